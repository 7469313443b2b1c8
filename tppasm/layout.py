"""NumPy helpers for the blocked and VNNI layouts that BRGEMM kernels read.

``block`` cuts a row-major matrix into a grid of contiguous blocks (DESIGN.md's ``(Mb, Kb, bm, bk)``
for A, ``(Nb, Kb, bk, bn)`` for B); ``vnni_pack`` interleaves ``factor`` consecutive rows of B, the
layout x86 dot instructions read (VNNI2 for bf16 ``vdpbf16ps``, VNNI4 for int8 ``vpdpbusd``).
``empty`` and ``aligned`` give arrays whose data starts on a cache line; every helper here returns
such arrays, and (but ``aligned``) always a new one, never a view of its input, whatever the shapes.

>>> import numpy as np
>>> x = np.arange(16).reshape(4, 4)
>>> block(x, 2, 2)[1, 0].tolist()
[[8, 9], [12, 13]]
>>> vnni_pack(np.arange(6).reshape(2, 3), 2)[0].tolist()
[[0, 3], [1, 4], [2, 5]]
"""
import ctypes
import math

import numpy as np

from isa.int_text import int_text

from . import buffers
from .display import shown
from .dtypes import NUMPY_NAMES, DtypeError, imported, name_of, numpy_dtype
from .operand import as_ndarray, refuse_masked

VNNI_FACTORS = {"bf16": 2, "i8": 4}
ALIGN = 64      # bytes: a cache line, and an AVX-512 vector
MAX_ALIGN = 1 << 21     # bytes: a huge page (an alignment costs up to that much memory per array)
_MAX_BYTES = int(np.iinfo(np.intp).max)


def empty(shape, dtype="f32", align=ALIGN):
    """An uninitialized C-contiguous array whose data starts at a multiple of ``align`` bytes.

    NumPy aligns large arrays to 16 bytes only. A kernel reading 32- or 64-byte rows of such an
    array splits loads across two cache lines, and a BRGEMM whose B is misaligned was measured
    5-15% slower here, so allocate operands with this (or pass them through :func:`aligned`).
    ``dtype``: a tppasm name ("f32", "bf16", ...; also "f64"), a torch dtype, or anything ``np.dtype``
    takes. From 64 KiB on, the memory is reused once no array on it is alive (:mod:`tppasm.buffers`:
    no page faults in calls that allocate the same sizes again and again).

    >>> x = empty((3, 5), "bf16")
    >>> x.ctypes.data % 64, x.shape, x.dtype.name, x.flags.c_contiguous
    (0, (3, 5), 'bfloat16', True)
    """
    try:
        dt = _DTYPES[dtype]                  # a call costs microseconds: kernels' callers allocate often
    except (KeyError, TypeError):
        dt = _empty_dtype(dtype)
    if align is not ALIGN:
        align = _check_align("empty", align)
    if type(shape) is not tuple or not all(type(d) is int and d >= 0 for d in shape):
        shape = _empty_shape(shape)
    count = math.prod(shape)
    if count * dt.itemsize > _MAX_BYTES - align or not count and _dimensions_too_big(shape, dt):
        raise _too_big(shape, dt, count)
    nbytes = max(count, 1) * dt.itemsize + align
    try:
        if nbytes >= buffers.FROM:
            out = buffers.array(shape, dt, nbytes, align)
            if out is not None:
                return out
        raw = np.empty(nbytes, np.uint8)
    except MemoryError:                      # (NumPy's names the byte buffer: (nbytes,) uint8)
        raise _no_memory(shape, dt, count * dt.itemsize) from None
    start = -ctypes.addressof(ctypes.c_char.from_buffer(raw)) % align      # (raw.ctypes.data: 3x the time)
    return np.ndarray(shape, dt, raw, start)            # (a slice, view and reshape: 3x the time)


_DTYPES = {}          # dtype argument -> its NumPy dtype, for the hashable ones empty() has seen


def _empty_dtype(dtype):
    try:
        dt = numpy_dtype(_numpy_spelling(dtype))
    except DtypeError as e:
        raise DtypeError(f"empty: {e}") from None
    except TypeError:
        raise TypeError(f"empty: dtype {dtype!r} is not a dtype; use a tppasm name "
                        f"({', '.join(NUMPY_NAMES)}) or a NumPy dtype") from None
    if dt.hasobject:
        raise TypeError(f"empty: dtype {dt} holds Python objects, which no kernel reads and a raw aligned buffer "
                        "cannot hold; pass a numeric dtype (tppasm names: " + ", ".join(NUMPY_NAMES) + ")")
    try:
        if len(_DTYPES) < 256:
            _DTYPES[dtype] = dt
    except TypeError:                       # unhashable (a dict spec): not remembered
        pass
    return dt


