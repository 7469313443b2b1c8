"""Audit of the benches' figures (issue #12): every % of peak is of the dtype's own unit (the
instruction the kernel runs, measured on this host), every figure follows from the others in its
record, and the printed table shows the record's numbers. Timers are replaced by fixed seconds
and peaks by chosen rates that differ per unit, so dividing by the wrong peak changes a figure;
no speed is asserted."""
import json
import math
import types

import numpy as np
import pytest

from bench import peaks
from isa.cpu import host

torch = pytest.importorskip("torch")

# what one instruction of each unit's loop does, in flops (int8: ops) per 32-bit lane, counted by hand
OPS_PER_LANE = {"FMA": ("vfmadd231ps", 2), "BF16-dot": ("vdpbf16ps", 4), "VNNI": ("vpdpbusd", 8),
                "u7": ("vpmaddubsw", 8), "madd": ("vpmaddwd", 4)}
# chosen peaks (median, best) per (dtype, unit): all different, so a figure names the peak it used
FAKE_PEAKS = {("f32", "FMA"): (80.0, 90.0), ("bf16", "FMA"): (81.0, 91.0), ("bf16", "BF16-dot"): (200.0, 220.0),
              ("i8", "VNNI"): (400.0, 440.0), ("i8", "u7"): (250.0, 260.0), ("i8", "madd"): (150.0, 160.0),
              ("bf16", "AMX"): (3000.0, 3100.0), ("i8", "AMX"): (6000.0, 6100.0)}


@pytest.fixture
def fake_peaks(monkeypatch):
    """peaks.peak_stats returns FAKE_PEAKS; nothing is timed."""
    monkeypatch.setattr(peaks, "peak_stats", lambda dtype="f32", unit=None, runs=9: FAKE_PEAKS[dtype, unit])


# -- the peak loops: work per call is what their instructions do --------------------------------------------

@pytest.mark.parametrize("isa, unit", [(i, u) for i in ("avx512", "avx2") for u in OPS_PER_LANE
                                       if not (i == "avx2" and u == "BF16-dot")])
def test_peak_loop_work_is_what_its_instructions_do(isa, unit):
    from isa.x86.interp import Machine
    fn, per_trip = peaks._vector_loop(unit, isa, 2)
    m = Machine()
    m.call(fn.code, args=[2])
    mnemonic, ops = OPS_PER_LANE[unit]
    lanes = 16 if isa == "avx512" else 8
    assert 2 * per_trip == m.stats.counts[mnemonic] * ops * lanes


def test_amx_peak_loop_work_is_what_its_tdp_do():
    from isa.x86.interp import Machine
    for dtype, mnemonic, k in (("bf16", "tdpbf16ps", 32), ("i8", "tdpbusd", 64)):
        fn, per_trip = peaks.amx_loop(dtype)
        m = Machine()
        m.call(fn.code, args=[1])
        assert per_trip == m.stats.counts[mnemonic] * 16 * 16 * k * 2


# -- which unit a dtype's peak is of, on hosts of every kind -----------------------------------------------

ZEN4 = frozenset({"avx512f", "avx512_bf16", "avx512_vnni"})
HOSTS = [  # (isa, features, {dtype: unit of the kernel}, i8 unit with 7-bit A)
    ("avx512", ZEN4, {"f32": "FMA", "bf16": "BF16-dot", "i8": "VNNI"}, "VNNI"),
    ("avx512", frozenset({"avx512f"}), {"f32": "FMA", "bf16": "FMA", "i8": "madd"}, "u7"),
    ("avx2", ZEN4, {"f32": "FMA", "bf16": "FMA", "i8": "madd"}, "u7"),       # Zen 4 capped at AVX2
    ("avx2", frozenset({"avx_vnni"}), {"f32": "FMA", "bf16": "FMA", "i8": "VNNI"}, "VNNI"),
    ("amx", ZEN4 | {"amx_bf16", "amx_int8"}, {"f32": "FMA", "bf16": "AMX", "i8": "AMX"}, "AMX"),
]


