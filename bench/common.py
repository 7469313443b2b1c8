"""What every benchmark suite shares: timing, tables, progress, one JSON file and a plot per run.

How a suite plugs in: a module under ``bench/`` with ``main(argv)`` that accepts ``--json FILE``,
prints its tables with :class:`Report` and ends with ``write_json(args.json, reports)``; list it in
``bench.__main__.SUITES``. Its options are read by ``parse(argv)``, which checks them (the types of
:mod:`bench.options`: a bad one is argparse's error, exit status 2) and does no work.
``python -m bench SUITE --json FILE --plot FILE.png`` (both checked before anything runs) then runs
every module of the suite, merges their records into exactly FILE and draws the plot (:func:`plot`).
A record joins the plot when it has ``gflops`` (ours) and an ``x`` label; its other ``*_gflops``
keys are further series (``numpy_gflops``, ``torch_gflops``, ...) and ``peak_gflops`` is drawn as
the peak line. Every record also names the host and its ISA (:func:`host_info`).
"""
import json
import os
import sys

import numpy as np

import functools

from bench.interleave import interleaved as _interleaved
from tppasm.timing import calibrate, median_time, time_runs  # noqa: F401  (re-exported)


class Report:
    """Rows printed as an aligned table as they come, and kept for ``--json``; keyword arguments of
    :meth:`add` go into the record only (e.g. ``gflops=``, ``x=`` for the plot, a tuned spec).

    ``marked``: the columns that hold a measured % of a peak, printed by :func:`peak_cell` ("!" after
    a figure over 100; the record keeps the number), the header saying so after ``legend`` (which
    peak they are of: :func:`bench.peaks.peak_legend`).

    >>> rep = Report("t", ["what", "% peak"], marked=["% peak"], legend="peaks: f32 FMA")
    <BLANKLINE>
    ## t
    <BLANKLINE>
    peaks: f32 FMA; '!' after a % of peak: over 100, a disturbed round or a wrong peak, not a kernel beyond its unit
    <BLANKLINE>
    what | % peak
    --- | ---
    >>> rep.add("a", 163.0); rep.add("b", 95.0); rep.rows[0]["% peak"]
    a | 163.0!
    b | 95.0
    163.0
    """

    def __init__(self, title, columns, marked=(), legend=""):
        self.title, self.columns, self.rows, self.marked = title, columns, [], frozenset(marked)
        if not self.marked <= set(columns):
            raise ValueError(f"Report: marked columns {sorted(self.marked - set(columns))} are not among {columns}")
        print(f"\n## {title}\n")
        if self.marked:
            print(f"{legend}; {OVER_PEAK}\n" if legend else f"{OVER_PEAK}\n")
        print(" | ".join(columns))
        print(" | ".join("---" for _ in columns))

    def add(self, *values, **extra):
        self.rows.append({**dict(zip(self.columns, values)), **extra})
        print(" | ".join(_fmt(peak_cell(v) if c in self.marked else v) for c, v in zip(self.columns, values)),
              flush=True)

    def records(self):
        host = host_info()
        return [{"table": self.title, "host": host["host"], "isa": host["isa"], **r} for r in self.rows]


def _fmt(v):
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 10 else f"{v:,.1f}"
    return str(v)


OVER_PEAK = "'!' after a % of peak: over 100, a disturbed round or a wrong peak, not a kernel beyond its unit"


def over_peak_mark(percent):
    """``"!"`` for a % of the peak over 100 (a disturbed measurement, not a kernel faster than the
    peak loop: see :func:`bench.peaks.ratio_stats`), else ``""``.

    >>> over_peak_mark(163.0), over_peak_mark(98.0)
    ('!', '')
    """
    return "!" if percent > 100 else ""


def peak_cell(percent):
    """A measured % of a peak as a table cell: the number, or its text with ``"!"`` after it when over
    100 (:func:`over_peak_mark`; the header says what it means: :data:`OVER_PEAK`).

    >>> peak_cell(116.0), peak_cell(90.0), peak_cell(float("nan")), peak_cell("-")
    ('116.0!', 90.0, nan, '-')
    """
    if isinstance(percent, (int, float)) and not isinstance(percent, bool) and over_peak_mark(percent):
        return f"{percent:,.1f}!"
    return percent


def interleaved(fns, rounds=9, seconds=0.03):
    """Time ``fns`` back to back in each of ``rounds`` rounds (each call repeated to ~``seconds``;
    :func:`bench.interleave.interleaved`, which pauses between them on several threads):
    (median seconds per call of each, median over rounds of each one's time / the first one's), so
    a ratio is taken between runs a fraction of a second apart and the host's drift cancels.

    >>> t, r = interleaved([lambda: sum(range(100)), lambda: sum(range(100))], rounds=3, seconds=0.001)
    >>> len(t), r[0], r[1] > 0
    (2, 1.0, True)
    """
    samples = _interleaved(fns, rounds, seconds)
    ratios = [float(np.median(s / samples[0])) for s in samples]
    return [float(np.median(s)) for s in samples], ratios


