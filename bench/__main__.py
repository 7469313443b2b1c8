"""``python -m bench SUITE [--json FILE] [--plot FILE.png] [suite options]``: suites are isa, tpp, gemm,
mlp, pool, cache, sve-static, amx-static, amx-micro, amx-variants, x86-static, conv, spmm, bert, llm,
ddp, linear, all.

``--json FILE`` writes exactly FILE with the records of every module of the suite; ``--plot FILE.png``
draws their GFLOP/s per shape with the peak as a line (see :mod:`bench.common`), for the suites that
have them (tpp, gemm, mlp, conv, spmm, linear, all). A suite module that fails makes the run fail
(exit status 1, naming it) after the records of the others are written."""
import argparse
import importlib
import json
import os
import sys
import tempfile
import traceback

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


# what --help prints (the module docstring, which python -OO strips: then a short text of the same)
HELP = __doc__ or (f"python -m bench SUITE [--json FILE] [--plot FILE.png] [suite options]: suites are "
                   f"{', '.join(SUITES)}, all. (python -OO strips the rest of this help.)")
OWN = ("--json", "--plot")      # python -m bench's own options; the others go to the suite's modules
DRAWN = ("tpp", "gemm", "mlp", "conv", "spmm", "linear", "all")    # the suites whose records --plot draws


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


def abbreviated(rest):
    """The first flag in ``rest`` (what goes to the suite) that abbreviates ``--json`` or ``--plot``
    (the suite's parser would read it as its own ``--json`` and lose it); None when there is none.

    >>> abbreviated(["--quick", "--js", "x.json"]), abbreviated(["--p", "--jsonx"])
    ('--js', None)
    """
    for arg in rest:
        flag = arg.split("=", 1)[0]
        if len(flag) > 3 and any(own.startswith(flag) and own != flag for own in OWN) or flag == "--j":
            return flag
    return None


def check_own(parser, suite, own, rest, opts):
    """argparse's error (exit 2) for what :meth:`argparse.ArgumentParser.parse_args` lets through: an
    abbreviated or repeated ``--json``/``--plot``, both naming one file, or ``--plot`` for a suite with
    nothing to draw."""
    short = abbreviated(rest)
    if short:
        full = next(o for o in OWN if o.startswith(short))
        parser.error(f"{short}: write {full} in full (python -m bench takes no abbreviations of its own options)")
    flags = [a.split("=", 1)[0] for a in own if a.startswith("--")]
    for flag in OWN:
        if flags.count(flag) > 1:
            parser.error(f"{flag} is given {flags.count(flag)} times: give it once, e.g. {flag} "
                         f"run.{'json' if flag == '--json' else 'png'}")
    if opts.json and opts.plot and os.path.realpath(opts.json) == os.path.realpath(opts.plot):
        parser.error(f"--json and --plot name the same file ({opts.plot!r}): the plot would overwrite the records; "
                     "name two files, e.g. --json run.json --plot run.png")
    if opts.plot and suite not in DRAWN:
        parser.error(f"--plot: the {suite} suite has no GFLOP/s per shape to draw; drop --plot (the suites that "
                     f"draw: {', '.join(DRAWN)})")


def run(names, argv, json_path=None, plot_path=None):
    """Run the suite modules ``names`` with ``argv``; merge their records; write/plot them; return them.
    A module that fails (returns non-zero, or raises: :func:`run_module`) or a plot with nothing to
    draw: the records are written, then SystemExit naming it (exit status 1). A closed stdout (its
    reader left) raises BrokenPipeError, before any file is written if a module met it."""
    records, failed = [], []
    host = common.host_info()
    common.ANNOUNCE = False
    with tempfile.TemporaryDirectory() as tmp:
        for n, name in enumerate(names):
            part = os.path.join(tmp, f"{n}.json")
            status = run_module(name, list(argv) + ["--json", part])
            if status:
                failed.append(f"{name} ({status if isinstance(status, str) else f'exit status {status}'})")
            if os.path.exists(part):
                with open(part) as f:
                    got = json.load(f)
                records += [{"suite": name.split(".")[-1], "host": host["host"], "isa": host["isa"], **r}
                            if isinstance(r, dict) else r for r in got]
    try:
        if json_path:
            with open(json_path, "w") as f:
                json.dump(common.plain(records), f, indent=1)
    except OSError as e:                # checked writable before the run; the disk or the device said no
        sys.exit(f"python -m bench: cannot write {e.filename or json_path}: {e.strerror or e}; the records were "
                 "printed above")
    if json_path:
        print(f"\nwrote {json_path} ({len(records)} records)")     # (a closed stdout: BrokenPipeError, quiet)
    try:
        if plot_path and not draw(records, plot_path):
            failed.append(f"--plot {plot_path} (no GFLOP/s records to draw; not written)")
    except BrokenPipeError:             # draw's "wrote ..." on a stdout whose reader left: not the plot's fault
        raise
    except OSError as e:
        sys.exit(f"python -m bench: cannot write {e.filename or plot_path}: {e.strerror or e}; the records were "
                 "printed above")
    if failed:
        sys.exit(f"python -m bench: failed: {'; '.join(failed)}" + ("; the records of the rest were written"
                                                                     if json_path else ""))
    return records


