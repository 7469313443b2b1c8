"""A BRGEMM with a transcendental activation (gelu, gelu_erf, gelu_erf_fast, sigmoid, tanh) keeps
the register tile of one without: its epilogue stages the accumulators on the stack and reuses
every vector register, so no register is held back from the tile for it.

AVX2 has 16 vector registers: holding back the activation's 8 cut MiniLM's up projection
(64 x 16 x 384, bias, gelu_erf_fast) from 6 x 2 accumulators to 4 x 2, and its GELU cost from 6%
to 12% of the GEMM (Zen 4 running AVX2, `.devx`-style A/B: 11.5 against 12.3 ms for 1024 x 1536 x 384).
"""
import numpy as np
import pytest

import tppasm
from tppasm.brgemm import Brgemm
from tppasm.testing import FTZ_ATOL, SUBNORMAL_ATOL, assert_matches_reference
from tppasm.testing.compare import compare
from tppasm.x86.brgemm import Gen, target_features
from tppasm.x86.ctile import ACT_EMITTERS
from tests.support import isa_params, native, run_raw

SHAPES = {"avx2": [(64, 16, 384), (24, 48, 40), (7, 24, 33)], "avx512": [(64, 64, 384), (64, 32, 64), (9, 48, 17)]}


def _plan(isa, m, n, k, dtype, c_dtype, act):
    desc = Brgemm(m=m, n=n, k=k, lda=k, ldb=n, ldc=n, dtype=dtype, c_dtype=c_dtype, bias=True, act=act)
    return Gen(desc, isa, target_features(isa)).plan


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("act", sorted(ACT_EMITTERS))
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_staged_activation_keeps_the_tile_of_relu(isa, act, dtype):
    for m, n, k in SHAPES[isa]:
        assert _plan(isa, m, n, k, dtype, dtype, act) == _plan(isa, m, n, k, dtype, dtype, "relu"), (m, n, k)


def test_minilm_up_projection_has_six_rows_on_avx2():
    plan = _plan("avx2", 64, 16, 384, "f32", "f32", "gelu_erf_fast")
    assert (plan.rows, plan.vecs) == (6, 2)


@pytest.mark.parametrize("isa", isa_params(("avx2", "avx512")))
@pytest.mark.parametrize("act", ["gelu_erf_fast", "sigmoid"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_full_tiles_with_a_staged_activation_match_numpy(isa, act, dtype):
    """Natively through tppasm.testing; on a host without the ISA in the interpreter (its small
    shapes: 64 x 64 x 384 takes ~3 s there)."""
    rng = np.random.default_rng(3)
    for m, n, k in SHAPES[isa] if native(isa) else [s for s in SHAPES[isa] if s[2] < 384]:
        kern = tppasm.brgemm(m, n, k, dtype, c_dtype=dtype, bias=True, act=act, isa=isa)
        a = rng.standard_normal((2, m, k)).astype(np.float32)
        b = rng.standard_normal((2, k, n)).astype(np.float32) * 0.2
        if dtype == "bf16":
            bf16 = tppasm.dtypes.dtype("bf16")
            a, b = a.astype(bf16), tppasm.vnni_pack(b.astype(bf16), 2)
        bias = rng.standard_normal(n).astype(np.float32)
        if native(isa):
            assert_matches_reference(kern, a, b, bias)
            continue
        c = np.full((m, n), np.nan, np.float32).astype(a.dtype)
        want = c.copy()
        kern.reference(a, b, want, bias, count=2)
        run_raw(kern, (a, b, c, bias), (2,), isa=isa)
        floor = FTZ_ATOL if dtype == "bf16" else SUBNORMAL_ATOL
        assert compare("c", c, want, None, None, floor, None, True) == [], (kern, m, n, k)
