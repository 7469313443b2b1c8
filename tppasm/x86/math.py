"""Vectorized fp32 transcendentals as instruction emitters, for any :class:`tppasm.x86.vector.VectorISA`.

Every emitter has the same signature, so generators (element-wise TPPs, BRGEMM epilogues) can
reuse them::

    emit_<fn>(a, v, dst, src, tmp, c)

``a`` the Assembler, ``v`` the VectorISA, ``dst``/``src`` vector registers (``dst`` may be
``src``; ``src`` is otherwise left unchanged), ``tmp`` a list of at least ``NTMP[fn]`` scratch
registers distinct from both, ``c`` a :class:`Consts` (broadcast constants). On AVX-512 the
emitters also clobber the opmask ``c.k`` (k7 unless :func:`interleave` gave them another).

Each emitter is one long dependency chain (gelu_erf: ~60 instructions, ~150 cycles of latency)
and the out-of-order core holds only about two of them in flight, so code that evaluates one
vector after another runs at the chain's latency; :func:`interleave` emits several independent
evaluations instruction by instruction, which runs at the instructions' throughput.

Accuracy: see ``ACCURACY`` (max ulps vs float64 rounded to fp32 on dense samples, enforced by
tests/tpp/test_math_accuracy.py). Specials: NaN in -> NaN out; exp(+inf)=inf, exp(-inf)=0,
tanh(+-inf)=+-1, sigmoid(+-inf)=1/0, gelu(+inf)=inf, gelu(-inf)=-0, tanh(-0)=-0;
reciprocal(+-0)=+-inf, rsqrt(0)=inf, rsqrt(x<0)=NaN. Results that are fp32 denormals may be
flushed or off by more (exp below -87.3, gelu far left); |x| >= 2^126 gives reciprocal 0.

>>> from isa.x86 import Function, rdi, rsi, ymm0, ymm1, ymm2, ymm3, ymm4
>>> from tppasm.x86.vector import VectorISA
>>> import numpy as np
>>> v = VectorISA("avx2"); fn = Function("exp8", ["ptr", "ptr"]); a = fn.asm; c = Consts(v)
>>> a.vmovups(ymm0, [rdi]); emit_exp(a, v, ymm1, ymm0, [ymm2, ymm3, ymm4], c); a.vmovups([rsi], ymm1)
>>> c.finish(fn); f = fn.finalize()
>>> x = np.linspace(-2, 2, 8, dtype=np.float32); y = np.empty_like(x); f(x.ctypes.data, y.ctypes.data)
>>> bool(np.allclose(y, np.exp(x), rtol=1e-6))
True
"""
import itertools

from isa.x86 import K

from .consts import K7, Consts, f32_bits  # noqa: F401 (Consts: the emitters' c)
from ..approx import (ERFC_MID, ERFC_POLY, EXP_POLY, EXP_POLY_BF16, FLT_MAX, HALF_ERFC_POLY_BF16, K0, K1,  # noqa: F401
                      GELU_TABLE_8, GELU_TABLE_16, LN2, LN2_HI, LN2_LO, LOG2E, MAGIC, TANH_POLY, TANH_SMALL)

OPMASKS = (K[7], K[6], K[5], K[4])     # one per interleaved chain; k1-k3 are tails', bf16 NaNs', AMX's
LT, LE, UNORD, NLT, NLE, GE, GT = 1, 2, 3, 5, 6, 13, 14     # vcmpps predicates (NLT, NLE: also true for NaN)
SIGN, ABS = -0x80000000, 0x7FFFFFFF

NTMP = {"exp": 3, "exp_bf16": 3, "sigmoid": 3, "tanh": 5, "gelu_tanh": 4, "gelu_erf": 5, "gelu_erf_bf16": 4,
        "gelu_erf_fast": 5,
        "gelu_tanh_grad": 5, "gelu_erf_grad": 5, "reciprocal": 2, "rsqrt": 2}

