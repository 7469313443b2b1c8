"""tppasm.testing, the fixes of review fz9g: a kernel reading its write-only output is caught (max and
min too), float tolerances are per element for element-wise kinds, operands(specials=True) passes
correct kernels that sum, a signalling NaN input warns nowhere, each kernel has its own hypothesis
database key, misuse (count= for a loop kernel, outputs= naming an input, strategy arguments) is
refused in tppasm's words, and the kernel views (SVE hint, isa=, half-built objects)."""
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.database import InMemoryExampleDatabase

import tppasm as tpp
from isa.x86 import ymm0, ymm1, ymm2
from loops import Loop, kernel
from tests.test_testing import _hand_made
from tppasm.eltwise import Unary
from tppasm.kernel import ISAUnavailableError, Kernel
from tppasm.testing import assert_matches_reference, check, strategies as S
from tppasm.testing.compare import compare

F32_MAX = float(np.finfo(np.float32).max)


def _reads_output(combine):
    """relu that starts from its write-only output: out = combine(out, relu(x)) (vmaxps or vminps)."""
    def emit(a, x, y):
        a.vxorps(ymm2, ymm2, ymm2)
        a.vmovups(ymm1, [x])
        a.vmaxps(ymm1, ymm1, ymm2)
        a.vmovups(ymm0, [y])
        getattr(a, combine)(ymm0, ymm0, ymm1)
        a.vmovups([y], ymm0)
    return emit


@pytest.mark.parametrize("combine", ["vmaxps", "vminps"])
def test_a_kernel_reading_its_write_only_output_is_caught(combine):
    """Run 0's signalling NaN passes through vmaxps/vminps; the huge finite poisons of both signs
    make max- and min-style reads show, since every run's values are compared."""
    k = _hand_made(Unary("relu", 1, 8), _reads_output(combine))
    x = np.array([[-1, 2, -3, 4, -5, 6, -7, 8]], np.float32)
    problems = check(k, (x, np.empty((1, 8), np.float32)))
    assert any("the kernel reads its write-only output" in p for p in problems), problems
    with pytest.raises(AssertionError, match="reads its write-only output"):
        assert_matches_reference(k, max_examples=5)


class _Off:
    """A correct kernel whose call then changes its output with ``change(out)`` (a planted bug)."""

    def __init__(self, k, change):
        self.k, self.change = k, change

    def __getattr__(self, name):
        return getattr(self.k, name)

    def __call__(self, x, out):
        self.k(x, out)
        self.change(out)


def _add_at_1(amount):
    def change(out):
        out[0, 1] += amount
    return change


def test_one_huge_element_hides_no_wrong_element_of_an_elementwise_kernel():
    x = np.array([[1e6, 1.0, 2.0, 3.0]], np.float32)
    with pytest.raises(AssertionError, match=r"\[0, 1\] got 6.0 want 1.0"):
        assert_matches_reference(_Off(tpp.relu(1, 4), _add_at_1(5.0)), x)
    x[0, 0] = F32_MAX

    def times_1e30(out):
        out[0, 1:] *= np.float32(1e30)
    with pytest.raises(AssertionError, match="3 of 4 elements differ"):
        assert_matches_reference(_Off(tpp.relu(1, 4), times_1e30), x)


def test_bf16_elementwise_results_within_two_ulps_fp32_within_rtol():
    want = np.array([1.5, 1.0, 3.0], np.float64)
    ulp = 2.0 ** -7
    bf16 = np.array([1.5 + 2 * ulp, 1.0 + 2 * ulp * 0.5, 3.0], ml_dtypes.bfloat16)
    assert compare("out", bf16, want, None, None, 0.0, summing=False) == []
    three = np.array([1.5 + 3 * ulp, 1.0, 3.0], ml_dtypes.bfloat16)
    assert "2 bf16 ulps per element" in compare("out", three, want, None, None, 0.0, summing=False)[0]
    fp32 = np.array([1.0 + 150 * 2.0 ** -23, 1.0, 3.0], np.float32)
    assert "1 of 3 elements" in compare("out", fp32, np.array([1.0, 1.0, 3.0]), None, None, 0.0, summing=False)[0]
    # kinds that sum keep the magnitude-aware bound, for sums that cancel
    assert compare("c", np.array([5e-4, 100.0], np.float32), np.array([0.0, 100.0]), None, None, 0.0) == []
    assert compare("c", np.array([5e-4, 100.0], np.float32), np.array([0.0, 100.0]), None, None, 0.0,
                   summing=False)


