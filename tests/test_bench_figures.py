"""The benches' figures from fixed times: the formulas, labels and JSON fields of "% peak", the
thread-scaling and ratio columns, never a speed. Every timer (or the interleaving that calls it)
is replaced by one returning chosen seconds, and the printed rows are checked against them."""
import math
import types

import numpy as np
import pytest

from bench import peaks
from bench.common import over_peak_mark

torch = pytest.importorskip("torch")


def no_wall_clock_peak(monkeypatch):
    """The wall-clock peak (peaks.peak_stats) must not be what a figure is divided by."""
    def refuse(*args, **kwargs):
        raise AssertionError("peaks.peak_stats: a wall-clock peak, not timed beside the kernel")
    monkeypatch.setattr(peaks, "peak_stats", refuse)
    import bench.versus
    monkeypatch.setattr(bench.versus, "_PEAKS", {})


# -- 1, 4: linear's % peak is of the peak loop on its threads, timed beside it on its clock -----------------

LINEAR_COLUMNS = ["dtype", "n x k -> m", "path", "ms ours", "ms torch", "torch/ours", "torch/frozen", "GFLOP/s",
                  "% peak", "weight GB/s", "max rel. diff"]


def test_linear_peak_is_the_loop_on_its_threads_in_the_same_rounds(monkeypatch):
    from bench import linear
    from bench.common import Report
    no_wall_clock_peak(monkeypatch)
    asked = []

    def fake_versus(ours, theirs, rounds=11, seconds=0.02, peak_loop=None):
        asked.append(peak_loop)
        return (2e-3, 4e-3, 2.0) + ((0.25,) if peak_loop else ())
    monkeypatch.setattr(linear, "versus", fake_versus)
    rep = Report("t", LINEAR_COLUMNS)
    linear.bench_shape(rep, torch, 2, 4, 8, 16, "f32", False, 3)
    row = rep.rows[0]
    flops = 2 * 4 * 8 * 16
    assert row["% peak"] == 25.0
    assert row["peak_gflops"] == pytest.approx(flops / 2e-3 / 1e9 / 0.25)
    loop_work = peaks.peak_loop_on(2, "f32", peaks.kernel_unit("f32"))[1]     # 2 threads' loop, not 2 x 1 core
    assert asked[0][1] == pytest.approx(flops / loop_work)


# -- 2: linear --backward checks the gradients -----------------------------------------------------------

class _WrongGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        return torch.nn.functional.linear(x, w, b)

    @staticmethod
    def backward(ctx, dy):
        return torch.full((dy.shape[0], 8), 123.0), torch.zeros(16, 8), torch.zeros(16)


def test_linear_backward_refuses_wrong_gradients(monkeypatch):
    from bench import linear
    from bench.common import Report
    import tppasm.torch.ops as ops
    monkeypatch.setattr(ops, "linear", lambda x, w, b: _WrongGradient.apply(x, w, b))
    monkeypatch.setattr(linear, "versus", lambda *a, **k: pytest.fail("timed before the check"))
    with pytest.raises(AssertionError, match=r"x\.grad differs from torch's"):
        linear.bench_shape(Report("t", LINEAR_COLUMNS), torch, 1, 4, 8, 16, "f32", True, 3)


def test_linear_backward_compares_every_gradient():
    from bench.linear import max_difference
    y = torch.ones(2)
    same = {"y": y, "x.grad": y, "w.grad": y, "b.grad": y}
    assert max_difference(same, same, 1e-4, "t") == 0.0
    with pytest.raises(AssertionError, match=r"b\.grad differs"):
        max_difference({**same, "b.grad": 2 * y}, same, 1e-4, "t")
    with pytest.raises(AssertionError, match=r"w\.grad is missing \(ours\)"):
        max_difference({**same, "w.grad": None}, same, 1e-4, "t")


# -- 1: bert --profile divides by the peak loop timed in its own interleaving, on its clock ----------------

