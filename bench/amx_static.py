"""AMX BRGEMM without AMX hardware: the instruction mix, and a cycle model of each kernel.

Kernels run in :mod:`isa.x86.interp`; its ``stats`` give the executed instruction counts and the
tile instructions and prefetches in order (``tile_ops``). From these:

- the mix: ``tdp*`` per A/B tile load, and no tile load repeated within a batch step (a step: a
  run of loads from the A and B blocks of one batch index, ended by a tile store or zero; in batch
  chunks, :mod:`tppasm.x86.amx_chunk`, the next macro block's loads of a panel they share count,
  as they are issued before the stores: they hit L1);
- the model (:mod:`bench.amx_model`, Sapphire / Emerald Rapids figures): cycles per call and the
  modelled % of the AMX peak (16 cycles per 16x16x32 bf16 / 16x16x64 int8 ``tdp*``), in three
  readings of the hardware: ``in-order`` (tile instructions start in program order), ``ooo``
  (loads run ahead of waiting ``tdp*``, but a tile is not reloaded while a ``tdp*`` reads it) and
  ``renamed`` (tiles renamed like vector registers), with the tile-load lines per cache level.

These are MODELLED figures, not measurements: the latencies and throughputs are the optimization
manual's, the cache bandwidths assumptions (see :mod:`bench.amx_model`). Where the model would chunk
the batch, the table has two rows: the kernel without chunks and the one with them
(``TPPASM_AMX_CHUNKS=1``), which win in the renamed reading and lose in the other two; an AMX host
decides by timing both (:mod:`tppasm.x86.amx_probe`).

A last table sets the model against the one AMX measurement on record (:mod:`bench.amx_calibration`):
the reading that fits it best is ``ooo``.

``--conv`` adds the BRGEMMs of ResNet-50's 3x3 layers on 7x7 and 14x14 images, one output row per
call against several through the padded width (``bench.conv_nest.Blocking.rows``), and of its
strided 1x1 layers there, one output row against several gathered ones
(``bench.conv_nest.Blocking.gather``), in % of the AMX peak counting only the products that reach
the output.

``--crowding`` adds a LLaMA prefill projection's BRGEMM with A's rows 4 KiB apart and padded, as
generated (no prefetch of lines that would crowd an L1 set) and without prefetch, with a fully
associative and a 12-way L1 (:func:`crowding_rows`).

``python -m bench amx-static [--json FILE] [--quick] [--choices] [--conv] [--crowding] [--figures FILE]``
(``--choices``: the synthetic comparison of blockings and ``tdp*`` orders of
:mod:`bench.amx_choices` that chose the kernel's, and the best of every blocking that fits the 8
tiles in each reading; ``--figures``: every table but the calibration,
which weighs the model's own timings, modelled with the ones ``python -m bench amx-micro
--figures FILE`` measured on an AMX host)
"""
import argparse
import time
from collections import Counter

import numpy as np

from .amx_model import READINGS
from .common import Report, write_json
from .options import json_option

CASES = [  # (m, n, k, count, dtype, beta, c_dtype)
    (64, 64, 64, 16, "bf16", 0, "f32"),
    (64, 64, 64, 16, "bf16", 1, "bf16"),
    (32, 32, 32, 16, "bf16", 0, "f32"),
    (32, 32, 32, 1, "bf16", 0, "f32"),
    (64, 64, 63, 16, "bf16", 0, "f32"),
    (64, 64, 128, 16, "i8", 0, "i32"),
    (64, 64, 126, 16, "i8", 0, "i32"),
    (64, 64, 512, 4, "bf16", 0, "f32"),
    (40, 40, 64, 8, "bf16", 0, "f32"),
    (40, 24, 70, 8, "bf16", 1, "f32"),
    (17, 33, 36, 8, "i8", 1, "i32"),
]
QUICK = CASES[:1] + CASES[4:6]


