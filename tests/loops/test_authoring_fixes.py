"""Kernel-authoring defects of loops (tracing, binding, caching): each test fails without its fix."""
import copy
import pickle

import numpy as np
import pytest

import tppasm as tpp
from loops import BoundsError, Loop, TraceError, kernel
from loops.recent import Recent
from loops.trace import ViewAttributeError, trace

relu, neg = tpp.relu(2, 4), tpp.unary("negate", 2, 4)


def _blocks(*shape):
    return np.random.default_rng(0).standard_normal(shape + (2, 4)).astype(np.float32)


# -- 1. a comparison of index comparisons holds per iteration -------------------------------------

CONDITIONS = [
    lambda i, j: (i == 0) != (j == 0),
    lambda i, j: (i == 0) == True,              # noqa: E712 (what the test is about)
    lambda i, j: [i == 0, j == 0].count(True) == 1,
    lambda i, j: (i == 0) in [True],
    lambda i, j: int(i == 0) + (j == 1) == 1,
    lambda i, j: sum([i == 0, j == 0]) == 1,
    lambda i, j: max(i == 0, j == 2),
    lambda i, j: (i == 0) in {True},
]


@pytest.mark.parametrize("n", range(len(CONDITIONS)))
def test_comparing_index_comparisons_holds_per_iteration(n):
    cond = CONDITIONS[n]
    X = _blocks(3, 3)

    @kernel("ab", Loop(0, 3), Loop(0, 3))
    def k(i, j, X, Y):
        if cond(i, j):
            relu(X[i, j], Y[i, j])
        else:
            neg(X[i, j], Y[i, j])
    Y = np.full_like(X, np.nan)
    k(X, Y)
    ref = np.array([[np.maximum(X[i, j], 0) if cond(i, j) else -X[i, j] for j in range(3)] for i in range(3)])
    np.testing.assert_array_equal(Y, ref)


def test_an_index_comparison_compared_with_a_string_is_refused():
    k = kernel("a", Loop(0, 2))(lambda i, X: relu(X[i], X[i]) if (i == 0) == "yes" else None)
    with pytest.raises(TraceError, match="acts as a Python bool"):
        k(_blocks(2))


# -- 2. == and != on traced arrays are refused, identity still works -------------------------------

@pytest.mark.parametrize("test", [lambda X, Y, i: X[i] != 0, lambda X, Y, i: X[i] == Y[i]])
def test_comparing_traced_arrays_is_refused(test):
    k = kernel("a", Loop(0, 2))(lambda i, X, Y: relu(X[i], Y[i]) if test(X, Y, i) else neg(X[i], Y[i]))
    with pytest.raises(TraceError, match="traced array"):
        k(_blocks(2), _blocks(2))


def test_traced_arrays_keep_identity_and_hash():
    seen = []

    def body(i, X, Y):
        seen.append((X is X, {X: 1}[X], X is not Y))
        relu(X[i], Y[i])
    kernel("a", Loop(0, 2))(body)(_blocks(2), _blocks(2))
    assert seen == [(True, 1, True)]


# -- 3. .strides in bytes (as .python() sees them); internal slots hidden --------------------------

def test_view_strides_are_numpy_byte_strides():
    seen = []

    def body(i, X):
        seen.append(X[i].strides)
        relu(X[i], X[i])
    k = kernel("a", Loop(0, 2))(body)
    X = _blocks(2)
    k(X)
    k.python(X)
    assert seen[0] == seen[-1] == X[0].strides == (16, 4)


@pytest.mark.parametrize("name", ["offset", "arg", "text", "checks", "axes", "vmap", "box"])
def test_internal_view_slots_are_not_readable_in_a_body(name):
    k = kernel("a", Loop(0, 2))(lambda i, X: getattr(X[i], name))
    with pytest.raises(ViewAttributeError, match=f"X\\[i\\].{name}: a traced array"):
        k(_blocks(2))


