"""The backward's dx of :mod:`tppasm.fc` for a few bf16 rows: :class:`StripGemm`."""
import functools

import numpy as np

from .brgemm import brgemm
from .dtypes import dtype as numpy_dtype
from .eltwise import transform, unary
from .fc_operands import k_blocks
from .fc_panels import PANEL_K
from .fc_parallel import parallel_kernels, part_flops, split
from .layout import empty


class StripGemm:
    """``C = A @ B`` for a few rows of A (rows, k) and a bf16 B (k, m) read in place: strips of B's
    rows (whole rows of each thread's columns, read in order; about ``strip_bytes`` packed, fc's
    :data:`~tppasm.fc.STRIP_BYTES`) are VNNI2-packed one at a time into a buffer that stays in the
    caches and multiplied at once, summed in fp32 and rounded to C by a copy at the end. Threads
    take runs of B's columns. The backward's dx for a few rows: packing B in column panels instead
    (:class:`tppasm.fc.PanelGemm`) reads it in short pieces a row stride apart (on Zen 4, 1 thread,
    dx of 8 rows against a 4096 x 4096 weight: 3.7-4.5 ms against 7.4-9.6; 16 x 1024 x 1024: 0.23
    against 0.36).

    >>> import numpy as np; from tppasm.dtypes import dtype
    >>> g = StripGemm(2, 70, 5, threads=2, min_flops=1)
    >>> g.blocks, g.strips
    ([(0, 35), (35, 70)], [(0, 5)])
    >>> c = np.empty((2, 70), dtype("bf16")); g(np.ones((2, 5), c.dtype), np.ones((5, 70), c.dtype), c)
    >>> float(c.astype(np.float32).min()), float(c.astype(np.float32).max())
    (5.0, 5.0)
    """

    def __init__(self, rows, m, k, dtype="bf16", threads=1, min_flops=None, strip_bytes=2 << 20):
        self.rows, self.m, self.k, self.np_dtype = rows, m, k, numpy_dtype(dtype)
        self.blocks = split(m, 2 * rows * m * k, threads, part_flops(dtype) if min_flops is None else min_flops)
        width = max(hi - lo for lo, hi in self.blocks)
        depth = min(k, max(PANEL_K, strip_bytes // (2 * width) // PANEL_K * PANEL_K))
        self.strips = [(j, min(j + depth, k)) for j in range(0, k, depth)]
        widths, depths = {hi - lo for lo, hi in self.blocks}, {j1 - j0 for j0, j1 in self.strips}
        self.packs = {(d, w): transform("vnni2", d, w, ldx=m, dtype=dtype) for d in depths for w in widths}
        self.kernels = {(d, w, beta): brgemm(rows, w, d, dtype, c_dtype="f32", lda=k, ldc=m, stride_a=d, beta=beta)
                        for d in depths for w in widths for beta in (0, 1)}
        self.rounding = {w: unary("copy", rows, w, ldx=m, ldo=m, dtype="f32", out_dtype=dtype) for w in widths}
        self.depth = depth

    def __call__(self, a, b, c):
        c32 = empty((self.rows, self.m), np.float32)
        parallel_kernels([self._column_calls(a, b, c, c32, lo, hi) for lo, hi in self.blocks])

    def _column_calls(self, a, b, c, c32, lo, hi):
        """The kernel calls of columns lo..hi: strip by strip, pack (into a buffer of their own)
        and multiply; then round to C."""
        w, calls = hi - lo, []
        buffer = empty((-(-self.depth // 2), w, 2), self.np_dtype)
        for j0, j1 in self.strips:
            d = j1 - j0
            panel = buffer[:-(-d // 2)]
            calls.append(functools.partial(self.packs[d, w], b[j0:j1, lo:hi], panel))
            calls.append(functools.partial(self.kernels[d, w, int(j0 > 0)], k_blocks(a[:, j0:], d, 1), _one(panel),
                                           c32[:, lo:hi], count=1))
        calls.append(functools.partial(self.rounding[w], c32[:, lo:hi], c[:, lo:hi]))
        return calls


def _one(a):
    """``a`` as a batch of one block (a[None] would give the batch axis stride 0, which the native
    entry does not take; a non-contiguous input is copied)."""
    return a.reshape((1,) + a.shape)


