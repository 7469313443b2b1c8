"""Shared by the workload benches (conv, spmm): measured peaks per dtype, ours-vs-torch timing
interleaved round by round, geometric means.

On a shared VM the speed of a core drifts by 10-20% within seconds (other tenants), so two
figures measured a second apart do not compare. :func:`versus` therefore times the two callables
in alternating rounds and reports the median of the per-round time ratios next to the median
times: the ratio is the figure to trust, the times set the scale.

>>> t_ours, t_theirs, ratio = versus(lambda: sum(range(200)), lambda: sum(range(400)), rounds=3, seconds=0.002)
>>> t_ours > 0 and t_theirs > 0 and ratio > 0
True
"""
import math

import numpy as np

from isa.cpu import host

from . import peaks
from .common import pool_of
from .interleave import CLOCKS, interleaved, use_threads
from .options import MAX_THREADS, count, json_option

_PEAKS = {}
_clock = ["wall"]


def set_clock(name):
    """Time with the wall clock ("wall", default) or the calling thread's CPU time ("cpu"): on a
    busy machine the latter leaves out the time other processes held the core, but it only sees
    the calling thread, so it is meaningful for 1-thread runs only (torch with one thread runs its
    ops on the caller, as the loop nests do)."""
    if name not in CLOCKS:
        raise ValueError(f"clock {name!r}: expected one of {', '.join(CLOCKS)}")
    _clock[0] = name


def now():
    """The current reading of the clock chosen with :func:`set_clock`."""
    return CLOCKS[_clock[0]]()


def peak(dtype):
    """Measured GFLOP/s of one core for ``dtype`` on the unit its BRGEMM uses (:mod:`bench.peaks`:
    the FMA loop for f32, ``vdpbf16ps`` for bf16 on AVX512-BF16 hosts, AMX tiles on AMX hosts); the
    best of timed runs (the least disturbed by other processes), timed on the clock of
    :func:`set_clock` (the one the tables' % peak use), measured once per process and clock.

    >>> peak("f32") > 0
    True
    """
    key = (dtype, _clock[0])
    if key not in _PEAKS:
        unit = peaks.kernel_unit(dtype)
        if _clock[0] == "wall":
            _PEAKS[key] = peaks.peak_stats(dtype, unit)[1]
        else:
            call, work = peaks.peak_loop(dtype, unit)
            _PEAKS[key] = work / float(interleaved([call], 9, 0.02, _clock[0], settle=0.0)[0].min()) / 1e9
    return _PEAKS[key]


def versus(ours, theirs, rounds=11, seconds=0.02, peak_loop=None):
    """(median seconds of ``ours``, median seconds of ``theirs``, median of the per-round ratios
    theirs/ours): the two timed back to back in each of ``rounds`` rounds of ~``seconds`` each
    (so > 1 means ours is faster); the clock is :func:`set_clock`'s. With ``peak_loop`` (from :func:`peak_loop`) a fourth value:
    the median per-round fraction of the peak that ``ours`` reaches, the peak loop timed in the
    same rounds."""
    fns = [ours, theirs] + ([peak_loop[0]] if peak_loop else [])
    times = interleaved(fns, rounds, seconds, _clock[0])
    ta, tb = times[0], times[1]
    out = (float(np.median(ta)), float(np.median(tb)), float(np.median([b / a for a, b in zip(ta, tb)])))
    if peak_loop:
        out += (float(np.median([peak_loop[1] * tp / a for a, tp in zip(ta, times[2])])),)
    return out


def peak_loop(dtype, work, threads=1):
    """(callable, factor) for :func:`versus`: the JIT'd peak loop of ``dtype`` on ``threads``
    threads at once (:func:`bench.peaks.peak_loop_on`) and how many of its calls ``work`` FLOPs at
    that peak would take."""
    fn, loop_work = peaks.peak_loop_on(threads, dtype, peaks.kernel_unit(dtype))
    return fn, work / loop_work


def ranked(fns, rounds=5, seconds=0.03):
    """Indices of ``fns`` (candidates of ours, no peers), fastest first: each timed in turn in each
    of ``rounds`` rounds (calls repeated to ~``seconds``), by median, so a slow phase of the host
    hits every candidate alike instead of the one timed during it. No pauses between them (those
    are for peers whose idle workers spin, see :func:`use_threads`).

    >>> ranked([lambda: sum(range(2000)), lambda: sum(range(20))], rounds=3, seconds=0.001)
    [1, 0]
    """
    times = interleaved(fns, rounds, seconds, _clock[0], settle=0.0)
    return [int(i) for i in np.argsort([np.median(t) for t in times], kind="stable")]


def fastest(fns, rounds=5, seconds=0.03):
    """Index of the fastest of ``fns`` (:func:`ranked`'s first).

    >>> fastest([lambda: sum(range(2000)), lambda: sum(range(20))], rounds=3, seconds=0.001)
    1
    """
    return ranked(fns, rounds, seconds)[0]


def quick_seconds(fn, seconds=0.01, runs=3):
    """Median seconds per call of ``fn`` (clock of :func:`set_clock`) over ``runs`` runs of about
    ``seconds`` each; a single call's time when one call takes longer (for tuning)."""
    t = now()
    fn()
    once = now() - t
    if once >= seconds:
        return once
    reps = min(1000, int(seconds / max(once, 1e-7)) + 1)
    times = []
    for _ in range(runs):
        t = now()
        for _ in range(reps):
            fn()
        times.append((now() - t) / reps)
    return float(np.median(times))


def add_arguments(parser):
    """The options every workload bench takes: --threads, --clock, --json (checked: :mod:`bench.options`)."""
    parser.add_argument("--threads", type=count("threads (0: all CPUs)", "--threads 2", least=0, most=MAX_THREADS),
                        default=0, help="threads for ours and torch (default 0: all CPUs)")
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall",
                        help="wall time (default) or the calling thread's CPU time (busy machine; needs --threads 1)")
    json_option(parser)


def parse(parser, argv):
    """``parser``'s options for ``argv`` (those of :func:`add_arguments` among them), checked: argparse's
    error when they disagree (--clock cpu measures one thread)."""
    args = parser.parse_args(argv)
    if args.clock == "cpu" and threads_of(args) != 1:
        parser.error("--clock cpu measures the calling thread only: use it with --threads 1")
    return args


def threads_of(args):
    """The threads ``--threads`` asks for (0: the global pool's, all CPUs by default)."""
    from isa.pool import get_pool
    return args.threads or get_pool().nthreads


def setup(args):
    """(torch, threads, pool) for the options :func:`parse` checked; the clock set. Exits with a
    message when torch is missing."""
    torch = torch_or_none()
    if torch is None:
        raise SystemExit("torch is not installed (pip install -e .[bench]): this bench compares against it")
    threads = threads_of(args)
    set_clock(args.clock)
    use_threads(threads, torch)
    pool = pool_of(threads)
    print(f"host {host().isa}, {threads} thread(s), {args.clock} clock; peak per core measured on the {args.clock} "
          f"clock: fp32 {peak('f32'):.1f}, bf16 {peak('bf16'):.1f} GFLOP/s")
    return torch, threads, pool


def geomean(values):
    """Geometric mean of the positive finite ``values`` (NaN when there are none).

    >>> geomean([1.0, 4.0]), math.isnan(geomean([]))
    (2.0, True)
    """
    vals = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else float("nan")


def torch_or_none():
    """torch, or None when the ``bench`` extra is not installed."""
    try:
        import torch
        return torch
    except ImportError:
        return None
