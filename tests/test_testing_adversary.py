"""An adversarial pass over tppasm.testing: assert_matches_reference passes correct kernels of every
kind and fails planted bugs in each (a wrong element, an unwritten one, NaN, a write past the
output, a reference that differs, a stale loop nest) naming the array and the element; the
strategies draw what the kernels accept, edge values included; misuse is refused in tppasm's
words before hypothesis runs; and it behaves inside users' hypothesis tests, profiles and threads."""
import ctypes
import dataclasses
import sys
import threading

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings, strategies as st
from hypothesis.database import InMemoryExampleDatabase
from hypothesis.errors import FailedHealthCheck

import tppasm as tpp
from loops import Loop, kernel
from tppasm.eltwise import Unary
from tppasm.kernel import ISAUnavailableError
from tppasm.operand import OperandError, check as check_operand
from tppasm.testing import _identity, assert_matches_reference, check, strategies as S

BF16_MAX = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
QUIET = settings(database=None, max_examples=300)      # for find(): no saved examples


class Planted:
    """``k`` with a planted bug: after each call ``bug(arrays)`` changes what it wrote (``before``:
    called with the arrays before the call, its result passed on to ``bug``)."""

    def __init__(self, k, bug, before=None):
        self.k, self.bug, self.before = k, bug, before

    def __getattr__(self, name):
        return getattr(self.k, name)

    def __repr__(self):
        return f"<planted {self.k!r}>"

    def __call__(self, *arrays, **kw):
        saved = self.before(arrays) if self.before else None
        self.k(*arrays, **kw)
        self.bug(arrays, saved) if self.before else self.bug(arrays)


def filled(k, count=2, seed=0):
    """Every operand of ``k`` in its exact layout, inputs random (ints within the operand's
    ``max_value`` and +-100), outputs zero; block_spmm's indices in range."""
    rng = np.random.default_rng(seed)
    out = []
    for spec in k.operands:
        shape, dt = spec.full_shape(count), spec.np_dtype
        extent = 1 + sum((d - 1) * s for d, s in zip(shape, spec.strides))
        view = np.lib.stride_tricks.as_strided(np.zeros(extent, dt), shape, [s * dt.itemsize for s in spec.strides])
        if spec.name == "rowptr":
            view[...] = (0, count)
        elif spec.name == "colidx":
            view[...] = rng.integers(0, k.desc.kb, count)
        elif spec.writable and spec.name in k.desc.allocated():
            pass
        elif dt.kind in "iu":
            info = np.iinfo(dt)
            high = min(int(info.max), spec.max_value or 100, 100)
            view[...] = rng.integers(max(int(info.min), -100), high + 1, shape)
        else:
            view[...] = rng.uniform(-2, 2, shape).astype(np.float32)
        out.append(view)
    return out


def _last(a):
    return tuple(d - 1 for d in a.shape)


def _wrong_value(pos):
    def bug(arrays):
        a = arrays[pos]
        if a.dtype.kind in "iu":
            a[_last(a)] ^= 1                                          # off by one bit: integers are exact
        else:
            a[_last(a)] = a[_last(a)].astype(np.float32) + 1 + 2 * np.abs(a.astype(np.float32)).max()
    return bug


def _nan(pos):
    def bug(arrays):
        arrays[pos][_last(arrays[pos])] = np.nan
    return bug


def _unwritten(pos):
    """The last element of output ``pos`` keeps what it held before the call (the poison)."""
    return (lambda arrays, saved: arrays[pos].__setitem__(_last(arrays[pos]), saved),
            lambda arrays: arrays[pos][_last(arrays[pos])].copy())


def _past_the_end(pos):
    """Zero the bytes of one element just past output ``pos``'s last element (a guard of the check)."""
    def bug(arrays):
        a = arrays[pos]
        ctypes.memset(a.ctypes.data + sum((d - 1) * s for d, s in zip(a.shape, a.strides)) + a.itemsize, 0,
                      a.itemsize)
    return bug


