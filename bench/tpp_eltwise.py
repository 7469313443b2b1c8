"""Element-wise TPPs vs numpy and torch (one thread): GB/s per core, STREAM byte counting (every
array read or written once), fused bias + gelu vs numpy's two steps, JIT time of every TPP.

``python -m bench.tpp_eltwise [--json FILE] [--quick]``; ``main(argv)`` is the entry point.
One kernel call covers the whole (rows x cols) array. Medians of 5 auto-calibrated runs, the
contenders interleaved round by round; ratios are medians of per-round ratios.
"""
import argparse
import math
import time

import numpy as np

import tppasm
from tppasm.eltwise import (BINARY_OPS, GRAD_OPS, REDUCE_OPS, TRANSFORMS, UNARY_OPS, Binary, Reduce,
                            Ternary, Transform, Unary)
from tppasm.kernel import Kernel

from .common import Report, calibrate, write_json
from .options import summary
from .tpp_gemm import add_options

K0, K1 = math.sqrt(2 / math.pi), 0.044715


def _torch():
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    return torch


def compare(nbytes, fns, runs=5):
    """GB/s of each of ``fns`` (None: skipped), timed in interleaved rounds so that a noisy shared
    host slows all of them alike; returns (median GB/s per fn, median per-round ratio of the first
    to each other)."""
    live = [f for f in fns if f is not None]
    reps = [calibrate(f) for f in live]
    rounds = []
    for _ in range(runs):
        row = []
        for f, r in zip(live, reps):
            t = time.perf_counter()
            for _ in range(r):
                f()
            row.append(nbytes * r / (time.perf_counter() - t) / 1e9)
        rounds.append(row)
    rounds = np.array(rounds)
    gbs = list(np.median(rounds, axis=0))
    ratios = [float(np.median(rounds[:, 0] / rounds[:, j])) for j in range(len(live))]
    it_g, it_r = iter(gbs), iter(ratios)
    return ([next(it_g) if f is not None else float("nan") for f in fns],
            [next(it_r) if f is not None else float("nan") for f in fns])


def bandwidth(report, rows, cols, label, torch, runs):
    # every contender works on the same cache-line-aligned arrays
    x = tppasm.aligned(np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32))
    y = tppasm.aligned(np.random.default_rng(1).standard_normal((rows, cols), dtype=np.float32))
    out = tppasm.empty(x.shape)
    nb = x.nbytes
    t = torch and (torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(out))
    cases = {
        "relu": (2 * nb, lambda k=tppasm.relu(rows, cols): k(x, out), lambda: np.maximum(x, 0, out=out),
                 t and (lambda: torch.clamp(t[0], min=0, out=t[2]))),
        "add": (3 * nb, lambda k=tppasm.binary("add", rows, cols): k(x, y, out), lambda: np.add(x, y, out=out),
                t and (lambda: torch.add(t[0], t[1], out=t[2]))),
        "copy": (2 * nb, lambda k=tppasm.copy(rows, cols): k(x, out), lambda: np.copyto(out, x),
                 t and (lambda: t[2].copy_(t[0]))),
    }
    for name, (nbytes, ours, numpy_fn, torch_fn) in cases.items():
        (g, gn, gt), (_, rn, rt) = compare(nbytes, [ours, numpy_fn, torch_fn], runs)
        report.add(f"{name} {label}", g, gn, gt, rn, rt)


def fused_gelu(report, rows, cols, torch, runs):
    x = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
    bias = np.random.default_rng(1).standard_normal(cols, dtype=np.float32)
    x, out = tppasm.aligned(x), tppasm.empty(x.shape)
    k = tppasm.binary("add", rows, cols, bcast_b="row", post="gelu")

    def numpy_two_step():
        t = x + bias
        np.multiply(0.5 * t, 1 + np.tanh(K0 * (t + K1 * t * t * t)), out=out)

    nbytes = 2 * x.nbytes + bias.nbytes
    if torch:
        tx, tb = torch.from_numpy(x), torch.from_numpy(bias)

        def torch_fn():
            torch.nn.functional.gelu(tx + tb, approximate="tanh")
    else:
        torch_fn = None
    (g, gn, gt), (_, rn, rt) = compare(nbytes, [lambda: k(x, bias, out), numpy_two_step, torch_fn], runs)
    report.add(f"bias+gelu {rows}x{cols}", g, gn, gt, rn, rt)


