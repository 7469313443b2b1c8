"""Bad inputs to the loop DSL (bodies, Loop declarations, bounds, tuning options) are refused with a
TypeError/ValueError that says what to write, before anything runs; none crashes or is ignored."""
import functools

import numpy as np
import pytest

import tppasm as tpp
from isa.cpu import host
from loops import BoundsError, Loop, SpecError, TraceError, kernel
from loops.trace import Affine

relu = tpp.relu(2, 4)
G = np.ones((6, 2, 4), np.float32)


def zeros():
    return np.zeros((6, 2, 4), np.float32)


# -- a global array indexed by a loop index ---------------------------------------------------

def global_body(i, Y):
    relu(G[i], Y[i])


def partial_body(X, i, Y):
    relu(X[i], Y[i])


SAVED = []


def saving_body(i, Y):
    SAVED.append(i)
    relu(G[SAVED[0]], Y[i])


@pytest.mark.parametrize("body", [global_body, functools.partial(partial_body, G), saving_body,
                                  lambda i, Y: relu(G[i, 0:2][None][0], Y[i]),
                                  lambda i, Y: relu(G[[i]][0], Y[i])])
def test_numpy_array_indexed_by_a_loop_index_says_declare_it(body):
    assert issubclass(TraceError, TypeError)
    with pytest.raises(TraceError, match="must be a parameter of the body.*declare it as one"):
        kernel("a", Loop(0, 6))(body)(zeros())


def test_index_saved_from_a_trace_is_refused_by_numpy_outside_it():
    seen = []
    kernel("a", Loop(0, 6))(lambda i, Y: seen.append(i))(zeros())
    with pytest.raises(TraceError, match="parameter of the body"):
        G[seen[0]]


def test_numpy_scalars_still_combine_with_indices():
    i = Affine((("a", 1),), 0, {"a": "i"})
    assert repr(np.int64(2) * i) == "2*i" and repr(np.int64(3) - i) == "-i + 3" and repr(i + np.int32(1)) == "i + 1"
    assert repr((np.int64(3) == i).test) == "i == 3"
    with pytest.raises(TraceError, match="cannot combine a loop index with ndarray"):
        np.array([1, 2]) + i


# -- the operator named in the message ---------------------------------------------------------

