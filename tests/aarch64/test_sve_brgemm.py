"""SVE BRGEMM generators against NumPy at VL 128, 256 and 512: natively on an SVE host that runs
that length, else under qemu.

Each hypothesis example draws a few shapes (tails in m and n, k=1, count=1 included) and runs them
all in one batch (one qemu process) per vector length; C is poisoned (NaN / sentinel) where beta=0
and every element of C, including the padding between ldc and n, is checked.
"""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from isa.aarch64.emulate import AddressTable, Call, run_unicorn
from isa.aarch64.native import run_calls
from tppasm.sve.microkernel import brgemm, brgemm_ref, pack_b
from tests.aarch64.marks import needs_unicorn, vl_params

VLS = (128, 256, 512)
COMBOS = [("f32", "indexed"), ("f32", "dot"), ("bf16", "dot"), ("bf16", "mmla"), ("i8", "dot"), ("i8", "mmla"),
          ("u8", "dot"), ("u8", "mmla"), ("u8i8", "dot"), ("u8i8", "mmla")]
POISON_INT = -0x5A5A5A5A


def operand_types(dtype):
    return {"f32": ("f32", "f32"), "bf16": ("bf16", "bf16"), "i8": ("i8", "i8"), "u8": ("u8", "u8"),
            "u8i8": ("u8", "i8")}[dtype]


def random_array(rng, kind, size):
    if kind == "f32":
        return rng.standard_normal(size).astype(np.float32)
    if kind == "bf16":
        return rng.standard_normal(size).astype(ml_dtypes.bfloat16)
    lo, hi = (-128, 128) if kind == "i8" else (0, 256)
    return rng.integers(lo, hi, size).astype(np.int8 if kind == "i8" else np.uint8)


shapes = st.fixed_dictionaries({
    "m": st.sampled_from([1, 2, 3, 5, 6, 7, 9, 13]),
    "n": st.sampled_from([1, 3, 4, 8, 13, 16, 17, 33, 40]),
    "k": st.sampled_from([1, 2, 3, 5, 8, 9, 16]),
    "count": st.sampled_from([1, 2, 3]),
    "beta": st.sampled_from([0, 1]),
    "pad": st.integers(0, 3),
    "seed": st.integers(0, 2**16),
})


class Case:
    """One BRGEMM instance: operands, kernel code, the expected C."""

    def __init__(self, dtype, kernel, batch, m, n, k, count, beta, pad, seed):
        rng = np.random.default_rng(seed)
        ta, tb = operand_types(dtype)
        lda, ldc = k + pad, n + pad
        stride_a = m * lda + pad
        a = random_array(rng, ta, stride_a * count)
        bs = [random_array(rng, tb, k * n).reshape(k, n) for _ in range(count)]
        packed = [pack_b(b, dtype, kernel) for b in bs]
        stride_b = packed[0].size
        b_flat = np.concatenate([b.ravel() for b in packed])
        b_nat = np.concatenate([b.ravel() for b in bs])
        # offset/address batches visit the matrices in a shuffled order
        order = np.arange(count) if batch == "stride" else rng.permutation(count)
        c_type = np.float32 if dtype in ("f32", "bf16") else np.int32
        self.c = (rng.standard_normal(m * ldc) * 4).astype(c_type)
        if not beta:
            self.c[:] = np.nan if c_type is np.float32 else POISON_INT
        self.expected = self.c.copy()
        wide = (lambda v: v.astype(np.float32)) if dtype == "bf16" else (lambda v: v)
        brgemm_ref(wide(a), wide(b_nat), self.expected, m=m, n=n, k=k, lda=lda, ldb=n, ldc=ldc,
                   count=count, beta=beta, a_offsets=[int(i) * stride_a for i in order],
                   b_offsets=[int(i) * k * n for i in order])
        code = brgemm(m, n, k, lda, None, ldc, count, stride_a, stride_b, beta, dtype=dtype,
                      kernel=kernel, batch=batch)
        if batch == "stride":
            inputs = [a, b_flat]
        elif batch == "offset":
            offs_a = (order * stride_a * a.itemsize).astype(np.int64)
            offs_b = (order * stride_b * b_flat.itemsize).astype(np.int64)
            inputs = [a, b_flat, offs_a, offs_b]
        else:
            inputs = [AddressTable(a, order * stride_a * a.itemsize),
                      AddressTable(b_flat, order * stride_b * b_flat.itemsize)]
        self.inputs, self.batch, self.code = inputs, batch, code
        self.tol = {"f32": 1e-4, "bf16": 2e-2}.get(dtype, 0) * max(1, k * count) ** 0.5

    def call(self):
        self.out = self.c.copy()
        # offset batch: x0 = A, x1 = B, x2 = C, x3/x4 = offsets
        return Call(self.code, self.inputs, [self.out], order=(0, 1, 4, 2, 3) if self.batch == "offset" else None)

    def check(self, label):
        got, want = self.out, self.expected
        if self.tol:
            np.testing.assert_allclose(got, want, rtol=self.tol, atol=self.tol, equal_nan=True, err_msg=label)
        else:
            np.testing.assert_array_equal(got, want, err_msg=label)


