"""The argument checks of :mod:`tppasm.fc`: each refuses with a TypeError or ValueError that
names ``fc.forward`` or ``fc.backward``, what was expected and what to pass instead.

>>> import numpy as np
>>> thread_count("forward", np.int64(2))
2
>>> dtype_of("forward", x=np.ones(2, np.float32), w=np.ones(2, np.float64))
Traceback (most recent call last):
...
ValueError: fc.forward: x is float32 and w float64; expected all float32 or all bfloat16 (a bias: float32 or x's dtype): pass w.astype(x.dtype)
"""
import numbers

import numpy as np

from .dtypes import dtype as numpy_dtype, name_of
from .operand import OperandError, as_ndarray, origin_of, refuse_masked

DTYPES = ("f32", "bf16")
DTYPE_NAMES = {numpy_dtype(name): name for name in DTYPES}     # NumPy dtype -> its name


def dtype_of(who, packed=(), **arrays):
    """The tppasm dtype name ("f32" or "bf16") all of ``arrays`` (name=array, in argument order) have;
    ``packed``: the names of those given packed (:func:`tppasm.fc.pack`: converting means packing again)."""
    values = list(arrays.values())
    first = values[0].dtype
    if first in DTYPE_NAMES and all(a.dtype == first for a in values):
        return DTYPE_NAMES[first]                    # (the usual case, in a third of the time)
    dts = {a.dtype for a in values}
    try:
        name = name_of(dts.pop()) if len(dts) == 1 else None
    except TypeError:
        name = None
    if name not in DTYPES:
        fail(who, _dtype_advice(arrays, packed))
    return name


def _dtype_advice(arrays, packed=()):
    """What ``dtype_of`` says of ``arrays`` (name=array) that are not all float32 or all bfloat16:
    each one's dtype, in argument order, and the conversions that make them one dtype."""
    names = list(arrays)
    dts = [arrays[n].dtype for n in names]
    said = ", ".join(f"{n} {dt}" for n, dt in zip(names[1:], dts[1:]))
    said = f"{names[0]} is {dts[0]}" + (f" and {said}" if len(names) == 2 else f", {said}" if said else "")
    good = next((n for n, dt in sorted(zip(names, dts), key=lambda p: p[0] != "x") if dt in DTYPE_NAMES), None)
    to = {n: "np.float32" if good is None else f"{good}.dtype" for n, dt in zip(names, dts)
          if good is None or dt != arrays[good].dtype}
    fix = ", ".join(f"tppasm.fc.pack({n}.astype({t})) (from the weight before packing)" if n in packed
                    else f"{n}.astype({t})" for n, t in to.items())
    bias = " (a bias: float32 or x's dtype)" if "x" in arrays else ""
    return f"{said}; expected all float32 or all bfloat16{bias}: pass {fix}"


def bias_of(who, bias, m, x):
    """``bias`` as the float32 (m,) array the kernels add (a bfloat16 bias in x's dtype converted,
    exactly), or None for None."""
    if bias is None:
        return None
    if not isinstance(bias, np.ndarray):
        fail(who, f"bias is a {type(bias).__name__}; expected a NumPy array of shape ({m},) in float32 or x's dtype, "
                  "or None: pass np.asarray(bias, np.float32)", TypeError)
    refuse_masked(bias, f"fc.{who}: bias")
    if bias.shape != (m,) or bias.dtype not in (np.float32, x.dtype):
        like_x = "" if x.dtype == np.float32 else f" or {x.dtype} as x"
        fail(who, f"bias must be float32 of shape ({m},){like_x}, got {bias.dtype} of shape {bias.shape}; pass one "
                  "value per row of w, as bias.astype(np.float32)")
    return np.ascontiguousarray(bias, np.float32)


def dense_rows(who, name, a):
    """``a``, a 2-D array, with dense rows (copied only when they are not): the kernels are built
    for row strides equal to the row length. A torch tensor or DLPack object is viewed as an array
    (:func:`tppasm.operand.as_ndarray`, which explains a tensor it cannot take); a NumPy masked
    array is refused, as kernels refuse it."""
    refuse_masked(a, f"fc.{who}: {name}")
    if not isinstance(a, np.ndarray):
        if origin_of(a) is None:
            fail(who, f"{name} is a {type(a).__name__}; expected a 2-D float32 or bfloat16 array: pass "
                      f"np.asarray({name}, np.float32)", TypeError)
        a = as_ndarray(a, name, f"fc.{who}")
    if a.ndim != 2:
        fail(who, f"{name} must be a 2-D array, got {type(a).__name__} of shape {a.shape}")
    return np.ascontiguousarray(a)


ALLOCATED = "or let it be allocated"
GRADIENT_CHOICES = "or pass True (allocated) or False (not computed)"


def output(who, name, a, shape, dt, choices=ALLOCATED):
    """``a``, when it is a C-contiguous writable array of ``shape`` and dtype ``dt`` to write a
    result into (TypeError for anything but a NumPy array, else ValueError)."""
    want = numpy_dtype(dt)
    array = isinstance(a, np.ndarray)
    refuse_masked(a, f"fc.{who}: {name}", writes=True)
    if array:
        flags = a.flags
        if a.shape == shape and a.dtype == want and flags.c_contiguous and flags.writeable:
            return a
    fail(who, f"{name} must be a C-contiguous writable {want} array of shape {shape}, got {describe(a)}; pass "
              f"such an array (e.g. tppasm.empty({shape}, {name_of(want)!r})) {choices}",
         ValueError if array else TypeError)


def refuse_overlap(who, given, inputs):
    """OperandError (a ValueError) naming the fix where an output array the caller gave (``given``: (name, array)
    pairs) shares memory with one of ``inputs`` ((name, array or None) pairs) or with another
    output: each kernel of a call reads its inputs after others have written outputs, so the
    result would be wrong (the kernels' own overlap checks see one kernel at a time, and none on
    threads). Inputs and outputs are C-contiguous here, so overlapping bounds are shared memory."""
    for i, (name, out) in enumerate(given):
        for role, pairs in (("the input", inputs), ("the output", given[:i])):
            for other, a in pairs:
                if a is not None and np.may_share_memory(out, a):
                    fail(who, f"{name} shares memory with {role} {other}; each result needs memory of its own, apart "
                              f"from the inputs: pass a separate array for {name} (e.g. tppasm.empty({out.shape}, "
                              f"{name_of(out.dtype)!r})) or let it be allocated", OperandError)


def describe(a):
    """``a``'s dtype, shape and what a kernel's output cannot be (its type, if not an array)."""
    if not isinstance(a, np.ndarray):
        return type(a).__name__
    return (f"{a.dtype} of shape {a.shape}" + ("" if a.flags.c_contiguous else ", not contiguous")
            + ("" if a.flags.writeable else ", read-only"))


def thread_count(who, threads):
    """``threads`` as an int >= 1 (a NumPy integer too, never a bool)."""
    if not isinstance(threads, numbers.Integral) or isinstance(threads, bool):
        fail(who, f"threads={threads!r} ({type(threads).__name__}); expected an int >= 1, the most threads to "
                  "share the GEMMs: pass threads=1, or e.g. threads=os.cpu_count()", TypeError)
    if threads < 1:
        fail(who, f"threads={threads!r}; expected an int >= 1: pass threads=1 for one thread")
    return int(threads)


def fail(who, message, error=ValueError):
    """Raise ``error`` with ``message``, as ``fc.<who>`` (forward or backward) says it."""
    raise error(f"fc.{who}: {message}")
