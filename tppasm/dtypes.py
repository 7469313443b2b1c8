"""The element types tppasm kernels accept, and every way users spell them.

A tppasm dtype has a short name ("f32", "bf16", "i8", "u8", "i32", "i64"). Every constructor
also takes what NumPy, ml_dtypes and torch users write: ``np.float32``, ``"float32"``,
``np.dtype("f4")``, ``ml_dtypes.bfloat16``, ``"bfloat16"``, ``torch.bfloat16`` (when torch is
imported), ``np.int8``... :func:`name_of` turns any of them into the short name.

``ml_dtypes`` (which supplies NumPy's bfloat16) takes about 1.5 s to import, so it is imported
only when a bf16 dtype is first needed: fp32 and int8 users never pay for it.

>>> dtype("bf16").itemsize, dtype("f32").name, name_of("float32"), name_of(np.int8)
(2, 'float32', 'f32', 'i8')
"""
import sys

import numpy as np

NUMPY_NAMES = {"f32": "float32", "bf16": "bfloat16", "i8": "int8", "u8": "uint8", "i32": "int32",
               "i64": "int64"}
# spellings of each short name besides itself and its NumPy name
ALIASES = {"fp32": "f32", "single": "f32", "float32_t": "f32", "bfloat16_t": "bf16", "int8_t": "i8",
           "uint8_t": "u8", "int32_t": "i32", "int64_t": "i64", "s8": "i8", "s32": "i32", "s64": "i64"}
SPELLINGS = {**{k: k for k in NUMPY_NAMES}, **{v: k for k, v in NUMPY_NAMES.items()}, **ALIASES}
# dtypes people try that no kernel computes in, and what to do instead
UNSUPPORTED = {
    "float64": "tppasm kernels compute in f32 or bf16: convert with .astype(np.float32)",
    "float16": "tppasm kernels compute in f32 or bf16 (not IEEE half): convert with .astype(np.float32) "
               "or .astype(ml_dtypes.bfloat16)",
    "int16": "integer kernels take int8/uint8 inputs with int32 results: convert with .astype(np.int8)",
    "uint16": "integer kernels take int8/uint8 inputs with int32 results: convert with .astype(np.uint8)",
}
_TABLE = {}


class DtypeError(TypeError, ValueError):
    """A dtype no tppasm kernel takes (a TypeError; also a ValueError, which descriptor checks raise)."""


def _bfloat16():
    import ml_dtypes          # lazily: see the module docstring
    return ml_dtypes.bfloat16


def _table():
    """short name -> np.dtype, built on first use (bf16 resolved only when asked for)."""
    if not _TABLE:
        for short, numpy_name in NUMPY_NAMES.items():
            if short != "bf16":
                _TABLE[short] = np.dtype(numpy_name)
    return _TABLE


def _short_name(x):
    """The short name of ``x`` without importing ml_dtypes unless ``x`` is a bfloat16, else None.
    Spellings once recognized are remembered: NumPy's ``dtype.name`` alone takes microseconds, and
    every allocation and kernel call asks."""
    if not isinstance(x, (str, np.dtype, type)):
        return _recognize(x)
    short = _KNOWN.get(x)
    if short is None:
        short = _recognize(x)
        if short is not None:
            _KNOWN[x] = short
    return short


_KNOWN = {}


def imported(module, attr):
    """``module.attr`` if ``module`` is imported and has it, else None, never importing it. A module
    that another thread is importing at this moment is in ``sys.modules`` half initialized, without
    the attribute yet, which counts as not imported.

    >>> imported("numpy", "ndarray") is np.ndarray, imported("no_such_module", "x")
    (True, None)
    """
    return getattr(sys.modules.get(module), attr, None)


def _recognize(x):
    if x is None or isinstance(x, bool):
        return None
    if isinstance(x, str):
        short = SPELLINGS.get(x.strip().lower().removeprefix("np.").removeprefix("numpy.")
                              .removeprefix("torch."))
        if short is not None:
            return short
    torch_dtype = imported("torch", "dtype")
    if torch_dtype is not None and isinstance(x, torch_dtype):
        return SPELLINGS.get(str(x).removeprefix("torch."))
    try:
        dt = np.dtype(x)
    except (TypeError, ValueError):
        return None
    if dt.name == "bfloat16" and dt == np.dtype(_bfloat16()):
        return "bf16"
    short = SPELLINGS.get(dt.name)
    return short if short != "bf16" and short in NUMPY_NAMES and _table()[short] == dt else None


