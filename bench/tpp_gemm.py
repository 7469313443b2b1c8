"""BRGEMM benchmark (the GEMM part of ``python -m bench tpp``): tppasm vs numpy (and torch), % of peak.

``python -m bench.tpp_gemm [--json FILE] [--quick] [--shapes dtype:size:count,...]`` prints
GFLOP/s (GOP/s for int8; median of 5 runs, repetitions calibrated to ~0.2 s each), the speed ratios
to numpy computing the same batch as one matmul and to torch (medians of interleaved rounds), the percentage of the peak of the unit the kernel
uses (``FMA``, ``BF16-dot``, ``VNNI``, ``madd``, ``AMX``: see :mod:`bench.peaks`), the per-call
time of a 32x32x32 GEMM from Python and the JIT time of each kernel. Every peak is a JIT'd loop of
independent accumulators on that unit, so no clock frequency is assumed.
"""
import argparse
import contextlib
import json
import sys
import time

import numpy as np

import tppasm
from tppasm.timing import calibrate, time_runs
from isa.cpu import host

from . import peaks
from .common import over_peak_mark
from .interleave import interleaved as interleaved_rounds
from .options import MAX_ROWS, MAX_SIDE, checked, items, json_option, once, summary, whole
from .peaks import interleaved_ratios, ratio_stats  # noqa: F401  (bench.gemm uses them from here)


def timings(fn, min_time=0.2, runs=5):
    """(median, best) per-call seconds of ``fn`` over ``runs`` runs, repetitions calibrated to
    ~``min_time``/``runs`` each. The best run is the figure least disturbed by other processes."""
    samples = time_runs(fn, calibrate(fn, min_time / runs), runs)
    return float(np.median(samples)), min(samples)


def median_seconds(fn, min_time=0.2, runs=5):
    """Median per-call seconds of ``fn`` (see :func:`timings`)."""
    return timings(fn, min_time, runs)[0]


LOOPS = {}      # "fma_peak" or (dtype, unit) -> (call, work per call) of a peak loop (bench.peaks)


def fma_peak():
    """(median, best) GFLOP/s of the fp32 FMA loop (:mod:`bench.peaks`); its loop is ``LOOPS["fma_peak"]``."""
    LOOPS["fma_peak"] = peaks.peak_loop("f32", "FMA")
    return peaks.peak_stats("f32", "FMA")


def unit_peak(dtype, unit):
    """(median, best) of ``dtype``'s peak on ``unit``; its loop is ``LOOPS[(dtype, unit)]``."""
    LOOPS[dtype, unit] = peaks.peak_loop(dtype, unit)
    return peaks.peak_stats(dtype, unit)


def _rand(rng, shape, dtype):
    """Random operand, cache-line aligned (:func:`tppasm.empty`), as a kernel library's user allocates."""
    if dtype == "i8":
        x = rng.integers(-128, 128, shape, dtype=np.int8)
    elif dtype == "u8":
        x = rng.integers(0, 256, shape, dtype=np.uint8)
    else:
        x = rng.standard_normal(shape, dtype=np.float32).astype(tppasm.dtypes.dtype(dtype))
    return tppasm.aligned(x)


