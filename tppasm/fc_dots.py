"""The dot-product path of :func:`tppasm.fc.forward`: ``x @ w.T`` as the row-by-row dot products of
:func:`tppasm.gemm_nt`, which reads x and w along k as they are stored. Three cases take it:

- a few rows of x against a large weight (a decoder's next token): w is streamed once, at the speed
  of memory, its rows split among the threads;
- few out features (a classifier's or a regression's head): a BRGEMM would run its vectors along
  y's short rows, mostly empty; x's rows are split among the threads;
- a mid-size fp32 weight that is not packed (:func:`mid_dots`), which packing on every call would
  cost more than it saves; x's rows are split among the threads.

>>> dots(1, 4096, 4096), dots(100000, 2, 64), dots(1024, 1024, 1024)
(True, True, False)
"""
import functools
import math

import numpy as np

from .dtypes import dtype as numpy_dtype
from .eltwise import binary
from .fc_parallel import parallel_kernels, split
from .gemm_nt import MAX_ROW_BYTES, gemm_nt
from .layout import empty


def dots(n, m, k):
    """Whether :func:`tppasm.fc.forward` takes ``x @ w.T`` as the row-by-row dot products of
    :func:`tppasm.gemm_nt`, which streams w once as it is stored: for at most :data:`DOT_ROWS` rows of x, or few out
    features (:func:`few_columns`), where a BRGEMM's vectors along y's row would be mostly empty
    (and rows of w and y that gemm_nt takes).

    >>> dots(8, 4096, 4096), dots(1024, 1024, 1024), dots(100000, 2, 64)
    (True, False, True)
    """
    return (n <= DOT_ROWS or few_columns(n, m, k)) and max(m, k) * 4 <= MAX_ROW_BYTES


def few_columns(n, m, k):
    """Whether y's rows are so short (``m`` out features: a classifier's or a regression's head) that
    dot products along k beat the panels' BRGEMM, whose vectors run along y's rows: up to
    :data:`DOT_COLUMNS`; or up to 16 for k of at least 256; or up to 32 for at most 256 rows (whose
    panels cost more to pack than to use).

    >>> few_columns(9999, 8, 32), few_columns(9999, 16, 256), few_columns(9999, 16, 128), few_columns(256, 24, 64)
    (True, True, False, True)
    """
    return m <= DOT_COLUMNS or (m <= 16 and k >= 256) or (m <= 32 and n <= 256)


def mid_dots(n, m, k, dtype="f32"):
    """Whether a forward whose weight is not packed (:func:`tppasm.fc.pack`) takes the dot products
    past :data:`DOT_ROWS` rows too: a weight of at most :data:`MID_DOTS_BYTES` (in a core's L2, so
    gemm_nt's passes over it for each few rows of x stay in the cache), sizes within :data:`MID_DOTS_MAX`,
    with rows at least twice as long as x has rows (bf16: of up to :data:`MID_DOTS_BF16_ROWS` rows), or in fp32 one that
    :func:`tppasm.fc.transposed` would move x for, up to 64 rows. Those products are too small for
    packing w (or transposing x and y) on every call to pay off.

    >>> mid_dots(64, 64, 256), mid_dots(64, 256, 64), mid_dots(33, 256, 64), mid_dots(64, 256, 256, "bf16")
    (True, False, True, False)
    """
    if m * k * (2 if dtype == "bf16" else 4) > MID_DOTS_BYTES or n > MID_DOTS_MAX[0] or max(m, k) > MID_DOTS_MAX[1]:
        return False                # (past what was measured: 4096 x 8192 -> 32 ran 2.4x slower so)
    if dtype == "bf16":
        return k >= 2 * n and n <= MID_DOTS_BF16_ROWS
    return k >= 2 * n or (n <= 64 and n * (k + m) < m * k)


# Zen 4, 1 thread, us of a forward without packing: panels or transposed (as chosen before) / dots,
# fp32: 64 x 256 -> 64 28.3 / 22.7, 64 x 128 -> 256 87 / 62, 33 x 64 -> 512 89 / 40, 127 x 256 -> 256
# 226 / 181, 127 x 512 -> 512 753 / 656, 256 x 512 -> 256 782 / 729; but 64 x 64 -> 256 30.1 / 34.1,
# 127 x 128 -> 256 97 / 107, 256 x 256 -> 256 365 / 375; bf16 (k >= 2n) 33 x 128 -> 64 0.41x, 48 x 128 -> 256
# 0.76x, 48 x 512 -> 512 0.93x, but from 64 rows 0.7-1.2x, and 1.0-3.0x the time of the panels for shorter rows.
MID_DOTS_BYTES = 1 << 20
MID_DOTS_MAX = (256, 512)          # rows of x, and in or out features: the range measured
MID_DOTS_BF16_ROWS = 48


