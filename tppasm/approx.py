"""The arithmetic behind the transcendental TPPs, independent of the ISA: range-reduction
constants, polynomial coefficients and limits. The x86 emitters (:mod:`tppasm.x86.math`) and the
SVE ones (:mod:`tppasm.sve.math`) evaluate the same formulas. The coefficients are the fits of the
``_fit_*`` functions here, written out: fitting them at import cost a process's first kernel ~70 ms
(tests/tpp/test_approx.py fits them again and compares).

>>> EXP_POLY[-1] == 1.0 and len(EXP_POLY) == 7 and len(TANH_POLY) == 6 and len(ERFC_POLY) == 11
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

# tanh: a polynomial below TANH_SMALL, 1 - 2/(exp(2a)+1) above
TANH_SMALL = 0.55


def _fit_tanh():
    """tanh(x)/x as a polynomial in x^2 on [0, TANH_SMALL] (least squares on Chebyshev nodes)."""
    s = (np.cos(np.linspace(0, np.pi, 2000)) + 1) * 0.5 * TANH_SMALL ** 2
    x = np.sqrt(s)
    y = np.where(x > 0, np.tanh(x) / np.where(x > 0, x, 1), 1.0)
    return [float(k) for k in np.polyfit(s, y, 5)]


TANH_POLY = [  # _fit_tanh()
    -0.006238850673496554, 0.0210421853222763, -0.05384337876130705, 0.13332468115285553, -0.33333311244332864,
    0.99999999908366
]

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


ERFC_POLY = [  # _fit_erfc()
    -0.1449081398416583, 0.14492810675486167, 0.1429508264441025, -0.24506388952741212, -0.05273672599229512,
    0.29521234936864243, -0.03468891534863421, -0.4073979332797321, 0.09069162693020094, 1.3687370471064915,
    -0.5585953537287202
]
# gelu_erf for results rounded to bf16 (2^-9): 2^-16 relative is plenty; measured 1.1e-5 with
# these degrees, the rounding of x^2/2 (one fp32 rounding of up to 87) being most of it. In t
# itself (a subtraction less; fine at degree 5), and Phi(-|x|) = erfc / 2 directly.
HALF_ERFC_POLY_BF16 = [  # _fit_erfc(5, mid=0.0, halve=True)
    0.23058047877317392, -0.7148308012921846, 0.48125294473753066, 0.25063209026497485, 1.0190104206378874,
    -1.9597841290442197
]
# exp(r), |r| <= ln2/2: degree 6, one FMA less than the degree-7 Taylor series it replaced (exp
# 0.9x the time on a Zen 3 core, where the FMA pipes bound softmax's exp pass), worst error over
# [-87.3, 88.7] 1.01 ulp instead of 0.91
EXP_POLY = [  # _fit_exp(6)
    0.001385930071255341, 0.008374769942849025, 0.04166772443041732, 0.16666420874545615, 0.4999999534957524,
    1.0000000361076133, 1.0
]
EXP_POLY_BF16 = [  # _fit_exp(4)
    0.041589902493414425, 0.1679064212355279, 0.5000222275545452, 0.9999636500616143, 1.0
]
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


# _fit_gelu_table(16, 6.0, 5); AVX-512: vpermps picks from 16 lanes
GELU_TABLE_16 = GeluTable(6.0, 2.5833332538604736, (
    (8.450369205093011e-05, 5.6568547734059393e-05, -4.849233391723828e-06, -4.770740633830428e-05,
     -4.884267400484532e-05, -2.4197055608965456e-05, -6.764913109691406e-07, 9.341069016954862e-06,
     8.914580575947184e-06, 5.193127890379401e-06, 2.233149643871002e-06, 7.541410695921513e-07,
     2.0591237159806042e-07, 4.621205818011731e-08, 8.61362625670381e-09, 0.0),
    (1.6339031390089076e-06, 0.00037867517676204443, 0.0005102974246256053, 0.0003633132146205753,
     0.00010604690760374069, -8.106862514978275e-05, -0.00013880588812753558, -0.0001115298000513576,
     -6.319452222669497e-05, -2.7726133339456283e-05, -9.787004273675848e-06, -2.8354800178931328e-06,
     -6.823381681897445e-07, -1.3745258797825954e-07, -2.3304414398239715e-08, 0.0),
    (-0.003857190255075693, -0.0030420864932239056, -0.0011450190795585513, 0.0006849475903436542,
     0.0016253606881946325, 0.0016273449873551726, 0.0011422145180404186, 0.0006224523531273007,
     0.000274014106253162, 9.940309973899275e-05, 3.006160113727674e-05, 7.63508342060959e-06,
     1.6367639545933343e-06, 2.9722605177084915e-07, 4.5842764251347035e-08, 0.0),
    (5.941213387927746e-08, -0.010734645649790764, -0.017147747799754143, -0.01768532581627369,
     -0.013956954702734947, -0.008889184333384037, -0.004678691737353802, -0.0020609607454389334,
     -0.0007655507652089, -0.00024096210836432874, -6.448130443459377e-05, -1.4704638488183264e-05,
     -2.8626300263567828e-06, -4.7636260092076554e-07, -6.782872929989026e-08, 0.0),
    (0.15442927181720734, 0.1432819366455078, 0.11443974077701569, 0.07868390530347824, 0.04657132178544998,
     0.02372874692082405, 0.010407697409391403, 0.003929688595235348, 0.0012772775953635573,
     0.00035738482256419957, 8.608167991042137e-05, 1.784880987543147e-05, 3.185898549418198e-06,
     4.89529668357136e-07, 6.475165292840757e-08, 0.0),
    (1.8713322558205903e-11, 0.15065771341323853, 0.28059181571006775, 0.37723806500434875,
     0.4392354488372803, 0.4735345244407654, 0.4898991584777832, 0.49663257598876953, 0.4990217983722687,
     0.49975287914276123, 0.4999457895755768, 0.49998968839645386, 0.4999983012676239, 0.4999997615814209,
     0.4999999701976776, 0.5),
))
# _fit_gelu_table(8, 6.4, 6); AVX2: 8 lanes
GELU_TABLE_8 = GeluTable(6.4, 1.171875, (
    (-0.0006417608237825334, -0.0010143844410777092, 0.0004545518895611167, 0.00016162589599844068,
     -7.163636473705992e-05, -1.7290005416725762e-05, -1.0710331252994365e-06, 0.0),
    (0.004939377773553133, -0.0007983442046679556, -0.0020646932534873486, 0.00034112806315533817,
     0.00030723982490599155, 4.012519639218226e-05, 1.8411348037261632e-06, 0.0),
    (-0.0001424492511432618, 0.011867609806358814, 0.000310043862555176, -0.003027551341801882,
     -0.0007685164455324411, -6.361774285323918e-05, -2.112704123646836e-06, 0.0),
    (-0.04129110649228096, -0.00781299825757742, 0.01841490902006626, 0.008665894158184528,
     0.0012986322399228811, 7.88984980317764e-05, 2.08832125281333e-06, 0.0),
    (-2.0260772544133943e-06, -0.0861218124628067, -0.057780396193265915, -0.014036543667316437,
     -0.0014633305836468935, -6.905408372404054e-05, -1.5108199704627623e-06, 0.0),
    (0.3404307961463928, 0.23654159903526306, 0.07934916764497757, 0.01285073533654213,
     0.0010048068361356854, 3.793944415519945e-05, 6.921140993654262e-07, 0.0),
    (-3.1445404613528183e-10, 0.30326277017593384, 0.45605799555778503, 0.49476638436317444,
     0.4996791183948517, 0.4999900758266449, 0.49999985098838806, 0.5),
))
