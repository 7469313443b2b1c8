"""The tuner's defects found by fuzzing (fz6b): tuned specs stay with the kernel that was tuned and
its thread count, results with NaN/inf are compared exactly, outputs are poisoned, damaged
records and other searches' records are never used, chunks the nests cannot take are refused."""
import numpy as np
import pytest

import tppasm as tpp
from isa.pool import Pool, get_num_threads, set_num_threads
from loops import Loop, SpecError, kernel, remembered
from loops.races import RaceError
from loops.spec import parse
from loops.trial import Built, same
from loops.tune import REMEMBERED, search
from tppasm import cache

from tests.loops.test_remembered import _zeroing

copy = tpp.copy(1, 4)


def _racy():
    """A kernel whose every iteration writes Y[0]: any parallel spec is a race on 2 threads."""
    @kernel("ab", Loop(0, 4), Loop(0, 4), pool=Pool(2))
    def k(i, j, X, Y):
        copy(X[i, j], Y[0])
    return k, np.ones((4, 4, 1, 4), np.float32), np.zeros((1, 1, 4), np.float32)


def test_with_spec_after_tune_runs_the_spec_it_names():
    k, X, Y = _racy()
    k.tune(X, Y, specs=["ab", "ba"], reps=1, progress=False)
    with pytest.raises(RaceError):
        k.with_spec("Ab")(X, Y)


def test_a_second_tune_times_each_candidate_itself():
    k, X, Y = _racy()
    k.tune(X, Y, specs=["ab", "ba"], reps=1, progress=False)
    k.tune(X, Y, specs=["ab", "Ab", "ba"], reps=1, progress=False)
    notes = {spec: (seconds, note) for spec, seconds, note in k.last_tuning}
    assert notes["Ab"][0] is None and "race" in notes["Ab"][1]


def test_a_tuned_spec_is_kept_per_thread_count():
    before = get_num_threads()

    @kernel("ab", Loop(0, 4), Loop(0, 4))
    def k(i, j, X, Y):
        copy(X[i, j], Y[i, j])
    X = np.random.rand(4, 4, 1, 4).astype(np.float32)
    Y = np.zeros_like(X)
    try:
        set_num_threads(2)
        assert k.tune(X, Y, specs=["A{R:2}b"], reps=1, progress=False) == "A{R:2}b"
        set_num_threads(1)                  # a 2x1x1 grid does not fit: the kernel's own spec runs
        Y[...] = np.nan
        k(X, Y)
        np.testing.assert_array_equal(X, Y)
    finally:
        set_num_threads(before)


def test_same_compares_nan_and_inf_exactly():
    nan, inf = np.nan, np.inf
    assert same([np.array([nan, 1.0, inf])], [np.array([nan, 1.0, inf])], 1e-4)
    assert not same([np.array([inf, 12345.0, -7.0])], [np.array([inf, 1.0, 2.0])], 1e-4)
    assert not same([np.array([1.0, nan])], [np.array([nan, 1.0])], 1e-4)
    assert not same([np.array([inf, 1.0])], [np.array([-inf, 1.0])], 1e-4)


def test_tune_keeps_a_nan_the_kernel_keeps():
    relu = tpp.relu(1, 4)

    @kernel("ab", Loop(0, 4), Loop(0, 4))
    def k(i, j, X, Y):
        relu(X[i, j], Y[i, j])
    X = np.random.randn(4, 4, 1, 4).astype(np.float32)
    X[1, 2, 0, 3] = np.nan
    assert k.tune(X, np.empty_like(X), specs=["ab", "ba"], reps=1, progress=False) in ("ab", "ba")


def test_outputs_are_poisoned_and_a_candidate_that_writes_nothing_fails():
    @kernel("A", Loop(0, 4))
    def k(i, X, Y):
        copy(X[i], Y[i])
    X = np.random.rand(4, 1, 4).astype(np.float32)
    Y = np.empty_like(X)
    k(X, Y)                                # Y already holds the result (README: gemm(...) then tune)
    built = Built((k, (X, Y)))
    want = built.reference()
    assert built.poison and built.outputs == {1}
    built.restore()
    assert np.isnan(Y).all() and not np.isnan(X).any()
    assert not same(built.result(), want, 1e-4)          # a candidate that wrote nothing


@pytest.mark.parametrize("damage", [{"explored": 5}, {"explored": [["x"]]}, {"runs": "2"}, {"runs": 0},
                                    {"tuning_seconds": None}, {"tuning_seconds": float("nan")},
                                    {"spec": "A@schedule(dynamic,99999999999)"}])
def test_a_damaged_record_costs_a_search(tmp_path, damage):
    make, knobs, key = _zeroing(), {"bm": [4, 8]}, ("test_tune_defects", "damaged")
    with cache.using(tmp_path):
        try:
            first = search(make, knobs, seconds=5, top=3, reps=1, progress=False, key=key)
            disk = remembered.disk_key(key, [{"bm": 4}, {"bm": 8}], None, True, make, make(4)[0],
                                       first.record["threads"])
            assert remembered.load(disk, [{"bm": 4}, {"bm": 8}]) is not None
            cache.remember("tune", disk, {**first.record, **damage})
            assert remembered.load(disk, [{"bm": 4}, {"bm": 8}]) is None or "spec" in damage
            REMEMBERED.pop(key)
            again = search(make, knobs, seconds=5, top=3, reps=1, progress=False, key=key, resume=True)
            assert again.record["runs"] == 1 and not again.record["resumed"]
            again()
            assert (again.output() == 0).all()
        finally:
            REMEMBERED.pop(key, None)


