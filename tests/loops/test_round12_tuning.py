"""Round 12 fixes of the tuner and the checker: declared scratch arrays (loops.scratch), skipped
candidates that do not use the budget, the budget's two names, the progress bar closed on an
interrupt, a short repr of a search result, lk.tune's signature, and the hooks' wording."""
import functools
import inspect
import pydoc

import numpy as np
import pytest

import tppasm as tpp
from isa.pool import Pool
from loops import Loop, LoopKernel, kernel, thread
from loops import tune as tune_module
from loops.trial import Candidate
from loops.tune import Tuned, search
from loops.tune_order import SKIPS_PER_SLOT, Order
from tppasm.testing import assert_matches_reference

relu, add, copy = tpp.relu(4, 8), tpp.binary("add", 4, 8), tpp.copy(4, 8)


@functools.cache
def _pool():
    """Two threads whatever the CPUs: the scratch and race cases need them."""
    return Pool(2)


def _per_thread(i, X, S, Y):
    relu(X[i], S[thread().tid])                 # one slot of S per thread
    add(S[thread().tid], X[i], Y[i])            # Y = relu(X) + X


def _scratch_arrays():
    X = np.random.default_rng(0).standard_normal((4, 4, 8)).astype(np.float32)
    return X, np.zeros((2, 4, 8), np.float32), np.zeros_like(X)


# -- 1. scratch arrays: the checker and the tuner -----------------------------------------------

def test_declared_scratch_is_not_compared_by_the_checker():
    k = kernel("A", Loop(0, 4), pool=_pool(), scratch=("S",))(_per_thread)
    X, S, Y = _scratch_arrays()
    assert k.scratch == ("S",)
    assert_matches_reference(k, X, S, Y)
    assert_matches_reference(k, X, S, Y, outputs=["Y"])


def test_undeclared_scratch_fails_with_advice_to_declare_it():
    k = kernel("A", Loop(0, 4), pool=_pool())(_per_thread)
    X, S, Y = _scratch_arrays()
    with pytest.raises(AssertionError, match=r"S: .*never wrote.*scratch=\('S',\)"):
        assert_matches_reference(k, X, S, Y)


def test_scratch_leaves_the_other_arrays_compared():
    @kernel("A", Loop(0, 4), pool=_pool(), scratch=("S",))
    def k(i, X, S, Y):
        relu(X[i], S[thread().tid])
        copy(X[thread().tid], Y[i])             # depends on the thread: .python() reads tid 0
    X, S, Y = _scratch_arrays()
    with pytest.raises(AssertionError, match="Y: "):
        assert_matches_reference(k, X, S, Y)


def test_checker_says_how_to_check_an_output_left_in_part():
    zero = tpp.zero(4, 8)

    @kernel("A", Loop(0, 3))
    def k(i, Y):
        zero(Y[i])                              # Y[3]: padding the nest leaves
    Y = np.ones((4, 4, 8), np.float32)
    with pytest.raises(AssertionError, match=r"never written.*outputs=\(\)"):
        assert_matches_reference(k, Y)
    assert_matches_reference(k, Y, outputs=())


def _tuned_scratch(scratch):
    @kernel("AB", Loop(0, 8), Loop(0, 4), pool=_pool(), scratch=scratch)
    def k(i, j, X, S, Y):
        relu(X[i, j], S[thread().tid])
        add(S[thread().tid], X[i, j], Y[i, j])
    X = np.random.default_rng(1).standard_normal((8, 4, 4, 8)).astype(np.float32)
    S, Y = np.zeros((2, 4, 8), np.float32), np.zeros_like(X)
    k.tune(X, S, Y, specs=["AB", "Ba", "aB", "BA"], model=False, reps=1, progress=False)
    return [note for spec, seconds, note in k.last_tuning if seconds is None]


def test_tuner_does_not_compare_declared_scratch():
    assert _tuned_scratch(("S",)) == []


def test_tuner_note_points_to_scratch():
    notes = _tuned_scratch(())
    assert notes and all("different result (S)" in n and "scratch=('S',)" in n for n in notes)


def test_scratch_names_are_checked():
    with pytest.raises(ValueError, match=r"no array parameter.*scratch=\('Y',\)"):
        kernel("A", Loop(0, 4), scratch=("T",))(_per_thread)
    with pytest.raises(TypeError, match="tuple of array parameter names"):
        kernel("A", Loop(0, 4), scratch=3)(_per_thread)
    k = kernel("A", Loop(0, 4), scratch="S")(_per_thread)
    assert k.scratch == ("S",) and k.with_spec("a").scratch == ("S",)


# -- 2. skipped candidates do not use the budget --------------------------------------------------

def _accumulating():
    """'aB' is the kernel's spec; 'Ab', 'AB' and 'bA' race on 2 threads (i steps accumulate into Y[j])."""
    @kernel("aB", Loop(0, 4), Loop(0, 4), pool=_pool())
    def k(i, j, X, Y):
        if i == 0:
            copy(X[i, j], Y[j])
        else:
            add(Y[j], X[i, j], Y[j])
    X = np.random.default_rng(2).standard_normal((4, 4, 4, 8)).astype(np.float32)
    return k, X, np.zeros((4, 4, 8), np.float32)


SPECS = ["aB", "Ab", "AB", "bA", "Ba", "ab"]