# max error in fp32 ulps vs float64 rounded to fp32, 2^20 samples of the domain (measured worst
# in parentheses); *_grad: ulps of max(|ref|, 1). tests/tpp/test_math_accuracy.py enforces these.
#   exp [-87.3, 88.7] 2 (1); sigmoid [-87, 87] 3 (2); tanh [-10, 10] 3 (2); gelu_erf [-13, 12] 6 (5);
#   gelu_tanh [-3, 12] 16 (12): for x << 0 it is ill-conditioned (cond ~ 2u'(x) x, 300 at x=-10) and
#   the error stays within 4 ulps x max(1, cond); grads [-12, 12] 4 (2); reciprocal, rsqrt
#   [1e-37, 1e37] 2 (1, 1) on AVX2 (vdivps, exact; vrsqrtps + 2nd-order Newton) and AVX-512 (the 14-bit forms).
# These hold in MXCSR's default rounding (to nearest). Under a directed mode (fesetround) the
# range reduction picks n = floor or ceil, and the worst errors grow to 15-42 ulps (exp 21,
# sigmoid 42, tanh 13, gelu_tanh 36, gelu_erf 40; ~2.5e-6 relative, torch's F.gelu there: 1.4e-6);
# grads stay at ~5, reciprocal and rsqrt at 1. Left so: rounding n in the instruction would cost
# every transcendental kernel a vroundps (8 cycles on Intel) for a mode few callers set.
ACCURACY = {"exp": 2, "sigmoid": 3, "tanh": 3, "gelu_tanh": 16, "gelu_erf": 6, "gelu_tanh_grad": 4,
            "gelu_erf_grad": 4, "reciprocal": 2, "rsqrt": 2}
# gelu_erf_bf16 is for results rounded to bf16 next (BRGEMM epilogues with a bf16 C): relative
# error <= 2^-16 (128 fp32 ulps; measured 1.1e-5) on [-13, 12], the specials of gelu_erf.
ACCURACY_BF16 = {"gelu_erf_bf16": 2.0 ** -16, "exp_bf16": 2.0 ** -16}
# gelu_erf_fast: |error| / max(1, |x|) for any x (measured 0.34 of it on AVX-512, 0.40 on AVX2; under
# a directed MXCSR rounding mode 0.65 and 0.69), the accuracy class of torch's gelu
ACCURACY_ABS = {"gelu_erf_fast": 2.0 ** -22}


class _Recorder:
    """Stands in for the Assembler while an emitter runs: keeps its instructions to replay."""

    def __init__(self):
        self.code = []

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)

        def record(*ops, **kw):
            self.code.append((name, ops, kw))
        return record


def interleave(a, c, chains):
    """Emit independent computations one instruction of each in turn. ``chains``: functions
    ``chain(a, c)`` emitting straight-line code on registers of their own; chain i gets ``c``
    with opmask ``OPMASKS[i]`` (at most four chains). GPRs must not be shared either.

    >>> from isa.x86 import Function, ymm0, ymm1
    >>> from tppasm.x86.vector import VectorISA
    >>> fn = Function("two", []); c = Consts(VectorISA("avx2"))
    >>> interleave(fn.asm, c, [lambda a, c: (a.vaddps(ymm0, ymm0, ymm0), a.vmulps(ymm0, ymm0, ymm0)),
    ...                        lambda a, c: (a.vaddps(ymm1, ymm1, ymm1), a.vmulps(ymm1, ymm1, ymm1))])
    >>> [line.split()[2] for line in fn.finalize().disassemble().splitlines() if "ymm" in line]
    ['vaddps', 'vaddps', 'vmulps', 'vmulps']
    """
    if len(chains) > len(OPMASKS):
        raise ValueError(f"interleave: {len(chains)} chains; at most {len(OPMASKS)} (one opmask each)")
    if len(chains) == 1:
        chains[0](a, c)
        return
    codes = []
    for chain, k in zip(chains, OPMASKS):
        rec = _Recorder()
        chain(rec, c.with_mask(k))
        codes.append(rec.code)
    for step in itertools.zip_longest(*codes):
        for ins in step:
            if ins is not None:
                getattr(a, ins[0])(*ins[1], **ins[2])


# -- bitwise and select helpers (AVX2: VEX forms; AVX-512: EVEX dword forms) ------------------
def vand(a, v, d, x, y):
    (a.vpandd if v.avx512 else a.vpand)(d, x, y)


def vor(a, v, d, x, y):
    (a.vpord if v.avx512 else a.vpor)(d, x, y)


def vxor(a, v, d, x, y):
    (a.vpxord if v.avx512 else a.vpxor)(d, x, y)