def bench_brgemm(size, count, dtype, rng, torch=None, loop=None):
    """One record: tppasm BRGEMM vs numpy's one-matmul equivalent (fp32 operands for bf16/int8);
    with ``loop`` (a peak loop of :data:`LOOPS`) also its interleaved fraction of that peak, and
    numpy's of the fp32 FMA peak."""
    m = n = k = size
    tppasm.brgemm(m=1, n=1, k=4, dtype=dtype)          # warm the assembler's tables
    t = time.process_time()
    gemm = tppasm.brgemm(m=m, n=n, k=k, dtype=dtype)
    jit_ms = (time.process_time() - t) * 1e3
    a_dt = {"f32": "f32", "bf16": "bf16", "i8": "u8"}[dtype]
    A = _rand(rng, (count, m, k), a_dt)
    Bp = _rand(rng, (count, k, n), {"f32": "f32", "bf16": "bf16", "i8": "i8"}[dtype])
    B = Bp if dtype == "f32" else tppasm.vnni_pack(Bp, gemm.desc.vnni)
    C = tppasm.empty((m, n), gemm.desc.c_dtype)
    flops = 2.0 * m * n * k * count
    ours, ours_best = timings(lambda: gemm(A, B, C, count=count))
    interleaved = None if loop is None else peaks.ratio_stats(
        peaks.interleaved_ratios(lambda: gemm(A, B, C, count=count), flops, loop))
    # numpy: the same sum as one (m, count*k) @ (count*k, n) matmul, in fp32 (its fastest type)
    A2 = np.ascontiguousarray(A.astype(np.float32).transpose(1, 0, 2).reshape(m, count * k))
    B2 = np.ascontiguousarray(Bp.astype(np.float32).reshape(count * k, n))
    C2 = np.empty((m, n), np.float32)
    theirs = median_seconds(lambda: np.matmul(A2, B2, out=C2))
    rec = {"what": f"brgemm {dtype}", "m": m, "n": n, "k": k, "count": count, "jit_ms": jit_ms,
           "gflops": flops / ours / 1e9, "best_gflops": flops / ours_best / 1e9,
           "numpy_gflops": flops / theirs / 1e9}
    if interleaved is not None:         # numpy gets the same treatment against the fp32 peak
        np_stats = peaks.ratio_stats(peaks.interleaved_ratios(lambda: np.matmul(A2, B2, out=C2), flops,
                                                              LOOPS["f32", "FMA"]))
        rec["pct_peak_interleaved"], rec["pct_peak_interleaved_q90"] = (100 * x for x in interleaved)
        rec["numpy_pct_fp32_peak_interleaved"], rec["numpy_pct_fp32_peak_interleaved_q90"] = (100 * x for x in np_stats)
    peers = {"numpy": lambda: np.matmul(A2, B2, out=C2)}
    if torch is not None:
        ta, tb = torch.from_numpy(A2), torch.from_numpy(B2)
        peers["torch"] = lambda: torch.matmul(ta, tb)
        rec["torch_gflops"] = flops / median_seconds(peers["torch"]) / 1e9
        if dtype == "bf16":
            a3 = torch.from_numpy(A.astype(np.float32)).to(torch.bfloat16)
            b3 = torch.from_numpy(Bp.astype(np.float32)).to(torch.bfloat16)
            peers["torch"] = lambda: torch.bmm(a3, b3).sum(0)
            rec["torch_bf16_bmm_gflops"] = flops / median_seconds(peers["torch"]) / 1e9
    # speed ratios (> 1: ours faster) as medians of per-round ratios, rounds alternating ours and the peers'
    rounds = interleaved_rounds([lambda: gemm(A, B, C, count=count), *peers.values()], 9, min_run=0.02, clock="cpu",
                         settle=0)
    for name, theirs_s in zip(peers, rounds[1:]):
        rec[f"{name}_ratio_interleaved"] = float(np.median(theirs_s / rounds[0]))
    return rec


def bench_call_overhead(rng):
    """A single 32x32x32 fp32 GEMM called from Python: microseconds per call, tppasm vs numpy."""
    gemm = tppasm.brgemm(m=32, n=32, k=32)
    A, B = _rand(rng, (1, 32, 32), "f32"), _rand(rng, (1, 32, 32), "f32")
    C = tppasm.empty((32, 32))
    ours, ours_best = timings(lambda: gemm(A, B, C))
    a2, b2 = A[0], B[0]
    theirs, theirs_best = timings(lambda: np.matmul(a2, b2, out=C))
    return {"what": "gemm 32x32x32 call", "us": ours * 1e6, "numpy_us": theirs * 1e6,
            "best_us": ours_best * 1e6, "numpy_best_us": theirs_best * 1e6}


