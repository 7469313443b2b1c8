"""``python -m bench SUITE [--json FILE] [--plot FILE.png] [suite options]``: suites are isa, tpp, gemm,
mlp, pool, cache, sve-static, amx-static, amx-micro, x86-static, conv, spmm, bert, llm, ddp, linear, all.

``--json FILE`` writes exactly FILE with the records of every module of the suite; ``--plot FILE.png``
draws their GFLOP/s per shape with the peak as a line (see :mod:`bench.common`)."""
import importlib
import json
import os
import sys
import tempfile

import bench.common as common
from bench.common import plot

SUITES = {
    "isa": ["bench.isa"],
    "tpp": ["bench.tpp_gemm", "bench.tpp_eltwise"],
    "gemm": ["bench.gemm"],
    "mlp": ["bench.mlp"],
    "pool": ["bench.pool"],
    "cache": ["bench.cache"],
    "sve-static": ["bench.sve_static"],
    "amx-static": ["bench.amx_static"],
    "amx-micro": ["bench.amx_micro"],
    "x86-static": ["bench.x86_static"],
    "conv": ["bench.conv"],
    "spmm": ["bench.spmm"],
    "bert": ["bench.bert"],
    "llm": ["bench.llm"],
    "ddp": ["bench.ddp_mlp"],
    "linear": ["bench.linear"],
}


def _take(argv, flag):
    """Remove ``flag VALUE`` from ``argv``; return VALUE (or None).

    >>> argv = ["--quick", "--json", "x.json"]; _take(argv, "--json"), argv
    ('x.json', ['--quick'])
    """
    if flag not in argv:
        return None
    i = argv.index(flag)
    if i + 1 >= len(argv):
        raise SystemExit(f"{flag} needs a file name")
    value = argv[i + 1]
    del argv[i:i + 2]
    return value


def run(names, argv, json_path=None, plot_path=None):
    """Run the suite modules ``names`` with ``argv``; merge their records; write/plot them; return them."""
    records = []
    host = common.host_info()
    common.ANNOUNCE = False
    with tempfile.TemporaryDirectory() as tmp:
        for n, name in enumerate(names):
            part = os.path.join(tmp, f"{n}.json")
            importlib.import_module(name).main(list(argv) + ["--json", part])
            if os.path.exists(part):
                with open(part) as f:
                    got = json.load(f)
                records += [{"suite": name.split(".")[-1], "host": host["host"], "isa": host["isa"], **r}
                            if isinstance(r, dict) else r for r in got]
    if json_path:
        with open(json_path, "w") as f:
            json.dump(common.plain(records), f, indent=1)
        print(f"\nwrote {json_path} ({len(records)} records)")
    if plot_path:
        panels = plot(records, plot_path, f"python -m bench {' '.join(sorted({r.get('suite', '') for r in records}))}")
        print(f"wrote {plot_path} ({panels} panels)" if panels else "(no GFLOP/s records to plot)")
    return records


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in (*SUITES, "all"):
        print(__doc__)
        return 2
    suite, rest = argv[0], argv[1:]
    names = [m for s in SUITES.values() for m in s] if suite == "all" else SUITES[suite]
    json_path, plot_path = _take(rest, "--json"), _take(rest, "--plot")
    run(names, rest, json_path, plot_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