def run_cases(cases, bits):
    run_calls([c.call() for c in cases], vl_bits=bits)
    for c in cases:
        c.check(f"VL {bits}")


@pytest.mark.parametrize("bits", vl_params(VLS))
@pytest.mark.parametrize("dtype,kernel", COMBOS)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(shapes, min_size=2, max_size=3))
def test_brgemm_stride(dtype, kernel, bits, drawn):
    run_cases([Case(dtype, kernel, "stride", **s) for s in drawn], bits)


@pytest.mark.parametrize("bits", vl_params(VLS))
@pytest.mark.parametrize("dtype,kernel", [("f32", "indexed"), ("bf16", "mmla"), ("i8", "dot")])
@pytest.mark.parametrize("batch", ["offset", "address"])
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(shapes, min_size=2, max_size=2))
def test_brgemm_offset_and_address_batches(dtype, kernel, batch, bits, drawn):
    run_cases([Case(dtype, kernel, batch, **s) for s in drawn], bits)


@pytest.mark.parametrize("bits", vl_params(VLS + (1024, 2048)))
def test_brgemm_edge_shapes(bits):
    """k=1, count=1, m=1, n=1, a wide n and large strides, at every VL up to 2048 bits."""
    edges = [dict(m=1, n=1, k=1, count=1, beta=0, pad=0, seed=1),
             dict(m=13, n=100, k=1, count=1, beta=1, pad=1, seed=2),
             dict(m=6, n=64, k=4, count=1, beta=0, pad=0, seed=3),
             dict(m=19, n=20, k=35, count=2, beta=1, pad=1100, seed=4)]   # strides beyond add #imm12
    run_cases([Case(dt, kn, "stride", **e) for dt, kn in [("f32", "auto"), ("i8", "mmla"), ("bf16", "dot")]
               for e in edges], bits)


def test_brgemm_rejects_bad_parameters():
    with pytest.raises(ValueError):
        brgemm(4, 4, 4, dtype="f16")
    with pytest.raises(ValueError):
        brgemm(4, 4, 4, dtype="f32", kernel="mmla")
    with pytest.raises(ValueError):
        brgemm(0, 4, 4)
    with pytest.raises(ValueError, match="lda >= k"):
        brgemm(4, 4, 8, lda=4)
    with pytest.raises(ValueError):
        brgemm(4, 4, 4, dtype="bf16", kernel="indexed")


@needs_unicorn
@pytest.mark.parametrize("bits", [128, 256, 512])
def test_fp32_brgemm_in_unicorn(bits):
    """The in-process path: fp32 (indexed fmla and k tails) under unicorn."""
    rng = np.random.default_rng(bits)
    m, n, k, count, lda, ldb, ldc = 7, 21, 5, 2, 6, 23, 22
    a = rng.standard_normal(count * m * lda).astype(np.float32)
    b = rng.standard_normal(count * k * ldb).astype(np.float32)
    c = rng.standard_normal(m * ldc).astype(np.float32)
    want = c.copy()
    brgemm_ref(a, b, want, m=m, n=n, k=k, lda=lda, ldb=ldb, ldc=ldc, count=count,
               stride_a=m * lda, stride_b=k * ldb)
    run_unicorn(brgemm(m, n, k, lda, ldb, ldc, count, m * lda, k * ldb), [a, b], [c], vl_bits=bits)
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5)