# Zen 4, 1 thread, time of the panels / the dots over k from 32 to 4096, 2048 rows, fp32 (bf16): m = 1
# 5.6-14 (5.7-10), m = 8 1.8-3.7 (1.1-2.9), m = 12 1.1-3.1 (0.74-1.9), m = 16 0.93-1.04 at k <= 64
# (0.58-0.64), 1.1-2.4 at k >= 256 (1.1-1.7), m = 24 0.75-1.5 (0.49-1.3), m = 32 0.58-1.2 (0.36-0.89);
# 256 rows: m = 32 1.13-1.36 (1.11-1.24), m = 40 1.07-1.27 (1.08-1.24)
DOT_COLUMNS = 8


# W bytes per thread of DotGemm (or DOT_MIN_FLOPS). Zen 4, 2 threads, us, DOT_MIN_FLOPS alone -> this: fp32
# 1 x 1024 -> 1024 79-81 -> 66-67, 4 x 768 -> 3072 196-199 -> 143-149; bf16 4 x 768 -> 3072 109-111 ->
# 97-107; at 1 << 20 flops instead, bf16 1 x 1024 -> 1024 (2 MiB) went 41-43 -> 57.
DOT_MIN_BYTES = 2 << 20
DOT_MIN_FLOPS = 1 << 24
# Zen 4, 1 thread, ms forward dots / transposed: fp32 24 x 4096 -> 4096 7.5 / 13.4, 32 rows 9.8 / 13.6, 48 rows
# 16.0 / 14.9, 64 rows 21.0 / 19.9; bf16 32 rows 5.1 / 7.1, 48 rows 7.8 / 7.7; 32 x 768 -> 3072 fp32 1.6 / 1.6,
# bf16 0.85 / 0.94. The fp32 backward's dx in place, ms against panels: 32 x 4096 -> 4096 14.9 / 19.5
DOT_ROWS = 32
# Flops per thread of DotGemm's runs of rows (few out features), fp32 and bf16. Zen 4, 2 threads, nothing
# else running, us, 1 part / 2: fp32 128 x 768 -> 24 (4.7 MFLOP) 53 / 64, 256 x 768 -> 24 (9.4) 99 / 89;
# bf16 256 x 768 -> 24 58 / 68, 2048 x 768 -> 10 (31) 190 / 149 (.devx/s49/split.py)
ROWS_MIN_FLOPS, BF16_ROWS_MIN_FLOPS = 1 << 22, 1 << 23


def forward_dots(plan, x, w, bias, out):
    """``out = x @ w.T + bias`` (then relu, where fused) from gemm_nt's dot products, straight into
    out without a bias or relu, else in fp32 (out itself for fp32: the add works in place) and
    rounded once by the bias add."""
    if plan.add_bias is None:
        return plan.gemm(x, w, out)
    y32 = out if out.dtype == np.float32 else empty(out.shape, np.float32)
    bias = plan.zero_bias if bias is None else bias
    if plan.gemm.by_rows and len(plan.gemm.blocks) > 1:          # each thread adds to its own rows
        return parallel_kernels([[product, *plan.add_bias[hi - lo].calls(y32[lo:hi], bias, out[lo:hi])]
                                 for product, (lo, hi) in zip(plan.gemm.calls(x, w, y32), plan.gemm.blocks)])
    plan.gemm(x, w, y32)
    plan.add_bias[len(out)](y32, bias, out)


LONG_VALUES = 4096         # BiasAdd's long rows from this many values on


