"""Interleaved timing for the model benches: every function timed in turn, round after round, so
that the machine's drift (clock, other tenants) hits all of them alike; report medians of per-round
ratios. The clock is wall time, or the calling thread's CPU time (``time.thread_time``: meaningful
for 1-thread runs only, it leaves out the time other processes held the core).

>>> a, b = interleaved([lambda: None, lambda: sum(range(20000))], runs=3, min_run=0.001)
>>> len(a), bool((b > a).all())
(3, True)
"""
import time

import numpy as np

from tppasm.timing import calibrate

CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
SETTLE = [0.0]      # seconds slept (untimed) before each function's turn in a round: see use_threads


def use_threads(n, torch=None):
    """Time the peers on ``n`` threads: ``torch.set_num_threads(n)`` and, with more than one thread,
    a pause of 0.25 s before each function's turn in :func:`interleaved`. OpenBLAS's and OpenMP's
    idle workers spin after a call (OpenBLAS for about 0.1 s); on a 2-core machine they would take a
    core from whatever is timed next, and the ratios would depend on the order of the functions.

    >>> use_threads(1); SETTLE[0]
    0.0
    """
    if torch is not None:
        torch.set_num_threads(n)
    SETTLE[0] = 0.25 if n > 1 else 0.0


def interleaved(fns, runs, min_run=0.05, clock="wall", settle=None):
    """Per-call seconds of each of ``fns`` (one array each) over ``runs`` rounds; in a round each
    runs a calibrated number of calls (>= ``min_run`` s), after a pause of ``settle`` seconds
    (default: :func:`use_threads`'s) and one untimed call: the first call after an idle pause
    wakes the function's own workers (and the VM's idle vCPUs), measured 1-4% of a 2-thread
    1024^3 GEMM's rounds on Zen 4."""
    now = CLOCKS[clock]
    pause = SETTLE[0] if settle is None else settle
    reps = [calibrate(f, min_run) for f in fns]
    out = [[] for _ in fns]
    for _ in range(runs):
        for f, r, acc in zip(fns, reps, out):
            if pause:
                time.sleep(pause)
                f()
            t = now()
            for _ in range(r):
                f()
            acc.append((now() - t) / r)
    return [np.array(a) for a in out]


def add_clock_option(parser):
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time (default), or the calling thread's CPU time (a busy machine; --threads 1)")


def check_clock(parser, args):
    """Refuse ``--clock cpu`` unless ``--threads`` (a list, :func:`bench.options.threads_option`) is just 1."""
    if args.clock == "cpu" and args.threads != [1]:
        parser.error("--clock cpu measures the calling thread only: use it with --threads 1")