def _display(x):
    if x is None or isinstance(x, bool):
        return repr(x)
    torch_dtype = imported("torch", "dtype")
    if torch_dtype is not None and isinstance(x, torch_dtype):
        return str(x)
    try:
        dt = np.dtype(x)
    except (TypeError, ValueError):
        return repr(x)
    if isinstance(x, str):
        return repr(x)
    if dt.names is not None:
        return str(dt)                                  # a structured dtype: its fields, not void32
    return dt.name if dt.isnative else repr(dt.str)     # '>f4', not float32


def _byte_order_hint(x):
    """What to write for a dtype that is a tppasm one in the other byte order ('>f4'), else None."""
    try:
        dt = np.dtype(x)
    except (TypeError, ValueError):
        return None
    short = None if dt.isnative else _short_name(dt.newbyteorder("="))
    return short and (f"its byte order is not this machine's: use {short!r} (arrays: convert with "
                      f".astype({dt.newbyteorder('=').str!r}))")


def name_of(x, who="", param="dtype") -> str:
    """The short name ("f32", "bf16", "i8", "u8", "i32", "i64") of any spelling of a dtype.

    Raises :class:`DtypeError` (a TypeError) naming the accepted spellings; ``who``/``param`` say where it came from.

    >>> [name_of(x) for x in ("float32", "bfloat16", np.uint8, np.dtype("i4"), "fp32")]
    ['f32', 'bf16', 'u8', 'i32', 'f32']
    """
    if isinstance(x, str) and x in NUMPY_NAMES:          # the common case, first
        return x
    short = _short_name(x)
    if short is not None:
        return short
    where = f"{who}: " if who else ""
    shown = _display(x)
    hint = UNSUPPORTED.get(shown.strip("'").removeprefix("torch.")) or _byte_order_hint(x)
    legal = ("f32 (np.float32, 'float32'), bf16 (ml_dtypes.bfloat16, 'bfloat16'), i8 (np.int8), "
             "u8 (np.uint8), i32 (np.int32), i64 (np.int64)")
    raise DtypeError(f"{where}{param}={shown} is not a tppasm dtype" + (f": {hint}" if hint else "")
                    + f"; the dtypes are {legal}")


def dtype(x) -> np.dtype:
    """The NumPy dtype of any spelling of a tppasm dtype.

    >>> dtype("float32") == np.float32, dtype("u8").name
    (True, 'uint8')
    """
    short = name_of(x)
    if short == "bf16":
        return np.dtype(_bfloat16())
    return _table()[short]


def numpy_dtype(x) -> np.dtype:
    """A tppasm spelling as its NumPy dtype, anything else as ``np.dtype(x)`` (for allocation
    helpers, which also make float64 or bool arrays); TypeError if neither.

    >>> numpy_dtype("bf16").itemsize, numpy_dtype(np.float64).name
    (2, 'float64')
    """
    short = _short_name(x)
    if short is not None:
        return dtype(short)
    if isinstance(x, str) and x in _BYTE_COUNTED:
        raise DtypeError(f"dtype {x!r}: tppasm's names count bits (f32, bf16, i8, ...), and NumPy reads {x!r} as "
                         f"{_BYTE_COUNTED[x]} (a count of bytes), which is likely not what was meant: pass the NumPy "
                         f"name ('float16' for half precision, {_BYTE_COUNTED[x]!r} if that is it)")
    return np.dtype(x)


_BYTE_COUNTED = {"f8": "float64", "f16": "float128"}     # NumPy codes that read as another tppasm-like name


def __getattr__(name):
    """``DTYPES`` (short name -> np.dtype) and ``NAMES`` (the inverse), built on first access
    (they include bfloat16, so they import ml_dtypes)."""
    if name == "DTYPES":
        return {short: dtype(short) for short in NUMPY_NAMES}
    if name == "NAMES":
        return {dtype(short): short for short in NUMPY_NAMES}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
