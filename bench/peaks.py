"""Each dtype's peak on this core, measured: JIT'd loops of independent accumulators on the best
unit the host has for it, so no clock frequency or port count is assumed.

Units (the instruction whose loop defines the peak; work in GFLOP/s, GOP/s for int8):

| unit | instruction | dtypes | work per instruction |
|---|---|---|---|
| ``FMA`` | ``vfmadd231ps`` (zmm on AVX-512, ymm on AVX2) | f32; bf16 without BF16 dots (converted to fp32) | 2 x lanes |
| ``BF16-dot`` | ``vdpbf16ps`` zmm (AVX512-BF16) | bf16 | 4 x lanes |
| ``VNNI`` | ``vpdpbusd`` (zmm with AVX512-VNNI, ymm with AVX-VNNI) | i8 | 8 x lanes |
| ``u7`` | ``vpmaddubsw`` + ``vpmaddwd`` (ones) + ``vpaddd`` | i8 with A <= 127 (``a_bits=7``) | 8 x lanes |
| ``madd`` | ``vpmaddwd`` + ``vpaddd`` (int16 pairs) | i8 without VNNI | 4 x lanes per pair |
| ``AMX`` | ``tdpbf16ps`` / ``tdpbusd`` on 16 x 64-byte tiles | bf16 / i8 | 16 x 16 x 32 x 2 / 16 x 16 x 64 x 2 |

The API the GEMM benches use (stable)::

    units(dtype)             # the units this host has for dtype, best first
    best_unit(dtype)         # units(dtype)[0]
    kernel_unit(dtype, isa)  # the unit tppasm's BRGEMM uses for dtype on isa (host's ISA by default)
    peak_unit(dtype, isa)    # what a record's peak_unit says: that unit and its loop's instruction at isa's width
    peak(dtype, unit=None)   # median GFLOP/s (int8: GOP/s) per core of the unit's loop (best unit by default)
    peak_stats(dtype, unit)  # (median, best) of the same runs
    peak_loop(dtype, unit)   # (call, work per call): the loop itself, for interleaved_ratios
    peak_loop_on(threads, dtype, unit)   # the same on that many threads at once, work summed
    interleaved_ratios(fn, work, loop), ratio_stats(ratios)   # a kernel's fraction of a peak, back to back
    peak_legend(dtypes)      # a table's header: which peak its dtypes' % of peak are of

>>> best_unit("f32")
'FMA'
>>> kernel_unit("bf16", "avx2"), kernel_unit("i8", "amx")
('FMA', 'AMX')
>>> peak("f32") > 0
True
"""
import argparse
import functools
import time

import numpy as np

from bench.options import summary
from isa.cpu import host
from tppasm.timing import calibrate, time_runs

# Independent vector chains, at least latency x issue width on every x86 part: Zen 5 issues two
# vdpbf16ps a cycle at about 6 cycles' latency, so 12 chains read 9% under its kernels' speed.
ACCUMULATORS = 24
AMX_ACCUMULATORS = 6            # tiles 0..5 accumulate, 6 and 7 are the operands
ITERS = 1 << 13                 # loop trips per call (4 copies of the accumulators each)
AMX_ITERS = 1 << 9
UNITS = ("FMA", "BF16-dot", "VNNI", "u7", "madd", "AMX")


def _features(isa):
    from tppasm.x86.brgemm import target_features
    return target_features(isa)


def units(dtype, isa=None):
    """The units this host (running ``isa``, the host's level by default) has for ``dtype``, best first.

    >>> units("f32")
    ('FMA',)
    """
    if dtype not in ("f32", "bf16", "i8"):
        raise ValueError(f"peaks: dtype={dtype!r}; expected 'f32', 'bf16' or 'i8'")
    isa = isa or host().isa
    f = _features(isa)
    wide = isa in ("avx512", "amx")
    out = []
    if isa == "amx" and dtype in ("bf16", "i8"):
        out.append("AMX")
    if dtype == "bf16" and wide and "avx512_bf16" in f:
        out.append("BF16-dot")
    if dtype == "i8" and ("avx512_vnni" if wide else "avx_vnni") in f:
        out.append("VNNI")
    out.extend(("u7", "madd") if dtype == "i8" else ("FMA",))
    return tuple(out)


def best_unit(dtype, isa=None):
    """The unit of ``dtype``'s peak on this host: its fastest instruction for that dtype."""
    return units(dtype, isa)[0]


