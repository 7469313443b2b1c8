"""How :func:`tppasm.testing.assert_matches_reference` compares a result with its reference.

Integers must be equal. Floats of element-wise kinds (each output element computed from a few
inputs: unary, binary, transforms, quantize, dequant, SwiGLU, a reduction to the largest value)
are compared per element: fp32 within ``rtol`` (1e-5) of the element's own reference value, bf16
within two bf16 ulps of it, so one huge element cannot hide a wrong small one. Kinds that sum
(:data:`SUMMING_KINDS`: BRGEMMs, add and sumsq reductions, norms, softmax, muladd, rotary, loop
kernels) may cancel, so there the bound is ``rtol * |reference| + rtol * max|reference|``, the
largest taken over each row where rows are computed apart (:data:`ROW_KINDS`: softmax and rotary,
so a row of small results is held to its own scale); a layer norm's or RMSNorm's element within
``rtol`` times its size, :func:`norm_sizes` (``r |gamma| (max|x_row| + |mean|) + |beta|``, what
fp32's rounding of the mean and of ``x - mean`` scales with). Both add a small floor (results that
are all subnormal; bf16 dot products flush denormals to zero), and an op documented to an absolute
error (``gelu_erf_fast``: 2^-22 max(1, |x|)) adds that error; a unary math op's element may also be
off by 2^-126 max(1, |x|), a denormal result flushed to zero (:func:`flushed_atol`).

A kind whose reference sums products of its inputs (:func:`bounds_terms`: BRGEMMs, ``gemm_nt``,
block SpMM, muladd, add and sumsq reductions) is also run on the absolute values of its float
inputs (a BRGEMM's without its epilogue, :func:`without_epilogue`): that gives each result's sum
of the sizes of its terms (``|c| + |bias| + sum |a||b|``), which fp32 rounding scales with however
much the terms cancel (or a ReLU cuts). With the default ``rtol`` each element's bound is then its
own, without the term of the largest reference value, so a large element cannot hide an error in
a small one there either: ``max(rtol * |reference|, g * size)`` and the floor, where ``g =
max(rtol, 2 n u / (1 - n u))`` (Higham's bound of a sum of ``n`` terms, :func:`terms_summed`, u =
2^-24; the 2: Arm's bf16 dot products round to odd); after an epilogue that bends the sum (GELU,
sigmoid, tanh: an error ``e`` in the sum moves its result by at most ``slope * e``),
``rtol * |reference| + slope * g * size``, the floor, and the epilogue's documented error
(``gelu_erf_fast``: 2^-22 max(1, size); every bending one: 2^-126 max(1, size), a denormal result
flushed, :data:`FLUSHED_ATOL`), ``slope`` the epilogue's steepest within ``g * size`` of
the element's sum (:func:`epilogue_slope`: a sigmoid's result at a sum of -8 is held to its own
scale, not to the slope at 0). With an ``rtol`` given, the bound is the one above, or ``rtol *
size`` and the floor where that is more.

>>> import numpy as np
>>> tolerance(np.array([1.0, 1e6]), "f32", summing=False, rtol=None, atol=None, floor=0.0)[0]
array([1.e-05, 1.e+01])
>>> tolerance(np.array([1e-3, 1.0]), "f32", True, None, None, 0.0, magnitude=np.array([5.0, 1.0]))[0]
array([6.e-05, 2.e-05])
>>> tolerance(np.array([1e-3, 1e3]), "f32", True, None, None, 0.0, magnitude=np.array([1e-3, 1e3]), exact=True)[0]
array([1.e-08, 1.e-02])
>>> tolerance(np.array([0.0, 1e3]), "f32", True, None, None, 0.0, magnitude=np.array([1e-3, 1e3]), exact=True,
...           epilogue="gelu")[0]
array([1.13e-08, 2.13e-02])
"""
import dataclasses

import numpy as np

from ..brgemm import ACTS

