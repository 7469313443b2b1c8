"""The tuner's defects found by fz9f: the budget bounds the whole call (the spec space's
enumeration and the final rounds), racing candidates are skipped whatever ``races=`` says, a
remembered winner is checked in this process as on disk, retrace drops the tuned specs, and the
views show the nest that calls run."""
import warnings

import numpy as np
import pytest

import tppasm as tpp
from isa.pool import Pool
from loops import Loop, SpecError, enumerate as enumerate_module, kernel, trial
from loops import tune as tune_module
from loops.races import RaceError
from loops.signature import signature
from loops.tune import REMEMBERED, search, space
from loops.tune_options import check_options
from tppasm import cache
from tppasm.__main__ import _record_text

relu = tpp.relu(1, 4)


def _racy(races="refuse"):
    """'Ab' is race-free on 2 threads; 'aB' races: every j writes Y[i]."""
    @kernel("Ab", Loop(0, 4), Loop(0, 4), pool=Pool(2), races=races)
    def k(i, j, X, Y):
        relu(X[i], Y[i])
    X = np.random.rand(4, 1, 4).astype(np.float32)
    return k, X, np.zeros_like(X)


def _plain(spec="ab", n=4, parallel=True):
    @kernel(spec, Loop(0, n, parallel=parallel), Loop(0, 4))
    def k(i, j, X, Y):
        relu(X[i, j], Y[i, j])
    X = np.random.rand(n, 4, 1, 4).astype(np.float32)
    return k, X, np.zeros_like(X)


@pytest.fixture(autouse=True)
def _remembered_as_before():
    """What a test remembers in this process is forgotten after it."""
    before = dict(REMEMBERED), dict(tune_module._SPACES)
    yield
    for now, then in zip((REMEMBERED, tune_module._SPACES), before):
        now.clear()
        now.update(then)


class _Clock:
    """A virtual clock for loops.tune: every reading is ``tick`` seconds after the one before."""

    def __init__(self, tick):
        self.t, self.tick = 0.0, tick

    def perf_counter(self):
        self.t += self.tick
        return self.t


# -- 1: the budget bounds the spec space ------------------------------------------------------

def test_blockings_are_capped_by_the_nested_sizes_that_fit(monkeypatch):
    asked = []
    monkeypatch.setattr(enumerate_module, "iter_union", lambda desc, limits: asked.append(limits) or iter(()))
    enumerate_module.spec_space([Loop(0, 4), Loop(0, 5), Loop(0, 6)], {"a": 5, "b": 5, "c": 5})
    assert asked == [{"a": 1, "b": 1, "c": 1}]          # one size ([2]) fits each: one blocking


def test_the_budget_bounds_the_enumeration_of_the_space(monkeypatch, capsys):
    @kernel("abc", Loop(0, 8), Loop(0, 8), Loop(0, 8))
    def k(i, j, l, X):
        relu(X[i, j, l], X[i, j, l])
    X = np.random.rand(8, 8, 8, 1, 4).astype(np.float32)
    assert len(space(k)) > 1000
    monkeypatch.setattr(tune_module, "time", _Clock(0.01))
    found = search(lambda: (k, (X,)), {}, blocks=True, seconds=1, reps=1, remember=False, progress=False)
    assert found.record["candidates"] <= 60             # those enumerated in half the budget


def test_progress_says_when_the_budget_ended_the_search(monkeypatch, capsys):
    @kernel("abc", Loop(0, 8), Loop(0, 8), Loop(0, 8))
    def k(i, j, l, X):
        relu(X[i, j, l], X[i, j, l])
    X = np.random.rand(8, 8, 8, 1, 4).astype(np.float32)
    specs = [s for s in space(k) if "[" in s][:40]      # distinct nests: none is timed as another's twin
    monkeypatch.setattr(tune_module, "time", _Clock(0.05))
    search(lambda: (k, (X,)), {}, specs=specs, seconds=1, reps=1, remember=False, progress=True)
    assert "the seconds budget ended the search after" in capsys.readouterr().err