def transpose(report, n, torch, runs):
    x = tppasm.aligned(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32))
    out = tppasm.empty(x.shape)
    k = tppasm.transform("transpose", n, n)
    if torch:
        tx, to = torch.from_numpy(x), torch.from_numpy(out)

        def torch_fn():
            to.copy_(tx.t())
    else:
        torch_fn = None
    (g, gn, gt), (_, rn, rt) = compare(2 * x.nbytes, [lambda: k(x, out), lambda: np.copyto(out, x.T),
                                                      torch_fn], runs)
    report.add(f"transpose {n}x{n}", g, gn, gt, rn, rt)


def jit_label(d):
    """The JIT table's row label of TPP descriptor ``d``: its kind and op, and what sets it apart
    from another of the same op (a fused post-op, the reduced axis, a converting copy, a bitmask)."""
    out = getattr(d, "out_dtype", None)
    return (f"{d.kind} {d.op}" + (f" post={d.post}" if getattr(d, "post", None) else "")
            + (f" over={d.over}" if d.kind == "reduce" else "")
            + (f" {d.dtype}->{out}" if out and out != d.dtype else "")
            + (" bitmask" if getattr(d, "bitmask", False) else ""))


def jit_times(report):
    """CPU time of building each element-wise TPP (median of 5 builds, cache bypassed)."""
    m, n = 64, 1000
    descs = ([Unary(op, m, n) for op in UNARY_OPS] + [Unary(op, m, n) for op in GRAD_OPS]
             + [Unary("copy", m, n, dtype="f32", out_dtype="bf16"), Unary("relu", m, n, bitmask=True)]
             + [Binary(op, m, n, bcast_b="row") for op in BINARY_OPS]
             + [Binary("add", m, n, bcast_b="row", post="gelu_erf"), Ternary("muladd", m, n)]
             + [Reduce(op, m, n, over) for op in REDUCE_OPS for over in ("rows", "cols")]
             + [Transform(op, 64, 64, dtype="bf16") for op in TRANSFORMS])
    Kernel(descs[0], tppasm.get_kernel(descs[0]).isa)              # warm imports
    worst = 0.0
    for d in descs:
        samples = []
        for _ in range(5):
            t = time.process_time()
            Kernel(d, tppasm.get_kernel(d).isa)
            samples.append(time.process_time() - t)
        ms = float(np.median(samples)) * 1e3
        worst = max(worst, ms)
        report.add(jit_label(d), ms)
    print(f"\nslowest JIT: {worst:.2f} ms (target <= 5 ms)")
    return worst


def parse(argv=None):
    """The options of ``python -m bench.tpp_eltwise``, checked (a bad one: argparse's error); no work done."""
    p = argparse.ArgumentParser(allow_abbrev=False,
                                prog="python -m bench tpp (its element-wise part, bench.tpp_eltwise)",
                                description=summary(__doc__))
    add_options(p)
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    json_path, quick = args.json, args.quick
    runs = 3 if quick else 5
    torch = _torch()
    from isa.cpu import host
    print(f"host ISA {host().isa}; torch {torch.__version__ if torch else 'not installed'} (1 thread); "
          "GB/s = bytes of every array read or written once / time")
    cols = ["op", "tppasm GB/s", "numpy GB/s", "torch GB/s", "vs numpy", "vs torch"]
    l3 = Report("element-wise, 1M fp32 (1024 x 1024, 4 MiB per array)", cols)
    bandwidth(l3, 1024, 1024, "1M", torch, runs)
    fused = Report("fused bias + gelu (tanh form) vs numpy two-step and torch; fp32 transpose", cols)
    fused_gelu(fused, 1024, 1024, torch, runs)
    transpose(fused, 1000, torch, runs)
    rows, label = (2048, "16M") if quick else (8192, "64M")
    dram = Report(f"element-wise, {label} fp32 ({rows} x 8192, {rows * 8192 * 4 >> 20} MiB per array)", cols)
    bandwidth(dram, rows, 8192, label, torch, runs)
    jit = Report("JIT time per element-wise TPP (64 x 1000; CPU ms, median of 5)", ["TPP", "ms"])
    jit_times(jit)
    write_json(json_path, [l3, fused, dram, jit])


if __name__ == "__main__":
    main()