RTOL = {"f32": 1e-5, "bf16": 2.0 ** -7}
BF16_ULPS = 2                              # the README's promise for element-wise bf16 results
# the kinds whose results sum products or terms (and may cancel): the bound there grows with the
# largest reference value; strategies.operands(specials=True) also keeps their sums in fp32 range
SUMMING_KINDS = frozenset({"brgemm", "gemm_nt", "block_spmm", "reduce", "softmax", "layernorm",
                           "rmsnorm", "ternary", "rotary", "loop"})
ELEMENTWISE_KINDS = frozenset({"unary", "binary", "transform", "quantize", "dequant", "swiglu"})
# kinds whose rows are computed apart, each result from its row alone, whose rounding scales with that
# row: the term of the largest reference value is each row's (norms: :func:`norm_sizes`)
ROW_KINDS = frozenset({"softmax", "rotary"})
# kinds whose results' sizes :func:`norm_sizes` gives (each element then held to its own bound)
NORM_KINDS = frozenset({"layernorm", "rmsnorm"})
# bf16 dot products (vdpbf16ps, tdpbf16ps, SVE bfdot) flush denormal inputs and products to zero:
# results that small may differ from the exact reference by up to (terms x the smallest normal)
FTZ_ATOL = float(np.finfo(np.float32).tiny) * 2.0 ** 20
SUBNORMAL_ATOL = 2.0 ** -137
BF16_LEAST_ULP = 2.0 ** -133
# the kinds whose reference run on |inputs| sums the sizes of the terms each result sums (reduce:
# but for op="max"); not norms, softmax, rotary (x1 cos - x2 sin keeps its minus) or loop kernels
MAGNITUDE_KINDS = frozenset({"brgemm", "gemm_nt", "block_spmm", "ternary", "reduce"})
UNIT_ROUNDOFF = 2.0 ** -24                 # fp32's: every fp32 sum rounds to within it, relatively
# an element's own bound (exact sizes) allows twice Higham's: Arm's BFDOT/BFMMLA round to odd
EXACT_SLACK = 2.0
# element-wise ops documented to an absolute error (times max(1, |x|)) rather than a relative one
ABSOLUTE_ERROR = {"gelu_erf_fast": 2.0 ** -22}
# a bending epilogue's result under fp32's smallest normal times the size of its sum may be flushed
# to zero (tppasm.x86.math: denormal results; the AVX2 exp flushes them, so GELU far left and a
# sigmoid below -87.3 give 0 where AVX-512's vscalefps keeps the denormal)
FLUSHED_ATOL = float(np.finfo(np.float32).tiny)
# the unary ops whose results may be flushed denormals so (per element: 2^-126 max(1, |x|))
FLUSHING_OPS = frozenset({"exp", "sigmoid", "tanh", "gelu", "gelu_erf", "gelu_erf_fast"})
# a bending BRGEMM epilogue's steepest slope (rounded up): an error e in a sum moves its result by at
# most slope * e (GELU's, 1.1290, at x = sqrt(2); sigmoid's at 0); None and ReLU pass the sum's error on
EPILOGUE_SLOPE = {"gelu": 1.13, "gelu_erf": 1.13, "gelu_erf_fast": 1.13, "sigmoid": 0.25, "tanh": 1.0}
# where a bent epilogue's slope turns (its derivative's extrema; GELU's tanh form's found numerically):
# between them the slope is monotone, so on an interval it is steepest at an end or at a turn inside
EPILOGUE_TURNS = {"gelu": (-1.4185, 1.4185), "gelu_erf": (-2 ** 0.5, 2 ** 0.5), "gelu_erf_fast": (-2 ** 0.5, 2 ** 0.5),
                  "sigmoid": (0.0,), "tanh": (0.0,)}


def _bf16_ulps(w):
    """The spacing of bf16 numbers (8 significant bits) at each magnitude of ``w``."""
    with np.errstate(invalid="ignore", divide="ignore"):
        _, exponent = np.frexp(np.where(np.isfinite(w), w, 0.0))
    return np.maximum(np.ldexp(1.0, exponent - 8), BF16_LEAST_ULP)