def test_traced_views_keep_offsets_and_element_strides_internally():
    seen = []

    def body(i, j, X):
        v = X[i, 2 * j + 1, 4:]
        seen.append((v.shape, v._strides, v._offset))
    trace(body, ["i", "j"], [np.zeros((4, 6, 8), np.float32)])
    (shape, strides, offset), = seen
    assert shape == (4,) and strides == (1,) and offset.terms == (("a", 48), ("b", 16)) and offset.const == 12


# -- 4. a body is traced once per signature; inspecting never changes what runs; retrace() ---------

def test_explain_and_accesses_reuse_the_bound_nest():
    ops = {"op": relu}

    @kernel("A", Loop(0, 2))
    def k(i, X, Y):
        ops["op"](X[i], Y[i])
    X = _blocks(2)
    Y = np.full_like(X, np.nan)
    k(X, Y)
    bound = dict(k._bound)
    ops["op"] = neg
    assert "relu" in k.explain(X, Y)
    assert k.accesses(X, Y) == {"X": "read", "Y": "written"}
    assert dict(k._bound) == bound and k._last is next(iter(bound.values()))
    k(X, Y)
    np.testing.assert_array_equal(Y, np.maximum(X, 0))        # the nest the first call traced
    k.retrace()
    k(X, Y)
    np.testing.assert_array_equal(Y, -X)


def test_retrace_reads_a_changed_closure_value():
    add = tpp.binary("add", 2, 4)
    count = [2]

    @kernel("a", Loop(0, 1))
    def k(i, X, Y):
        for n in range(count[0]):
            add(X[n], Y[0], Y[0])
    X = np.ones((4, 2, 4), np.float32)
    Y = np.zeros((1, 2, 4), np.float32)
    k(X, Y)
    count[0] = 4
    k.retrace()
    k(X, Y)
    assert Y[0, 0, 0] == 2 + 4


# -- 5. an empty problem does nothing; an empty array with iterations is a BoundsError -------------

def test_a_nest_running_no_iteration_over_empty_arrays_does_nothing():
    k = kernel("A", Loop(0, 0))(lambda i, X, Y: relu(X[i], Y[i]))
    X = np.ones((0, 2, 4), np.float32)
    k(X, np.empty_like(X))
    k(X, np.empty_like(X))


def test_iterations_over_an_empty_array_are_a_bounds_error():
    k = kernel("A", Loop(0, 3))(lambda i, X, Y: relu(X[i], Y[i]))
    with pytest.raises(BoundsError, match="X has no block i"):
        k(np.ones((0, 2, 4), np.float32), np.empty((3, 2, 4), np.float32))


# -- 6. copy and deepcopy --------------------------------------------------------------------------

def test_loop_kernels_copy_and_deepcopy_as_themselves():
    k = kernel("A", Loop(0, 2))(lambda i, X: relu(X[i], X[i]))
    assert copy.copy(k) is k and copy.deepcopy(k) is k and copy.deepcopy({"k": k})["k"] is k
    k(_blocks(2))
    assert copy.deepcopy([k])[0] is k


def test_recent_copies_keep_their_limit():
    r = Recent(2)
    r["a"], r["b"] = 1, 2
    for c in (copy.copy(r), copy.deepcopy(r)):
        c["c"] = 3
        assert list(c) == ["b", "c"] and c.limit == 2


# -- 7. views and indices of another body are refused ----------------------------------------------

def test_views_and_indices_kept_from_another_body_are_refused():
    stash = {}

    @kernel("a", Loop(0, 2))
    def first(i, P, Q, R):
        stash["view"], stash["i"] = R, i
        relu(P[i], Q[i])
    first(_blocks(2), _blocks(2), _blocks(2))
    k_view = kernel("a", Loop(0, 2))(lambda i, X, Y, Z: relu(stash["view"][i], Y[i]))
    with pytest.raises(TraceError, match="R is a view traced for another loop body"):
        k_view(_blocks(2), _blocks(2), _blocks(2))
    k_whole = kernel("a", Loop(0, 2))(lambda i, X, Y, Z: relu(stash["view"], Y[i]))
    with pytest.raises(TraceError, match="traced for another loop body"):
        k_whole(_blocks(2), _blocks(2), _blocks(2))
    k_index = kernel("a", Loop(0, 2))(lambda j, X, Y: relu(X[stash["i"]], Y[j]))
    with pytest.raises(TraceError, match="loop index of another loop body"):
        k_index(_blocks(2), _blocks(2))


