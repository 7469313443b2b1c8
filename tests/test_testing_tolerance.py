"""tppasm.testing's float tolerance of kinds that sum products (review fz15a item 1, fix14b's note):
it scales with the sizes of the terms an element sums (the reference on |inputs|), so a correct
kernel whose terms cancel (or a ReLU cuts) or that sums many terms passes, while an error in an
element whose terms do not cancel is still caught."""
import numpy as np
import pytest

import tppasm as tpp
from tppasm.brgemm import Brgemm
from tppasm.testing import assert_matches_reference, check
from tppasm.testing.compare import compare

F = np.float32


def _cancelling_case():
    """The report's element: relu(0 + 2.4335938 - 5 * 0.0603541 - 2.125) = 0.0068, summed from terms
    of ~2.4 (k=2, 3 blocks, C zero with beta=1, a bias that cancels)."""
    a = np.zeros((3, 7, 512), F)
    a[:, 0, :2] = -0.6953125
    b = np.zeros((3, 2, 1024), F)
    b[:, :, :32] = 0.0868014
    b[0, 0, 0] = -3.5
    c = np.zeros((7, 32), F)
    bias = np.zeros(32, F)
    bias[0] = -2.125
    return a[:, :, :2], b[:, :, :32], c, bias


def test_relu_after_cancelling_terms_passes():
    g = tpp.brgemm(7, 32, 2, lda=512, ldb=1024, beta=1, bias=True, act="relu", stream_c=True)
    a, b, c, bias = _cancelling_case()
    assert check(g, [a, b, c, bias]) == []
    g(a, b, c, bias)
    assert 0 < c[0, 0] < 0.01                               # the case cancels, as in the report


def test_second_case_of_the_report_passes_on_cancelling_data():
    """brgemm(31, 32, 8, lda=1040, ldb=2048, ldc=1024, beta=1, bias=True, act="relu") on a C that
    cancels each element's products and bias (terms of ~10) down to about 1e-4."""
    g = tpp.brgemm(31, 32, 8, lda=1040, ldb=2048, ldc=1024, beta=1, bias=True, act="relu")
    rng = np.random.default_rng(7)
    a = rng.uniform(-3, 3, (2, 31, 1040)).astype(F)[..., :8]
    b = rng.uniform(-3, 3, (2, 8, 2048)).astype(F)[..., :32]
    bias = rng.uniform(-3, 3, 32).astype(F)
    exact = bias + sum(a[i].astype(float) @ b[i] for i in range(2))
    c = np.zeros((31, 1024), F)[:, :32]
    c[...] = -exact + rng.uniform(1e-4, 2e-4, exact.shape)
    assert check(g, [a, b, c, bias]) == []


def test_long_sum_of_equal_terms_passes():
    """fix14b's note: 3 blocks of k=1024 equal positive terms; fp32 summation is 4e-5 off, relatively."""
    g = tpp.brgemm(64, 8, 1024)
    a, b = np.full((3, 64, 1024), 0.9, F), np.full((3, 1024, 8), 0.9, F)
    assert check(g, [a, b, np.empty((64, 8), F)]) == []


def _positive(m=8, n=16, k=32, count=2):
    rng = np.random.default_rng(3)
    return (rng.uniform(0.5, 1.0, (count, m, k)).astype(F), rng.uniform(0.5, 1.0, (count, k, n)).astype(F),
            np.empty((m, n), F))


def _off_by(monkeypatch, scale, where=(0, 0)):
    """The reference with one element ``scale`` times the result's size off (as a kernel bug would be)."""
    compute = Brgemm.compute

    def wrong(self, a_blocks, b_blocks, c, bias=None):
        out = compute(self, a_blocks, b_blocks, c, bias)
        out[where] += scale * np.abs(out).max()
        return out
    monkeypatch.setattr(Brgemm, "compute", wrong)


