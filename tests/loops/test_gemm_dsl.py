"""DESIGN.md's blocked GEMM written in the loop DSL gives NumPy's result for every spec of its space."""
import numpy as np
import pytest

import tppasm as tpp
from loops import Loop, kernel
from loops.enumerate import enumerate_union
from tppasm.testing import assert_matches_reference

BM = BN = BK = 16
MB, NB, KB, KSTEP = 5, 3, 4, 2            # 5 and 3 blocks: blockings that do not divide


def make_gemm(dtype):
    brgemm = tpp.brgemm(m=BM, n=BN, k=BK, dtype=dtype, beta=1)
    zero = tpp.zero(BM, BN, "f32")

    @kernel("aBC", Loop(0, KB, KSTEP, parallel=False), Loop(0, MB, blocks=[4, 2]), Loop(0, NB, blocks=[2, 1]))
    def gemm(ik, im, jn, A, B, C):
        if ik == 0:
            zero(C[im, jn])
        brgemm(A[im, ik:ik + KSTEP], B[jn, ik:ik + KSTEP], C[im, jn], count=KSTEP)
    return gemm


def operands(dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((MB * BM, KB * BK)).astype(np.float32)
    b = rng.standard_normal((KB * BK, NB * BN)).astype(np.float32)
    if dtype == "bf16":
        a, b = (x.astype(tpp.dtypes.dtype("bf16")) for x in (a, b))
        B = tpp.vnni_pack(tpp.block(b, BK, BN, outer="n"), 2)
    else:
        B = tpp.block(b, BK, BN, outer="n")
    A = tpp.block(a, BM, BK)
    ref = a.astype(np.float32) @ b.astype(np.float32)
    return A, np.ascontiguousarray(B), ref


SPECS = enumerate_union([("a", False), ("b", True), ("c", True)], {"b": 2, "c": 2})


def _gemm_or_skip(dtype):
    try:
        return make_gemm(dtype)
    except Exception as e:                       # the BRGEMM of this dtype is not on this host
        pytest.skip(f"brgemm {dtype}: {e}")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_every_spec_of_the_gemm_space(dtype):
    gemm = _gemm_or_skip(dtype)
    A, B, ref = operands(dtype)
    C = np.empty((MB, NB, BM, BN), np.float32)
    tol = 1e-4 if dtype == "f32" else 1e-2
    for spec in SPECS:
        C[...] = np.nan
        gemm.with_spec(spec)(A, B, C)
        np.testing.assert_allclose(tpp.unblock(C), ref, rtol=tol, atol=tol * 8, err_msg=spec)


def test_python_mode_matches_native():
    gemm = make_gemm("f32").with_spec("bcaBCb")
    A, B, ref = operands("f32", seed=1)
    C = np.empty((MB, NB, BM, BN), np.float32)
    assert_matches_reference(gemm, A, B, C, outputs=["C"])     # C poisoned: every element written
    gemm.python(A, B, C)
    np.testing.assert_allclose(tpp.unblock(C), ref, rtol=1e-4, atol=1e-3)


def test_explain_shows_the_nest_and_body():
    gemm = make_gemm("f32")
    A, B, _ = operands("f32")
    C = np.empty((MB, NB, BM, BN), np.float32)
    text = gemm.with_spec("aBCb").explain(A, B, C)
    assert "for ik in range(0, 4, 2)" in text and "share(tid" in text
    assert "if ik == 0:" in text and "brgemm(A[im, ik:ik + 2]" in text
    assert "# thread 0:" in text
    grid = gemm.with_spec("aB{R:1}C{C:1}").explain(A, B, C)
    assert "# thread 0: row 0, col 0, layer 0; im in [0, 1, 2, 3, 4]" in grid


def test_tune_remembers_the_best_spec():
    gemm = make_gemm("f32")
    A, B, ref = operands("f32")
    C = np.empty((MB, NB, BM, BN), np.float32)
    best = gemm.tune(A, B, C, budget=4, reps=1, progress=False)
    assert best in SPECS
    C[...] = 0
    gemm(A, B, C)
    np.testing.assert_allclose(tpp.unblock(C), ref, rtol=1e-4, atol=1e-3)
