"""``C = A @ B.T`` on the SVE backend (:mod:`tppasm.sve.gemm_nt`) against ``GemmNT.reference`` at VL
128, 256 and 512, natively on an SVE host that runs that length, else under qemu. Hypothesis draws
m and n (whole and partial blocks of A and of B rows), k (below, at and past whole vectors of every
VL, odd for the bf16 pairs), the padding of each leading dimension (one large enough that a block's
stride takes more than an add's immediate); each example runs f32, bf16 -> f32 and bf16 -> bf16.
A and B are NaN past k in each row, C is NaN everywhere before the run; every element of C's
buffer is compared (the padding must stay NaN, so nothing outside (m, n) is written).

Tolerance, per element ``|got - want| <= atol + rtol |want|``: a lane's fp32 sum is a chain of at
most k roundings (fmla: 2^-24 each; bfdot: two per pair of products, round to odd, 2^-23 each),
then at most 4 of ``faddv``'s tree, each relative to a partial sum bounded by S = sum |a_i| |b_i|
(bf16 products are exact in fp32): atol 2^-22 (k + 8) S, with a factor 2 of room. A bf16 C adds
rtol 2^-7 (the kernel's fp32 sum, a little off the reference's, can round to the neighbouring bf16,
one bf16 ulp being at most 2^-7 of the value) and doubles atol for that rounding near zero.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from isa.aarch64.native import run_calls
from tppasm.gemm_nt import GemmNT
from tppasm.sve.gemm_nt import blocking
from tests.aarch64.marks import vl_params
from tests.aarch64.sve_cases import DescCase, close, same_examples_at_every_vl, sve_kernel, view

VLS = (128, 256, 512)
DTYPES = [("f32", "f32"), ("bf16", "f32"), ("bf16", "bf16")]
KS = [1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 64, 65, 100]
SETTINGS = dict(max_examples=100, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PAD = st.sampled_from([0, 0, 1, 2, 3, 1029])

example = st.fixed_dictionaries({
    "m": st.integers(1, 9), "n": st.integers(1, 13), "k": st.sampled_from(KS),
    "pads": st.tuples(PAD, PAD, PAD), "seed": st.integers(0, 2 ** 16)})


def _input(case, name):
    i = next(i for i, s in enumerate(case.specs) if s.name == name)
    return view(case.bufs[i], case.specs[i], 1).astype(np.float64)


def tolerance(case):
    """(rtol, atol) of a case: atol an array over C's buffer (see the module docstring)."""
    d = case.desc
    bound = 2.0 ** -22 * (d.k + 8) * (np.abs(_input(case, "a")) @ np.abs(_input(case, "b")).T)
    c = case.specs[2]
    atol = np.zeros(case.bufs[2].size)
    view(atol, c, 1)[...] = bound * (2 if d.c_dtype == "bf16" else 1)
    return (2.0 ** -7 if d.c_dtype == "bf16" else 0.0), atol


def run_all(cases, bits):
    run_calls([c.call() for c in cases], vl_bits=bits)
    for c in cases:
        rtol, atol = tolerance(c)
        (got, want), = c.results()
        bad = close(got, want, rtol, atol)
        assert not bad.size, (f"VL {bits}: {c.desc} (blocks {blocking(c.desc)}): {bad.size} elements differ, "
                              f"first at flat {bad[0]}: got {got[bad[0]]!r}, expected {want[bad[0]]!r}")


def cases_of(m, n, k, pads, seed):
    pa, pb, pc = pads
    return [DescCase(GemmNT(m, n, k, lda=k + pa, ldb=k + pb, ldc=n + pc, dtype=dt, c_dtype=cdt), seed=seed + i)
            for i, (dt, cdt) in enumerate(DTYPES)]


@pytest.mark.parametrize("bits", vl_params(VLS))
@same_examples_at_every_vl
@settings(**SETTINGS)
@given(example)
def test_gemm_nt(bits, s):
    run_all(cases_of(s["m"], s["n"], s["k"], s["pads"], s["seed"]), bits)


@pytest.mark.parametrize("bits", vl_params(VLS))
def test_gemm_nt_larger(bits):
    """Loops of several blocks each way, full vectors before the k tail, a single row of A against
    many rows of B (the decoder's case), dense and padded."""
    cases = cases_of(16, 40, 257, (0, 0, 0), 1) + cases_of(1, 50, 130, (5, 3, 7), 2) + \
        cases_of(13, 17, 1, (1029, 0, 2000), 3)
    run_all(cases, bits)


def test_blocking_fits_the_registers():
    """Every block's accumulators, A vectors and at least two B vectors fit the 32 z registers;
    rows of A are spread evenly over the blocks."""
    for m in range(1, 20):
        ra, rb = blocking(GemmNT(m, 8, 8))
        assert ra <= 4 and ra * rb + ra + 2 <= 32 and -(-m // ra) == -(-m // 4), (m, ra, rb)


@pytest.mark.parametrize("desc", [GemmNT(5, 9, 17), GemmNT(2, 3, 8, dtype="bf16", c_dtype="bf16")])
def test_gemm_nt_takes_the_sve_generator(desc):
    """``Kernel(desc, "sve")`` finds the generator and the code is position independent."""
    from tppasm.cache import position
    code = sve_kernel(desc).raw.code
    assert position.audit(code, "sve") is None and len(code) % 4 == 0