EVERY_KIND = {
    "brgemm f32": lambda: tpp.brgemm(5, 17, 9, lda=11),
    "brgemm f32 beta bias gelu ld": lambda: tpp.brgemm(3, 9, 7, ldb=12, ldc=10, beta=1, bias=True, act="gelu"),
    "brgemm f32 erf_fast stream": lambda: tpp.brgemm(3, 9, 7, act="gelu_erf_fast", stream_c=True, prefetch=False),
    "brgemm f32 strides pace": lambda: tpp.brgemm(4, 8, 5, stride_a=40, stride_b=60, act="tanh", pace=3),
    "brgemm bf16 c bf16 bias": lambda: tpp.brgemm(4, 17, 7, dtype="bf16", c_dtype="bf16", bias=True, act="gelu_erf"),
    "brgemm bf16 beta relu": lambda: tpp.brgemm(4, 16, 6, dtype="bf16", beta=1, act="relu"),
    "brgemm i8 us": lambda: tpp.brgemm(3, 16, 9, dtype="i8"),
    "brgemm i8 ss beta": lambda: tpp.brgemm(3, 17, 8, dtype="i8", signs="ss", beta=1),
    "brgemm i8 su relu": lambda: tpp.brgemm(3, 16, 8, dtype="i8", signs="su", act="relu"),
    "brgemm i8 uu": lambda: tpp.brgemm(2, 16, 5, dtype="i8", signs="uu"),
    "brgemm i8 a_bits 7": lambda: tpp.brgemm(3, 16, 8, dtype="i8", a_bits=7),
    "unary gelu ldx": lambda: tpp.unary("gelu", 5, 9, ldx=12),
    "unary exp bf16": lambda: tpp.unary("exp", 3, 17, dtype="bf16"),
    "unary gelu_erf_bwd": lambda: tpp.unary("gelu_erf_bwd", 3, 9),
    "relu bitmask": lambda: tpp.relu(3, 17, bitmask=True),
    "copy to bf16": lambda: tpp.copy(3, 9, out_dtype="bf16"),
    "zero": lambda: tpp.zero(3, 5, ldo=8),
    "binary div bcast": lambda: tpp.binary("div", 3, 17, bcast_b="row"),
    "binary add relu bf16": lambda: tpp.binary("add", 3, 9, post="relu", dtype="bf16"),
    "ternary muladd": lambda: tpp.ternary("muladd", 3, 7, ldc=9),
    "reduce add rows": lambda: tpp.reduce("add", 5, 9, over="rows"),
    "reduce max": lambda: tpp.reduce("max", 5, 18),
    "reduce sumsq bf16": lambda: tpp.reduce("sumsq", 4, 33, dtype="bf16"),
    "transpose bf16": lambda: tpp.transform("transpose", 5, 9, dtype="bf16"),
    "vnni4 i8": lambda: tpp.transform("vnni4", 7, 5, dtype="i8"),
    "unvnni2": lambda: tpp.transform("unvnni2", 6, 5, dtype="bf16"),
    "softmax row mask": lambda: tpp.softmax(3, 17, scale=0.5, mask="row"),
    "layernorm": lambda: tpp.layernorm(3, 17, ldx=20),
    "rmsnorm bf16": lambda: tpp.rmsnorm(3, 33, dtype="bf16"),
    "rotary": lambda: tpp.rotary(3, 16, 8),
    "quantize": lambda: tpp.quantize(3, 17),
    "dequant beta": lambda: tpp.dequant(3, 17, beta=1),
    "swiglu bf16": lambda: tpp.swiglu(3, 17, dtype="bf16"),
    "gemm_nt": lambda: tpp.gemm_nt(5, 7, 9, ldc=11),
    "gemm_nt bf16": lambda: tpp.gemm_nt(5, 7, 9, dtype="bf16"),
    "block_spmm": lambda: tpp.block_spmm(4, 8, 17, 3, beta=1),
    "block_spmm bf16": lambda: tpp.block_spmm(3, 4, 16, 3, "bf16"),
}


