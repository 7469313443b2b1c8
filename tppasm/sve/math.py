"""Vectorized fp32 transcendentals for SVE as instruction emitters, and the constants they use.

Every emitter has the signature ``emit(a, dst, src, tmp, c)``: ``a`` the Assembler, ``dst``/``src``
z registers (``.s`` views; ``dst`` distinct from ``src``, which is left unchanged), ``tmp`` a list
of at least ``NTMP[name]`` scratch z registers distinct from both, ``c`` a :class:`Consts`. All
lanes are computed (governing predicate ``c.pg``, all true); ``c.ptmp`` is clobbered.

The algorithms are the x86 ones (:mod:`tppasm.x86.math`, same polynomials): exp by Cody-Waite
reduction, a degree-6 polynomial and ``fscale`` (exact scaling, no two-factor trick needed);
tanh, sigmoid, both gelu forms and their gradients from exp; reciprocal and rsqrt by the
``frecpe``/``frsqrte`` estimates and two Newton steps (``frecps``/``frsqrts``; no divide: ``fdiv``
and ``fsqrt`` are not pipelined on A64FX-class cores); sqrt is ``fsqrt`` (exact).

Accuracy (``ACCURACY``; max ulps vs float64 rounded to fp32, same domains and metric as the x86
table, enforced by tests/aarch64/test_sve_descriptors.py on 2^16 samples per domain under qemu;
measured worst in parentheses; per-lane code, so the same at every VL): exp 2 (1), sigmoid 3 (2), tanh 3 (1),
gelu_tanh 16 (10), gelu_erf 6 (4), gelu_tanh_grad 4 (1), gelu_erf_grad 4 (1), reciprocal 2 (1),
rsqrt 2 (2; a third Newton step does not lower it), sqrt 0 (0). Specials as on x86 (tested):
exp(+-inf) = inf/0, tanh(-0) = -0, gelu(-inf) = -0, reciprocal(+-0) = +-inf, rsqrt(0) = inf,
rsqrt(x<0) = NaN, NaN in NaN out; subnormal inputs are not flushed: reciprocal(+-1e-40) = +-inf, rsqrt(1e-45)
finite (both bounds hold from 2^-149 to FLT_MAX).

>>> from isa.aarch64 import Function, vl, p, z, x
>>> f = Function(nargs=2); a = f.asm; c = Consts(a, x[15], z[20:30], z[30:32])
>>> a.ptrue(p[7].s); c.setup()
>>> a.ld1w(z[0].s, p[7].z, vl(x[0])); EMITTERS["exp"][1](a, z[1].s, z[0].s, [z[2].s, z[3].s, z[4].s], c)
>>> a.st1w(z[1].s, p[7], vl(x[1])); f.ret(); c.pool()
>>> len(f.code()) > 80
True
"""
from __future__ import annotations

import struct

from isa.aarch64 import mem, p, z

from ..approx import (ERFC_MID, ERFC_POLY, EXP_POLY, FLT_MAX, K0, K1, LN2_HI, LN2_LO, LOG2E, TANH_POLY,
                      TANH_SMALL)

ACCURACY = {"exp": 2, "sigmoid": 3, "tanh": 3, "gelu_tanh": 16, "gelu_erf": 6, "gelu_tanh_grad": 4,
            "gelu_erf_grad": 4, "reciprocal": 2, "rsqrt": 2, "sqrt": 0}
SIGN = 0x80000000


def f32_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