def test_gelu_erf_fast_is_held_to_its_documented_absolute_error():
    """gelu_erf_fast is gelu_erf to 2^-22 max(1, |x|) absolute: at x = -4 (gelu ~ -1.3e-4) that is
    2.7e-4 relative, which a per-element rtol of 1e-5 alone called wrong."""
    x = np.array([[-4.0, -3.5, 1.0, 2.0]], np.float32)
    assert_matches_reference(tpp.unary("gelu_erf_fast", 1, 4), x)
    assert check(_Off(tpp.unary("gelu_erf_fast", 1, 4), _add_at_1(1e-5)), (x, np.empty_like(x)))


@pytest.mark.parametrize("make", [lambda: tpp.brgemm(3, 9, 5), lambda: tpp.brgemm(4, 16, 6, dtype="bf16"),
                                  lambda: tpp.rmsnorm(2, 17), lambda: tpp.swiglu(2, 8, 16)])
def test_specials_leave_correct_summing_kernels_passing(make):
    k = make()
    assert_matches_reference(k, S.operands(k, specials=True), max_examples=30)


@settings(max_examples=60)
@given(st.data())
def test_specials_of_a_summing_kernel_stay_in_fp32_range(data):
    a, b, _ = data.draw(S.operands(tpp.brgemm(2, 3, 4), specials=True))
    values = np.concatenate([a.ravel(), b.ravel()]).astype(np.float64)
    assert not (np.abs(values) == F32_MAX).any()
    tiny = (values != 0) & (np.abs(values) < np.finfo(np.float32).tiny)       # denormals
    assert not (tiny.any() and np.isinf(values).any())


def test_a_signalling_nan_input_warns_nowhere():
    x = np.ones((1, 4), np.float32)
    x.view(np.uint32)[0, 1] = 0x7F800001
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_matches_reference(tpp.copy(1, 4), x)
        assert_matches_reference(tpp.transform("transpose", 1, 4), x)


@pytest.fixture
def in_memory_database():
    """The active hypothesis profile with an in-memory example database, restored afterwards."""
    previous = settings.get_current_profile_name()
    db = InMemoryExampleDatabase()
    settings.register_profile("fix9g-db", parent=settings.get_profile(previous), database=db, max_examples=10)
    settings.load_profile("fix9g-db")
    yield db
    settings.load_profile(previous)


def test_each_kernel_keeps_its_own_database_entries(in_memory_database):
    db = in_memory_database
    with pytest.raises(AssertionError):
        assert_matches_reference(_Off(tpp.relu(3, 17), _add_at_1(1.0)))
    saved = {k: set(v) for k, v in db.data.items()}
    assert saved
    assert_matches_reference(tpp.softmax(5, 9))
    assert all(db.data.get(k) == v for k, v in saved.items()), "another kernel's check deleted them"


def test_loop_kernels_refuse_count():
    zero = tpp.zero(4, 8)

    @kernel("A", Loop(0, 3))
    def lk(i, X):
        zero(X[i])
    X = np.empty((3, 4, 8), np.float32)
    assert_matches_reference(lk, X)
    for count in (2, 0, "many"):
        with pytest.raises(TypeError, match="loop kernel, which takes no count"):
            assert_matches_reference(lk, X, count=count)