def select(a, v, dst, x, y, pred, if_true, if_false, tmp, k=K7):
    """dst = pred(x, y) ? if_true : if_false (per lane; ``tmp`` is a scratch vector for AVX2,
    ``k`` the opmask clobbered on AVX-512)."""
    if v.avx512:
        a.vcmpps(k, x, y, pred)
        a.vblendmps(dst.mask(k), if_false, if_true)
    else:
        a.vcmpps(tmp, x, y, pred)
        a.vblendvps(dst, if_false, if_true, tmp)


def select_sign(a, v, dst, if_pos, if_neg, sign_of, c):
    """dst = sign bit of ``sign_of`` set ? if_neg : if_pos."""
    if v.avx512:
        a.vptestmd(c.k, sign_of, c.i(SIGN))
        a.vblendmps(dst.mask(c.k), if_pos, if_neg)
    else:
        a.vblendvps(dst, if_pos, if_neg, sign_of)


def keep_if(a, v, reg, x, y, pred, tmp, k=K7):
    """reg = pred(x, y) ? reg : 0 (``k``: the opmask clobbered on AVX-512)."""
    if v.avx512:
        a.vcmpps(k, x, y, pred)
        a.vmovaps(reg.mask(k, zero=True), reg)
    else:
        a.vcmpps(tmp, x, y, pred)
        a.vandps(reg, reg, tmp)


def max_nan(a, v, dst, first, second, tmp, op="vmaxps", k=K7):
    """dst = max(first, second) lane by lane, NaN where either is NaN, as np.maximum (``op``
    "vminps": np.minimum). ``vmaxps`` alone gives its second source where either is NaN, so
    lanes where ``first`` is NaN take it back. ``first`` is a register other than ``dst``;
    ``tmp``: an AVX2 scratch vector; ``k``: the AVX-512 opmask clobbered."""
    if v.avx512:
        a.vcmpps(k, first, first, UNORD)
        getattr(a, op)(dst, first, second)
        a.vmovaps(dst.mask(k), first)
    else:
        a.vcmpps(tmp, first, first, UNORD)
        getattr(a, op)(dst, first, second)
        a.vblendvps(dst, dst, first, tmp)


def clamp(a, v, dst, src, lo, hi, tmp, c):
    """dst = min(max(src, lo), hi), NaN kept (the constant is the first source: x86 returns the
    second source when either is NaN)."""
    a.vmaxps(dst, c.into(a, tmp, lo), src)
    a.vminps(dst, c.into(a, tmp, hi), dst)


def horner(a, dst, x, coeffs, c):
    """dst = polynomial(x), coefficients highest degree first (FMA Horner)."""
    c.load(a, dst, c.f(coeffs[0]))
    for k in coeffs[1:]:
        a.vfmadd213ps(dst, x, c.f(k))


# -- exp --------------------------------------------------------------------------------------


def emit_exp(a, v, dst, src, tmp, c, nonpositive=False):
    """dst = exp(src). tmp: 3 registers. Relative error <= 2 ulp for x in [-87.3, 88.7].
    ``nonpositive``: src is <= 0 or NaN (softmax's x - max), so one clamp and, on AVX2, 2^n in one
    factor (2 instructions for 9; results under 2^-126, x < -87.3, may be flushed to 0)."""
    t0, t1, t2 = tmp[:3]
    _exp_clamp(a, v, t0, src, t1, c, nonpositive)
    _exp_reduced(a, v, dst, t0, t0, (), (t1, t2), c, nonpositive)


def emit_exp_bf16(a, v, dst, src, tmp, c, nonpositive=False):
    """dst = exp(src) to 2^-16 relative (:data:`ACCURACY_BF16`), for a result rounded to bf16
    next (softmax probabilities): one ln 2 in the reduction and a degree-4 polynomial (AVX-512:
    10 instructions where emit_exp takes 14); the same clamps, specials and ``nonpositive``. tmp: 3."""
    t0, t1, t2 = tmp[:3]
    _exp_clamp(a, v, t0, src, t1, c, nonpositive)
    c.load(a, t1, c.f(_magic(v, nonpositive)))
    a.vfmadd231ps(t1, t0, c.f(LOG2E))              # s = n + MAGIC in its low mantissa bits
    a.vsubps(t2, t1, c.f(_magic(v, nonpositive)))
    a.vfnmadd231ps(t0, t2, c.f(LN2))               # r
    horner(a, dst, t0, EXP_POLY_BF16, c)
    _scale_pow2(a, v, dst, t1, t2, c, nonpositive)


