"""The tuner: specs, block sizes and knobs searched; every pick computes what the reference computes."""
import numpy as np
import pytest

import tppasm as tpp
from bench.gemm import gemm_maker
from loops import Loop, kernel
from loops.enumerate import bake_blocks, block_sizes, block_tuples, spec_space
from isa.pool import get_pool
from loops.spec import parse
from loops.tune import REMEMBERED, search, space


def small_gemm(M=40, N=24, K=56, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    return a, b, gemm_maker(a, b, "f32", get_pool())


def test_search_over_knobs_specs_and_blocks_matches_python():
    a, b, make = small_gemm()
    knobs = {"bm": [16, 8], "bn": [16], "bk": [16, 8], "kstep": [2, 1], "edges": [False, True]}
    found = search(make, knobs, seconds=30, top=40, reps=1, progress=False, remember=False)
    r = found.record
    assert r["timed"] >= 2 and r["candidates"] > r["timed"] and r["spec"] and set(r["knobs"]) == set(knobs)
    np.testing.assert_allclose(found.output(), a @ b, rtol=1e-4, atol=1e-4)
    # the winner, run again in Python with the NumPy references, computes the same
    lk, (A, B, C), output = make(**r["knobs"])
    C[...] = np.nan
    lk.with_spec(r["spec"]).python(A, B, C)
    np.testing.assert_allclose(output(), a @ b, rtol=1e-4, atol=1e-4)
    assert all(c.config in [dict(zip(knobs, v)) for v in __import__("itertools").product(*knobs.values())]
               for c in found.candidates)


def test_a_spec_with_a_different_result_is_never_picked():
    zero = tpp.zero(4, 8)
    X = np.ones((16, 4, 8), np.float32)

    @kernel("a", Loop(0, 16))
    def clear(i, X):
        zero(X[i])
    # 'a[,2,,()]' bakes the end to 2: it clears 2 of the 16 blocks, so it is faster and wrong
    found = search(lambda: (clear, (X,)), {}, specs=["a", "a[,2,,()]"], seconds=20, reps=3, progress=False,
                   remember=False, model=False)
    assert found.record["spec"] == "a"
    wrong = [c for c in found.candidates if c.spec == "a[,2,,()]"][0]
    assert wrong.seconds is None and "different result" in wrong.note


def test_tune_with_blocks_bakes_block_sizes_and_remembers_them():
    a, b, make = small_gemm(64, 64, 32)
    lk, (A, B, C), output = make(bm=8, bn=16, bk=16, kstep=1)
    best = lk.tune(A, B, C, blocks=True, budget=12, reps=1, progress=False)
    parse(best, 3).resolve(lk.loops)                            # a legal spec for these loops
    assert len(lk.last_tuning) >= 2
    C[...] = np.nan
    lk(A, B, C)                                                 # runs the remembered spec
    np.testing.assert_allclose(output(), a @ b, rtol=1e-4, atol=1e-4)


def test_search_is_remembered_per_key():
    a, b, make = small_gemm(16, 16, 16)
    key = ("test", id(make))
    try:
        first = search(make, {"bm": [16, 8]}, seconds=10, top=4, reps=1, progress=False, key=key)
        assert REMEMBERED[key] is first.record
        again = search(make, {"bm": [16, 8]}, seconds=10, top=4, reps=1, progress=False, key=key)
        # recalled, and checked again as a disk record is: its one candidate is that check
        assert again.record["spec"] == first.record["spec"] and again.record["recalled"]
        assert [c.spec for c in again.candidates] == [first.record["spec"]]
    finally:
        REMEMBERED.pop(key, None)


def test_knob_errors_name_the_fix():
    a, b, make = small_gemm(16, 16, 16)
    with pytest.raises(TypeError, match="non-empty list"):
        search(make, {"bm": 16}, progress=False, remember=False)
    with pytest.raises(TypeError, match="must return"):
        search(lambda: None, {}, progress=False, remember=False)
    with pytest.raises(TypeError, match="every knob must name a parameter of make"):
        search(make, {"tile": [16]}, progress=False, remember=False)


# -- the candidate space -------------------------------------------------------------------

def test_block_sizes_and_tuples():
    assert block_sizes(16) == [2, 4, 8] and block_sizes(64, most=2) == [16, 32] and block_sizes(1) == []
    assert block_sizes(10, step=3) == [6, 12]
    assert block_tuples([2, 4, 8], 1) == [(2,), (4,), (8,)] and block_tuples([2, 4], 0) == [()]
    assert all(t[0] > t[1] and t[0] % t[1] == 0 for t in block_tuples([2, 4, 8, 16], 2))
    assert bake_blocks("aBCb", {"b": (4,)}) == "aB[,,,(4)]Cb"


def test_every_spec_of_the_space_is_legal_and_distinct():
    loops = (Loop(0, 12, 3, parallel=False), Loop(0, 9), Loop(0, 16, blocks=[4]))
    specs = spec_space(loops, {"a": 1, "b": 1, "c": 2})
    assert len(specs) == len(set(specs)) > 500
    for s in specs:
        resolved = parse(s, 3).resolve(loops)
        for lp in resolved:
            assert all(b % lp.step == 0 for b in lp.blocks)


def test_space_puts_the_current_spec_first():
    k = kernel("cab", Loop(0, 4), Loop(0, 8), Loop(0, 2))(lambda i, j, m: None)
    assert space(k)[0] == "cab" and space(k, blocks=False)[0] == "cab"
    assert any("[,,,(" in s for s in space(k)) and not any("[" in s for s in space(k, blocks=False))


from hypothesis import given, settings, strategies as st  # noqa: E402

_POOLS = {}


def pool_of(threads):
    from isa.pool import Pool
    if get_pool().nthreads == threads:
        return get_pool()
    return _POOLS.setdefault(threads, Pool(threads))


@settings(max_examples=6)
@given(M=st.integers(1, 48), N=st.integers(1, 48), K=st.integers(1, 48), threads=st.sampled_from([1, 2]))
def test_tuned_variants_of_any_shape_match_numpy(M, N, K, threads):
    rng = np.random.default_rng(M + 100 * N + 10000 * K)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    make = gemm_maker(a, b, "f32", pool_of(threads))
    knobs = {"bm": [16, 8], "bn": [16], "bk": [16, 8], "kstep": [2], "edges": [False, True]}
    found = search(make, knobs, seconds=3, top=12, reps=1, progress=False, remember=False)
    lk, (A, B, C), output = make(**found.record["knobs"])
    C[...] = np.nan
    lk.with_spec(found.record["spec"])(A, B, C)
    np.testing.assert_allclose(output(), a @ b, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(a @ b).max())))


