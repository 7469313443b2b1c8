"""Timing and reporting shared by the benchmarks: medians of auto-calibrated runs, ratios, JSON."""
import json

from tppasm.timing import calibrate, median_time, time_runs  # noqa: F401  (re-exported)


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