# a nonpositive exp's clamp (AVX-512, AVX2): exp(-104) rounds to 0; on AVX2 n >= -127, whose 2^n bits are 0
EXP_FLOOR = {True: -104.0, False: -88.0}


def _exp_clamp(a, v, dst, src, tmp, c, nonpositive):
    """dst = src clamped to exp's domain (NaN kept); from below only for a ``nonpositive`` src."""
    if nonpositive:
        a.vmaxps(dst, c.into(a, tmp, EXP_FLOOR[v.avx512]), src)
    else:
        clamp(a, v, dst, src, -104.0, 88.8, tmp, c)


def _magic(v, nonpositive):
    """The rounding constant whose sum with x log2 e holds n in its low bits: with 127 added where
    AVX2 builds 2^n in one factor (:func:`_scale_pow2`), so that those bits are 2^n's exponent."""
    return MAGIC + 127 if nonpositive and not v.avx512 else MAGIC


def _exp_reduced(a, v, dst, approx, base, adds, tmp, c, nonpositive=False):
    """dst = exp(base + sum(adds)) given ``approx`` ~ that sum (to pick n); ``approx`` is
    clobbered (it becomes the reduced argument r), ``base`` too unless it is ``approx``."""
    s, nf = tmp
    c.load(a, s, c.f(_magic(v, nonpositive)))
    a.vfmadd231ps(s, approx, c.f(LOG2E))            # s = n + MAGIC in its low mantissa bits
    a.vsubps(nf, s, c.f(_magic(v, nonpositive)))
    r = approx
    if base is approx:
        a.vfnmadd231ps(r, nf, c.f(LN2_HI))          # exact: nf*LN2_HI has <= 24 bits
    else:
        a.vfmadd231ps(base, nf, c.f(LN2_HI))        # base + n*ln2_hi, rounded once
        a.vxorps(r, r, r)
        a.vsubps(r, r, base)
        for add in adds:
            a.vaddps(r, r, add)
    a.vfnmadd231ps(r, nf, c.f(LN2_LO))
    horner(a, dst, r, EXP_POLY, c)
    _scale_pow2(a, v, dst, s, nf, c, nonpositive)


def _scale_pow2(a, v, dst, s, t, c, nonpositive=False):
    """dst *= 2^n, n the integer-valued float ``t`` (and in s's low bits): AVX-512 ``vscalefps``
    (one instruction, denormal results rounded once); AVX2 two factors built in the exponent
    bits, so that n in [-150, 128] stays exact, or for n in [-127, 0] (``nonpositive``: s's low
    bits n + 127) one, n = -127 giving 0."""
    if v.avx512:
        a.vscalefps(dst, dst, t)
        return
    if nonpositive:
        a.vpslld(s, s, 23)
        a.vmulps(dst, dst, s)
        return
    a.vpsubd(s, s, c.i(f32_bits(MAGIC)))
    a.vpsrad(t, s, 1)
    a.vpsubd(s, s, t)
    for reg in (s, t):
        a.vpaddd(reg, reg, c.i(127))
        a.vpslld(reg, reg, 23)
        a.vmulps(dst, dst, reg)


# -- sigmoid, tanh ----------------------------------------------------------------------------
def emit_sigmoid(a, v, dst, src, tmp, c):
    """dst = 1 / (1 + exp(-src)). tmp: 3."""
    vxor(a, v, dst, src, c.i(SIGN))
    emit_exp(a, v, dst, dst, tmp, c)
    a.vaddps(dst, dst, c.f(1.0))
    a.vdivps(dst, c.into(a, tmp[0], 1.0), dst)




def emit_tanh(a, v, dst, src, tmp, c):
    """dst = tanh(src): a*P(a^2) for a = |x| < 0.55, else 1 - 2/(exp(2a)+1); sign restored. tmp: 5."""
    t0, t1, t2, t3, t4 = tmp[:5]
    vand(a, v, t3, src, c.i(ABS))
    a.vmulps(t4, t3, t3)
    horner(a, t1, t4, TANH_POLY, c)
    a.vmulps(t4, t1, t3)                            # small-|x| result
    a.vaddps(dst, t3, t3)
    emit_exp(a, v, dst, dst, (t0, t1, t2), c)
    a.vaddps(dst, dst, c.f(1.0))
    a.vdivps(dst, c.into(a, t0, 2.0), dst)
    a.vsubps(dst, c.into(a, t0, 1.0), dst)
    select(a, v, dst, t3, c.f(TANH_SMALL), LT, t4, dst, t0, c.k)
    vand(a, v, t0, src, c.i(SIGN))
    vor(a, v, dst, dst, t0)


