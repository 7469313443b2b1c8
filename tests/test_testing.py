"""tppasm.testing: assert_matches_reference passes correct kernels and catches each kind of broken
one (unwritten outputs, writes outside an operand, wrong values, a changed input); the strategies
draw what they promise (tails, leading dimensions, unaligned arrays, edge values, exact layouts)."""
import ctypes

import numpy as np
import pytest
from hypothesis import find, given, settings, strategies as st

import tppasm as tpp
from isa.x86 import Function, rax, xmm0, ymm0
from loops import Loop, kernel
from tppasm.eltwise import Unary
from tppasm.kernel import Kernel
from tppasm.operand import OperandError
from tppasm.testing import assert_matches_reference, check, strategies as S

GOOD = [lambda: tpp.relu(3, 17), lambda: tpp.unary("gelu", 5, 9, ldx=12), lambda: tpp.relu(2, 9, bitmask=True),
        lambda: tpp.binary("mul", 4, 33, bcast_a="col"), lambda: tpp.ternary("muladd", 3, 7, ldc=9),
        lambda: tpp.reduce("max", 5, 18, over="rows"), lambda: tpp.transform("vnni2", 5, 7, dtype="bf16"),
        lambda: tpp.copy(3, 9, out_dtype="bf16"), lambda: tpp.brgemm(5, 17, 9, lda=11),
        lambda: tpp.brgemm(4, 16, 6, dtype="bf16", c_dtype="bf16"), lambda: tpp.brgemm(3, 16, 8, dtype="i8"),
        lambda: tpp.brgemm(3, 5, 4, beta=1)]


@pytest.mark.parametrize("make", GOOD)
def test_correct_kernels_pass(make):
    assert_matches_reference(make(), max_examples=8)


def _hand_made(desc, emit):
    """A kernel for ``desc`` whose code is ``emit(asm, x, y)`` (deliberately wrong code)."""
    fn = Function("broken", ["ptr", "ptr"])
    emit(fn.asm, *fn.args)
    k = Kernel.__new__(Kernel)
    k.desc, k.isa, k.raw = desc, "avx2", fn.finalize()
    k.operands, k.scalars, k.checked_call = tuple(desc.operands()), (), True
    k._native, k._n, k._defaults, k._alloc = False, 2, (), (1,)
    k._raw = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(k.raw.address)
    return k


def _copy4(a, x, y):
    a.vmovups(xmm0, [x])
    a.vmovups([y], xmm0)


def _copy8(a, x, y):
    a.vmovups(ymm0, [x])
    a.vmovups([y], ymm0)


def _copy_and_clear_x(a, x, y):
    _copy8(a, x, y)
    a.vxorps(ymm0, ymm0, ymm0)
    a.vmovups([x], ymm0)


def _copy_as_relu(a, x, y):
    _copy4(a, x, y)
    a.mov(rax, [x + 16])
    a.mov([y + 16], rax)


@pytest.mark.parametrize("desc, emit, words", [
    (Unary("copy", 1, 5), _copy4, "1 of 5 output elements were never written, first at (0, 4)"),
    (Unary("copy", 1, 5), _copy8, "written outside the operand"),
    (Unary("copy", 1, 8, ldi=16), _copy_and_clear_x, "an input was changed"),
    (Unary("relu", 1, 5), _copy_as_relu, "elements differ from the reference"),
])
def test_broken_kernels_are_caught(desc, emit, words):
    k = _hand_made(desc, emit)
    x = -np.arange(1, desc.ldi * desc.m + 1, dtype=np.float32).reshape(desc.m, desc.ldi)[:, :desc.n]
    problems = check(k, (x, np.empty((desc.m, desc.n), np.float32)))
    assert any(words in p for p in problems), problems
    assert "case:\n  x = np.array(" in problems[-1] and "out = np.empty((1, " in problems[-1]
    with pytest.raises(AssertionError, match="does not match its reference"):
        assert_matches_reference(k, max_examples=10)


