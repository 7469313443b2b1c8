"""Gaps in the loop DSL's tests found by mutation testing (round 12, fz12g): a step that does not
divide its loop's span, an if/elif/else on one index, two calls on one array merged into one
covering block by the race analysis, the fixes a RaceError names, and the tuner's spec space over a
loop of one iteration."""
import numpy as np
import pytest

import tppasm as tpp
from loops import BoundsError, Loop, kernel
from loops.enumerate import spec_space
from loops.races import RaceError, check
from tests.support import pool_of

relu, zero, copy = tpp.relu(4, 4), tpp.zero(4, 4), tpp.unary("copy", 4, 4)


# -- S04: Loop.trip rounds up, so the bounds check sees the last index --------------------------------

@pytest.mark.parametrize("start, end, step, trip", [(0, 5, 2, 3), (0, 4, 2, 2), (1, 8, 3, 3), (0, 1, 4, 1)])
def test_trip_counts_a_last_partial_step(start, end, step, trip):
    assert Loop(start, end, step).trip == len(range(start, end, step)) == trip


def test_last_index_of_a_step_that_does_not_divide_the_span_is_bounds_checked():
    @kernel("a", Loop(0, 5, 2))                      # i = 0, 2, 4
    def k(i, X, Y):
        relu(X[i], Y[i])

    base = np.full((6, 4, 4), 5.0, np.float32)
    X, Y = base[:4], np.zeros((5, 4, 4), np.float32)     # X[4] would read base[4], outside X
    with pytest.raises(BoundsError, match="i=4"):
        k(X, Y)
    assert not Y.any()                                   # refused before any kernel ran


# -- F02: if / elif / else on one index: the else branch holds only i == 2 ----------------------------

def _three_way(i, X, Y):
    if i > 2:
        relu(X[i], Y[i])
    elif i < 2:
        zero(Y[i])
    else:
        copy(X[i], Y[i])


@pytest.mark.parametrize("spec", ["a", "A"])
def test_if_elif_else_on_one_index_takes_each_iteration_s_branch(spec):
    X = np.random.default_rng(0).standard_normal((5, 4, 4)).astype(np.float32)
    got = np.full((5, 4, 4), 7.0, np.float32)
    kernel(spec, Loop(0, 5), pool=pool_of(2))(_three_way)(X, got)
    want = np.stack([np.maximum(X[i], 0) if i > 2 else np.zeros_like(X[i]) if i < 2 else X[i]
                     for i in range(5)])
    np.testing.assert_array_equal(got, want)


# -- R03 / R07: two calls on one array at different offsets, merged into one covering block -----------

def _racy(writes, read):
    """A kernel over Loop(0, 4) in which iteration i writes ``writes`` of Y[i] and reads ``read`` of
    Y[3 - i] (which iteration 3 - i, on the other thread, writes)."""
    def body(i, X, Y, Z):
        for op, rows in writes:
            op(X[i], Y[i, rows])
        read[0](Y[3 - i, read[1]], Z[i])
    return kernel("A", Loop(0, 4), races="allow", pool=pool_of(2))(body)


def _arrays():
    return (np.ones((4, 4, 4), np.float32), np.zeros((4, 8, 4), np.float32), np.zeros((4, 4, 4), np.float32))


def test_race_on_the_second_of_two_adjacent_blocks_is_reported():
    lk = _racy([(copy, slice(0, 4)), (copy, slice(4, 8))], (copy, slice(4, 8)))
    assert check(lk, _arrays(), nthreads=2)


def test_race_on_the_second_of_two_interleaved_strided_blocks_is_reported():
    put = tpp.unary("copy", 4, 4, ldo=8)              # writes 4 rows 8 apart
    get = tpp.unary("copy", 4, 4, ldx=8)              # reads 4 rows 8 apart
    lk = _racy([(put, slice(0, 8, 2)), (put, slice(1, 8, 2))], (get, slice(1, 8, 2)))
    assert check(lk, _arrays(), nthreads=2)


def test_merged_blocks_read_by_their_own_iteration_are_race_free():
    @kernel("A", Loop(0, 4), races="allow", pool=pool_of(2))
    def k(i, X, Y, Z):
        copy(X[i], Y[i, 0:4])
        copy(X[i], Y[i, 4:8])
        copy(Y[i, 4:8], Z[i])

    assert check(k, _arrays(), nthreads=2) == []


# -- R05: every fix a RaceError names is itself race-free ---------------------------------------------

def test_every_fix_a_race_error_names_passes_check():
    @kernel("AB", Loop(0, 3), Loop(0, 2), pool=pool_of(2))
    def k(i, j, X, Y):
        relu(X[i], Y[i])                                 # every j writes the same Y[i]

    X = np.ones((3, 4, 4), np.float32)
    with pytest.raises(RaceError) as e:
        k(X, X.copy())
    assert e.value.fixes
    for fix in e.value.fixes:
        assert check(k, (X, X.copy()), fix, nthreads=2) == [], fix
        assert repr(fix) in str(e.value)


# -- E01: the tuner never parallelizes a loop of one iteration ----------------------------------------

@pytest.mark.parametrize("loops", [[Loop(0, 1), Loop(0, 16)], [Loop(0, 16), Loop(3, 4)], [Loop(0, 9, 10)]])
def test_spec_space_keeps_one_iteration_loops_serial(loops):
    space = spec_space(loops, {})
    one = [chr(ord("A") + k) for k, lp in enumerate(loops) if lp.trip == 1]
    assert space and not [s for s in space if any(letter in s for letter in one)]
