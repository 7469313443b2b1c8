"""The element types tppasm kernels accept, by short name.

>>> dtype("bf16").itemsize, dtype("f32").name
(2, 'float32')
"""
import ml_dtypes
import numpy as np

DTYPES = {
    "f32": np.dtype(np.float32),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "i8": np.dtype(np.int8),
    "u8": np.dtype(np.uint8),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
}
NAMES = {v: k for k, v in DTYPES.items()}


def dtype(name) -> np.dtype:
    """The NumPy dtype of a tppasm dtype name (or of a NumPy dtype / type given directly)."""
    if isinstance(name, str) and name in DTYPES:
        return DTYPES[name]
    try:
        dt = np.dtype(name)
    except TypeError:
        dt = None
    if dt in NAMES:
        return dt
    raise TypeError(f"dtype {name!r} is not supported; use one of {', '.join(DTYPES)}")


def name_of(dt) -> str:
    """The short name of a dtype: ``name_of(np.float32) == 'f32'``."""
    return NAMES[dtype(dt)]