@pytest.mark.parametrize("scale", [4e-5, -4e-5])
def test_small_error_in_an_uncancelled_element_is_caught(monkeypatch, scale):
    """Terms all positive (nothing cancels): an error of 4 rtol of the result's size still shows."""
    g = tpp.brgemm(8, 16, 32)
    arrays = _positive()
    assert check(g, arrays) == []
    _off_by(monkeypatch, scale, (3, 5))
    problems = check(g, arrays)
    assert problems and "c: 1 of 128 elements differ" in problems[0] and "[3, 5]" in problems[0]


def test_a_missing_term_in_a_cancelled_element_is_caught():
    """The report's cancelled element with one of its 6 products left out (relu(0.0068 + 0.06))."""
    g = tpp.brgemm(7, 32, 2, lda=512, ldb=1024, beta=1, bias=True, act="relu", stream_c=True)
    a, b, c, bias = _cancelling_case()
    g(a, b, c, bias)
    got, want = c, c.copy()
    want[0, 0] += F(0.6953125 * 0.0868014)
    sizes = np.full(want.shape, 10.0)
    assert compare("c", got, want, None, None, summing=True, magnitude=sizes, terms=7)


def test_compare_scales_with_the_terms_only_where_given():
    want = np.array([[1e-3, 1.0]])
    got = want + np.array([[4e-5, 0.0]])
    assert compare("c", got.astype(F), want, None, None, summing=True)           # without sizes: a mismatch
    assert not compare("c", got.astype(F), want, None, None, summing=True, magnitude=np.array([[5.0, 1.0]]))
    # an explicit atol is the bound: the sizes do not widen it
    assert compare("c", got.astype(F), want, None, 1e-6, summing=True, magnitude=np.array([[5.0, 1.0]]))
    # element-wise kinds keep their per-element bound
    assert compare("c", got.astype(F), want, None, None, summing=False, magnitude=np.array([[5.0, 1.0]]))


def test_overflowing_sizes_fall_back_to_the_plain_bound():
    want = np.array([1.0, 2.0])
    got = (want + np.array([1.0, 0.0])).astype(F)
    assert compare("c", got, want, None, None, summing=True, magnitude=np.array([np.inf, 2.0]))


def test_reduce_max_and_norms_keep_their_bound():
    from tppasm.testing.compare import bounds_terms
    assert not bounds_terms(tpp.reduce("max", 2, 8), "kernel")
    assert not bounds_terms(tpp.rmsnorm(2, 8), "kernel")
    assert bounds_terms(tpp.reduce("add", 2, 8), "kernel") and bounds_terms(tpp.gemm_nt(2, 2, 2), "kernel")


def test_hypothesis_examples_of_a_cancelling_relu_brgemm_pass():
    assert_matches_reference(tpp.brgemm(7, 32, 2, lda=512, ldb=1024, beta=1, bias=True, act="relu",
                                        stream_c=True), max_examples=10)


@pytest.mark.parametrize("factor, reported", [(2.0, True), (0.5, False)])
def test_a_long_sum_is_held_to_gamma_n_of_its_terms_sizes(factor, reported):
    """4096 terms whose sizes sum to 100, cancelling to ~0: past ~170 terms Higham's gamma_n
    (n u / (1 - n u), u = 2^-24: 0.0244 here) outgrows rtol and is the bound; twice it is an error,
    half of it is rounding. (A bound 4x looser went unnoticed: only correct long sums were tried.)"""
    n, size = 4096, 100.0
    nu = n * 2.0 ** -24
    bound = nu / (1 - nu) * size
    want = np.zeros((2, 4))
    want[0, 0] = 1e-3
    got = want.astype(F)
    got[0, 1] = factor * bound
    problems = compare("c", got, want, None, None, summing=True, magnitude=np.full(want.shape, size), terms=n)
    assert bool(problems) == reported, problems
    if reported:
        assert "1 of 8 elements differ" in problems[0] and "[0, 1]" in problems[0]


