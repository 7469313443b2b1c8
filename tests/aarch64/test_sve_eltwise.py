"""SVE element-wise generators against NumPy: qemu at VL 128/256/512 (all ops), unicorn in-process
for the fp32 ops. Outputs (with padding columns between n and ld_out) are poisoned and every
element is checked; padding must keep its poison."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from isa.aarch64.emulate import Call, run_qemu_calls, run_unicorn
from tppasm.sve.eltwise import BINARY, eltwise, eltwise_ref
from tests.aarch64.marks import needs_qemu, needs_unicorn

VLS = (128, 256, 512)
OPS = [("copy", "none"), ("relu", "none"), ("exp", "none"), ("cvt_bf16", "none"), ("add", "none"),
       ("mul", "row"), ("sub", "col"), ("max", "scalar"), ("add", "scalar"), ("mul", "col")]

shapes = st.fixed_dictionaries({
    "m": st.integers(1, 5), "n": st.sampled_from([1, 3, 4, 7, 8, 15, 16, 17, 31, 64, 70]),
    "pad_in": st.integers(0, 3), "pad_out": st.integers(0, 3), "seed": st.integers(0, 2**16)})


class Case:
    def __init__(self, op, bcast, m, n, pad_in, pad_out, seed):
        rng = np.random.default_rng(seed)
        ld_in, ld_out = n + pad_in, n + pad_out
        scale = 30 if op == "exp" else 4
        x0 = (rng.standard_normal((m, ld_in)) * scale).astype(np.float32)
        if n >= 4:
            x0[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
        in1_shape = {"none": (m, ld_in), "row": (n,), "col": (m,), "scalar": (1,)}[bcast]
        x1 = rng.standard_normal(in1_shape).astype(np.float32)
        out_t = ml_dtypes.bfloat16 if op == "cvt_bf16" else np.float32
        self.out = np.full((m, ld_out), np.nan, out_t)
        self.expected = self.out.copy()
        y = {"none": lambda: x1[:, :n], "row": lambda: np.broadcast_to(x1, (m, n)),
             "col": lambda: np.broadcast_to(x1[:, None], (m, n)),
             "scalar": lambda: np.broadcast_to(x1, (m, n))}[bcast]()
        self.expected[:, :n] = eltwise_ref(op, x0[:, :n], y if op in BINARY else None)
        self.inputs = [x0] + ([x1] if op in BINARY else [])
        self.code = eltwise(op, m, n, ld_in, ld_out, bcast=bcast, ld_in1=ld_in if bcast == "none" else None)
        self.op = op

    def check(self, got, label):
        got, want = got.astype(np.float32), self.expected.astype(np.float32)
        if self.op == "exp":
            np.testing.assert_allclose(got, want, rtol=4e-7, atol=1e-37, equal_nan=True, err_msg=label)
        else:
            np.testing.assert_array_equal(got, want, err_msg=label)


@needs_qemu
@pytest.mark.parametrize("op,bcast", OPS)
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(shapes, min_size=2, max_size=3))
def test_eltwise_qemu(op, bcast, drawn):
    cases = [Case(op, bcast, **s) for s in drawn]
    for bits in VLS:
        calls = [Call(c.code, c.inputs, [c.out.copy()]) for c in cases]
        run_qemu_calls(calls, vl_bits=bits)
        for c, call in zip(cases, calls):
            c.check(call.outputs[0], f"VL {bits}")


@needs_unicorn
@pytest.mark.parametrize("op,bcast", [o for o in OPS if o[0] != "cvt_bf16"])
@pytest.mark.parametrize("bits", VLS)
def test_eltwise_unicorn(op, bcast, bits):
    c = Case(op, bcast, m=3, n=37, pad_in=1, pad_out=2, seed=bits)
    out = c.out.copy()
    run_unicorn(c.code, c.inputs, [out], vl_bits=bits)
    c.check(out, f"VL {bits}")


def test_eltwise_rejects_bad_parameters():
    with pytest.raises(ValueError):
        eltwise("tanh", 2, 2)
    with pytest.raises(ValueError):
        eltwise("relu", 2, 2, bcast="row")
