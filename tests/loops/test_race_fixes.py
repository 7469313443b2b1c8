"""The fixes a RaceError names (loops.races.fixes over loops.race_fixes' edits of the spec).

A refusal names at least one spec that binds, is race-free (to the same analysis, and here to the
independent oracle of test_races_oracle) and computes what its own serial order computes; one that
keeps the refused spec's serial order is always among them (every loop serial, at worst), parallel
ones come first, and a fix that changes the serial order says so (a floating-point sum may round
differently). The cases below named no fix before: the racing pair differed only in a loop that was
already serial and outermost, or only two edits together (a loop made serial and a barrier or a
static schedule) remove every race.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import tppasm as tpp
from loops import Loop, kernel
from loops.race_fixes import candidates, parallel, reorders
from loops.races import RaceError
from loops.spec import SpecError, parse
from tests.loops.test_races_oracle import build, make_arrays, needs, nests, oracle, serial_text, snapshot
from tests.support import pool_of

V0, V1, C0, C1 = ("v", 0), ("v", 1), ("c", 0), ("c", 1)


def _op(name, f1, f2, strided=False):
    return (name, f1, f2, strided)


COPY_XAB_YB = ("copy", (_op("X", V0, V1), _op("Y", V1, C0)), None, 0)       # every a writes Y[b]
FIXLESS = [
    # the pair (a=0, b=0), (a=1, b=0) differs only in the serial outer a; Y[1, 1] races inside an instance
    ([Loop(0, 2), Loop(0, 4)], "aB@schedule(dynamic)", (COPY_XAB_YB, ("zero", (_op("Y", C1, C1),), None, 0)),
     "none", 2, ["ab"]),
    # a serial alone races across instances of B (dynamic): a serial and a barrier or a static schedule
    ([Loop(0, 3), Loop(0, 4)], "AB@schedule(dynamic)", (COPY_XAB_YB,), "none", 2,
     ["aB|@schedule(dynamic)", "aB"]),
    # found by the oracle's generators (the old search named none of these)
    ([Loop(1, 12, 3, [3, 9]), Loop(0, 1, 2, [2, 6])], "ABb@schedule(dynamic,2)",
     (("add", (_op("X", V0, C0), _op("X", C0, C1, True), _op("W", V1, ("rev", 1), True)), ("eqv", 0, 0), 0),),
     "selfoverlap", 3, ["aB|b@schedule(dynamic,2)", "aBb", "aBb@schedule(static,2)"]),
    ([Loop(0, 4), Loop(0, 3), Loop(0, 4)], "BCA[0,5,2,()]@schedule(static)",
     (("copy", (_op("Y", ("v+1", 0), V1, True), _op("Z", ("rev", 2), ("v+1", 2), True)), None, 0),),
     "transposed", 3, ["bCa[0,5,2,()]@schedule(static)"]),
    ([Loop(1, 12, 3, [6]), Loop(0, 4), Loop(0, 4)], "cBa@schedule(dynamic,2)",
     (("add", (_op("Z", ("rev", 0), V1), _op("Y", ("v+1", 1), ("v", 2)), _op("Z", ("rev", 2), C1, True)),
       ("eq", 0, 4), 0),), "transposed", 3, ["cba"]),
]


@pytest.mark.parametrize("case", FIXLESS, ids=lambda c: f"{c[1]}-{c[4]}")
def test_refusals_that_named_no_fix_name_fixes_that_bind_and_compute_their_serial_order(case):
    loops, text, program, alias, T, expect = case
    lk = build(loops, text, program, (), (), pool=pool_of(T))
    with pytest.raises(RaceError) as e:
        lk(*make_arrays(alias))
    assert e.value.fixes == expect, str(e.value)
    assert all(repr(fix) in str(e.value) for fix in expect)
    for fix in expect:
        assert not oracle(fix, loops, program, (), (), make_arrays(alias), T), fix
        want = make_arrays(alias)
        build(loops, serial_text(fix), program, (), ())(*want)
        for seed in range(3):
            got = make_arrays(alias)
            lk.with_spec(fix)(*got)                      # binds: refused again if it raced
            for g, w in zip(snapshot(got), snapshot(want)):
                np.testing.assert_array_equal(g, w, err_msg=f"{fix} of {text}, run {seed}")


def _gemm(spec):
    zero, gemm = tpp.zero(4, 4), tpp.brgemm(4, 4, 4, beta=1)

    @kernel(spec, Loop(0, 3), Loop(0, 2), Loop(0, 2), pool=pool_of(2))
    def mm(ik, im, jn, A, B, C):
        if ik == 0:
            zero(C[im, jn])
        gemm(A[im, ik:ik + 1], B[jn, ik:ik + 1], C[im, jn], count=1)
    return mm


def _refusal(lk, *arrays):
    with pytest.raises(RaceError) as e:
        lk(*arrays)
    return e.value


def test_a_fix_that_reorders_the_serial_loops_says_so_and_comes_after_those_that_keep_the_order():
    loops, program = [Loop(0, 3), Loop(0, 3)], (COPY_XAB_YB,)      # 'BA' splits b = 1 between two threads
    e = _refusal(build(loops, "BA", program, (), (), pool=pool_of(2)), *make_arrays("none"))
    assert e.fixes == ["Ba", "aB"], str(e)               # the pair differs in a: serial in place, or outermost
    todo = str(e).splitlines()[1]
    assert todo.startswith("  fix: write 'Ba' (checked race-free), or 'aB' (checked race-free; serial order "
                           "changes: sums may round differently); or pass races="), todo


def test_fixes_that_keep_the_serial_order_are_not_labelled_and_a_serial_one_only_without_them():
    A = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    C = np.zeros((2, 2, 4, 4), np.float32)
    e = _refusal(_gemm("aBC@schedule(dynamic,1)"), A, A, C)   # README's example
    assert e.fixes == ["aBC|@schedule(dynamic,1)", "aBC", "aBC@schedule(static,1)"]
    assert "serial order changes" not in str(e) and "'aBC@schedule(static,1)' (checked race-free);" in str(e)
    assert _refusal(_gemm("ABC"), A, A, C).fixes == ["aBC"]             # no 'abc' beside a parallel fix
    e = _refusal(_gemm("bcA"), A, A, C)                  # k parallel: every k step adds to the same C block
    assert e.fixes == ["bca"] and "serial order changes" not in str(e), str(e)   # not 'abc' (k outermost)


def test_edits_are_the_simple_ones_and_reorders_compares_the_serial_readings():
    assert list(candidates(parse("aB@schedule(dynamic,2)", 2), [0])) == [
        "aB|@schedule(dynamic,2)", "aB", "aB@schedule(static,2)", "a|B@schedule(dynamic,2)", "ab"]
    assert "B|a" in candidates(parse("BA|", 2), [0])       # the run's barrier follows it when A leaves the run
    pairs = list(candidates(parse("AB@schedule(dynamic)", 2), [0], edits=2))
    assert {"aB|@schedule(dynamic)", "aB"} <= set(pairs)
    assert reorders("aCb@schedule(static)", "cab") and reorders("bABb", "abBb")
    assert not reorders("aCb@schedule(static)", "acb") and not reorders("c[0,2,1,()]|B{R:2}aa", "c[0,2,1,()]|baa")
    assert parallel("aB{R:2}c|") and not parallel("a[0,4,1,(2)]b|")


def _legal(text, nloops):
    try:
        parse(text, nloops)
        return True
    except SpecError:
        return False


def _named_fixes_hold(case, T):
    """Bind ``case`` on ``T`` threads; on a refusal, the fixes it names against the oracle."""
    loops, text, program, init, fini, alias = case
    lk = build(loops, text, program, init, fini, pool=pool_of(T))
    try:
        lk(*make_arrays(alias))
        return
    except RaceError as e:
        err = e
    fixes = err.fixes
    assert fixes, ("a refusal named no fix", text, T, str(err))
    assert any(not reorders(text, f) for f in fixes), (text, fixes)
    for fix in fixes:
        assert not oracle(fix, loops, program, init, fini, make_arrays(alias), T), (text, fix, T)
        assert repr(fix) in str(err) and (not reorders(text, fix) or "serial order changes" in str(err))
    assert [parallel(f) for f in fixes] == sorted((parallel(f) for f in fixes), reverse=True), fixes
    if not any(parallel(f) for f in fixes):             # no parallel single edit of the spec is race-free
        for cand in candidates(lk.spec, range(len(loops))):
            if parallel(cand) and _legal(cand, len(loops)) and needs(cand) <= T:
                assert oracle(cand, loops, program, init, fini, make_arrays(alias), T), (text, T, cand, fixes)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nests(threads=False, hooks=False, allow_empty=False))
def test_every_refusal_names_a_fix_and_a_parallel_one_where_a_single_edit_gives_one(case):
    for T in (2, 3):
        if needs(case[1]) <= T:
            _named_fixes_hold(case, T)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nests())
def test_every_refusal_names_a_fix_with_thread_indices_hooks_and_empty_loops(case):
    for T in (2, 3):
        if needs(case[1]) <= T:
            _named_fixes_hold(case, T)
