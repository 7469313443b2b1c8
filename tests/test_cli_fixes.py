"""The command lines' end-user surfaces (``python -m tppasm``, ``python -m bench``) do what they say:
an empty ``--only`` clears nothing, a failing suite is a failing run, ``--json``/``--plot`` are
refused up front when they could not do what they promise (the same file, an abbreviation, a
repeat, a format needing TeX, a suite with nothing to draw), a repeated item is refused, and the
small things (a closed pipe, the demo's wording, help lines, labels) say what happened."""
import collections
import doctest
import json
import os
import pathlib
import subprocess
import sys
import types
import warnings

import pytest

import bench.__main__ as bench_main
import tppasm.cache as tc
from tppasm.__main__ import main as tppasm_main

ROOT = pathlib.Path(__file__).resolve().parent.parent


def refused(capsys, parse, argv):
    """stderr of ``parse(argv)``, which must exit as argparse's error does."""
    with pytest.raises(SystemExit) as e:
        parse(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


@pytest.fixture
def no_suite(monkeypatch):
    """bench.__main__.run recording its calls instead of running a suite."""
    calls = []
    monkeypatch.setattr(bench_main, "run", lambda *a: calls.append(a))
    return calls


def fake_suites(monkeypatch, results):
    """bench.__main__.run's modules replaced: module NAME writes ``results[NAME] = (status, records)``."""
    def module(name):
        status, records = results[name]

        def main(argv):
            with open(argv[argv.index("--json") + 1], "w") as f:
                json.dump(records, f)
            return status
        return types.SimpleNamespace(main=main)
    monkeypatch.setattr(bench_main, "importlib", types.SimpleNamespace(import_module=module))


# 1. python -m tppasm cache clear --only ""

def test_clear_with_an_empty_only_is_refused_and_clears_nothing(tmp_path, capsys):
    with tc.using(tmp_path / "cache"):
        tc.remember("fixtest", "k", {"v": 1})
        assert tppasm_main(["cache", "clear", "--only", ""]) == 2
        assert "namespace ''" in capsys.readouterr().err
        assert tc.recall("fixtest", "k") == {"v": 1}


# 2. a failing suite

def test_a_failing_suite_writes_the_records_then_exits_non_zero(tmp_path, monkeypatch, capsys):
    fake_suites(monkeypatch, {"bench.a": (0, [{"table": "t", "v": 1}]), "bench.b": (1, [])})
    out = tmp_path / "run.json"
    with pytest.raises(SystemExit, match=r"failed: bench.b \(exit status 1\)") as e:
        bench_main.run(["bench.a", "bench.b"], [], str(out))
    assert "bench.a" not in str(e.value.code)
    assert [r["v"] for r in json.loads(out.read_text())] == [1]


# 3-6. --json and --plot refused up front

@pytest.mark.parametrize("argv, words", [
    (["gemm", "--json", "{tmp}/x.png", "--plot", "{tmp}/x.png"], "--json and --plot name the same file"),
    (["gemm", "--json", "{tmp}/x.png", "--plot", "{tmp}/./x.png"], "--json and --plot name the same file"),
    (["gemm", "--js", "{tmp}/x.json"], "--js: write --json in full"),
    (["gemm", "--quick", "--jso={tmp}/x.json"], "--jso: write --json in full"),
    (["gemm", "--pl", "{tmp}/x.png"], "--pl: write --plot in full"),
    (["gemm", "--json", "{tmp}/a.json", "--json={tmp}/b.json"], "--json is given 2 times: give it once"),
    (["gemm", "--plot", "{tmp}/a.png", "--plot", "{tmp}/b.png"], "--plot is given 2 times"),
    (["gemm", "--plot", "{tmp}/run.pgf"], "through a TeX system"),
    (["pool", "--plot", "{tmp}/run.png"], "--plot: the pool suite has no GFLOP/s per shape to draw"),
    (["isa", "--plot", "{tmp}/run.png"], "drop --plot"),
])
def test_json_and_plot_that_could_not_work_are_refused_up_front(capsys, tmp_path, no_suite, argv, words):
    pytest.importorskip("matplotlib")
    err = refused(capsys, bench_main.main, [a.format(tmp=tmp_path) for a in argv])
    assert words in err and "usage: python -m bench" in err
    assert no_suite == []


def test_plot_still_takes_the_suites_that_draw(tmp_path, no_suite):
    pytest.importorskip("matplotlib")
    for suite in ("tpp", "gemm", "all"):
        assert bench_main.main([suite, "--plot", str(tmp_path / "p.svg")]) == 0
    assert bench_main.main(["bert", "--p"]) == 0             # bert's own --profile, not --plot
    assert [c[1] for c in no_suite] == [[], [], [], ["--p"]]


def test_a_drawing_error_is_one_line_after_the_records(tmp_path, monkeypatch):
    fake_suites(monkeypatch, {"bench.a": (0, [{"table": "t", "x": "1", "gflops": 1.0}])})
    monkeypatch.setattr(bench_main, "plot", lambda *a: (_ for _ in ()).throw(RuntimeError("'xelatex' not found")))
    out = tmp_path / "run.json"
    with pytest.raises(SystemExit, match=r"cannot draw .*run.png: RuntimeError: 'xelatex' not found"):
        bench_main.run(["bench.a"], [], str(out), str(tmp_path / "run.png"))
    assert len(json.loads(out.read_text())) == 1


def test_a_plot_with_nothing_to_draw_removes_the_old_one_and_fails(tmp_path, monkeypatch):
    fake_suites(monkeypatch, {"bench.a": (0, [{"table": "t", "v": 1}])})
    old = tmp_path / "run.png"
    old.write_bytes(b"an earlier run's plot")
    with pytest.raises(SystemExit, match=r"--plot .*run.png \(no GFLOP/s records to draw; not written\)"):
        bench_main.run(["bench.a"], [], None, str(old))
    assert not old.exists()


def test_tpp_brgemm_records_are_drawn(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from bench import common, tpp_gemm
    rec = {"what": "brgemm f32", "gflops": 50.0, "best_gflops": 60.0, "numpy_gflops": 40.0, "jit_ms": 1.0,
           "numpy_ratio_interleaved": 1.25,
           "pct_peak_interleaved": 50.0, "pct_peak_interleaved_q90": 60.0, "numpy_pct_fp32_peak_interleaved_q90": 40.0}
    monkeypatch.setattr(tpp_gemm, "unit_peak", lambda dtype, unit: (100.0, 110.0))
    monkeypatch.setattr(tpp_gemm, "bench_brgemm", lambda *a: dict(rec))
    monkeypatch.setattr(tpp_gemm, "LOOPS", {("f32", "FMA"): None, ("f32", tpp_gemm.peaks.kernel_unit("f32")): None})
    monkeypatch.setattr(tpp_gemm, "bench_call_overhead", lambda rng: {"us": 1.0, "best_us": 1.0, "numpy_us": 1.0,
                                                                      "numpy_best_us": 1.0})
    monkeypatch.setattr(tpp_gemm, "jit_times", lambda: {"n": 1, "median_ms": 1.0, "max_ms": 1.0, "wall_max_ms": 1.0})
    out = tmp_path / "tpp.json"
    tpp_gemm._run(tpp_gemm.parse(["--quick", "--json", str(out)]), None)
    records = json.loads(out.read_text())
    assert [r["x"] for r in records if "x" in r] == ["f32 64^3 x16"]
    drawn = []
    monkeypatch.setattr("matplotlib.axes.Axes.bar", lambda ax, *a, label=None, **k: drawn.append(label))
    assert common.plot(records, str(tmp_path / "tpp.png")) == 1
    assert drawn == ["tppasm", "best", "numpy"]           # the peaks (peak_gflops, best_peak_gflops): the line


# 7. repeated items

@pytest.mark.parametrize("module, argv", [
    ("gemm", ["--sizes", "8,8x8x8"]),
    ("linear", ["--shapes", "1x16x16,1x16x16"]),
    ("bert", ["--shapes", "1x32,1X32"]),
    ("spmm", ["--sparsities", "0.5,0.50"]),
    ("tpp_gemm", ["--shapes", "f32:64:16,f32:064:16"]),
])
def test_a_repeated_item_is_refused(capsys, module, argv):
    import importlib
    err = refused(capsys, importlib.import_module(f"bench.{module}").parse, argv)
    assert "comma separated, each once" in err and "Traceback" not in err


# 8. small things

def test_bench_main_docstring_examples_pass():
    assert doctest.testmod(bench_main).failed == 0


@pytest.mark.parametrize("command", [["tppasm", "info"], ["bench", "all", "--help"]])
def test_a_closed_pipe_is_quiet(command):
    read, write = os.pipe()
    os.close(read)                      # the reader has left before the first line
    try:
        proc = subprocess.run([sys.executable, "-m", *command], stdout=write, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT, timeout=60)
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_jit_table_rows_are_told_apart():
    from bench.tpp_eltwise import jit_label
    from tppasm.eltwise import Unary
    labels = [jit_label(Unary("copy", 4, 8)), jit_label(Unary("copy", 4, 8, dtype="f32", out_dtype="bf16")),
              jit_label(Unary("relu", 4, 8)), jit_label(Unary("relu", 4, 8, bitmask=True))]
    assert labels == ["unary copy", "unary copy f32->bf16", "unary relu", "unary relu bitmask"]


def test_quick_dram_table_names_its_size(monkeypatch):
    from bench import tpp_eltwise
    reports = []
    for name in ("bandwidth", "fused_gelu", "transpose", "jit_times"):
        monkeypatch.setattr(tpp_eltwise, name, lambda *a: None)
    monkeypatch.setattr(tpp_eltwise, "_torch", lambda: None)
    monkeypatch.setattr(tpp_eltwise, "write_json", lambda path, reps: reports.extend(reps))
    tpp_eltwise.main(["--quick"])
    assert "element-wise, 16M fp32 (2048 x 8192, 64 MiB per array)" in [r.title for r in reports]


@pytest.mark.parametrize("from_disk, words", [(False, "JIT'd BRGEMM 32x32x32, "),
                                               (True, "loaded BRGEMM 32x32x32 from the disk cache, ")])
def test_the_demo_says_when_its_kernel_came_from_the_cache(monkeypatch, capsys, from_disk, words):
    import tppasm
    import tppasm.timing
    from tppasm.__main__ import demo
    real = tppasm.brgemm

    def brgemm(**kw):                   # the real kernel, loaded from the disk or not as the case says
        kernel = real(**kw)
        return type("Kernel", (), {"raw": kernel.raw, "from_disk": from_disk,
                                   "__call__": lambda self, *a, **k: kernel(*a, **k)})()
    monkeypatch.setattr(tppasm, "brgemm", brgemm)
    monkeypatch.setattr(tppasm.timing, "median_time", lambda fn: (fn(), 1e-6)[1])
    assert demo() == 0
    assert capsys.readouterr().out.split("\n")[1].startswith(words)


@pytest.mark.parametrize("module, words", [
    ("gemm", "--no-progress        no progress bar"), ("pool", "runs per row"),
    ("pool", "the Python-thread rows run a tenth"), ("spmm", "fractions of zero blocks"),
    ("linear", "timed rounds per row"),
])
def test_help_lines(capsys, module, words):
    import importlib
    with pytest.raises(SystemExit):
        importlib.import_module(f"bench.{module}").parse(["--help"])
    assert " ".join(words.split()) in " ".join(capsys.readouterr().out.split())


def test_suite_help_names_json_and_plot(capsys, no_suite):
    assert bench_main.main(["pool", "--help"]) == 0
    assert "python -m bench pool also takes --json FILE" in capsys.readouterr().out
    assert bench_main.main(["gemm", "-h"]) == 0
    assert "and --plot FILE.png (draw their GFLOP/s per shape)" in capsys.readouterr().out


def test_cache_commands_report_a_bad_directory_in_one_line(tmp_path, monkeypatch, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv("TPPASM_CACHE_DIR", str(afile))
    tc.reset()
    try:
        with warnings.catch_warnings(record=True) as escaped:    # what would print as a raw RuntimeWarning
            warnings.simplefilter("always")
            assert tppasm_main(["cache", "info"]) == 0
    finally:
        tc.reset()
    out, err = capsys.readouterr()
    assert "is not a directory" in out and escaped == []
    assert err.startswith("python -m tppasm cache: tppasm: not using the kernel cache: ") and err.count("\n") == 1


def test_cache_info_does_not_create_the_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TPPASM_CACHE_DIR", str(tmp_path / "missing"))
    monkeypatch.setenv("TPPASM_CACHE", "1")
    tc.reset()
    try:
        assert tppasm_main(["cache", "info"]) == 0
    finally:
        tc.reset()
    assert "not created yet" in capsys.readouterr().out and not (tmp_path / "missing").exists()


def test_notebook_hypothesis_tests_keep_no_database():
    book = json.loads((ROOT / "notebooks" / "04-new-fused-kernel.ipynb").read_text())
    lines = [line for cell in book["cells"] if cell["cell_type"] == "code" for line in cell["source"]]
    settings = [line for line in lines if line.startswith("@settings(")]
    assert settings and all("database=None" in line for line in settings)


SUITE_PARSERS = ["amx_micro", "amx_static", "amx_variants", "bert", "cache", "conv", "ddp_mlp", "gemm", "isa",
                 "linear", "llm", "make_minilm_reference", "mlp", "peaks", "pool", "spmm", "sve_static", "tpp_gemm",
                 "tpp_eltwise", "tune_score", "x86_static"]


@pytest.mark.parametrize("module", SUITE_PARSERS)
def test_a_suite_run_directly_takes_no_abbreviations(capsys, module):
    """``python -m bench.gemm --js F`` would have written F as --json; argparse's abbreviations are off."""
    import importlib
    mod = importlib.import_module(f"bench.{module}")
    parse = getattr(mod, "parse", None) or mod.main
    assert "unrecognized arguments: --he" in refused(capsys, parse, ["--he"])


@pytest.mark.parametrize("record, words", [
    ({"spec": "A", "knobs": {}, "seconds": 10 ** 400}, '"seconds": 1000'),          # past a float: its JSON
    ({"spec": "A\x1b]0;title\x07", "key": ["k\r\nx"], "knobs": {"m": "\x1b[2J"}, "seconds": 0.001},
     "k\\r\\nx -> A\\x1b]0;title\\x07 m=\\x1b[2J")])
def test_cache_list_shows_every_record_on_one_escaped_line(tmp_path, monkeypatch, capsys, record, words):
    monkeypatch.setenv("TPPASM_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("TPPASM_CACHE", "1")
    tc.reset()
    try:
        assert tc.remember("tune", "one", record) and tc.remember("tune", "two", {"spec": "B", "seconds": 1})
        assert tppasm_main(["cache", "list"]) == 0
    finally:
        tc.reset()
    out = capsys.readouterr().out
    assert words in out and "\x1b" not in out and len(out.splitlines()) == 2


def test_cache_list_json_is_strict_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TPPASM_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("TPPASM_CACHE", "1")
    tc.reset()
    try:
        assert tc.remember("tune", "nan", {"spec": "A", "seconds": float("nan"), "runs": [float("inf"), 1.0]})
        assert tppasm_main(["cache", "list", "--json"]) == 0
    finally:
        tc.reset()
    listing = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"bare {c}"))
    assert listing[0]["record"] == {"spec": "A", "seconds": None, "runs": [None, 1.0]}


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_json_file_where_no_file_can_be_made_is_refused_before_the_run_even_as_root():
    """os.access says yes to root everywhere; /proc takes no new file, so `--json /proc/x.json` failed only
    after the whole run. The check tries to make one (a file that vanishes) instead."""
    from bench.options import writable_file
    with pytest.raises(Exception, match="cannot create a file in '/proc'"):
        writable_file("--json run.json")("/proc/tppasm-x.json")
    assert not os.path.exists("/proc/tppasm-x.json")


def test_tpp_shapes_win_over_quick(tmp_path, monkeypatch):
    """`bench tpp --quick --shapes bf16:64:16` ran fp32 64^3 x 16 only: --quick silently dropped --shapes."""
    from bench import tpp_gemm
    ran = []
    rec = {"what": "brgemm", "gflops": 1.0, "best_gflops": 1.0, "numpy_gflops": 1.0, "jit_ms": 1.0,
           "numpy_ratio_interleaved": 1.0, "pct_peak_interleaved": 1.0, "pct_peak_interleaved_q90": 1.0,
           "numpy_pct_fp32_peak_interleaved_q90": 1.0}
    monkeypatch.setattr(tpp_gemm, "unit_peak", lambda dtype, unit: (100.0, 110.0))
    monkeypatch.setattr(tpp_gemm, "bench_brgemm", lambda size, count, dtype, *a: ran.append((size, count, dtype))
                        or dict(rec))
    monkeypatch.setattr(tpp_gemm, "LOOPS", collections.defaultdict(lambda: None))
    monkeypatch.setattr(tpp_gemm, "bench_call_overhead", lambda rng: {"us": 1.0, "best_us": 1.0, "numpy_us": 1.0,
                                                                      "numpy_best_us": 1.0})
    monkeypatch.setattr(tpp_gemm, "jit_times", lambda: {"n": 1, "median_ms": 1.0, "max_ms": 1.0, "wall_max_ms": 1.0})
    tpp_gemm._run(tpp_gemm.parse(["--quick", "--shapes", "bf16:64:16"]), None)
    assert ran == [(64, 16, "bf16")]
