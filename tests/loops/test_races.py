"""The race analysis (loops.races) against a brute-force oracle, and specs it accepts against real runs.

The oracle walks the nest the way the generated code does (tests/loops/test_nest.py checks the
code against the same walk), runs the body in Python on arrays of element ids with recording
kernels, and compares every pair of iterations that may run at the same time; the analysis must
find a race exactly when the oracle does, and each race it reports must be one of the oracle's.
"""
import itertools
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tppasm as tpp
from loops import Loop, SpecError, kernel, thread
from loops.races import RaceError, RaceWarning, check
from loops.spec import LETTERS, parse
from tests.loops.test_nest import specs
from tests.support import kernel_level, native_levels, pool_of

BLOCK = (2, 4)


# -- the oracle ----------------------------------------------------------------------------------

def walk(spec, loops, nthreads):
    """[(index tuple, thread or None, chunk or None, epoch)] in serial order (None: dynamic)."""
    levels, out = spec.levels, []
    x, hi, coord = {}, {}, {"R": 0, "C": 0, "L": 0}
    state = {"epoch": 0, "instance": 0}
    rows, cols, _ = spec.grid

    def rng(i):
        lv = levels[i]
        lp = loops[lv.loop]
        if lv.occurrence == 0:
            lo, top = lp.start, lp.end
        else:
            prev = (lv.loop, lv.occurrence - 1)
            lo, top = x[prev], min(x[prev] + lp.blocks[lv.occurrence - 1], hi[prev])
        return lo, top, lp.step if lv.last else lp.blocks[lv.occurrence]

    def leaf(owner, chunk):
        idx = tuple(x[(k, spec.occurrences[k] - 1)] for k in range(len(loops)))
        if spec.mode == "grid":
            owner = coord["L"] * rows * cols + coord["R"] * cols + coord["C"]
        out.append((idx, owner, chunk, state["epoch"]))

    def go(i, owner, chunk):
        if i == len(levels):
            leaf(owner, chunk)
            return
        lv = levels[i]
        if spec.mode == "collapse" and i == spec.run[0]:
            members = list(range(spec.run[0], spec.run[1] + 1))
            rs = [rng(j) for j in members]
            for j, (lo, top, s) in zip(members, rs):
                hi[(levels[j].loop, levels[j].occurrence)] = top
            trips = [len(range(*r)) for r in rs]
            n = int(np.prod(trips))
            kind, size = spec.schedule
            state["instance"] += 1
            for q, digits in enumerate(itertools.product(*[range(t) for t in trips])):
                for j, d, (lo, top, s) in zip(members, digits, rs):
                    x[(levels[j].loop, levels[j].occurrence)] = lo + d * s
                if kind == "dynamic":
                    who, ch = None, (state["instance"], q // (size or 1))
                elif size:
                    who, ch = (q // size) % nthreads, None
                else:
                    quot, rem = divmod(n, nthreads)
                    who, ch = next(t for t in range(nthreads) if q < (t + 1) * quot + min(t + 1, rem)), None
                go(spec.run[1] + 1, who, ch)
            if levels[spec.run[1]].barrier:
                state["epoch"] += 1
            return
        lo, top, s = rng(i)
        hi[(lv.loop, lv.occurrence)] = top
        vals = range(lo, top, s)
        for q, v in enumerate(vals):
            x[(lv.loop, lv.occurrence)] = v
            if lv.axis:
                coord[lv.axis] = q // -(-len(vals) // lv.teams)
            go(i + 1, owner, chunk)
        if lv.axis:
            coord[lv.axis] = 0
        if lv.barrier:
            state["epoch"] += 1
    go(0, 0, None)
    return out


class Recorder:
    """Stands for a kernel in the oracle: records the element ids its operands cover."""

    def __init__(self, kernel, log):
        self.kernel, self.log = kernel, log

    def __call__(self, *views, count=1):
        for spec, v in zip(self.kernel.operands, views):
            ids = v[:count] if spec.batch else v
            self.log.append((v.base_name, spec.writable, frozenset(np.asarray(ids).ravel().tolist())))


class Ids(np.ndarray):
    """Element ids of an argument, carrying the argument's name through indexing."""

    def __array_finalize__(self, obj):
        self.base_name = getattr(obj, "base_name", None)


def footprints(body, kernels, arrays, names, idx, tid):
    log = []
    saved = dict(kernels)
    for name, k in saved.items():
        kernels[name] = Recorder(k, log)
    TID[0] = tid
    try:
        views = []
        for a, n in zip(arrays, names):
            v = np.arange(a.size).reshape(a.shape).view(Ids)
            v.base_name = n
            views.append(v)
        body(*idx, *views)
    finally:
        kernels.update(saved)
        TID[0] = None
    return log


def oracle_races(lk, arrays, spec, nthreads, kernels):
    """Pairs (iteration, iteration) that may run at once and touch one element, one writing."""
    spec = parse(spec, len(lk.loops))
    loops = spec.resolve(lk.loops)
    if spec.mode == "serial":
        return []
    runs = walk(spec, loops, nthreads)
    dynamic = spec.mode == "collapse" and spec.schedule[0] == "dynamic"
    tids = range(nthreads) if dynamic else [None]
    prints = {}
    for i, (idx, owner, _, _) in enumerate(runs):
        for t in tids:
            prints[i, t] = footprints(lk.body, kernels, arrays, lk.array_names, idx, owner if t is None else t)
    found = []
    for i, j in itertools.combinations(range(len(runs)), 2):
        a, b = runs[i], runs[j]
        if a[3] != b[3]:
            continue
        if dynamic:
            if a[2] == b[2]:
                continue
            combos = [(t, u) for t in tids for u in tids if t != u]
        else:
            if a[1] == b[1]:
                continue
            combos = [(None, None)]
        for t, u in combos:
            if _touch(prints[i, t], prints[j, u]):
                found.append((a[0], b[0]))
                break
    return found


def _touch(p, q):
    for (n1, w1, s1), (n2, w2, s2) in itertools.product(p, q):
        if n1 == n2 and (w1 or w2) and s1 & s2:
            return True
    return False


# -- bodies --------------------------------------------------------------------------------------

TID = [None]
_KERNELS = {}


def kernels_at(level):
    """The kernels the generated bodies call, built for ``level`` (a dict the oracle may patch)."""
    if level not in _KERNELS:
        with kernel_level(level):
            _KERNELS[level] = {"zero": tpp.zero(*BLOCK), "relu": tpp.relu(*BLOCK), "add": tpp.binary("add", *BLOCK),
                               "gemm": tpp.brgemm(BLOCK[0], BLOCK[1], BLOCK[0], lda=BLOCK[1], beta=1)}
    return _KERNELS[level]


def tid():
    return thread().tid if TID[0] is None else TID[0]


INDEX = st.sampled_from(["v", "v", "v+1", "0", "tid", "v+w", "2v", "rev", "rev-1"])


@st.composite
def ops(draw, nloops):
    """One kernel call: (kind, output index, input index, condition, input array)."""
    kind = draw(st.sampled_from(["zero", "relu", "add", "gemm"]))
    loop = st.integers(0, nloops - 1)
    idx = lambda: tuple((draw(INDEX), draw(loop), draw(loop)) for _ in range(2))
    cond = draw(st.sampled_from([None, None, ("==", 0), ("<", 1), ("==w", 0), ("tid", 0)]))
    source = draw(st.sampled_from(["X", "Y"])) if kind in ("relu", "add") else "X"   # Y: a stencil on the output
    return kind, idx(), idx(), (draw(loop), draw(loop), cond) if cond else None, source


def _index(pattern, values, size):
    out = []
    for form, k, k2 in pattern:
        v, w = values[k], values[k2]
        out.append({"v": v, "v+1": v + 1, "0": 0, "tid": tid(), "v+w": v + w, "2v": 2 * v,
                    "rev": size - 1 - v, "rev-1": size - 2 - v}[form])
    return tuple(out)


def make_body(nloops, program, kernels):
    names = [f"i{LETTERS[k]}" for k in range(nloops)]

    def body(*args):
        values, (X, Y) = args[:nloops], args[nloops:]
        for kind, out, inp, cond, source in program:
            if cond is not None:
                k, k2, (op, c) = cond
                hit = {"==": values[k] == c, "<": values[k] < c, "==w": values[k] == values[k2],
                       "tid": op == "tid" and tid() == c}[op]
                if not hit:
                    continue
            o, i = _index(out, values, Y.shape[0]), _index(inp, values, X.shape[0])
            k, S = kernels[kind], (X if source == "X" else Y)
            if kind == "zero":
                k(Y[o])
            elif kind == "relu":
                k(S[i], Y[o])
            elif kind == "add":
                k(S[i], Y[o], Y[o])
            else:
                a, b = i[0], i[1]
                k(X[a, b:b + 1, :, :BLOCK[0]], X[a, b:b + 1], Y[o], count=1)
    import inspect
    body.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names + ["X", "Y"]])
    body.__name__ = "body"
    return body


