"""Hypothesis strategies for TPP operands and loop declarations.

Sizes favour the tails of vector loops (1, 7, 8, 9, 15, 16, 17, ... 65) over a plain range;
leading dimensions are the row width or wider; arrays start 64-byte aligned or not; values are
moderate by default and, with ``specials=True``, include NaN, +-inf, -0, denormals and the
extreme finite values (integers: their minimum and maximum), within an operand's ``max_value`` (a
BRGEMM's A with ``a_bits=7``: 127). :func:`operands` of a kernel that
sums or multiplies inputs (a BRGEMM, a norm, a reduction, dequant, SwiGLU...) draws no extreme
finite values, and in each example either the non-finite values (NaN, +-inf, +-0) or the tiny
ones (+-0, denormals, the smallest normal; dequant: none), never both: fp32 sums of extremes leave fp32 range,
and inf times a denormal that fp32 (or a bf16 dot product) underflows or flushes to 0 is NaN,
where the float64 reference stays finite or infinite. :func:`operands` draws every array a
given kernel takes, in its exact layout; :func:`loop_bounds` and :func:`block_sizes` draw loop
declarations.

>>> import tppasm
>>> from hypothesis import given, settings
>>> @settings(max_examples=5)
... @given(operands(tppasm.relu(3, 17)))
... def test(arrays):
...     x, out = arrays
...     assert x.shape == out.shape == (3, 17)
>>> test()
"""
import math

import numpy as np

try:
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
except ModuleNotFoundError as e:           # an optional package: say which, and how to get it
    if not (e.name or "").startswith("hypothesis"):
        raise
    raise ModuleNotFoundError("tppasm.testing.strategies needs hypothesis: pip install hypothesis (or the test "
                              "extra: pip install tppasm[test])", name="hypothesis") from e

from ..dtypes import dtype as np_dtype, name_of
from ..layout import vnni_pack
from .compare import SUMMING_KINDS

__all__ = ["TAILS", "dims", "shapes", "leading_dimensions", "dtypes", "values", "arrays", "vnni_b", "operands",
           "block_sizes", "loop_bounds"]

TAILS = (1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65)
F32 = np.finfo(np.float32)
BF16_MAX = float(np.array(0x7F7F0000, np.uint32).view(np.float32))     # bf16's largest finite value
BF16_LEAST = 2.0 ** -133                                                # and its smallest denormal
FLOAT_SPECIALS = (math.nan, math.inf, -math.inf, -0.0, 0.0, float(F32.smallest_subnormal),
                  -float(F32.smallest_subnormal), float(F32.tiny) / 2, float(F32.max), -float(F32.max),
                  float(F32.tiny))
NONFINITE = (math.nan, math.inf, -math.inf, -0.0, 0.0)
TINY = (-0.0, 0.0, float(F32.smallest_subnormal), -float(F32.smallest_subnormal), float(F32.tiny) / 2,
        float(F32.tiny))
# per kind, the families of specials operands() draws from, one family per example: kinds that sum or
# multiply inputs keep within fp32 range; dequant multiplies its two scales first, so a product of
# tiny scales rounds twice, the second time as a denormal (no tiny values there)
SPECIAL_FAMILIES = dict.fromkeys(SUMMING_KINDS | {"swiglu"}, (NONFINITE, TINY))
SPECIAL_FAMILIES["dequant"] = (NONFINITE,)