def test_loop_kernels_against_their_python_path():
    brgemm = tpp.brgemm(4, 8, 4, beta=1)
    zero = tpp.zero(4, 8)

    @kernel("aB", Loop(0, 3, parallel=False), Loop(0, 5))
    def gemm(k, m, A, B, C):
        if k == 0:
            zero(C[m])
        brgemm(A[m, k:k + 1], B[k:k + 1], C[m], count=1)
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((5, 3, 4, 4), np.float32), rng.standard_normal((3, 4, 8), np.float32)
    C = np.empty((5, 4, 8), np.float32)
    assert gemm.accesses(A, B, C) == {"A": "read", "B": "read", "C": "read and written"}
    assert_matches_reference(gemm, A, B, C, outputs=["C"])

    @kernel("A", Loop(0, 5))
    def partial(m, A, B, C):
        if m < 4:
            zero(C[m])
    problems = check(partial, (A, B, C), outputs=["C"])
    assert "C: 32 of 160 output elements were never written, first at (4, 0, 0)" in problems[0]


def test_strategies_draw_what_they_promise():
    assert find(S.arrays("f32", (3, 5), align=False), lambda a: a.ctypes.data % 64 != 0).shape == (3, 5)
    wide = find(S.arrays("bf16", (3, 5)), lambda a: a.strides[0] > 10)
    assert wide.strides[1] == 2 and np.isnan(np.lib.stride_tricks.as_strided(wide, (3, 6), wide.strides)
                                             [:2, 5].astype(np.float32)).all()
    assert np.isnan(find(S.values("f32", specials=True), lambda v: v != v))
    assert find(S.values("f32", specials=True), lambda v: 0 < abs(v) < np.finfo(np.float32).tiny)
    assert find(S.values("i8"), lambda v: v == -128) == -128
    assert find(S.dims(), lambda d: d % 16 == 1 and d > 1) in (17, 33, 49, 65)    # (shrinking may stop at 33)
    assert find(S.vnni_b("i8", 5, 3, count=2), lambda b: True).shape == (2, 2, 3, 4)


@settings(max_examples=10)
@given(st.data())
def test_operands_match_the_kernel_layout(data):
    g = tpp.brgemm(5, 3, 4, lda=7, dtype=data.draw(st.sampled_from(["f32", "bf16", "i8"])))
    arrays = data.draw(S.operands(g, max_count=3))
    assert arrays[0].shape[0] == arrays[1].shape[0] <= 3
    for spec, a in zip(g.operands, arrays):
        assert a.dtype == spec.np_dtype and a.strides[-len(spec.strides):] == tuple(
            s * a.itemsize for s in spec.strides)[-a.ndim:]
    bounds = data.draw(S.loop_bounds(max_trip=4))
    lp = Loop(*bounds)
    assert lp.trip <= 4 and all(b % lp.step == 0 for b in lp.blocks)


# -- arrays that are not what the kernel takes are explained before anything runs -----------------

@pytest.mark.parametrize("kernel, arrays, error, words", [
    (lambda: tpp.relu(2, 4), (np.ones(3),), OperandError, r"operand x has dtype float64"),
    (lambda: tpp.relu(2, 4), (np.ones(3, np.float32),), OperandError, r"operand x has 1 dimensions \(3,\)"),
    (lambda: tpp.relu(2, 4), (np.ones((2, 4)), np.ones((2, 4))), OperandError,
     r"operand x has dtype float64, expected float32.*astype\(np.float32\)"),
    (lambda: tpp.relu(2, 4), (np.ones((2, 4), np.float32),) * 3, TypeError,
     r"takes 2 arrays \(x, out\), or its 1 inputs \(x\); got 3"),
    (lambda: tpp.brgemm(2, 3, 4), (np.ones((2, 2, 4), np.float32), np.ones((2, 4, 3), np.float32)),
     OperandError, "count=0"),
    (lambda: tpp.brgemm(2, 3, 4, batch="offset"), (np.array([None] * 8), np.ones(12, np.float32),
                                                   np.empty((2, 3), np.float32), np.zeros((1, 2), np.int64)),
     ValueError, "array #0 has dtype object"),
    (lambda: tpp.brgemm(2, 3, 4, batch="offset"), (np.ones(8), np.ones(12, np.float32),
                                                   np.empty((2, 3), np.float32), np.zeros((1, 2), np.int64)),
     OperandError, "C-contiguous float32 array"),
])
def test_arrays_are_checked_against_the_kernel_first(kernel, arrays, error, words):
    count = 0 if "count" in words else None
    with pytest.raises(error, match=words):
        assert_matches_reference(kernel(), *arrays, count=count)


