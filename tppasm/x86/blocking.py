"""The blocking model of the x86 BRGEMM kernels: how many rows (R) and vectors (V) a register
tile holds, chosen per shape by a small throughput model, and how rows split into tiles.

>>> row_runs(64, 6)
[(6, 9), (5, 2)]
"""
import functools
import math
from dataclasses import dataclass

FMA_LATENCY = 5                 # cycles, with slack: 4 on Zen 3 and Skylake-X, more blocks hide jitter
# Memory side of a k group: its loads and broadcasts issue at LOADS_PER_CYCLE, and each 64-byte
# line of B or A it brings in (B outgrows L1 and streams from L2 once per row tile) adds
# LINE_CYCLES. Fitted on Zen 3 to four tiles that the FMA count alone ranks equal, in fractions of
# the FMA peak: 6x2 on 48 columns 0.95 (one B line per group), 4x3 on 48 0.72-0.90 (96 of every
# 192 bytes: two lines), 2x5 on 40 0.68, 14x1 on 72 0.63 (15 loads); from L1 alone 14x1 runs at
# 0.85, hence 1.8 loads per cycle. AVX-512 parts move twice Zen 3's 32 bytes per cycle from L2:
# half the line cost (not measured: no such host here).
LOADS_PER_CYCLE = 1.8
LINE_CYCLES = {256: 1.5, 512: 0.75}
# A tile broadcasts from all of its rows at every k, so each row's current line of A stays live. Lines
# SET_PERIOD bytes apart share an L1 set (64 sets of 64 bytes: Zen 3/4, Intel since Skylake; 8 or 12
# ways), so rows a multiple of 4 KiB apart (lda = 1024 fp32, 2048 bf16) evict one another when a tile
# has more of them than the ways. Tiles keep at most ALIASED_ROWS rows in one set: on Zen 4, 1 thread,
# fp32 1024 x 16 x 1024 took 729 us with 16 rows, 409-428 with at most 4, 6 or 8 (1040: 407).
SET_PERIOD, ALIASED_ROWS = 4096, 6
# ... except a tile of every row of A (m of them: no next tile's rows): the ways hold up to 8. Splitting it
# read B twice: avx2 fp32 7 x 8 x 4096, lda 4096: 7.3 us in one tile, 11.0 as 4 + 3 rows
SINGLE_TILE_ROWS = 8


@dataclass(frozen=True)
class Plan:
    rows: int          # R: rows per full tile
    vecs: int          # V: vectors per full column block
    nvec: int          # vectors across n
    tail: int          # columns in the last vector (0: full)


def _tile_cycles(dot, r, v, lines=0.0):
    """Cycles per k group of an r x v tile: FMA ports (2), all vector ops (~3 per cycle: shifts and
    logic share ports with the FMAs), loads, the latency chain (FMA_LATENCY per dependent
    op) of each accumulator, and ``lines``: the cache-line cost of the operand bytes it reads."""
    fma = r * v * dot.mults / 2 + r * v * (dot.ops - dot.mults) / 4
    alu = (r * v * dot.ops + r * dot.a_ops + v * dot.b_ops) / 3
    return max(fma, alu, (r + v) / LOADS_PER_CYCLE + lines, FMA_LATENCY * dot.chain) + 0.01 * (r + v)


