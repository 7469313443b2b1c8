"""Every bench figure names the peak it is a % of (issue #12): records with a % of peak carry
``peak_gflops`` consistent with it and ``peak_unit`` (:func:`bench.peaks.peak_unit`: the unit of the
dtype's peak loop and its instruction at the ISA's width: AVX2 names in AVX2 mode, AMX on tiles);
a printed % of peak over 100 has "!" after it, one under 100 has not, and the table's header says
which peaks its figures are of and what the mark means. Timers and the interleavings are replaced
by chosen seconds; no speed is asserted."""
import json
import math
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from bench import peaks
from bench.common import OVER_PEAK
from bench.peaks import peak_legend

torch = pytest.importorskip("torch")

ZEN4 = frozenset({"avx512f", "avx512_bf16", "avx512_vnni"})
HOSTS = [  # (isa, features, {dtype: peak_unit})
    ("avx512", ZEN4, {"f32": "FMA (vfmadd231ps zmm)", "bf16": "BF16-dot (vdpbf16ps zmm)",
                      "i8": "VNNI (vpdpbusd zmm)"}),
    ("avx512", frozenset({"avx512f"}), {"f32": "FMA (vfmadd231ps zmm)", "bf16": "FMA (vfmadd231ps zmm)",
                                        "i8": "madd (vpmaddwd zmm)"}),
    ("avx2", ZEN4, {"f32": "FMA (vfmadd231ps ymm)", "bf16": "FMA (vfmadd231ps ymm)", "i8": "madd (vpmaddwd ymm)"}),
    ("avx2", frozenset({"avx_vnni"}), {"f32": "FMA (vfmadd231ps ymm)", "bf16": "FMA (vfmadd231ps ymm)",
                                       "i8": "VNNI (vpdpbusd ymm)"}),
    ("amx", ZEN4 | {"amx_bf16", "amx_int8"}, {"f32": "FMA (vfmadd231ps zmm)", "bf16": "AMX (tdpbf16ps)",
                                              "i8": "AMX (tdpbusd)"}),
]


def pretend(monkeypatch, isa, features):
    """The host runs ``isa`` with ``features`` as far as bench.peaks can tell."""
    monkeypatch.setattr(peaks, "_features", lambda _isa: features)
    monkeypatch.setattr(peaks, "host", lambda: types.SimpleNamespace(isa=isa))


# -- peak_unit: the unit and instruction of each dtype's peak loop -------------------------------------------

@pytest.mark.parametrize("isa, features, want", HOSTS)
def test_peak_unit_names_the_dtypes_unit_on_each_host(monkeypatch, isa, features, want):
    pretend(monkeypatch, isa, features)
    for dtype, name in want.items():
        assert peaks.peak_unit(dtype) == peaks.peak_unit(dtype, isa) == name
        assert name.split()[0] == peaks.kernel_unit(dtype)                  # the unit the loop of its % runs
    assert peak_legend(list(want)) == "peaks: " + ", ".join(f"{d} of {n}" for d, n in want.items())


def test_peak_unit_of_a_named_unit_and_a_wrong_one():
    assert peaks.peak_unit("i8", "avx2", unit="u7") == "u7 (vpmaddubsw+vpmaddwd ymm)"
    assert peaks.peak_unit("bf16", "avx512", unit="FMA") == "FMA (vfmadd231ps zmm)"
    with pytest.raises(ValueError, match="expected one of"):
        peaks.peak_unit("f32", "avx512", unit="fma")


def test_peak_unit_here():
    from isa.cpu import host
    for dtype in ("f32", "bf16", "i8"):
        assert peaks.peak_unit(dtype).split()[0] == peaks.kernel_unit(dtype)
    if host().isa != "avx512" or not ZEN4 <= peaks._features("avx512"):
        pytest.skip("names checked on an AVX-512 host with BF16 and VNNI dots")
    assert [peaks.peak_unit(d) for d in ("f32", "bf16", "i8")] == [
        "FMA (vfmadd231ps zmm)", "BF16-dot (vdpbf16ps zmm)", "VNNI (vpdpbusd zmm)"]


