"""fp32/bf16 lane arithmetic with x86 results, bit for bit where the hardware is exact.

- IEEE operations (+ - * / sqrt) are NumPy's float32 ones (round to nearest even, MXCSR default:
  no DAZ/FTZ); NaN results then follow x86: the first NaN source in operand order, quieted, else
  the default NaN 0xFFC00000 for invalid operations.
- ``fma32`` is a single-rounding fused multiply-add: the product is exact in float64; where the
  float64 sum could round differently from the exact one (a float32 midpoint, or the subnormal
  range) the sum is made round-to-odd with TwoSum, and round-to-odd then float32 is correctly
  rounded (53 >= 24 + 2).
- ``to_bf16`` is the SDM's convert_fp32_to_bfloat16: denormals to signed zero, NaN truncated
  and quieted, otherwise round to nearest even.
- Approximations (``recip``/``rsqrt``): the exact value rounded to p significant bits, p = 12 for
  rcpps/rsqrtps (SDM bound 1.5*2^-12) and 14 for rcp14/rsqrt14 (bound 2^-14); the real hardware
  tables differ, so results are compared within those bounds, never bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

f32, f64, u32, u16, i64 = np.float32, np.float64, np.uint32, np.uint16, np.int64
DEFAULT_NAN = np.uint32(0xFFC00000)
QUIET = np.uint32(0x00400000)
_ZEROS: dict = {}


def nonfinite(r: np.ndarray) -> bool:
    """True when some lane is NaN or inf (one BLAS call instead of isnan().any())."""
    z = _ZEROS.get(r.size)
    if z is None:
        z = _ZEROS[r.size] = np.zeros(r.size, f32)
    return math.isnan(r.dot(z) if r.ndim == 1 else r.reshape(-1).dot(z))


def nan_rule(r: np.ndarray, *srcs) -> np.ndarray:
    """Replace NaN lanes of r per x86: first NaN source (priority order), quieted, else default NaN."""
    out = np.where(np.isnan(r), DEFAULT_NAN, r.view(u32))
    for s in reversed(srcs):
        s = np.asarray(s, f32)
        out = np.where(np.isnan(s), s.view(u32) | QUIET, out)
    return out.astype(u32).view(f32)


def fbin(op):
    """Lane-wise binary IEEE op with x86 NaN propagation (a has priority over b)."""
    def f(n, a, b):
        r = op(a, b)
        return nan_rule(r, a, b) if nonfinite(r) else r
    return f


def funary(op):
    def f(n, a):
        r = op(a)
        return nan_rule(r, a) if nonfinite(r) else r
    return f


def _round_to_odd(s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """s = RN(x), e = x - s exactly: return round-to-odd(x) in float64."""
    inexact = (e != 0) & np.isfinite(e)
    if not inexact.any():
        return s
    fix = inexact & ((s.view(i64) & 1) == 0)
    toward = np.where(e > 0, np.inf, -np.inf)
    return np.where(fix, np.nextafter(s, toward), s)


_LOW29, _MID29 = np.int64(0x1FFFFFFF), np.int64(0x10000000)
_FTZ_EDGE = 2.0 ** -126 - 2.0 ** -151       # below it the 24-bit rounding stays under 2^-126
_MAG64, _TINY64 = np.uint64(0x7FFFFFFFFFFFFFFF), np.uint64(((1023 - 126) << 52) - 1)
_ONE64 = np.uint64(1)


def fma32(a, b, c, *, prio=None, daz_ftz=False) -> np.ndarray:
    """Correctly rounded float32 a*b + c (one rounding), x86 NaN rules over ``prio`` sources.

    >>> x = np.array([1 + 2 ** -12], f32)          # x*x is a float32 midpoint; c breaks the tie
    >>> bool(fma32(x, x, np.array([2 ** -60], f32))[0] > 1 + 2 ** -11)
    True

    s = RN64(a*b + c) (the product is exact in float64) rounds to float32 like the exact value
    unless s is a float32 midpoint or lies in the float32 subnormal range: only those lanes need
    the exact error (TwoSum) and round-to-odd, which is rare, so it is done only when present.
    """
    if daz_ftz:
        a, b, c = daz(a), daz(b), daz(c)
    p = np.multiply(a, b, dtype=f64)
    s = p + c
    bits = s.view(i64)
    tiny = ((bits.view(np.uint64) & _MAG64) - _ONE64) < _TINY64  # 0 < |s| < 2^-126 (zero is exact)
    any_tiny = False
    if np.count_nonzero(((bits & _LOW29) == _MID29) | tiny):
        any_tiny = bool(np.count_nonzero(tiny))
        bb = s - p
        s = _round_to_odd(s, (p - (s - bb)) + (c - bb))
    r = s.astype(f32)
    if daz_ftz:
        if any_tiny:  # x86 flushes what is tiny after rounding to 24 bits (unbounded exponent)
            r = np.where(np.abs(s) < _FTZ_EDGE, np.copysign(f32(0), r), r)
        r = ftz(r)
    if nonfinite(r):
        r = nan_rule(r, *(prio if prio is not None else (a, b, c)))
    return r


def daz(x) -> np.ndarray:
    """Denormal inputs read as signed zero."""
    x = np.asarray(x, f32)
    u = x.view(u32)
    return np.where((u & 0x7F800000) == 0, u & 0x80000000, u).astype(u32).view(f32)


ftz = daz  # denormal results flushed to signed zero: same bit operation


def to_bf16(x: np.ndarray) -> np.ndarray:
    """SDM convert_fp32_to_bfloat16 (uint16 lanes).

    >>> [hex(v) for v in to_bf16(np.array([1.00390625, 1.01171875, 1e-40], f32))]
    ['0x3f80', '0x3f82', '0x0']
    """
    u = np.asarray(x, f32).view(u32)
    exp, man = u & 0x7F800000, u & 0x007FFFFF
    rounded = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
    res = np.where((exp == 0x7F800000) & (man != 0), (u >> 16) | 0x40,
                   np.where(exp == 0, (u >> 16) & 0x8000, rounded))
    return res.astype(u16)


def from_bf16(h: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16 lanes) to float32 (exact)."""
    return (np.asarray(h, u16).astype(u32) << 16).view(f32)