# -- 8. explain() describes the last call's nest ---------------------------------------------------

def test_explain_without_arrays_describes_the_last_call():
    @kernel("A", Loop(0, 2))
    def k(i, X, Y):
        if X.shape[0] == 2:
            relu(X[i], Y[i])
        else:
            neg(X[i], Y[i])
    A, B = _blocks(2), _blocks(3)
    k(A, np.empty_like(A))
    k(B, np.empty_like(B))
    k(A, np.empty_like(A))
    assert "relu" in k.explain() and "negate" not in k.explain()
    k.explain(B, np.empty_like(B))
    k(A, np.empty_like(A))                      # the fast path
    assert "relu" in k.explain() and "relu" in k._repr_html_() and "negate" not in k._repr_html_()


# -- 9. clear errors -------------------------------------------------------------------------------

def test_pickling_a_loop_kernel_says_it_does_not_pickle():
    k = kernel("A", Loop(0, 2))(lambda i, X: relu(X[i], X[i]))
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(k)


def test_hooks_are_refused_in_hook_words():
    k = kernel("A", Loop(0, 2))(lambda i, X: relu(X[i], X[i]))

    def gen(X):
        yield
    with pytest.raises(TypeError, match="init hook 'gen' is a generator function"):
        k.init(gen)
    with pytest.raises(TypeError, match="fini hook '<lambda>' takes '\\*\\*kw': a hook receives no loop indices"):
        k.fini(lambda **kw: None)


def test_arrays_passed_by_keyword_are_refused_with_the_positional_form():
    k = kernel("A", Loop(0, 2))(lambda i, X, Y: relu(X[i], Y[i]))
    X = _blocks(2)
    with pytest.raises(TypeError, match=r"takes its arrays by position.*write <lambda>\(X, Y\)"):
        k(X, Y=X)


def test_a_body_default_is_named_in_the_count_message():
    def body(i, X, Y, r=relu):
        r(X[i], Y[i])
    with pytest.raises(TypeError, match="defaults included: capture r as a global"):
        kernel("A", Loop(0, 2))(body)(_blocks(2), _blocks(2))


def test_a_hook_parameter_with_a_default_keeps_it():
    got = []
    k = kernel("A", Loop(0, 2))(lambda i, X, Y: relu(X[i], Y[i]))

    @k.fini
    def after(Y0, which=1):
        got.append(which)
    k(_blocks(2), _blocks(2))
    k.python(_blocks(2), _blocks(2))
    assert got == [1, 1]


def test_decorating_a_loop_kernel_again_is_refused():
    k = kernel("A", Loop(0, 2))(lambda i, X: relu(X[i], X[i]))
    with pytest.raises(TypeError, match="already a loop kernel"):
        kernel("a", Loop(0, 2))(k)


def test_a_half_built_loop_kernel_has_a_repr():
    """A debugger shows ``self`` while the constructor runs: repr and the notebook view say so."""
    from loops.decorator import LoopKernel
    k = LoopKernel.__new__(LoopKernel)
    assert repr(k).startswith("<LoopKernel (not built") and "not built" in k._repr_html_()


def test_a_keyword_array_is_refused_on_the_fast_path_too():
    """k(X, out=Y) after k(X) compiled a one-array nest: refused, not run on X with out= dropped."""
    import pytest
    import numpy as np
    import tppasm as tpp
    from loops import Loop, kernel
    relu = tpp.relu(1, 4)

    @kernel("a", Loop(0, 2))
    def k(i, X):
        relu(X[i:i + 1], X[i:i + 1])
    X = np.ones((2, 4), np.float32)
    k(X)
    k(X)                                # the fast path is set
    with pytest.raises(TypeError, match="takes its arrays by position"):
        k(X, out=X.copy())