def _int_arg(who, name, value, least, example):
    """``value`` as an int >= ``least``: TypeError if it is no int (bools neither), ValueError if smaller."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{who}: {name}={value!r} ({type(value).__name__}); expected an int >= {least}, "
                        f"e.g. {name}={example}")
    if value < least:
        raise ValueError(f"{who}: {name}={value!r}; expected an int >= {least}, e.g. {name}={example}")
    return int(value)


def dims(max_value=65):
    """Sizes from 1 to ``max_value``, the tails of 8- and 16-lane loops first.

    >>> from hypothesis import given, settings
    >>> from tppasm.testing.strategies import dims
    >>> @settings(max_examples=20, database=None)
    ... @given(dims(17))
    ... def test(n):
    ...     assert 1 <= n <= 17
    >>> test()
    """
    max_value = _int_arg("dims", "max_value", max_value, 1, 65)
    return st.one_of(st.sampled_from([t for t in TAILS if t <= max_value]), st.integers(1, max_value))


def shapes(ndim=2, max_side=65):
    """Tuples of ``ndim`` sizes (see :func:`dims`).

    >>> shapes("2")
    Traceback (most recent call last):
    ...
    TypeError: shapes: ndim='2' (str); expected an int >= 0, e.g. ndim=2
    """
    ndim = _int_arg("shapes", "ndim", ndim, 0, 2)
    return st.tuples(*[dims(max_side)] * ndim)


def leading_dimensions(width, max_extra=17):
    """Row strides (elements) for rows of ``width``: the dense one or up to ``max_extra`` more.

    >>> leading_dimensions(-5)
    Traceback (most recent call last):
    ...
    ValueError: leading_dimensions: width=-5; expected an int >= 0, e.g. width=16
    """
    width = _int_arg("leading_dimensions", "width", width, 0, 16)
    max_extra = _int_arg("leading_dimensions", "max_extra", max_extra, 0, 17)
    dense = st.just(width)
    return st.one_of(dense, st.integers(width + 1, width + max_extra)) if max_extra else dense


def dtypes(*names):
    """tppasm dtype names, by default the float ones ("f32", "bf16").

    >>> from hypothesis import given, settings
    >>> from tppasm.testing.strategies import dtypes
    >>> @settings(max_examples=10, database=None)
    ... @given(dtypes("f32", "i8"))
    ... def test(name):
    ...     assert name in ("f32", "i8")
    >>> test()
    """
    return st.sampled_from([name_of(n) for n in names] or ["f32", "bf16"])


def values(dtype, specials=False, bound=None):
    """Element values for ``dtype``: floats in [-bound, bound] (default 4; with ``specials=True``
    also NaN, infinities, -0, denormals and the largest finite values; given a sequence of floats,
    those, and denormals only if it holds one), integers in [-bound, bound] (default: their whole
    range; their minimum, maximum, 0 and -1 drawn often). A bound that fp32 cannot hold is taken
    as the fp32 below it. bf16 draws bf16 numbers (fp32 ones cut toward zero; its own largest).

    >>> values("i8", bound="x")
    Traceback (most recent call last):
    ...
    TypeError: values: bound='x' (str); expected a finite number >= 0 or None (the default), e.g. bound=4.0
    """
    dt = np_dtype(dtype)
    specials = _special_values("values", specials)
    if bound is not None and (isinstance(bound, (bool, np.bool_))
                              or not isinstance(bound, (int, float, np.integer, np.floating))):
        raise TypeError(f"values: bound={bound!r} ({type(bound).__name__}); expected a finite number >= 0 or "
                        "None (the default), e.g. bound=4.0")
    if bound is not None and not 0 <= bound < np.inf:
        raise ValueError(f"values: bound={bound!r}; expected a finite number >= 0, e.g. bound=4.0")
    if dt.kind in "iu":
        info = np.iinfo(dt)
        low, high = int(info.min), int(info.max)
        if bound is not None:
            low, high = max(low, -math.floor(bound)), min(high, math.floor(bound))
        edges = [v for v in (low, high, 0, -1, 1) if low <= v <= high]
        return st.one_of(st.sampled_from(edges), st.integers(low, high))
    bound = 4.0 if bound is None else bound
    inner = np.float32(bound)                    # hypothesis wants bounds exact in f32: round inward
    if float(inner) > bound:
        inner = np.nextafter(inner, np.float32(0))
    subnormal = specials in (FLOAT_SPECIALS, ()) or any(0 < abs(v) < F32.tiny for v in specials)
    finite = st.floats(-float(inner), float(inner), width=32, allow_subnormal=subnormal)
    if dt.name == "bfloat16":          # bf16 numbers: fp32's extremes (bf16 infinities, zeros) as bf16's
        specials, finite = tuple(_bf16_special(v) for v in specials), finite.map(_bf16_toward_zero)
    return st.one_of(finite, st.sampled_from(specials)) if specials else finite


def _bf16_toward_zero(v):
    """The bf16 number next to fp32 ``v`` toward zero (within any bound ``v`` is within)."""
    return float((np.array(v, np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32))


def _bf16_special(v):
    """A special value as a bf16 number: fp32's largest as bf16's, a denormal below bf16's least as it."""
    if abs(v) == F32.max:
        return math.copysign(BF16_MAX, v)
    if 0 < abs(v) < BF16_LEAST:
        return math.copysign(BF16_LEAST, v)
    return v if not math.isfinite(v) else _bf16_toward_zero(v)


