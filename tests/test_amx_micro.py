"""bench.amx_micro: the AMX loops that decide the cycle model's reading. Their code runs in the
interpreter here (natively on AMX hosts); the timing pipeline is checked on stand-in loops that
take a reading's modelled cycles."""
import itertools
import json
import math
import time
from collections import Counter

import pytest

from bench.amx_micro import (BLOCK, L1_BLOCKS, LOOPS, build, differences, goal_kernel, host_figures, main, measure,
                              misfit, model_rows, operands)
from bench.amx_choices import compare
from bench.amx_model import FIGURES, load_figures
from bench.amx_static import main as static_main
from isa.cpu import host
from isa.x86.interp import Machine


@pytest.fixture(scope="module")
def rows():
    return {r["loop"]: r for r in model_rows()}


def _run(name, trips):
    m = Machine()
    base = m.map(operands())
    m.call(build(name).code, args=[trips, base])
    return m.stats, base


@pytest.mark.parametrize("name", list(LOOPS))
def test_each_trip_runs_its_body(name):
    (one, _), (three, _) = _run(name, 1), _run(name, 3)
    body = Counter(op[0] for op in LOOPS[name][1])
    for op, mnemonic in (("tdp", "tdpbf16ps"), ("load", "tileloadd"), ("store", "tilestored"), ("config", "ldtilecfg"),
                         ("stcfg", "sttilecfg")):
        assert three.counts[mnemonic] - one.counts[mnemonic] == 2 * body[op]
    assert one.counts["ldtilecfg"] == 1 + body["config"] and one.counts["tilerelease"] == 1


@pytest.mark.parametrize("name", [n for n, (_, _, span) in LOOPS.items() if span > L1_BLOCKS])
def test_streaming_loops_read_new_blocks_and_wrap(name):
    _, body, span = LOOPS[name]
    per = 1 + max(op[2] for op in body if op[0] == "load")
    wrap = span // per
    stats, base = _run(name, wrap + 1)
    loads = [op[3] - base for op in stats.tile_ops if op[0] == "tileloadd"][2:]   # after tiles 6 and 7
    n = sum(op[0] == "load" for op in body)
    trips = [loads[i:i + n] for i in range(0, len(loads), n)]
    assert len(trips) == wrap + 1
    assert [min(t) for t in trips[:wrap]] == [k * per * BLOCK for k in range(wrap)]
    assert max(max(t) for t in trips) < span * BLOCK            # never past the operand array
    assert trips[wrap] == trips[0]                              # then round again


def test_an_unknown_loop_is_refused_by_name():
    with pytest.raises(ValueError, match="no loop 'tdp2'; the loops are tdp, chain"):
        build("tdp2")


def test_the_readings_differ_where_the_loops_say(rows):
    for name in ("tdp", "chain", "load", "load_l2"):             # no tile is reloaded under a reader
        assert rows[name]["in-order"] == rows[name]["ooo"] == rows[name]["renamed"]
    assert rows["reload"]["renamed"] * 2 < rows["reload"]["ooo"]
    assert rows["reload2"]["renamed"] < rows["reload2"]["ooo"] < rows["reload2"]["in-order"]
    assert rows["tdp"]["ooo"] == 16 * 24


@pytest.mark.parametrize("reading", ["in-order", "ooo", "renamed"])
def test_timing_recovers_the_reading_a_core_follows(reading, rows, monkeypatch):
    """On a virtual clock that each stand-in loop advances by its reading's cycles (with a few
    percent of jitter), so that a loaded machine cannot fail it."""
    now, jitter = [0.0], iter(1 + 0.04 * math.sin(i) for i in itertools.count())
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])

    def stand_in(cycles, seconds_per_cycle=2e-8):
        def call(trips):
            now[0] += trips * cycles * seconds_per_cycle * next(jitter)
        return call

    measured = measure(rounds=3, loops={n: stand_in(rows[n][reading]) for n in LOOPS})
    for n in LOOPS:
        assert measured[n] == pytest.approx(rows[n][reading], rel=0.1)
    fit = misfit(measured, rows)
    assert min(fit, key=fit.get) == reading


def test_suite_runs_and_refuses_bad_rounds(capsys, tmp_path):
    main(["--rounds", "1", "--json", str(tmp_path / "m.json")])
    out = capsys.readouterr().out
    assert "reload2" in out and (tmp_path / "m.json").exists()
    with pytest.raises(SystemExit):
        main(["--rounds", "0"])
    assert "expected a positive number of rounds" in capsys.readouterr().err


def _as_amx_host(monkeypatch, timings):
    import types

    import bench.amx_micro as micro
    import isa.cpu
    monkeypatch.setattr(isa.cpu, "host", lambda: types.SimpleNamespace(levels=("avx2", "avx512", "amx")))
    monkeypatch.setattr(micro, "measure", lambda rounds: dict(timings))
    return micro


def test_an_amx_host_gets_the_fit_and_the_implied_figures(monkeypatch, capsys, rows, tmp_path):
    """run() as an AMX host would: a core that follows the renamed reading exactly (its timings
    stand in for the native loops) is told so, and its implied figures, written for amx-static,
    are the model's own."""
    micro = _as_amx_host(monkeypatch, {n: rows[n]["renamed"] for n in LOOPS})
    rep, fit = micro.run(rounds=1, figures_path=str(tmp_path / "f.json"))
    out = capsys.readouterr().out
    assert fit["renamed"] == 0.0 < fit["ooo"] < fit["in-order"]
    assert "the reading that fits: renamed" in out
    assert "differ from the model's (in brackets): none" in out
    assert "the AMX BRGEMM of issue #12's goal, chunks: MODELLED % of the AMX peak" in out
    assert [r["this host"] for r in rep.rows] == [rows[n]["renamed"] for n in LOOPS]
    figures, reading, host = load_figures(tmp_path / "f.json")
    assert differences(figures) == [] and reading == "renamed" and host