@pytest.mark.parametrize("isa, features, want, u7", HOSTS)
def test_each_dtype_is_measured_on_its_kernels_unit(monkeypatch, isa, features, want, u7):
    monkeypatch.setattr(peaks, "_features", lambda _isa: features)
    for dtype, unit in want.items():
        assert peaks.kernel_unit(dtype, isa) == unit
        assert unit in peaks.units(dtype, isa)                  # a unit this host has: its peak is measured
        if dtype != "i8":
            assert peaks.best_unit(dtype, isa) == unit          # bert and llm divide by the best unit's peak
    assert peaks.kernel_unit("i8", isa, a_bits=7) == u7 == peaks.best_unit("i8", isa)
    if isa == "avx2":           # AVX2 kernels: no zmm dot products behind their figures
        assert not {"BF16-dot", "AMX"} & set(peaks.units("bf16", isa) + peaks.units("i8", isa))
        assert "VNNI" not in peaks.units("i8", isa) or "avx_vnni" in features
    if isa != "amx":
        assert "AMX" not in peaks.units("bf16", isa) + peaks.units("i8", isa)


def test_llm_int8_peak_is_its_kernels_unit():
    """bench.llm takes the best unit's peak; its int8 layers quantize A to activation_bits()."""
    from bench.models.llama_weights import activation_bits
    assert peaks.best_unit("i8") == peaks.kernel_unit("i8", a_bits=activation_bits())


def test_no_amx_here_no_amx_peak():
    if host().isa == "amx":
        pytest.skip("this host has AMX")
    for dtype in ("bf16", "i8"):
        assert "AMX" not in peaks.units(dtype) and peaks.kernel_unit(dtype) != "AMX"
        with pytest.raises(ValueError, match="no AMX unit"):
            peaks.peak_loop(dtype, "AMX")


# -- tpp: % peak of the kernel's unit, the numpy figure of the FMA one; table = JSON -------------------------

def cells(line):
    """The printed row of tpp_gemm's BRGEMM table as its 15 cells (the kernel name is two words)."""
    words = line.split()
    return [" ".join(words[:2])] + words[2:]


