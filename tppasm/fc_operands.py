"""The BRGEMM operands :mod:`tppasm.fc` makes of its arrays: rows as a batch of k blocks (A), and a
matrix's transpose, VNNI2-packed for bf16 (B).

>>> import numpy as np
>>> x = np.arange(12, dtype=np.float32).reshape(2, 6)
>>> k_blocks(x, 3, 2)[1].tolist()
[[3.0, 4.0, 5.0], [9.0, 10.0, 11.0]]
"""
import functools

import numpy as np

from .dtypes import dtype as numpy_dtype
from .eltwise import transform
from .layout import empty


def k_blocks(x, bk, count):
    """The rows of x (rows, >= count * bk) as a BRGEMM's A: a batch of ``count`` blocks of ``bk``
    columns (``stride_a=bk``)."""
    if count == 1 and bk == x.shape[1]:
        return x.reshape((1,) + x.shape)        # (0.2 us where the constructor takes 0.9 with its arguments)
    shape, strides = (count, x.shape[0], bk), (bk * x.itemsize,) + x.strides
    if x.flags.c_contiguous:    # the constructor: 0.3 us where as_strided takes 3, and it checks the bounds
        return np.ndarray(shape, x.dtype, x, 0, strides)
    return np.lib.stride_tricks.as_strided(x, shape, strides)


class PackedWeight:
    """A weight w (m, k) packed once by :func:`tppasm.fc.pack` for :func:`tppasm.fc.forward`:
    ``panels`` maps each column range (c0, c1) of y to the B its BRGEMM reads (w's rows c0..c1
    transposed; for bf16 VNNI2-packed), and ``w`` is w itself, which the dot products of a few
    rows against a large weight stream as stored."""

    __slots__ = ("w", "dtype", "panels")

    def __init__(self, w, dtype, panels):
        self.w, self.dtype, self.panels = w, dtype, panels

    def __reduce__(self):
        # (the default reduce of a __slots__ class needs protocol 2; this one works at every protocol)
        return PackedWeight, (self.w, self.dtype, self.panels)

    def __repr__(self):
        return f"PackedWeight({self.w.shape[0]} x {self.w.shape[1]} {self.dtype}, {len(self.panels)} panel(s))"


class TransposedB:
    """The B of a BRGEMM from a matrix given by its r rows of k (W, or x; C-contiguous): its
    transpose (k, r), for bf16 the VNNI2 packing of it (ceil(k/2), r, 2), which for an even k is
    the fp32 transpose of the rows' bf16 pairs read as 32-bit words; an odd k's rows have no such
    view, and are transposed as bf16, then packed (1000 x 65: 7.8 us, where padding the rows with a
    copy for the one-pass form took 20). ``ld``: the packed rows' stride in 32-bit words (fp32 elements,
    bf16 pairs), at least r (default r: contiguous; an odd k's bf16 packing is always contiguous).

    >>> import numpy as np; from tppasm.dtypes import dtype
    >>> x = np.arange(6, dtype=np.float32).reshape(2, 3).astype(dtype("bf16"))
    >>> TransposedB(2, 3, "bf16")(x).astype(np.float32).tolist()
    [[[0.0, 1.0], [3.0, 4.0]], [[2.0, 0.0], [5.0, 0.0]]]
    """

    def __init__(self, r, k, dtype, ld=None):
        self.r, self.k, self.pairs, self.np_dtype = r, k, dtype == "bf16", numpy_dtype(dtype)
        self.words = -(-k // 2) if self.pairs else k
        self.odd = self.pairs and k % 2 == 1
        self.ld = r if ld is None or self.odd else ld         # 32-bit words from a packed row to the next
        if self.odd:
            self.kernels = transform("transpose", r, k, dtype=dtype), transform("vnni2", k, r, dtype=dtype)
        else:
            self.kernels = transform("transpose", r, self.words, ldo=self.ld, dtype="f32"),

    def __call__(self, rows):
        buffers = self.buffers()
        for call in self.calls(rows, buffers):
            call()
        return self.packed(buffers)

    def buffers(self):
        """(out, scratch) for :meth:`calls`: the packing as fp32 words and, for an odd k, room for
        the bf16 transpose."""
        return empty((self.words, self.ld), np.float32), empty((self.k, self.r), self.np_dtype) if self.odd else None

    def calls(self, rows, buffers):
        """The kernel calls that pack ``rows`` into ``buffers`` (:meth:`buffers`)."""
        out, scratch = buffers
        if self.odd:
            return [functools.partial(self.kernels[0], rows, scratch),
                    functools.partial(self.kernels[1], scratch, self.packed(buffers))]
        return [functools.partial(self.kernels[0], rows.view(np.float32), out[:, :self.r])]

    def packed(self, buffers):
        """The B that :meth:`calls` leave in ``buffers``."""
        return self.room(buffers)[:, :self.r]

    def room(self, buffers):
        """The C-contiguous array whose first r columns :meth:`packed` is: (words, ld) (bf16: (words, ld, 2))."""
        out = buffers[0]
        return out.view(self.np_dtype).reshape(self.words, self.ld, 2) if self.pairs else out