@st.composite
def cases(draw, max_trip=4):
    """(loops, program, thread count, spec, ISA level): a body of kernel calls on blocks of X and Y."""
    nloops = draw(st.integers(1, 3))
    loops = []
    for _ in range(nloops):
        trip, step = draw(st.integers(1, max_trip)), draw(st.sampled_from([1, 1, 2]))
        start = draw(st.sampled_from([0, 0, 1]))
        blocks = draw(st.lists(st.integers(1, max(3, max_trip // 2)).map(lambda b: b * step), max_size=1))
        loops.append(Loop(start, start + trip * step, step, blocks))
    program = draw(st.lists(ops(nloops), min_size=1, max_size=3))
    nthreads = draw(st.sampled_from([2, 3]))
    text = draw(specs(loops, nthreads).filter(lambda s: s[2] != "serial"))[0]   # tests/loops/test_nest.py's
    return loops, program, nthreads, text, draw(st.sampled_from(native_levels()))


def arrays_for(loops, seed=0):
    d = 2 * max(lp.end for lp in loops) + 2
    rng = np.random.default_rng(seed)
    X = rng.integers(-3, 4, (d, d) + BLOCK).astype(np.float32)
    Y = rng.integers(-3, 4, (d, d) + BLOCK).astype(np.float32)
    return X, Y


# -- properties ----------------------------------------------------------------------------------

@settings(max_examples=60)
@given(cases())
def test_the_analysis_finds_a_race_exactly_when_the_oracle_does(case):
    loops, program, nthreads, text, level = case
    kernels = kernels_at(level)
    lk = kernel(text, *loops, races="allow")(make_body(len(loops), program, kernels))
    X, Y = arrays_for(lk.resolved)
    try:
        found = check(lk, (X, Y), nthreads=nthreads)
    except (SpecError, IndexError):
        return                                          # a grid too large, or a shifted index past the end
    expect = oracle_races(lk, (X, Y), text, nthreads, kernels)
    assert bool(found) == bool(expect), (text, program, [str(c) for c in found], expect[:3])
    names = lk.index_names
    pairs = {frozenset([a, b]) for a, b in expect}
    for c in found:
        a = tuple(c.at_first[n] for n in names)
        b = tuple(c.at_second[n] for n in names)
        assert frozenset([a, b]) in pairs or a == b, (text, str(c))


@settings(max_examples=25)
@given(cases())
def test_accepted_specs_compute_the_serial_result_on_threads(case):
    loops, program, nthreads, text, level = case
    if any(form == "tid" for op in program for form, _, _ in op[1] + op[2]) or \
            any(op[3] and op[3][2][0] == "tid" for op in program):
        return                                          # .python() runs every iteration as thread 0
    body = make_body(len(loops), program, kernels_at(level))
    lk = kernel(text, *loops, pool=pool_of(nthreads))(body)
    X, Y0 = arrays_for(lk.resolved)
    expect = Y0.copy()
    try:
        lk.python(X, expect)
        got = Y0.copy()
        lk(X, got)
    except RaceError as e:
        assert e.conflicts and "fix:" in str(e)
        for fix in e.fixes:                             # every fix it offers is accepted and right
            got = Y0.copy()
            lk.with_spec(fix)(X, got)
            np.testing.assert_array_equal(got, expect, err_msg=fix)
        return
    except (SpecError, IndexError):
        return
    np.testing.assert_array_equal(got, expect, err_msg=text)
    for _ in range(3):
        again = Y0.copy()
        lk(X, again)
        np.testing.assert_array_equal(again, expect, err_msg=text)


# -- the GEMM of the issue ------------------------------------------------------------------------

MB = NB = 4
KB = 6


def _gemm(spec, races="refuse", pool=None):
    zero, gemm = tpp.zero(8, 8), tpp.brgemm(8, 8, 8, beta=1)

    @kernel(spec, Loop(0, KB), Loop(0, MB), Loop(0, NB), races=races, pool=pool)
    def mm(ik, im, jn, A, B, C):
        if ik == 0:
            zero(C[im, jn])
        gemm(A[im, ik:ik + 1], B[jn, ik:ik + 1], C[im, jn], count=1)
    return mm


def _operands():
    rng = np.random.default_rng(1)
    A = rng.standard_normal((MB, KB, 8, 8)).astype(np.float32)
    B = rng.standard_normal((NB, KB, 8, 8)).astype(np.float32)
    return A, B, np.full((MB, NB, 8, 8), np.nan, np.float32)


def test_dynamic_schedule_over_a_k_loop_is_refused_with_the_pair_and_the_fixes(isa_level):
    A, B, C = _operands()
    mm = _gemm("aBC@schedule(dynamic,1)", pool=pool_of(2))
    with pytest.raises(RaceError) as e:
        mm(A, B, C)
    text = str(e.value)
    assert "ik=0, im=0, jn=0" in text and "ik=1, im=0, jn=0" in text and " C " in text, text
    assert "dynamic" in text and "'aBC|@schedule(dynamic,1)'" in text, text
    assert isinstance(e.value, SpecError) and isinstance(e.value, ValueError)
    assert np.isnan(C).all()                               # refused before running
    for fix in e.value.fixes:
        C[...] = np.nan
        mm.with_spec(fix)(A, B, C)
        np.testing.assert_allclose(C, np.einsum("mkab,nkbc->mnac", A, B), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("spec", ["aBC", "aBC|@schedule(dynamic,1)", "aBC@schedule(static,1)", "aB{R:2}C{C:1}",
                                  "aBC|@schedule(dynamic)", "BCa", "Bac"])
def test_gemm_specs_without_races_run(spec, isa_level):
    A, B, C = _operands()
    mm = _gemm(spec, pool=pool_of(2))
    ref = np.einsum("mkab,nkbc->mnac", A, B)
    for _ in range(5):
        C[...] = np.nan
        mm(A, B, C)
        np.testing.assert_allclose(C, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("spec", ["ABC", "aBC@schedule(dynamic)", "Abc", "A{R:2}bc", "bcA", "Abc@schedule(static,1)",
                                  "ABC@schedule(static,3)"])
def test_gemm_specs_that_split_the_reduction_are_refused(spec):
    A, B, C = _operands()
    with pytest.raises(RaceError, match="data race"):
        _gemm(spec, pool=pool_of(2))(A, B, C)


def test_warn_and_allow():
    A, B, C = _operands()
    with pytest.warns(RaceWarning, match="data race"):
        _gemm("ABC", races="warn", pool=pool_of(2))(A, B, C)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _gemm("ABC", races="allow", pool=pool_of(2))(A, B, C)
    with pytest.raises(ValueError, match="races='maybe'.*'refuse', 'warn', 'allow'"):
        _gemm("ABC", races="maybe")


def test_one_thread_never_races():
    A, B, C = _operands()
    _gemm("ABC@schedule(dynamic)", pool=pool_of(1))(A, B, C)
    assert check(_gemm("ABC"), (A, B, C), nthreads=1) == []


def test_static_split_that_keeps_each_block_on_one_thread_is_accepted():
    """'AB' with the body ignoring j: the static split of 4 x 3 iterations over 2 threads gives rows
    0-1 to thread 0 and rows 2-3 to thread 1, so no row is shared; over 3 rows it would be."""
    relu = tpp.relu(*BLOCK)

    def body(i, j, X, Y):
        relu(X[i], Y[i])
    X = np.ones((4,) + BLOCK, np.float32)
    even = kernel("AB", Loop(0, 4), Loop(0, 3))(body)
    odd = kernel("AB", Loop(0, 3), Loop(0, 3))(body)
    assert check(even, (X, X.copy()), nthreads=2) == []
    found = check(odd, (X[:3], X[:3].copy()), nthreads=2)
    assert found and found[0].at_first["i"] == found[0].at_second["i"] == 1


def test_per_thread_scratch_is_no_race():
    copy = tpp.copy(*BLOCK)

    def body(i, X, S, Y):
        t = thread().tid
        copy(X[i], S[t])
        copy(S[t], Y[i])
    X = np.arange(8 * 8, dtype=np.float32).reshape((8,) + BLOCK)
    for spec in ("A", "A@schedule(dynamic)", "A{R:2}"):
        k = kernel(spec, Loop(0, 8), pool=pool_of(2))(body)
        S, Y = np.zeros((2,) + BLOCK, np.float32), np.zeros_like(X)
        k(X, S, Y)
        np.testing.assert_array_equal(Y, X)
    shared = kernel("A", Loop(0, 8), pool=pool_of(2))(lambda i, X, S, Y: (copy(X[i], S[0]), copy(S[0], Y[i])))
    with pytest.raises(RaceError, match="S"):
        shared(X, np.zeros((2,) + BLOCK, np.float32), np.zeros_like(X))


def test_calls_on_neighbouring_blocks_are_checked_as_one_block_first(monkeypatch):
    """Calls whose blocks differ only in constant offsets are checked first as one block covering
    them all (a superset: when it cannot race, neither can they), so a body of many calls costs a
    few pairs; a race among them is still reported on the calls themselves."""
    import loops.races as races
    relu = tpp.relu(*BLOCK)
    X = np.zeros((4, 8) + BLOCK, np.float32)
    pairs = []
    analyse = races.pair
    monkeypatch.setattr(races, "pair", lambda *a: pairs.append(a) or analyse(*a))

    def rows(i, X, Y):
        for j in range(8):
            relu(X[i, j], Y[i, j])
    assert check(kernel("A", Loop(0, 4))(rows), (X, X.copy()), nthreads=2) == [] and len(pairs) == 1

    def shared(i, X, Y):
        for j in range(7):
            relu(X[i, j], Y[i, j])
        relu(X[i, 7], Y[0, 7])                      # every iteration writes row 0's last block
    found = check(kernel("A", Loop(0, 4), races="allow")(shared), (X, X.copy()), nthreads=2)
    assert found and {c.first.text for c in found} == {c.second.text for c in found} == {"relu(X[i, 7], Y[0, 7])"}


def test_per_thread_rows_beside_loop_rows_of_one_array_are_apart():
    """Per-thread scratch rows and rows indexed by a loop in one array (the LLaMA layer keeps its
    int8 tiles and column offsets so) never meet: their ranges over every thread and iteration lie
    apart, which settles the pair without a search. Before, 2048 iterations on 2 threads were more
    pairs than the search takes, and the spec was refused as unproven."""
    copy = tpp.copy(*BLOCK)

    def body(j, S, Y):
        t = thread().tid
        copy(S[2 + j], S[t])
        copy(S[t], Y[j])
    S, Y = np.zeros((2 + 2048,) + BLOCK, np.float32), np.zeros((2048,) + BLOCK, np.float32)
    S[2:] = np.arange(2048, dtype=np.float32)[:, None, None]
    k = kernel("A", Loop(0, 2048), pool=pool_of(2))(body)
    assert check(k, (S, Y), nthreads=2) == []
    k(S, Y)
    np.testing.assert_array_equal(Y, S[2:])
    overlapping = kernel("A", Loop(0, 2048), races="allow")(lambda j, S, Y: (copy(S[1 + j], S[thread().tid]),
                                                                             copy(S[thread().tid], Y[j])))
    assert check(overlapping, (S, Y), nthreads=2)          # S[1 + j] meets thread 1's row: not apart


def test_init_hook_writing_a_shared_block_races():
    zero, relu = tpp.zero(*BLOCK), tpp.relu(*BLOCK)
    k = kernel("A", Loop(0, 4), pool=pool_of(2))(lambda i, X, Y: relu(X[i], Y[i]))

    @k.init
    def clear(X, Y):
        zero(Y[0])
    X = np.ones((4,) + BLOCK, np.float32)
    with pytest.raises(RaceError, match="init hook"):
        k(X, X.copy())
    per_thread = kernel("A|", Loop(0, 4), pool=pool_of(2))(lambda i, X, Y: relu(X[i], Y[i]))

    @per_thread.init
    def clear_mine(X, Y):
        zero(Y[thread().tid + 4])
    per_thread(X, np.ones((6,) + BLOCK, np.float32))


def test_arguments_that_alias_are_one_array():
    relu = tpp.relu(*BLOCK)
    k = kernel("A", Loop(0, 3), pool=pool_of(2))(lambda i, X, Y: relu(X[i + 1], Y[i]))
    X = np.ones((4,) + BLOCK, np.float32)
    k(X, np.zeros_like(X))                                 # distinct arrays: no race
    with pytest.raises(RaceError):
        kernel("A", Loop(0, 3), pool=pool_of(2))(lambda i, X, Y: relu(X[i + 1], Y[i]))(X, X)
    with pytest.raises(RaceError, match="bytes"):         # Y[i] is X[i + 1]
        kernel("A", Loop(0, 3), pool=pool_of(2))(lambda i, X, Y: relu(X[i], Y[i]))(X, X[1:])


def test_the_analysis_does_not_enumerate_iterations():
    """A GEMM of 1024^3 blocks: the analysis reasons per loop (milliseconds here); listing the 2**30
    iterations would take minutes, which the generous bound catches."""
    import mmap
    import time
    zero, gemm = tpp.zero(8, 8), tpp.brgemm(8, 8, 8, beta=1)

    def body(ik, im, jn, A, B, C):
        if ik == 0:
            zero(C[im, jn])
        gemm(A[im, ik:ik + 1], B[jn, ik:ik + 1], C[im, jn], count=1)
    n = 1024
    A = np.lib.stride_tricks.as_strided(np.zeros(64, np.float32), (n, n, 8, 8), (0, 0, 32, 4))
    # C's blocks must be apart (a stride-0 C is one block, which the checker rightly calls racing): 256 MiB
    # reserved, never touched
    C = np.frombuffer(mmap.mmap(-1, n * n * 64 * 4, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                                | getattr(mmap, "MAP_NORESERVE", 0x4000)), np.float32).reshape(n, n, 8, 8)
    for spec, racy in (("aBC", False), ("aBC|@schedule(dynamic)", False), ("aBC@schedule(dynamic)", True),
                       ("ABC", True)):
        k = kernel(spec, Loop(0, n), Loop(0, n), Loop(0, n), races="allow")(body)
        t = time.perf_counter()
        found = check(k, (A, A, C), nthreads=2)
        assert bool(found) == racy and time.perf_counter() - t < 30, spec


# -- the arithmetic under the analysis -----------------------------------------------------------

@settings(max_examples=200)
@given(st.integers(-20, 20), st.integers(1, 6), st.integers(1, 5), st.integers(-20, 20), st.integers(1, 6),
       st.integers(1, 5))
def test_progressions_meet_exactly_when_they_share_a_value(s1, n1, d1, s2, n2, d2):
    from loops.race_search import ap_meet
    expect = bool({s1 + d1 * t for t in range(n1)} & {s2 + d2 * t for t in range(n2)})
    assert bool(ap_meet(s1, n1, d1, s2, n2, d2)) == expect
    assert ap_meet(np.array([s1, s1]), n1, d1, s2, n2, d2).tolist() == [expect, expect]


@settings(max_examples=200)
@given(st.sampled_from([-3, -2, -1, 1, 2, 4]), st.integers(-6, 6), st.integers(1, 4), st.integers(1, 3),
       st.integers(-6, 6), st.integers(1, 4), st.integers(1, 3))
def test_difference_windows_list_every_overlapping_shift(a, c1, n1, d1, c2, n2, d2):
    from loops.race_search import difference_window
    got = difference_window(a, c1, n1, d1, c2, n2, d2).tolist()
    first = {c1 + d1 * t for t in range(n1)}
    # x - x' = delta: the first block, at a*delta + c1, meets the second, at c2 (x' = 0)
    expect = [delta for delta in range(-40, 41)
              if {a * delta + v for v in first} & {c2 + d2 * t for t in range(n2)}]
    assert got == expect


def test_a_shifted_stencil_races_in_either_direction():
    """Y[i] from Y[i + 1] (or, reversed, Y[n-1-i] from Y[n-2-i]): iteration i reads what i + 1 writes."""
    relu = tpp.relu(*BLOCK)
    Y = np.zeros((9,) + BLOCK, np.float32)
    for body in (lambda i, Y: relu(Y[i + 1], Y[i]), lambda i, Y: relu(Y[7 - i], Y[8 - i])):
        found = check(kernel("A", Loop(0, 8))(body), (Y,), nthreads=2)
        assert found and abs(found[0].at_first["i"] - found[0].at_second["i"]) == 1
        assert check(kernel("a", Loop(0, 8))(body), (Y,), nthreads=2) == []


@given(s1=st.integers(-60, 60), s2=st.integers(-60, 60), n1=st.integers(1, 12), n2=st.integers(1, 12),
       d1=st.integers(1, 9), d2=st.integers(1, 9))
def test_ap_meet_is_the_intersection_of_the_progressions(s1, s2, n1, n2, d1, d2):
    """ap_meet on ints (the Python path) and on arrays (NumPy) against the sets themselves."""
    from loops.race_search import ap_meet
    brute = bool(set(range(s1, s1 + d1 * n1, d1)) & set(range(s2, s2 + d2 * n2, d2)))
    assert ap_meet(s1, n1, d1, s2, n2, d2) is brute
    assert ap_meet(np.array([s1, s1]), n1, d1, np.array([s2, s2]), n2, d2).tolist() == [brute, brute]


def test_ifs_in_a_row_are_checked_in_few_pairs(monkeypatch):
    """k ifs in a row trace each later call on 2^k paths; the accesses that differ only in their
    paths are checked together first (8 ifs: a few pairs, where every pair of the 256 calls was
    98,000 and 18 s), and a race among them is still found."""
    import loops.races as races
    relu, neg = tpp.relu(*BLOCK), tpp.unary("negate", *BLOCK)
    X = np.ones((16, 16) + BLOCK, np.float32)

    def traced(first_block, ifs=8):
        conds = ["i == 0", "i == 15", "j == 0", "j == 15", "i == j", "i + j == 15", "i == 1", "j == 1"][:ifs]
        lines = ["def body(i, j, X, Y):", "    relu(X[i, j], Y[i, j])"]
        for c in conds:
            block = first_block if c == conds[-1] else "Y[i, j]"
            lines += [f"    if {c}:", f"        neg({block}, {block})"]
        env = dict(relu=relu, neg=neg)
        exec("\n".join(lines), env)
        return kernel("AB", Loop(0, 16), Loop(0, 16))(env["body"])
    seen, real = [], races.pair
    monkeypatch.setattr(races, "pair", lambda *a: seen.append(a) or real(*a))
    assert check(traced("Y[i, j]"), (X, X.copy()), nthreads=2) == []
    assert 0 < len(seen) <= 10
    found = check(traced("Y[0, j]", 4), (X, X.copy()), nthreads=2)     # every i writes row 0's blocks
    assert found and found[0].array == "Y"