def test_inputs_alone_and_tensors_are_checked_as_a_call_takes_them():
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    assert_matches_reference(tpp.relu(2, 4), x)                      # out allocated, as relu(x) does
    torch = pytest.importorskip("torch")
    assert_matches_reference(tpp.relu(2, 4), torch.from_numpy(x), torch.empty(2, 4))


@pytest.mark.parametrize("outputs", [-1, 2, [5], [1.0], [True], ["y"]])
def test_outputs_that_name_no_array_are_refused_not_ignored(outputs):
    x = np.ones((2, 4), np.float32)
    with pytest.raises(ValueError, match=r"outputs holds .*expected names of the arrays \(x, out\) or their "
                                         r"positions 0\.\.1"):
        check(tpp.relu(2, 4), [x, np.empty_like(x)], outputs=outputs)


def test_outputs_and_tolerances_as_documented():
    x = np.ones((2, 4), np.float32)
    for outputs in ("out", 1, np.int64(1), ["out"], (np.int64(1),)):     # one name or position, or a sequence
        assert check(tpp.relu(2, 4), [x, np.empty_like(x)], outputs=outputs) == []
    for bad in ({"rtol": "1e-5"}, {"atol": -1.0}, {"rtol": float("nan")}, {"atol": True}, {"rtol": float("inf")}):
        with pytest.raises(ValueError, match=f"{next(iter(bad))}=.*expected a finite number >= 0"):
            assert_matches_reference(tpp.relu(2, 4), x, np.empty_like(x), **bad)


def test_subnormal_fp32_results_get_an_absolute_floor_not_a_false_alarm():
    """Two fp32 FMAs of 1.5 x 1e-45 give 5.6e-45, the exact sum 4.2e-45: one subnormal ulp, which
    rtol * max|reference| (~4e-50) called wrong; a real error there is still caught."""
    g, a, b = tpp.gemm_nt(1, 1, 2), np.full((1, 2), 1.5, np.float32), np.full((1, 2), 1e-45, np.float32)
    assert check(g, [a, b, np.empty((1, 1), np.float32)]) == []
    assert check(g, [a, b * 2.0 ** 40, np.empty((1, 1), np.float32)]) == []          # 4.6e-33: normal, rtol
    assert check(g, [a, b * 2.0 ** 40, np.empty((1, 1), np.float32)], rtol=1e-5) == []
    assert check(g, [a * 2.0 ** 14, b, np.empty((1, 1), np.float32)]) == []
    copies = _hand_made(Unary("relu", 1, 5), _copy_as_relu)         # -1e-40 where relu gives 0: 7e4 ulps off
    x = np.full((1, 5), -1e-40, np.float32)
    assert any("elements differ" in p for p in check(copies, (x, np.empty((1, 5), np.float32))))


@pytest.mark.parametrize("make", [lambda: tpp.block_spmm(3, 2, 17, 3), lambda: tpp.block_spmm(3, 4, 16, 3, "bf16"),
                                  lambda: tpp.block_spmm(3, 2, 9, 3, beta=1, ldc=11)])