# -- 2 and 7: races ------------------------------------------------------------------------------

@pytest.mark.parametrize("races", ["warn", "allow"])
def test_racing_candidates_are_skipped_whatever_races_says(races):
    k, X, Y = _racy(races)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # nor does the skipped candidate warn
        assert k.tune(X, Y, specs=["Ab", "aB"], reps=1, progress=False) == "Ab"
    notes = {spec: (seconds, note) for spec, seconds, note in k.last_tuning}
    assert notes["aB"][0] is None and "race" in notes["aB"][1]


def test_every_listed_spec_racing_raises_its_race_error():
    k, X, Y = _racy("warn")
    with pytest.raises(RaceError, match="'aB' has a data race"):
        k.tune(X, Y, specs=["aB"], reps=1, progress=False)


# -- 3: the record remembered in this process ----------------------------------------------------

def test_a_remembered_record_is_kept_per_loop_declarations(tmp_path):
    with cache.using(tmp_path):
        k1, X, Y = _plain()
        k1.tune(X, Y, reps=1, progress=False, remember=True)
        key = next(k for k in REMEMBERED if k[0] == k1.__name__ and k[1] == ((X.shape, "float32"),) * 2)
        REMEMBERED[key]["spec"] = "Ab"                  # as if k1 had won 'Ab'
        k2, _, _ = _plain(parallel=False)               # same name, body and shapes; 'A' refused
        k2.with_spec(k2.tune(X, Y, reps=1, progress=False, remember=True))      # no SpecError for 'Ab'
        k2(X, Y)
        np.testing.assert_array_equal(Y, np.maximum(X, 0))


def test_the_in_process_key_holds_the_loop_declarations(tmp_path, monkeypatch):
    monkeypatch.setattr(tune_module.remembered, "load", lambda *args: None)     # nothing on disk
    with cache.using(tmp_path):
        k1, X, Y = _plain()
        k1.tune(X, Y, reps=1, progress=False, remember=True)
        key = next(k for k in REMEMBERED if k[0] == k1.__name__ and k[1] == ((X.shape, "float32"),) * 2)
        REMEMBERED[key]["spec"] = "ba"                  # a spec both kernels take
        k2, _, _ = _plain(parallel=False)
        k2.tune(X, Y, reps=1, progress=False, remember=True)
        assert len(k2.last_tuning) > 1                  # searched: k1's record is not k2's


def test_an_invalid_remembered_winner_is_searched_again(tmp_path):
    with cache.using(tmp_path):
        k, X, Y = _racy()
        k.tune(X, Y, reps=1, progress=False, remember=True, specs=["Ab", "ab"])
        assert len(k.last_tuning) >= 1
        k.tune(X, Y, reps=1, progress=False, remember=True, specs=["Ab", "ab"])
        assert len(k.last_tuning) == 1                  # the remembered winner's check
        key = next(key for key in REMEMBERED if key[0] == "k" and key[1] == ((X.shape, "float32"),) * 2)
        REMEMBERED[key]["spec"] = "aB"                  # stale: races on 2 threads
        assert k.tune(X, Y, reps=1, progress=False, remember=True, specs=["Ab", "ab"]) in ("Ab", "ab")


# -- 4 and 5: retrace, explain, the views --------------------------------------------------------

def test_retrace_drops_the_tuned_spec():
    k, X, Y = _plain()
    assert k.tune(X, Y, specs=["ba"], reps=1, progress=False) == "ba"
    assert "tuned: 'ba'" in repr(k)
    k.retrace()
    assert k._tuned == {} and "tuned" not in repr(k)
    assert k.explain(X, Y).startswith("# nest 'ab'")