@pytest.mark.parametrize("specials", [False, True])
@pytest.mark.parametrize("name", list(EVERY_KIND))
def test_correct_kernels_of_every_kind_pass(name, specials):
    k = EVERY_KIND[name]()
    assert_matches_reference(k, S.operands(k, specials=specials), max_examples=6)
    assert check(k, filled(k)) == []


@pytest.mark.parametrize("name", list(EVERY_KIND))
def test_planted_bugs_of_every_kind_are_caught_naming_the_element(name):
    """One element wrong, NaN, left unwritten, or one element written past the output: each is
    reported with the array's name and the element (the last one: a tail), and a case to paste."""
    k = EVERY_KIND[name]()
    arrays = filled(k)
    pos = next(i for i, s in enumerate(k.operands) if s.writable)
    out, a = k.operands[pos].name, arrays[pos]
    where = f"[{', '.join(map(str, _last(a)))}]"
    bugs = [(Planted(k, _wrong_value(pos)), f"{out}: 1 of {a.size} elements differ from the reference"),
            (Planted(k, _past_the_end(pos)), f"{out}: 1 element was written outside the operand")]
    if a.dtype.kind not in "iu":
        bugs.append((Planted(k, _nan(pos)), f"{out}: 1 of {a.size} elements differ from the reference"))
    if out in k.desc.allocated():
        bugs.append((Planted(k, *_unwritten(pos)),
                     f"{out}: 1 of {a.size} output elements were never written, first at {_last(a)}"))
    for planted, words in bugs:
        problems = check(planted, arrays)
        assert problems and words in problems[0], (words, problems)
        if "differ" in words:
            assert f"{where} got" in problems[0], problems
        assert problems[-1].startswith(("case:\n", "arrays: ")), problems


def test_a_planted_bug_is_found_and_shrunk_by_the_strategy():
    k = EVERY_KIND["brgemm bf16 c bf16 bias"]()
    with pytest.raises(AssertionError, match=r"c: 1 of 68 elements differ from the reference .*\[3, 16\] got"):
        assert_matches_reference(Planted(k, _wrong_value(2)), max_examples=10)
    with pytest.raises(AssertionError, match=r"out: 1 of 15 output elements were never written, first at \(2, 4\)"):
        assert_matches_reference(Planted(tpp.zero(3, 5), *_unwritten(0)), max_examples=10)


@dataclasses.dataclass(frozen=True)
class _OffByOneReference(Unary):
    """relu whose reference differs in one element (the kernel is generated for it as for Unary)."""

    def reference(self, x, out):
        super().reference(x, out)
        out[1, 2] += 1


def test_a_descriptor_whose_reference_differs_in_one_element_fails():
    k = tpp.get_kernel(_OffByOneReference("relu", 3, 17))
    x = filled(k)[0]
    problems = check(k, (x,))
    assert "out: 1 of 51 elements differ" in problems[0] and "[1, 2] got" in problems[0], problems
    assert check(tpp.relu(3, 17), (x,)) == []                 # the same code against Unary's reference
    with pytest.raises(AssertionError, match=r"\[1, 2\] got -?0\.0 want 1\.0"):     # (relu(-0.0): -0.0 on x86)
        assert_matches_reference(k, max_examples=5)


def test_a_bf16_ulp_is_within_the_default_tolerance_and_caught_where_exact_is_asked():
    """Element-wise bf16 results may be two bf16 ulps off by default (the README's promise); with
    rtol=0, atol=0 one ulp is reported; integer outputs are always exact."""
    k = tpp.transform("transpose", 5, 9, dtype="bf16")
    x = filled(k)[0]

    def one_ulp(arrays):
        arrays[1].view(np.uint16)[2, 3] += 1
    assert check(Planted(k, one_ulp), (x,)) == []
    problems = check(Planted(k, one_ulp), (x,), rtol=0, atol=0)
    assert "out: 1 of 45 elements differ" in problems[0] and "[2, 3] got" in problems[0], problems
    q = tpp.quantize(3, 17)
    problems = check(Planted(q, _wrong_value(1)), filled(q)[:1])
    assert "q: 1 of 51 elements differ from the reference (integers: exact): [2, 16]" in problems[0], problems