def test_block_spmm_is_checked_like_any_kernel(make):
    spmm = make()
    assert_matches_reference(spmm, max_examples=8)
    arrays = find(S.operands(spmm), lambda a: a[0][1] > a[0][0] + 1)       # in-range indices, 2+ blocks
    rowptr, colidx = arrays[:2]
    assert 0 <= rowptr[0] < rowptr[1] <= len(colidx) and ((0 <= colidx) & (colidx < 3)).all()
    colidx[rowptr[0]] = 3
    with pytest.raises(ValueError, match=f"colidx\\[{rowptr[0]}\\] = 3 is not a block column"):
        assert_matches_reference(spmm, *arrays)


def test_poison_covers_every_float_width():
    from tppasm.testing import poison_bits
    first = np.array([poison_bits(np.float64, 0)], np.uint64).view(np.float64)
    second = np.array([poison_bits(np.float64, 1)], np.uint64).view(np.float64)
    assert np.isnan(first).all() and np.isfinite(second).all()
    with pytest.raises(ValueError, match="complex64 is no kernel operand's"):
        poison_bits(np.complex64, 0)


def test_arrays_refuse_a_row_stride_below_the_width():
    """ld < width overlapped the rows and wrote past the buffer (a crash with wide rows)."""
    with pytest.raises(ValueError, match="ld=1; expected an int >= the row width 100"):
        find(S.arrays("f32", (2, 100), ld=1), lambda a: True)


@settings(max_examples=50)
@given(v=S.values("f32", bound=0.1))
def test_values_take_a_bound_that_f32_cannot_hold(v):
    assert abs(v) <= 0.1


@pytest.mark.parametrize("bound", [-1.0, float("inf"), float("nan"), "1", True])
def test_values_refuse_a_bound_that_is_no_finite_number(bound):
    with pytest.raises((ValueError, TypeError), match="expected a finite number >= 0"):
        S.values("f32", bound=bound)


def test_poison_bits_read_tppasm_names():
    from tppasm.testing import poison_bits
    assert poison_bits("i8", 0) == 0xA5 and poison_bits("f32", 0) == poison_bits(np.float32, 0)
    assert poison_bits("bf16", 1) == poison_bits(tpp.dtypes.dtype("bf16"), 1)


def test_unspecified_outputs_are_skipped_and_only_they(monkeypatch):
    """quantize leaves the codes of a row with a NaN or inf unspecified: the check skips those rows
    and still compares every other element."""
    x = np.array([[1, -2, 3, 0.5, 7], [1, np.nan, 3, 0.5, 7], [1, 2, -np.inf, 0.5, 7]], np.float32)
    k = tpp.quantize(3, 5)
    assert_matches_reference(k, x)
    q, scale = np.empty((3, 5), np.uint8), np.empty(3, np.float32)
    k.reference(x, q, scale)
    assert k.desc.unspecified(x, q, scale)["q"].tolist() == [[False] * 5, [True] * 5, [True] * 5]
    reference = type(k.desc).reference

    def off_by_one(self, x, q, scale):
        reference(self, x, q, scale)
        q += 1
    monkeypatch.setattr(type(k.desc), "reference", off_by_one)
    problems = check(k, (x,))
    assert any("q: 5 of 15 elements differ" in p for p in problems), problems


def _copy_rows_and_one_more(a, x, y):
    """Copies 2 rows of 4 floats (x: ld 4, y: ld 32) and writes a third row of y, past the last."""
    for row in range(3):
        a.vmovups(xmm0, [x + 16 * min(row, 1)])
        a.vmovups([y + 128 * row], xmm0)


def test_a_row_written_one_too_far_is_caught_past_64_bytes():
    desc = Unary("copy", 2, 4, ldo=32)         # the extra row starts 112 bytes past the output's last element
    k = _hand_made(desc, _copy_rows_and_one_more)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    problems = check(k, (x, np.empty((2, 32), np.float32)[:, :4]))
    assert any("written outside the operand" in p for p in problems), problems