def test_explain_and_the_views_show_the_tuned_nest():
    k, X, Y = _plain()
    k(X, Y)
    k.tune(X, Y, specs=["ba"], reps=1, progress=False)
    assert "# nest 'ba'" in k.explain(X, Y) and "declared 'ab'" in k.explain(X, Y)
    k(X, Y)
    assert "# nest 'ba'" in k.explain()
    html = k._repr_html_()
    assert "tuned spec <code>ba</code>" in html and "# nest &#x27;ba&#x27;" in html


def test_the_repr_counts_shapes_not_thread_counts():
    k, X, Y = _plain()
    k._tuned[signature((X, Y)), 1] = k._tuned[signature((X, Y)), 2] = "ba"
    assert "tuned: 'ba' for 1 shape(s) on 1 and 2 threads" in repr(k)


# -- 6: the final rounds ---------------------------------------------------------------------------

def test_the_final_timings_stop_after_the_repeat_time(monkeypatch):
    k, X, Y = _plain()
    runs = []
    monkeypatch.setattr(trial, "elapsed", lambda fn, arrays, clock="wall": runs.append(1) or 0.01)
    trial.time_again(trial.Candidate({}, "ab"), trial.Builds(lambda: (k, (X, Y))), reps=1000)
    assert 1 <= len(runs) <= 4


def test_the_final_rounds_stop_at_the_deadline(monkeypatch):
    k, X, Y = _plain()
    again, clock = [], _Clock(0.01)

    def measure(c, *args, **kw):                        # each candidate takes half the budget
        c.seconds, clock.t = 1e-3, clock.t + 0.5
    monkeypatch.setattr(tune_module, "measure", measure)
    monkeypatch.setattr(tune_module, "time_again", lambda c, *a, **kw: again.append(c) or 1.0)
    monkeypatch.setattr(tune_module, "time", clock)
    search(lambda: (k, (X, Y)), {}, specs=["ab", "ba"], seconds=1, reps=1, remember=False, progress=False)
    assert again == []


# -- smaller ---------------------------------------------------------------------------------------

def test_the_margin_prefers_the_kernels_own_spec_and_the_winner_is_marked(monkeypatch):
    k, X, Y = _plain()
    times = {"ba": 0.99e-3, "ab": 1.0e-3}              # 'ba' 1% faster: within the margin

    def fake(c, *args, **kw):
        c.seconds = times[c.spec]
    monkeypatch.setattr(tune_module, "measure", fake)
    monkeypatch.setattr(tune_module, "time_again", lambda c, *a, **kw: times[c.spec])
    found = search(lambda: (k, (X, Y)), {}, specs=["ba", "ab"], seconds=1, reps=1, remember=False, progress=False)
    assert found.record["spec"] == "ab" and found.record["reference_seconds"] == times["ab"]
    k.tune(X, Y, specs=["ba", "ab"], reps=1, progress=False)
    assert dict((s, note) for s, _, note in k.last_tuning) == {"ab": "chosen", "ba": ""}


def test_a_budget_too_large_for_a_float_is_a_value_error():
    with pytest.raises(ValueError, match="seconds="):
        check_options("tune", seconds=10 ** 400)
    check_options("tune", seconds=2 ** 70)              # a float's range, as 1e300: no limit in effect


def test_an_empty_blocks_dict_blocks_no_loop():
    k = kernel("ab", Loop(0, 8, blocks=[4]), Loop(0, 4))(lambda i, j, X: None)
    assert space(k, {}) == space(k, {"a": 0}) == [s for s in space(k, False) if len(s) == 2]


def test_cache_list_shows_sub_second_tuning():
    record = {"key": ["k"], "spec": "ab", "seconds": 1e-3, "tuning_seconds": 0.47}
    assert "0.47 s of tuning" in _record_text("tune", record)


def test_an_unknown_spec_list_still_raises_spec_error():
    k, X, Y = _plain(parallel=False)
    with pytest.raises(SpecError):
        k.tune(X, Y, specs=["Ab"], progress=False)