class Consts:
    """Broadcast fp32/int32 constants: each gets a register of ``regs`` while they last, the rest
    are reloaded (``ld1rw``) into the rotating ``scratch`` registers at each use. All values live in
    a literal pool placed by :meth:`pool` after the function's last instruction and addressed
    through ``base`` (``adr``). Call :meth:`setup` before the body and :meth:`pool` after
    ``f.ret()``."""

    def __init__(self, a, base, regs, scratch, pg=p[7], ptmp=p[5]):
        self.a, self.base, self.regs, self.scratch = a, base, [r.s for r in regs], [r.s for r in scratch]
        self.pg, self.ptmp = pg, ptmp
        self.values: list[int] = []            # pool order
        self.resident: dict[int, object] = {}  # bits -> register
        self._turn = 0
        self._label = a.label("consts")

    def setup(self) -> None:
        """Point ``base`` at the pool and load the register constants (a branch to code that
        :meth:`pool` emits once the body has said which constants it uses)."""
        self.a.adr(self.base, self._label)
        self._load, self._back = self.a.label("load_consts"), self.a.label("consts_loaded")
        self.a.b(self._load)
        self.a.bind(self._back)

    def _index(self, bits: int) -> int:
        if bits not in self.values:
            if len(self.values) >= 64:
                raise ValueError("more than 64 constants in one kernel")
            self.values.append(bits)
        return self.values.index(bits)

    def i(self, bits: int):
        """A register holding int32 ``bits`` in every lane (valid until two more constants are used)."""
        bits &= 0xFFFFFFFF
        idx = self._index(bits)
        if bits in self.resident:
            return self.resident[bits]
        if len(self.resident) < len(self.regs):
            reg = self.resident[bits] = self.regs[len(self.resident)]
            return reg
        reg = self.scratch[self._turn % len(self.scratch)]
        self._turn += 1
        self.a.ld1rw(reg, self.pg.z, mem(self.base, 4 * idx))
        return reg

    def f(self, value: float):
        """A register holding fp32 ``value`` in every lane."""
        return self.i(f32_bits(value))

    def load(self, dst, value: float) -> None:
        """dst = fp32 ``value`` in every lane."""
        bits = f32_bits(value)
        if bits in self.resident or len(self.resident) < len(self.regs):
            mov(self.a, dst, self.f(value))
        else:
            self.a.ld1rw(dst, self.pg.z, mem(self.base, 4 * self._index(bits)))

    def pool(self) -> None:
        """Emit the register loads of the setup and the literal pool (after the body's ``ret``)."""
        a = self.a
        a.bind(self._load)
        for bits, reg in self.resident.items():
            a.ld1rw(reg, self.pg.z, mem(self.base, 4 * self.values.index(bits)))
        a.b(self._back)
        a.bind(self._label)
        for bits in self.values or [0]:
            a.word(bits)


def mov(a, dst, src) -> None:
    """dst = src (vector copy; nothing when they are the same register)."""
    if dst.num != src.num:
        a.orr(z[dst.num].d, z[src.num].d, z[src.num].d)


def horner(a, dst, x, coeffs, c) -> None:
    """dst = polynomial(x), coefficients highest degree first (dst distinct from x)."""
    c.load(dst, coeffs[0])
    for k in coeffs[1:]:
        a.fmad(dst, c.pg.m, x, c.f(k))          # dst = k + dst * x


def clamp(a, dst, src, lo, hi, c) -> None:
    """dst = min(max(src, lo), hi); NaN stays NaN (SVE fmax/fmin propagate it)."""
    mov(a, dst, src)
    a.fmax(dst, c.pg.m, dst, c.f(lo))
    a.fmin(dst, c.pg.m, dst, c.f(hi))


def select(a, dst, pred, if_true, if_false) -> None:
    a.sel(dst, pred, if_true, if_false)


# -- exp ----------------------------------------------------------------------------------------
def _exp_poly_scale(a, dst, r, nf, c) -> None:
    """dst = P(r) * 2^nf (nf: an integral float; clobbered)."""
    horner(a, dst, r, EXP_POLY, c)
    a.fcvtzs(nf, c.pg.m, nf)
    a.fscale(dst, c.pg.m, dst, nf)


def emit_exp(a, dst, src, tmp, c) -> None:
    """dst = exp(src). tmp: 2."""
    t0, t1 = tmp[:2]
    clamp(a, t0, src, -104.0, 88.8, c)
    a.fmul(t1, t0, c.f(LOG2E))
    a.frintn(t1, c.pg.m, t1)                    # n, ties to even
    a.fmls(t0, c.pg.m, t1, c.f(LN2_HI))        # r = x - n ln2, Cody-Waite (n*LN2_HI exact)
    a.fmls(t0, c.pg.m, t1, c.f(LN2_LO))
    _exp_poly_scale(a, dst, t0, t1, c)


def emit_sigmoid(a, dst, src, tmp, c) -> None:
    """dst = 1 / (1 + exp(-src)). tmp: 2."""
    a.fneg(dst, c.pg.m, src)
    emit_exp(a, dst, dst, tmp, c)
    a.fadd(dst, c.pg.m, dst, 1.0)
    a.fdivr(dst, c.pg.m, dst, c.f(1.0))


def emit_tanh(a, dst, src, tmp, c) -> None:
    """dst = tanh(src): a P(a^2) for a = |x| < 0.55, else 1 - 2/(exp(2a)+1); sign restored. tmp: 4."""
    t0, t1, t2, t3 = tmp[:4]
    a.fabs(t3, c.pg.m, src)
    a.fmul(t2, t3, t3)
    horner(a, t1, t2, TANH_POLY, c)
    a.fmul(t2, t1, t3)                          # small-|x| result
    a.fadd(dst, t3, t3)
    emit_exp(a, dst, dst, (t0, t1), c)
    a.fadd(dst, c.pg.m, dst, 1.0)
    a.fdivr(dst, c.pg.m, dst, c.f(2.0))
    a.fsubr(dst, c.pg.m, dst, c.f(1.0))
    a.fcmgt(c.ptmp.s, c.pg.z, c.f(TANH_SMALL), t3)
    a.sel(dst, c.ptmp, t2, dst)
    a.and_(z[t0.num].d, z[src.num].d, z[c.i(SIGN).num].d)
    a.orr(z[dst.num].d, z[dst.num].d, z[t0.num].d)