def test_batched_brgemms_by_offset_and_address_pass_and_fail():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(3 * 12).astype(np.float32), rng.standard_normal(3 * 32).astype(np.float32)
    offsets = np.array([[0, 0], [12, 32], [24, 64]], np.int64)
    g = tpp.brgemm(3, 8, 4, batch="offset")
    assert_matches_reference(g, a, b, np.empty((3, 8), np.float32), offsets)
    with pytest.raises(AssertionError, match=r"c: 1 of 24 elements differ .*\[2, 7\] got"):
        assert_matches_reference(Planted(g, _wrong_value(2)), a, b, np.empty((3, 8), np.float32), offsets)
    with pytest.raises(AssertionError, match=r"c: 1 of 24 output elements were never written, first at \(2, 7\)"):
        assert_matches_reference(Planted(g, *_unwritten(2)), a, b, np.empty((3, 8), np.float32), offsets)
    ga = tpp.brgemm(3, 8, 4, batch="address", beta=1)
    blocks_a, blocks_b = [a[i:i + 12].reshape(3, 4) for i in (0, 12)], [b[i:i + 32].reshape(4, 8) for i in (0, 32)]
    c = rng.standard_normal((3, 8)).astype(np.float32)
    assert_matches_reference(ga, blocks_a, blocks_b, c)
    with pytest.raises(AssertionError, match=r"c: 1 of 24 elements differ"):
        assert_matches_reference(Planted(ga, _nan(2)), blocks_a, blocks_b, c)


ACT = tpp.relu(4, 8)


@kernel("A", Loop(0, 3))
def _act_rows(i, X, Y):
    ACT(X[i], Y[i])


def test_loop_kernels_pass_and_planted_or_stale_nests_fail(monkeypatch):
    X = np.random.default_rng(2).standard_normal((3, 4, 8)).astype(np.float32)
    Y = np.empty_like(X)
    assert_matches_reference(_act_rows, X, Y)
    with pytest.raises(AssertionError, match=r"Y: 1 of 96 elements differ .*\[2, 3, 7\] got"):
        assert_matches_reference(Planted(_act_rows, _wrong_value(1)), X, Y)
    with pytest.raises(AssertionError, match=r"Y: 1 of 96 output elements were never written, first at \(2, 3, 7\)"):
        assert_matches_reference(Planted(_act_rows, *_unwritten(1)), X, Y)
    # the nest was traced with relu; a changed global reaches .python() (the reference) only: caught
    monkeypatch.setattr(sys.modules[__name__], "ACT", tpp.unary("negate", 4, 8))
    with pytest.raises(AssertionError, match="Y: .* elements differ from the reference"):
        assert_matches_reference(_act_rows, X, Y)
    _act_rows.retrace()
    assert_matches_reference(_act_rows, X, Y)
    monkeypatch.undo()
    _act_rows.retrace()


# -- the strategies draw what the kernels accept, edge values included --------------------------

