"""Tracing bodies: affine views, branches on indices, thread coordinates, hooks, and the errors."""
import numpy as np
import pytest

import tppasm as tpp
from loops import Loop, TraceError, kernel, thread
from loops.trace import Affine, trace
from tppasm.operand import OperandError

copy, relu = tpp.copy(1, 4), tpp.relu(1, 4)      # tests that run nests build theirs at isa_level


def rows(n, fill=None):
    x = np.arange(n * 4, dtype=np.float32).reshape(n, 4) - 7
    return x if fill is None else np.full_like(x, fill)


def test_affine_arithmetic_and_text():
    i, j = Affine((("a", 1),), 0, {"a": "i", "b": "j"}), Affine((("b", 1),), 0, {"a": "i", "b": "j"})
    e = 3 * i - j + 2 - i
    assert e.terms == (("a", 2), ("b", -1)) and e.const == 2
    assert repr(e) == "2*i - j + 2"
    assert e.evaluate({"a": 4, "b": 1}) == 9
    assert e.bounds({"a": (0, 3), "b": (0, 5)}) == (-3, 8)


def test_branches_and_or_not_elif():
    def body(i, X, Y):
        if i == 0 or i == 5:
            copy(X[i:i + 1], Y[i:i + 1])
        elif not i < 3 and i != 4:
            relu(X[i:i + 1], Y[i:i + 1])
        if i == 0:                       # decided already on this path: no new branch
            relu(X[0:1], Y[0:1])
    tree = trace(body, ["i"], [rows(6), rows(6)])
    calls = list(tree.all_calls())
    assert sum(c.text.startswith("copy") for c in calls) == 2
    X, Y = rows(6), rows(6, fill=99)
    k = kernel("a", Loop(0, 6))(body)
    k(X, Y)
    Y2 = rows(6, fill=99)
    k.python(X, Y2)
    np.testing.assert_array_equal(Y, Y2)
    expect = rows(6, fill=99)
    expect[[0, 5]] = X[[0, 5]]
    expect[3] = np.maximum(X[3], 0)
    expect[0] = np.maximum(X[0], 0)
    np.testing.assert_array_equal(Y, expect)


def test_views_offsets_and_shapes():
    X = np.zeros((4, 6, 8), np.float32)
    seen = []

    def body(i, j, X):
        v = X[i, 2 * j + 1, 4:]
        seen.append((v.shape, v._strides, v._offset))
        w = X[:, j][i:i + 1]
        seen.append((w.shape, w._strides, w._offset))
    trace(body, ["i", "j"], [X])
    (s1, st1, o1), (s2, st2, o2) = seen
    assert s1 == (4,) and st1 == (1,) and o1.terms == (("a", 48), ("b", 16)) and o1.const == 12
    assert s2 == (1, 8) and st2 == (48, 1) and o2.terms == (("a", 48), ("b", 8))