def _numpy_spelling(dtype):
    """``dtype`` as NumPy spells it where NumPy would not read it: a torch dtype (torch.float64 is
    "float64"), "f64" (tppasm's names count bits, and NumPy reads none of f64); else itself."""
    torch_dtype = imported("torch", "dtype")
    if torch_dtype is not None and isinstance(dtype, torch_dtype):
        return str(dtype).removeprefix("torch.")
    return "float64" if isinstance(dtype, str) and dtype.strip().lower() == "f64" else dtype


def _dimensions_too_big(shape, dt):
    """Whether NumPy refuses an empty array of ``shape``: it bounds the product of the other
    dimensions, as if the zero ones were 1."""
    return math.prod(d or 1 for d in shape) * dt.itemsize > _MAX_BYTES


def _too_big(shape, dt, count):
    if count:
        return ValueError(f"empty: shape {shown(shape)} of {dt.name} would span {int_text(count * dt.itemsize)} bytes, "
                          "more than an "
                          "array can address (2**63 - 1 bytes); check the shape")
    return ValueError(f"empty: shape {shown(shape)} of {dt.name} has no elements, but NumPy refuses it: its nonzero "
                      f"dimensions times the {dt.itemsize}-byte item exceed 2**63 - 1 bytes; check the shape")


def _no_memory(shape, dt, nbytes):
    """The MemoryError for an array of ``shape`` and ``dt`` (``nbytes`` bytes), worded as NumPy's.

    >>> text = str(_no_memory((1 << 40,), np.dtype(np.float32), 1 << 42)); text[:text.index(":")]
    'Unable to allocate 4.00 TiB for an array with shape (1099511627776,) and data type float32'
    """
    scale = next(i for i in range(6, -1, -1) if nbytes >= 1024 ** i or not i)
    size = f"{nbytes} bytes" if not scale else f"{nbytes / 1024 ** scale:.2f} {'KMGTPE'[scale - 1]}iB"
    return MemoryError(f"Unable to allocate {size} for an array with shape {shown(tuple(shape))} and data type "
                       f"{dt.name}: free memory, or allocate less (check the shape)")


def _empty_shape(shape):
    """``shape`` as a tuple of Python ints, or the ValueError naming the fix."""
    shape = (shape,) if isinstance(shape, (int, np.integer)) else shape
    if not isinstance(shape, (tuple, list)) or any(
            not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 0 for d in shape):
        raise ValueError(f"empty: shape {shown(shape)} must be non-negative integers, e.g. (64, 64)")
    return tuple(int(d) for d in shape)


def empty_for(spec):
    """A new, uninitialized array the (unbatched) kernel operand ``spec`` (a
    :class:`tppasm.operand.OperandSpec`) accepts: its shape and strides, rows ``ld`` apart where the
    kernel was built with ``ld`` > the row width; what ``kernel(inputs...)`` allocates.

    >>> import tppasm
    >>> out = empty_for(tppasm.relu(2, 3, ldo=8).operands[1])
    >>> out.shape, out.strides, out.ctypes.data % 64
    ((2, 3), (32, 4), 0)
    """
    plan = _ALLOCATIONS.get(spec)
    if plan is None:
        if len(_ALLOCATIONS) >= 4096:
            _ALLOCATIONS.clear()
        plan = _ALLOCATIONS[spec] = _allocation(spec)
    dt, shape, elements, strides = plan
    if strides is None:
        return empty(shape, dt)
    try:
        return np.ndarray(shape, dt, buffer=empty((elements,), dt), strides=strides)
    except MemoryError:                      # (named (elements,) above: the rows' span)
        raise _no_memory(shape, dt, elements * dt.itemsize) from None


_ALLOCATIONS = {}      # OperandSpec -> _allocation(spec) (a dict: torch.compile warns of an lru_cache)


def _allocation(spec):
    """(dtype, shape, elements spanned, byte strides or None when C-contiguous) of an array for ``spec``:
    worked out once per operand (an allocating call ``out = k(x)`` costs microseconds)."""
    dt = spec.np_dtype
    shape = tuple(spec.shape)
    strides = tuple(s * dt.itemsize for s in spec.strides)
    dense = tuple(dt.itemsize * math.prod(shape[i + 1:]) for i in range(len(shape)))
    return dt, shape, spec.nbytes() // dt.itemsize, None if strides == dense else strides


def aligned(x, align=ALIGN):
    """``x`` itself when it is C-contiguous and starts at a multiple of ``align`` bytes, else an
    aligned C-contiguous copy (see :func:`empty`).

    >>> import numpy as np
    >>> x = aligned(np.arange(10.0)[1:])
    >>> x.ctypes.data % 64, float(x[0]), aligned(x) is x
    (0, 1.0, True)
    """
    align = _check_align("aligned", align)
    x = as_array(x, "aligned", "x")
    if x.dtype.hasobject:
        raise TypeError(f"aligned: x of type {type(x.item(0) if x.size else x).__name__} is not numeric data "
                        "(NumPy reads it as Python objects); pass a NumPy array, a torch tensor or (nested) lists "
                        "of numbers")
    if x.flags.c_contiguous and x.ctypes.data % align == 0:
        return x
    out = empty(x.shape, x.dtype, align)
    out[...] = x
    return out