def _special_values(who, specials):
    """``specials`` (True, False or a sequence of floats) as the tuple of special values to draw."""
    if isinstance(specials, (bool, np.bool_)):
        return FLOAT_SPECIALS if specials else ()
    if isinstance(specials, (tuple, list)) and specials and all(isinstance(v, float) for v in specials):
        return tuple(specials)
    raise TypeError(f"{who}: specials={specials!r}; expected True, False or a sequence of floats to draw, "
                    "e.g. specials=True")


def _buffer(draw, dt, extent, align):
    """A 1-D array of ``extent`` elements of ``dt`` whose start is 64-byte aligned (align True),
    not (False) or either (None, drawn)."""
    if align is None:
        align = draw(st.booleans())
    shift = 0 if align else draw(st.integers(1, max(1, 64 // dt.itemsize - 1)))
    raw = np.empty((extent + shift) * dt.itemsize + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + (extent + shift) * dt.itemsize].view(dt)[shift:]


def _fill(draw, dt, shape, specials, bound=None):
    """An array of ``shape`` with values drawn for ``dt`` (bf16 drawn as fp32 arrays of bf16 numbers), within
    ``bound`` if given (an operand's ``max_value``)."""
    if dt.name == "bfloat16":
        return draw(hnp.arrays(np.float32, shape, elements=values(dt, specials, bound))).astype(dt)
    return draw(hnp.arrays(dt, shape, elements=values(dt, specials, bound)))


def _flag(who, name, value, none=False):
    """``value`` as a bool (or None where ``none``): TypeError for anything else."""
    if value is None and none:
        return None
    if not isinstance(value, (bool, np.bool_)):
        either = "True, False or None (drawn)" if none else "True or False"
        raise TypeError(f"{who}: {name}={value!r} ({type(value).__name__}); expected {either}")
    return bool(value)


def arrays(dtype, shape, ld=None, align=None, specials=False):
    """An array of ``shape`` (a tuple of sizes; the last axis is a row) with row stride ``ld``
    elements (default: drawn by :func:`leading_dimensions`; pass the shape's width for dense rows),
    aligned or not; the padding between rows holds NaN (floats) or 0x5a bytes, which no kernel may
    read into its results.

    >>> arrays("f32", 3)
    Traceback (most recent call last):
    ...
    TypeError: arrays: shape=3 (int); expected a tuple of sizes, e.g. (3,) or (3, 5)
    """
    if not isinstance(shape, (tuple, list)) or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)) for d in shape):
        raise TypeError(f"arrays: shape={shape!r} ({type(shape).__name__}); expected a tuple of sizes, "
                        "e.g. (3,) or (3, 5)")
    if any(d < 0 for d in shape):
        raise ValueError(f"arrays: shape={tuple(shape)!r}; expected sizes >= 0")
    align, specials = _flag("arrays", "align", align, none=True), _flag("arrays", "specials", specials)
    if ld is not None:
        _check_ld(ld, shape[-1] if shape else 1)
    return _arrays(np_dtype(dtype), tuple(int(d) for d in shape), ld, align, specials)


