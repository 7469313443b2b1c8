"""Time and memory pathologies of the loop DSL (fuzzing report fz11b): the race proof of loops longer
than the analysis lists, the tuner's knob grid and budget, the refusal of bodies with too many paths,
and two messages that grew with their input."""
import time

import numpy as np
import pytest

import loops.trace as trace_mod
import loops.tune_options as tune_options
import tppasm as tpp
from loops import Loop, SpecError, kernel
from loops.knob_grid import Grid
from loops.race_search import LISTED
from loops.races import RaceError, check
from loops.spec import parse
from loops.trace import TraceError
from loops.tune import search
from tests.support import pool_of

N = 10 ** 8                       # a parallel loop far longer than the race search lists
relu = tpp.relu(1, 16)


def _body(src):
    ns = {"relu": relu, "N": N}
    exec(src, ns)
    return ns["body"]


def _one_loop(cond, write="relu(X[0], X[0])"):
    return kernel("A", Loop(0, N))(_body(f"def body(i, X):\n    if {cond}:\n        {write}\n"))


# -- 1: the race proof of a long loop pinned by '==' ------------------------------------------------

@pytest.mark.parametrize("cond", ["i == 0", "i == 5", "i == N - 1", "i == 5 or i == 6"])
def test_long_loop_pinned_by_equality_is_race_free(cond):
    X = np.zeros((16, 1, 16), np.float32)
    assert N > LISTED
    assert check(_one_loop(cond), (X,), nthreads=2) == []


@pytest.mark.parametrize("spec", ["Ab", "Ab@schedule(dynamic,1)"])
def test_long_loop_pinned_in_a_nest_is_race_free(spec):
    body = _body("def body(i, j, X):\n    if i == N - 1:\n        relu(X[j], X[j])\n")
    lk = kernel(spec, Loop(0, N), Loop(0, 16))(body)
    assert check(lk, (np.zeros((16, 1, 16), np.float32),), nthreads=2) == []


def test_long_loop_pins_on_different_threads_still_race():
    src = ("def body(i, X):\n    if i == 0:\n        relu(X[0], X[0])\n"
           "    if i == N - 1:\n        relu(X[0], X[0])\n")
    lk = kernel("A", Loop(0, N), pool=pool_of(2))(_body(src))
    with pytest.raises(RaceError, match="has a data race") as e:
        lk.accesses(np.zeros((16, 1, 16), np.float32))
    assert "i=0" in str(e.value) and f"i={N - 1}" in str(e.value)


def test_long_loop_pinned_on_one_side_only_finds_the_real_race():
    src = ("def body(i, X, Y):\n    if i == 5:\n        relu(Y[0], X[0])\n    relu(X[0], Y[1])\n")
    lk = kernel("A", Loop(0, N), pool=pool_of(2))(_body(src))
    X = np.zeros((16, 1, 16), np.float32)
    with pytest.raises(RaceError, match="has a data race") as e:
        lk.accesses(X, X.copy())
    assert "i=5" in str(e.value)


def test_long_loop_without_a_pin_is_refused_with_specific_advice():
    lk = kernel("A", Loop(0, N), pool=pool_of(2))(_body("def body(i, X):\n    if i < 2:\n        relu(X[0], X[0])\n"))
    with pytest.raises(RaceError, match="cannot be shown race-free") as e:
        lk.accesses(np.zeros((16, 1, 16), np.float32))
    msg = str(e.value)
    assert "neither call pins i" in msg and "if i == <value>:" in msg and "use a static schedule" not in msg


def test_long_unconditional_constant_block_is_a_real_race():
    lk = kernel("A", Loop(0, N), pool=pool_of(2))(_body("def body(i, X):\n    relu(X[0], X[0])\n"))
    with pytest.raises(RaceError, match="has a data race"):
        lk.accesses(np.zeros((16, 1, 16), np.float32))


# -- 3: the knob grid is walked lazily ---------------------------------------------------------------

def test_grid_counts_contains_and_keys_without_listing():
    big = Grid({k: range(1000) for k in "abcd"})
    assert big.count == 10 ** 12 and big[0] == {k: 0 for k in "abcd"}
    assert {"a": 999, "b": 0, "c": 5, "d": 7} in big and {"a": 1000, "b": 0, "c": 0, "d": 0} not in big
    assert {"a": 1, "b": 0, "c": 0} not in big and "x" not in big
    assert len(big.key_text()) < 20000
    small = Grid({"bm": [64, 32], "bn": [16]})
    assert small.key_text() == repr([sorted(c.items()) for c in list(small)])   # as disk keys always were
    assert Grid({"a": [1, 2]}).key_text() != Grid({"a": [1, 3]}).key_text()


def _make(a=0, b=0, c=0, d=0):
    X = np.zeros((8, 1, 16), np.float32)
    return kernel("A", Loop(0, 8))(lambda i, X: relu(X[i], X[i])), (X,)