SHAPES = [(32, 16, "f32"), (48, 16, "f32"), (64, 16, "f32"), (80, 16, "f32"),
          (32, 16, "bf16"), (64, 16, "bf16"), (80, 16, "bf16"), (64, 16, "i8"), (128, 16, "i8")]


DTYPES = ("f32", "bf16", "i8")


def _shape(item):
    """'bf16:64:16' -> (64, 16, 'bf16'); ValueError for anything else."""
    dtype, size, count = item.split(":")
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}")
    return whole(size, limit=MAX_SIDE), whole(count, limit=MAX_ROWS), dtype


_shapes = checked(lambda text: once([_shape(s) for s in items(text)]),
                  f"dtype:size:count triples (dtype out of {', '.join(DTYPES)}; positive size and count), comma "
                  "separated, each once", "--shapes bf16:64:16,i8:64:16")


def add_options(parser):
    """The options of ``python -m bench tpp`` (its modules take the same): --json, --quick, --shapes."""
    json_option(parser)
    parser.add_argument("--quick", action="store_true", help="fp32 64^3 x 16 and the call overhead only; a smaller "
                        "DRAM sweep of the element-wise TPPs")
    parser.add_argument("--shapes", type=_shapes, help="BRGEMMs dtype:size:count,... (e.g. bf16:64:16,i8:64:16) "
                        "instead of the default set (bench.tpp_gemm only)")


def parse(argv=None):
    """The options of ``python -m bench.tpp_gemm``, checked (a bad one: argparse's error); no work done."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m bench tpp (its GEMM part, bench.tpp_gemm)",
                                description=summary(__doc__))
    add_options(p)
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        torch = None
    with _one_blas_thread():            # one core each: tppasm kernels are single-threaded
        return _run(args, torch)


def _one_blas_thread():
    """numpy's BLAS limited to one thread for the duration (no-op without threadpoolctl)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1)


