"""Timing for the demo and the benchmarks: repetitions calibrated to a minimum run time, then the
per-call seconds of several timed runs (report medians; the machines are noisy).

>>> reps = calibrate(lambda: None, min_run=0.001)
>>> len(time_runs(lambda: None, reps, runs=3))
3
"""
import math
import time

import numpy as np


def calibrate(fn, min_run=0.05):
    """How many back-to-back calls of ``fn`` take at least ``min_run`` seconds (``fn`` runs first once)."""
    _check("calibrate", fn, seconds={"min_run": min_run})
    fn()
    reps = 1
    while True:
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        dt = time.perf_counter() - t
        if dt >= min_run:
            return reps
        reps = max(reps * 2, int(reps * min_run / max(dt, 1e-9) * 1.2))


def time_runs(fn, reps, runs=5):
    """Seconds per call of ``fn`` in each of ``runs`` timed runs of ``reps`` calls."""
    _check("time_runs", fn, counts={"reps": reps, "runs": runs})
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        out.append((time.perf_counter() - t) / reps)
    return out


def median_time(fn, min_run=0.05, warmup=0.05, runs=5):
    """Median seconds per call of ``fn`` over ``runs`` runs of at least ``min_run`` s each."""
    _check("median_time", fn, seconds={"min_run": min_run, "warmup": warmup}, counts={"runs": runs})
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        fn()
    return float(np.median(time_runs(fn, calibrate(fn, min_run), runs)))


def _check(who, fn, seconds=None, counts=None):
    """Raise TypeError unless ``fn`` is callable, ValueError unless each of ``seconds`` is a finite
    number >= 0 and each of ``counts`` an int >= 1 (an infinite or NaN time would never be reached)."""
    if not callable(fn):
        raise TypeError(f"{who}: fn={fn!r} is not callable; pass the function to time, e.g. lambda: kernel(x, out)")
    for name, v in (seconds or {}).items():
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or \
                not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{who}: {name}={v!r}; expected a finite number of seconds >= 0, e.g. 0.05")
    for name, v in (counts or {}).items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{who}: {name}={v!r}; expected an int >= 1")
