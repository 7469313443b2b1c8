"""How :mod:`tppasm.fc` shares its kernel calls among threads: products cut into runs of rows or
panels of at least :data:`MIN_FLOPS` each, and lists of kernel calls run one per thread on the
process's native pool.

>>> split(5, 10 ** 9, threads=2)
[(0, 3), (3, 5)]
"""
from isa.pool import get_pool


def row_blocks(rows, n, k, threads, min_flops=None):
    """``rows`` cut into up to ``threads`` (lo, hi) blocks of at least ``min_flops`` (default
    :data:`MIN_FLOPS`) of a (rows x n x k) product each.

    >>> row_blocks(10, 4, 4, threads=3, min_flops=1)
    [(0, 4), (4, 7), (7, 10)]
    """
    return split(rows, 2 * rows * n * k, threads, min_flops)


def split(count, flops, threads, min_flops=None):
    """``count`` items (of ``flops`` in all) cut into up to ``threads`` runs (lo, hi) of about equal
    length, each of at least ``min_flops``.

    >>> split(5, 10 ** 9, threads=2), split(5, 10, threads=2)
    ([(0, 3), (3, 5)], [(0, 5)])
    """
    min_flops = MIN_FLOPS if min_flops is None else min_flops
    parts = max(1, min(threads, count, flops // min_flops))
    q, r = divmod(count, parts)
    return [(i * q + min(i, r), (i + 1) * q + min(i + 1, r)) for i in range(parts)]


def panel_shares(panels, rows, parts, grain=16):
    """The work of ``panels`` ((c0, c1) column ranges) over ``rows`` rows cut into ``parts``
    shares, each a list of pieces (c0, c1, lo, hi): whole panels, runs of panels of about equal
    columns; where those would leave a share more than :data:`UNEVEN` over an equal one (5
    panels on 2 threads: 3 against 2.5), equal work instead, a panel's rows cut (at a multiple
    of ``grain``) between two shares, each packing it (fc's backward dw of 1000 x 300 -> 700 on
    2 threads of a Zen 3: 3.0 -> 2.6 ms).

    >>> panel_shares([(0, 64), (64, 128), (128, 192), (192, 256)], 100, 2)
    [[(0, 64, 0, 100), (64, 128, 0, 100)], [(128, 192, 0, 100), (192, 256, 0, 100)]]
    >>> panel_shares([(0, 64), (64, 128), (128, 172)], 100, 2)
    [[(0, 64, 0, 100), (64, 128, 0, 32)], [(64, 128, 32, 100), (128, 172, 0, 100)]]
    """
    widths = [c1 - c0 for c0, c1 in panels]
    ends = [sum(widths[:i + 1]) for i in range(len(panels))]       # columns up to each panel's end
    whole = [0] + [min(range(len(panels) + 1), key=lambda i: abs((ends[i - 1] if i else 0) - t * ends[-1] / parts))
                   for t in range(1, parts)] + [len(panels)]
    most = max((ends[j - 1] if j else 0) - (ends[i - 1] if i else 0) for i, j in zip(whole, whole[1:]))
    shares = [[(*panels[p], 0, rows) for p in range(i, j)] for i, j in zip(whole, whole[1:]) if j > i]
    if most <= ends[-1] / parts * (1 + UNEVEN):
        return shares
    cuts = [0]                     # each share's start: panel index * rows + the row it starts at
    for t in range(1, parts):
        column = t * ends[-1] / parts
        p = next(i for i, end in enumerate(ends) if end > column)
        row = min(rows, round((column - ends[p] + widths[p]) / widths[p] * rows / grain) * grain)
        cuts.append(max(cuts[-1], p * rows + row))
    cuts.append(len(panels) * rows)
    cut = [[(*panels[p], max(lo - p * rows, 0), min(hi - p * rows, rows)) for p in range(lo // rows, -(-hi // rows))]
           for lo, hi in zip(cuts, cuts[1:]) if hi > lo]
    return min(shares, cut, key=lambda shares: max(sum((c1 - c0) * (hi - lo) for c0, c1, lo, hi in share)
                                                   for share in shares))


UNEVEN = 0.05

# The least work of a thread's part, fp32 and bf16: below it a second thread costs more than it saves
# (a region of two parts costs ~15 us of Python and pool). Zen 4 VM, 2 threads, nothing else running,
# fc.forward us in 1 part / 2 (.devx/s49/split.py): fp32 100 x 300 -> 70 (4.2 MFLOP) 59 / 72, 64 x 256
# -> 256 (8.4) 102 / 94, 48 x 384 -> 384 (14.2) 152 / 123, 127 x 65 -> 1000 (16.5) 176 / 152; bf16 8.4
# MFLOP 58-65 / 77-81, 14.2 89 / 111, 16.5 109 / 108, 64 x 512 -> 512 (33.6) 188 / 147. (Figures taken
# beside other processes had put fp32's at 1 << 24 too.)
MIN_FLOPS = 5 << 20
BF16_MIN_FLOPS = 1 << 24

# Up to this many rows, a weight of one panel (fc.panel_width) that several threads multiply is cut
# into a panel per thread, each packed by the thread that uses it, instead of one panel packed
# first and shared by row blocks. Zen 4, 2 threads, time of row blocks / column panels: fp32 64 x
# 64 -> 4096 1.37, 128 x 128 -> 2048 1.15, 256 x 256 -> 1024 1.04; bf16 1.24, 1.19, 1.10; at 384 to
# 2048 rows 0.82-1.33 (fp32 256 -> 1024 0.82-0.94) (.devx/fcpan2.py).
COLUMN_SPLIT_ROWS = 256


def part_flops(dtype):
    """The least work (flops) of a thread's part of a ``dtype`` product: :data:`MIN_FLOPS` for fp32,
    :data:`BF16_MIN_FLOPS` for bf16 (its products take half the time and more of their packing).

    >>> part_flops("f32") < part_flops("bf16")
    True
    """
    return BF16_MIN_FLOPS if dtype == "bf16" else MIN_FLOPS


def parallel_kernels(shares):
    """Run ``shares`` (lists of kernel calls: functools.partial of a kernel and its arrays, one list per
    thread): one here, several as native calls on the process's pool (:meth:`isa.pool.Pool.run_native`),
    whose workers never take the interpreter lock. Zen 4 VM, 2 threads, 127 x 384 -> 1536 fp32, ms after
    0.25 s idle, Python pool threads / native calls: forward 1.5-1.7 / 0.86-1.0, with backward 4.2-5.0 / 2.5-3.0."""
    if len(shares) == 1:
        for call in shares[0]:
            call()
        return
    get_pool().run_native([[call.func.raw_call(*call.args, check=CHECK_RAW_CALLS, **call.keywords) for call in share]
                           for share in shares])


# True: check each native call as a kernel call would be (the tests do; ~15 us a BRGEMM)
CHECK_RAW_CALLS = False