DRAWN = [lambda: tpp.brgemm(5, 3, 4, lda=7), lambda: tpp.brgemm(3, 17, 5, dtype="bf16", ldb=19, bias=True),
         lambda: tpp.brgemm(3, 16, 9, dtype="i8", a_bits=7, stride_a=40), lambda: tpp.relu(3, 17, ldx=20),
         lambda: tpp.binary("mul", 4, 33, bcast_a="col", dtype="bf16"), lambda: tpp.dequant(3, 17, beta=1),
         lambda: tpp.block_spmm(3, 2, 17, 3, ldc=19), lambda: tpp.transform("vnni4", 7, 5, dtype="i8"),
         lambda: tpp.quantize(2, 9, ldx=12), lambda: tpp.gemm_nt(3, 5, 7, dtype="bf16")]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_every_drawn_operand_is_what_the_kernel_accepts(data):
    k = data.draw(st.sampled_from(DRAWN))()
    arrays = data.draw(S.operands(k, max_count=3, specials=data.draw(st.booleans()),
                                  align=data.draw(st.sampled_from([None, True, False]))))
    count = k._count_of(arrays) if k.desc.count_scalar is not None else 1
    assert len(arrays) == len(k.operands) and 1 <= count <= 3
    for spec, a in zip(k.operands, arrays):
        check_operand(spec, a, count, "drawn")
        assert a.dtype == spec.np_dtype and a.shape == spec.full_shape(count)
        if spec.max_value is not None:
            assert (a <= spec.max_value).all()
        if spec.writable and spec.name in k.desc.allocated():
            assert not np.asarray(a, np.float64).any()
    if k.desc.kind == "block_spmm":
        rowptr, colidx = arrays[:2]
        assert 0 <= rowptr[0] <= rowptr[1] <= count and ((0 <= colidx) & (colidx < k.desc.kb)).all()
    assert check(k, arrays) == []


def _found(strategy, predicate):
    return find(strategy, predicate, settings=QUIET)


def _bits16(a):
    return a.view(np.uint16) & 0x7FFF


@pytest.mark.parametrize("what, strategy, predicate", [
    ("bf16's largest finite", lambda: S.arrays("bf16", (3, 4), specials=True),
     lambda a: (np.abs(a.astype(np.float32)) == BF16_MAX).any()),
    ("bf16 operands' largest finite", lambda: S.operands(tpp.unary("exp", 2, 9, dtype="bf16"), specials=True),
     lambda a: (np.abs(a[0].astype(np.float32)) == BF16_MAX).any()),
    ("bf16 VNNI B's largest finite", lambda: S.vnni_b("bf16", 4, 3, specials=True),
     lambda b: (np.abs(b.astype(np.float32)) == BF16_MAX).any()),
    ("bf16 infinities", lambda: S.arrays("bf16", (3, 4), specials=True), lambda a: (_bits16(a) == 0x7F80).any()),
    ("bf16 denormals", lambda: S.arrays("bf16", (3, 4), specials=True),
     lambda a: ((_bits16(a) > 0) & (_bits16(a) < 0x80)).any()),
    ("f32 largest finite", lambda: S.operands(tpp.relu(2, 9), specials=True),
     lambda a: (np.abs(a[0]) == np.finfo(np.float32).max).any()),
    ("f32 NaN", lambda: S.operands(tpp.softmax(2, 9), specials=True), lambda a: np.isnan(a[0]).any()),
    ("f32 -inf", lambda: S.operands(tpp.gemm_nt(2, 3, 4), specials=True), lambda a: (a[1] == -np.inf).any()),
    ("f32 denormals", lambda: S.operands(tpp.layernorm(2, 9), specials=True),
     lambda a: ((a[0] != 0) & (np.abs(a[0]) < np.finfo(np.float32).tiny)).any()),
    ("f32 -0", lambda: S.operands(tpp.relu(2, 9), specials=True),
     lambda a: ((a[0] == 0) & np.signbit(a[0])).any()),
    ("int8 B's minimum", lambda: S.operands(tpp.brgemm(2, 16, 4, dtype="i8")), lambda a: (a[1] == -128).any()),
    ("uint8 A's maximum", lambda: S.operands(tpp.brgemm(2, 16, 4, dtype="i8")), lambda a: (a[0] == 255).any()),
    ("a_bits=7 A's maximum", lambda: S.operands(tpp.brgemm(2, 16, 4, dtype="i8", a_bits=7)),
     lambda a: (a[0] == 127).any()),
    ("int32 extremes", lambda: S.operands(tpp.dequant(2, 3)),
     lambda a: (a[0] == 2 ** 31 - 1).any() and (a[0] == -2 ** 31).any()),
    ("unaligned operands", lambda: S.operands(tpp.relu(2, 9)), lambda a: a[0].ctypes.data % 64 != 0),
    ("aligned operands", lambda: S.operands(tpp.relu(2, 9)), lambda a: a[1].ctypes.data % 64 == 0),
    ("a batch of max_count", lambda: S.operands(tpp.brgemm(2, 3, 4), max_count=5), lambda a: len(a[0]) == 5),
    ("a leading dimension past n", lambda: S.arrays("f32", (3, 9)), lambda a: a.strides[0] > 9 * 4),
    ("a dense row", lambda: S.arrays("i8", (3, 9)), lambda a: a.strides[0] == 9),
])
def test_edge_values_and_layouts_are_drawn_at_all(what, strategy, predicate):
    assert predicate(_found(strategy(), predicate)), what