@pytest.mark.parametrize("faster, keeps", [(0.99, True), (0.9, False)])
def test_the_reference_is_kept_unless_a_candidate_beats_it_by_the_margin(monkeypatch, faster, keeps):
    """A 1% win in the playoff is noise on a shared machine: the reference stays; 10% wins."""
    import loops.tune as tune
    _, _, make = small_gemm()
    first = []

    def seconds(c, *args, **kwargs):
        first[:] = first or [c]                    # the reference is timed first
        return 1.0 if c is first[0] else faster

    def fake_measure(c, *args, **kwargs):
        c.seconds = seconds(c)
    monkeypatch.setattr(tune, "measure", fake_measure)
    monkeypatch.setattr(tune, "time_again", seconds)
    knobs = {"bm": [16, 8], "bn": [16], "bk": [16], "kstep": [1], "edges": [True]}
    r = search(make, knobs, seconds=30, top=10, reps=1, progress=False, remember=False).record
    assert ((r["knobs"], r["spec"]) == (first[0].config, first[0].spec)) == keeps


def test_hints_are_timed_first_and_play_in_the_final_rounds(monkeypatch):
    """A hint (another search's record: one thread's winner for two) is timed even when ``top``
    leaves no room for it and wins when it is the fastest; a hint whose spec the kernel refuses is
    dropped, not raised."""
    import loops.tune as tune
    _, _, make = small_gemm()
    hint = {"knobs": {"bm": 8, "bn": 16, "bk": 8, "kstep": 2, "edges": True}, "spec": "aBC", "seconds": 1.0}
    refused = {"knobs": hint["knobs"], "spec": "ABC"}          # loop a (K) is sequential: refused

    def seconds(c, *args, **kwargs):
        return 0.5 if (c.config, c.spec) == (hint["knobs"], hint["spec"]) else 1.0
    real_measure = tune.measure

    def fake_measure(c, *args, **kwargs):
        real_measure(c, *args, **kwargs)                     # the check (and a refused spec's note)
        if c.seconds is not None:
            c.seconds = seconds(c)
    monkeypatch.setattr(tune, "measure", fake_measure)
    monkeypatch.setattr(tune, "time_again", seconds)
    knobs = {"bm": [16], "bn": [16], "bk": [16], "kstep": [1], "edges": [True]}
    found = search(make, knobs, seconds=30, top=1, reps=1, progress=False, remember=False,
                   hints=[refused, hint, dict(hint)])
    assert (found.record["knobs"], found.record["spec"]) == (hint["knobs"], hint["spec"])
    assert found.record["timed"] == 2                          # the reference and the hint (once)
    a, b, _ = small_gemm()
    np.testing.assert_allclose(found.output(), a @ b, rtol=1e-4, atol=1e-4)
    assert search(make, knobs, seconds=30, top=1, reps=1, progress=False, remember=False).record["knobs"]["bm"] != 8


@pytest.mark.parametrize("hints", [{"spec": "aBC"}, [{"spec": "aBC"}], [{"knobs": {}, "spec": 3}], ["aBC"]])
def test_malformed_hints_name_the_form(hints):
    _, _, make = small_gemm()
    with pytest.raises(TypeError, match="hints.*expected a list of records"):
        search(make, {"bm": [16]}, progress=False, remember=False, hints=hints)


@pytest.mark.parametrize("run, runs", [(0.001, 4), (0.02, 3), (0.05, 2)])
def test_a_candidate_is_timed_by_its_checking_run_and_repeats_up_to_a_time(monkeypatch, run, runs):
    """The checking run is the first sample; repeats (``reps`` at most, one at least) stop once they
    took :data:`loops.trial.REPEAT_SECONDS`: a long run gets one, a short one all three. The
    candidate's seconds are the least of its samples."""
    import loops.trial as trial
    from loops.trial import Builds, Candidate, measure
    _, _, make = small_gemm()
    builds = Builds(make)
    config = {"bm": 16, "bn": 16, "bk": 16, "kstep": 1, "edges": True}
    reference = builds.get(config).reference()
    times = iter([run * 1.5] + [run] * 10)
    calls = []

    def fake_elapsed(fn, arrays, clock="wall"):
        fn(*arrays)
        calls.append(1)
        return next(times)
    monkeypatch.setattr(trial, "elapsed", fake_elapsed)
    c = Candidate(config, "aBC")
    measure(c, builds, reference, 3, 1e-4)
    assert (len(calls), c.seconds) == (runs, run) and not c.note