def test_search_over_a_huge_knob_grid_keeps_to_its_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("TPPASM_CACHE_DIR", str(tmp_path))
    t = time.perf_counter()
    found = search(_make, {k: list(range(100)) for k in "abcd"}, seconds=0.5, progress=False, blocks=False,
                   key=("pathology-grid", time.time()))
    assert time.perf_counter() - t < 10                # 20x the budget; listing 10^8 dicts takes minutes
    assert found.record["configurations"] == 10 ** 8
    assert found.record["unmodelled_configurations"] >= 10 ** 8 - 10 ** 6


# -- 4: tune's budget with a slow run and a long specs list --------------------------------------------

def test_tune_starts_no_run_past_its_budget(monkeypatch):
    X = np.zeros((4, 64, 64), np.float32)
    big = tpp.relu(64, 64)
    lk = kernel("aB", Loop(0, 40000), Loop(0, 4))(lambda i, j, X: big(X[j], X[j]))
    lk(X)
    pool = type(lk.pool)
    runs = []
    real = pool.run
    monkeypatch.setattr(pool, "run", lambda self, *a, **k: runs.append(1) or real(self, *a, **k))
    assert lk.tune(X, seconds=0.001, remember=False, progress=False) == "aB"
    assert len(runs) == 1                  # the reference run, which also times the own spec


def test_tune_checks_a_long_specs_list_within_its_budget(monkeypatch):
    X = np.zeros((8, 8, 1, 16), np.float32)
    lk = kernel("aB", Loop(0, 8), Loop(0, 8))(lambda i, j, X: relu(X[i, j], X[i, j]))
    specs = [f"aB@schedule(static,{c})" for c in range(1, 50001)]
    parsed = []
    real = tune_options.parse
    monkeypatch.setattr(tune_options, "parse", lambda *a: parsed.append(1) or real(*a))
    assert lk.tune(X, specs=specs, seconds=0.3, remember=False, progress=False).startswith("aB")
    assert len(parsed) < len(specs)


# -- 5: too many control paths are refused early -------------------------------------------------------

def _ifs(k):
    return _body("def body(i, j, X):\n" + "".join(
        f"    if i == {c} or j == {c}:\n        relu(X[i, j], X[i, j])\n" for c in range(k)))


def test_too_many_paths_are_counted_without_recording(monkeypatch):
    monkeypatch.setattr(trace_mod, "MAX_PATHS", 200)
    recording = []
    real = trace_mod._run
    monkeypatch.setattr(trace_mod, "_run", lambda tr, *a: recording.append(not getattr(tr, "counting", False))
                        or real(tr, *a))
    X = np.zeros((16, 16, 1, 16), np.float32)
    with pytest.raises(TraceError, match="more than 200 control paths; simplify its 'if's"):
        trace_mod.trace(_ifs(6), ["i", "j"], [X], ["X"])          # 3^6 = 729 paths
    assert sum(recording) <= 64 < len(recording)                  # the first paths traced, the rest counted


def test_a_body_under_the_limit_traces_the_same(monkeypatch):
    X = np.zeros((16, 16, 1, 16), np.float32)
    counted = trace_mod.trace(_ifs(5), ["i", "j"], [X], ["X"]).pretty()         # 243 paths: counted first
    monkeypatch.setattr(trace_mod, "COUNT_AFTER", 10 ** 6)
    assert trace_mod.trace(_ifs(5), ["i", "j"], [X], ["X"]).pretty() == counted


@pytest.mark.parametrize("bad, message", [("X[99, j]", "X: index 99 out of range for axis 0 of length 16"),
                                          ("X[i, j].T", "views cannot be transposed")])
def test_an_error_on_a_counted_path_keeps_its_message(bad, message):
    src = ("def body(i, j, X):\n    if i == 0:\n        relu(X[i, j], X[i, j])\n    else:\n"
           f"        relu(X[i, j], {bad})\n" + "".join(f"    if j == {c}:\n        relu(X[i, j], X[i, j])\n"
                                                     for c in range(1, 8)))
    X = np.zeros((16, 16, 1, 16), np.float32)
    with pytest.raises(TraceError, match=message):      # the first failing path is the 129th: counted first
        trace_mod.trace(_body(src), ["i", "j"], [X], ["X"])


# -- cosmetic: messages bounded ------------------------------------------------------------------------

def test_grid_beyond_any_pool_advises_shrinking_it():
    lk = kernel("A{R:1000000}B{C:1000000}", Loop(0, 10 ** 6), Loop(0, 10 ** 6), pool=pool_of(2))(
        lambda i, j, X: relu(X[0], X[0]))
    with pytest.raises(SpecError) as e:
        lk.accesses(np.zeros((2, 1, 16), np.float32))
    assert "set_num_threads(1000000000000)" not in str(e.value) and "at most 4096 threads" in str(e.value)


def test_spec_error_shows_a_window_of_a_long_spec():
    with pytest.raises(SpecError) as e:
        parse("a" * 50000 + "x" + "b" * 50000, 2)
    msg = str(e.value)
    assert len(msg) < 500 and "position 50000" in msg and "of 100001 characters" in msg
    line, caret = msg.splitlines()[1:3]
    assert line[caret.index("^")] == "x"