def test_amx_static_models_with_a_host_s_figures(monkeypatch, capsys, rows, tmp_path):
    """amx-micro --figures on a (stand-in) AMX host whose tdp latency is 40, then amx-static
    --figures: its tables say whose timings they use, and the kernels model faster than with the
    model's own; the candidate blockings likewise."""
    timings = {n: rows[n]["ooo"] for n in LOOPS}
    timings["chain"] = 160.0
    path = str(tmp_path / "f.json")
    with monkeypatch.context() as patch:
        _as_amx_host(patch, timings).main(["--rounds", "1", "--figures", path])
    assert f"wrote {path}" in capsys.readouterr().out
    figures, reading, _ = load_figures(path)
    assert figures.tdp_latency == 40 and reading == "ooo"
    tables = {}
    for name, extra in (("own", []), ("host", ["--figures", path])):
        static_main(["--quick", "--json", str(tmp_path / f"{name}.json")] + extra)
        tables[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert "MODELLED with the timings amx-micro measured on" in capsys.readouterr().out
    own, host = ([r for r in tables[k] if r.get("kernel", "").startswith("bf16 64x64x64")] for k in ("own", "host"))
    assert own and all(f"the timings of {path}" in r["table"] for r in host)
    assert all(h["% ooo"] > o["% ooo"] for h, o in zip(host, own))
    one = [(2, 2, 1, 1, "columns")]
    assert compare(one, steps=8, figures=figures)[0]["L1 ooo"] > compare(one, steps=8)[0]["L1 ooo"]


@pytest.mark.parametrize("text, words", [
    ("not json", "cannot read it"),
    ('{"figures": {}, "reading": "ooo"}', "expected {'figures'"),
    (json.dumps({"figures": {**vars(FIGURES), "load_latency": [None, "x", 1, 2]}, "reading": "ooo"}),
     "must be numbers"),
    (json.dumps({"figures": {**vars(FIGURES), "tdp_latency": -1}, "reading": "ooo"}), "must be numbers"),
    (json.dumps({"figures": vars(FIGURES), "reading": "fast"}), "'reading': one of in-order, ooo, renamed")])
def test_a_bad_figures_file_is_refused_with_the_fix(tmp_path, capsys, text, words):
    path = tmp_path / "f.json"
    path.write_text(text)
    with pytest.raises(SystemExit):
        static_main(["--quick", "--figures", str(path)])
    err = capsys.readouterr().err
    assert words in err and "amx-micro --figures FILE on an AMX host" in err


def test_figures_only_where_amx_runs(capsys, tmp_path):
    """No AMX: refused, no file. An AMX host times the loops and writes its figures (this test
    failed there before, expecting the refusal on every host)."""
    out = tmp_path / "f.json"
    if "amx" in host().levels:
        main(["--figures", str(out)])
        assert out.exists() and out.stat().st_size > 0
        return
    with pytest.raises(SystemExit):
        main(["--figures", str(out)])
    assert "this host has no AMX" in capsys.readouterr().err and not out.exists()


def test_a_host_s_figures_feed_the_model(rows):
    """Timings that follow the ooo reading but load tiles 15 cycles sooner, tdp latency 40: the
    figures say so, and the goal kernel models faster under them."""
    measured = {n: rows[n]["ooo"] for n in LOOPS}
    measured["reload"] -= 4 * 15
    measured["chain"] = 160.0
    figures = host_figures(measured, "ooo")
    assert figures.load_latency[1:] == (30, 41, 130) and figures.tdp_latency == 40
    assert figures.l2_bw == pytest.approx(48, rel=1e-3) and figures.ldtilecfg == 204
    assert host_figures(measured, "renamed").load_latency == FIGURES.load_latency
    assert differences(figures) == ["tdp_latency 40 (52)", "load_latency 30/41/130 (45/56/145)"]
    faster, model = (got["default"]["ooo"] for got in goal_kernel(figures, FIGURES))
    assert faster > model + 3


def test_the_tile_store_fence_prices_a_round_trip_of_c(rows, monkeypatch):
    """bench.amx_model's fence (tile loads wait for earlier tile stores) is what makes the c_trip
    loops cost ~100 cycles beyond their tdp, as measured on an Emerald Rapids core; without it the
    round trip hides under the tdp."""
    import bench.amx_micro as micro
    assert rows["c_trip8"]["renamed"] > 128 + 64 and rows["c_trip16"]["renamed"] > 256 + 64
    monkeypatch.setitem(micro.READINGS, "renamed", dict(renaming=True, fence=False))
    assert micro.model_cycles("c_trip8")["renamed"] == pytest.approx(128, abs=2)


def test_a_12_way_l1_holds_12_lines_of_a_set():
    """bench.amx_model.simulate(l1_ways=12): 13 tile rows 4 KiB apart share one L1 set, so a second
    load of them misses L1 (13 lines from L2) where a fully associative L1 holds them all."""
    from bench.amx_model import simulate
    load = ("tileloadd", (0,), (), 0, 4096, 64, 13)
    ops = [load, ("tilezero", (0,), (), 0, 0, 0, 0), load]
    for ways, from_l2 in ((None, 0), (12, 13)):
        res = simulate(ops, warm=False, l1_ways=ways)
        assert res.lines[2] + res.lines[3] - 13 == from_l2          # the first load misses either way