AVX2_SCRIPT = """
import json
from bench import peaks
from bench.gemm_table import add_row, gemm_report
rep = gemm_report(3, ["f32", "bf16", "i8"])
res = {"tuned": (50.0, 1.0), "fixed": (40.0, 1.25)}
for dtype in ("f32", "bf16", "i8"):
    add_row(rep, dtype, (64, 64, 64), 1, res, (50.0, 60.0, float("nan")), float("nan"), None, None)
print(json.dumps([peaks.peak_unit(d) for d in ("f32", "bf16", "i8")] + [r["peak_unit"] for r in rep.rows]))
"""


def test_avx2_mode_names_the_avx2_units():
    """``TPPASM_ISA=avx2`` (a fresh process: the host is probed once): ymm FMA for fp32 and bf16, the
    AVX2 int8 unit, in peak_unit, a gemm record and the table's header."""
    from isa.cpu import host
    if host().arch != "x86_64":
        pytest.skip("x86 only")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", AVX2_SCRIPT], cwd=root, capture_output=True, text=True,
                         env={**os.environ, "TPPASM_ISA": "avx2"}, timeout=120, check=True).stdout
    *_, header = [line for line in out.splitlines() if line.startswith("peaks: ")]
    names = json.loads(out.splitlines()[-1])
    i8 = "VNNI (vpdpbusd ymm)" if "avx_vnni" in peaks._features("avx2") else "madd (vpmaddwd ymm)"
    assert names == ["FMA (vfmadd231ps ymm)", "FMA (vfmadd231ps ymm)", i8] * 2
    assert header.startswith(f"peaks: f32 of FMA (vfmadd231ps ymm), bf16 of FMA (vfmadd231ps ymm), i8 of {i8}; ")


def test_amx_tiles_pretended_name_the_amx_unit(monkeypatch, capsys):
    from bench.gemm_table import add_row, gemm_report
    pretend(monkeypatch, *HOSTS[-1][:2])
    rep = gemm_report(3, ["bf16", "i8"])
    for dtype in ("bf16", "i8", "f32"):
        add_row(rep, dtype, (64, 64, 64), 1, {"tuned": (50.0, 1.0), "fixed": (40.0, 1.25)},
                (50.0, 60.0, float("nan")), float("nan"), None, None)
    assert [r["peak_unit"] for r in rep.rows] == ["AMX (tdpbf16ps)", "AMX (tdpbusd)", "FMA (vfmadd231ps zmm)"]
    assert f"peaks: bf16 of AMX (tdpbf16ps), i8 of AMX (tdpbusd); {OVER_PEAK}" in capsys.readouterr().out


# -- the printed table: '!' after a % over 100, the legend in the header -------------------------------------

def printed(out, rep):
    """(the legend line above ``rep``'s column header, [{column: printed cell} per row]) in ``out``."""
    lines = out.splitlines()
    start = lines.index(" | ".join(rep.columns))
    rows = [line.split(" | ") for line in lines[start + 2:] if line.count(" | ") == len(rep.columns) - 1]
    return lines[start - 2], [dict(zip(rep.columns, r)) for r in rows[:len(rep.rows)]]


def check_table(out, rep, dtypes, units=None):
    """The header names the peaks of ``dtypes`` and the mark; every marked cell shows its record's
    number, "!" after it exactly when over 100. Returns {over 100?} of the figures seen."""
    legend, rows = printed(out, rep)
    assert legend == f"{peak_legend(dtypes, units)}; {OVER_PEAK}"
    assert len(rows) == len(rep.rows) and rep.marked
    seen = set()
    for rec, cells in zip(rep.rows, rows):
        for column in rep.marked:
            value, cell = rec[column], cells[column]
            if math.isnan(value):
                assert cell == "nan"
                continue
            assert cell.endswith("!") == (value > 100), (column, value, cell)
            assert float(cell.rstrip("!").replace(",", "")) == pytest.approx(value, rel=1e-2, abs=0.06)
            seen.add(value > 100)
    return seen


def check_peak(rec, percent, unit=None):
    """``rec``'s peak is the one its ``percent`` (of the record's ``gflops``) is of, from ``unit``'s loop."""
    assert rec["peak_unit"] == peaks.peak_unit(rec["dtype"], unit=unit)
    assert rec["gflops"] / rec["peak_gflops"] == pytest.approx(percent / 100)


def test_report_refuses_a_marked_column_it_lacks():
    from bench.common import Report
    with pytest.raises(ValueError, match="not among"):
        Report("t", ["a", "% peak"], marked=["%peak"])