@functools.lru_cache(maxsize=4096)
def lines_per_row(offset, width, stride, line=64):
    """Cache lines of ``line`` bytes per row that a sweep down rows ``stride`` bytes apart brings in,
    reading ``width`` bytes from ``offset`` in each (the first row line-aligned, as
    :func:`tppasm.empty` allocates); lines shared by neighbouring rows count once.

    >>> lines_per_row(0, 64, 192), lines_per_row(0, 96, 192), lines_per_row(0, 96, 96), lines_per_row(64, 32, 96)
    (1.0, 2.0, 1.5, 1.0)
    """
    rows = line // math.gcd(stride, line) * 2         # a whole period of alignments, twice
    starts = [r * stride + offset for r in range(rows)]
    return len({i for s in starts for i in range(s // line, (s + width - 1) // line + 1)}) / rows


@functools.lru_cache(maxsize=4096)
def rows_per_set(stride, rows, line=64):
    """The most distinct lines in one L1 set (one ``line`` of every ``SET_PERIOD`` bytes) among
    the first bytes of ``rows`` rows ``stride`` bytes apart (rows that share a line count once).

    >>> rows_per_set(4096, 16), rows_per_set(2048, 16), rows_per_set(4100, 16), rows_per_set(4160, 16)
    (16, 8, 16, 1)
    >>> rows_per_set(4, 16), rows_per_set(0, 16)          # overlapping rows (a convolution's A)
    (1, 1)
    """
    sets = [n % (SET_PERIOD // line) for n in {i * stride // line for i in range(rows)}]
    return max(sets.count(s) for s in set(sets))


def column_blocks(nvec, vecs, vbytes, line=64):
    """The blocks of ``vecs`` vectors (``vbytes`` each) across ``nvec`` as (first byte modulo the
    line, vectors, how many): blocks whose start lies alike in a cache line cost alike, so the
    model's work does not grow with n.

    >>> column_blocks(10, 2, 32), column_blocks(7, 3, 32)
    ([(0, 2, 5)], [(0, 3, 1), (32, 3, 1), (0, 1, 1)])
    """
    full, rest = divmod(nvec, vecs)
    period = line // math.gcd(vecs * vbytes, line)          # blocks until the alignment repeats
    out = {}
    for j in range(min(full, period)):
        key = (j * vecs * vbytes % line, vecs)
        out[key] = out.get(key, 0) + len(range(j, full, period))
    if rest:
        key = (full * vecs * vbytes % line, rest)
        out[key] = out.get(key, 0) + 1
    return [(offset, vt, n) for (offset, vt), n in out.items()]


def row_runs(m, rows):
    """Row tiles of at most ``rows`` rows covering ``m``, as (rows, times) runs: as few tiles as
    ``rows`` allows, their heights differing by at most one (64 rows by 6: 9 x 6 + 2 x 5, not
    10 x 6 + 1 x 4, whose short tile has too few accumulators to hide the FMA latency).

    >>> row_runs(64, 6), row_runs(12, 6), row_runs(3, 6)
    ([(6, 9), (5, 2)], [(6, 2)], [(3, 1)])
    """
    tiles = -(-m // rows)
    base, tall = divmod(m, tiles)
    return [(r, t) for r, t in ((base + 1, tall), (base, tiles - tall)) if t]


def plan(desc, v, dot, epilogue_regs, row_a=0):
    """Choose R x V minimizing the modelled cycles over all tiles of C; with A's rows ``row_a``
    bytes apart (0: unknown), tiles of at most ``ALIASED_ROWS`` rows in one L1 set
    (``SINGLE_TILE_ROWS`` for one tile of all m rows)."""
    lanes = v.lanes(4)
    nvec = -(-desc.n // lanes)
    tail = desc.n % lanes
    reserved = (1 if tail and not v.avx512 else 0) + (1 if desc.pace else 0)   # AVX2 mask, pace chain
    loop_regs = v.nregs - reserved - dot.na - len(dot.consts) - dot.tmps
    groups = desc.groups
    row_b, line_cycles = desc.ldb * 4, LINE_CYCLES[v.bytes * 8]
    best = None
    for vecs in range(1, min(nvec, 8) + 1):
        rmax = min((loop_regs - vecs * dot.nb) // vecs, (v.nregs - reserved - epilogue_regs) // vecs,
                   desc.m, 16)
        for rows in range(1, rmax + 1):
            if row_a and rows_per_set(row_a, rows) > (ALIASED_ROWS if rows < desc.m else SINGLE_TILE_ROWS):
                continue                        # (rows = m may still fit)
            cost = 0.0
            for offset, vt, blocks in column_blocks(nvec, vecs, v.bytes):
                b_lines = lines_per_row(offset, vt * v.bytes, row_b)
                for r, times in row_runs(desc.m, rows):
                    lines = (b_lines + r * 4 / 64) * line_cycles
                    cost += blocks * times * (groups * _tile_cycles(dot, r, vt, lines) * 4 + 2 * r * vt + 30)
            key = (cost, -rows * vecs)
            if best is None or key < best[0]:
                best = (key, Plan(rows, vecs, nvec, tail))
    return best[1]