def test_tpp_gemm_records_divide_by_the_kernels_unit(monkeypatch, fake_peaks, tmp_path, capsys):
    from bench import tpp_gemm as tg
    t_ours, t_best, t_numpy, t_torch = 1e-4, 0.8e-4, 2e-4, 4e-4
    monkeypatch.setattr(tg, "timings", lambda fn, min_time=0.2, runs=5: (t_ours, t_best))
    # numpy's lambda names np, torch's torch
    monkeypatch.setattr(tg, "median_seconds", lambda fn, min_time=0.2, runs=5:
                        t_numpy if "np" in fn.__code__.co_names else t_torch)
    calls = []

    def fake_ratios(fn, work, loop, rounds=31, seconds=0.01):
        calls.append(loop)                  # ours first, numpy second
        return [0.9, 0.95, 1.2] if len(calls) % 2 else [0.3, 0.4, 0.5]
    monkeypatch.setattr(peaks, "interleaved_ratios", fake_ratios)
    # ours, numpy's and torch's per-round times (rounds alternate): ratios their time over ours, per round
    # (per-round ratios 4, 1, 3 and 2, 6, 6: medians 3 and 6, where the ratios of the medians are 2 and 4)
    rounds = [np.array(t) * 1e-4 for t in ([1.0, 2.0, 3.0], [4.0, 2.0, 9.0], [2.0, 12.0, 18.0])]
    monkeypatch.setattr(tg, "interleaved_rounds", lambda fns, runs, **kw: rounds[:len(fns)])
    out = tmp_path / "tpp.json"
    args = tg.parse(["--shapes", "f32:64:16,bf16:64:16,i8:64:16", "--json", str(out)])
    assert tg._run(args, torch) == 0
    printed = capsys.readouterr().out
    records = json.loads(out.read_text())
    flops = 2.0 * 64 ** 3 * 16
    brgemm = [r for r in records if r["what"].startswith("brgemm")]
    assert [r["what"] for r in brgemm] == ["brgemm f32", "brgemm bf16", "brgemm i8"]
    for i, rec in enumerate(brgemm):
        dtype = rec["what"].split()[1]
        unit = peaks.kernel_unit(dtype)
        med, best = FAKE_PEAKS[dtype, unit]
        assert rec["unit"] == unit and (rec["peak_gflops"], rec["best_peak_gflops"]) == (med, best)
        assert rec["gflops"] == pytest.approx(flops / t_ours / 1e9)
        assert rec["best_gflops"] == pytest.approx(flops / t_best / 1e9)
        assert rec["numpy_gflops"] == pytest.approx(flops / t_numpy / 1e9)
        assert rec["pct_peak"] == pytest.approx(100 * rec["gflops"] / med)
        assert rec["best_pct_peak"] == pytest.approx(100 * rec["best_gflops"] / best)
        assert (rec["pct_peak_interleaved"], rec["pct_peak_interleaved_q90"]) == pytest.approx((95.0, 115.0))
        assert rec["numpy_pct_fp32_peak_interleaved"] == pytest.approx(40.0)
        assert calls[2 * i] is peaks.peak_loop(dtype, unit)            # ours: its own unit's loop
        assert calls[2 * i + 1] is peaks.peak_loop("f32", "FMA")       # numpy's fp32 matmul: the FMA loop
        row = next(cells(line) for line in printed.splitlines() if line.startswith(rec["what"] + " "))
        assert row[1] == unit and float(row[4]) == pytest.approx(rec["gflops"], abs=0.05)
        for cell, pct in ((row[5], rec["pct_peak"]), (row[7], rec["best_pct_peak"]),
                          (row[8], rec["pct_peak_interleaved"]), (row[9], rec["pct_peak_interleaved_q90"])):
            assert cell == f"{pct:.0f}%" + ("!" if pct > 100 else "")      # over 100: marked, never bare
        assert (rec["numpy_ratio_interleaved"], rec["torch_ratio_interleaved"]) == pytest.approx((3.0, 6.0))
        assert (row[12], row[14]) == ("3.00x", "6.00x")
    peak_rows = [r for r in records if r["what"] == "peak"]
    assert {(r["dtype"], r["unit"]) for r in peak_rows} == {(d, u) for d in ("f32", "bf16", "i8")
                                                            for u in peaks.units(d)}
    for r in peak_rows:
        assert r["brgemm_unit"] == (r["unit"] == peaks.kernel_unit(r["dtype"]))
        assert (r["gflops"], r["best_gflops"]) == FAKE_PEAKS[r["dtype"], r["unit"]]


# -- gemm: the loop of the dtype's unit on 1 and n threads ------------------------------------------------

def test_gemm_dtype_peak_is_the_kernels_unit(fake_peaks):
    from bench.gemm import dtype_peak
    for dtype in ("f32", "bf16", "i8"):
        gflops, loop, share = dtype_peak(dtype)
        unit = peaks.kernel_unit(dtype)
        assert (gflops, share) == (FAKE_PEAKS[dtype, unit][1], 1.0)
        assert loop is peaks.peak_loop(dtype, unit)


