"""How a core runs tile loads beside tile products, measured: synthetic AMX loops timed on this
host and set against the three readings of the cycle model (:mod:`bench.amx_model`), which
decides which reading the AMX blocking should be chosen by.

The model's readings (``in-order``, ``ooo``: a tile is not reloaded while a ``tdp*`` still
reads it, ``renamed``: tiles renamed like vector registers) disagree most on a loop that reloads
the operand tile of a ``tdp*`` in flight; these loops isolate each effect. On an Emerald Rapids
core (family 6 model 207) the renamed reading fit (misfit 0.19 against 0.51 and 0.56): a reloaded
operand tile cost nothing, a chain of ``tdp*`` into one tile ran at 16 cycles each, a 2 x 2 k step
took 87-89 cycles from L2 against 64 from L1, and a round trip of C (the ``c_trip`` loops) ~100
cycles, which the model's tile-store fence (:mod:`bench.amx_model`) is fitted to. The ``check``
loop (not yet run on an AMX host) asks whether the ``sttilecfg`` with which every
``tile_setup=True`` kernel call checks its tiles waits for the tile work before it, as the model
has it: 119 cycles a trip if so, 64 if not. Each loop's body
is data (:data:`LOOPS`); its machine code runs natively where the host has AMX and, everywhere, in the
interpreter, whose record of the tile instructions is what the model reads. Operands are bf16
tiles of one array: the first 8 (8 KiB, L1) for most loops; the ``_l2`` loops walk 1 MiB of them
(L2), new blocks every trip. One ``ldtilecfg`` per call, before the loop (the ``config`` loop
adds one a trip).

Cycles come from the ``tdp`` loop: its independent ``tdpbf16ps`` run one per 16 cycles (the
model's figure, the optimization manual's), so the host's cycles per trip of a loop are its time
per trip times 16 x 24 / the ``tdp`` loop's time per trip. The model's cycles per trip are the
difference between two runs of the loop (12 and 4 trips; 96 and 32 for the ``_l2`` loops) over
their difference in trips, so the ``ldtilecfg`` and the cold start drop out. A reading's misfit
is the mean |ln(model / measured)| over the loops other than ``tdp``; the smallest fits.

On an AMX host the report goes on: the reading that fits, the timings the host implies where they
differ from the model's (:func:`host_figures`, a :class:`bench.amx_model.Figures` that
:func:`bench.amx_model.simulate` takes), and the AMX BRGEMM at issue #12's goal shape modelled
with the host's timings beside the model's own, with and without batch chunks.

Where AMX is interpreted (no AMX on this host) only the model's columns are filled: a MODEL, not
a measurement. ``python -m bench amx-micro [--rounds N] [--json FILE] [--figures FILE]``
(``--figures``, AMX hosts: the host's timings and the reading that fits, which ``python -m bench
amx-static --figures FILE`` then models every kernel with)

>>> rows = model_rows()
>>> [r["loop"] for r in rows][:3], rows[0]["ooo"], rows[0]["renamed"]
(['tdp', 'chain', 'load'], 384.0, 384.0)
>>> reload = rows[3]; reload["loop"], reload["renamed"] < reload["ooo"] / 2
('reload', True)
"""
import argparse
import math
import time
from dataclasses import replace

import numpy as np

from .amx_model import FIGURES, READINGS, TDP_CYCLES, save_figures, simulate
from .common import Report, write_json
from .options import count, json_option, summary, writable_file

BLOCK = 1024                          # bytes of one operand tile: 16 rows x 64
L1_BLOCKS = 8                         # 8 KiB: the loops that stay in L1
L2_BLOCKS = 1024                      # 1 MiB: the loops that stream from L2 (48 KiB L1, 2 MiB L2)


def _load(tile, block):
    return ("load", tile, block)


def _tdp(c, a, b):
    return ("tdp", c, a, b)


def _store(tile, block):
    return ("store", tile, block)