def new_aligned(x):
    """A new aligned C-contiguous copy of the NumPy array ``x`` (see :func:`empty`): what the layout
    helpers return, so that a result never shares memory with its input, whatever the shapes (a
    view of a (64, 64) x as its one 64 x 64 block would change when x does).

    >>> import numpy as np
    >>> x = np.ones((2, 3)); y = new_aligned(x)
    >>> y.ctypes.data % 64, np.shares_memory(x, y), bool((y == x).all())
    (0, False, True)
    """
    out = empty(x.shape, x.dtype)
    out[...] = x
    return out


def as_array(x, who, name="x"):
    """``x`` as a NumPy array for the helper ``who``: a torch tensor (bfloat16 too) or DLPack object
    viewed as a kernel views it (:func:`tppasm.operand.as_ndarray`), anything else ``np.asarray(x)``.
    A NumPy masked array is refused as kernels refuse it (its mask would be dropped): an
    :class:`~tppasm.operand.OperandError` naming ``who`` and the argument ``name``."""
    if isinstance(x, np.ndarray):
        refuse_masked(x, f"{who}: {name}")
        return np.asarray(x)
    if hasattr(type(x), "__dlpack__"):
        return as_ndarray(x, name, who)
    return np.asarray(x)


def _check_align(who, align):
    """``align`` as a Python int, or the ValueError naming the fix."""
    if isinstance(align, bool) or not isinstance(align, (int, np.integer)) or not 1 <= align <= MAX_ALIGN \
            or align & (align - 1):
        raise ValueError(f"{who}: align={shown(align)} must be a power of two number of bytes from 1 to {MAX_ALIGN} "
                         "(2 MiB, a huge page), e.g. 64")
    return int(align)


def block(x, bm, bk, outer="m", pad=False):
    """Blocks of ``x`` (rows, cols) as a new contiguous ``(rows/bm, cols/bk, bm, bk)`` array.

    ``outer="n"`` puts the column-block index first: ``(cols/bk, rows/bm, bm, bk)``, the layout of B
    in DESIGN.md's GEMM (``block(B, bk, bn, outer="n")[jn, ik]`` is block (ik, jn) of B).
    ``pad=True`` takes any shape: the last row and column blocks are filled up with zeros to
    ``ceil(rows/bm)`` x ``ceil(cols/bk)`` blocks (zeros add nothing to a GEMM's sums), and
    ``unblock(xb, shape=x.shape)`` crops them off again.

    >>> import numpy as np
    >>> block(np.zeros((6, 4)), 3, 2, outer="n").shape
    (2, 2, 3, 2)
    >>> xb = block(np.ones((5, 3)), 4, 2, pad=True)
    >>> xb.shape, xb[1, 1].tolist()
    ((2, 2, 4, 2), [[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    """
    x = as_array(x, "block", "x")
    if x.ndim != 2:
        raise ValueError(f"block: x must be 2-D (rows, cols), got shape {x.shape}")
    if not isinstance(pad, (bool, np.bool_)):
        raise ValueError(f"block: pad={pad!r}; expected True (fill the last blocks with zeros) or False")
    rows, cols = x.shape
    for name, size, dim in (("bm", bm, rows), ("bk", bk, cols)):
        if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 1:
            raise ValueError(f"block: {name}={shown(size)} must be a positive int block size")
        if dim % int(size) and not pad:
            raise ValueError(f"block: {name}={shown(size)} does not divide {dim}; pass a divisor of {dim}, or pad=True "
                             f"to fill the last block with zeros (unblock(..., shape=...) crops it off)")
    if outer not in ("m", "n"):
        raise ValueError(f"block: outer={outer!r}; expected 'm' (row blocks first) or 'n' (column blocks first)")
    bm, bk = int(bm), int(bk)                 # (NumPy block sizes of few bits would overflow in -(-rows // bm))
    mb, kb = -(-rows // bm), -(-cols // bk)
    if (mb * bm, kb * bk) != (rows, cols):
        full = np.zeros((mb * bm, kb * bk), x.dtype)
        full[:rows, :cols] = x
        x = full
    grid = x.reshape(mb, bm, kb, bk).transpose(0, 2, 1, 3)
    if outer == "n":
        grid = grid.transpose(1, 0, 2, 3)
    return new_aligned(grid)


def unblock(xb, outer="m", shape=None):
    """The inverse of :func:`block`: a blocked array back to (rows, cols), a new array;
    ``shape=(rows, cols)`` crops the zero padding of ``block(..., pad=True)``.

    >>> import numpy as np
    >>> x = np.arange(12.0).reshape(3, 4)
    >>> bool((unblock(block(x, 1, 2)) == x).all())
    True
    >>> bool((unblock(block(x, 2, 3, pad=True), shape=x.shape) == x).all())
    True
    """
    xb = as_array(xb, "unblock", "xb")
    if xb.ndim != 4:
        raise ValueError(f"unblock: expected a 4-D blocked array, got shape {xb.shape}")
    if outer not in ("m", "n"):
        raise ValueError(f"unblock: outer={outer!r}; expected 'm' or 'n', as given to block()")
    if outer == "n":
        xb = xb.transpose(1, 0, 2, 3)
    mb, kb, bm, bk = xb.shape
    full = xb.transpose(0, 2, 1, 3).reshape(mb * bm, kb * bk)
    if shape is not None:
        rows, cols = _crop_shape(shape, full.shape, (bm, bk))
        full = full[:rows, :cols]
    return new_aligned(full)


def _crop_shape(shape, full, sizes):
    if (not isinstance(shape, (tuple, list)) or len(shape) != 2
            or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in shape)):
        raise ValueError(f"unblock: shape={shown(shape)} must be (rows, cols), e.g. x.shape of the matrix blocked")
    if not all(f - b < d <= f for d, f, b in zip(shape, full, sizes)):
        raise ValueError(f"unblock: shape={shown(tuple(shape))} is not what {full[0]} x {full[1]} in blocks of "
                         f"{sizes[0]} x {sizes[1]} pads (each dimension in {full[0] - sizes[0] + 1}..{full[0]} x "
                         f"{full[1] - sizes[1] + 1}..{full[1]}); pass the shape of the matrix given to block()")
    return int(shape[0]), int(shape[1])