def tolerance(w, floats, summing, rtol, atol, floor, magnitude=None, terms=1, exact=False, epilogue=None,
              rows=False, sums=None):
    """Per-element bound on ``|got - w|`` (an array like ``w``) and its description; ``magnitude``:
    each element's sum of the sizes of its terms (or None), ``terms``: how many each sums at most,
    ``exact``: ``magnitude`` is that sum, not a value merely near it, so with the default ``rtol``
    each element's bound is its own, without the term of the largest reference value; ``epilogue``:
    the function (a key of :data:`EPILOGUE_SLOPE`) each result applies to its sum, ``sums`` those
    sums (the reference without the epilogue; None: its steepest slope anywhere is taken); ``rows``:
    that largest value is taken over each row (the last axis) of ``w``.

    >>> tolerance(np.array([[1e-3, 1e-3], [1.0, 0.5]]), "f32", True, None, None, 0.0, rows=True)[0]
    array([[2.0e-08, 2.0e-08],
           [2.0e-05, 1.5e-05]])
    """
    r = RTOL[floats] if rtol is None else rtol
    finite = np.abs(w[np.isfinite(w)])
    own = exact and magnitude is not None and rtol is None and atol is None and summing
    if atol is not None:
        a = atol
    elif rows and summing and not own and w.ndim and w.size:
        with np.errstate(invalid="ignore"):
            a = np.maximum(r * np.abs(np.where(np.isfinite(w), w, 0.0)).max(axis=-1, keepdims=True), floor or 0.0)
    else:
        a = max(r * float(finite.max()) if summing and finite.size and not own else 0.0, floor or 0.0)
    if isinstance(a, np.ndarray):
        shown = f"{r:g} x max|reference| of the row, at least {floor or 0.0:g}"
    else:
        shown = f"{a:g}"
    text = ""
    with np.errstate(invalid="ignore"):
        if floats == "bf16" and rtol is None and not summing:
            per, text = BF16_ULPS * _bf16_ulps(w), f"{BF16_ULPS} bf16 ulps per element"
        else:
            per, text = r * np.abs(w), f"rtol={r:g} per element"
        bound = np.where(np.isfinite(per), per, 0.0) + a
        if magnitude is None or atol is not None or not summing:
            return bound, f" ({text}, atol={shown})"
        g = max(r, EXACT_SLACK * _gamma(terms) if own else _gamma(terms)) if rtol is None else r
        size = np.abs(np.asarray(magnitude, np.float64))
        sized = np.where(np.isfinite(size), g * size, 0.0)      # an overflowing (or NaN) size: the bound above
        if own and epilogue not in (None, "relu"):
            slope = EPILOGUE_SLOPE[epilogue] if sums is None else epilogue_slope(epilogue, sums, sized)
            documented = ABSOLUTE_ERROR.get(epilogue, 0.0) + FLUSHED_ATOL
            extra = slope * sized + documented * np.maximum(1.0, np.where(np.isfinite(size), size, 0.0))
            return bound + extra, f" ({text}, atol={shown}, + {epilogue}'s steepest slope within that of the " \
                f"element's sum x {g:.3g} x the sum of the sizes of its terms, + {documented:g} max(1, that sum))"
        return np.maximum(bound, sized + a), f" ({text}, atol={shown}; or {g:.3g} x the sum of the sizes of " \
            f"the element's terms, + atol, where larger)"