# -- gelu --------------------------------------------------------------------------------------


def emit_gelu_tanh(a, v, dst, src, tmp, c):
    """dst = 0.5 x (1 + tanh(K0 (x + K1 x^3))) computed as x / (1 + exp(-2u)) (no cancellation
    for x < 0). tmp: 4."""
    t0, t1, t2, t3 = tmp[:4]
    a.vmulps(t3, src, src)
    c.load(a, dst, c.f(-2 * K0))
    a.vfmadd231ps(dst, t3, c.f(-2 * K0 * K1))
    a.vmulps(dst, dst, src)                         # -2u
    emit_exp(a, v, dst, dst, (t0, t1, t2), c)
    a.vaddps(dst, dst, c.f(1.0))
    a.vmaxps(t3, c.into(a, t3, -FLT_MAX), src)      # -inf -> -FLT_MAX: gelu(-inf) = -0
    a.vdivps(dst, t3, dst)


def emit_gelu_tanh_grad(a, v, dst, src, tmp, c):
    """dst = d/dx gelu_tanh(x) = s + x s (1-s) 2 K0 (1 + 3 K1 x^2), s = sigmoid(2u), 1-s = e s.
    tmp: 5."""
    t0, t1, t2, t3, t4 = tmp[:5]
    clamp(a, v, t4, src, -20.0, 20.0, t0, c)       # beyond: the derivative is 0 or 1 in fp32
    a.vmulps(t3, t4, t4)
    c.load(a, dst, c.f(-2 * K0))
    a.vfmadd231ps(dst, t3, c.f(-2 * K0 * K1))
    a.vmulps(dst, dst, t4)
    a.vminps(dst, dst, c.f(88.0))                   # e finite: e*s below stays a number
    emit_exp(a, v, dst, dst, (t0, t1, t2), c)       # e = exp(-2u)
    a.vaddps(t0, dst, c.f(1.0))
    a.vdivps(t0, c.into(a, t1, 1.0), t0)            # s
    a.vmulps(dst, dst, t0)
    a.vmulps(dst, dst, t0)                          # e s^2 = s (1 - s)
    c.load(a, t1, c.f(2 * K0))
    a.vfmadd231ps(t1, t3, c.f(6 * K0 * K1))
    a.vmulps(t1, t1, t4)
    a.vfmadd213ps(dst, t1, t0)
    keep_if(a, v, dst, src, c.f(-10.0), NLT, t0, c.k)   # below, |f'| < 4e-36: 0 (and 0 at -inf)




def _phi(a, v, dst, src, tmp, c):
    """dst = Phi(src) (standard normal CDF) = 1 - E/2 or E/2 with E = erfc(|x|/sqrt 2), which is
    t exp(P(t) - hi - lo), a^2 = hi + lo split exactly by FMA. tmp: 5."""
    t0, t1, t2, t3, t4 = tmp[:5]
    vand(a, v, t3, src, c.i(ABS))
    a.vminps(t3, t3, c.f(14.142135))                # a = |x|/sqrt 2 <= 10
    c.load(a, t4, c.f(1.0))
    a.vfmadd231ps(t4, t3, c.f(0.5 * 0.7071067811865476))
    a.vdivps(t4, c.into(a, t0, 1.0), t4)           # t = 1/(1 + a/2)
    a.vsubps(t1, t4, c.f(ERFC_MID))
    horner(a, dst, t1, ERFC_POLY, c)                # P
    a.vmulps(t2, t3, t3)                            # a^2 = x^2/2 = (hi + lo)/2, both exact
    a.vmovups(t1, t2)
    a.vfmsub231ps(t1, t3, t3)
    a.vmulps(t2, t2, c.f(0.5))
    a.vmulps(t1, t1, c.f(0.5))
    a.vsubps(t0, dst, t2)                           # ~ argument, to choose n
    # r = P - (hi + n ln2_hi) - lo - n ln2_lo, then the polynomial
    c.load(a, t3, c.f(MAGIC))
    a.vfmadd231ps(t3, t0, c.f(LOG2E))               # s
    a.vsubps(t0, t3, c.f(MAGIC))                    # nf
    a.vfmadd231ps(t2, t0, c.f(LN2_HI))
    a.vsubps(t2, dst, t2)
    a.vsubps(t2, t2, t1)
    a.vfnmadd231ps(t2, t0, c.f(LN2_LO))             # r
    horner(a, dst, t2, EXP_POLY, c)
    _scale_pow2(a, v, dst, t3, t0, c)
    a.vmulps(dst, dst, t4)                          # E
    a.vmulps(t0, dst, c.f(0.5))
    c.load(a, t1, c.f(1.0))
    a.vsubps(t1, t1, t0)
    select_sign(a, v, dst, t1, t0, src, c)
    keep_if(a, v, dst, src, c.f(-14.1), GE, t0, c.k)     # E clamps at a = 10: Phi is 0 below