def _check_ld(ld, width):
    if isinstance(ld, (bool, np.bool_)) or not isinstance(ld, (int, np.integer)):
        raise TypeError(f"arrays: ld={ld!r} ({type(ld).__name__}); expected an int >= the row width {width}, "
                        f"e.g. ld={width}")
    if ld < width:
        raise ValueError(f"arrays: ld={ld!r}; expected an int >= the row width {width} (rows ld elements apart; "
                         "a smaller ld would overlap the rows and run past the buffer)")


@st.composite
def _arrays(draw, dt, shape, ld, align, specials):
    width = shape[-1] if shape else 1
    ld = draw(leading_dimensions(width)) if ld is None else int(ld)
    outer = math.prod(shape[:-1]) if len(shape) > 1 else 1
    buf = _buffer(draw, dt, max(outer * ld, 1), align)
    if dt.kind == "f" or dt.name == "bfloat16":
        buf[...] = np.float32(np.nan)
    else:
        buf.view(np.uint8)[...] = 0x5A
    item = dt.itemsize
    strides = [ld * item, item] if len(shape) >= 2 else [item]
    for axis in range(len(shape) - 3, -1, -1):      # outer axes: dense over the rows below them
        strides.insert(0, strides[0] * shape[axis + 1])
    view = np.lib.stride_tricks.as_strided(buf, shape, strides[-len(shape):] if shape else ())
    view[...] = _fill(draw, dt, shape, specials)
    return view


def vnni_b(dtype, k, n, count=None, specials=False):
    """B of a bf16 (VNNI2) or int8 (VNNI4) BRGEMM: (ceil(k/f), n, f), or (count, ...) blocks.

    >>> vnni_b("bf16", 4, 3, count=0)
    Traceback (most recent call last):
    ...
    ValueError: vnni_b: count=0; expected an int >= 1, e.g. count=2
    """
    k, n = _int_arg("vnni_b", "k", k, 1, 4), _int_arg("vnni_b", "n", n, 1, 16)
    count = None if count is None else _int_arg("vnni_b", "count", count, 1, 2)
    return _vnni_b(np_dtype(dtype), name_of(dtype), k, n, count, _flag("vnni_b", "specials", specials))


@st.composite
def _vnni_b(draw, dt, name, k, n, count, specials):
    shape = ((count,) if count is not None else ()) + (k, n)
    return vnni_pack(_fill(draw, dt, shape, specials), name)


def operands(kernel, max_count=4, specials=False, align=None):
    """Every array ``kernel`` takes, in its order and exact layout (strides as built, a batch of 1
    to ``max_count`` blocks where it has one): inputs hold drawn values, outputs arbitrary ones.
    The batched operands hold the same number of blocks, so a call infers ``count``. With
    ``specials``, kernels that sum or multiply draw fewer specials (see the module docstring).

    >>> import tppasm
    >>> operands(tppasm.brgemm(2, 2, 2), max_count=0)
    Traceback (most recent call last):
    ...
    ValueError: operands: max_count=0; expected an int >= 1, e.g. max_count=4
    """
    if not hasattr(kernel, "operands") or not getattr(kernel.desc, "checked_call", True):
        raise TypeError(f"operands: {kernel!r} is not a kernel with a stride batch; draw its arrays with "
                        "tppasm.testing.strategies.arrays")
    max_count = _int_arg("operands", "max_count", max_count, 1, 4)
    specials, align = _flag("operands", "specials", specials), _flag("operands", "align", align, none=True)
    return _operands(kernel, max_count, specials, align)