def epilogue_slope(act, sums, reach):
    """Per element, the steepest slope of the epilogue ``act`` between ``sums - reach`` and ``sums +
    reach`` (central differences of its reference, 1% over; at most, and where not finite,
    :data:`EPILOGUE_SLOPE`): how far an error of up to ``reach`` in the sum moves the result.

    >>> epilogue_slope("sigmoid", np.array([-8.0, 0.0, np.nan]), np.array([1e-4, 1e-4, 1e-4])).round(6).tolist()
    [0.000339, 0.25, 0.25]
    """
    f, most = ACTS[act], EPILOGUE_SLOPE[act]

    def slope(t):
        h = 1e-6 * np.maximum(1.0, np.abs(t))
        return np.abs(f(t + h) - f(t - h)) / (2 * h)
    with np.errstate(all="ignore"):
        sums, reach = np.asarray(sums, np.float64), np.asarray(reach, np.float64)
        lo, hi = sums - reach, sums + reach
        steepest = np.fmax(slope(lo), slope(hi))
        for turn in EPILOGUE_TURNS[act]:
            steepest = np.where((lo <= turn) & (turn <= hi), np.fmax(steepest, slope(np.float64(turn))), steepest)
        steepest = np.minimum(1.01 * steepest, most)
        return np.where(np.isfinite(steepest), steepest, most)


def _gamma(n):
    """Higham's gamma_n = n u / (1 - n u): the relative bound of a sum of n terms rounded to fp32."""
    nu = n * UNIT_ROUNDOFF
    return nu / (1 - nu) if nu < 0.5 else float("inf")


def compare(name, got, want, rtol, atol, floor=None, skip=None, summing=True, magnitude=None, terms=1, exact=False,
            epilogue=None, rows=False, sums=None, flushed=None):
    """Problems (strings) where ``got`` differs from ``want``; ``floor``: the least ``atol``;
    ``skip``: a mask of elements whose values are unspecified; ``summing``: a kind that sums;
    ``magnitude``, ``terms``, ``exact``, ``epilogue``, ``rows``, ``sums``: see :func:`tolerance`;
    ``flushed``: per element, how far a flushed denormal may put it off (:func:`flushed_atol`)."""
    floats = "bf16" if got.dtype.name == "bfloat16" else "f32" if got.dtype.kind == "f" else None
    if floats:
        with np.errstate(invalid="ignore"):          # a signalling NaN warns as it is cast
            g, w = got.astype(np.float64), np.asarray(want).astype(np.float64)
        tol, text = tolerance(w, floats, summing, rtol, atol, floor, magnitude, terms, exact, epilogue, rows, sums)
        with np.errstate(invalid="ignore"):
            ok = (np.abs(g - w) <= tol) | (g == w) | (np.isnan(g) & np.isnan(w))
            if flushed is not None:
                ok |= np.abs(g - w) <= flushed
                text = text[:-1] + "; or 2^-126 max(1, |x|), a denormal result flushed)"
    else:
        g, w = got, np.asarray(want)
        ok = g == w
        text = " (integers: exact)"
    if skip is not None:
        ok = ok | skip
    bad = np.argwhere(~ok)
    if not len(bad):
        return []
    shown = "; ".join(f"[{', '.join(map(str, idx))}] got {g[tuple(idx)].item()!r} want {w[tuple(idx)].item()!r}"
                      for idx in bad[:5])
    return [f"{name}: {len(bad)} of {ok.size} elements differ from the reference{text}: {shown}"]


def documented_atol(kernel, kind, arrays):
    """The absolute error an element-wise op is documented to (:data:`ABSOLUTE_ERROR`, times
    max(1, max|x|) over its input), or 0.

    >>> import tppasm
    >>> documented_atol(tppasm.unary("gelu_erf_fast", 1, 2), "kernel", [np.array([[4.0, -1.0]])]) == 2.0 ** -20
    True
    """
    op = getattr(getattr(kernel, "desc", None), "op", None)
    if kind != "kernel" or op not in ABSOLUTE_ERROR or not arrays:
        return 0.0
    with np.errstate(invalid="ignore"):
        x = np.abs(np.asarray(arrays[0]).astype(np.float64))
    finite = x[np.isfinite(x)]
    return ABSOLUTE_ERROR[op] * max(1.0, float(finite.max()) if finite.size else 1.0)


