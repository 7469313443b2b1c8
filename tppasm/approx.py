"""The arithmetic behind the transcendental TPPs, independent of the ISA: range-reduction
constants, polynomial coefficients (fitted once, at import) and limits. The x86 emitters
(:mod:`tppasm.x86.math`) and the SVE ones (:mod:`tppasm.sve.math`) evaluate the same formulas.

>>> abs(sum(EXP_POLY[-3:]) - 2.5) < 1e-12 and len(TANH_POLY) == 6 and len(ERFC_POLY) == 11
True
>>> len(HALF_ERFC_POLY_BF16), len(EXP_POLY_BF16)
(6, 5)
"""
import math
from collections import namedtuple

import numpy as np

# exp: x = n ln2 + r, |r| <= ln2/2; 2^n built in the exponent bits
LOG2E = 1.4426950408889634
LN2_HI, LN2_LO = 0.693145751953125, 1.4286068203094172e-06     # LN2_HI has 16 trailing zero bits
MAGIC = 12582912.0                                              # 1.5 * 2^23: adding it rounds to int
EXP_POLY = [1 / 5040, 1 / 720, 1 / 120, 1 / 24, 1 / 6, 0.5, 1.0, 1.0]   # Taylor, |r| <= ln2/2

# tanh: a polynomial below TANH_SMALL, 1 - 2/(exp(2a)+1) above
TANH_SMALL = 0.55


def _fit_tanh():
    """tanh(x)/x as a polynomial in x^2 on [0, TANH_SMALL] (least squares on Chebyshev nodes)."""
    s = (np.cos(np.linspace(0, np.pi, 2000)) + 1) * 0.5 * TANH_SMALL ** 2
    x = np.sqrt(s)
    y = np.where(x > 0, np.tanh(x) / np.where(x > 0, x, 1), 1.0)
    return [float(k) for k in np.polyfit(s, y, 5)]


TANH_POLY = _fit_tanh()

# gelu (tanh form): 0.5 x (1 + tanh(K0 (x + K1 x^3)))
K0 = 0.7978845608028654          # sqrt(2/pi)
K1 = 0.044715
FLT_MAX = 3.4028234663852886e38

# gelu (erf form) through erfc
ERFC_MID = 7 / 12                 # t = 1/(1 + a/2) in [1/6, 1] for a = |x|/sqrt(2) in [0, 10]


def _fit_erfc(degree=10, mid=ERFC_MID, halve=False):
    """P with erfc(a) = t exp(P(t - mid) - a^2) (``halve``: erfc(a) / 2), least squares on
    Chebyshev nodes in t."""
    lo, hi = 1 / 6, 1.0
    t = (np.cos(np.linspace(0, np.pi, 3000)) * 0.5 + 0.5) * (hi - lo) + lo
    a = 2 * (1 / t - 1)
    y = np.log(np.array([math.erfc(z) for z in a]) / (t * (2 if halve else 1))) + a * a
    return [float(k) for k in np.polyfit(t - mid, y, degree)]


def _fit_exp(degree):
    """exp(r) on |r| <= ln2/2 as a polynomial with constant term 1 (so exp(0) = 1 exactly), least
    squares of the relative error."""
    r = np.cos(np.linspace(0, np.pi, 2000)) * math.log(2) / 2
    w = np.exp(-r)
    coeffs, *_ = np.linalg.lstsq(np.vander(r, degree + 1)[:, :-1] * w[:, None], (np.exp(r) - 1) * w, rcond=None)
    return [float(k) for k in coeffs] + [1.0]


ERFC_POLY = _fit_erfc()
# gelu_erf for results rounded to bf16 (2^-9): 2^-16 relative is plenty; measured 1.1e-5 with
# these degrees, the rounding of x^2/2 (one fp32 rounding of up to 87) being most of it. In t
# itself (a subtraction less; fine at degree 5), and Phi(-|x|) = erfc / 2 directly.
HALF_ERFC_POLY_BF16 = _fit_erfc(5, mid=0.0, halve=True)
EXP_POLY_BF16 = _fit_exp(4)
LN2 = 0.6931471805599453

# gelu_erf to an absolute error (as torch's own erf): x/2 + |x| f(|x|), f(s) = erf(s/sqrt 2)/2 a
# polynomial in w = s/h - j on each interval [(j - 1/2) h, (j + 1/2) h), its coefficients picked
# by j from a table of one vector per power (vpermps), f = 1/2 on the last interval (Phi(-5.6) <
# 2^-26). Simulated in float32: |error| <= 0.42 * 2^-22 * max(1, |x|) with either table.
GeluTable = namedtuple("GeluTable", "limit inv_h rows")


def _fit_gelu_table(intervals, limit, degree):
    """The :class:`GeluTable` of ``intervals`` on [0, limit): ``rows[p]`` holds the coefficient of
    w^(degree - p) of every interval (least squares on Chebyshev nodes, rounded to float32)."""
    h = limit / (intervals - 0.5)
    w = np.cos(np.linspace(0, np.pi, 400)) * 0.5
    coeffs = []
    for j in range(intervals - 1):
        wj = (w + 0.5) * 0.5 if j == 0 else w          # s >= 0: the first interval is half used
        coeffs.append(np.polyfit(wj, [0.5 * math.erf((j + x) * h / math.sqrt(2)) for x in wj], degree))
    coeffs.append([0.0] * degree + [0.5])
    rows = np.array(coeffs, np.float32).T
    return GeluTable(limit, float(np.float32(1 / h)), tuple(tuple(float(k) for k in row) for row in rows))


GELU_TABLE_16 = _fit_gelu_table(16, 6.0, 5)       # AVX-512: vpermps picks from 16 lanes
GELU_TABLE_8 = _fit_gelu_table(8, 6.4, 6)         # AVX2: 8 lanes