def nblocks(n, b):
    """How many blocks of ``b`` cover ``n`` (the last one padded): ``ceil(n / b)``.

    >>> nblocks(1000, 64), nblocks(1024, 64)
    (16, 16)
    """
    for name, value, least, what in (("n", n, 0, "the size to cover"), ("b", b, 1, "the block size")):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise ValueError(f"nblocks: {name}={shown(value)}; expected an int >= {least} ({what})")
    return -(-int(n) // int(b))


def vnni_pack(b, factor):
    """B (..., k, n) -> (..., ceil(k/factor), n, factor): ``factor`` consecutive rows interleaved.

    Rows past ``k`` (when ``factor`` does not divide it) are zero. ``factor`` is 2 (bf16), 4 (int8)
    or a dtype name ("bf16", "i8").

    >>> import numpy as np
    >>> vnni_pack(np.ones((3, 2), np.int8), "i8").shape
    (1, 2, 4)
    """
    f = _factor(factor)
    b = as_array(b, "vnni_pack", "b")
    if b.ndim < 2:
        raise ValueError(f"vnni_pack: b must be at least 2-D (..., k, n), got shape {b.shape}")
    k, n = b.shape[-2:]
    groups = -(-k // f)
    padded = np.zeros(b.shape[:-2] + (groups * f, n), b.dtype)
    padded[..., :k, :] = b
    return aligned(np.swapaxes(padded.reshape(b.shape[:-2] + (groups, f, n)), -1, -2))


def vnni_unpack(bv, k=None):
    """The inverse of :func:`vnni_pack`: (..., g, n, f) -> a new (..., k, n), ``k`` defaulting to g*f.

    >>> import numpy as np
    >>> b = np.arange(6).reshape(3, 2)
    >>> bool((vnni_unpack(vnni_pack(b, 2), 3) == b).all())
    True
    """
    bv = as_array(bv, "vnni_unpack", "bv")
    if bv.ndim < 3:
        raise ValueError(f"vnni_unpack: expected (..., k/f, n, f), got shape {bv.shape}")
    g, n, f = bv.shape[-3:]
    k = g * f if k is None else k
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not (0 < k <= g * f or k == g * f == 0):
        raise ValueError(f"vnni_unpack: k={k!r} must be an int in 1..{g * f} (the rows of B before packing)")
    out = np.swapaxes(bv, -1, -2).reshape(bv.shape[:-3] + (g * f, n))
    return new_aligned(out[..., :k, :])


def _factor(factor):
    if isinstance(factor, (int, np.integer)) and not isinstance(factor, bool):
        f = int(factor)
    else:
        try:
            f = VNNI_FACTORS.get(name_of(factor))     # any dtype spelling: "bfloat16", np.int8, ...
        except TypeError:
            f = None
    if f not in (1, 2, 4):
        raise ValueError(f"vnni_pack: factor={shown(factor)}; expected the int 2 (bf16), 4 (int8) or 1, or one of the "
                         f"dtypes {list(VNNI_FACTORS)}")
    return f