@pytest.mark.parametrize("index,op", [(lambda i: i // 2, "//"), (lambda i: i % 2, "%"), (lambda i: 7 % i, "%"),
                                      (lambda i: i / 2, "/"), (lambda i: 7 // i, "//"),
                                      (lambda i: divmod(i, 2)[0], "divmod")])
def test_non_affine_operator_is_named(index, op):
    with pytest.raises(TraceError, match=f"'{op}' on loop index i is not compilable"):
        kernel("a", Loop(0, 6))(lambda i, X, Y: relu(X[index(i)], Y[i]))(G, zeros())


# -- out of bounds, huge constants -------------------------------------------------------------

def test_out_of_bounds_is_a_documented_index_and_value_error():
    assert issubclass(BoundsError, IndexError) and issubclass(BoundsError, ValueError)
    assert BoundsError.__doc__
    with pytest.raises(ValueError, match=r"out of bounds: X: index i \+ 1 on axis 0 \(length 6\).*fails at i=5"):
        kernel("a", Loop(0, 6))(lambda i, X, Y: relu(X[i + 1], Y[i]))(G, zeros())


def test_huge_index_constants_are_out_of_bounds_not_overflow():
    with pytest.raises(BoundsError, match=r"i \+ 18446744073709551616 must be in \[0, 5\]; fails at i=0"):
        kernel("a", Loop(0, 6))(lambda i, X, Y: relu(X[i + 2 ** 64], Y[i]))(G, zeros())

    def guarded(i, X, Y):
        if i * 2 ** 64 > 0:                  # the path's test is evaluated exactly too
            relu(X[i + 5], Y[i])
    with pytest.raises(BoundsError, match="fails at i=1"):
        kernel("a", Loop(0, 6))(guarded)(G, zeros())


def test_offsets_beyond_64_bits_are_refused_at_bind():
    b = 2 ** 61 - 8
    with pytest.raises(ValueError, match=r"byte offset .* reaches .*64-bit integers, within \+-2\*\*63: shift "
                                         r"the loop to start near 0"):
        kernel("a", Loop(b, b + 6))(lambda i, X, Y: relu(X[i - b], Y[i - b]))(G, zeros())

    def compares(i, X, Y):
        if i * 2 ** 62 > 0:
            relu(X[i], Y[i])
    with pytest.raises(ValueError, match=r"'if 4611686018427387904\*i > 0': the comparison reaches .* 64-bit"):
        kernel("a", Loop(0, 6))(compares)(G, zeros())


def test_collapsed_run_beyond_64_bits_is_refused():
    with pytest.raises(SpecError, match="collapsed parallel run has 18446744073709551616 iterations"):
        kernel("AB", Loop(0, 2 ** 32), Loop(0, 2 ** 32), races="allow")(lambda i, j, Y: relu(Y[0], Y[0]))


@pytest.mark.skipif(host().arch != "x86_64", reason="x86 nest generator")
def test_strides_of_two_gigabytes_and_more(isa_level):
    """imul takes a 32-bit immediate: a 2 GiB stride goes through a register (the buffer is
    allocated lazily: only the touched pages are committed)."""
    k = tpp.relu(2, 4)
    try:
        buf = np.zeros((2 ** 31 + 64) // 4, np.float32)
    except MemoryError:
        pytest.skip("2 GiB of address space not available")
    X = np.lib.stride_tricks.as_strided(buf, shape=(2, 2, 4), strides=(2 ** 31, 16, 4))
    X[0], X[1] = -1, 3
    Y = np.full((2, 2, 4), 7, np.float32)
    kernel("a", Loop(0, 2))(lambda i, X, Y: k(X[i], Y[i]))(X, Y)
    np.testing.assert_array_equal(Y, np.maximum(X, 0))


# -- body signatures ---------------------------------------------------------------------------

@pytest.mark.parametrize("body", [max, print, np.add, len, int])
def test_builtin_bodies_are_refused(body):
    with pytest.raises(TypeError, match="not a Python function.*write it as a def"):
        kernel("a", Loop(0, 2))(body)


@pytest.mark.parametrize("body,what", [(lambda i, *, X, Y: None, "keyword-only parameter 'X'"),
                                       (lambda i, X, Y, **kw: None, r"'\*\*kw'"),
                                       (lambda *a: None, r"'\*a'"),
                                       (lambda i, *a: None, r"'\*a'")])
def test_bodies_take_positional_parameters_only(body, what):
    with pytest.raises(TypeError, match=what + ".*by position.*def body\\(i, X, Y\\)"):
        kernel("a", Loop(0, 2))(body)


def test_python_callables_and_bound_keywords_are_bodies():
    class Body:
        def __call__(self, i, X, Y):
            relu(X[i], Y[i])

        def method(self, i, X, Y):
            relu(X[i], Y[i])

    def body(i, X, Y, *, scale=1):
        relu(X[i * scale], Y[i])
    for fn in (Body(), Body().method, functools.partial(body, scale=1)):
        k = kernel("a", Loop(0, 6))(fn)
        assert k.array_names == ["X", "Y"]
        Y = zeros()
        k(-G, Y)
        assert not Y.any()


def test_hooks_are_checked_too():
    k = kernel("a", Loop(0, 2))(lambda i: None)
    with pytest.raises(TypeError, match="not a Python function"):
        k.init(print)
    with pytest.raises(TypeError, match="keyword-only"):
        k.fini(lambda *, X: None)
    k.init(lambda *arrays: None)


# -- Loop blocks -------------------------------------------------------------------------------

@pytest.mark.parametrize("blocks", [[np.int64(4)], np.array([4]), (np.uint16(4),), [4]])
def test_numpy_integer_block_sizes(blocks):
    lp = Loop(0, 8, blocks=blocks)
    assert lp.blocks == (4,) and type(lp.blocks[0]) is int
    assert kernel("aa", lp)(lambda i: None).resolved[0].blocks == (4,)


@pytest.mark.parametrize("blocks,what", [({4, 2}, r"is a set: .*in order.*blocks=\[4, 2\]"),
                                         ({4: 1}, "is a dict: .*in order"),
                                         (frozenset([4]), "is a frozenset"),
                                         (np.array([[4]]), "must be 1-D of integers"),
                                         (np.array([4.0]), "must be 1-D of integers"),
                                         (np.int64(4), r"blocks=\[4\]"),
                                         ([4.0], "must be an int")])
def test_unordered_or_non_integer_blocks_refused(blocks, what):
    with pytest.raises(SpecError, match=what):
        Loop(0, 8, blocks=blocks)


# -- tune's arguments --------------------------------------------------------------------------

def tunable():
    return kernel("A", Loop(0, 6))(lambda i, X, Y: relu(X[i], Y[i]))


@pytest.mark.parametrize("options,error,what", [
    (dict(specs=["zz"]), SpecError, "letter 'z' names loop 25"),
    (dict(specs=["A", "a1"]), SpecError, "loop spec 'a1', position 1"),
    (dict(specs="A"), TypeError, r"expected a list of spec strings, e.g. specs=\['aBC'"),
    (dict(specs=[]), ValueError, "nothing to time"),
    (dict(specs=[1]), TypeError, "each spec is a string"),
    (dict(seconds=-1), ValueError, "seconds=-1; expected a positive number of seconds"),
    (dict(seconds=0), ValueError, "seconds=0; expected a positive number"),
    (dict(seconds=float("nan")), ValueError, "seconds=nan"),
    (dict(seconds=float("inf")), ValueError, "seconds=inf"),
    (dict(seconds=True), TypeError, "seconds=True"),
    (dict(seconds="x"), TypeError, "seconds='x'; expected a positive number of seconds"),
    (dict(blocks="x"), TypeError, "blocks='x'; expected True"),
    (dict(blocks={"z": 1}), ValueError, "keys are the letters of the declared loops"),
    (dict(blocks={"a": -1}), ValueError, "an int >= 0"),
    (dict(budget=0), ValueError, "budget=0; expected an int >= 1"),
    (dict(budget=2.5), TypeError, "budget=2.5"),
    (dict(reps=True), TypeError, "reps=True"),
    (dict(rtol=-1e-4), ValueError, "rtol"),
    (dict(progress="no"), TypeError, "progress='no'; expected True or False"),
])
def test_tune_options_checked_before_timing(options, error, what, capsys):
    lk = tunable()
    with pytest.raises(error, match=what):
        lk.tune(G, zeros(), **options)
    assert "tuning" not in capsys.readouterr().err        # nothing was timed
    assert not hasattr(lk, "last_tuning")


def test_tune_skips_candidates_the_loops_refuse_unless_all_are():
    lk = kernel("a", Loop(0, 6, parallel=False))(lambda i, X, Y: relu(X[i], Y[i]))
    assert lk.tune(G, zeros(), specs=["A", "a"], reps=1, progress=False) == "a"     # 'A': i is serial
    with pytest.raises(SpecError, match="declared parallel=False"):
        lk.tune(G, zeros(), specs=["A"], reps=1, progress=False)


def test_tune_documented_defaults_still_work():
    lk = tunable()
    assert lk.tune(G, zeros(), budget=2, reps=1, progress=False, seconds=None) in ("A", "a")
    assert lk.tune(G, zeros(), specs=("a", "A"), reps=1, progress=False, seconds=5, blocks={"a": 1}) in ("A", "a")


@pytest.mark.parametrize("generator", ["x86", "aarch64"])
def test_nest_generators_refuse_constants_beyond_64_bits(generator):
    """The bind check refuses such nests first; the generators refuse them too (AArch64's mov_imm
    would keep the low 64 bits of a constant)."""
    from loops.nest_plan import Layout
    from loops.program import Node
    from loops.spec import parse
    from loops.trace import trace
    b = 2 ** 61 - 8
    body = trace(lambda i, X, Y: relu(X[i - b], Y[i - b]), ["i"], [G, zeros()])
    if generator == "x86":
        from loops.x86.nest import _Gen
        gen = _Gen(parse("a", 1), (Loop(b, b + 6),), Layout(2, 1, 1), [4, 4], {id(relu): 0})
    else:
        from loops.aarch64.nest import _Gen
        gen = _Gen(parse("a", 1), Layout(2, 1, 1), [4, 4], {id(relu): 0})
    with pytest.raises(ValueError, match="does not fit in 64 bits"):
        gen.build(body, Node(), Node())


@pytest.mark.parametrize("args, kw", [((0, 10**5000), {}), ((0, 4, 10**5000), {}), ((0, 4, -10**5000), {}),
                                      ((0, 4), {"blocks": [10**5000]})])
def test_a_huge_loop_bound_is_refused_with_its_digit_count(args, kw):
    """str() of an int past 4300 digits raises: the message must not convert it whole."""
    with pytest.raises(SpecError, match="an int of 5001 digits"):
        Loop(*args, **kw)