def test_outputs_naming_an_input_are_refused():
    x = np.ones((2, 3), np.float32)
    for outputs in ("x", 0, ["x", "out"]):
        with pytest.raises(ValueError, match=r"outputs names 'x', which the kernel only reads; name arrays it "
                                             r"writes \(out\)"):
            check(tpp.relu(2, 3), [x, np.empty_like(x)], outputs=outputs)


@pytest.mark.parametrize("make, error, words", [
    (lambda: S.values("i8", bound="x"), TypeError, "values: bound='x'"),
    (lambda: S.values("f32", specials="yes"), TypeError, "values: specials='yes'"),
    (lambda: S.leading_dimensions(-5), ValueError, "leading_dimensions: width=-5"),
    (lambda: S.leading_dimensions("8"), TypeError, "leading_dimensions: width='8'"),
    (lambda: S.leading_dimensions(5, max_extra=-1), ValueError, "max_extra=-1"),
    (lambda: S.vnni_b("bf16", 4, 3, count=0), ValueError, "vnni_b: count=0"),
    (lambda: S.loop_bounds(max_step=0), ValueError, "loop_bounds: max_step=0"),
    (lambda: S.loop_bounds(max_trip="3"), TypeError, "loop_bounds: max_trip='3'"),
    (lambda: S.loop_bounds(max_trip=2, min_trip=3), ValueError, "loop_bounds: max_trip=2; expected an int >= 3"),
    (lambda: S.operands(tpp.brgemm(2, 2, 2), max_count=0), ValueError, "operands: max_count=0"),
    (lambda: S.operands(tpp.relu(2, 2), align="no"), TypeError, "operands: align='no'"),
    (lambda: S.arrays("f32", (2, 3), align="no"), TypeError, "arrays: align='no'"),
    (lambda: S.arrays("f32", (2, 3), ld="8"), TypeError, "arrays: ld='8'"),
])
def test_strategy_arguments_are_checked_in_tppasm_words(make, error, words):
    with pytest.raises(error, match=words):
        make()


@settings(max_examples=40)
@given(v=S.values("i8", bound=10), ld=S.leading_dimensions(5, max_extra=0))
def test_strategy_arguments_take_effect(v, ld):
    assert -10 <= v <= 10 and ld == 5


def test_vnni_b_count_one_keeps_the_batch_axis():
    from hypothesis import find
    assert find(S.vnni_b("bf16", 4, 3, count=1), lambda b: True).shape == (1, 2, 3, 2)


def test_an_sve_kernel_is_pointed_to_the_aarch64_emulator():
    k = tpp.relu(2, 8, isa="sve")
    if k.runnable:
        pytest.skip("this host runs SVE")
    with pytest.raises(ISAUnavailableError, match=r"isa\.aarch64\.emulate") as e:
        assert_matches_reference(k)
    assert "isa.x86.interp" not in str(e.value)


def test_repr_shows_an_explicit_isa_and_survives_half_built_kernels():
    from isa.cpu import host
    other = next((level for level in ("avx2", "sve") if level != host().isa), None)
    k = tpp.relu(2, 8, isa=other)
    assert f"tppasm.unary('relu', 2, 8, isa='{other}')" in repr(k) and f"isa=&#x27;{other}&#x27;" in k._repr_html_()
    assert "isa=" not in repr(tpp.relu(2, 8))
    bare = Kernel.__new__(Kernel)
    assert repr(bare) == "<Kernel (not built: no attributes set)>" and "not built" in bare._repr_html_()


def test_summing_kinds_report_an_error_ten_times_their_bound():
    """rtol * |w_i| + rtol * max|w| (rtol 1e-5): an element off by 1e-4 * max|w| is reported."""
    from tppasm.testing.compare import compare
    want = np.array([[100.0, 1.0]], np.float32)
    got = want.copy()
    got[0, 1] += 1e-2
    assert compare("c", got, want, rtol=None, atol=None, summing=True)
    got[0, 1] = want[0, 1] + 1e-4                  # within the bound (1e-3 here)
    assert not compare("c", got, want, rtol=None, atol=None, summing=True)