def test_terms_summed_counts_every_term_of_each_kind():
    """block_spmm: bk per stored block (``count`` of them at most in a row) and C with beta=1."""
    from tppasm.eltwise import Reduce
    from tppasm.gemm_nt import GemmNT
    from tppasm.spmm import BlockSpmm
    from tppasm.testing.compare import terms_summed
    assert terms_summed(BlockSpmm(bm=4, bk=8, n=16, kb=6, beta=1), 5) == 8 * 5 + 1
    assert terms_summed(BlockSpmm(bm=4, bk=8, n=16, kb=6), 3) == 8 * 3
    assert terms_summed(GemmNT(2, 3, 40), 1) == 40
    assert terms_summed(Reduce("add", 3, 7), 1) == 7
    assert terms_summed(Reduce("add", 3, 7, "rows"), 1) == 3


def _with_element(kernel, value_of, output=2, where=(0, 0)):
    """``kernel``, but element ``where`` of its array ``output`` (a BRGEMM's C) comes out as
    ``value_of(what the kernel wrote)``."""
    class Changed(type(kernel)):
        def __call__(self, *arrays, **kw):
            out = super().__call__(*arrays, **kw)
            arrays[output][where] = value_of(arrays[output][where])
            return out
    changed = Changed.__new__(Changed)
    changed.__dict__.update(kernel.__dict__)
    return changed


def _off_in_small_element(kernel, relative, output=2, where=(0, 0)):
    """``kernel``, but element ``where`` of its array ``output`` comes out ``relative`` times itself
    too large."""
    return _with_element(kernel, lambda v: v + F(relative) * abs(v), output, where)


def test_a_denormal_result_of_an_epilogue_may_be_flushed():
    """GELU (tanh form) of a sum of -10.3 is -7.6e-41, a denormal that the AVX2 kernels flush to
    -0.0 (tppasm.x86.math; the AVX-512 ones keep it): the bound of every bending epilogue allows
    2^-126 max(1, |sum|) for that (hypothesis found the case on a Zen 3), and no more: -1e-30 is
    caught."""
    g = tpp.brgemm(3, 9, 7, ldb=12, ldc=10, beta=1, bias=True, act="gelu")
    a, b = np.full((1, 3, 7), 2.75, F), np.zeros((1, 7, 12), F)
    b[0, 0, 0] = -3.75
    arrays = [a, b[:, :, :9], np.zeros((3, 10), F)[:, :9], np.zeros(9, F)]
    assert check(g, arrays) == [] and check(_with_element(g, lambda v: F(-0.0)), arrays) == []
    problems = check(_with_element(g, lambda v: F(-1e-30)), arrays)
    assert any("1 of 27 elements differ" in p and "[0, 0] got -1.0000" in p for p in problems), problems


@pytest.mark.parametrize("act, small", [(None, 1.0), ("relu", 1.0), ("gelu", 1.0), ("gelu_erf", 1.0),
                                        ("gelu_erf_fast", 1.0), ("tanh", 1e-3), ("sigmoid", -1.0),
                                        ("gelu_erf", -0.5)])
def test_an_error_in_a_small_element_beside_large_ones_is_caught(act, small):
    """Row 0 sums to 8 (tanh: 0.008; sigmoid: -8, 3.4e-4; GELU: -4, -1.3e-4), row 1 to 80,000: 0.1% off in
    row 0 is far over fp32's rounding there, carried through the epilogue's slope near that sum,
    though under rtol * max|reference| (0.8; sigmoid, tanh: 1e-5), which alone hid it."""
    g = tpp.brgemm(2, 16, 8, act=act)
    a, b = np.ones((1, 2, 8), F), np.ones((1, 8, 16), F)
    a[0, 0], a[0, 1] = small, 1e4
    assert check(g, [a, b, np.empty((2, 16), F)]) == []
    problems = check(_off_in_small_element(g, 1e-3), [a, b, np.empty((2, 16), F)])
    assert any("1 of 32 elements differ" in p and "[0, 0] got" in p for p in problems), problems