def test_a_record_serves_only_the_search_it_came_from(tmp_path):
    def make_a(bm):
        @kernel("a", Loop(0, 4))
        def body(i, X, Y):
            copy(X[i], Y[i])
        X = np.random.rand(4, 1, 4).astype(np.float32)
        return body, (X, np.zeros_like(X))

    def make_b(order):
        @kernel("a", Loop(0, 4))
        def body(i, X, Y):
            copy(X[i], Y[3 - i])
        X = np.random.rand(4, 1, 4).astype(np.float32)
        return body, (X, np.zeros_like(X))
    before = set(REMEMBERED)
    with cache.using(tmp_path):
        try:
            assert search(make_a, {"bm": [1, 2]}, seconds=2, progress=False).record["knobs"]["bm"] in (1, 2)
            assert search(make_b, {"order": ["x", "y"]}, seconds=2, progress=False).record["knobs"]["order"] in ("x", "y")
            third = search(lambda bm: make_b("x"), {"bm": [8, 16]}, seconds=2, progress=False)
            assert third.record["knobs"]["bm"] in (8, 16) and third.candidates
        finally:
            for key in set(REMEMBERED) - before:
                REMEMBERED.pop(key)


def test_a_chunk_the_nests_cannot_take_is_refused_by_the_spec():
    with pytest.raises(SpecError, match=r"2\*\*31"):
        parse("A@schedule(static,2147483648)", 1)
    with pytest.raises(SpecError, match=r"2\*\*31"):
        parse("A@schedule(dynamic,4294967296)", 1)
    zero = tpp.zero(1, 4)
    for kind in ("static", "dynamic"):
        k = kernel(f"A@schedule({kind},2147483647)", Loop(0, 5), pool=Pool(2))(lambda i, X: zero(X[i]))
        X = np.ones((5, 1, 4), np.float32)
        k(X)
        assert (X == 0).all()


def test_search_takes_torch_tensors_from_make():
    torch = pytest.importorskip("torch")
    X, Y = torch.rand(4, 1, 4), torch.zeros(4, 1, 4)

    @kernel("A", Loop(0, 4))
    def k(i, X, Y):
        copy(X[i], Y[i])
    found = search(lambda n: (k, (X, Y)), {"n": [1]}, seconds=1, progress=False, remember=False)
    assert found.record["timed"] >= 1 and torch.equal(X, Y)
    Y.zero_()
    found = search(lambda n: (k, (X, Y), lambda: Y), {"n": [1]}, seconds=1, progress=False, remember=False)
    Y.zero_()
    found()
    assert torch.equal(X, Y)


def test_a_tiny_budget_searches_without_the_model():
    found = search(_zeroing(), {"bm": [4, 8]}, seconds=0.5, progress=False, remember=False)
    assert found.record["model"] is False and found.record["timed"] >= 1


# -- unclear errors ------------------------------------------------------------------------------

@pytest.mark.parametrize("offset", [abs, lambda i: i ** 2, lambda i: i << 1, lambda i: i & 1, round])
def test_non_affine_index_operations_raise_a_trace_error_naming_the_fix(offset):
    from loops import TraceError
    X = np.random.rand(6, 1, 4).astype(np.float32)
    k = kernel("a", Loop(0, 6))(lambda i, X, Y: copy(X[offset(i)], Y[i]))
    with pytest.raises(TraceError, match="offsets must be affine"):
        k(X, np.zeros_like(X))


def test_a_unicode_digit_in_a_baked_block_size_is_a_spec_error():
    with pytest.raises(SpecError, match="block size '²'"):
        parse("a[,,,(²)]", 1)
    with pytest.raises(SpecError) as e:
        parse("a[,,,(4,)]", 1)
    assert e.value.args[0].splitlines()[-1].index("^") - 2 == 8        # under the empty size, not the '4'


def test_search_argument_errors_name_the_fix():
    with pytest.raises(TypeError, match="a loops.kernel nest and a tuple of its arrays"):
        search(lambda: (None, ()), progress=False, remember=False)
    with pytest.raises(TypeError, match="not hashable"):
        search(_zeroing(), {"bm": [4]}, key=["gemm"], progress=False, remember=False)
    k = kernel("a", Loop(0, 4))(lambda i, X: None)
    with pytest.raises(ValueError, match="<= 5"):
        k.tune(np.zeros(4), blocks={"a": 9}, progress=False)


def test_a_hook_that_takes_more_arrays_than_the_nest_has_is_refused():
    k = kernel("a", Loop(0, 2))(lambda i, X: None)

    @k.init
    def setup(X, Y):
        pass
    with pytest.raises(TypeError, match="hook 'setup' takes 2 arrays"):
        k(np.zeros(3))


def test_the_grid_message_of_an_own_pool_names_the_pool():
    k = kernel("A{R:2}", Loop(0, 4), pool=Pool(1))(lambda i, X: None)
    with pytest.raises(SpecError, match=r"pool=Pool\(2\)"):
        k(np.zeros(3))
