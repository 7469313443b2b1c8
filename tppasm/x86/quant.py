"""x86 generators (AVX2, AVX-512) for per-row int8 quantization and int32 dequantization
(:mod:`tppasm.quant`).

Quantize: per row, the maximum |x| (pass 1, as int32 bit patterns, so a NaN in the row makes it
NaN: ``rows.LANE_OPS``), then ``vcvtps2dq(x * 127/max) + 128`` (bits=7: 63 and 64) packed to bytes
with unsigned saturation (AVX-512 ``vpmovusdb`` and a masked byte store; AVX2 ``vpackusdw`` /
``vpackuswb`` and one ``vpextrb`` per tail byte). Dequant: per vector ``vpaddd`` the column
offsets, ``vcvtdq2ps``, a multiply by ``row_scale * col_scale`` (that product first, so a result
that fits never overflows on the way), and an add of the output for beta=1.

>>> import numpy as np, tppasm
>>> x = np.linspace(-1, 1, 20, dtype=np.float32)[None]; q = np.empty((1, 20), np.uint8); s = np.empty(1, np.float32)
>>> tppasm.quantize(1, 20)(x, q, s); int(q.min()), int(q.max())
(1, 255)
>>> tppasm.quantize(1, 20, bits=7)(x, q, s); int(q.min()), int(q.max())
(1, 127)
"""
from isa.x86 import Function, byte, dword, qword, vec

from ..backends import register
from ..quant import levels, zero_point
from . import math as xm
from .stream import Stream, load, store
from .rows import Regs, at, combine, hreduce, row_loop, walk
from .vector import VectorISA

@register("x86", "quantize")
def generate_quantize(desc, isa):
    v = VectorISA(isa)
    fn = Function("quantize", ["ptr"] * 3)
    a = fn.asm
    rx, rq, rs = fn.args
    x = Stream(rx, "full", desc.dtype, desc.ldi)
    q = Stream(rq, "full", "u8", desc.ldo)
    R = Regs(fn, v, desc.n)
    tail, U = R.tail, (4 if v.avx512 else 2)
    acc, work, (inv, t0) = R.take(U), R.take(U), R.take(2)
    c = R.consts()
    lv, zp = float(levels(desc.bits)), zero_point(desc.bits)

    def amax(u, col, idx, t):
        r = load(a, v, work[u], x, at(x, col, idx), t)
        xm.vand(a, v, r, r, c.i(xm.ABS))
        a.vpmaxsd(acc[u], acc[u], r)

    def store(u, col, idx, t):
        r = load(a, v, work[u], x, at(x, col, idx), t)
        a.vmulps(r, r, inv)
        a.vcvtps2dq(r, r)
        a.vpaddd(r, r, c.i(zp))
        count = t.count if t else v.lanes(4)
        mem = at(q, col, idx)
        if v.avx512:
            x16 = vec(128, t0.num)
            a.vpmovusdb(x16, r)
            if t:
                a.vmovdqu8(mem(0, 1).mask(t.k), x16)
            else:
                a.vmovdqu(mem(0, 1), x16)
            return
        lo, hi = vec(128, r.num), vec(128, t0.num)
        a.vextracti128(hi, r, 1)
        a.vpackusdw(lo, lo, hi)
        a.vpackuswb(lo, lo, lo)
        if t is None:
            a.vmovq(qword[mem(0, 1).expr], lo)
        else:
            for i in range(count):
                a.vpextrb(_byte(mem(i, 1)), lo, i)

    def row():
        for r in acc:
            a.vxorps(r, r, r) if r.num < 16 else a.vpxord(r, r, r)
        walk(a, v, desc.n, U, amax, tail)
        combine(a, acc, "max_bits")
        hreduce(a, v, acc[0], acc[1], "max_bits")
        a.vpmaxsd(acc[0], acc[0], c.f(1e-30))
        c.load(a, inv, c.f(lv))
        a.vdivps(inv, inv, acc[0])
        a.vdivps(acc[0], acc[0], c.f(lv))
        a.vmovss(dword[rs], vec(128, acc[0].num))
        walk(a, v, desc.n, U, store, tail)
    row_loop(a, desc.m, row, [x, q], [rs])
    c.finish(fn, scratch=acc[0])
    return fn.finalize()


def _byte(mem):
    return byte[mem.expr]


@register("x86", "dequant")
def generate_dequant(desc, isa):
    v = VectorISA(isa)
    fn = Function("dequant", ["ptr"] * 5)
    a = fn.asm
    rc, roff, rrow, rcol, ro = fn.args
    cs = Stream(rc, "full", "f32", desc.ldi)                 # int32 bits, loaded as they are
    off, col = Stream(roff, "row", "f32"), Stream(rcol, "row", "f32")
    out = Stream(ro, "full", desc.out_dtype, desc.ldo)
    R = Regs(fn, v, desc.n)
    tail, U = R.tail, (4 if v.avx512 else 2)
    work, (rs,), tmp = [R.take(3) for _ in range(U)], R.take(1), R.take(3)
    c = R.consts()

    def vector(u, col_, idx, t):
        r, o, s = work[u]
        load(a, v, r, cs, at(cs, col_, idx), t)
        a.vpaddd(r, r, load(a, v, o, off, at(off, col_, idx), t))
        a.vcvtdq2ps(r, r)
        a.vmulps(s, rs, load(a, v, s, col, at(col, col_, idx), t))    # the scales' product first
        a.vmulps(r, r, s)
        if desc.beta:
            a.vaddps(r, r, load(a, v, o, out, at(out, col_, idx), t))
        store(a, v, out, r, at(out, col_, idx), t, tmp, c)

    def row():
        a.vbroadcastss(rs, dword[rrow])
        walk(a, v, desc.n, U, vector, tail)
    row_loop(a, desc.m, row, [cs, out], [rrow])
    c.finish(fn, scratch=tmp[0])
    return fn.finalize()