def test_peak_cell_marks_only_over_100():
    from bench.common import peak_cell
    assert peak_cell(100.5) == "100.5!" and peak_cell(1234.5) == "1,234.5!"
    assert peak_cell(100.0) == 100.0 and peak_cell(3.0) == 3.0 and math.isnan(peak_cell(float("nan")))


# -- every suite --------------------------------------------------------------------------------------------

def test_gemm_rows_name_their_peak_and_mark_over_100(monkeypatch, torch_threads, capsys):
    import bench.common
    from bench import gemm
    row_threads, flops = [], 2 * 32 ** 3
    real_pool_of = gemm.pool_of
    monkeypatch.setattr(gemm, "pool_of", lambda n: row_threads.append(n) or real_pool_of(n))
    dtypes = ["f32", "bf16", "i8"]
    loop_work = {d: peaks.peak_loop_on(2, d, peaks.kernel_unit(d))[1] for d in dtypes}
    current = []

    def fake(fns, rounds, seconds_each=0.03):     # every call 1 s; on 2 threads the peak loop's (last) 150%
        t_peak = 1.5 * loop_work[current[-1]] / flops if row_threads[-1] == 2 else 1.0
        return [np.full(3, 1.0) for _ in fns[:-1]] + [np.full(3, t_peak)]
    monkeypatch.setattr(bench.common, "_interleaved", fake)
    monkeypatch.setattr(gemm, "use_threads", lambda n, torch=None: None)
    monkeypatch.setattr(gemm, "peak_scaling", lambda dtype, n, rounds: 1.5)
    monkeypatch.setattr(gemm.tg, "interleaved_ratios",      # %pk 90, q90 132
                        lambda fn, work, loop, rounds, seconds: [0.9] * 13 + [1.6, 1.7])
    real_operands = gemm.operands
    monkeypatch.setattr(gemm, "operands", lambda rng, M, N, K, dtype: current.append(dtype) or
                        real_operands(rng, M, N, K, dtype))
    rep = gemm.bench_gemm([(32, 32, 32)], [1, 2], dtypes, True, 0, bar=False)
    assert check_table(capsys.readouterr().out, rep, dtypes) == {True, False}
    assert set(rep.marked) == {"%pk", "q90", "numpy %pk"}
    for rec in rep.rows:
        check_peak(rec, rec["%pk"])
        assert rec["%pk"] == pytest.approx(90.0 if rec["threads"] == 1 else 150.0)
        assert rec["q90"] == (pytest.approx(132.0) if rec["threads"] == 1 else pytest.approx(float("nan"), nan_ok=True))


def fake_versus(fracs, asked=None):
    """versus() returning 2 ms ours, 3 ms theirs and the next of ``fracs`` as the fraction of the peak."""
    fracs = iter(fracs)

    def run(ours, theirs, rounds=11, seconds=0.02, peak_loop=None):
        if asked is not None:
            asked.append(peak_loop)
        return (2e-3, 3e-3, 1.5) + ((next(fracs),) if peak_loop else ())
    return run


def test_conv_rows_name_their_peak_and_mark_over_100(monkeypatch, torch_threads, capsys):
    from bench import conv
    from bench.conv_nest import Conv
    monkeypatch.setattr(conv, "versus", fake_versus([1.2, 0.8]))
    monkeypatch.setattr(conv, "FRESH", True)
    torch.set_num_threads(1)
    shape = Conv(n=1, c=16, k=32, h=6, w=6, r=3, s=3, stride=1, pad=1)
    rep = conv.layers_report(1, ["f32", "bf16"])
    for dtype in ("f32", "bf16"):
        conv.bench_layer(rep, "tiny", shape, dtype, None, 1, torch, True, 3)
    assert check_table(capsys.readouterr().out, rep, ["f32", "bf16"]) == {True, False}
    assert [r["% peak"] for r in rep.rows] == pytest.approx([120.0, 80.0])
    for rec in rep.rows:
        check_peak(rec, rec["% peak"])