def emit_gelu_erf(a, v, dst, src, tmp, c):
    """dst = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)). tmp: 5."""
    _phi(a, v, dst, src, tmp, c)
    a.vmaxps(tmp[0], c.into(a, tmp[0], -FLT_MAX), src)
    a.vmulps(dst, dst, tmp[0])


GELU_BF16_LIM = 15.0      # |x| clamp: Phi(-15) < 2^-150, so x Phi(-|x|) is 0 in fp32 (AVX-512)
GELU_BF16_AVX2_LO = -13.0  # AVX2 builds 2^n in one factor (y >= -87): below, the result (< 4e-38) is -0


def emit_gelu_erf_bf16(a, v, dst, src, tmp, c):
    """dst = gelu_erf(src) to 2^-16 relative, for a result rounded to bf16 next: with s = |x|
    (clamped) and t = 1/(1 + s/sqrt 8), h = Phi(-s) = t exp(Q(t) - s^2/2), Q of degree 5
    (:data:`HALF_ERFC_POLY_BF16`), exp by one reduction and a degree-4 polynomial; then x h for
    x < 0 and x - x h for x >= 0, with x clamped to +-15 in the products (so +-inf and the far
    left give inf and -0; a NaN passes through). ~27 instructions where emit_gelu_erf takes ~55
    (AVX2: results under ~4e-38 are -0). tmp: 4."""
    t0, t1, t2, t3 = tmp[:4]
    vand(a, v, t3, src, c.i(ABS))
    a.vminps(t3, t3, c.f(GELU_BF16_LIM))           # s = |x| (a NaN gives the limit)
    c.load(a, t2, c.f(1.0))
    a.vfmadd231ps(t2, t3, c.f(0.5 * 0.7071067811865476))   # d = 1 + a/2, a = s/sqrt 2
    _estimate(a, v, "vrcp", t0, t2)                 # t = 1/d: the estimate and one Newton step,
    c.load(a, t1, c.f(1.0))                         # 2^-22 (vdivps measured slower in a bf16
    a.vfnmadd231ps(t1, t2, t0)                      # BRGEMM with this epilogue; Zen 4)
    a.vfmadd213ps(t1, t0, t0)
    horner(a, dst, t1, HALF_ERFC_POLY_BF16, c)      # Q(t)
    a.vmulps(t2, t3, c.f(-0.5))
    a.vfmadd231ps(dst, t2, t3)                      # y = Q - s^2/2
    c.load(a, t2, c.f(GELU_BF16_LIM))
    a.vminps(t2, t2, src)                           # x clamped (NaN kept: the second source)
    if v.avx512:
        c.load(a, t3, c.f(-GELU_BF16_LIM))
        a.vmaxps(t2, t3, t2)
    else:
        a.vmaxps(dst, dst, c.f(-87.0))
        a.vcmpps(t3, src, c.f(GELU_BF16_AVX2_LO), NLT)
        a.vblendvps(t2, c.into(a, t0, -0.0), t2, t3)
    a.vmulps(t2, t2, t1)                            # w = x t
    c.load(a, t0, c.f(MAGIC))
    a.vfmadd231ps(t0, dst, c.f(LOG2E))              # s: n in its low bits
    a.vsubps(t1, t0, c.f(MAGIC))
    a.vfnmadd231ps(dst, t1, c.f(LN2))               # r = y - n ln2
    if v.avx512:
        horner(a, t0, dst, EXP_POLY_BF16, c)
        a.vscalefps(t1, t0, t1)
        a.vmulps(dst, t1, t2)                       # x h
        a.vptestnmd(c.k, src, c.i(SIGN))
        a.vsubps(dst.mask(c.k), src, dst)           # x >= 0: x - x h
    else:
        horner(a, t1, dst, EXP_POLY_BF16, c)
        a.vpaddd(t0, t0, c.i(127 - f32_bits(MAGIC)))
        a.vpslld(t0, t0, 23)                        # 2^n
        a.vmulps(t1, t1, t0)
        a.vmulps(t1, t1, t2)                        # x h
        a.vsubps(t0, src, t1)
        a.vblendvps(dst, t0, t1, src)               # by the sign of x