@pytest.mark.parametrize("dtype", ["bf16", "i8"])
def test_gemm_pct_peak_is_of_the_dtypes_unit_on_each_thread_count(monkeypatch, fake_peaks, torch_threads, dtype):
    import bench.common
    from bench import gemm
    loops = []
    monkeypatch.setattr(gemm.tg, "interleaved_ratios",
                        lambda fn, work, loop, rounds, seconds: loops.append(loop) or [0.6, 0.7, 0.8])
    t_peak = 2.0

    def fake(fns, rounds, seconds_each=0.03):         # every call 1 s; the peak loop's turn (last) t_peak
        return [np.full(3, 1.0) for _ in fns[:-1]] + [np.full(3, t_peak if len(fns) > 3 else 1.0)]
    monkeypatch.setattr(bench.common, "_interleaved", fake)
    monkeypatch.setattr(gemm, "use_threads", lambda n, torch=None: None)
    monkeypatch.setattr(gemm, "peak_scaling", lambda dtype, n, rounds: 1.5)
    rep = gemm.bench_gemm([(32, 32, 32)], [1, 2], [dtype], True, 0, bar=False)
    one, two = rep.rows
    unit = peaks.kernel_unit(dtype)
    assert loops == [peaks.peak_loop(dtype, unit)]           # 1 thread: its unit's loop, not the FMA one
    assert one["%pk"] == pytest.approx(70.0) and one["q90"] == pytest.approx(78.0)
    assert one["peak_gflops"] == pytest.approx(one["gflops"] / 0.7)
    assert two["peak_gflops"] == pytest.approx(peaks.peak_loop_on(2, dtype, unit)[1] / t_peak / 1e9)
    assert two["%pk"] == pytest.approx(100 * two["gflops"] / two["peak_gflops"])
    assert two["gflops"] == pytest.approx(2 * 32 ** 3 / 1.0 / 1e9)
    assert math.isnan(one["numpy"]) and one["torch"] == pytest.approx(one["gflops"])


# -- versus (conv, spmm, linear): ratios and fractions are medians of per-round values ----------------------

def test_versus_takes_medians_of_per_round_ratios(monkeypatch):
    from bench import versus
    ta, tb, tp = [1.0, 1.0, 4.0], [1.0, 4.0, 4.0], [2.0, 1.0, 8.0]
    monkeypatch.setattr(versus, "interleaved", lambda fns, rounds, seconds, clock: [np.array(x) for x in (ta, tb, tp)])
    t_ours, t_theirs, ratio, frac = versus.versus(None, None, peak_loop=(None, 0.5))
    assert (t_ours, t_theirs) == (1.0, 4.0)
    assert ratio == 1.0                         # median of (1, 4, 1); the medians' ratio would say 4
    assert frac == pytest.approx(1.0)           # median of 0.5 * (2, 1, 2): the peak's calls / ours, per round
    loop, factor = versus.peak_loop("bf16", 1e9, 2)
    assert factor == pytest.approx(1e9 / peaks.peak_loop_on(2, "bf16", peaks.kernel_unit("bf16"))[1])


def test_common_interleaved_ratios_are_each_over_the_first(monkeypatch):
    import bench.common as common
    samples = [np.array([1.0, 2.0, 1.0]), np.array([2.0, 2.0, 8.0])]
    monkeypatch.setattr(common, "_interleaved", lambda fns, rounds, seconds: samples)
    times, ratios = common.interleaved([None, None], 3)
    assert times == [1.0, 2.0] and ratios == [1.0, 2.0]      # t(second) / t(first), per round: (2, 1, 8)


def fake_versus(result, asked):
    def run(ours, theirs, rounds=11, seconds=0.02, peak_loop=None):
        asked.append(peak_loop)
        return result + ((0.8,) if peak_loop else ())
    return run


