"""The gemm_nt TPP (``C = A @ B.T``, tppasm/gemm_nt.py, tppasm/x86/gemm_nt.py) against its NumPy
reference at every x86 level and bf16 strategy (``vdpbf16ps``, or widening where the target lacks
AVX512-BF16), natively where the host runs the code, else in the interpreter: hypothesis draws
m, n, k (tails of every vector length), leading-dimension pads, dtypes and non-finite entries; C
is poisoned with NaN, its row pads too, and every element is compared.

Tolerance per element: fp32 sums in any order are within k * 2^-24 of sum |a_p b_p|: atol 2^-20
of it (k <= 100 here); a bf16 C adds one bf16 rounding (rtol 2^-7)."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tppasm
from tppasm.dtypes import dtype as D
from tppasm.gemm_nt import GemmNT
from tppasm.x86.brgemm import target_features
from tppasm.x86.gemm_nt import blocking, generate_gemm_nt
from tests.support import assert_same_non_finite, interp_available, native, poisoned, run_raw

KS = [1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 64, 65, 100]
DTYPES = [("f32", "f32"), ("bf16", "f32"), ("bf16", "bf16")]
# (level, features): None = the target's; () = none, so bf16 takes the widening path
VARIANTS = [("avx2", None), ("avx512", None), ("avx512", ()), ("amx", None)]


def _runs(isa, features):
    return native(isa) and set(features or ()) <= target_features(isa)


def _params():
    out = []
    for isa, features in VARIANTS:
        runs = _runs(isa, features)
        ident = f"{isa}-{'widen' if features == () else 'target'}" + ("" if runs else "-interp")
        ok = runs or interp_available()
        out.append(pytest.param(isa, features, id=ident, marks=() if ok else pytest.mark.skip(
            reason=f"the host runs no {isa} code and the interpreter is missing")))
    return out


def _operand(rng, rows, k, ld, dt, specials):
    x = poisoned((rows, k), D(dt), ld)
    x[...] = rng.uniform(-2, 2, (rows, k)).astype(np.float32).astype(D(dt))
    if specials and rows * k > 1:
        x.flat[rng.integers(rows * k)] = rng.choice([np.nan, np.inf, -np.inf])
    return x


@pytest.mark.parametrize("isa,features", _params())
@given(m=st.integers(1, 9), n=st.integers(1, 13), k=st.sampled_from(KS), pads=st.tuples(*[st.integers(0, 5)] * 3),
       dts=st.sampled_from(DTYPES), specials=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_gemm_nt_matches_numpy(isa, features, m, n, k, pads, dts, specials, seed):
    dt, cdt = dts
    rng = np.random.default_rng(seed)
    desc = GemmNT(m, n, k, k + pads[0], k + pads[1], n + pads[2], dt, cdt)
    a = _operand(rng, m, k, desc.lda, dt, specials)
    b = _operand(rng, n, k, desc.ldb, dt, specials)
    c = poisoned((m, n), D(cdt), desc.ldc)
    want = c.copy()
    desc.reference(a, b, want)
    code = generate_gemm_nt(desc, isa, features)
    if _runs(isa, features):
        code(a.ctypes.data, b.ctypes.data, c.ctypes.data)
    else:
        run_raw(type("K", (), {"raw": code, "isa": isa})(), (a, b, c), isa=isa)
    got, w = c.astype(np.float64), want.astype(np.float64)
    assert_same_non_finite(got, w, "gemm_nt")
    bound = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T
    fin = np.isfinite(w)
    err = np.abs(got[fin] - w[fin])
    tol = 2.0 ** -20 * bound[fin] + (2.0 ** -7 * np.abs(w[fin]) if cdt == "bf16" else 0)
    assert (err <= tol).all(), err.max()
    assert np.isnan(c.base[:, n:].astype(np.float32)).all(), "a row pad of C was written"


def test_public_call_allocates_and_checks():
    """``kernel(a, b)`` returns C; strided views are taken as they are; a wrong operand is refused
    with a message naming the fix."""
    if not native("avx2"):
        pytest.skip("needs a host that runs x86 code")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    w = np.ones((7, 6), np.float32)[:, :4]
    c = tppasm.gemm_nt(3, 7, 4, ldb=6)(a, w)
    np.testing.assert_array_equal(c, a @ w.T)
    with pytest.raises(ValueError, match="ldb"):
        tppasm.gemm_nt(3, 7, 4)(a, w)
    with pytest.raises(ValueError, match="c_dtype"):
        tppasm.gemm_nt(3, 7, 4, c_dtype="bf16")
    with pytest.raises(ValueError, match="lda"):
        tppasm.gemm_nt(3, 7, 4, lda=2)
    with pytest.raises(ValueError, match="dense rows"):
        tppasm.gemm_nt(1, 1, 4, ldb=1 << 25)


def test_blocking_fits_the_registers():
    """RA x RB accumulators, RA A vectors, two B vectors and a mask fit every level's registers."""
    for isa, regs in (("avx2", 16), ("avx512", 32)):
        for m in range(1, 20):
            ra, rb = blocking(m, isa)
            assert 1 <= ra <= m and rb >= 2 and ra * rb + ra + 3 <= regs