def test_racing_candidates_do_not_use_the_tune_budget():
    k, X, Y = _accumulating()
    k.tune(X, Y, specs=SPECS, budget=3, model=False, reps=1, progress=False)
    timed = [s for s, seconds, _ in k.last_tuning if seconds is not None]
    skipped = [s for s, seconds, _ in k.last_tuning if seconds is None]
    assert timed == ["aB", "Ba", "ab"] and skipped == ["Ab", "AB", "bA"]


def test_racing_candidates_do_not_use_the_search_top():
    k, X, Y = _accumulating()
    found = search(lambda: (k, (X, Y)), {}, specs=SPECS, top=2, model=False, reps=1, seconds=None,
                   progress=False, remember=False)
    assert found.record["timed"] == 2
    assert [c.spec for c in found.candidates if c.seconds is not None] == ["aB", "Ba"]


def test_skipped_candidates_end_an_unbounded_search_eventually():
    cands = [Candidate({}, f"s{i}") for i in range(100)]
    seen = sum(1 for _ in Order(cands, model=False, top=2, threads=2))      # each one skipped (seconds None)
    assert seen == 2 * SKIPS_PER_SLOT
    assert sum(1 for _ in Order(cands, model=False, top=2, threads=2, bounded=True)) == 100


# -- 3. the budget's two names ------------------------------------------------------------------

def test_budget_names_point_to_each_other():
    k, X, Y = _accumulating()
    with pytest.raises(TypeError, match="tune calls it budget=.*write budget=3"):
        k.tune(X, Y, top=3)
    with pytest.raises(TypeError, match="search calls it top=.*write top=3"):
        search(lambda: (k, (X, Y)), {}, budget=3, remember=False)
    with pytest.raises(TypeError, match=r"option of loops.tune.search.*clock="):
        k.tune(X, Y, clock="cpu")
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'bugdet'.*budget="):
        k.tune(X, Y, bugdet=3)


# -- 4. the progress bar is closed on an interrupt ------------------------------------------------

def test_progress_bar_closed_when_interrupted(monkeypatch):
    closed = []

    class Bar:
        def __init__(self, total, enabled):
            pass

        def step(self, c):
            pass

        def close(self, budget_ended=False, winner=None):
            closed.append(True)
    calls = []

    def interrupted(c, *args, **kw):
        calls.append(c.spec)
        if len(calls) > 1:
            raise KeyboardInterrupt
        c.seconds = 1e-3
    k, X, Y = _accumulating()
    monkeypatch.setattr(tune_module, "Progress", Bar)
    monkeypatch.setattr(tune_module, "measure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        k.tune(X, Y, specs=SPECS, model=False, reps=1)
    assert closed


# -- 5. a search result's repr is one short line ------------------------------------------------

def test_tuned_repr_is_short():
    record = {"kernel": "k", "spec": "aB", "knobs": {"bm": 8}, "seconds": 2e-3, "candidates": 9315, "timed": 40,
              "skipped": 3, "explored": ["0123456789"] * 4096}
    many = [Candidate({"bm": 8}, "aB")] * 9315
    text = repr(Tuned(record, many, arrays=(np.zeros((512, 512)),)))
    assert text == "Tuned(k: spec 'aB' bm=8, 2.000 ms; 40 of 9315 candidates timed, 3 skipped)"


# -- 6. lk.tune shows its options ----------------------------------------------------------------

def test_tune_help_shows_its_options():
    k, _, _ = _accumulating()
    params = inspect.signature(k.tune).parameters
    assert list(params)[:3] == ["arrays", "budget", "reps"] and "seconds" in params and "blocks" in params
    assert params["budget"].default == inspect.signature(tune_module.tune).parameters["budget"].default
    text = pydoc.render_doc(k.tune, renderer=pydoc.plaintext)
    assert "budget=16" in text and "``budget``: how many are timed at most" in text
    assert "budget=" in str(inspect.signature(LoopKernel.tune))


# -- 7. hooks run on the threads that take part --------------------------------------------------

def test_hook_docs_say_which_threads_run_them():
    for hook in (LoopKernel.init, LoopKernel.fini):
        assert "once per thread" not in hook.__doc__ and "takes part" in hook.__doc__
    k = kernel("ab", Loop(0, 2), Loop(0, 2))(lambda i, j, X: relu(X[i], X[i]))
    k.init(lambda X: relu(X[0], X[0]))
    text = k.explain(np.zeros((2, 4, 8), np.float32))
    assert "# init (once on each thread taking part)" in text and "serial: runs on the calling thread only" in text


def test_racing_candidates_leave_their_slots_without_the_model_too():
    k, X, Y = _accumulating()
    k.tune(X, Y, budget=3, model=False, reps=1, progress=False)
    assert len([s for s, seconds, _ in k.last_tuning if seconds is not None]) == 3


def test_scratch_names_keep_the_bodys_order_whatever_the_container():
    """A set's order follows the hash seed, and the names are part of a remembered record's key."""
    body = lambda i, X, S, T: None                  # noqa: E731
    kernels = [kernel("A", Loop(0, 4), scratch=given)(body) for given in ({"T", "S"}, ("T", "S"), ["S", "T"])]
    assert {k.scratch for k in kernels} == {("S", "T")}


def test_tunes_knobs_advice_is_a_call_that_runs():
    lk = kernel("A", Loop(0, 4))(lambda i, X: None)
    with pytest.raises(TypeError, match=r"loops.tune.search\(make, knobs, top=...\)"):
        lk.tune(np.zeros(4, np.float32), knobs={"bm": [1]})