def repeated_loads(tile_ops, blocks):
    """Tile loads that repeat an address within one batch step (``[]`` when there are none).

    ``tile_ops`` is the interpreter's ``stats.tile_ops``; ``blocks`` maps an operand name to
    (first address, bytes per batch block, count). A step is a maximal run of loads from A and B
    blocks of the same batch index; a tile store or zero, or a load from elsewhere (C, the
    scratch), ends it. Needs count >= 2 and distinct blocks, so that consecutive steps differ.

    >>> ld = ("tileloadd", (4,), (), 100, 64, 64, 16)
    >>> repeated_loads([ld, ld], {"a": (100, 50, 2)}), repeated_loads([ld, ("tilezero", (0,), (), 0, 0, 0, 0), ld], {"a": (100, 50, 2)})
    ([(0, 100)], [])
    """
    out, run, seen = [], None, set()
    for name, _, _, addr, _, _, _ in tile_ops:
        if not name.startswith("tileload"):
            if name.startswith(("tilestore", "tilezero")):
                run, seen = None, set()
            continue
        step = None
        for start, size, count in blocks.values():
            if start <= addr < start + size * count:
                step = (addr - start) // size
        if step != run:
            run, seen = step, set()
        if step is None:
            continue
        if addr in seen:
            out.append((step, addr))
        seen.add(addr)
    return out


def run_case(m, n, k, count, dtype, beta, c_dtype, chunk=None, lda=None, prefetch=True):
    """Generate and interpret one kernel (two calls: the second sees configured tiles; ``chunk``
    and ``prefetch``: see :func:`tppasm.x86.amx.generate`; ``lda``: A's row length, k by default);
    returns (stats of the second call, blocks, jit seconds)."""
    import ml_dtypes
    from isa.x86.interp import Machine
    from tppasm.brgemm import Brgemm
    from tppasm.layout import vnni_pack
    from tppasm.x86.amx import generate

    lda = lda or k
    d = Brgemm(m=m, n=n, k=k, dtype=dtype, beta=beta, c_dtype=c_dtype, lda=lda, stride_a=m * lda)
    d.validate()
    t = time.perf_counter()
    fn = generate(d, chunk, prefetch)
    jit = time.perf_counter() - t
    rng = np.random.default_rng(0)
    if dtype == "bf16":
        a = rng.standard_normal((count, m, lda)).astype(ml_dtypes.bfloat16)
        b = vnni_pack(rng.standard_normal((count, k, n)).astype(ml_dtypes.bfloat16), 2)
    else:
        a = rng.integers(0, 256, (count, m, lda)).astype(np.uint8)
        b = vnni_pack(rng.integers(-128, 128, (count, k, n)).astype(np.int8), 4)
    c = np.zeros((m, n), {"f32": np.float32, "i32": np.int32, "bf16": ml_dtypes.bfloat16}[c_dtype])
    mach = Machine()
    pa, pb, pc = mach.map(a), mach.map(b), mach.map(c)
    mach.call(fn.code, args=[pa, pb, pc, count])
    mach.stats.reset()
    mach.call(fn.code, args=[pa, pb, pc, count])
    blocks = {"a": (pa, a[0].nbytes, count), "b": (pb, b[0].nbytes, count)}
    return mach.stats, blocks, jit


def model(stats, dtype, m, n, k, count, figures=None, l1_ways=None):
    """{mode: modelled % of the AMX peak} and the renamed run's :class:`bench.amx_model.Result`;
    ``figures``: the model's timings (:class:`bench.amx_model.Figures`; its own by default);
    ``l1_ways``: see :func:`bench.amx_model.simulate`."""
    from .amx_model import FIGURES, TDP_CYCLES, TDP_WORK, simulate
    work = 2 * m * n * k * count
    out, res = {}, None
    vector = sum(v for name, v in stats.counts.items() if name.startswith(("v", "k")))
    for mode in READINGS:
        res = simulate(stats.tile_ops, figures=figures or FIGURES, l1_ways=l1_ways, **READINGS[mode])
        cycles = max(res.cycles, vector / 2)          # AVX-512 work (epilogue, k-tail copies): 2 per cycle
        out[mode] = 100 * work / (cycles * TDP_WORK[dtype] / TDP_CYCLES)
    return out, res


CONV_LAYERS = ("res5b_branch2b", "res4b_branch2b", "res5a_branch1", "res4a_branch1")