class BiasAdd:
    """``out = act(y + bias)`` for y (fp32) and out, (rows, m) C-contiguous arrays, by the binary
    TPP. Rows shorter than a vector are added as whole vectors: up to ``rows - rows % per`` rows
    are viewed as rows of ``per * m`` values (a multiple of 16) against the bias repeated ``per``
    times, the rest as they are (on Zen 4, 100000 rows of 2: 0.79 ms as they are).

    >>> import numpy as np
    >>> add = BiasAdd(5000, 2, "f32", None)
    >>> add.per, add.long_rows, add.long is None, BiasAdd(5, 2, "f32", None).long is None
    (8, 625, False, True)
    >>> y = np.arange(4098, dtype=np.float32).reshape(2049, 2); out = np.empty_like(y)
    >>> BiasAdd(2049, 2, "f32", "relu")(y - 4, np.array([0, 100], np.float32), out)     # 2048 rows as 256
    >>> out[:3].tolist(), out[-1].tolist()
    ([[0.0, 97.0], [0.0, 99.0], [0.0, 101.0]], [4092.0, 4193.0])
    """

    def __init__(self, rows, m, dt, fused):
        self.m, self.per = m, (16 // math.gcd(m, 16) if m < 16 else 1)      # per * m = lcm(m, 16)
        self.long_rows, rest = divmod(rows, self.per)
        add = functools.partial(binary, "add", dtype="f32", out_dtype=dt, bcast_b="row", post=fused)
        # (a few rows are added as they are: repeating the bias costs more than it saves)
        long = self.long_rows * self.per * m >= LONG_VALUES and self.per > 1
        self.long = add(self.long_rows, self.per * m) if long else None
        self.rest = add(rest if self.long else rows, m) if rest or not self.long else None

    def __call__(self, y, bias, out):
        """Add ``bias`` to ``y`` into ``out`` here (:meth:`calls`: as calls for a thread)."""
        if self.long is None:                           # (the common case, without a call list)
            return self.rest(y, bias, out)
        for call in self.calls(y, bias, out):
            call()

    def calls(self, y, bias, out):
        """The kernel calls (of no arguments) that add ``bias`` to ``y`` into ``out``."""
        calls, done = [], 0
        if self.long:
            done, width = self.long_rows * self.per, self.per * self.m
            calls.append(functools.partial(self.long, y[:done].reshape(-1, width), np.tile(bias, self.per),
                                           out[:done].reshape(-1, width)))
        if self.rest:
            calls.append(functools.partial(self.rest, y[done:], bias, out[done:]))
        return calls


class DotGemm:
    """``C = A @ W.T`` for A (rows, k), W (m, k) by :func:`tppasm.gemm_nt` on up to ``threads`` threads,
    each a run of W's rows (C's columns) of ``min_flops`` (default :data:`DOT_MIN_FLOPS`) of work or
    :data:`DOT_MIN_BYTES` of W at least; past :data:`DOT_ROWS` rows (few columns) each a run of A's
    and C's rows instead (``by_rows``), of ``min_flops`` (default :data:`ROWS_MIN_FLOPS`, bf16
    :data:`BF16_ROWS_MIN_FLOPS`) or :data:`DOT_MIN_BYTES` of A.

    >>> import numpy as np
    >>> g = DotGemm(2, 70, 5, threads=2, min_flops=1)
    >>> g.blocks, DotGemm(1, 1024, 1024, "f32", threads=2).blocks, DotGemm(1, 1024, 1024, "bf16", threads=2).blocks
    ([(0, 35), (35, 70)], [(0, 512), (512, 1024)], [(0, 1024)])
    >>> c = np.empty((2, 70), np.float32); g(np.ones((2, 5), np.float32), np.ones((70, 5), np.float32), c)
    >>> float(c.min()), float(c.max())
    (5.0, 5.0)
    >>> DotGemm(100000, 2, 64, threads=2).blocks
    [(0, 50000), (50000, 100000)]
    """

    def __init__(self, rows, m, k, dtype="f32", threads=1, min_flops=None, c_dtype="f32"):
        flops, w_bytes = 2 * rows * m * k, m * k * numpy_dtype(dtype).itemsize
        self.by_rows = rows > DOT_ROWS
        if self.by_rows:
            x_bytes = rows * k * numpy_dtype(dtype).itemsize
            least = (BF16_ROWS_MIN_FLOPS if dtype == "bf16" else ROWS_MIN_FLOPS) if min_flops is None else min_flops
            by_flops = split(rows, flops, threads, least)
            self.blocks = max(by_flops, split(rows, x_bytes, threads, DOT_MIN_BYTES), key=len)
            self.kernels = {hi - lo: gemm_nt(hi - lo, m, k, dtype=dtype, c_dtype=c_dtype) for lo, hi in self.blocks}
            return
        by_flops = split(m, flops, threads, DOT_MIN_FLOPS if min_flops is None else min_flops)
        by_bytes = split(m, w_bytes, threads, DOT_MIN_BYTES)
        self.blocks = max(by_flops, by_bytes, key=len)
        self.kernels = {hi - lo: gemm_nt(rows, hi - lo, k, ldc=m, dtype=dtype, c_dtype=c_dtype)
                        for lo, hi in self.blocks}

    def __call__(self, a, w, c):
        if len(self.blocks) == 1:                    # (a small product: the calls' lists cost ~1 us)
            return self.kernels[self.blocks[0][1]](a, w, c)
        parallel_kernels([[call] for call in self.calls(a, w, c)])

    def calls(self, a, w, c):
        """The gemm_nt of each block of :attr:`blocks` as a call of no arguments."""
        if self.by_rows:
            return [functools.partial(self.kernels[hi - lo], a[lo:hi], w, c[lo:hi]) for lo, hi in self.blocks]
        return [functools.partial(self.kernels[hi - lo], a, w[lo:hi], c[:, lo:hi]) for lo, hi in self.blocks]


def dot_kernels(n, m, k, dt, bias, fused, threads):
    """The kernels of a forward on the dots path (for :func:`forward_dots`): the products, written
    straight into y without a bias or fused activation, else in fp32, with a bias add (and the
    activation) per block of rows that rounds them once (:class:`BiasAdd`)."""
    direct = not bias and not fused
    gemm = DotGemm(n, m, k, dt, threads, c_dtype=dt if direct else "f32")
    heights = {hi - lo for lo, hi in gemm.blocks} if gemm.by_rows else {n}
    return dict(gemm=gemm, zero_bias=np.zeros(m, np.float32),
                add_bias=None if direct else {h: BiasAdd(h, m, dt, fused) for h in heights})