def _keep_bits(x64: np.ndarray, p: int) -> np.ndarray:
    """Round a float64 to p significant bits (nearest, ties away) and return float32."""
    drop = 52 - (p - 1)
    u = x64.view(np.uint64)
    u = (u + np.uint64(1 << (drop - 1))) & ~np.uint64((1 << drop) - 1)
    return u.view(f64).astype(f32)


def approx(kind: str, p: int, flush_denormal_input: bool):
    """rcp/rsqrt approximations: the exact value rounded to p bits (see module docstring). Where
    that is the smallest normal, hardware's estimate may fall below it and flush to 0 (Zen 4:
    vrcpps(2^126) is 0, here 2^-126): a kernel keeps such inputs away from its estimates."""
    def f(n, a):
        x = daz(a) if flush_denormal_input else a
        x64 = x.astype(f64)
        with np.errstate(all="ignore"):
            r = 1.0 / x64 if kind == "rcp" else 1.0 / np.sqrt(x64)
        r = np.where(np.isfinite(r) & (r != 0), r, r)
        out = _keep_bits(np.ascontiguousarray(r), p)
        out = np.where(np.isnan(r), np.float32(np.nan), out)     # (rounding a long NaN payload carries out of it)
        if flush_denormal_input:
            out = ftz(out)
        return nan_rule(out, a) if nonfinite(out) else out
    return f


def cvt_f32_i32(truncate: bool):
    """cvt(t)ps2dq: RNE or truncation; NaN and out-of-range give the integer indefinite 0x80000000."""
    def f(n, a):
        with np.errstate(all="ignore"):
            r = np.trunc(a) if truncate else np.rint(a)
            ok = (r >= -2147483648.0) & (r < 2147483648.0)
            return np.where(ok, r, -2147483648.0).astype(np.int32)
    return f


def roundscale(n, imm, a):
    """vrndscaleps: round to 2^-M multiples, M = imm[7:4]; vroundps: :func:`round_ps`."""
    mode = imm & 3 if not imm & 4 else 0
    scale = float(2 ** ((imm >> 4) & 15))
    fn = (np.rint, np.floor, np.ceil, np.trunc)[mode]
    x = a.astype(f64) * scale
    r = (fn(x) / scale).astype(f32)
    r = np.where(np.isinf(a), a, r)
    return nan_rule(r, a) if nonfinite(r) else r


def round_ps(n, imm, a):
    """vroundps: round per imm[1:0] (imm[2]: MXCSR's mode, round to nearest even); imm[7:4] are
    reserved and ignored (no scale, unlike vrndscaleps)."""
    return roundscale(n, imm & 0xF, a)


def scalef(n, a, b):
    """vscalefps: a * 2^floor(b) (DAZ off; NaN rules; special zero*inf cases give default NaN)."""
    with np.errstate(all="ignore"):
        fb = np.floor(b.astype(f64))
        e = np.clip(np.nan_to_num(fb, nan=0.0, posinf=400, neginf=-400), -400, 400).astype(np.int32)
        r = np.ldexp(a.astype(f64), e).astype(f32)
        r = np.where(np.isinf(b) & (b > 0) & (a == 0), np.float32(np.nan), r)
        r = np.where(np.isinf(b) & (b < 0) & np.isinf(a), np.float32(np.nan), r)
        r = np.where(np.isnan(b), np.float32(np.nan), r)        # (a NaN scale made e 0 above)
    r = nan_rule(r, a, b) if nonfinite(r) else r
    quiet_a = np.isnan(a) & (a.view(u32) & np.uint32(1 << 22) != 0)     # the SDM's table: QNaN * 2^-inf = +0,
    return np.where(quiet_a & np.isinf(b), np.where(b > 0, np.float32(np.inf), np.float32(0)), r)  # 2^+inf: +inf


def getexp(n, a):
    """vgetexpps: floor(log2|a|) as fp32; 0 -> -inf, inf -> +inf, NaN quieted."""
    with np.errstate(all="ignore"):
        m_, e = np.frexp(np.abs(a.astype(f64)))
        r = (e - 1).astype(f32)
        r = np.where(a == 0, np.float32(-np.inf), np.where(np.isinf(a), np.float32(np.inf), r))
        r = np.where(np.isnan(a), np.float32(np.nan), r)        # (frexp gives a NaN the exponent 0)
    return nan_rule(r, a) if nonfinite(r) else r


def fsqrt(n, a):
    with np.errstate(all="ignore"):
        r = np.sqrt(a)
    return nan_rule(r, a) if nonfinite(r) else r
