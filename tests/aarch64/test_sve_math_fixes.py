"""SVE reciprocal and rsqrt of subnormal inputs (the Newton steps kept the estimate's infinity
with the wrong sign, and y*y overflowed to inf), and the test helper ``close`` on infinities."""
import numpy as np
import pytest

from tppasm.eltwise import Binary, Unary
from tppasm.kernel import Kernel
from tppasm.sve.math import ACCURACY
from tests.aarch64.marks import vl_params
from tests.aarch64.sve_cases import close
from tests.support import ulp_errors

TINY = np.float32([1e-45, 1e-42, 1e-40, -1e-40, -1e-45, 2.8e-39, 3e-39, 1e-38, 1.1754942e-38, 2e-38, 1e-37,
                   0.0, -0.0, np.inf, -np.inf, np.nan, 3.4028235e38, -3.4028235e38, 2.0, -1.0])


def _run(desc, inputs, bits):
    from isa.aarch64.emulate import Call
    from isa.aarch64.native import run_calls
    call = Call(Kernel(desc, "sve").raw.code, inputs, [np.full(inputs[0].shape, 7.0, np.float32)])
    run_calls([call], vl_bits=bits)
    return call.outputs[0]


def _reference(desc, inputs):
    want = np.empty(inputs[0].shape, np.float32)
    with np.errstate(all="ignore"):
        desc.reference(*inputs, want)
    return want[0]


def _assert_matches(op, x, got, want):
    """Same NaNs, infinities and zero signs as the reference; finite lanes within the op's ulps."""
    assert np.array_equal(np.isnan(got), np.isnan(want)), (x, got, want)
    inf = np.isinf(want)
    np.testing.assert_array_equal(got[inf], want[inf], err_msg=f"{op}: infinities of {x[inf]}")
    zero = want == 0
    np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(want[zero]))
    finite = np.isfinite(want)
    assert ulp_errors(op, x[finite], got[finite]).max() <= ACCURACY[op], (x[finite], got[finite])


@pytest.mark.parametrize("bits", vl_params((128, 512)))
@pytest.mark.parametrize("op", ["reciprocal", "rsqrt"])
def test_subnormal_and_special_inputs_match_the_reference(op, bits):
    x = TINY[None]
    _assert_matches(op, TINY, _run(Unary(op, 1, TINY.size), [x], bits)[0], _reference(Unary(op, 1, TINY.size), [x]))


@pytest.mark.parametrize("bits", vl_params((256,)))
@pytest.mark.parametrize("op", ["reciprocal", "rsqrt"])
def test_binary_post_of_subnormal_products_matches_the_reference(op, bits):
    d = Binary("mul", 1, TINY.size, post=op)
    ins = [TINY[None], np.ones_like(TINY)[None]]
    _assert_matches(op, TINY, _run(d, ins, bits)[0], _reference(d, ins))


def test_close_matches_an_infinity_only_with_the_same_infinity():
    got = np.float32([-np.inf, 5.0, np.inf, 1.0, np.inf, np.nan, 1.0001])
    want = np.float32([np.inf, np.inf, -np.inf, -np.inf, np.inf, np.nan, 1.0])
    assert close(got, want, 1e-3, 0.0).tolist() == [0, 1, 2, 3]
    assert close(np.float32([np.nan]), np.float32([np.inf]), 1.0, 1.0).tolist() == [0]