STEP2X2 = [_load(4, 0), _load(5, 1), _load(6, 2), _load(7, 3),
           _tdp(0, 4, 6), _tdp(1, 4, 7), _tdp(2, 5, 6), _tdp(3, 5, 7)]
C_TRIP = [_store(t, 8 + t) for t in range(4)] + [_load(t, 12 + t) for t in range(4)]   # batch chunks' hand-off

# name: (what it isolates, body of one trip, operand blocks it walks). A loop over more than
# L1_BLOCKS moves its blocks on by the ones its body reads each trip, wrapping round. Tiles 6 and 7
# are loaded once before the loop.
LOOPS = {
    "tdp": ("TMUL throughput, the clock: 24 independent tdp into 6 tiles",
            [_tdp(t, 6, 7) for _ in range(4) for t in range(6)], L1_BLOCKS),
    "chain": ("tdp latency: 4 tdp into one tile, each waiting for the last", [_tdp(0, 6, 7)] * 4, L1_BLOCKS),
    "load": ("tile-load issue rate from L1: 8 loads, no tdp", [_load(t, t) for t in range(8)], L1_BLOCKS),
    "reload": ("renaming: 4 x (load T6, tdp reading T6), T6 reloaded while a tdp reads it",
               [op for i in range(4) for op in (_load(6, i), _tdp(i, 6, 7))], L1_BLOCKS),
    "reload2": ("the same over two operand tiles, T4 and T5 in turn",
                [op for i in range(4) for op in (_load(4 + i % 2, i), _tdp(i, 4 + i % 2, 7))], L1_BLOCKS),
    "step2x2": ("a 2x2 BRGEMM k step from L1: A0 A1 B0 B1 loaded, 4 tdp", STEP2X2, L1_BLOCKS),
    "load_l2": ("tile loads from L2: 8 loads of new lines, no tdp", [_load(t, t) for t in range(8)], L2_BLOCKS),
    "step2x2_l2": ("the 2x2 k step on operands streaming from L2", STEP2X2, L2_BLOCKS),
    "store": ("tile-store rate into L1: 4 tilestored (past the operands)", [_store(t, 8 + t) for t in range(4)],
              L1_BLOCKS),
    "c_trip8": ("a C round trip: 2 k steps (8 tdp), then 4 accumulators stored and 4 loaded",
                STEP2X2 * 2 + C_TRIP, L1_BLOCKS),
    "c_trip16": ("the same after 4 k steps (16 tdp)", STEP2X2 * 4 + C_TRIP, L1_BLOCKS),
    "config": ("an ldtilecfg, as a kernel call that must configure pays", [("config",)], L1_BLOCKS),
    "check": ("the sttilecfg every tile_setup=True call checks its tiles with, after 4 independent tdp "
              "(modelled: it waits for them)", [_tdp(t, 6, 7) for t in range(4)] + [("stcfg",)], L1_BLOCKS),
}
MODEL_TRIPS = {L1_BLOCKS: (4, 12), L2_BLOCKS: (32, 96)}   # L2: 96 trips read 384-768 KiB, no wrap


