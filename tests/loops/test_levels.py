"""Loop nests around the kernels of every ISA level the host runs natively (the isa_level fixture):
a blocked GEMM (f32 and bf16 BRGEMM, zero) and an MLP layer (BRGEMM + bias + relu epilogue) over a
sample of specs, against NumPy. tests/loops/test_gemm_dsl.py covers every spec at the default level."""
import numpy as np
import pytest

import tppasm as tpp
from loops import Loop, kernel
from loops.enumerate import enumerate_union

BM = BN = BK = 16
MB, NB, KB = 5, 3, 4
SPECS = enumerate_union([("a", False), ("b", True), ("c", True)], {"b": 2, "c": 2})[::97]


def _operands(dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((MB * BM, KB * BK)).astype(np.float32)
    b = rng.standard_normal((KB * BK, NB * BN)).astype(np.float32)
    if dtype == "bf16":
        a, b = (x.astype(tpp.dtypes.dtype("bf16")) for x in (a, b))
        B = np.ascontiguousarray(tpp.vnni_pack(tpp.block(b, BK, BN, outer="n"), 2))
    else:
        B = tpp.block(b, BK, BN, outer="n")
    return tpp.block(a, BM, BK), B, a.astype(np.float32) @ b.astype(np.float32)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_blocked_gemm_at_each_level(dtype, isa_level):
    try:
        brgemm = tpp.brgemm(m=BM, n=BN, k=BK, dtype=dtype, beta=1)
    except Exception as e:                       # no such BRGEMM at this level
        pytest.skip(f"brgemm {dtype} at {isa_level}: {e}")
    assert brgemm.isa == isa_level
    zero = tpp.zero(BM, BN)

    @kernel("aBC", Loop(0, KB, 2, parallel=False), Loop(0, MB, blocks=[4, 2]), Loop(0, NB, blocks=[2, 1]))
    def gemm(ik, im, jn, A, B, C):
        if ik == 0:
            zero(C[im, jn])
        brgemm(A[im, ik:ik + 2], B[jn, ik:ik + 2], C[im, jn], count=2)
    A, B, ref = _operands(dtype)
    C = np.empty((MB, NB, BM, BN), np.float32)
    tol = 1e-4 if dtype == "f32" else 1e-2
    for spec in SPECS:
        C[...] = np.nan
        gemm.with_spec(spec)(A, B, C)
        np.testing.assert_allclose(tpp.unblock(C), ref, rtol=tol, atol=tol * 8, err_msg=spec)


def test_mlp_layer_at_each_level(isa_level):
    layer = tpp.brgemm(m=BM, n=BN, k=BK, beta=0, bias=True, act="relu")
    assert layer.isa == isa_level

    @kernel("AB", Loop(0, MB), Loop(0, NB))
    def mlp(im, jn, X, W, bias, Y):
        layer(X[im, :], W[jn, :], Y[im, jn], bias[jn], count=KB)
    A, B, ref = _operands("f32")
    bias = np.random.default_rng(1).standard_normal((NB, BN)).astype(np.float32)
    Y = np.full((MB, NB, BM, BN), np.nan, np.float32)
    mlp(A, B, bias, Y)
    expect = np.maximum(ref + bias.reshape(-1)[None, :], 0)
    np.testing.assert_allclose(tpp.unblock(Y), expect, rtol=1e-4, atol=1e-3)