def flushed_atol(kernel, kind, arrays):
    """Per element of a unary op of :data:`FLUSHING_OPS`, what a denormal result flushed to zero
    puts it off by at most, 2^-126 max(1, |x|) (:data:`FLUSHED_ATOL`; tppasm.x86.math: the AVX2
    kernels flush GELU far left, a sigmoid below -87.3); None for other kernels.

    >>> import tppasm
    >>> flushed_atol(tppasm.unary("gelu", 1, 2), "kernel", [np.array([[-10.0, 0.5]])]) / 2.0 ** -126
    array([[10.,  1.]])
    """
    desc = getattr(kernel, "desc", None)
    if kind != "kernel" or getattr(desc, "kind", None) != "unary" or getattr(desc, "op", None) not in FLUSHING_OPS:
        return None
    with np.errstate(invalid="ignore"):
        x = np.abs(np.asarray(arrays[0]).astype(np.float64))
    return FLUSHED_ATOL * np.maximum(1.0, np.where(np.isfinite(x), x, 0.0))


def is_summing(kernel, kind):
    """Whether ``kernel``'s results sum terms (see :data:`SUMMING_KINDS`); unknown kinds do.

    >>> import tppasm
    >>> from tppasm.testing import is_summing
    >>> is_summing(tppasm.brgemm(2, 2, 2), "kernel"), is_summing(tppasm.relu(2, 2), "kernel")
    (True, False)
    >>> is_summing(tppasm.reduce("add", 2, 2), "kernel"), is_summing(tppasm.reduce("max", 2, 2), "kernel")
    (True, False)
    """
    if kind in ("loop", "batched"):
        return True
    desc = getattr(kernel, "desc", None)
    k = getattr(desc, "kind", None)
    if k == "reduce" and getattr(desc, "op", None) == "max":
        return False                            # one of its inputs, rounded at most once
    return k in SUMMING_KINDS or k not in ELEMENTWISE_KINDS


def row_wise(kernel, kind):
    """Whether each row of ``kernel``'s results is computed from its row alone (:data:`ROW_KINDS`).

    >>> import tppasm
    >>> row_wise(tppasm.softmax(2, 8), "kernel"), row_wise(tppasm.layernorm(2, 8), "kernel")
    (True, False)
    """
    return kind == "kernel" and getattr(getattr(kernel, "desc", None), "kind", None) in ROW_KINDS


def norm_sizes(desc, x, gamma, beta=None):
    """Each result's size for a layer norm or RMSNorm (``desc``) on ``x``: ``|gamma| r (max|x_row| +
    |mean|) + |beta|`` (RMSNorm: ``|gamma| r max|x_row|``), with r = 1/sqrt(var + eps) of the row, in
    float64. A norm's fp32 rounding scales with it: the rounding of the row's mean and of each ``x -
    mean``, times ``r |gamma|``, so a row of values near their mean (or far from 0) may differ by more
    than one of larger deviations, and a column of small ``gamma`` by less.

    >>> import tppasm
    >>> x = np.array([[1.0, 3.0], [1.0, 1.0]], np.float32); g = np.array([1.0, 0.5], np.float32)
    >>> norm_sizes(tppasm.layernorm(2, 2, eps=1e-2).desc, x, g, np.zeros(2, np.float32)).round(2).tolist()
    [[4.98, 2.49], [20.0, 10.0]]
    """
    with np.errstate(all="ignore"):
        x = np.asarray(x).astype(np.float64)
        mean = x.mean(axis=1, keepdims=True) if desc.kind == "layernorm" else 0.0
        var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
        reach = np.abs(x).max(axis=1, keepdims=True) + np.abs(mean)
        size = np.abs(np.asarray(gamma).astype(np.float64)) * reach / np.sqrt(var + desc.eps)
        if beta is not None:
            size = size + np.abs(np.asarray(beta).astype(np.float64))
    return size


def bounds_terms(kernel, kind):
    """Whether ``kernel``'s reference, run on the absolute values of its float inputs, gives each
    result's sum of the sizes of its terms (:data:`MAGNITUDE_KINDS`).

    >>> import tppasm
    >>> bounds_terms(tppasm.brgemm(2, 2, 2), "kernel"), bounds_terms(tppasm.reduce("max", 2, 2), "kernel")
    (True, False)
    """
    desc = getattr(kernel, "desc", None)
    k = getattr(desc, "kind", None)
    return kind != "loop" and k in MAGNITUDE_KINDS and getattr(desc, "op", None) != "max"