# -- gelu ---------------------------------------------------------------------------------------
def emit_gelu_tanh(a, dst, src, tmp, c) -> None:
    """dst = 0.5 x (1 + tanh(K0 (x + K1 x^3))) = x / (1 + exp(-2u)). tmp: 3."""
    t0, t1, t2 = tmp[:3]
    a.fmul(t2, src, src)
    c.load(dst, -2 * K0 * K1)
    a.fmad(dst, c.pg.m, t2, c.f(-2 * K0))
    a.fmul(dst, dst, src)                       # -2u
    emit_exp(a, dst, dst, (t0, t1), c)
    a.fadd(dst, c.pg.m, dst, 1.0)
    mov(a, t2, src)
    a.fmax(t2, c.pg.m, t2, c.f(-FLT_MAX))      # -inf -> -FLT_MAX: gelu(-inf) = -0
    a.fdivr(dst, c.pg.m, dst, t2)


def emit_gelu_tanh_grad(a, dst, src, tmp, c) -> None:
    """dst = s + x s (1-s) 2 K0 (1 + 3 K1 x^2), s = sigmoid(2u), 1-s = e s. tmp: 4."""
    t0, t1, t2, t3 = tmp[:4]
    clamp(a, t3, src, -20.0, 20.0, c)
    a.fmul(t2, t3, t3)
    c.load(dst, -2 * K0 * K1)
    a.fmad(dst, c.pg.m, t2, c.f(-2 * K0))
    a.fmul(dst, dst, t3)
    a.fmin(dst, c.pg.m, dst, c.f(88.0))
    emit_exp(a, dst, dst, (t0, t1), c)          # e = exp(-2u)
    mov(a, t0, dst)
    a.fadd(t0, c.pg.m, t0, 1.0)
    a.fdivr(t0, c.pg.m, t0, c.f(1.0))           # s
    a.fmul(dst, dst, t0)
    a.fmul(dst, dst, t0)                        # e s^2 = s (1 - s)
    c.load(t1, 6 * K0 * K1)
    a.fmad(t1, c.pg.m, t2, c.f(2 * K0))
    a.fmul(t1, t1, t3)
    a.fmad(dst, c.pg.m, t1, t0)                 # dst * t1 + s
    a.fcmgt(c.ptmp.s, c.pg.z, c.f(-10.0), src)  # x < -10: |f'| < 4e-36, give 0 (NaN stays)
    a.sel(dst, c.ptmp, c.f(0.0), dst)


def _phi(a, dst, src, tmp, c) -> None:
    """dst = Phi(src) = 1 - E/2 or E/2, E = erfc(|x|/sqrt 2) = t exp(P(t) - a^2). tmp: 4."""
    t0, t1, t2, t3 = tmp[:4]
    a.fabs(t3, c.pg.m, src)
    a.fmin(t3, c.pg.m, t3, c.f(14.142135))      # a = |x|/sqrt 2 <= 10
    c.load(t0, 1.0)
    a.fmla(t0, c.pg.m, t3, c.f(0.5 * 0.7071067811865476))
    a.fdivr(t0, c.pg.m, t0, c.f(1.0))          # t = 1/(1 + a/2), kept in t0 until the end
    a.fsub(t1, t0, c.f(ERFC_MID))
    horner(a, dst, t1, ERFC_POLY, c)            # P
    a.fmul(t2, t3, t3)                          # hi = fl(|x|^2)
    mov(a, t1, t2)
    a.fmls(t1, c.pg.m, t3, t3)                  # t1 = hi - |x|^2 = -lo, exact
    a.fmul(t2, t2, c.f(0.5))
    a.fmul(t1, t1, c.f(0.5))                    # a^2 = t2 - t1
    # exp(P - t2 + t1): n from the rounded sum, then r = P - (t2 + n ln2_hi) + t1 - n ln2_lo
    a.fsub(t3, dst, t2)
    a.fmul(t3, t3, c.f(LOG2E))
    a.frintn(t3, c.pg.m, t3)
    a.fmla(t2, c.pg.m, t3, c.f(LN2_HI))
    a.fsub(t2, dst, t2)
    a.fadd(t2, t2, t1)
    a.fmls(t2, c.pg.m, t3, c.f(LN2_LO))
    _exp_poly_scale(a, dst, t2, t3, c)
    a.fmul(dst, dst, t0)                        # E
    a.fmul(t0, dst, c.f(0.5))                   # E/2
    c.load(t1, 1.0)
    a.fsub(t1, t1, t0)                          # 1 - E/2
    a.fcmlt(c.ptmp.s, c.pg.z, src, 0.0)
    a.sel(dst, c.ptmp, t0, t1)
    a.fcmgt(c.ptmp.s, c.pg.z, c.f(-14.1), src)  # E clamps at a = 10: Phi is 0 below
    a.sel(dst, c.ptmp, c.f(0.0), dst)


