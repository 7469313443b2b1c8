"""Element-wise TPPs vs numpy and torch (one thread): GB/s per core, STREAM byte counting (every
array read or written once), fused bias + gelu vs numpy's two steps, JIT time of every TPP.

``python -m bench.tpp_eltwise [--json FILE] [--quick]``; ``main(argv)`` is the entry point.
One kernel call covers the whole (rows x cols) array. Medians of 5 auto-calibrated runs.
"""
import math
import sys
import time

import numpy as np

import tppasm
from tppasm.eltwise import (BINARY_OPS, GRAD_OPS, REDUCE_OPS, TRANSFORMS, UNARY_OPS, Binary, Reduce,
                            Ternary, Transform, Unary)
from tppasm.kernel import Kernel

from .common import Report, median_time, write_json

K0, K1 = math.sqrt(2 / math.pi), 0.044715


def _torch():
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    return torch


def _gbs(nbytes, fn, runs=5):
    return nbytes / median_time(fn, min_run=0.05, runs=runs) / 1e9


def bandwidth(report, rows, cols, label, torch, runs):
    x = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
    y = np.random.default_rng(1).standard_normal((rows, cols), dtype=np.float32)
    out = np.empty_like(x)
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
        g = _gbs(nbytes, ours, runs)
        gn = _gbs(nbytes, numpy_fn, runs)
        gt = _gbs(nbytes, torch_fn, runs) if torch_fn else float("nan")
        report.add(f"{name} {label}", g, gn, gt, g / gn, g / gt if torch_fn else float("nan"))


def fused_gelu(report, rows, cols, torch, runs):
    x = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
    bias = np.random.default_rng(1).standard_normal(cols, dtype=np.float32)
    out = np.empty_like(x)
    k = tppasm.binary("add", rows, cols, bcast_b="row", post="gelu")

    def numpy_two_step():
        t = x + bias
        np.multiply(0.5 * t, 1 + np.tanh(K0 * (t + K1 * t * t * t)), out=out)

    nbytes = 2 * x.nbytes + bias.nbytes
    g = _gbs(nbytes, lambda: k(x, bias, out), runs)
    gn = _gbs(nbytes, numpy_two_step, runs)
    gt = float("nan")
    if torch:
        tx, tb = torch.from_numpy(x), torch.from_numpy(bias)
        gt = _gbs(nbytes, lambda: torch.nn.functional.gelu(tx + tb, approximate="tanh"), runs)
    report.add(f"bias+gelu {rows}x{cols}", g, gn, gt, g / gn, g / gt if torch else float("nan"))


def jit_times(report):
    """CPU time of building each element-wise TPP (median of 5 builds, cache bypassed)."""
    m, n = 64, 1000
    descs = ([Unary(op, m, n) for op in UNARY_OPS] + [Unary(op, m, n) for op in GRAD_OPS]
             + [Unary("copy", m, n, dtype="f32", out_dtype="bf16"), Unary("relu", m, n, bitmask=True)]
             + [Binary(op, m, n, bcast_b="row") for op in BINARY_OPS]
             + [Binary("add", m, n, bcast_b="row", post="gelu_erf"), Ternary("muladd", m, n)]
             + [Reduce(op, m, n, over) for op in REDUCE_OPS for over in ("rows", "cols")]
             + [Transform(op, 64, 64, dtype="bf16") for op in TRANSFORMS])
    Kernel(descs[0], None or tppasm.get_kernel(descs[0]).isa)
    worst = 0.0
    for d in descs:
        samples = []
        for _ in range(5):
            t = time.process_time()
            Kernel(d, tppasm.get_kernel(d).isa)
            samples.append(time.process_time() - t)
        ms = float(np.median(samples)) * 1e3
        worst = max(worst, ms)
        report.add(f"{d.kind} {d.op}" + (f" post={d.post}" if getattr(d, "post", None) else "")
                   + (f" over={d.over}" if d.kind == "reduce" else ""), ms)
    print(f"\nslowest JIT: {worst:.2f} ms (target <= 5 ms)")
    return worst


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    json_path = argv[argv.index("--json") + 1] if "--json" in argv else None
    quick = "--quick" in argv
    runs = 3 if quick else 5
    torch = _torch()
    from isa.cpu import host
    print(f"host ISA {host().isa}; torch {torch.__version__ if torch else 'not installed'} (1 thread); "
          "GB/s = bytes of every array read or written once / time")
    cols = ["op", "tppasm GB/s", "numpy GB/s", "torch GB/s", "vs numpy", "vs torch"]
    l3 = Report("element-wise, 1M fp32 (1024 x 1024, 4 MiB per array)", cols)
    bandwidth(l3, 1024, 1024, "1M", torch, runs)
    fused = Report("fused bias + gelu (tanh form) vs numpy two-step and torch", cols)
    fused_gelu(fused, 1024, 1024, torch, runs)
    dram = Report("element-wise, 64M fp32 (8192 x 8192, 256 MiB per array)", cols)
    if quick:
        bandwidth(dram, 2048, 8192, "16M", torch, runs)
    else:
        bandwidth(dram, 8192, 8192, "64M", torch, runs)
    jit = Report("JIT time per element-wise TPP (64 x 1000; CPU ms, median of 5)", ["TPP", "ms"])
    jit_times(jit)
    write_json(json_path, [l3, fused, dram, jit])


if __name__ == "__main__":
    main()
