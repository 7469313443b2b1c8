"""The table of ``python -m bench gemm`` and its records: the columns, the header (which peak each
dtype's % of peak is of, '!' after a figure over 100), one row from a row's measured figures, and
the texts of a tuning record (the winner, what it owes to earlier runs).

A record's ``peak_gflops`` is the peak that row's "%pk" is of (its ``gflops`` / "%pk"), so the
plot's peak line agrees with the table, and its ``peak_unit`` names that peak's unit and
instruction (:func:`bench.peaks.peak_unit`).
"""
from bench.common import Report
from bench.peaks import peak_legend, peak_unit

COLUMNS = ["dtype", "M x N x K", "threads", "tuned", "aBC", "numpy", "torch", "tuned/numpy", "tuned/torch",
           "nT/1T", "peak nT/1T", "%pk", "q90", "numpy %pk", "winner"]
PERCENT_COLUMNS = ("%pk", "q90", "numpy %pk")      # % of a measured peak: '!' over 100


def gemm_report(rounds, dtypes):
    """The GEMM table for ``dtypes``, ``rounds`` interleaved rounds a row (:func:`add_row` fills it)."""
    return Report(f"GEMM GFLOP/s (int8: GOP/s of u8 x s8 -> int32; torch: torch._int_mm, s8 x s8): tuned DSL "
                  f"(loops.tune.search: spec, block sizes, knobs) and the fixed aBC, numpy, torch, timed back to "
                  f"back (medians of {rounds} interleaved rounds; ratios: medians of per-round ratios); % of the "
                  f"dtype's peak: on 1 thread the median / 90th percentile of 15 ratios timed back to back with the "
                  f"peak loop on the thread's CPU time, on n threads the median ratio to the peak loop run on n "
                  f"threads in the same rounds; numpy %pk: its fp32 matmul against the FMA peak",
                  COLUMNS, marked=PERCENT_COLUMNS, legend=peak_legend(dtypes))


def add_row(rep, dtype, shape, nt, res, pct, host_scaling, win, torch_wrong):
    """One row of :func:`gemm_report` and its record: ``res`` {name: (GFLOP/s, ratio to tuned)} of the
    timed callables ("tuned", "fixed", maybe "numpy", "torch", "1T"), ``pct`` (%pk, q90, numpy %pk),
    the peak loop's n-thread / 1-thread rate and the tuning record ``win`` (None: not tuned)."""
    M, N, K = shape
    nan = (float("nan"), float("nan"))
    (np_g, np_r), (th_g, th_r) = res.get("numpy", nan), res.get("torch", nan)
    scaling = res.get("1T", nan)[1]         # median over rounds of t(1T) / t(this row)
    rep.add(dtype, f"{M}x{N}x{K}", nt, res["tuned"][0], res["fixed"][0], np_g, th_g, np_r, th_r, scaling,
            host_scaling, *pct, winner_text(win) if win else "-",
            x=f"{dtype} {M}x{N}x{K} {nt}T", gflops=res["tuned"][0], fixed_gflops=res["fixed"][0], numpy_gflops=np_g,
            torch_gflops=th_g, torch_wrong_sums=torch_wrong, peak_gflops=implied_peak(res["tuned"][0], pct[0]),
            peak_unit=peak_unit(dtype), host_scaling=host_scaling, tuning=win)


def implied_peak(gflops, percent):
    """The peak GFLOP/s of which ``gflops`` is ``percent`` % (None when the % is not a positive number).

    >>> implied_peak(30.0, 75.0), implied_peak(30.0, float("nan"))
    (40.0, None)
    """
    return gflops / (percent / 100) if percent > 0 else None


def resumed_text(record):
    """What a tuning record owes to earlier runs ('' for a first search).

    >>> resumed_text({"resumed": True, "runs": 3, "tuning_seconds": 151.2}), resumed_text({"runs": 1})
    ('; resumed from the remembered search: 3 runs, 151 s of tuning in all', '')
    """
    if not record.get("resumed"):
        return ""
    return (f"; resumed from the remembered search: {record['runs']} runs, "
            f"{record['tuning_seconds']:.0f} s of tuning in all")


def winner_text(record):
    """'spec bm=.. bn=..' of a tuning record.

    >>> winner_text({"spec": "aBC", "knobs": {"bm": 64, "edges": False, "prefetch": False}})
    'aBC bm=64 prefetch=False'
    """
    return record["spec"] + "".join(f" {k}={v}" for k, v in record["knobs"].items() if (k, v) != ("edges", False))
