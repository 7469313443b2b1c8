"""Timing and reporting shared by the benchmarks: medians of auto-calibrated runs, ratios, JSON."""
import json
import time

import numpy as np


def median_time(fn, min_run=0.05, warmup=0.05, runs=5):
    """Median seconds per call of ``fn`` over ``runs`` timed runs of at least ``min_run`` s each.

    >>> t = median_time(lambda: None, min_run=0.001, warmup=0.0, runs=3)
    >>> 0 < t < 1e-3
    True
    """
    end = time.perf_counter() + warmup
    fn()
    while time.perf_counter() < end:
        fn()
    reps = 1
    while True:
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        dt = time.perf_counter() - t
        if dt >= min_run:
            break
        reps = max(reps * 2, int(reps * min_run / max(dt, 1e-9) * 1.2))
    samples = [dt / reps]
    for _ in range(runs - 1):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        samples.append((time.perf_counter() - t) / reps)
    return float(np.median(samples))


class Report:
    """Rows printed as an aligned table as they come, and kept for ``--json``."""

    def __init__(self, title, columns):
        self.title, self.columns, self.rows = title, columns, []
        print(f"\n## {title}\n")
        print(" | ".join(columns))
        print(" | ".join("---" for _ in columns))

    def add(self, *values, **extra):
        self.rows.append({**dict(zip(self.columns, values)), **extra})
        print(" | ".join(_fmt(v) for v in values), flush=True)

    def records(self):
        return [{"table": self.title, **r} for r in self.rows]


def _fmt(v):
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 10 else f"{v:,.1f}"
    return str(v)


def write_json(path, reports):
    """Write the records of ``reports`` to ``path`` (if given)."""
    if path:
        with open(path, "w") as f:
            json.dump([r for rep in reports for r in rep.records()], f, indent=1)
        print(f"\nwrote {path}")


def fma_peak_gflops():
    """This core's fp32 FMA peak, measured with a JIT'd loop of independent FMAs (GFLOP/s)."""
    from isa.cpu import host
    from isa.x86 import Function, rax, vec
    width = 512 if host().isa in ("avx512", "amx") else 256
    lanes = width // 32
    fn = Function("fma_peak", ["i64"])
    (n,) = fn.args
    a = fn.asm
    accs = [vec(width, i) for i in range(12)]
    for r in accs:
        a.vxorps(r, r, r)
    x = vec(width, 14)
    a.vxorps(x, x, x)
    top = a.label()
    a.mov(rax, n)
    a.bind(top)
    for _ in range(4):
        for r in accs:
            a.vfmadd231ps(r, x, x)
    a.dec(rax)
    a.jnz(top)
    f = fn.finalize()
    iters = 200_000
    t = median_time(lambda: f(iters), min_run=0.05, runs=5)
    return 2 * lanes * 48 * iters / t / 1e9