def kernel_unit(dtype, isa=None, signs="us", a_bits=8):
    """The unit tppasm's BRGEMM uses for ``dtype`` on ``isa`` (what its % of peak is taken against),
    for int8 with ``signs`` and A's ``a_bits``.

    >>> kernel_unit("i8", "avx2", a_bits=7) in ("u7", "VNNI"), kernel_unit("i8", "avx2", "ss")
    (True, 'madd')
    """
    from tppasm.x86.dot import Bf16Dp, I8Maddubs, I8Vnni, choose_dot
    isa = isa or host().isa
    if isa == "amx" and dtype in ("bf16", "i8"):
        return "AMX"
    dot = choose_dot(dtype, "avx512" if isa == "amx" else isa, _features(isa), signs, a_bits)
    names = {Bf16Dp: "BF16-dot", I8Vnni: "VNNI", I8Maddubs: "u7"}
    return names.get(type(dot), "madd" if dtype == "i8" else "FMA")


INSTRUCTIONS = {"FMA": "vfmadd231ps", "BF16-dot": "vdpbf16ps", "VNNI": "vpdpbusd", "u7": "vpmaddubsw+vpmaddwd",
                "madd": "vpmaddwd", "AMX": {"bf16": "tdpbf16ps", "i8": "tdpbusd"}}


def peak_unit(dtype, isa=None, unit=None):
    """What a record's ``peak_unit`` says: the unit whose loop ``dtype``'s % of peak is of on ``isa``
    (the host's level by default, ``TPPASM_ISA`` honoured), :func:`kernel_unit`'s unless ``unit`` names
    one (``"best"``: :func:`best_unit`'s, what :func:`peak_loop_on` runs without one), and the instruction
    of that loop at the level's width (zmm on AVX-512 and AMX hosts, ymm on AVX2).

    >>> peak_unit("f32", "avx2"), peak_unit("bf16", "amx"), peak_unit("i8", "avx512", unit="madd")
    ('FMA (vfmadd231ps ymm)', 'AMX (tdpbf16ps)', 'madd (vpmaddwd zmm)')
    >>> peak_unit("f32", unit="best").startswith("FMA")
    True
    """
    isa = isa or host().isa
    unit = best_unit(dtype) if unit == "best" else unit or kernel_unit(dtype, isa)
    if unit not in UNITS:
        raise ValueError(f"peaks: unit={unit!r}; expected one of {', '.join(UNITS)}")
    if unit == "AMX":
        return f"AMX ({INSTRUCTIONS['AMX']['bf16' if dtype == 'bf16' else 'i8']})"
    return f"{unit} ({INSTRUCTIONS[unit]} {'zmm' if isa in ('avx512', 'amx') else 'ymm'})"


def peak_legend(dtypes, units=None):
    """Which peak a table's % of peak is of, per dtype: "peaks: f32 of FMA (vfmadd231ps zmm), ...";
    ``units``: {dtype: unit} where not :func:`kernel_unit`'s, or ``"best"`` for every dtype (:func:`peak_unit`).

    >>> peak_legend(["f32", "i8"], {"i8": "madd"}).replace("ymm", "zmm")
    'peaks: f32 of FMA (vfmadd231ps zmm), i8 of madd (vpmaddwd zmm)'
    """
    unit_of = (lambda d: units) if isinstance(units, str) else (units or {}).get
    return "peaks: " + ", ".join(f"{d} of {peak_unit(d, unit=unit_of(d))}" for d in dtypes)


# -- the loops ------------------------------------------------------------------------------------