def host_info():
    """The host as records name it: ``{"host": vendor and ISA level, "isa": ..., "threads": CPUs}``.

    >>> sorted(host_info())
    ['host', 'isa', 'threads']
    """
    from isa.cpu import host
    h = host()
    return {"host": f"{h.vendor} {h.arch}", "isa": h.isa, "threads": len(os.sched_getaffinity(0))}


def pool_of(threads):
    """The thread pool a bench runs ``threads`` threads on: loops' global pool when it has that
    many, else one pool of that size kept for the process (its workers are started once).

    >>> from isa.pool import get_pool
    >>> pool_of(get_pool().nthreads) is get_pool(), pool_of(1) is pool_of(1), pool_of(1).nthreads
    (True, True, 1)
    """
    from isa.pool import get_pool
    return get_pool() if get_pool().nthreads == threads else _own_pool(threads)


@functools.lru_cache(maxsize=None)
def _own_pool(threads):
    from isa.pool import Pool
    return Pool(threads)


ANNOUNCE = True         # python -m bench collects the files itself and says what it wrote


def write_json(path, reports):
    """Write the records of ``reports`` (:class:`Report`, or lists of record dicts) to ``path`` (if given)."""
    if path:
        records = [r for rep in reports for r in (rep.records() if hasattr(rep, "records") else rep)]
        with open(path, "w") as f:
            json.dump(plain(records), f, indent=1)
        if ANNOUNCE:
            print(f"\nwrote {path}")


def plain(x):
    """``x`` as strict JSON values: NumPy scalars as Python ones, NaN and infinities as None, other
    objects as their text.

    >>> plain({"a": [float("nan"), 1.5], "b": (2, "x")})
    {'a': [None, 1.5], 'b': [2, 'x']}
    """
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        x = x.item()
    if isinstance(x, float):
        return x if x == x and abs(x) != float("inf") else None
    if x is None or isinstance(x, (bool, int, str)):
        return x
    return str(x)


def progress(items, desc, enabled=True):
    """``items`` with a progress bar (tqdm, notebook-aware, when installed; else as they are).

    >>> list(progress([1, 2], "demo", enabled=False))
    [1, 2]
    """
    if not enabled or not (sys.stderr.isatty() or "ipykernel" in sys.modules):
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, leave=False)


def plot(records, path, title="tppasm benchmarks"):
    """GFLOP/s per shape (one panel per table that has ``gflops`` and ``x``), the peak as a line;
    written to ``path`` with matplotlib. Returns the number of panels (0: nothing to plot).

    >>> plot([{"table": "t", "x": "64", "gflops": 1.0}], os.devnull) in (0, 1)
    True
    """
    tables = {}
    for r in records:
        if isinstance(r.get("gflops"), (int, float)) and "x" in r:
            tables.setdefault(r.get("table", ""), []).append(r)
    if not tables:
        return 0
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib is not installed: no plot; pip install matplotlib)")
        return 0
    widest = max(len(rows) for rows in tables.values())        # many shapes (conv layers): a wider figure
    size = (max(10, 0.16 * widest), (3.6 if widest <= 20 else 5.0) * len(tables))
    fig, axes = plt.subplots(len(tables), 1, figsize=size, squeeze=False)
    for ax, (name, rows) in zip(axes[:, 0], tables.items()):
        xs = list(range(len(rows)))
        series = ["gflops"] + sorted({k for r in rows for k in r                 # peaks are the line, not bars
                                      if k.endswith("_gflops") and not k.endswith("peak_gflops")})
        width = 0.8 / len(series)
        for j, key in enumerate(series):
            ys = [r.get(key) if isinstance(r.get(key), (int, float)) else float("nan") for r in rows]
            ax.bar([x + (j - (len(series) - 1) / 2) * width for x in xs], ys, width,
                   label={"gflops": "tppasm", "fixed_gflops": "tppasm, fixed spec"}.get(key, key[:-len("_gflops")]))
        peaks = [r.get("peak_gflops") for r in rows]
        if any(isinstance(p, (int, float)) for p in peaks):
            ax.step([x - 0.5 for x in xs] + [xs[-1] + 0.5],
                    [p if isinstance(p, (int, float)) else float("nan") for p in peaks + peaks[-1:]],
                    where="post", color="k", linestyle="--", label="peak")
        ax.set_xticks(xs, [str(r["x"]) for r in rows], rotation=30 if widest <= 20 else 90,
                      ha="right" if widest <= 20 else "center", fontsize=8 if widest <= 20 else 6)
        ax.set_ylabel("GFLOP/s")
        ax.set_title(name[:110], fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"{title} ({host_info()['host']}, {host_info()['isa']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return len(tables)