def _lane_rows(table):
    """``table``'s rows as int32 lane values (what :meth:`Consts.lanes` takes)."""
    return [tuple(f32_bits(k) for k in row) for row in table.rows]


# AVX-512 (True) or AVX2: the :class:`tppasm.approx.GeluTable` a vpermps picks from, and its rows
GELU_TABLES = {True: (GELU_TABLE_16, _lane_rows(GELU_TABLE_16)), False: (GELU_TABLE_8, _lane_rows(GELU_TABLE_8))}


def round_nearest(a, v, dst, src):
    """dst = src rounded to the nearest integer (ties to even) by the instruction's immediate, not
    MXCSR.RC: a caller's fesetround must not move a table index (imm 8: RC nearest, bit 3 keeps
    the precision exception quiet)."""
    (a.vrndscaleps if v.avx512 else a.vroundps)(dst, src, 8)


def emit_gelu_erf_fast(a, v, dst, src, tmp, c):
    """dst = gelu_erf(src) to an absolute error of 2^-22 max(1, |x|) (ACCURACY_ABS; torch's erf
    has 1.5e-7) as x/2 + s f(s), s = |x|, f = erf(s/sqrt 2)/2 a polynomial on each of 16 (AVX2:
    8) intervals of s whose coefficients ``vpermps`` picks (:data:`GELU_TABLES`).
    x is clamped at -limit first, so -inf gives 0 and +inf inf; a NaN passes through. The
    interval is picked by rounding to nearest whatever MXCSR.RC says (a directed mode would pick
    a neighbour, or a row past the table, which vpermps wraps to row 0). 21
    instructions (AVX2: 23) and no division, where emit_gelu_erf takes ~55; the tables are 6
    (7) vectors that :func:`lane_tables` names, for a caller to keep in registers. tmp: 5."""
    t0, t1, t2, t3, t4 = tmp[:5]
    tab, rows = GELU_TABLES[v.avx512]
    c.load(a, t0, c.f(-tab.limit))
    a.vmaxps(t0, t0, src)                           # x' (a NaN kept: the second source)
    vand(a, v, t1, t0, c.i(ABS))                    # s
    a.vminps(t2, t1, c.f(tab.limit * (1 - 2.0 ** -20)))   # inside the last interval
    a.vmulps(t3, t2, c.f(tab.inv_h))                # s/h, < intervals - 1/2 in any rounding mode
    round_nearest(a, v, dst, t3)                    # the interval j, whatever MXCSR.RC says
    a.vcvttps2dq(t3, dst)                           # j as the vpermps index
    a.vfmsub132ps(t2, dst, c.f(tab.inv_h))          # w = s/h - j
    a.vpermps(dst, t3, c.lanes(rows[0]))
    for row in rows[1:]:
        a.vpermps(t4, t3, c.lanes(row))
        a.vfmadd213ps(dst, t2, t4)                  # f(s)
    a.vmulps(t2, t0, c.f(0.5))
    a.vfmadd213ps(dst, t1, t2)                      # x'/2 + s f(s)


def lane_tables(name, v):
    """The lane tables (int32 value tuples) emitter ``name`` reads for ``v``, [] if none."""
    return GELU_TABLES[v.avx512][1] if name in LANE_TABLE_EMITTERS else []


LANE_TABLE_EMITTERS = ("gelu_erf_fast",)


def emit_gelu_erf_grad(a, v, dst, src, tmp, c):
    """dst = d/dx gelu_erf(x) = Phi(x) + x exp(-x^2/2) / sqrt(2 pi). tmp: 5."""
    t0, t1, t2, t3, t4 = tmp[:5]
    _phi(a, v, dst, src, tmp, c)
    clamp(a, v, t4, src, -20.0, 20.0, t0, c)
    a.vmulps(t0, t4, t4)
    a.vmulps(t0, t0, c.f(-0.5))
    emit_exp(a, v, t1, t0, (t0, t2, t3), c)
    a.vmulps(t1, t1, t4)
    a.vfmadd231ps(dst, t1, c.f(0.3989422804014327))