def test_bert_profile_times_the_peak_in_its_interleaving_on_its_clock(monkeypatch):
    from bench import bert
    from bench.models.minilm import LAYERS
    no_wall_clock_peak(monkeypatch)
    got = {}

    def fake(fns, runs, min_run=0.05, clock="wall", settle=None):
        got["clock"], got["n"] = clock, len(fns)
        steps = [np.array([1e-4, 2e-4, 1e-4])] * (len(fns) - 2)
        return [np.array([1e-2, 1e-2, 2e-2])] + steps + [np.array([1e-3, 2e-3, 4e-3])]
    monkeypatch.setattr(bert, "interleaved", fake)
    rep = bert.profile_bert([(1, 8)], [1], ["f32"], 3, clock="cpu")
    assert got["clock"] == "cpu"
    work = peaks.peak_loop_on(1, "f32")[1]
    rate = work / np.array([1e-3, 2e-3, 4e-3])
    flops = bert.step_flops(1, 8)
    qkv = next(r for r in rep.rows if r["step"] == "qkv")
    assert qkv["% peak"] == pytest.approx(100 * np.median(flops["qkv"] / np.array([1e-4, 2e-4, 1e-4]) / rate))
    fwd = next(r for r in rep.rows if r["step"] == "forward")
    total = sum(flops.values()) * LAYERS
    assert fwd["% peak"] == pytest.approx(100 * np.median(total / np.array([1e-2, 1e-2, 2e-2]) / rate))


# -- 3, 5, 6: gemm's nT/1T, peak_gflops and flagged q90 ---------------------------------------------------

def test_gemm_scaling_is_against_the_one_thread_row_in_any_order(monkeypatch, torch_threads):
    import bench.common
    from bench import gemm
    tg = gemm.tg
    row_threads, tuned_time = [], {}
    real_pool_of = gemm.pool_of
    monkeypatch.setattr(gemm, "pool_of", lambda n: row_threads.append(n) or real_pool_of(n))
    seconds = {1: 1.0, 2: 0.5}

    def fake(fns, rounds, seconds_each=0.03):
        now = seconds[row_threads[-1]]
        out = [np.full(3, now)] + [np.full(3, tuned_time.get(id(f), 1.0)) for f in fns[1:]]
        tuned_time[id(fns[0])] = now
        return out
    monkeypatch.setattr(bench.common, "_interleaved", fake)
    monkeypatch.setattr(gemm, "use_threads", lambda n, torch=None: None)
    monkeypatch.setattr(gemm, "peak_scaling", lambda dtype, n, rounds: 1.8)
    monkeypatch.setattr(gemm, "dtype_peak", lambda dtype: (40.0, "loop", 1.0))
    monkeypatch.setattr(tg, "interleaved_ratios", lambda fn, work, loop, rounds, seconds: [0.5] * 13 + [1.6, 1.7])
    rep = gemm.bench_gemm([(8, 8, 8)], [2, 1], ["f32"], True, 0, bar=False)
    assert "nT/1T" in rep.columns and "peak nT/1T" in rep.columns and "2T/1T" not in rep.columns
    one, two = rep.rows
    assert (one["threads"], two["threads"]) == (1, 2)
    assert two["nT/1T"] == 2.0 and two["peak nT/1T"] == 1.8 and math.isnan(one["nT/1T"])
    # 1 thread: %pk is the median ratio, peak_gflops the peak it is of; q90 over 100 is flagged, the number kept
    assert one["%pk"] == 50.0 and one["peak_gflops"] == pytest.approx(one["gflops"] / 0.5)
    assert one["q90"] == pytest.approx(116.0)
    # 2 threads: the peak loop's rate on 2 threads in the row's rounds (its call took 1 s)
    loop_work = peaks.peak_loop_on(2, "f32", peaks.kernel_unit("f32"))[1]
    assert two["peak_gflops"] == pytest.approx(loop_work / 1e9)
    assert two["gflops"] / two["peak_gflops"] == pytest.approx(two["%pk"] / 100)


