"""AMX kernels in a loop nest: tiles configured once per thread in ``init``, released in ``fini``,
and the BRGEMM built without its own setup (PARLOOPER's NO_SETUP/NO_RESET_TILECONFIG)."""
import numpy as np
import pytest

import tppasm as tpp
from isa.cpu import host
from loops import Loop, kernel

BM = BN = BK = 32


def _amx_gemm(Mb, Nb, Kb):
    gemm = tpp.brgemm(m=BM, n=BN, k=BK, dtype="bf16", beta=0, tile_setup=False, isa="amx")
    config, release = tpp.tileconfig(gemm), tpp.tilerelease()

    @kernel("aBC", Loop(0, Kb, Kb, parallel=False), Loop(0, Mb), Loop(0, Nb))
    def mm(ik, im, jn, A, B, C):
        gemm(A[im, ik:], B[jn, ik:], C[im, jn], count=Kb)

    @mm.init
    def setup(A, B, C):
        config()

    @mm.fini
    def teardown(A, B, C):
        release()
    return mm


def _operands(Mb, Nb, Kb, rng):
    a = rng.standard_normal((Mb * BM, Kb * BK)).astype(tpp.dtypes.dtype("bf16"))
    b = rng.standard_normal((Kb * BK, Nb * BN)).astype(tpp.dtypes.dtype("bf16"))
    A = tpp.block(a, BM, BK)
    B = np.ascontiguousarray(tpp.vnni_pack(tpp.block(b, BK, BN, outer="n"), 2))
    C = np.full((Mb, Nb, BM, BN), np.nan, np.float32)
    return a, b, A, B, C


def test_tile_configuration_runs_once_per_thread_around_the_nest():
    mm = _amx_gemm(2, 2, 2)
    _, _, A, B, C = _operands(2, 2, 2, np.random.default_rng(0))
    text = mm.explain(A, B, C)
    init, fini = text.index("# init"), text.index("# fini")
    assert "amx_tileconfig" in text[init:fini] and "amx_tilerelease" in text[fini:]
    assert text.count("amx_tileconfig") == 1 and text.count("amx_tilerelease") == 1


def test_the_python_path_gives_numpy_results():
    mm = _amx_gemm(2, 3, 2)
    a, b, A, B, C = _operands(2, 3, 2, np.random.default_rng(1))
    mm.python(A, B, C)
    ref = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(tpp.unblock(C), ref, rtol=1e-4, atol=1e-3)


@pytest.mark.skipif(host().isa != "amx", reason=f"host runs {host().isa}, not AMX: the nest is compiled but not run")
def test_native_amx_nest_matches_numpy():
    mm = _amx_gemm(3, 2, 4)
    a, b, A, B, C = _operands(3, 2, 4, np.random.default_rng(2))
    mm(A, B, C)
    ref = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(tpp.unblock(C), ref, rtol=1e-4, atol=1e-3)


@pytest.mark.skipif(host().isa == "amx", reason="the host runs AMX")
def test_amx_code_is_refused_not_executed_on_other_hosts():
    mm = _amx_gemm(1, 1, 1)
    _, _, A, B, C = _operands(1, 1, 1, np.random.default_rng(3))
    with pytest.raises(RuntimeError, match="cannot run"):
        mm(A, B, C)
    with pytest.raises(RuntimeError, match="cannot run"):
        tpp.tilerelease()()