def test_spmm_rows_name_their_peak_and_mark_over_100(monkeypatch, capsys):
    from bench import spmm
    monkeypatch.setattr(spmm, "versus", fake_versus([1.25, 0.5]))
    monkeypatch.setattr(spmm, "quick_seconds", lambda fn, seconds=0.01, runs=3: 2e-3)
    rep = spmm.points_report(64, 1, ["f32", "bf16"])
    for dtype in ("f32", "bf16"):
        nest = spmm.SpmmNest(64, 64, 64, 16, 16, dtype, 64)
        for sparsity in (0.5, 1.0):
            spmm.bench_point(rep, 64, 16, sparsity, dtype, nest, torch, 1, np.random.default_rng(0), 3)
    assert check_table(capsys.readouterr().out, rep, ["f32", "bf16"]) == {True, False}
    for rec in rep.rows:
        assert rec["peak_unit"] == peaks.peak_unit(rec["dtype"])
        done = 2.0 * rec["stored blocks"] * 16 * 16 * 64
        if done:            # the % counts the flops done, not the dense-equivalent ones
            assert done / 2e-3 / 1e9 / rec["peak_gflops"] == pytest.approx(rec["% peak"] / 100)
        else:
            assert rec["% peak"] == 0.0 and rec["peak_gflops"] is None
    assert [r["% peak"] for r in rep.rows if r["stored blocks"]] == [125.0, 50.0]


def test_linear_rows_name_their_peak_and_mark_over_100(monkeypatch, capsys):
    from bench import linear
    monkeypatch.setattr(linear, "versus", fake_versus([1.5, 0.25, 0.9]))
    rep = linear.shapes_report(False, 1, ["f32", "bf16"])
    linear.bench_shape(rep, torch, 1, 4, 8, 16, "f32", False, 3)
    linear.bench_shape(rep, torch, 1, 4, 8, 16, "bf16", False, 3)
    assert check_table(capsys.readouterr().out, rep, ["f32", "bf16"]) == {True, False}
    for rec in rep.rows:
        check_peak(rec, rec["% peak"])


def test_mlp_has_a_pct_peak_column_that_names_its_peak(monkeypatch, torch_threads, capsys):
    from bench import mlp
    row_threads, flops = [], 2 * 8 * 16 * 16
    real_pool_of = mlp.pool_of
    monkeypatch.setattr(mlp, "pool_of", lambda n: row_threads.append(n) or real_pool_of(n))
    want = {1: 1.5, 2: 0.5}         # the tuned MLP's fraction of the peak per thread count

    def fake(fns, runs, min_run=0.05):
        nt = row_threads[-1]
        calls = flops / peaks.peak_loop_on(nt, "f32", peaks.kernel_unit("f32"))[1]
        # tuned (1, 2, 1 s), aBC, torch, the peak loop (its per-round time / ours: want / calls), 1T's tuned
        tuned = np.array([1.0, 2.0, 1.0])
        return [tuned, np.ones(3), np.ones(3), tuned * want[nt] / calls, np.ones(3)][:len(fns)]
    monkeypatch.setattr(mlp, "interleaved", fake)
    monkeypatch.setattr(mlp, "use_threads", lambda n, torch=None: None)
    rep = mlp.bench_mlp(8, 16, 1, [1, 2], ["f32"], True, 0, bar=False)
    assert "tuned %pk" in rep.columns and set(rep.marked) == {"tuned %pk"}
    assert check_table(capsys.readouterr().out, rep, ["f32"]) == {True, False}
    for rec in rep.rows:
        assert rec["tuned %pk"] == pytest.approx(100 * want[rec["threads"]])
        check_peak(rec, rec["tuned %pk"])


def best(dtypes):
    return {d: peaks.best_unit(d) for d in dtypes}


def test_bert_rows_name_their_peak_and_mark_over_100(monkeypatch, torch_threads, capsys):
    from bench import bert
    from bench.models.minilm import LAYERS
    if not bert.model_dir():
        pytest.skip("MiniLM weights not present")
    flops = LAYERS * sum(bert.step_flops(1, 16).values())
    work = peaks.peak_loop_on(1, "bf16")[1]
    top = np.full(3, 1e-3)              # the peak loop's calls: a constant rate, so the median is every round's
    rate = work / 1e-3
    # ours at 130% of the peak, torch at 40%
    monkeypatch.setattr(bert, "interleaved", lambda fns, runs, clock="wall": [
        np.full(3, flops / rate / 1.3), np.full(3, flops / rate / 0.4), top])
    monkeypatch.setattr(bert, "torch_model", lambda dtype: (None, lambda ids, mask: torch.zeros(1, 16, 384)))
    monkeypatch.setattr(bert.MiniLM, "forward", lambda self, ids, mask: np.zeros((1, 16, 384), np.float32))
    rep = bert.bench_bert([(1, 16)], [1], ["bf16"], 3)
    assert check_table(capsys.readouterr().out, rep, ["bf16"], best(["bf16"])) == {True, False}
    rec = rep.rows[0]
    assert (rec["ours % peak"], rec["torch % peak"]) == pytest.approx((130.0, 40.0))
    assert rec["peak_unit"] == peaks.peak_unit("bf16", unit=peaks.best_unit("bf16"))
    assert rec["peak_gflops"] == pytest.approx(rate / 1e9)
    assert flops / np.median(rep.rows[0]["tppasm ms"] / 1e3) / 1e9 / rec["peak_gflops"] == pytest.approx(1.3)


