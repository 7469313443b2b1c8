"""SVE code for :class:`tppasm.rotary.Rotary` (RoPE, "rotate half"): per row and per head of
head_dim values, halves x1, x2 become ``x1*cos - x2*sin`` and ``x2*cos + x1*sin`` with the row's
fp32 tables. fp32 arithmetic; x and out f32 or bf16. Arguments: x0 = x, x1 = cos, x2 = sin, x3 = out.

Per row a loop over the heads; per head the column walk (:func:`.rowwise.walk_columns`) runs over
head_dim/2 lanes with one index for both halves and the tables. Each vector's four loads come
before its two stores and no vector reads what another writes, so out may be x itself.

>>> import numpy as np
>>> from tppasm.rotary import Rotary
>>> from isa.aarch64.native import Call, run_calls, sve_runner_skip_reason
>>> xs = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32); out = np.zeros_like(xs)
>>> cos, sin = np.zeros((1, 1), np.float32), np.ones((1, 1), np.float32)
>>> if sve_runner_skip_reason(128) is None:                  # qemu, or an SVE host
...     run_calls([Call(generate(Rotary(1, 4, 2)), [xs, cos, sin], [out])], vl_bits=128)
...     assert out.tolist() == [[-2.0, 1.0, -4.0, 3.0]]
>>> "fmls" in disassemble(generate(Rotary(1, 4, 2)))
True
"""
from __future__ import annotations

from isa.aarch64 import Function, disassemble, x, z

from .common import add_imm
from .raw import register_sve
from .rowwise import P_ALL, R_N, R_S, U, esize, load, row_loop, store, walk_columns

__all__ = ["generate", "disassemble"]

R_X1, R_X2, R_O1, R_O2, R_HEADS = x[14], x[15], x[16], x[17], x[7]   # this head's halves, head count


def generate(d) -> bytes:
    """Machine code for a Rotary descriptor (see the module docstring)."""
    f = Function(nargs=4)
    a = f.asm
    xs, cos, sin, out = f.args
    half = d.head_dim // 2
    es_in, es_out = esize(d.dtype), esize(d.out_dtype)
    X1, X2, C, S, O = ([z[5 * u + i].s for u in range(U)] for i in range(5))
    a.ptrue(P_ALL.s)
    a.mov_imm(R_N, half)

    def vector(u):
        x1, x2 = load(a, d.dtype, X1[u], u, R_X1), load(a, d.dtype, X2[u], u, R_X2)
        c, s = load(a, "f32", C[u], u, cos), load(a, "f32", S[u], u, sin)
        a.fmul(O[u], x1, c)
        a.fmls(O[u], P_ALL.m, x2, s)                    # x1*cos - x2*sin
        a.fmul(x2, x2, c)
        a.fmla(x2, P_ALL.m, x1, s)                      # x2*cos + x1*sin
        store(a, d.out_dtype, O[u], u, R_O1)
        store(a, d.out_dtype, x2, u, R_O2)

    def row():
        a.mov(R_X1, xs)
        add_imm(a, R_X2, xs, half * es_in, R_S)
        a.mov(R_O1, out)
        add_imm(a, R_O2, out, half * es_out, R_S)
        a.mov_imm(R_HEADS, d.n // d.head_dim)
        heads = a.label("heads")
        a.bind(heads)
        walk_columns(a, vector)
        for reg, es in ((R_X1, es_in), (R_X2, es_in), (R_O1, es_out), (R_O2, es_out)):
            add_imm(a, reg, reg, d.head_dim * es, R_S)
        a.subs(R_HEADS, R_HEADS, 1)
        a.b_ne(heads)

    row_loop(a, d.m, row, [(xs, d.ldi * es_in), (out, d.ldo * es_out), (cos, d.ldt * 4), (sin, d.ldt * 4)])
    f.ret()
    return f.code()


register_sve(generate, "rotary")