def conv_rows(layers=CONV_LAYERS, bk=(32, 64), bc=64, count=8, figures=None):
    """A Report: each layer's bf16 BRGEMM (bc-deep blocks, ``count`` per call) over one output row
    and over several: the row spans :func:`bench.conv.row_spans` offers (a stride-1 3x3 layer,
    through the padded width) or the gathered pixels (a strided 1x1 layer,
    ``bench.conv_nest.Blocking.gather``: 1, up to 8 and all output rows), MODELLED in % of the AMX
    peak of the products that reach the output (the padded width's extra columns do not count);
    ``figures``: as :func:`model`'s."""
    from .conv import layer, pixel_spans, row_spans
    rep = Report("Convolution BRGEMMs over 1 or several output rows (bench.conv_nest rows or gather), bf16: "
                 "MODELLED % of the AMX peak in useful products",
                 ["layer", "bk", "rows", "BRGEMM m", "useful rows", "% in-order", "% ooo", "% renamed"])
    for name in layers:
        sh = layer(name, 1)
        spans = [px // sh.q for px in pixel_spans(sh)] if sh.gatherable else [1] + row_spans(sh)
        for n in bk:
            for rows in spans:
                m = rows * sh.q if sh.gatherable else sh.spanned(rows)
                stats, _, _ = run_case(m, n, bc, count, "bf16", 1, "f32")
                pct, _ = model(stats, "bf16", m, n, bc, count, figures)
                useful = rows * sh.q / m
                rep.add(name, n, rows, m, rows * sh.q, *(round(pct[mode] * useful, 1) for mode in READINGS))
    return rep


def crowding_rows(figures=None, m=64, n=64, k=2048, lda=2048):
    """A Report: the LLaMA prefill projection's bf16 BRGEMM (one block of k) with A's rows 4 KiB
    apart (lda 2048) and padded (+32), as generated (lines that crowd an L1 set not prefetched,
    :func:`tppasm.x86.amx_pipe.crowded`) and without prefetch, MODELLED with a fully associative
    and a 12-way L1."""
    rep = Report(f"A's rows {2 * lda} bytes apart or padded: bf16 {m}x{n}x{k} x 1, MODELLED % of the AMX "
                 "peak (renamed / ooo) with a fully associative L1 and a 12-way one",
                 ["lda", "kernel", "prefetches", "fully associative L1", "12-way L1"])
    from tppasm.x86.amx_pipe import L1_WAYS
    for row in (lda, lda + 32):
        for prefetch in (True, False):
            stats, _, _ = run_case(m, n, k, 1, "bf16", 0, "f32", lda=row, prefetch=prefetch)
            cells = []
            for ways in (None, L1_WAYS):
                pct, res = model(stats, "bf16", m, n, k, 1, figures, l1_ways=ways)
                cells.append(f"{pct['renamed']:.1f} / {pct['ooo']:.1f}")
            rep.add(row, "as generated" if prefetch else "no prefetch", res.prefetches, *cells)
    return rep


def _table(title, rows):
    """A Report of ``rows`` (dicts with the same keys, in column order)."""
    rep = Report(title, list(rows[0]))
    for row in rows:
        rep.add(*row.values())
    return rep


def parse(argv=None):
    """The options of ``python -m bench amx-static``, checked (a bad one: argparse's error); no work done."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m bench amx-static")
    json_option(p)
    p.add_argument("--quick", action="store_true", help="three kernels only")
    p.add_argument("--choices", action="store_true", help="also score candidate blockings and tdp orders "
                   "on synthetic traces (bench.amx_choices)")
    p.add_argument("--conv", action="store_true", help="also the 7x7 and 14x14 3x3 and strided 1x1 "
                   "convolution BRGEMMs, one output row and several (bench.conv_nest rows, gather)")
    p.add_argument("--crowding", action="store_true", help="also a LLaMA prefill projection with A's rows "
                   "4 KiB apart or padded, modelled with a fully associative and a 12-way L1")
    p.add_argument("--figures", metavar="FILE", help="model with the timings python -m bench amx-micro "
                   "--figures FILE measured on an AMX host instead of the model's own")
    args = p.parse_args(argv)
    from .amx_model import FIGURES, load_figures
    args.model = (FIGURES, None, None)          # the figures modelled with, the reading that fit them, their host
    if args.figures:
        try:
            args.model = load_figures(args.figures)
        except ValueError as e:
            p.error(str(e))
    return args


def main(argv=None):
    args = parse(argv)
    from tppasm.brgemm import Brgemm
    from tppasm.x86.amx import plan
    from tppasm.x86.amx_chunk import chunk_blocks

    figures, reading, host = args.model
    if args.figures:
        print(f"MODELLED with the timings amx-micro measured on {host or 'an AMX host'} ({args.figures}); "
              f"the reading that fit it there: {reading}")
    else:
        print("MODELLED, not measured: AMX kernels run in the interpreter here; cycles from "
              "bench.amx_model (Sapphire/Emerald Rapids: tdp* 16 cycles, tileloadd 8 + 45 latency, "
              "L2 48 B/cycle; three readings of tile dependencies)")
    rep = Report("AMX BRGEMM static mix and modelled % of the AMX peak (per call, warm caches"
                 + (f"; the timings of {args.figures})" if args.figures else ")"),
                 ["kernel", "blocking", "tdp", "tileloadd A+B", "other tile loads", "tdp/load",
                  "repeats in a step", "prefetches", "L1/L2/L3 lines", "% in-order", "% ooo", "% renamed",
                  "JIT ms"])
    run_case(16, 16, 32, 2, "bf16", 0, "f32")           # warm-up: imports, the assembler's tables
    for case in (QUICK if args.quick else CASES):
        m, n, k, count, dtype, beta, c_dtype = case
        desc = Brgemm(m=m, n=n, k=k, dtype=dtype, beta=beta, c_dtype=c_dtype)
        pl, g = plan(desc), chunk_blocks(desc, plan(desc))
        for chunk in (0, g) if g else (0,):            # the default, and the opt-in batch chunks
            stats, blocks, jit = run_case(*case, chunk=chunk)
            counts = Counter(stats.counts)
            tdp = sum(v for name, v in counts.items() if name.startswith("tdp"))
            loads = [op for op in stats.tile_ops if op[0].startswith("tileload")]
            ab = sum(1 for op in loads if any(s <= op[3] < s + z * c for s, z, c in blocks.values()))
            blocking = f"{pl.gm}x{pl.gn}, {pl.steps}x{pl.step}" + (f"+{pl.tail}" if pl.tail else "") + \
                " groups" + (f", chunks of {chunk} (TPPASM_AMX_CHUNKS=1)" if chunk else "")
            pct, res = model(stats, dtype, m, n, k, count, figures)
            name = f"{dtype} {m}x{n}x{k} count {count} beta {beta} C {c_dtype}"
            rep.add(name, blocking, tdp, ab, len(loads) - ab, round(tdp / max(ab, 1), 3),
                    len(repeated_loads(stats.tile_ops, blocks)), res.prefetches,
                    "/".join(str(res.lines[lv]) for lv in (1, 2, 3)),
                    round(pct["in-order"], 1), round(pct["ooo"], 1), round(pct["renamed"], 1), round(jit * 1e3, 1))
    reports = [rep]
    if args.choices:
        from .amx_choices import best, compare, every_blocking
        reports.append(_table("Candidate blockings, 64 k steps, loads right after their tile's last reader: "
                              "MODELLED fraction of cycles the TMUL is busy", compare(figures=figures)))
        every = every_blocking()
        reports.append(_table(f"The ceiling: the best of all {len(every)} blockings of 8 tiles (48 k steps), "
                              "MODELLED", best(compare(every, steps=48, figures=figures))))
    if args.conv:
        reports.append(conv_rows(figures=figures))
    if args.crowding:
        reports.append(crowding_rows(figures=figures))
    from .amx_calibration import calibrate
    reports.append(_table("Calibration: the unpipelined kernel issue #12 measured on an Emerald Rapids core "
                          "(bf16 64x64x64 x 16, 1,346 GFLOP/s), MODELLED in each reading", calibrate()))
    write_json(args.json, reports)
    return 0


if __name__ == "__main__":
    main()
