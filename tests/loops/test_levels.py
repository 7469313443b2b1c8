"""Loop nests around the kernels of every ISA level the host runs natively (the isa_level fixture):
DESIGN.md's blocked GEMM (f32 and bf16 BRGEMM, zero; tests/loops/test_gemm_dsl.py runs every spec of
its space at the default level) over a sample of specs, and an MLP layer (BRGEMM with a bias + relu
epilogue), against NumPy."""
import numpy as np
import pytest

import tppasm as tpp
from loops import Loop, kernel
from tests.loops.test_gemm_dsl import BK, BM, BN, KB, MB, NB, SPECS, make_gemm, operands


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_blocked_gemm_at_each_level(dtype, isa_level):
    try:
        gemm = make_gemm(dtype)
    except Exception as e:                       # no such BRGEMM at this level
        pytest.skip(f"brgemm {dtype} at {isa_level}: {e}")
    A, B, ref = operands(dtype)
    C = np.empty((MB, NB, BM, BN), np.float32)
    tol = 1e-4 if dtype == "f32" else 1e-2
    for spec in SPECS[::97]:
        C[...] = np.nan
        gemm.with_spec(spec)(A, B, C)
        np.testing.assert_allclose(tpp.unblock(C), ref, rtol=tol, atol=tol * 8, err_msg=spec)
    assert tpp.brgemm(m=BM, n=BN, k=BK, dtype=dtype, beta=1).isa == isa_level


def test_mlp_layer_at_each_level(isa_level):
    layer = tpp.brgemm(m=BM, n=BN, k=BK, beta=0, bias=True, act="relu")
    assert layer.isa == isa_level

    @kernel("AB", Loop(0, MB), Loop(0, NB))
    def mlp(im, jn, X, W, bias, Y):
        layer(X[im, :], W[jn, :], Y[im, jn], bias[jn], count=KB)
    A, B, ref = operands("f32")
    bias = np.random.default_rng(1).standard_normal((NB, BN)).astype(np.float32)
    Y = np.full((MB, NB, BM, BN), np.nan, np.float32)
    mlp(A, B, bias, Y)
    np.testing.assert_allclose(tpp.unblock(Y), np.maximum(ref + bias.reshape(-1)[None, :], 0), rtol=1e-4, atol=1e-3)
