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


# -- any shape: padded blocked layouts or edge kernels, every block size, K step and tail -------

from hypothesis import given, strategies as st  # noqa: E402

import bench.gemm as gemm_module  # noqa: E402
import bench.mlp as mlp_module  # noqa: E402
from bench.gemm import gemm_configs, gemm_maker, k_granule  # noqa: E402
from isa.pool import get_pool  # noqa: E402


def _bf16_ok():
    try:
        tpp.brgemm(m=2, n=2, k=2, dtype="bf16")
        return True
    except Exception:
        return False


@given(M=st.integers(1, 70), N=st.integers(1, 70), K=st.integers(1, 90), bm=st.sampled_from([8, 16, 25, 32]),
       bn=st.sampled_from([16, 32]), bk=st.sampled_from([8, 16, 32, 33, 50]), kstep=st.integers(1, 4),
       edges=st.booleans(), dtype=st.sampled_from(["f32", "bf16"]), spec=st.sampled_from(["aBC", "BCa", "cBab"]),
       prefetch=st.booleans())
def test_any_shape_gemm_matches_numpy(M, N, K, bm, bn, bk, kstep, edges, dtype, spec, prefetch):
    if dtype == "bf16" and not _bf16_ok():
        dtype = "f32"
    rng = np.random.default_rng(M * 10007 + N * 101 + K)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    gemm, (A, B, C), output = gemm_maker(a, b, dtype, get_pool(), spec=spec)(bm=bm, bn=bn, bk=bk, kstep=kstep,
                                                                             edges=edges, prefetch=prefetch)
    C[...] = np.nan                      # every element the result needs must be written
    gemm(A, B, C)
    got = output()
    assert got.shape == (M, N) and not np.isnan(got).any()
    cast = tpp.dtypes.dtype(dtype)
    ref = a.astype(cast).astype(np.float32) @ b.astype(cast).astype(np.float32)
    tol = 1e-4 if dtype == "f32" else 1e-2
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * max(1.0, float(np.abs(ref).max())))


@given(M=st.integers(1, 70), N=st.integers(1, 70), K=st.integers(1, 90), bm=st.sampled_from([8, 16, 25, 32]),
       bn=st.sampled_from([16, 32]), bk=st.sampled_from([4, 8, 32, 33, 50]), kstep=st.integers(1, 4),
       edges=st.booleans(), spec=st.sampled_from(["aBC", "BCa", "cBab"]), seed=st.integers(0, 2 ** 32 - 1))
def test_any_shape_int8_gemm_is_exact(M, N, K, bm, bn, bk, kstep, edges, spec, seed):
    """u8 x s8 -> int32 (bench gemm --dtypes i8): any shape, K blocks that split VNNI quads included,
    every sum exact (the bench's own operands() and reference() against an int64 product)."""
    a, b = gemm_module.operands(np.random.default_rng(seed), M, N, K, "i8")
    a[0, :] = 255
    b[:, 0] = -128
    gemm, (A, B, C), output = gemm_maker(a, b, "i8", get_pool(), spec=spec)(bm=bm, bn=bn, bk=bk, kstep=kstep,
                                                                            edges=edges)
    C[...] = np.iinfo(np.int32).min       # no sum of these shapes reaches it: an unwritten element shows
    gemm(A, B, C)
    got, want = output(), a.astype(np.int64) @ b.astype(np.int64)
    assert got.dtype == np.int32 and got.shape == (M, N)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(gemm_module.reference(a, b, "i8"), want)


def test_gemm_configs_start_with_the_fixed_one_and_are_distinct():
    configs = gemm_configs(1000, 700, 300, "f32")
    assert configs[0]["bm"] == 64 and configs[0]["kstep"] == 8 and configs[0]["edges"] is True
    assert not all(c["edges"] for c in configs)                   # 1000 and 700 do not divide: both ways
    keys = [tuple(sorted(c.items())) for c in configs]
    assert len(set(keys)) == len(keys)


@given(M=st.integers(1, 3000), N=st.integers(1, 3000), K=st.integers(1, 3000), dtype=st.sampled_from(["f32", "bf16"]))
def test_gemm_configs_fit_the_shape(M, N, K, dtype):
    """Every shape gets block sizes that cover it with little padding: some K block computes at
    most K + K/8 (+ a granule), not up to twice K, and bf16 K blocks stay whole VNNI pairs."""
    configs = gemm_configs(M, N, K, dtype)
    granule = k_granule(dtype)
    assert min(tpp.nblocks(K, c["bk"]) * c["bk"] for c in configs) <= max(K * 9 / 8, K + granule - 1)
    assert min(tpp.nblocks(M, c["bm"]) * c["bm"] for c in configs) <= M * 9 / 8
    assert all(c["bk"] % granule == 0 for c in configs[1:])


@pytest.mark.parametrize("granule", [2, 32])
def test_gemm_configs_tune_prefetches_only_on_amx(granule, monkeypatch):
    """On AMX hosts (K blocks of whole tile rows) every bf16 GEMM and MLP configuration comes also
    with prefetch=False; elsewhere, and in f32, the knob is not searched."""
    monkeypatch.setattr(gemm_module, "on_tiles", lambda dtype: dtype != "f32" and granule == 32)
    mlp = mlp_module.mlp_configs(1024, 1024, dtype="bf16")
    assert sum(c.get("prefetch") is False for c in mlp) * 2 == (len(mlp) if granule == 32 else 0)
    bf16, f32 = gemm_configs(1024, 1024, 1024, "bf16"), gemm_configs(1024, 1024, 1024, "f32")
    assert not any("prefetch" in c for c in f32)
    quiet = [c for c in bf16 if c.get("prefetch") is False]
    if granule == 2:
        assert not quiet
    else:
        assert bf16[0].get("prefetch", True) and len(quiet) * 2 == len(bf16)
        assert [dict(c, prefetch=False) for c in bf16 if "prefetch" not in c] == quiet


def test_inexact_counts_the_peers_wrong_int8_sums(capsys):
    """The int8 peer's result against the exact sums of the same bytes (A's read as s8, as it reads them)."""
    import types
    a, b = np.array([[255, 3]], np.uint8), np.array([[2], [1]], np.int8)       # as s8: -1 * 2 + 3 * 1 = 1
    peer = lambda value: lambda: types.SimpleNamespace(numpy=lambda: np.array([[value]], np.int32))  # noqa: E731
    assert gemm_module.inexact(peer(1), a, b, "i8", "1x1x2") == 0 and capsys.readouterr().out == ""
    assert gemm_module.inexact(peer(513), a, b, "i8", "1x1x2") == 1
    assert "1x1x2: 1 of 1 int32 sums differ" in capsys.readouterr().out
    assert gemm_module.inexact(peer(0), a, b, "f32", "1x1x2") is None
