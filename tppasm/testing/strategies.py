"""Hypothesis strategies for TPP operands and loop declarations.

Sizes favour the tails of vector loops (1, 7, 8, 9, 15, 16, 17, ... 65) over a plain range;
leading dimensions are the row width or wider; arrays start 64-byte aligned or not; values are
moderate by default and, with ``specials=True``, include NaN, +-inf, -0, denormals and the
extreme finite values (integers: their minimum and maximum). :func:`operands` draws every array a
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
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ..dtypes import dtype as np_dtype, name_of
from ..layout import vnni_pack

__all__ = ["TAILS", "dims", "shapes", "leading_dimensions", "dtypes", "values", "arrays", "vnni_b", "operands",
           "block_sizes", "loop_bounds"]

TAILS = (1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65)
F32 = np.finfo(np.float32)
FLOAT_SPECIALS = (math.nan, math.inf, -math.inf, -0.0, 0.0, float(F32.smallest_subnormal),
                  -float(F32.smallest_subnormal), float(F32.tiny) / 2, float(F32.max), -float(F32.max),
                  float(F32.tiny))


def _int_arg(who, name, value, least, example):
    """``value`` as an int >= ``least``: TypeError if it is no int (bools neither), ValueError if smaller."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{who}: {name}={value!r} ({type(value).__name__}); expected an int >= {least}, "
                        f"e.g. {name}={example}")
    if value < least:
        raise ValueError(f"{who}: {name}={value!r}; expected an int >= {least}, e.g. {name}={example}")
    return int(value)


def dims(max_value=65):
    """Sizes from 1 to ``max_value``, the tails of 8- and 16-lane loops first."""
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
    """Row strides (elements) for rows of ``width``: the dense one or up to ``max_extra`` more."""
    return st.one_of(st.just(width), st.integers(width + 1, width + max_extra))


def dtypes(*names):
    """tppasm dtype names, by default the float ones ("f32", "bf16")."""
    return st.sampled_from([name_of(n) for n in names] or ["f32", "bf16"])


def values(dtype, specials=False, bound=4.0):
    """Element values for ``dtype``: floats in [-bound, bound] (with ``specials``: NaN, infinities,
    -0, denormals, the largest finite values), integers over their whole range (their minimum,
    maximum, 0 and -1 drawn often). A bound that fp32 cannot hold is taken as the fp32 below it."""
    dt = np_dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        edges = [v for v in (info.min, info.max, 0, -1, 1) if info.min <= v <= info.max]
        return st.one_of(st.sampled_from(edges), st.integers(int(info.min), int(info.max)))
    if isinstance(bound, bool) or not isinstance(bound, (int, float, np.integer, np.floating)) \
            or not 0 <= bound < np.inf:
        raise ValueError(f"values: bound={bound!r}; expected a finite number >= 0")
    inner = np.float32(bound)                    # hypothesis wants bounds exact in f32: round inward
    if float(inner) > bound:
        inner = np.nextafter(inner, np.float32(0))
    finite = st.floats(-float(inner), float(inner), width=32)
    return st.one_of(finite, st.sampled_from(FLOAT_SPECIALS)) if specials else finite


def _buffer(draw, dt, extent, align):
    """A 1-D array of ``extent`` elements of ``dt`` whose start is 64-byte aligned (align True),
    not (False) or either (None, drawn)."""
    if align is None:
        align = draw(st.booleans())
    shift = 0 if align else draw(st.integers(1, max(1, 64 // dt.itemsize - 1)))
    raw = np.empty((extent + shift) * dt.itemsize + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + (extent + shift) * dt.itemsize].view(dt)[shift:]


def _fill(draw, dt, shape, specials):
    """An array of ``shape`` with values drawn for ``dt`` (bf16 drawn as fp32, then rounded)."""
    if dt.name == "bfloat16":
        return draw(hnp.arrays(np.float32, shape, elements=values("f32", specials))).astype(dt)
    return draw(hnp.arrays(dt, shape, elements=values(dt, specials)))


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
    return _arrays(np_dtype(dtype), tuple(int(d) for d in shape), ld, align, specials)


@st.composite
def _arrays(draw, dt, shape, ld, align, specials):
    width = shape[-1] if shape else 1
    ld = draw(leading_dimensions(width)) if ld is None else ld
    if isinstance(ld, bool) or not isinstance(ld, (int, np.integer)) or ld < width:
        raise ValueError(f"arrays: ld={ld!r}; expected an int >= the row width {width} (rows ld elements apart; "
                         "a smaller ld would overlap the rows and run past the buffer)")
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


@st.composite
def vnni_b(draw, dtype, k, n, count=None, specials=False):
    """B of a bf16 (VNNI2) or int8 (VNNI4) BRGEMM: (ceil(k/f), n, f), or (count, ...) blocks."""
    shape = ((count,) if count else ()) + (k, n)
    b = _fill(draw, np_dtype(dtype), shape, specials)
    return vnni_pack(b, name_of(dtype))


@st.composite
def operands(draw, kernel, max_count=4, specials=False, align=None):
    """Every array ``kernel`` takes, in its order and exact layout (strides as built, a batch of 1
    to ``max_count`` blocks where it has one): inputs hold drawn values, outputs arbitrary ones.
    The batched operands hold the same number of blocks, so a call infers ``count``."""
    if not hasattr(kernel, "operands") or not getattr(kernel.desc, "checked_call", True):
        raise TypeError(f"operands: {kernel!r} is not a kernel with a stride batch; draw its arrays with "
                        "tppasm.testing.strategies.arrays")
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
            view[...] = _fill(draw, dt, shape, specials)
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


@st.composite
def loop_bounds(draw, max_trip=9, max_step=2, max_start=3, max_blocks=2, min_trip=0):
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
    """
    step = draw(st.integers(1, max_step))
    start = draw(st.integers(0, max_start))
    trip = draw(st.integers(min_trip, max_trip))
    end = start + trip * step - (draw(st.integers(0, step - 1)) if trip else 0)
    return start, end, step, draw(block_sizes(step, max_blocks))