def operands(seed=0):
    """The loops' operand array: L2_BLOCKS tiles of bf16 (random normal: real products, no
    denormals), 64-byte aligned; the L1 loops use its first L1_BLOCKS."""
    import ml_dtypes
    import tppasm as tpp
    out = tpp.empty((L2_BLOCKS, BLOCK // 2), "bf16")
    out[...] = np.random.default_rng(seed).standard_normal(out.shape).astype(ml_dtypes.bfloat16)
    return out


def build(name, loops=None):
    """The JitFunction(trips, operands) of loop ``name`` of ``loops`` (by default :data:`LOOPS`;
    the same form): tiles configured, zeroed, tiles 6 and 7 loaded from blocks 6 and 7, then
    ``trips`` times the body, then ``tilerelease``.

    >>> from isa.x86.interp import Machine
    >>> m = Machine(); _ = m.call(build("step2x2").code, args=[2, m.map(operands())])
    >>> m.stats.counts["tdpbf16ps"], m.stats.counts["tileloadd"]
    (8, 10)
    """
    from isa.x86 import TMM, Function, r8, r9, r10, r11, rax, rsp
    from .peaks import configure_full_tiles
    loops = LOOPS if loops is None else loops
    if name not in loops:
        raise ValueError(f"amx-micro: no loop {name!r}; the loops are {', '.join(loops)}")
    _, body, span = loops[name]
    fn = Function(f"amx_micro_{name}", ["i64", "ptr"])
    a = fn.asm
    configure_full_tiles(fn)
    base, stride, start, left = r10, r11, r8, r9
    a.mov(base, fn.args[1])
    a.mov(stride, 64)
    for t in range(8):
        a.tilezero(TMM[t])
    for t in (6, 7):
        a.tileloadd(TMM[t], [base + stride + t * BLOCK])
    per = 1 + max(op[2] for op in body if op[0] == "load") if span > L1_BLOCKS else 0
    if per:
        a.mov(start, base)
        a.mov(left, span // per)
    loop, go_on = a.label(), a.label()
    a.mov(rax, fn.args[0])
    a.bind(loop)
    for op in body:
        if op[0] == "load":
            a.tileloadd(TMM[op[1]], [base + stride + op[2] * BLOCK])
        elif op[0] == "store":
            a.tilestored([base + stride + op[2] * BLOCK], TMM[op[1]])
        elif op[0] == "config":
            a.ldtilecfg([rsp])
        elif op[0] == "stcfg":
            a.sttilecfg([rsp])                 # the configuration loaded: the same 64 bytes
        else:
            a.tdpbf16ps(TMM[op[1]], TMM[op[2]], TMM[op[3]])
    if per:
        a.add(base, per * BLOCK)
        a.dec(left)
        a.jnz(go_on)
        a.mov(base, start)
        a.mov(left, span // per)
        a.bind(go_on)
    a.dec(rax)
    a.jnz(loop)
    a.tilerelease()
    return fn.finalize()


def model_cycles(name):
    """{reading: modelled cycles per trip of loop ``name``}, from its code run in the interpreter."""
    from isa.x86.interp import Machine
    fn, ops = build(name), operands()
    trips = MODEL_TRIPS[LOOPS[name][2]]
    traces = []
    for n in trips:
        m = Machine()
        m.call(fn.code, args=[n, m.map(ops)])
        traces.append(m.stats.tile_ops)
    return {reading: (simulate(traces[1], **kw).cycles - simulate(traces[0], **kw).cycles) / (trips[1] - trips[0])
            for reading, kw in READINGS.items()}


def model_rows():
    """One record per loop: what it isolates and the modelled cycles per trip in each reading."""
    return [{"loop": name, "isolates": what, **{r: round(c, 1) for r, c in model_cycles(name).items()}}
            for name, (what, _, _) in LOOPS.items()]


def measure(rounds=9, seconds=0.002, loops=None):
    """{loop: host cycles per trip}: each loop timed in ``rounds`` interleaved rounds (median), in
    cycles of the ``tdp`` loop's clock (16 per tdp). ``loops``: {name: call(trips)}, by default
    the loops' native code (AMX hosts only)."""
    from tppasm.timing import calibrate
    if loops is None:
        ops = operands()
        loops = {name: (lambda trips, fn=build(name), ptr=ops.ctypes.data: fn(trips, ptr)) for name in LOOPS}
    trips = {}
    for name, call in loops.items():
        call(64)
        trips[name] = 64 * calibrate(lambda call=call: call(64), seconds)
    per_trip = {name: [] for name in loops}
    for _ in range(rounds):
        for name, call in loops.items():
            t = time.perf_counter()
            call(trips[name])
            per_trip[name].append((time.perf_counter() - t) / trips[name])
    med = {name: float(np.median(v)) for name, v in per_trip.items()}
    clock = TDP_CYCLES * len(LOOPS["tdp"][1]) / med["tdp"]
    return {name: t * clock for name, t in med.items()}


def misfit(measured, modelled):
    """{reading: mean |ln(model / measured)|} over the loops other than ``tdp`` (the clock), from
    ``measured`` {loop: cycles} and ``modelled`` {loop: {reading: cycles}}; the smallest fits.

    >>> misfit({"tdp": 384, "reload": 64}, {"tdp": {"ooo": 384, "renamed": 384}, "reload": {"ooo": 128, "renamed": 64}})
    {'ooo': 0.693, 'renamed': 0.0}
    """
    loops = [n for n in measured if n != "tdp"]
    readings = [r for r in READINGS if r in modelled[loops[0]]]
    return {r: round(sum(abs(math.log(modelled[n][r] / measured[n])) for n in loops) / len(loops), 3)
            for r in readings}


def host_figures(measured, reading):
    """The model's :class:`bench.amx_model.Figures` as ``measured`` {loop: cycles per trip}
    implies them: tdp latency ``chain`` / 4, a tile load's row cycles ``load`` / 8 / 16, L2 bytes
    per cycle 8 KiB / ``load_l2``, a tile store ``store`` / 4, ``ldtilecfg`` ``config``; and where
    ``reading`` (the one that fits) does not rename tiles, the load-to-use latency ``reload`` / 4
    - 16 (each reload waits for its tdp's 16 cycles, then for the load), L2 and L3 latencies
    shifted by as much. Where tiles are renamed the reloads hide the latency: the model's stays.

    >>> f = host_figures({"chain": 160.0, "load": 64.0, "load_l2": 128.0, "store": 64.0, "config": 100.0,
    ...                   "reload": 200.0}, "ooo")
    >>> f.tdp_latency, f.l2_bw, f.ldtilecfg, f.load_latency[1:]
    (40.0, 64.0, 100.0, (34.0, 45.0, 134.0))
    """
    lat = FIGURES.load_latency
    if reading != "renamed":
        shift = measured["reload"] / 4 - FIGURES.tdp_cycles - lat[1]
        lat = (None,) + tuple(x + shift for x in lat[1:])
    return replace(FIGURES, tdp_latency=measured["chain"] / 4, load_row_cycles=measured["load"] / 8 / 16,
                   l2_bw=8 * BLOCK / measured["load_l2"], store_cycles=measured["store"] / 4,
                   ldtilecfg=measured["config"], load_latency=lat)


def differences(figures, tolerance=0.02):
    """``name host (model)`` for each of ``figures``' timings more than ``tolerance`` (relative)
    from the model's own.

    >>> differences(replace(FIGURES, tdp_latency=40.0, l2_bw=48.5, load_latency=(None, 30, 41, 130)))
    ['tdp_latency 40 (52)', 'load_latency 30/41/130 (45/56/145)']
    """
    def far(a, b):
        if isinstance(a, tuple):
            return any(far(x, y) for x, y in zip(a, b) if x is not None)
        return abs(a - b) > tolerance * abs(b)

    def text(v):              # load_latency: L1/L2/L3
        return "/".join(text(x) for x in v if x is not None) if isinstance(v, tuple) else f"{round(v, 2):g}"
    return [f"{k} {text(v)} ({text(getattr(FIGURES, k))})" for k, v in vars(figures).items()
            if far(v, getattr(FIGURES, k))]


def goal_kernel(*figures):
    """For each of ``figures``: {"default" / "chunks": {reading: MODELLED % of the AMX peak}} of
    the AMX BRGEMM at issue #12's goal shape (:data:`tppasm.x86.amx_probe.PROBE`, fp32 C), without
    and with batch chunks. Each kernel is interpreted once and modelled under every ``figures``."""
    from tppasm.brgemm import Brgemm
    from tppasm.x86.amx import plan
    from tppasm.x86.amx_chunk import chunk_blocks
    from tppasm.x86.amx_probe import PROBE
    from .amx_static import model, run_case
    m, n, k, count, dtype = (PROBE[key] for key in ("m", "n", "k", "count", "dtype"))
    desc = Brgemm(m=m, n=n, k=k, dtype=dtype)
    out = [{} for _ in figures]
    for name, chunk in (("default", 0), ("chunks", chunk_blocks(desc, plan(desc)))):
        stats, _, _ = run_case(m, n, k, count, dtype, 0, "f32", chunk=chunk)
        for got, fig in zip(out, figures):
            got[name] = model(stats, dtype, m, n, k, count, fig)[0]
    return out


def run(rounds=9, figures_path=None):
    """Print the table: per loop, modelled cycles per trip in each reading and, on AMX hosts, this
    host's; then each reading's misfit, and (``figures_path``) write the host's figures and the
    reading that fits for ``amx-static --figures``. Returns (the :class:`Report`, misfit or None)."""
    from isa.cpu import host, identity
    native = "amx" in host().levels
    rows = model_rows()
    measured = measure(rounds) if native else None
    rep = Report("AMX loops: cycles per trip in the model's three readings (MODELLED) and on this host "
                 "(measured, in cycles of the tdp loop: 16 a tdp)",
                 ["loop", "isolates", *READINGS, "this host" if native else "this host (no AMX: not measured)"])
    for r in rows:
        rep.add(r["loop"], r["isolates"], *(r[k] for k in READINGS),
                round(measured[r["loop"]], 1) if native else "-")
    fit = None
    if native:
        fit = misfit(measured, {r["loop"]: r for r in rows})
        best = min(fit, key=fit.get)
        print("\nmisfit, mean |ln(model / measured)| over the loops but tdp: "
              + ", ".join(f"{k} {v}" for k, v in fit.items()) + f"; the reading that fits: {best}")
        figures = host_figures(measured, best)
        print("this host's figures, where they differ from the model's (in brackets): "
              + (", ".join(differences(figures)) or "none"))
        if figures_path:
            save_figures(figures_path, figures, best, identity())
            print(f"wrote {figures_path}: python -m bench amx-static --figures {figures_path} models every "
                  "kernel with them")
        mine, its = goal_kernel(figures, FIGURES)
        for name in mine:
            print(f"the AMX BRGEMM of issue #12's goal, {name}: MODELLED % of the AMX peak with this host's "
                  "figures (the model's) "
                  + ", ".join(f"{r} {mine[name][r]:.1f} ({its[name][r]:.1f})" for r in mine[name]))
    else:
        print("\nno AMX on this host: the model's columns only. On an AMX host the last column is measured "
              "and a misfit line says which reading fits.")
    return rep, fit


def parse(argv=None):
    """The options of ``python -m bench amx-micro``, checked (a bad one: argparse's error); no work done."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m bench amx-micro", description=summary(__doc__))
    p.add_argument("--rounds", type=count("rounds", "--rounds 9"), default=9,
                   help="interleaved timing rounds per loop (AMX hosts)")
    json_option(p)
    p.add_argument("--figures", metavar="FILE", type=writable_file("--figures figures.json"),
                   help="AMX hosts: write the timings the loops imply, and the reading that fits, for "
                        "python -m bench amx-static --figures FILE")
    args = p.parse_args(argv)
    if args.figures:
        from isa.cpu import host
        if "amx" not in host().levels:
            p.error(f"--figures {args.figures}: this host has no AMX, so no loop is timed and there are no "
                    "figures to write; run it on an AMX host (bench/device_check.sh does where a lent machine has AMX)")
    return args


def main(argv=None):
    args = parse(argv)
    rep, fit = run(args.rounds, args.figures)
    if args.json:
        write_json(args.json, [rep, [{"table": "misfit", **fit}] if fit else []])


if __name__ == "__main__":
    main()