def _run(args, torch):
    rng = np.random.default_rng(0)
    isa = host().isa
    records = []
    print(f"host {isa}; each dtype's peak per core, measured by a JIT'd loop on each unit (median / best):")
    for dtype in ("f32", "bf16", "i8"):
        for unit in peaks.units(dtype):
            med, best = unit_peak(dtype, unit)
            used = unit == peaks.kernel_unit(dtype)
            records.append({"what": "peak", "dtype": dtype, "unit": unit, "gflops": med, "best_gflops": best,
                            "brgemm_unit": used})
            print(f"  {dtype:<5}{unit:<9}{med:8.1f} / {best:6.1f} G{'OP' if dtype == 'i8' else 'FLOP'}/s"
                  f"{'   <- the BRGEMM uses it' if used else ''}")
    print("%peak: of the kernel's unit, median vs median and best vs best; %pk il / q90: median / 90th "
          "percentile of 31 kernel/peak ratios timed back to back on the thread's CPU time (time other "
          "processes took is left out; q90: the better rounds, the core's SMT sibling idle; '!' after a "
          "figure over 100%: a disturbed round, not a kernel faster than the peak); np q90: numpy's fp32 "
          "matmul the same way, vs the FMA peak; x np / x torch: their time over ours (> 1: ours faster), the "
          "median of 9 interleaved rounds on the thread's CPU time; torch: torch.matmul's GFLOP/s in fp32 (bf16 "
          "rows: torch.bmm in bf16). int8 figures are GOP/s.")
    shapes = args.shapes or ([(64, 16, "f32")] if args.quick else SHAPES)      # (--shapes wins over --quick)
    print(f"{'kernel':<12}{'unit':>9}{'m=n=k':>6}{'count':>6}{'GFLOP/s':>9}{'%peak':>7}{'best':>7}{'%best':>7}"
          f"{'%pk il':>7}{'q90':>6}{'numpy':>8}{'np q90':>7}{'x np':>7}{'torch':>8}{'x torch':>8}"
          f"{'JIT ms':>8}")  # JIT: CPU ms
    for size, count, dtype in shapes:
        unit = peaks.kernel_unit(dtype)
        # the peak is re-measured next to each kernel: the load from other processes drifts
        ref, ref_best = unit_peak(dtype, unit)
        unit_peak("f32", "FMA")
        rec = bench_brgemm(size, count, dtype, rng, torch, LOOPS[dtype, unit])
        rec["unit"] = unit
        rec["table"], rec["x"] = "BRGEMM, one core (int8: GOP/s)", f"{dtype} {size}^3 x{count}"    # what --plot draws
        rec["peak_gflops"], rec["best_peak_gflops"] = ref, ref_best
        rec["pct_peak"] = 100 * rec["gflops"] / ref
        rec["best_pct_peak"] = 100 * rec["best_gflops"] / ref_best
        records.append(rec)
        tt = rec.get("torch_bf16_bmm_gflops", rec.get("torch_gflops"))
        print(f"{rec['what']:<12}{unit:>9}{size:>6}{count:>6}{rec['gflops']:>9.1f}{percent_cell(rec['pct_peak'], 7)}"
              f"{rec['best_gflops']:>7.1f}{percent_cell(rec['best_pct_peak'], 7)}"
              f"{percent_cell(rec['pct_peak_interleaved'], 7)}"
              f"{percent_cell(rec['pct_peak_interleaved_q90'], 6)}{rec['numpy_gflops']:>8.1f}"
              f"{percent_cell(rec['numpy_pct_fp32_peak_interleaved_q90'], 7)}"
              f"{rec['numpy_ratio_interleaved']:>6.2f}x{(f'{tt:.1f}' if tt else '-'):>8}"
              f"{(f'{x:.2f}x' if (x := rec.get('torch_ratio_interleaved')) else '-'):>8}{rec['jit_ms']:>8.2f}")
    call = bench_call_overhead(rng)
    records.append(call)
    print(f"32x32x32 GEMM from Python: {call['us']:.2f} us/call median, {call['best_us']:.2f} best "
          f"(numpy {call['numpy_us']:.2f} / {call['numpy_best_us']:.2f} us: {call['numpy_us'] / call['us']:.2f}x)")
    jit = jit_times()
    records.append(jit)
    print(f"JIT per BRGEMM ({jit['n']} fresh descriptors, 3 dtypes, warm process): CPU time median "
          f"{jit['median_ms']:.2f} ms, max {jit['max_ms']:.2f} ms; wall max {jit['wall_max_ms']:.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0


def percent_cell(percent, width):
    """``percent`` as a right-aligned cell of ``width`` characters, ``"!"`` after a figure over 100
    (:func:`bench.common.over_peak_mark`: a disturbed round, not a kernel beyond the peak).

    >>> percent_cell(95.2, 6), percent_cell(163.0, 6)
    ('   95%', ' 163%!')
    """
    mark = over_peak_mark(percent)
    return f"{percent:>{width - 1 - len(mark)}.0f}%{mark}"


def jit_times():
    """JIT time of fresh BRGEMM descriptors of every dtype (the generator and encoder, warm)."""
    from tppasm.brgemm import Brgemm
    from tppasm.dtypes import dtype as np_dtype
    from tppasm.kernel import Kernel
    np_dtype("bf16")                 # ml_dtypes loads on first bf16 use: not a JIT cost
    times, walls = [], []
    for dtype in ("f32", "bf16", "i8"):
        for size in (16, 32, 64, 80):
            desc = Brgemm(m=size + 1, n=size, k=size, dtype=dtype, ldc=size + 3)
            t, w = time.process_time(), time.perf_counter()
            Kernel(desc, host().isa)
            times.append((time.process_time() - t) * 1e3)
            walls.append((time.perf_counter() - w) * 1e3)
    return {"what": "jit", "n": len(times), "median_ms": float(np.median(times)), "max_ms": max(times),
            "wall_max_ms": max(walls)}


if __name__ == "__main__":
    sys.exit(main())
