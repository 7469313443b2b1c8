"""Kernels under a caller's non-default MXCSR rounding mode (as ``fesetround`` sets it): the
table form gelu_erf_fast keeps its documented bound, 2^-22 max(1, |x|), in each of the four
modes. Its interval index once came from ``MAGIC + s/h`` (rounded by MXCSR.RC): round-up
picked the next interval, and for a clamped |x| one past the table, which ``vpermps`` wraps
to row 0 (gelu_erf_fast(-6) gave -3.46 on AVX-512)."""
import numpy as np
import pytest

import tppasm
from tppasm.eltwise import UNARY_OPS
from tppasm.x86.math import ACCURACY_ABS
from tests.mxcsr import RC_BITS, read, rounding
from tests.support import kernel_level, native

MODES = {"nearest": 0, "down": 1, "up": 2, "toward_zero": 3}     # MXCSR.RC, bits 13-14
BOUND = ACCURACY_ABS["gelu_erf_fast"]
LEVELS = [level for level in ("avx2", "avx512") if native(level)]


def _inputs():
    """Dense [-8, 8], the table's ends (6.0: AVX-512's limit, 6.4: AVX2's) and clamped |x|."""
    ends = [-6.0, -6.4, 6.0, 6.4, -5.99, 5.99, -6.39, 6.39, -7.0, 7.0, -20.0, 20.0, -1e30, 1e30]
    return np.concatenate([np.linspace(-8.0, 8.0, 4096, dtype=np.float32), np.float32(ends)]).reshape(1, -1)


def _assert_within_bound(got, x, what):
    x64 = x.astype(np.float64)
    err = np.abs(got - UNARY_OPS["gelu_erf"](x64)) / np.maximum(1.0, np.abs(x64))
    worst = int(np.argmax(err))
    assert err.flat[worst] <= BOUND, (f"{what}: error {err.flat[worst]:.3g} x max(1, |x|) at "
                                      f"x={x.flat[worst]!r} (got {got.flat[worst]!r}), bound {BOUND:.3g}")


@pytest.mark.skipif(not LEVELS, reason="the host runs neither avx2 nor avx512 code")
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("mode", MODES)
def test_gelu_erf_fast_unary_in_every_rounding_mode(level, mode):
    x = _inputs()
    with kernel_level(level):
        k = tppasm.unary("gelu_erf_fast", 1, x.shape[1])
    out = np.full_like(x, np.nan)
    with rounding(MODES[mode]):
        k(x, out)
    _assert_within_bound(out, x, f"unary gelu_erf_fast, {level}, rounding {mode}")


@pytest.mark.skipif(not LEVELS, reason="the host runs neither avx2 nor avx512 code")
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("mode", MODES)
def test_gelu_erf_fast_brgemm_epilogue_in_every_rounding_mode(level, mode):
    """The same emitter in a BRGEMM epilogue (its tables kept in registers there)."""
    x = _inputs()[:, :1024]
    with kernel_level(level):
        g = tppasm.brgemm(1, x.shape[1], 1, act="gelu_erf_fast")
    c = np.full((1, x.shape[1]), np.nan, np.float32)
    with rounding(MODES[mode]):
        g(np.ones((1, 1, 1), np.float32), x.reshape(1, 1, -1).copy(), c)
    _assert_within_bound(c, x, f"BRGEMM act=gelu_erf_fast, {level}, rounding {mode}")


@pytest.mark.skipif(not LEVELS, reason="the host runs neither avx2 nor avx512 code")
def test_rounding_restores_the_callers_mxcsr():
    before = read()
    with pytest.raises(ZeroDivisionError), rounding(MODES["up"]):
        assert read() & RC_BITS == MODES["up"] << 13
        1 / 0
    assert read() == before
