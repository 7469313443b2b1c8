"""The key under which a loop kernel keeps what it built for a call: its arrays' shapes, strides,
dtypes and writability (a call with the same key reuses the traced, compiled nest).

>>> import numpy as np
>>> signature([np.zeros((2, 3), np.float32)]) == signature([np.ones((2, 3), np.float32)])
True
"""
import numpy as np


def signature(arrays):
    """The binding key of ``arrays``; TypeError unless each is a NumPy array."""
    if not all(type(a) is np.ndarray for a in arrays):
        bad = [type(a).__name__ for a in arrays if type(a) is not np.ndarray]
        raise TypeError(f"loop kernels take NumPy arrays (np.ndarray, not subclasses); got {', '.join(bad)}")
    return tuple((a.shape, a.strides, a.dtype, a.flags.writeable) for a in arrays)