ERRORS = [
    (lambda i, X, Y: copy(X[range(i)], Y), "used as a Python int"),
    (lambda i, X, Y: copy(X[i // 2:i // 2 + 1], Y[0:1]), "'//' on loop index"),
    (lambda i, X, Y: copy(X[i * i:i * i + 1], Y[0:1]), "product of two loop indices"),
    (lambda i, X, Y: np.sum(X), "only tppasm kernels can run on it"),
    (lambda i, X, Y: X + 1, "only tppasm kernels can run on it"),
    (lambda i, X, Y: copy(X[i:i + 1], Y[0:1]) if i else None, "as a truth value"),
    (lambda i, X, Y: {i: 1}, "cannot be hashed"),
    (lambda i, X, Y: copy(X[i:i + 1], Y[0:1]) if i == 1.5 else None, "cannot compare loop index i with float"),
    (lambda i, X, Y: copy(X[i:i + 1], Y[0:1]) if i != "1" else None, "cannot compare loop index i with str"),
    (lambda i, X, Y: copy(X[i:i + 1], Y[0:1]) if 2.5 > i else None, "cannot compare loop index i with float"),
    (lambda i, X, Y: copy(X[i:i + 1], Y[0:1]) if i <= True else None, "cannot compare loop index i with bool"),
    (lambda i, X, Y: copy(X[i:2 * i], Y[0:1]), "length that depends on loop indices"),
    (lambda i, X, Y: copy(X[i:i + 1], GLOBAL), "declare the array as a parameter"),
    (lambda i, X, Y: copy(X[i:i + 2], Y[0:2]), "has shape"),
    (lambda i, X, Y: copy(X[i:i + 1, 0:2], Y[0:1]), "has shape"),
    (lambda i, X, Y: copy(X[i:i + 1], Y[0:1]) if X[i, 0] > 0 else None, "only tppasm kernels can run on it"),
    (lambda i, X, Y: copy(X[i:i + 1], Y[0:1]) if 0 <= X[i, 1] else None, "only tppasm kernels can run on it"),
    (lambda i, X, Y: -X / 2, "only tppasm kernels can run on it"),
    (lambda i, X, Y: range(X[i, 0]), "only tppasm kernels can run on it"),
    (lambda i, X, Y: INNER(X, Y), "a loop nest cannot run inside another nest's body"),
]
GLOBAL = np.zeros((1, 4), np.float32)
INNER = kernel("a", Loop(0, 4))(lambda i, X, Y: copy(X[i:i + 1], Y[i:i + 1]))


@pytest.mark.parametrize("body,what", ERRORS)
def test_untraceable_bodies_say_what_to_do(body, what):
    k = kernel("a", Loop(0, 4))(lambda i, X, Y: body(i, X, Y))
    with pytest.raises((TraceError, OperandError), match=what.replace("(", r"\(")):
        k(rows(8), rows(8))


def test_out_of_bounds_found_before_running_and_conditions_respected(isa_level):
    copy = tpp.copy(1, 4)

    def shifted(i, X, Y):
        copy(X[i + 1:i + 2], Y[i:i + 1])
    with pytest.raises(IndexError, match="slice stop i \\+ 2 on axis 0 \\(length 4\\).*fails at i=3"):
        kernel("a", Loop(0, 4))(shifted)(rows(4), rows(4))

    def guarded(i, X, Y):
        if i < 3:
            copy(X[i + 1:i + 2], Y[i:i + 1])
    X, Y = rows(4), rows(4, fill=0)
    kernel("A", Loop(0, 4))(guarded)(X, Y)
    np.testing.assert_array_equal(Y[:3], X[1:])


def test_batch_extent_checked_against_count():
    g = tpp.brgemm(m=2, n=2, k=2)

    def body(i, A, B, C):
        g(A[i:], B[i:], C, count=3)
    A = np.ones((4, 2, 2), np.float32)
    with pytest.raises(IndexError, match="holds"):
        kernel("a", Loop(0, 3))(body)(A, A.copy(), np.zeros((2, 2), np.float32))


def test_thread_coordinates_split_reduction(isa_level):
    """Each grid column sums its share of rows into its own partial; the caller adds the partials."""
    add = tpp.copy(1, 4)

    @kernel("A{C:2}", Loop(0, 6))
    def tag(i, X, P):
        t = thread()
        add(X[i:i + 1], P[t.col, i:i + 1])
    X = rows(6)
    P = np.zeros((2, 6, 4), np.float32)
    try:
        tag(X, P)
    except Exception as e:                    # a 1-thread pool cannot hold a 2-column grid
        pytest.skip(str(e))
    np.testing.assert_array_equal(P[0, :3], X[:3])
    np.testing.assert_array_equal(P[1, 3:], X[3:])
    assert not P[0, 3:].any() and not P[1, :3].any()


def test_init_and_fini_run_once_per_thread(isa_level):
    copy, relu = tpp.copy(1, 4), tpp.relu(1, 4)

    @kernel("A", Loop(0, 4))
    def work(i, X, Y, S):
        copy(X[i:i + 1], Y[i:i + 1])

    @work.init
    def start(X, Y, S):
        copy(X[0:1], S[thread().tid, 0:1])

    @work.fini
    def stop(X, Y, S):
        relu(X[0:1], S[thread().tid, 1:2])
    X, Y = rows(4), rows(4, fill=0)
    nt = work.pool.nthreads
    S = np.full((nt, 2, 4), 5, np.float32)
    work(X, Y, S)
    for t in range(nt):
        np.testing.assert_array_equal(S[t, 0], X[0])
        np.testing.assert_array_equal(S[t, 1], np.maximum(X[0], 0))
    assert "init" in work.explain()


def test_cached_per_signature_and_with_spec(isa_level):
    copy = tpp.copy(1, 4)

    @kernel("aB", Loop(0, 2), Loop(0, 2))
    def k(i, j, X, Y):
        copy(X[2 * i + j:2 * i + j + 1], Y[2 * i + j:2 * i + j + 1])
    X, Y = rows(4), rows(4, fill=0)
    k(X, Y)
    inst = k._last
    k(X, Y)
    assert k._last is inst and len(k._bound) == 1
    k(rows(6), rows(6, fill=0))
    assert len(k._bound) == 2
    assert k.with_spec("Ba") is k.with_spec("Ba")
    Y2 = rows(4, fill=0)
    k.with_spec("ba")(X, Y2)
    np.testing.assert_array_equal(Y, Y2)
