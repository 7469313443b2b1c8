"""SVE code for :mod:`tppasm.quant`'s per-row int8 quantization and int32 dequantization.

Quantize (x0 = x, x1 = q, x2 = scale): per row, pass 1 takes max|x| (two ``fmax`` accumulators,
then ``fmaxv`` and a broadcast), clamped below at 1e-30 so an all-zero row gives ``scale =
1e-30/127`` and codes 128 as the reference does; ``inv = 127/amax`` and ``scale = amax/127`` are
fp32 divisions like the reference's. Pass 2 stores ``clamp(frintn(x*inv) + 128, 0, 255)``
(round to nearest even; bits=7: 63 for 127, ``+ 64`` and a clamp at 127), converted with
``fcvtzu`` and narrowed by ``st1b`` of ``.s`` lanes: the codes are exactly the reference's.

Dequant (x0 = c, x1 = offset, x2 = row_scale, x3 = col_scale, x4 = out): per vector
``scvtf(c + offset) * (col_scale * row_scale)`` (int32 add; the scales' product first, as on
x86, so a result that fits never overflows on the way), plus out for beta=1.

>>> import numpy as np
>>> from tppasm.quant import Quantize
>>> from isa.aarch64.native import Call, run_calls, sve_runner_skip_reason
>>> xs = np.array([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0]], np.float32)
>>> q, s = np.zeros((2, 3), np.uint8), np.zeros(2, np.float32)
>>> if sve_runner_skip_reason(128) is None:                  # qemu, or an SVE host
...     run_calls([Call(generate_quantize(Quantize(2, 3)), [xs], [q, s])], vl_bits=128)
...     assert q.tolist() == [[192, 1, 160], [128, 128, 128]] and s[0] == np.float32(1) / 127
...     run_calls([Call(generate_quantize(Quantize(2, 3, bits=7)), [xs], [q, s])], vl_bits=128)
...     assert q.tolist() == [[96, 1, 80], [64, 64, 64]] and s[0] == np.float32(1) / 63
>>> "fcvtzu" in disassemble(generate_quantize(Quantize(2, 3)))
True
"""
from __future__ import annotations

from isa.aarch64 import Function, disassemble, mem, v, vl, x, z

from ..quant import levels, zero_point
from .math import Consts
from .raw import register_sve
from .rowwise import IDX, P_ALL, P_LANE, P_ONE, R_N, U, esize, load, row_loop, store, walk_columns

__all__ = ["generate_quantize", "generate_dequant", "disassemble"]

R_POOL = x[14]
AMAX_FLOOR = 1e-30                 # the reference's floor of max|x| (all-zero rows)


def _consts(a, free):
    """Constants in the registers ``free`` leaves (two of them as reload scratch)."""
    regs = [z[i] for i in free]
    return Consts(a, R_POOL, regs[2:], regs[:2], P_ALL)


def generate_quantize(d) -> bytes:
    """Machine code for a Quantize descriptor (see the module docstring)."""
    f = Function(nargs=3)
    a = f.asm
    xs, q, scale = f.args
    ACC, VAL = [z[u].s for u in range(U)], [z[U + u].s for u in range(U)]
    amax, inv = z[2 * U].s, z[2 * U + 1].s
    c = _consts(a, range(2 * U + 2, 32))
    a.ptrue(P_ALL.s)
    a.ptrue(P_ONE.s, "vl1")
    c.setup()
    a.mov_imm(R_N, d.n)
    lv, zp = float(levels(d.bits)), float(zero_point(d.bits))

    def max_abs(u):
        val = load(a, d.dtype, VAL[u], u, xs)           # inactive lanes load 0
        a.fabs(val, P_ALL.m, val)
        a.fmax(ACC[u], P_ALL.m, ACC[u], val)

    def codes(u):
        val = load(a, d.dtype, VAL[u], u, xs)
        a.fmul(val, val, inv)
        a.frintn(val, P_ALL.m, val)
        a.fadd(val, val, c.f(zp))
        a.fmax(val, P_ALL.m, val, 0.0)
        a.fmin(val, P_ALL.m, val, c.f(2 * zp - 1))      # (255.0; bits=7: 127.0)
        a.fcvtzu(val, P_ALL.m, val)
        a.st1b(val, P_LANE[u], mem(q, IDX[u]))

    def row():
        for acc in ACC:
            a.dup(acc, 0)
        walk_columns(a, max_abs)
        a.fmax(ACC[0], P_ALL.m, ACC[0], ACC[1])
        a.fmaxv(v[ACC[0].num].s, P_ALL, ACC[0])
        a.dup(amax, ACC[0][0])
        a.fmax(amax, P_ALL.m, amax, c.f(AMAX_FLOOR))
        c.load(inv, lv)
        a.fdiv(inv, P_ALL.m, inv, amax)
        a.fdiv(amax, P_ALL.m, amax, c.f(lv))
        a.st1w(amax, P_ONE, vl(scale))
        walk_columns(a, codes)

    row_loop(a, d.m, row, [(xs, d.ldi * esize(d.dtype)), (q, d.ldo), (scale, 4)])
    f.ret()
    c.pool()
    return f.code()


def generate_dequant(d) -> bytes:
    """Machine code for a Dequant descriptor (see the module docstring)."""
    f = Function(nargs=5)
    a = f.asm
    cs, offset, row_scale, col_scale, out = f.args
    R, O = [z[u].s for u in range(U)], [z[U + u].s for u in range(U)]
    rs = z[2 * U].s
    a.ptrue(P_ALL.s)
    a.mov_imm(R_N, d.n)

    def vector(u):
        r = load(a, "f32", R[u], u, cs)                 # int32 bits, loaded as they are
        a.add(r, r, load(a, "f32", O[u], u, offset))
        a.scvtf(r, P_ALL.m, r)
        s = load(a, "f32", O[u], u, col_scale)
        a.fmul(s, s, rs)                                # the scales' product first, as on x86
        a.fmul(r, r, s)
        if d.beta:
            a.fadd(r, r, load(a, d.out_dtype, O[u], u, out))
        store(a, d.out_dtype, r, u, out)

    def row():
        a.ld1rw(rs, P_ALL.z, mem(row_scale))
        walk_columns(a, vector)

    row_loop(a, d.m, row, [(cs, d.ldi * 4), (out, d.ldo * esize(d.out_dtype)), (row_scale, 4)])
    f.ret()
    return f.code()


register_sve(generate_quantize, "quantize")
register_sve(generate_dequant, "dequant")