@pytest.mark.parametrize("tail", [1, 7, 9, 15, 17, 31, 33, 63, 65])
def test_vector_tails_are_drawn(tail):
    assert _found(S.dims(), lambda d: d == tail) == tail
    assert tail in _found(S.shapes(2), lambda s: tail in s)


@settings(max_examples=40, deadline=None)
@given(S.arrays("bf16", (3, 5)), S.arrays("i8", (2, 4)), S.values("u8", bound=7), S.values("bf16", specials=True),
       S.values("bf16", bound=0.1))
def test_drawn_values_keep_their_promises(bf, i8, u8, v, small):
    padded = np.lib.stride_tricks.as_strided(bf, (3, bf.strides[0] // 2), bf.strides)[:2, 5:]
    assert np.isnan(padded.astype(np.float32)).all()               # NaN between the rows of floats
    rows = np.lib.stride_tricks.as_strided(i8, (2, i8.strides[0]), i8.strides)[:1, 4:]
    assert (rows.view(np.uint8) == 0x5A).all()                     # 0x5a bytes between rows of integers
    assert 0 <= u8 <= 7
    for value in (v, small):                                       # bf16 numbers (fp32's largest is none)
        assert np.isnan(value) or float(np.float32(value).astype(ml_dtypes.bfloat16)) == value
    assert abs(small) <= 0.1


# -- misuse is refused in tppasm's words, before hypothesis runs ---------------------------------

@pytest.fixture
def saved():
    """An in-memory example database for the checks of one test (the active profile otherwise)."""
    previous = settings.get_current_profile_name()
    db = InMemoryExampleDatabase()
    settings.register_profile("adversary-db", parent=settings.get_profile(previous), database=db, derandomize=False,
                              max_examples=10)
    settings.load_profile("adversary-db")
    yield db
    settings.load_profile(previous)


def _entries(db):
    return sum(len(v) for v in db.data.values())


@pytest.mark.parametrize("max_examples, error, words", [
    (0, ValueError, r"max_examples=0; expected an int >= 1, e.g. max_examples=20"),
    (-1, ValueError, r"max_examples=-1; expected an int >= 1"),
    ("10", TypeError, r"max_examples='10' \(str\); expected an int >= 1"),
    (2.5, TypeError, r"max_examples=2.5 \(float\)"),
    (True, TypeError, r"max_examples=True \(bool\)"),
])
def test_max_examples_must_be_a_positive_int(max_examples, error, words):
    with pytest.raises(error, match=words):
        assert_matches_reference(tpp.relu(3, 17), max_examples=max_examples)
    assert_matches_reference(tpp.relu(3, 17), max_examples=np.int64(2))


@pytest.mark.parametrize("strategy, words", [
    (st.just(None), "the strategy drew a NoneType, not a tuple of the arrays of a call"),
    (st.just(np.ones((3, 17), np.float32)), "the strategy drew a ndarray, not a tuple"),
    (st.just({"x": np.ones((3, 17), np.float32)}), "the strategy drew a dict"),
    (st.data(), "the strategy drew a DataObject"),
])
def test_a_strategy_that_draws_no_tuple_is_refused(strategy, words, saved):
    with pytest.raises(TypeError, match=words + r".*draw tuples \(st.tuples"):
        assert_matches_reference(tpp.relu(3, 17), strategy, max_examples=3)


def test_a_strategy_of_the_wrong_arrays_or_beside_arrays_is_refused(saved):
    other = tpp.relu(3, 16)
    with pytest.raises(OperandError, match=r"operand x has shape \(3, 16\), expected \(3, 17\)"):
        assert_matches_reference(tpp.relu(3, 17), S.operands(other), max_examples=3)
    with pytest.raises(TypeError, match="strategy is given beside arrays; pass it as the only array argument"):
        assert_matches_reference(other, S.arrays("f32", (3, 16)), np.empty((3, 16), np.float32))


@pytest.mark.parametrize("call, error, words", [
    (lambda k, x: assert_matches_reference(k, x, np.empty((3, 16), np.float32)), OperandError,
     r"operand out has shape \(3, 16\), expected \(3, 17\)"),
    (lambda k, x: assert_matches_reference(k, x.T), OperandError, "operand x has shape"),
    (lambda k, x: assert_matches_reference(k, x.astype(np.float64)), OperandError, r"astype\(np.float32\)"),
    (lambda k, x: assert_matches_reference(k, x, outputs="y"), ValueError, r"outputs holds 'y'; expected names"),
    (lambda k, x: assert_matches_reference(k, outputs=["out", 7]), ValueError, r"outputs holds 7"),
    (lambda k, x: assert_matches_reference(k, x, count="3"), ValueError, r"count='3'"),
    (lambda k, x: assert_matches_reference(k, x, max_examples=5), TypeError, "drop max_examples="),
    (lambda k, x: assert_matches_reference(k, rtol=-1), ValueError, r"rtol=-1; expected a finite number >= 0"),
    (lambda k, x: assert_matches_reference(k.desc, x), TypeError, "Unary is not a tppasm kernel"),
    (lambda k, x: assert_matches_reference(lambda y: y), TypeError, "function is not a tppasm kernel"),
])
def test_misuse_names_the_fix(call, error, words, saved):
    k, x = tpp.relu(3, 17), np.ones((3, 17), np.float32)
    with pytest.raises(error, match=words):
        call(k, x)


def test_a_kernel_the_host_cannot_run_is_refused_before_any_example(saved):
    from isa.cpu import host
    if "amx" in host().isa:
        pytest.skip("this host runs AMX")
    amx = tpp.brgemm(16, 16, 32, dtype="bf16", isa="amx")
    for args in ((), (np.ones(3),)):
        with pytest.raises(ISAUnavailableError, match=r"cannot run on this host; check it where it runs .*interp"):
            assert_matches_reference(amx, *args)
    assert isinstance(ISAUnavailableError(), ValueError)
    assert _entries(saved) == 0, "the refusal was saved as a failing example"


# -- hypothesis interplay: users' tests, profiles, derandomize, the database, threads -----------

class Counted:
    def __init__(self, k):
        self.k, self.calls, self.seen = k, 0, []

    def __getattr__(self, name):
        return getattr(self.k, name)

    def __repr__(self):
        return repr(self.k)

    def __call__(self, *arrays, **kw):
        self.calls += 1
        self.seen.append(arrays[0].tobytes())
        return self.k(*arrays, **kw)


@settings(max_examples=4, deadline=None)
@given(st.data())
def test_inside_a_users_given_test_with_drawn_arrays(data):
    k = tpp.binary("add", 3, 9, ldb=12)
    assert_matches_reference(k, *data.draw(S.operands(k)))
    with pytest.raises(AssertionError, match="out: 1 of 27 elements differ"):
        assert_matches_reference(Planted(k, _wrong_value(2)), *data.draw(S.operands(k)))


def test_nested_in_a_users_given_test_says_how_to_fix_it():
    @settings(max_examples=2, deadline=None, database=None)
    @given(st.integers(2, 3))
    def nested(m):
        assert_matches_reference(tpp.relu(m, 9), max_examples=2)
    with pytest.raises(FailedHealthCheck, match=r"(?s)st\.data\(\).*nested_given"):
        nested()
    counted = Counted(tpp.relu(2, 9))

    @settings(max_examples=2, deadline=None, database=None, suppress_health_check=[HealthCheck.nested_given])
    @given(st.just(0))
    def allowed(_):
        assert_matches_reference(counted, max_examples=3)
    allowed()
    assert counted.calls == 3 * 3            # (st.just: one outer example) x 3 examples x 3 poisoned runs


def test_the_users_profile_and_an_explicit_max_examples():
    previous = settings.get_current_profile_name()
    settings.register_profile("adversary-7", max_examples=7, database=None, derandomize=True)
    settings.load_profile("adversary-7")
    try:
        runs = []
        for max_examples in (None, 2, None):
            counted = Counted(tpp.relu(3, 17))
            assert_matches_reference(counted, max_examples=max_examples)
            runs.append(counted.seen)
        assert len(runs[0]) == 7 * 3 and len(runs[1]) == 2 * 3
        assert runs[0] == runs[2], "derandomize=True drew other examples the second time"
    finally:
        settings.load_profile(previous)


def test_twice_on_the_same_kernel_replays_its_own_failure(saved):
    first, second = (Counted(Planted(tpp.relu(3, 17), _wrong_value(1))) for _ in range(2))
    with pytest.raises(AssertionError) as one:
        assert_matches_reference(first)
    assert _entries(saved)
    with pytest.raises(AssertionError) as two:
        assert_matches_reference(second)
    assert str(one.value) == str(two.value) and second.calls < first.calls


def test_kernels_that_differ_only_in_isa_keep_their_own_entries(saved):
    """Their descriptors are equal: keyed by it alone, the passing AVX-512 check deleted the failure
    saved for the AVX-2 kernel."""
    avx2, own = tpp.relu(3, 17, isa="avx2"), tpp.relu(3, 17)
    if avx2.isa == own.isa:
        pytest.skip("the host's own level is avx2")
    assert _identity(avx2) != _identity(own)
    planted = Planted(avx2, _wrong_value(1))
    type(planted).__qualname__, qualname = type(avx2).__qualname__, type(planted).__qualname__
    try:
        assert _identity(planted) == _identity(avx2)
        with pytest.raises(AssertionError):
            assert_matches_reference(planted)
        kept = {k: set(v) for k, v in saved.data.items()}
        assert_matches_reference(own)
        assert all(saved.data.get(k) == v for k, v in kept.items()), "the AVX-512 check deleted them"
    finally:
        type(planted).__qualname__ = qualname


def test_two_threads_at_once():
    kernels = {m: Counted(tpp.unary("gelu", m, 17)) for m in (2, 3)}
    errors = []

    def work(m):
        try:
            for _ in range(2):
                assert_matches_reference(kernels[m], max_examples=5)
            with pytest.raises(AssertionError, match=f"out: 1 of {m * 17} elements differ"):
                assert_matches_reference(Planted(kernels[m].k, _wrong_value(1)), max_examples=5)
        except BaseException as e:          # (a thread's exception is lost otherwise)
            errors.append(e)
    threads = [threading.Thread(target=work, args=(m,)) for m in kernels]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert all(k.calls == 2 * 5 * 3 for k in kernels.values()), {m: k.calls for m, k in kernels.items()}


def test_the_case_to_paste_runs_when_inputs_hold_nan_and_inf():
    for dtype in ("f32", "bf16"):
        k = tpp.relu(1, 4, dtype=dtype)
        x = np.array([[np.nan, 1, -np.inf, np.inf]], k.operands[0].np_dtype)
        problems = check(Planted(k, _wrong_value(1)), (x,))
        scope = {"np": np, "ml_dtypes": ml_dtypes}
        exec(problems[-1].split("case:\n")[1].replace("\n  ", "\n").strip(), scope)
        assert np.array_equal(scope["x"], x, equal_nan=True) and scope["out"].shape == (1, 4)
