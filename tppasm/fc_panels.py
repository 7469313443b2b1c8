"""The geometry of :mod:`tppasm.fc`'s BRGEMM calls over packed B panels: the rows of a call
(:func:`panel_rows`), the row stride of a panel (:func:`panel_stride`), and :class:`RowGemm`, the
products over blocks of rows that the transposed forward runs.

>>> panel_rows(0, 300), panel_stride(256)
([(0, 100), (100, 200), (200, 300)], 272)
"""
import functools

import numpy as np

from .brgemm import brgemm
from .fc_args import DTYPE_NAMES
from .fc_operands import k_blocks
from .fc_parallel import parallel_kernels, part_flops, row_blocks, split

PANEL, PANEL_K = 64, 64    # columns of C per BRGEMM call; k per batch block (where it divides k)


def panel_rows(lo, hi):
    """Rows lo..hi cut into the fewest runs of at most :data:`PANEL_ROWS`, of about equal length:
    a panel's BRGEMM call each, which ran faster than one call over all rows on a Zen 3 core (1
    thread, fp32 GFLOP/s, A @ B over k in batch blocks of 64, calls of all rows / of 128: panels of
    64 columns 256 x 1024 -> 1024 87 / 92, 512 x 1024 -> 1024 81 / 92, 1024 x 256 -> 1024 85 / 93;
    one panel 2048 x 256 -> 256 75 / 95, 2048 x 128 -> 512 80 / 92, 1024 x 256 -> 1024 86 / 87).
    Callers cut rows so only where k comes in several batch blocks: a shallow k (the backward's dw
    for 64 to 127 rows: k = 64, 127) lost 5-15% on 2 threads in runs.

    >>> panel_rows(0, 100), panel_rows(0, 300)
    ([(0, 100)], [(0, 100), (100, 200), (200, 300)])
    """
    count = hi - lo
    return [(lo + a, lo + b) for a, b in split(count, count, -(-count // PANEL_ROWS), 1)] if count else [(lo, hi)]


PANEL_ROWS = 128


def batch_depth(k):
    """The k of a batch block of a product over ``k``: :data:`PANEL_K` where it divides k (and is
    smaller), else k whole.

    >>> batch_depth(1024), batch_depth(64), batch_depth(300)
    (64, 64, 300)
    """
    return PANEL_K if k % PANEL_K == 0 and k > PANEL_K else k


def block_runs(blocks, cut):
    """The runs of rows of each block (lo, hi) of ``blocks``: :func:`panel_rows` where ``cut``, else
    the block whole.

    >>> block_runs([(0, 200), (200, 260)], True), block_runs([(0, 200)], False)
    ([[(0, 100), (100, 200)], [(200, 260)]], [[(0, 200)]])
    """
    return [panel_rows(lo, hi) if cut else [(lo, hi)] for lo, hi in blocks]


def panel_stride(width):
    """The row stride, in 32-bit words (fp32 elements, bf16 pairs), of a packed B panel ``width``
    words wide: one 64-byte line more where its rows would be an even number of lines apart, at
    least 512 bytes. Such rows fall in few of the L1's 64 sets (rows 4 KiB apart: all in one), so
    a column block of B, read down its k rows by every row tile, misses L1 on every line. On a Zen
    3 core, 1 thread, fp32 GFLOP/s of one BRGEMM with B's rows ``width`` / ``panel_stride(width)``
    words apart: 512 x 1024 x 128 51 / 88, 1024 x 1024 x 256 (fc's dw of a 256 x 1024 -> 1024
    layer) 51 / 86, 512^3 71 / 92, 384 x 1536 x 384 65 / 86; 64 columns (256 bytes) the same.

    >>> panel_stride(64), panel_stride(128), panel_stride(1024), panel_stride(700)
    (64, 144, 1040, 700)
    """
    row = width * 4
    return width + 16 if row >= 512 and row % 128 == 0 else width


def packed_stride(width, k, dtype):
    """The row stride of :class:`~tppasm.fc_operands.TransposedB`'s packing of ``width`` rows of
    ``k``: :func:`panel_stride`, but for bf16 of an odd k (packed by the vnni2 transform) ``width``.

    >>> packed_stride(128, 64, "bf16"), packed_stride(128, 65, "bf16"), packed_stride(128, 65, "f32")
    (144, 128, 144)
    """
    return width if dtype == "bf16" and k % 2 else panel_stride(width)


class RowGemm:
    """``C = A @ B`` (+ bias, activation) as BRGEMMs over blocks of A's and C's rows, run on up to
    ``threads`` threads (kernels release the GIL for large calls), each block at least
    :func:`~tppasm.fc_parallel.part_flops` of work; within a block, with ``runs``, in runs of rows
    (:func:`panel_rows`) over k in batch blocks of :data:`PANEL_K` where they divide k, as
    :class:`tppasm.fc.PanelGemm` multiplies a panel. Called with A (rows, k), B (k, n) or VNNI2 (k/2, n, 2)
    whose rows are ``ldb`` (default n) 32-bit words apart, C (rows, n) and the bias if built with one.

    >>> import numpy as np
    >>> g = RowGemm(64, 8, 8, threads=2, min_flops=1)
    >>> g.blocks
    [(0, 32), (32, 64)]
    >>> c = np.empty((64, 8), np.float32); g(np.ones((64, 8), np.float32), np.ones((8, 8), np.float32), c)
    >>> float(c.min()), float(c.max())
    (8.0, 8.0)
    """

    def __init__(self, rows, n, k, dtype="f32", threads=1, min_flops=None, c_dtype=None, ldb=0, runs=False,
                 **options):
        self.blocks = row_blocks(rows, n, k, threads, part_flops(dtype) if min_flops is None else min_flops)
        self.k, self.bk = k, batch_depth(k) if runs else k
        self.runs = block_runs(self.blocks, k > self.bk)
        heights = {hi - lo for run in self.runs for lo, hi in run}
        self.kernels = {h: brgemm(h, n, self.bk, dtype, c_dtype=c_dtype or dtype, lda=k, ldb=ldb, stride_a=self.bk,
                                  **options) for h in heights}

    def __call__(self, a, b, c, *bias):
        parallel_kernels(self.calls(a, b, c, *bias))

    def calls(self, a, b, c, *bias):
        """For each block of :attr:`blocks`, the BRGEMMs of its runs as calls of no arguments."""
        count = self.k // self.bk
        b = b.reshape((count, -1) + b.shape[1:])
        return [[functools.partial(self.kernels[hi - lo], k_blocks(a[lo:hi], self.bk, count), b, c[lo:hi], *bias,
                                   count=count) for lo, hi in run] for run in self.runs]


def packed_panel(p, c0, c1):
    """Columns c0..c1 of PackedWeight ``p``; a ValueError with the fix where its panels are not
    those of today's plan (a packing pickled by another version, or under other panel settings),
    or the panel is not what :func:`tppasm.fc.pack` makes of ``p.w`` (threads > 1 run it unchecked)."""
    panel = p.panels.get((c0, c1))
    if panel is None:
        raise ValueError(f"{p!r}: its panels are not the ones this tppasm cuts (none for columns {c0}..{c1}: "
                         "packed by another version, or under other panel settings); pack the weight again: "
                         "fc.pack(p.w)")
    k, dt = p.w.shape[1], p.w.dtype     # (what pack makes: (k, ld), bf16 VNNI2-packed; its first c1 - c0 columns)
    ld = packed_stride(c1 - c0, k, DTYPE_NAMES[dt])
    shape = (k, ld) if dt.itemsize == 4 else (-(-k // 2), ld, 2)      # (fp32, or bf16: no other)
    if type(panel) is not np.ndarray or panel.shape != shape or panel.dtype != dt or not panel.flags.c_contiguous:
        got = f"{panel.shape} {panel.dtype}" if isinstance(panel, np.ndarray) else f"a {type(panel).__name__}"
        raise ValueError(f"{p!r}: its panel for columns {c0}..{c1} is {got}, not the C-contiguous {shape} {dt} that "
                         "fc.pack(p.w) makes (panels of another weight, or of another version?); pack the weight "
                         "again: fc.pack(p.w)")
    return panel[:, :c1 - c0]