def emit_gelu_erf(a, dst, src, tmp, c) -> None:
    """dst = x Phi(x). tmp: 4."""
    _phi(a, dst, src, tmp, c)
    mov(a, tmp[0], src)
    a.fmax(tmp[0], c.pg.m, tmp[0], c.f(-FLT_MAX))
    a.fmul(dst, dst, tmp[0])


def emit_gelu_erf_grad(a, dst, src, tmp, c) -> None:
    """dst = Phi(x) + x exp(-x^2/2) / sqrt(2 pi). tmp: 4."""
    out = dst
    _phi(a, out, src, tmp, c)
    t0, t1, t2, t3 = tmp[:4]
    clamp(a, t3, src, -20.0, 20.0, c)
    a.fmul(t0, t3, t3)
    a.fmul(t0, t0, c.f(-0.5))
    emit_exp(a, t1, t0, (t0, t2), c)
    a.fmul(t1, t1, t3)
    a.fmla(out, c.pg.m, t1, c.f(0.3989422804014327))


# -- simple ops ---------------------------------------------------------------------------------
def emit_reciprocal(a, dst, src, tmp, c) -> None:
    """dst = 1/x: ``frecpe`` (8 bits) and two Newton steps y *= |frecps(x, y)| = |2 - x y|. x = +-0
    and +-inf stay exact (frecps(0, inf) is defined as 2). The step factor is near 1 for every other
    x but |x| < 2^-128, where y = +-inf and frecps(x, y) = -inf: the |.| keeps y's sign. tmp: 1."""
    t0 = tmp[0]
    a.frecpe(dst, src)
    for _ in range(2):
        a.frecps(t0, src, dst)
        a.fabs(t0, c.pg.m, t0)
        a.fmul(dst, dst, t0)


def emit_rsqrt(a, dst, src, tmp, c) -> None:
    """dst = 1/sqrt(x): ``frsqrte`` and two steps y *= frsqrts(x y, y) = (3 - x y^2)/2; x y stays in
    range where y^2 would overflow (x < 2^-128). x = +-0 (y = +-inf) and x = inf (y = 0) give NaN
    there (0 * inf), as do x < 0 and NaN: NaN lanes take the estimate, exact for the first two and
    NaN for the others. tmp: 1."""
    t0 = tmp[0]
    a.frsqrte(dst, src)
    for _ in range(2):
        a.fmul(t0, src, dst)
        a.frsqrts(t0, t0, dst)
        a.fmul(dst, dst, t0)
    a.fcmuo(c.ptmp.s, c.pg.z, dst, dst)
    a.frsqrte(t0, src)
    a.sel(dst, c.ptmp, t0, dst)


def _simple(fn):
    return lambda a, dst, src, tmp, c: fn(a, dst, src, c)


# name -> (scratch registers needed, emitter)
EMITTERS = {
    "copy": (0, _simple(lambda a, d, s, c: mov(a, d, s))),
    "identity": (0, _simple(lambda a, d, s, c: mov(a, d, s))),
    "relu": (0, _simple(lambda a, d, s, c: (mov(a, d, s), a.fmax(d, c.pg.m, d, 0.0)))),
    "negate": (0, _simple(lambda a, d, s, c: a.fneg(d, c.pg.m, s))),
    "square": (0, _simple(lambda a, d, s, c: a.fmul(d, s, s))),
    "sqrt": (0, _simple(lambda a, d, s, c: a.fsqrt(d, c.pg.m, s))),
    "reciprocal": (1, emit_reciprocal),
    "rsqrt": (1, emit_rsqrt),
    "exp": (2, emit_exp),
    "sigmoid": (2, emit_sigmoid),
    "tanh": (4, emit_tanh),
    "gelu": (3, emit_gelu_tanh),
    "gelu_erf": (4, emit_gelu_erf),
    "gelu_erf_fast": (4, emit_gelu_erf),        # its contract is looser than gelu_erf's accuracy
    "gelu_bwd": (4, emit_gelu_tanh_grad),
    "gelu_erf_bwd": (4, emit_gelu_erf_grad),
}
NTMP = {k: v[0] for k, v in EMITTERS.items()}