def test_bert_profile_rows_name_their_peak_and_mark_over_100(monkeypatch, capsys):
    from bench import bert
    if not bert.model_dir():
        pytest.skip("MiniLM weights not present")
    work = peaks.peak_loop_on(1, "f32")[1]
    flops = bert.step_flops(1, 8)

    def fake(fns, runs, min_run=0.05, clock="wall", settle=None):
        # qkv at 250% of the peak loop (1 ms a call), every other step at 50%, the forward 10 ms
        steps = [np.full(3, flops["qkv"] / (work / 1e-3) / (2.5 if i == 0 else 0.5)) for i in range(len(fns) - 2)]
        return [np.full(3, 1e-2)] + steps + [np.full(3, 1e-3)]
    monkeypatch.setattr(bert, "interleaved", fake)
    rep = bert.profile_bert([(1, 8)], [1], ["f32"], 3)
    assert check_table(capsys.readouterr().out, rep, ["f32"], best(["f32"])) == {True, False}
    assert next(r for r in rep.rows if r["step"] == "qkv")["% peak"] == pytest.approx(250.0)
    for rec in rep.rows:
        assert rec["peak_unit"] == peaks.peak_unit("f32", unit=peaks.best_unit("f32"))
        assert rec["peak_gflops"] == pytest.approx(work / 1e-3 / 1e9)
        if rec["step"] in flops:
            gflops = flops[rec["step"]] / (rec["ms"] / 1e3) / 1e9
            assert gflops / rec["peak_gflops"] == pytest.approx(rec["% peak"] / 100)


def test_llm_ceiling_rows_name_their_peak_and_mark_over_100(monkeypatch, capsys):
    from bench import llm
    from bench.models.llama_weights import Config
    cfg = Config.small()
    proj, att = llm.layer_flops(cfg, 16)
    peer = types.SimpleNamespace(dt=torch.float32)
    rep = llm.ceiling_report(["bf16", "i8"])
    for dtype, ours_frac in (("bf16", 1.1), ("i8", 0.6)):
        rate = peaks.peak_loop_on(1, dtype)[1] / 1e-3            # the peak loops: 1 ms a call
        ideal = proj / rate + att / (peaks.peak_loop_on(1, "bf16")[1] / 1e-3)     # int8: a bf16 attention
        t_ours, t_theirs = ideal / ours_frac, ideal / 0.3
        monkeypatch.setattr(llm, "interleaved", lambda fns, runs, clock="wall", a=t_ours, b=t_theirs, c=proj / rate:
                            [np.full(3, a), np.full(3, b), np.full(3, c)] + [np.full(3, 1e-3)] * (len(fns) - 3))
        llm.first_token_ceiling(cfg, 16, 1, dtype, None, peer, 3, "wall", rep)
        rec = rep.rows[-1]
        assert rec["peak_unit"] == peaks.peak_unit(dtype, unit=peaks.best_unit(dtype))
        assert rec["peak_gflops"] == rec["peak GFLOP/s (i8: GOP/s)"] == pytest.approx(rate / 1e9)
        bf16_unit = peaks.peak_unit("bf16", unit=peaks.best_unit("bf16"))
        assert rec.get("attention_peak_unit") == (None if dtype == "bf16" else bf16_unit)
        assert (rec["tppasm % peak"], rec["torch matmuls % peak"]) == pytest.approx((100 * ours_frac, 100.0))
    assert check_table(capsys.readouterr().out, rep, ["bf16", "i8"], best(["bf16", "i8"])) == {True, False}
    assert "1.5x torch needs % peak" not in rep.marked          # a requirement: over 100 is out of reach