@pytest.mark.parametrize("op, x", [("gelu", -10.3125), ("sigmoid", -90.0)])
def test_a_denormal_result_of_a_unary_op_may_be_flushed(op, x):
    """The same for the unary ops: gelu(-10.3125) = -7.6e-41 and sigmoid(-90) = 8.2e-40, denormals
    the AVX2 kernels flush to zero, pass as zero (2^-126 max(1, |x|) each) and not as 1e-30."""
    k = tpp.unary(op, 1, 2)
    arrays = [np.array([[x, 1.0]], F), np.empty((1, 2), F)]
    assert check(k, arrays) == [] and check(_with_element(k, lambda v: F(0.0), output=1), arrays) == []
    problems = check(_with_element(k, lambda v: F(-1e-30), output=1), arrays)
    assert any("1 of 2 elements differ" in p and "[0, 0] got -1.0000" in p for p in problems), problems


def _two_scales(shape, small, large, seed=5):
    """Row 0 of values about ``small``, the other rows about ``large``."""
    x = np.random.default_rng(seed).uniform(0.5, 1.0, shape).astype(F)
    x[0] *= F(small)
    x[1:] *= F(large)
    return x


def test_an_error_in_a_row_of_small_results_is_caught():
    """softmax, rotary (rows computed apart: the largest value is each row's) and a reduction to the
    largest value (element-wise): 0.1% off in an element of a row of small results, under rtol times
    the largest result of the array, which alone hid it."""
    n = 256
    x = np.zeros((2, n), F)
    x[1, 0] = 30.0                                  # row 1: one probability of ~1; row 0: all 1/256
    cos, sin = _two_scales((2, 4), 1, 1), _two_scales((2, 4), 1, 1, seed=6)
    cases = [(tpp.softmax(2, n), [x, np.empty((2, n), F)], 1, (0, 3)),
             (tpp.rotary(2, 16, 8), [_two_scales((2, 16), 1e-3, 1e3), cos, sin, np.empty((2, 16), F)], 3, (0, 3)),
             (tpp.reduce("max", 2, 16, over="cols"), [_two_scales((2, 16), 1e-3, 1e3), np.empty(2, F)], 1, (0,))]
    for kernel, arrays, output, where in cases:
        assert check(kernel, arrays) == [], kernel
        problems = check(_off_in_small_element(kernel, 1e-3, output, where), arrays)
        assert any(" 1 of " in p and f"[{', '.join(map(str, where))}] got" in p for p in problems), (kernel, problems)


def test_a_layer_norm_of_values_far_from_zero_passes():
    """Rows of 1e4 + N(0, 1): the rounding of each x - mean (~1e-3) is ~1e-3 of the results, which
    rtol * max|reference| (3e-5) refused; the norm's sizes (r |gamma| (max|x| + |mean|)) allow it."""
    rng = np.random.default_rng(2)
    x = (1e4 + rng.standard_normal((4, 64))).astype(F)
    gamma, beta = rng.uniform(-2, 2, 64).astype(F), rng.uniform(-1, 1, 64).astype(F)
    assert check(tpp.layernorm(4, 64), [x, gamma, beta, np.empty_like(x)]) == []


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_an_error_in_a_column_of_small_gamma_is_caught(kind):
    """gamma 1e-3 in column 0, 1e3 elsewhere: 0.1% off in column 0 is far under rtol * max|reference|
    (~3e-2) but over the element's own bound (rtol times its size, ~4e-8)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 64)).astype(F)
    x[1, 0] = 2.5
    gamma = np.full(64, 1e3, F)
    gamma[0] = 1e-3
    arrays = [x, gamma, np.zeros(64, F), np.empty_like(x)] if kind == "layernorm" else [x, gamma, np.empty_like(x)]
    kernel = getattr(tpp, kind)(4, 64)
    assert check(kernel, arrays) == []
    problems = check(_off_in_small_element(kernel, 1e-3, len(arrays) - 1, (1, 0)), arrays)
    assert any(" 1 of 256 " in p and "[1, 0] got" in p for p in problems), problems