def test_gemm_q90_over_100_is_marked(capsys):
    from bench.common import peak_cell
    from bench.tpp_gemm import percent_cell
    assert peak_cell(116.0) == "116.0!" and peak_cell(90.0) == 90.0
    assert percent_cell(163.0, 6) == " 163%!" and percent_cell(95.0, 6) == "   95%"


# -- 6: the interleaved ratios leave out the time other processes took -----------------------------------

def test_interleaved_ratios_leave_out_a_preempted_peak_turn(monkeypatch):
    clock = {"cpu": 0.0, "wall": 0.0}
    fake_time = types.SimpleNamespace(thread_time=lambda: clock["cpu"], perf_counter=lambda: clock["wall"])

    def runs(cpu, wall):
        def fn():
            clock["cpu"] += cpu
            clock["wall"] += wall
        return fn
    monkeypatch.setattr(peaks, "time", fake_time)
    monkeypatch.setattr(peaks, "calibrate", lambda fn, seconds: 1)
    # the kernel runs at the loop's rate; the loop's turns lose 2/3 of the wall clock to another process
    ratios = peaks.interleaved_ratios(runs(1.0, 1.0), 1.0, (runs(1.0, 3.0), 1.0), rounds=5)
    assert ratios == [1.0] * 5
    assert over_peak_mark(100.0) == "" and over_peak_mark(100.5) == "!"


# -- 3, 4, 5, 7: mlp's ratios are medians of per-round ratios; its peak is the loop on its threads ----------

def test_mlp_ratios_are_medians_of_per_round_ratios(monkeypatch, torch_threads):
    from bench import mlp
    row_threads = []
    real_pool_of = mlp.pool_of
    monkeypatch.setattr(mlp, "pool_of", lambda n: row_threads.append(n) or real_pool_of(n))
    tuned = {1: [1.0, 1.0, 1.0], 2: [0.5, 0.5, 0.5]}

    def fake(fns, runs, min_run=0.05):
        # tuned, aBC (1, 1, 4), torch (1, 4, 4), the peak loop (2 s a call), the 1-thread row's tuned
        out = [tuned[row_threads[-1]], [1.0, 1.0, 4.0], [1.0, 4.0, 4.0], [2.0, 2.0, 2.0], [1.0, 1.0, 1.0]]
        return [np.array(x) for x in out[:len(fns)]]
    monkeypatch.setattr(mlp, "interleaved", fake)
    monkeypatch.setattr(mlp, "use_threads", lambda n, torch=None: None)
    rep = mlp.bench_mlp(8, 16, 1, [2, 1], ["f32"], True, 0, bar=False)
    assert "nT/1T" in rep.columns and "2T/1T" not in rep.columns
    one, two = rep.rows
    assert (one["threads"], two["threads"]) == (1, 2)
    assert one["aBC/torch"] == 1.0            # the medians' ratio would say 4.0
    assert one["tuned/torch"] == 4.0 and two["tuned/torch"] == 8.0
    assert math.isnan(one["nT/1T"]) and two["nT/1T"] == 2.0
    for row in (one, two):
        loop_work = peaks.peak_loop_on(row["threads"], "f32", peaks.kernel_unit("f32"))[1]
        assert row["peak_gflops"] == pytest.approx(loop_work / 2.0 / 1e9)


# -- 8: labels ----------------------------------------------------------------------------------------------

def test_conv_table_says_its_flops_are_nominal():
    from bench.conv import layers_report
    assert "nominal flops" in layers_report(1).title and "over 100%" in layers_report(1).title


def test_llm_ceiling_table_says_gop_for_int8():
    from bench.llm import ceiling_report
    rep = ceiling_report()
    assert "GFLOP (i8: GOP)" in rep.columns and "peak GFLOP/s (i8: GOP/s)" in rep.columns
