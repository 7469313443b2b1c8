"""``python -m bench SUITE [--json FILE] [--plot FILE.png] [suite options]``: suites are isa, tpp, gemm,
mlp, pool, cache, sve-static, amx-static, amx-micro, amx-variants, x86-static, conv, spmm, bert, llm,
ddp, linear, all.

``--json FILE`` writes exactly FILE with the records of every module of the suite; ``--plot FILE.png``
draws their GFLOP/s per shape with the peak as a line (see :mod:`bench.common`)."""
import argparse
import importlib
import json
import os
import sys
import tempfile

import bench.common as common
from bench.common import plot
from bench.options import plot_file, writable_file

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
    "amx-variants": ["bench.amx_variants"],
    "x86-static": ["bench.x86_static"],
    "conv": ["bench.conv"],
    "spmm": ["bench.spmm"],
    "bert": ["bench.bert"],
    "llm": ["bench.llm"],
    "ddp": ["bench.ddp_mlp"],
    "linear": ["bench.linear"],
}


OWN = ("--json", "--plot")      # python -m bench's own options; the others go to the suite's modules


def _parser(suite):
    """python -m bench's own options, checked (:mod:`bench.options`) before any suite module runs."""
    p = argparse.ArgumentParser(prog=f"python -m bench {suite}", add_help=False, allow_abbrev=False,
                                usage=f"%(prog)s [--json FILE] [--plot FILE.png] [options of the suite: see "
                                      f"python -m bench {suite} --help]")
    p.add_argument("--json", metavar="FILE", type=writable_file("--json run.json"),
                   help="write the records of every module of the suite to this file")
    p.add_argument("--plot", metavar="FILE.png", type=plot_file, help="draw their GFLOP/s per shape")
    return p


def split(argv):
    """(python -m bench's own options: the ``--json``/``--plot`` in ``argv`` with their values, the
    rest for the suite), in order; a flag without a value stays alone (argparse then says so).

    >>> split(["--quick", "--json", "x.json", "--plot=x.png", "--json"])
    (['--json', 'x.json', '--plot=x.png', '--json'], ['--quick'])
    """
    own, rest, i = [], [], 0
    while i < len(argv):
        flag = argv[i].split("=", 1)[0]
        n = 1 if flag not in OWN or "=" in argv[i] else 2
        (own if flag in OWN else rest).extend(argv[i:i + n])
        i += n
    return own, rest


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
    try:
        if json_path:
            with open(json_path, "w") as f:
                json.dump(common.plain(records), f, indent=1)
            print(f"\nwrote {json_path} ({len(records)} records)")
        if plot_path:
            suites = " ".join(sorted({r.get("suite", "") for r in records}))
            panels = plot(records, plot_path, f"python -m bench {suites}")
            print(f"wrote {plot_path} ({panels} panels)" if panels else "(no GFLOP/s records to plot)")
    except OSError as e:                # checked writable before the run; the disk or the device said no
        sys.exit(f"python -m bench: cannot write {e.filename or json_path}: {e.strerror or e}; the records were "
                 "printed above")
    return records


def unknown_suite(argv):
    """What to say when ``argv`` (non-empty) does not start with a suite: the suite misspelled, or given
    after options.

    >>> unknown_suite(["GEMM"])
    "unknown suite 'GEMM'; did you mean 'gemm'? (suites are lowercase)"
    >>> unknown_suite(["--json", "x.json", "gemm"])
    "the suite comes first: python -m bench gemm --json x.json"
    """
    first = argv[0]
    suites = (*SUITES, "all")
    later = [a for a in argv[1:] if a in suites]
    if first.startswith("-") and later:
        rest = list(argv)
        rest.remove(later[0])
        return f"the suite comes first: python -m bench {later[0]} {' '.join(rest)}"
    if first.lower() in suites:
        return f"unknown suite {first!r}; did you mean {first.lower()!r}? (suites are lowercase)"
    return f"unknown suite {first!r}; expected one of {', '.join(suites)}, e.g. python -m bench gemm"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in (*SUITES, "all"):
        if argv[:1] in (["-h"], ["--help"]):
            print(__doc__)
            return 0
        print(__doc__, file=sys.stderr)
        if argv:
            print(f"python -m bench: error: {unknown_suite(argv)}", file=sys.stderr)
        return 2
    suite = argv[0]
    own, rest = split(argv[1:])
    opts = _parser(suite).parse_args(own)        # a bad --json or --plot exits here, before any suite runs
    if suite == "all" and rest:
        if rest in (["-h"], ["--help"]):
            print(__doc__)
            return 0
        _parser(suite).error(f"unrecognized arguments: {' '.join(rest)}: 'all' runs every suite with its "
                             "defaults and takes only --json and --plot; give options to one suite, e.g. "
                             "python -m bench gemm --threads 1")
    names = [m for s in SUITES.values() for m in s] if suite == "all" else SUITES[suite]
    run(names, rest, opts.json, opts.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