def epilogue(kernel):
    """The function a kernel applies to each of its sums (a BRGEMM's ``act``), or None.

    >>> import tppasm
    >>> epilogue(tppasm.brgemm(2, 2, 2, act="gelu")), epilogue(tppasm.reduce("add", 2, 2))
    ('gelu', None)
    """
    return getattr(getattr(kernel, "desc", None), "act", None)


def without_epilogue(desc):
    """``desc`` without its epilogue (a BRGEMM's ``act``), whose reference gives the sums it bends.

    >>> import tppasm
    >>> without_epilogue(tppasm.brgemm(2, 2, 2, act="tanh").desc).act is None
    True
    """
    return dataclasses.replace(desc, act=None) if getattr(desc, "act", None) is not None else desc


def terms_summed(desc, count):
    """How many terms each result of a :func:`bounds_terms` kernel sums at most, with ``count``
    blocks (BRGEMM: k per block, and C with beta=1, and the bias; block SpMM: bk per stored block).

    >>> import tppasm
    >>> terms_summed(tppasm.brgemm(2, 2, 64, beta=1, bias=True).desc, 3)
    194
    """
    kind = desc.kind
    if kind == "brgemm":
        return desc.k * count + int(desc.beta) + int(desc.bias)
    if kind == "block_spmm":
        return desc.bk * count + int(desc.beta)
    if kind == "gemm_nt":
        return desc.k
    if kind == "reduce":
        return desc.n if desc.over == "cols" else desc.m
    return 2                                    # muladd: c + a b


def scratch_positions(kernel, kind, names):
    """Positions (among ``names``) of the arrays a loop kernel declares scratch
    (``loops.kernel(..., scratch=...)``, :mod:`loops.scratch`): what they hold after a call is no
    result (a slot per thread holds what that thread computed last), so they are not compared.

    >>> from types import SimpleNamespace
    >>> scratch_positions(SimpleNamespace(scratch=("S",)), "loop", ["X", "S", "Y"])
    {1}
    """
    if kind != "loop":
        return set()
    declared = getattr(kernel, "scratch", ())
    return {i for i, n in enumerate(names) if n in declared}


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.itemsize}")


def scratch_hint(kind, name, got, want, initial):
    """For a loop kernel's array ``name`` that differs from the reference: when the reference run
    (``.python()``: every iteration as thread 0) left some of the differing elements as they were
    in ``initial`` (what a slot per thread, ``S[thread().tid]``, of a thread other than 0 shows),
    the advice to declare it scratch; else "".

    >>> x = np.zeros((2, 2), np.float32); got = x + 1
    >>> scratch_hint("loop", "S", got, x, x)[:60]
    '; 4 of them the reference run (.python(), every iteration as'
    >>> scratch_hint("loop", "S", got, x + 2, x)
    ''
    """
    if kind != "loop":
        return ""
    g, w, i = _bits(got), _bits(want), _bits(initial)
    left = (w == i) & (g != w)
    if not left.any():
        return ""
    return (f"; {int(left.sum())} of them the reference run (.python(), every iteration as thread 0) never wrote: "
            f"if {name} is working memory (e.g. one slot per thread, {name}[thread().tid]), declare it "
            f"scratch, loops.kernel(..., scratch=({name!r},)), and it is not compared")


def unwritten_hint(kind, name):
    """For a loop kernel's write-only array ``name`` with elements no run wrote: how to check a
    nest that leaves part of an output by design (padding columns a ``result()`` crops); else "".

    >>> unwritten_hint("kernel", "Y")
    ''
    """
    if kind != "loop":
        return ""
    return (f"; if the nest leaves them by design (e.g. padding columns that a result() crops), check it with "
            f"outputs= naming the arrays it fully writes, without {name} (outputs=() poisons none), or declare "
            f"an array that is all working memory scratch: loops.kernel(..., scratch=({name!r},))")