def test_spmm_pct_peak_counts_the_stored_blocks(monkeypatch):
    from bench import spmm
    from bench.common import Report
    asked = []
    monkeypatch.setattr(spmm, "versus", fake_versus((1e-3, 3e-3, 3.0), asked))
    monkeypatch.setattr(spmm, "quick_seconds", lambda fn, seconds=0.01, runs=3: 2e-3)
    rep = Report("t", ["dtype", "block", "sparsity", "stored blocks", "ms ours", "ms torch dense", "ms torch csr",
                       "ms torch bsr", "GFLOP/s (dense-equiv.)", "% peak", "ours/dense"])
    size, block = 64, 16
    for dtype in ("f32", "bf16"):
        nest = spmm.SpmmNest(size, size, size, block, block, dtype, 64)
        for sparsity in (0.5, 1.0):
            spmm.bench_point(rep, size, block, sparsity, dtype, nest, torch, 1, np.random.default_rng(0), 3)
    for row, loop in zip(rep.rows, asked):
        done = 2.0 * row["stored blocks"] * block * block * size
        assert row["GFLOP/s (dense-equiv.)"] == row["gflops"] == pytest.approx(2.0 * size ** 3 / 1e-3 / 1e9)
        assert row["ours/dense"] == 3.0 and row["ms ours"] == pytest.approx(1.0)
        if done:
            assert row["% peak"] == pytest.approx(80.0)
            assert row["peak_gflops"] == pytest.approx(done / 1e-3 / 1e9 / 0.8)
            unit = peaks.kernel_unit(row["dtype"])
            assert loop[1] == pytest.approx(done / peaks.peak_loop_on(1, row["dtype"], unit)[1])
        else:                                   # no block stored: no flops, no peak timed
            assert loop is None and row["% peak"] == 0.0 and row["peak_gflops"] is None


def test_conv_figures_follow_from_the_rounds(monkeypatch, torch_threads):
    from bench import conv
    from bench.conv_nest import Conv
    asked = []
    monkeypatch.setattr(conv, "versus", fake_versus((2e-3, 3e-3, 1.5), asked))
    monkeypatch.setattr(conv, "FRESH", True)
    torch.set_num_threads(1)
    shape = Conv(n=1, c=16, k=32, h=6, w=6, r=3, s=3, stride=1, pad=1)
    rep = conv.layers_report(1)
    conv.bench_layer(rep, "tiny", shape, "bf16", None, 1, torch, True, 3)
    row = rep.rows[0]
    assert row["flops"] == 2 * 1 * 32 * 16 * 9 * 6 * 6
    assert row["GFLOP/s"] == row["gflops"] == pytest.approx(row["flops"] / 2e-3 / 1e9)
    assert row["torch_gflops"] == pytest.approx(row["flops"] / 3e-3 / 1e9)
    assert row["% peak"] == pytest.approx(80.0) and row["peak_gflops"] == pytest.approx(row["gflops"] / 0.8)
    assert row["ours/torch"] == 1.5 and (row["ms ours"], row["ms torch"]) == pytest.approx((2.0, 3.0))
    assert asked[0][1] == pytest.approx(row["flops"] / peaks.peak_loop_on(1, "bf16", peaks.kernel_unit("bf16"))[1])


# -- llm and bert: % of the peak loop timed in the same rounds --------------------------------------------

def test_llm_first_token_ceiling_follows_from_the_rounds(monkeypatch):
    from bench import llm
    from bench.models.llama_weights import Config
    cfg = Config.small()
    ours, theirs, mm, top = (np.array(x) for x in ([1.0, 2.0, 1.0], [4.0, 4.0, 8.0], [2.0, 2.0, 2.0],
                                                    [1.0, 0.5, 1.0]))
    top_bf16 = np.array([2.0, 1.0, 1.0])          # an int8 row also times the bf16 loop (its attention's peak)
    calls = []

    def rounds(fns, runs, clock="wall"):
        calls.append(len(fns))
        return [ours, theirs, mm, top, top_bf16][:len(fns)]
    monkeypatch.setattr(llm, "interleaved", rounds)
    peer = types.SimpleNamespace(dt=torch.float32)
    for dtype in ("bf16", "i8"):
        rep = llm.ceiling_report()
        llm.first_token_ceiling(cfg, 16, 1, dtype, None, peer, 3, "wall", rep)
        row = rep.rows[0]
        proj, att = llm.layer_flops(cfg, 16)
        rate = peaks.peak_loop_on(1, dtype, peaks.best_unit(dtype))[1] / top
        att_rate = peaks.peak_loop_on(1, "bf16", peaks.best_unit("bf16"))[1] / (top_bf16 if dtype == "i8" else top)
        ideal = proj / rate + att / att_rate          # int8: the attention's flops at the bf16 peak
        assert row["GFLOP (i8: GOP)"] == pytest.approx((proj + att) / 1e9)
        assert row["peak GFLOP/s (i8: GOP/s)"] == pytest.approx(np.median(rate) / 1e9)
        assert row["tppasm % peak"] == pytest.approx(100 * np.median(ideal / ours))
        assert row["torch % peak"] == pytest.approx(100 * np.median(ideal / theirs))
        assert row["torch matmuls % peak"] == pytest.approx(100 * np.median(proj / mm / rate))
        assert row["1.5x torch needs % peak"] == pytest.approx(1.5 * row["torch % peak"])
        assert ("attention_peak_unit" in row) == (dtype == "i8")
    assert calls == [4, 5]