@st.composite
def _operands(draw, kernel, max_count, specials, align):
    if specials and kernel.desc.kind in SPECIAL_FAMILIES:
        specials = draw(st.sampled_from(SPECIAL_FAMILIES[kernel.desc.kind]))
    count = draw(st.integers(1, max_count)) if any(s.batch for s in kernel.operands) else 1
    indices = _indices(draw, kernel.desc, count)
    out = []
    for spec in kernel.operands:
        dt = spec.np_dtype
        shape = spec.full_shape(count)
        extent = 1 + sum((d - 1) * s for d, s in zip(shape, spec.strides))
        buf = _buffer(draw, dt, extent, align)
        view = np.lib.stride_tricks.as_strided(buf, shape, [s * dt.itemsize for s in spec.strides])
        if spec.writable and spec.name in kernel.desc.allocated():
            view[...] = 0
        elif spec.name in indices:
            view[...] = indices[spec.name]
        else:
            view[...] = _fill(draw, dt, shape, specials, spec.max_value)
        out.append(view)
    return tuple(out)


def _indices(draw, desc, count):
    """Values of the index operands a kernel checks before it runs (block_spmm's rowptr and colidx),
    drawn in range: indices out of range are refused, never computed (name -> values)."""
    if getattr(desc, "kind", None) != "block_spmm":
        return {}
    start = draw(st.integers(0, count))
    end = draw(st.integers(start, count))
    cols = draw(hnp.arrays(np.int32, (count,), elements=st.integers(0, desc.kb - 1)))
    return {"rowptr": np.array([start, end], np.int32), "colidx": cols}


def block_sizes(step=1, max_blocks=2, max_factor=4):
    """A loop's ``blocks``: up to ``max_blocks`` positive multiples of ``step`` (an int >= 1), outermost first.

    >>> block_sizes(0)
    Traceback (most recent call last):
    ...
    ValueError: block_sizes: step=0; expected an int >= 1, e.g. step=1
    """
    step = _int_arg("block_sizes", "step", step, 1, 1)
    max_blocks = _int_arg("block_sizes", "max_blocks", max_blocks, 0, 2)
    max_factor = _int_arg("block_sizes", "max_factor", max_factor, 1, 4)
    return st.lists(st.integers(1, max_factor).map(lambda b: b * step), max_size=max_blocks)


def loop_bounds(max_trip=9, max_step=2, max_start=3, max_blocks=2, min_trip=0):
    """``(start, end, step, blocks)`` of a loop, for ``loops.Loop(*bounds)``: a trip count of
    ``min_trip`` to ``max_trip`` (the end not necessarily on a step) and blocks from
    :func:`block_sizes`. (tppasm sits below the loop DSL, so this draws the numbers, not the Loop.)

    >>> from hypothesis import given, settings
    >>> @settings(max_examples=5)
    ... @given(loop_bounds(max_trip=4))
    ... def test(bounds):
    ...     start, end, step, blocks = bounds
    ...     assert all(b % step == 0 for b in blocks) and -(-(end - start) // step) <= 4
    >>> test()
    >>> loop_bounds(max_step=0)
    Traceback (most recent call last):
    ...
    ValueError: loop_bounds: max_step=0; expected an int >= 1, e.g. max_step=2
    """
    min_trip = _int_arg("loop_bounds", "min_trip", min_trip, 0, 0)
    max_trip = _int_arg("loop_bounds", "max_trip", max_trip, min_trip, max(9, min_trip))
    max_step = _int_arg("loop_bounds", "max_step", max_step, 1, 2)
    max_start = _int_arg("loop_bounds", "max_start", max_start, 0, 3)
    max_blocks = _int_arg("loop_bounds", "max_blocks", max_blocks, 0, 2)
    return _loop_bounds(max_trip, max_step, max_start, max_blocks, min_trip)


@st.composite
def _loop_bounds(draw, max_trip, max_step, max_start, max_blocks, min_trip):
    step = draw(st.integers(1, max_step))
    start = draw(st.integers(0, max_start))
    trip = draw(st.integers(min_trip, max_trip))
    end = start + trip * step - (draw(st.integers(0, step - 1)) if trip else 0)
    return start, end, step, draw(block_sizes(step, max_blocks))