# -- reciprocal, rsqrt: estimate + one second-order Newton step ------------------------------
def _estimate(a, v, name, dst, src):
    if v.avx512:
        getattr(a, name + "14ps")(dst, src)
    else:
        getattr(a, name + "ps")(dst, src)


def emit_reciprocal(a, v, dst, src, tmp, c):
    """dst = 1/x: y0 = rcp(x), e = 1 - x y0, y = y0 + y0 (e + e^2); where that is NaN for a
    non-NaN estimate (x = 0 or inf) the estimate is exact and kept. On AVX2, whose ``vrcpps``
    takes a denormal x as 0 (giving inf), a correctly rounded ``vdivps`` instead. tmp: 2."""
    t0, t1 = tmp[:2]
    if not v.avx512:
        c.load(a, dst, c.f(1.0))
        a.vdivps(dst, dst, src)
        return
    _estimate(a, v, "vrcp", t0, src)
    c.load(a, t1, c.f(1.0))
    a.vfnmadd231ps(t1, src, t0)                     # e
    a.vfmadd213ps(t1, t1, t1)                       # e + e^2
    a.vmovaps(dst, t1)
    a.vfmadd213ps(dst, t0, t0)
    _keep_estimate(a, v, dst, t0, t1, c.k)


def emit_rsqrt(a, v, dst, src, tmp, c):
    """dst = 1/sqrt(x): y0 = rsqrt(x), e = 1 - x y0^2, y = y0 + y0 e (1/2 + 3/8 e). AVX2's
    ``vrsqrtps`` takes a denormal x as 0: there x is scaled by 2^24 first and the result by 2^12
    after (:func:`_denormal_scale`; on Zen 4 1.8x the time of the unscaled form). tmp: 2."""
    t0, t1 = tmp[:2]
    x = src
    if not v.avx512:
        _denormal_scale(a, t1, src, 2.0 ** 24, c)
        a.vaddps(t1, t1, c.f(1.0))
        a.vmulps(t1, t1, src)                       # (x + x (s - 1) would make inf's 0 * inf)
        x = t1
    _estimate(a, v, "vrsqrt", t0, x)
    a.vmulps(t1, x, t0)
    a.vfnmadd213ps(t1, t0, c.f(1.0))                # e = 1 - (x y0) y0
    c.load(a, dst, c.f(0.375))
    a.vfmadd213ps(dst, t1, c.f(0.5))
    a.vmulps(dst, dst, t1)
    a.vfmadd213ps(dst, t0, t0)
    _keep_estimate(a, v, dst, t0, t1, c.k)
    if not v.avx512:
        _denormal_scale(a, t1, src, 2.0 ** 12, c)
        a.vfmadd231ps(dst, dst, t1)                 # (y is finite, or inf where s - 1 > 0)


def _denormal_scale(a, dst, src, factor, c):
    """AVX2: dst = ``factor`` - 1 in the lanes where |src| is below the smallest normal fp32, else 0."""
    a.vandps(dst, src, c.i(ABS))
    a.vcmpps(dst, dst, c.f(2.0 ** -126), LT)
    a.vandps(dst, dst, c.f(factor - 1))


def _keep_estimate(a, v, y, est, tmp, k):
    """y = isnan(y) ? est : y (x = 0 or inf: the Newton step computes 0*inf)."""
    if v.avx512:
        a.vcmpps(k, y, y, 3)
        a.vmovaps(y.mask(k), est)
    else:
        a.vcmpps(tmp, y, y, 3)
        a.vblendvps(y, y, est, tmp)


EMITTERS = {"exp": emit_exp, "exp_bf16": emit_exp_bf16, "sigmoid": emit_sigmoid, "tanh": emit_tanh, "gelu_tanh": emit_gelu_tanh,
            "gelu_erf": emit_gelu_erf, "gelu_erf_bf16": emit_gelu_erf_bf16, "gelu_erf_fast": emit_gelu_erf_fast,
            "gelu_tanh_grad": emit_gelu_tanh_grad, "gelu_erf_grad": emit_gelu_erf_grad,
            "reciprocal": emit_reciprocal, "rsqrt": emit_rsqrt}
