"""python -m bench's shared layer: one JSON file per run with every module's records, and the plot."""
import json
import sys
import types

import pytest

import bench.__main__ as bench_main
from bench.common import Report, plot, write_json


def fake_suite(name, rows):
    mod = types.ModuleType(name)

    def main(argv):
        path = argv[argv.index("--json") + 1]
        rep = Report(f"table of {name}", ["shape", "GFLOP/s"])
        for x, g in rows:
            rep.add(x, g, x=x, gflops=g, numpy_gflops=g / 2, peak_gflops=10.0)
        write_json(path, [rep])
    mod.main = main
    sys.modules[name] = mod
    return name


def test_a_suite_of_several_modules_writes_exactly_one_file(tmp_path, monkeypatch):
    names = [fake_suite("bench_fake_one", [("64", 1.0), ("128", float("nan"))]),
             fake_suite("bench_fake_two", [("256", 3.0)])]
    out = tmp_path / "run.json"
    try:
        bench_main.run(names, [], str(out), None)
    finally:
        for n in names:
            sys.modules.pop(n)
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]
    records = json.loads(out.read_text())          # strict JSON: NaN became null
    assert [r["suite"] for r in records] == ["bench_fake_one", "bench_fake_one", "bench_fake_two"]
    assert records[1]["gflops"] is None and records[0]["host"] and records[0]["isa"]


def test_plot_draws_a_panel_per_table_with_gflops(tmp_path):
    pytest.importorskip("matplotlib")
    records = [{"table": "t1", "x": "64", "gflops": 1.0, "numpy_gflops": 0.5, "peak_gflops": 2.0},
               {"table": "t1", "x": "128", "gflops": 1.5, "peak_gflops": 2.0},
               {"table": "t2", "x": "a", "gflops": 3.0},
               {"table": "t3", "other": 1}]
    path = tmp_path / "p.png"
    assert plot(records, str(path)) == 2
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot(records[3:], str(tmp_path / "none.png")) == 0


def test_flags_are_taken_out_of_the_suite_arguments():
    own, rest = bench_main.split(["--quick", "--json", "a.json", "--plot", "a.png", "--threads", "1"])
    assert own == ["--json", "a.json", "--plot", "a.png"] and rest == ["--quick", "--threads", "1"]
    assert bench_main.split(["--json"]) == (["--json"], [])       # argparse then says it needs a file name
