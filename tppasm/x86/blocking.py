"""The blocking model of the x86 BRGEMM kernels: how many rows (R) and vectors (V) a register
tile holds, chosen per shape by a small throughput model, and how rows split into tiles.

>>> row_runs(64, 6)
[(6, 9), (5, 2)]
"""
from dataclasses import dataclass

FMA_LATENCY = 5                 # cycles, with slack: 4 on Zen 3 and Skylake-X, more blocks hide jitter


@dataclass(frozen=True)
class Plan:
    rows: int          # R: rows per full tile
    vecs: int          # V: vectors per full column block
    nvec: int          # vectors across n
    tail: int          # columns in the last vector (0: full)


def _tile_cycles(dot, r, v):
    """Cycles per k group of an r x v tile: FMA ports (2), all vector ops (~3 per cycle: shifts and
    logic share ports with the FMAs), loads (2/cycle),
    and the latency chain (FMA_LATENCY per dependent op) of each accumulator."""
    fma = r * v * dot.ops / 2 if dot.ops <= 2 else r * v * 2 / 2 + r * v * 2 / 4
    alu = (r * v * dot.ops + r * dot.a_ops + v * dot.b_ops) / 3
    return max(fma, alu, (r + v) / 2, FMA_LATENCY * dot.chain) + 0.01 * (r + v)


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


def plan(desc, v, dot, epilogue_regs):
    """Choose R x V minimizing the modelled cycles over all tiles of C."""
    lanes = v.lanes(4)
    nvec = -(-desc.n // lanes)
    tail = desc.n % lanes
    mask_regs = 1 if tail and not v.avx512 else 0
    loop_regs = v.nregs - mask_regs - dot.na - len(dot.consts) - dot.tmps
    groups = desc.groups
    best = None
    for vecs in range(1, min(nvec, 8) + 1):
        rmax = min((loop_regs - vecs * dot.nb) // vecs, (v.nregs - mask_regs - epilogue_regs) // vecs,
                   desc.m, 16)
        for rows in range(1, rmax + 1):
            cost = 0.0
            for j in range(0, nvec, vecs):
                vt = min(vecs, nvec - j)
                for r, times in row_runs(desc.m, rows):
                    cost += times * (groups * _tile_cycles(dot, r, vt) * 4 + 2 * r * vt + 30)
            key = (cost, -rows * vecs)
            if best is None or key < best[0]:
                best = (key, Plan(rows, vecs, nvec, tail))
    return best[1]
