"""Argument checks shared by the models: each refuses with a TypeError (wrong kind of thing) or a
ValueError (wrong value) that says what was expected and what to write instead.

>>> positive_int(3, "encode: batch_size")
3
>>> positive_int(0, "encode: batch_size")
Traceback (most recent call last):
...
ValueError: encode: batch_size=0; expected an int >= 1
"""
import math
from collections.abc import Mapping

import numpy as np

import tppasm as tpp
from isa.pool import Pool
from tppasm.layout import as_array


def positive_int(value, name):
    """``value`` as an int when it is an int (Python or NumPy, not a bool) >= 1; ``name`` ("who:
    argument") leads the error."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}={value!r}; expected an int >= 1 (write int(...))")
    if value < 1:
        raise ValueError(f"{name}={value!r}; expected an int >= 1")
    return int(value)


def positive_float(value, name):
    """``value`` as a float when it is a finite real number > 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}={value!r}; expected a number > 0 (write float(...))")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value!r}; expected a finite number > 0")
    return float(value)


def choice(value, options, name):
    """Refuse ``value`` unless it is one of the strings ``options``."""
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name}={value!r}; expected {' or '.join(map(repr, options))}")


def check_pool(pool, who):
    """Refuse a ``pool`` that is neither a thread pool nor None."""
    if pool is not None and not isinstance(pool, Pool):
        raise TypeError(f"{who}: pool={pool!r}; expected an isa.pool.Pool (e.g. Pool(4)) or None for the "
                        "process's pool (isa.pool.get_pool())")


def float_weights(weights, shapes, who):
    """{name: float32 array} for each name and shape of ``shapes``, from the mapping ``weights`` of
    floating-point arrays (other names are ignored); refuses a missing, misshapen, non-float or
    non-finite (in float32) weight by name."""
    if not isinstance(weights, Mapping):
        raise TypeError(f"{who}: weights of type {type(weights).__name__}; expected a dict of arrays by name "
                        f"({', '.join(list(shapes)[:3])}, ...)")
    missing = [name for name in shapes if name not in weights]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ValueError(f"{who}: weights lack {', '.join(map(repr, missing[:3]))}{more}; pass all "
                         f"{len(shapes)} weights of the checkpoint")
    out = {}
    for name, shape in shapes.items():
        a = as_array(weights[name], who)              # (a torch bfloat16 tensor too)
        if a.dtype.kind != "f" and not is_bf16(a):
            raise TypeError(f"{who}: weights[{name!r}] is {a.dtype}; expected floating point "
                            "(write .astype(np.float32))")
        if a.shape != shape:
            raise ValueError(f"{who}: weights[{name!r}] has shape {a.shape}; expected {shape}")
        a = np.asarray(a, np.float32)
        if not np.isfinite(a).all():
            raise ValueError(f"{who}: weights[{name!r}] holds NaN or inf (in float32); expected finite values")
        out[name] = a
    return out


def aligned_copy(a):
    """A 64-byte aligned C-contiguous copy of the array ``a``, never ``a`` itself (a model keeps
    it: the caller's later edits of ``a`` must not reach the model, as ``tpp.aligned`` would let
    them where ``a`` is already aligned).

    >>> w = np.ones(4, np.float32); c = aligned_copy(w); w[0] = 5
    >>> float(c[0]), c.ctypes.data % 64
    (1.0, 0)
    """
    out = tpp.empty(a.shape, a.dtype)
    out[...] = a
    return out


def is_bf16(a):
    """Whether the NumPy array ``a`` holds bfloat16 (ml_dtypes', tppasm's bf16), a float to widen.

    >>> import tppasm
    >>> is_bf16(np.zeros(1, tppasm.dtypes.dtype("bf16"))), is_bf16(np.zeros(1, np.float16))
    (True, False)
    """
    return a.dtype.name == "bfloat16"