def run_module(name, argv):
    """``main(argv)`` of the suite module ``name``: its exit status, or what it raised (printed with
    its traceback, then said in a word), so that the modules after it still run and the records of
    all are written; but BrokenPipeError (stdout's reader left) is raised on, ending the run. A
    missing package (the bench extra: torch, ...) is named with what to install; argparse's exits
    (``--help``, a bad option) end the run, as before."""
    try:
        return importlib.import_module(name).main(argv)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            raise
        print(f"python -m bench: {name}: {e.code}", file=sys.stderr)
        return 1
    except ImportError as e:
        print(f"python -m bench: {name}: {e}: install the bench extra (pip install -e .[bench])", file=sys.stderr)
        return f"needs {e.name or 'a package'}: pip install -e .[bench]"
    except BrokenPipeError:         # stdout's reader left (| head): the run ends, quietly (exit 141), and
        raise                       # writes no records: it has not made them
    except Exception as e:          # a module's bug: the others still run, and their records are written
        traceback.print_exc()
        return f"raised {type(e).__name__}: {e}"


def draw(records, path):
    """Plot ``records`` to ``path``; the number of panels. None drawn: an older ``path`` is removed (it
    would pass for this run's plot). A drawing error (a missing TeX, ...): SystemExit naming it."""
    suites = " ".join(sorted({r.get("suite", "") for r in records}))
    try:
        panels = plot(records, path, f"python -m bench {suites}")
    except OSError:
        raise
    except Exception as e:              # matplotlib's errors have no common class
        sys.exit(f"python -m bench: cannot draw {path}: {type(e).__name__}: {e}; the records were printed above")
    if panels:
        print(f"wrote {path} ({panels} panels)")
    elif os.path.exists(path):
        os.remove(path)
    return panels


def own_help(suite):
    """What ``python -m bench SUITE --help`` says of python -m bench's own options, above the suite's help.

    >>> print(own_help("pool"))  # doctest: +ELLIPSIS
    python -m bench pool also takes --json FILE (...); --plot FILE.png is not for it (...)
    """
    plot = (" and --plot FILE.png (draw their GFLOP/s per shape)" if suite in DRAWN else
            f"; --plot FILE.png is not for it (it has no GFLOP/s per shape; the suites that draw: {', '.join(DRAWN)})")
    return f"python -m bench {suite} also takes --json FILE (write the records of every module of the suite){plot}"


def unknown_suite(argv):
    """What to say when ``argv`` (non-empty) does not start with a suite: the suite misspelled, or given
    after options.

    >>> unknown_suite(["GEMM"])
    "unknown suite 'GEMM'; did you mean 'gemm'? (suites are lowercase)"
    >>> unknown_suite(["--json", "x.json", "gemm"])
    'the suite comes first: python -m bench gemm --json x.json'
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
            print(HELP)
            return 0
        print(HELP, file=sys.stderr)
        if argv:
            print(f"python -m bench: error: {unknown_suite(argv)}", file=sys.stderr)
        return 2
    suite = argv[0]
    own, rest = split(argv[1:])
    parser = _parser(suite)
    opts = parser.parse_args(own)        # a bad --json or --plot exits here, before any suite runs
    check_own(parser, suite, own, rest, opts)
    if suite == "all" and rest:
        if rest in (["-h"], ["--help"]):
            print(HELP)
            return 0
        _parser(suite).error(f"unrecognized arguments: {' '.join(rest)}: 'all' runs every suite with its "
                             "defaults and takes only --json and --plot; give options to one suite, e.g. "
                             "python -m bench gemm --threads 1")
    if "-h" in rest or "--help" in rest:         # the suite's parser prints its help next, and exits
        print(own_help(suite), end="\n\n")
    names = [m for s in SUITES.values() for m in s] if suite == "all" else SUITES[suite]
    run(names, rest, opts.json, opts.plot)
    return 0


if __name__ == "__main__":
    try:
        status = main()
        sys.stdout.flush()              # a closed pipe raises here, not at exit
    except BrokenPipeError:             # the reader left (python -m bench all --help | head -3): quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 141                    # 128 + SIGPIPE, as tppasm's command line
    sys.exit(status)
