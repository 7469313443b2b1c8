"""The evidence behind the AMX BRGEMM's blocking and ``tdp*`` order: synthetic steady-state traces
of candidate schedules, scored by the cycle model (:mod:`bench.amx_model`; MODELLED figures).

A candidate is gm x gn accumulator tiles with ``abuf`` / ``bbuf`` buffers per A / B operand tile
(8 tiles in all), a ``tdp*`` order within a k step, and loads of the next step issued right after
the last reader of their tile (or at the step's start when the tile is double-buffered). Each
candidate runs 64 steps on operands that stay in L1 or that stream from L2; the table gives the
fraction of cycles the TMUL is busy in the model's three readings of tile dependencies.

``python -m bench amx-static --choices``

>>> rows = compare([(2, 2, 1, 1, "columns")], steps=8)
>>> rows[0]["blocking"], 0 < rows[0]["L1 ooo"] <= 1
('2x2 A1 B1 columns', True)

:func:`every_blocking` lists every candidate that fits the 8 tiles, and :func:`best` picks the
fastest of each column: the ceiling of what any blocking reaches in each reading, not only the
few :data:`CANDIDATES`.
"""
from .amx_model import FIGURES, READINGS, simulate

CANDIDATES = [(2, 2, 1, 1, "rows"), (2, 2, 1, 1, "columns"), (1, 2, 2, 2, "rows"), (2, 1, 2, 2, "rows"),
              (1, 3, 2, 1, "rows"), (3, 1, 1, 2, "columns"), (1, 1, 3, 3, "rows")]


def trace(gm, gn, abuf, bbuf, order, steps=64, resident=True):
    """Tile ops of ``steps`` k steps of one macro block (``order``: "rows" = C row by row,
    "columns" = column by column); operands cycle through 4 blocks (L1) or never repeat (L2)."""
    if gm * gn + gm * abuf + gn * bbuf > 8:
        raise ValueError("more than 8 tiles")
    c = {(i, j): i * gn + j for i in range(gm) for j in range(gn)}
    a_t = lambda i, s: gm * gn + i * abuf + s % abuf                    # noqa: E731
    b_t = lambda j, s: gm * gn + gm * abuf + j * bbuf + s % bbuf        # noqa: E731
    pairs = sorted(c, key=(lambda ij: ij) if order == "rows" else (lambda ij: (ij[1], ij[0])))
    last = {}
    for q, (i, j) in enumerate(pairs):
        last[("a", i)] = last[("b", j)] = q

    def load(kind, idx, s):
        block = s % 4 if resident else s
        addr = (block * 16 + (idx if kind == "a" else 8 + idx)) << 10
        return ("tileloadd", (a_t(idx, s) if kind == "a" else b_t(idx, s),), (), addr, 64, 64, 16)

    keys = [("a", i) for i in range(gm)] + [("b", j) for j in range(gn)]
    ops = [("tilezero", (t,), (), 0, 0, 0, 0) for t in c.values()] + [load(k, i, 0) for k, i in keys]
    for s in range(steps):
        early = [(k, i) for k, i in keys if (abuf if k == "a" else bbuf) > 1]
        if s + 1 < steps:
            ops += [load(k, i, s + 1) for k, i in early]
        for q, (i, j) in enumerate(pairs):
            ops.append(("tdp", (c[i, j],), (c[i, j], a_t(i, s), b_t(j, s)), 0, 0, 64, 16))
            if s + 1 < steps:
                ops += [load(k, idx, s + 1) for (k, idx), qq in last.items() if qq == q and (k, idx) not in early]
    return ops


def compare(candidates=CANDIDATES, steps=64, figures=FIGURES):
    """One record per candidate: TMUL utilization per reading, operands from L1 and from L2;
    ``figures``: the model's timings (:class:`bench.amx_model.Figures`)."""
    out = []
    for gm, gn, abuf, bbuf, order in candidates:
        rec = {"blocking": f"{gm}x{gn} A{abuf} B{bbuf} {order}", "loads/tdp": round((gm + gn) / (gm * gn), 2)}
        for where, resident in (("L1", True), ("L2", False)):
            ops = trace(gm, gn, abuf, bbuf, order, steps, resident)
            for name, kw in READINGS.items():
                rec[f"{where} {name}"] = round(simulate(ops, figures=figures, **kw).utilization(), 3)
        out.append(rec)
    return out


def every_blocking(tiles=8):
    """Every (gm, gn, abuf, bbuf, order) whose accumulators and operand buffers fit ``tiles``
    tiles; "columns" only where it differs from "rows" (gm and gn both above 1).

    >>> len(every_blocking()), (2, 2, 1, 1, "columns") in every_blocking(), (1, 1, 4, 3, "rows") in every_blocking()
    (39, True, True)
    """
    out = []
    for gm in range(1, tiles):
        for gn in range(1, tiles):
            for abuf in range(1, tiles):
                for bbuf in range(1, tiles):
                    if gm * gn + gm * abuf + gn * bbuf <= tiles:
                        out += [(gm, gn, abuf, bbuf, order) for order in ("rows", "columns")[:1 + (gm > 1 < gn)]]
    return out


def best(rows):
    """For each reading and level of :func:`compare`'s ``rows``: the highest TMUL busy fraction and
    the blocking that reaches it.

    >>> best([{"blocking": "x", "loads/tdp": 1, "L1 ooo": 0.5}, {"blocking": "y", "loads/tdp": 2, "L1 ooo": 0.7}])
    [{'reading': 'L1 ooo', 'best': 0.7, 'blocking': 'y'}]
    """
    columns = [c for c in rows[0] if c not in ("blocking", "loads/tdp")]
    return [{"reading": c, "best": top[c], "blocking": top["blocking"]}
            for c in columns for top in [max(rows, key=lambda r: r[c])]]