def test_bert_pct_peak_and_goal_follow_from_the_rounds(monkeypatch, torch_threads):
    from bench import bert
    from bench.models.minilm import LAYERS
    if not bert.model_dir():
        pytest.skip("MiniLM weights not present")
    ours, theirs, top = np.array([1.0, 2.0, 1.0]), np.array([3.0, 3.0, 6.0]), np.array([1e-3, 2e-3, 1e-3])
    monkeypatch.setattr(bert, "interleaved", lambda fns, runs, clock="wall": [ours, theirs, top])
    monkeypatch.setattr(bert, "torch_model", lambda dtype: (None, lambda ids, mask: torch.zeros(1, 16, 384)))
    monkeypatch.setattr(bert.MiniLM, "forward", lambda self, ids, mask: np.zeros((1, 16, 384), np.float32))
    rep = bert.bench_bert([(1, 16)], [1], ["bf16"], 3)
    row = rep.rows[0]
    rate = peaks.peak_loop_on(1, "bf16", peaks.kernel_unit("bf16"))[1] / top
    flops = LAYERS * sum(bert.step_flops(1, 16).values())
    assert row["torch/tppasm"] == 3.0 and row["goal"] == 2.0            # median of (3, 1.5, 6)
    assert row["ours % peak"] == pytest.approx(100 * np.median(flops / ours / rate))
    assert row["torch % peak"] == pytest.approx(100 * np.median(flops / theirs / rate))
    assert row["goal needs % peak"] == pytest.approx(2.0 * row["torch % peak"])


# -- element-wise: GB/s and ratios from the same rounds -------------------------------------------------------

def test_eltwise_ratios_are_medians_of_per_round_ratios(monkeypatch):
    from bench import tpp_eltwise
    clock = [0.0]
    turns = iter([1.0, 2.0, 4.0, 4.0, 2.0, 4.0, 1.0, 4.0, 2.0])     # rounds of (ours, numpy, torch) seconds

    def fn():
        clock[0] += next(turns)
    monkeypatch.setattr(tpp_eltwise, "calibrate", lambda f: 1)
    monkeypatch.setattr(tpp_eltwise, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    (g, gn, gt), (r, rn, rt) = tpp_eltwise.compare(8e9, [fn, fn, fn], runs=3)
    assert (g, gn, gt) == (8.0, 4.0, 2.0)                    # medians of each one's GB/s
    assert r == 1.0 and rn == 2.0 and rt == 2.0              # ours / torch per round (4, 1, 2); medians': 4


# -- the printed table is the record --------------------------------------------------------------------------

def test_report_prints_the_numbers_it_records(capsys, tmp_path):
    from bench.common import Report, write_json
    rep = Report("t", ["a", "GFLOP/s", "% peak"])
    rep.add("x", 1234.567, 0.123456, gflops=1234.567, peak_gflops=float("nan"))
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line == "x | 1,234.6 | 0.123"
    path = tmp_path / "r.json"
    write_json(str(path), [rep])
    rec = json.loads(path.read_text())[0]
    assert rec["GFLOP/s"] == rec["gflops"] == 1234.567 and rec["% peak"] == 0.123456 and rec["peak_gflops"] is None
    assert rec["host"] and rec["isa"] == host().isa
