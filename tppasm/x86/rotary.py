"""x86 generator (AVX2, AVX-512) for rotary position embeddings (:mod:`tppasm.rotary`).

Per row, a loop over the heads; per head, the column walk over head_dim/2 lanes loads both halves
and the row's cos/sin, and stores ``x1*cos - x2*sin`` and ``x2*cos + x1*sin`` (one FMA each) after
both halves are read, so the output may be the input.

>>> import numpy as np, tppasm
>>> x = np.arange(8, dtype=np.float32).reshape(1, 8); out = np.empty_like(x)
>>> c, s = np.ones((1, 2), np.float32), np.zeros((1, 2), np.float32)
>>> tppasm.rotary(1, 8, 4)(x, c, s, out); out.tolist()
[[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]]
"""
from isa.x86 import Function, r8, r9, r10, rax

from ..backends import register
from .stream import Stream, load, store
from .rows import Regs, at, walk
from .vector import VectorISA


@register("x86", "rotary")
def generate_rotary(desc, isa):
    v = VectorISA(isa)
    fn = Function("rotary", ["ptr"] * 4)
    a = fn.asm
    rx, rc, rs, ro = fn.args
    half = desc.head_dim // 2
    x, out = Stream(rx, "full", desc.dtype, desc.ldi), Stream(ro, "full", desc.out_dtype, desc.ldo)
    cos, sin = Stream(rc, "full", "f32", desc.ldt), Stream(rs, "full", "f32", desc.ldt)
    xh, oh = Stream(r8, "full", desc.dtype), Stream(r9, "full", desc.out_dtype)   # this head
    R = Regs(fn, v, half)
    U = 4 if v.avx512 else 2
    work = [R.take(5) for _ in range(U)]
    tmp = R.take(3)
    c = R.consts()

    def vector(u, col, idx, t):
        x1, x2, cs, sn, o = work[u]
        load(a, v, x1, xh, at(xh, col, idx), t)
        load(a, v, x2, xh, at(xh, col + half, idx), t)
        load(a, v, cs, cos, at(cos, col, idx), t)
        load(a, v, sn, sin, at(sin, col, idx), t)
        a.vmulps(o, x1, cs)
        a.vfnmadd231ps(o, x2, sn)
        a.vmulps(x2, x2, cs)
        a.vfmadd231ps(x2, x1, sn)
        store(a, v, oh, o, at(oh, col, idx), t, tmp, c)
        store(a, v, oh, x2, at(oh, col + half, idx), t, tmp, c)

    a.mov(r10, desc.m)
    rows = a.label()
    a.bind(rows)
    a.mov(xh.reg, x.reg)
    a.mov(oh.reg, out.reg)
    a.mov(rax, desc.n // desc.head_dim)
    heads = a.label()
    a.bind(heads)
    walk(a, v, half, U, vector, R.tail)
    a.add(xh.reg, desc.head_dim * xh.es)
    a.add(oh.reg, desc.head_dim * oh.es)
    a.dec(rax)
    a.jnz(heads)
    for s in (x, out, cos, sin):
        a.add(s.reg, s.ld * s.es)
    a.dec(r10)
    a.jnz(rows)
    c.finish(fn, scratch=tmp[0])
    return fn.finalize()