def _vector_loop(unit, isa, iters, params=("i64",)):
    """(JitFunction(iters, ...), work per trip) of ``unit``'s register-only loop at ``isa``'s width;
    ``params``: its signature (the trip count first; the rest unused)."""
    from isa.x86 import Function, rax, vec
    bits = 512 if isa in ("avx512", "amx") else 256
    nregs = 32 if bits == 512 else 16
    pairs = unit in ("madd", "u7")
    consts = [vec(bits, nregs - 3)] if unit == "u7" else []       # u7: vpmaddwd's ones
    acc = min(ACCUMULATORS, (nregs - 2 - len(consts)) // (2 if pairs else 1))
    regs = [vec(bits, i) for i in range(nregs)]
    accs, tmps, x, y = regs[:acc], regs[acc:2 * acc], regs[-2], regs[-1]
    lanes = bits // 32
    fn = Function(f"peak_{unit}_{bits}", list(params))
    a = fn.asm
    zero = a.vpxord if bits == 512 else a.vpxor
    for r in regs[:2 * acc if pairs else acc] + [x, y] + consts:
        zero(r, r, r)
    loop = a.label()
    a.mov(rax, fn.args[0])
    a.bind(loop)
    for _ in range(4):
        for i, r in enumerate(accs):
            if unit == "FMA":
                a.vfmadd231ps(r, x, y)
            elif unit == "BF16-dot":
                a.vdpbf16ps(r, x, y)
            elif unit == "VNNI":
                a.vpdpbusd(r, x, y)         # ymm: the VEX (AVX-VNNI) form
            elif unit == "u7":
                a.vpmaddubsw(tmps[i], x, y)
                a.vpmaddwd(tmps[i], tmps[i], consts[0])
                a.vpaddd(r, r, tmps[i])
            else:
                a.vpmaddwd(tmps[i], x, y)
                a.vpaddd(r, r, tmps[i])
    a.dec(rax)
    a.jnz(loop)
    per = {"FMA": 2, "BF16-dot": 4, "VNNI": 8, "u7": 8, "madd": 4}[unit] * lanes
    return fn.finalize(), 4 * acc * per


def configure_full_tiles(fn):
    """Emit into ``fn`` (an :class:`isa.x86.Function`) the configuration of all 8 tiles at 16
    rows x 64 bytes, written to 64 bytes of stack scratch at ``[rsp]``, and its ``ldtilecfg``."""
    from isa.x86 import dword, rsp
    from tppasm.x86.amx import tile_config
    cfg = tile_config({t: (16, 64) for t in range(8)})
    fn.stack(64)
    for off in range(0, 64, 4):
        v = int.from_bytes(cfg[off:off + 4], "little")
        fn.asm.mov(dword[rsp + off], v - (1 << 32) if v >= 1 << 31 else v)
    fn.asm.ldtilecfg([rsp])


def amx_loop(dtype, iters=None, params=("i64",)):
    """(JitFunction(iters), work per trip): independent ``tdp*`` into 6 accumulator tiles, no loads.

    Runs on AMX hosts; elsewhere in the interpreter (:mod:`isa.x86.interp`):

    >>> from isa.x86.interp import Machine
    >>> fn, work = amx_loop("bf16")
    >>> m = Machine(); _ = m.call(fn.code, args=[2]); m.stats.counts["tdpbf16ps"], work
    (48, 393216)
    """
    from isa.x86 import TMM, Function, rax
    fn = Function(f"peak_amx_{dtype}", list(params))
    a = fn.asm
    configure_full_tiles(fn)
    for t in range(8):
        a.tilezero(TMM[t])
    dot = a.tdpbf16ps if dtype == "bf16" else a.tdpbusd
    loop = a.label()
    a.mov(rax, fn.args[0])
    a.bind(loop)
    for _ in range(4):
        for t in range(AMX_ACCUMULATORS):
            dot(TMM[t], TMM[6], TMM[7])
    a.dec(rax)
    a.jnz(loop)
    a.tilerelease()
    per = 16 * 16 * (32 if dtype == "bf16" else 64) * 2
    return fn.finalize(), 4 * AMX_ACCUMULATORS * per


def _check_unit(dtype, unit):
    if unit not in UNITS:
        raise ValueError(f"peaks: unit={unit!r}; expected one of {', '.join(UNITS)}")
    have = units(dtype)
    if unit not in have:
        raise ValueError(f"peaks: this host has no {unit} unit for {dtype} (it has {', '.join(have)}); "
                         f"pass unit=None for the best one")


@functools.lru_cache(maxsize=None)
def _loop(dtype, unit, params=("i64",)):
    """(JitFunction(iters, ...), work per trip, trips per call) of the peak loop."""
    unit = unit or best_unit(dtype)
    _check_unit(dtype, unit)
    if unit == "AMX":
        fn, per = amx_loop(dtype, params=params)
        return fn, per, AMX_ITERS
    fn, per = _vector_loop(unit, host().isa, ITERS, params)
    return fn, per, ITERS


@functools.lru_cache(maxsize=None)
def peak_loop(dtype="f32", unit=None):
    """(call, work per call) of the peak loop of ``dtype`` on ``unit`` (best by default): a
    no-argument callable and the GFLOP (GOP) it does times 1e9."""
    fn, per, iters = _loop(dtype, unit)
    return (lambda: fn(iters)), per * iters


def peak_loop_on(threads, dtype="f32", unit=None):
    """(call, work per call) of the peak loop run on ``threads`` threads at once, its work summed:
    the peak of that many cores as they are at the moment it runs. A kernel on n threads compared
    with this loop timed beside it is compared with what n cores delivered then, not with n times
    one core's peak: on a shared VM a second vCPU at times delivers half a core or less, for
    every program alike (numpy's 2-thread GEMM too).

    The loop runs as a region of :mod:`isa.pool`'s pool, the one tppasm's kernels run on when
    it has ``threads`` threads: the same workers, waking and spinning as for a kernel's region.
    (A gang of Python threads beside the pool, interleaved with a 2-thread GEMM and torch, read
    0-12% below it, and our GEMM above 100% of it: its helper could wake on a vCPU where a pool
    worker still spun.) Each call runs ``LONG`` ordinary calls' trips on every thread, so a
    region's start and end cost well under 1%.

    >>> call, work = peak_loop_on(2); call(); work == 2 * LONG * peak_loop()[1]
    True
    """
    if threads == 1:
        return peak_loop(dtype, unit)
    from bench.common import pool_of
    fn, per, iters = _loop(dtype, unit, ("i64", "i64", "i64"))
    pool = pool_of(threads)
    address, trips = fn.address, iters * LONG
    return (lambda: pool.run(address, trips)), per * iters * LONG * threads


LONG = 64               # peak_loop_on: trips per thread per call, in ordinary peak_loop calls


def peak_stats(dtype="f32", unit=None, runs=9):
    """(median, best) GFLOP/s (int8: GOP/s) of ``runs`` timed runs of the peak loop, on the wall
    clock: a figure against a kernel timed on another clock (``--clock cpu``) times the loop beside
    it instead (:func:`peak_loop`, :func:`peak_loop_on`)."""
    call, work = peak_loop(dtype, unit)
    samples = time_runs(call, calibrate(call, 0.2 / runs), runs)
    return work / float(np.median(samples)) / 1e9, work / min(samples) / 1e9


def peak(dtype="f32", unit=None):
    """Median GFLOP/s (int8: GOP/s) per core of ``dtype``'s peak loop on ``unit`` (the best unit
    for ``dtype`` on this host when None)."""
    return peak_stats(dtype, unit)[0]


# -- a kernel's fraction of a peak ------------------------------------------------------------------

def interleaved_ratios(fn, work, loop, rounds=31, seconds=0.01):
    """Per-round ratios of ``fn``'s rate to the peak ``loop``'s rate (``loop`` as from
    :func:`peak_loop`), the two timed back to back in every round, so the host's drift (the clock,
    other machines on it) cancels in each ratio. Both turns are timed on the calling thread's CPU
    time (``time.thread_time``; ``fn`` runs on the calling thread, as a 1-thread kernel does): on
    the wall clock a turn of the peak loop that another process preempted made the round's ratio
    read far above 1 (163-433% on a shared core), though no kernel outruns its unit's loop.

    On a shared VM the ratios are still bimodal, switching every few seconds: a kernel whose data is
    in L1 runs at 0.97-1.00 of the FMA loop for a while, then at 0.80-0.87 (presumably another tenant
    on the core's SMT sibling, competing for loads and the front end, which the register-only loop
    hardly uses; CPU time does not leave that out). :func:`ratio_stats` reports the median and the
    90th percentile, the latter being the figure when the sibling leaves the core alone.

    >>> r = interleaved_ratios(lambda: sum(range(300)), 1, (lambda: sum(range(300)), 1), rounds=3, seconds=0.001)
    >>> len(r), all(x > 0 for x in r)
    (3, True)
    """
    ref, ref_work = loop
    reps, ref_reps = calibrate(fn, seconds), calibrate(ref, seconds)
    ratios = []
    for _ in range(rounds):
        ours = _turn(fn, reps)
        peak_s = _turn(ref, ref_reps)
        ratios.append((work / ours) / (ref_work / peak_s))
    return ratios


def _turn(fn, reps):
    """CPU seconds of the calling thread per call of ``fn`` over ``reps`` calls."""
    t = time.thread_time()
    for _ in range(reps):
        fn()
    return max(time.thread_time() - t, 1e-9) / reps


def ratio_stats(ratios):
    """(median, 90th percentile) of :func:`interleaved_ratios`: the typical fraction of the peak, and
    the fraction in the kernel's better rounds (the core's SMT sibling idle). Above 1 is no kernel
    beating the loop but a disturbed round (noise of the CPU clock, a slowed peak turn): printed
    tables mark such a figure with :func:`bench.common.over_peak_mark`.

    >>> ratio_stats([0.8, 0.82, 0.85, 0.97, 0.99])
    (0.85, 0.982)
    """
    return round(float(np.median(ratios)), 6), round(float(np.percentile(ratios, 90)), 6)


def main(argv=None):
    """Print every unit's peak for every dtype on this host (no options: argparse refuses any)."""
    argparse.ArgumentParser(allow_abbrev=False,
                            prog="python -m bench.peaks", description=summary(__doc__)).parse_args(argv)
    print(f"host {host().isa}: peak per core of each dtype's units (median / best of 9 runs)")
    for dtype in ("f32", "bf16", "i8"):
        for unit in units(dtype):
            med, best = peak_stats(dtype, unit)
            mark = " (tppasm's BRGEMM)" if unit == kernel_unit(dtype) else ""
            print(f"  {dtype:<5}{unit:<9}{med:9.1f} / {best:7.1f} G{'OP' if dtype == 'i8' else 'FLOP'}/s{mark}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
