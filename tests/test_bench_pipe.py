"""python -m bench with a stdout whose reader leaves (``| head -1``), and the header's peak under
``--clock cpu`` (review fz15b items 2 and 3)."""
import json
import pathlib
import subprocess
import sys
import textwrap
import types
from argparse import Namespace

import numpy as np
import pytest

import bench.__main__ as bench_main
from bench import peaks, versus

ROOT = pathlib.Path(__file__).resolve().parents[1]

# a stand-in suite module printing many rows (what fills a pipe), then writing one record to its --json
FAKE_SUITE = textwrap.dedent('''
    import json, runpy, sys, types
    def main(argv):
        for i in range(200000):
            print("row", i)
        with open(argv[argv.index("--json") + 1], "w") as f:
            json.dump([{"gflops": 1.0}], f)
        return 0
    fake = types.ModuleType("bench.linear")
    fake.main = main
    sys.modules["bench.linear"] = fake
    sys.argv = ["bench", "linear", "--json", sys.argv[1]]
    runpy.run_module("bench", run_name="__main__", alter_sys=True)
''')


def test_a_reader_that_leaves_ends_the_run_quietly_with_status_141(tmp_path):
    out = tmp_path / "run.json"
    proc = subprocess.Popen([sys.executable, "-c", FAKE_SUITE, str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout.readline() == b"row 0\n"
    proc.stdout.close()                                   # as head -1 does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and "cannot write" not in err and "run.json" not in err, err
    assert not out.exists()                               # no empty [] in place of the records


def _suite(monkeypatch, name, main):
    module = types.ModuleType(name)
    module.main = main
    monkeypatch.setitem(sys.modules, name, module)


def test_run_module_raises_on_a_broken_pipe(monkeypatch, capsys):
    def main(argv):
        raise BrokenPipeError(32, "Broken pipe")
    _suite(monkeypatch, "fake_pipe_suite", main)
    with pytest.raises(BrokenPipeError):
        bench_main.run_module("fake_pipe_suite", [])
    assert "Traceback" not in capsys.readouterr().err


class _ClosedStdout:
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass


def test_a_closed_stdout_after_the_records_does_not_blame_the_json_file(monkeypatch, tmp_path):
    def main(argv):
        with open(argv[argv.index("--json") + 1], "w") as f:
            json.dump([{"gflops": 2.0}], f)
        return 0
    _suite(monkeypatch, "fake_records_suite", main)
    path = tmp_path / "run.json"
    monkeypatch.setattr(sys, "stdout", _ClosedStdout())
    with pytest.raises(BrokenPipeError):                 # not SystemExit("cannot write run.json ...")
        bench_main.run(["fake_records_suite"], [], str(path))
    assert json.loads(path.read_text())[0]["gflops"] == 2.0


def test_the_header_prints_the_peak_on_the_cpu_clock(monkeypatch, capsys):
    """--clock cpu: the peak is timed on the thread's CPU time, as the table's % peak is, not on the wall."""
    def wall(*args, **kwargs):
        raise AssertionError("the wall clock's peak was measured")
    monkeypatch.setattr(peaks, "peak_stats", wall)
    monkeypatch.setattr(peaks, "peak_loop", lambda dtype, unit: ((lambda: None), 4e9))
    clocks = []

    def interleaved(fns, runs, min_run, clock, settle=None):
        clocks.append(clock)
        return [np.array([0.04, 0.02, 0.03])]
    monkeypatch.setattr(versus, "interleaved", interleaved)
    monkeypatch.setattr(versus, "_PEAKS", {})
    monkeypatch.setattr(versus, "_clock", ["wall"])
    monkeypatch.setattr(versus, "torch_or_none", lambda: types.SimpleNamespace(set_num_threads=lambda n: None))
    versus.setup(Namespace(threads=1, clock="cpu"))
    out = capsys.readouterr().out
    assert "peak per core measured on the cpu clock: fp32 200.0, bf16 200.0 GFLOP/s" in out
    assert set(clocks) == {"cpu"}


def test_the_wall_clock_peak_is_the_best_of_peak_stats(monkeypatch):
    monkeypatch.setattr(peaks, "peak_stats", lambda dtype, unit: (10.0, 12.5))
    monkeypatch.setattr(versus, "_PEAKS", {})
    monkeypatch.setattr(versus, "_clock", ["wall"])
    assert versus.peak("f32") == 12.5
