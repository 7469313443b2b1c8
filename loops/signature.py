"""The key under which a loop kernel keeps what it built for a call: its arrays' shapes, strides,
dtypes and writability (a call with the same key reuses the traced, compiled nest); and the
arrays themselves, from whatever the caller passed (NumPy arrays, torch tensors, DLPack objects).

>>> import numpy as np
>>> signature([np.zeros((2, 3), np.float32)]) == signature([np.ones((2, 3), np.float32)])
True
"""
import numpy as np

from tppasm.operand import as_ndarray, origin_of, refuse_write

from .affine import TraceError
from .trace import PyArray


def signature(arrays):
    """The binding key of ``arrays``; TypeError unless each is a NumPy array."""
    if not all(type(a) is np.ndarray for a in arrays):
        if any(getattr(a, "traced_view", False) or isinstance(a, PyArray) for a in arrays):   # (PyArray: .python())
            raise TraceError("a loop nest cannot run inside another nest's body, where its arguments are traced "
                             "blocks, not arrays: write the loops as one nest (one spec over all of them), or call "
                             "the nests one after the other from Python")
        bad = [type(a).__name__ for a in arrays if type(a) is not np.ndarray]
        raise TypeError("loop kernels take NumPy arrays (subclasses as plain views), torch tensors and objects "
                        f"with __dlpack__; got {', '.join(bad)}: pass np.asarray(...) of it")
    return tuple((a.shape, a.strides, a.dtype, a.flags.writeable) for a in arrays)


def as_arrays(objs, names, who):
    """``objs`` with its torch tensors, DLPack objects and ndarray subclasses (``np.memmap``...) as
    NumPy arrays over the same memory (:func:`tppasm.operand.as_ndarray`, which refuses masked
    arrays; anything else is left for :func:`signature` to refuse):
    ``objs`` itself when every one is an ``np.ndarray`` already, else a new tuple.

    >>> import numpy as np
    >>> objs = (np.zeros(2),); as_arrays(objs, ["X"], "k") is objs
    True
    """
    if all(type(a) is np.ndarray for a in objs):
        return objs
    names = list(names) + [f"arg{i}" for i in range(len(names), len(objs))]
    return tuple(as_ndarray(a, n, who) if _viewed(a) else a for a, n in zip(objs, names))


def _viewed(a):
    """Whether ``a`` is taken as a NumPy view: a tensor, a DLPack object, an ndarray subclass other
    than the python mode's arrays (which :func:`signature` refuses inside a body)."""
    if isinstance(a, np.ndarray):
        return not isinstance(a, PyArray)
    return origin_of(a) in ("torch", "dlpack")


def written_objects(objs, writes, names, who):
    """The objects among ``objs`` whose index is in ``writes``, once each is known writable in
    place (:func:`tppasm.operand.refuse_write`: not a tensor that requires grad, say)."""
    out = []
    for i in sorted(writes):
        refuse_write(objs[i], names[i], who)
        out.append(objs[i])
    return out
