"""Torch tensors as kernel and loop-kernel operands: zero-copy (results land in the caller's
tensor, autograd is told), every refusal explained in torch's terms."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e .[test] pins torch==2.13.0)")

import tppasm as tpp  # noqa: E402
from loops import Loop, kernel  # noqa: E402
from tppasm.dtypes import dtype as D  # noqa: E402
from tppasm.operand import OperandError, as_ndarray  # noqa: E402
from tppasm.torch import linear  # noqa: E402

TORCH = {"f32": torch.float32, "bf16": torch.bfloat16}


def padded(rows, cols, ld, dt, fill=float("nan")):
    """A (rows, cols) view of a NaN-filled (rows, ld) tensor: a leading dimension past cols."""
    return torch.full((rows, ld), fill, dtype=TORCH[dt])[:, :cols]


@given(m=st.integers(1, 40), n=st.integers(1, 40), pad_in=st.integers(0, 5), pad_out=st.integers(0, 5),
       dt=st.sampled_from(["f32", "bf16"]), op=st.sampled_from(["relu", "add"]), seed=st.integers(0, 99))
def test_eltwise_kernels_on_tensors(m, n, pad_in, pad_out, dt, op, seed):
    g = torch.Generator().manual_seed(seed)
    a = padded(m, n, n + pad_in, dt)
    a.copy_(torch.randn(m, n, generator=g))
    b = torch.randn(m, n, generator=g).to(TORCH[dt])
    out = padded(m, n, n + pad_out, dt)
    base, version = out.data_ptr(), out._version
    if op == "relu":
        tpp.relu(m, n, ldx=n + pad_in, ldo=n + pad_out, dtype=dt)(a, out)
        want = torch.relu(a)
    else:
        tpp.binary("add", m, n, lda=n + pad_in, ldo=n + pad_out, dtype=dt)(a, b, out)
        want = (a.float() + b.float()).to(TORCH[dt])
    assert out.data_ptr() == base and out._version > version          # written in place, autograd told
    assert torch.equal(out, want)
    assert out.untyped_storage().nbytes() == m * (n + pad_out) * out.element_size()
    rest = torch.as_strided(out, (m, pad_out), (n + pad_out, 1), out.storage_offset() + n)
    assert torch.isnan(rest).all()                                      # the padding is never written


@given(m=st.integers(1, 12), n=st.integers(1, 12), k=st.integers(1, 12), count=st.integers(1, 3),
       dt=st.sampled_from(["f32", "bf16"]))
def test_brgemm_on_tensors(m, n, k, count, dt):
    a = torch.randn(count, m, k).to(TORCH[dt])
    b = torch.randn(count, k, n).to(TORCH[dt])
    bk = b if dt == "f32" else torch.from_numpy(tpp.vnni_pack(b.float().numpy(), 2).astype(np.float32)).bfloat16()
    c = torch.full((m, n), float("nan"))
    tpp.brgemm(m=m, n=n, k=k, dtype=dt)(a, bk, c, count=count)
    want = torch.einsum("bik,bkj->ij", a.double(), b.double())
    torch.testing.assert_close(c.double(), want, rtol=1e-5 if dt == "f32" else 1e-2, atol=1e-4 if dt == "f32" else 1e-2)


@pytest.mark.parametrize("batch", ["offset", "address"])
def test_offset_and_address_batches_take_tensors(batch):
    a, b = torch.randn(3, 4, 5), torch.randn(3, 5, 6)
    c, bias = torch.full((4, 6), float("nan")), torch.randn(6)
    g = tpp.brgemm(m=4, n=6, k=5, batch=batch, bias=True)
    if batch == "offset":
        offsets = torch.tensor([[0, 0], [40, 60], [20, 30]], dtype=torch.int64)     # blocks 0, 2, 1
        g(a, b, c, offsets, bias, count=3)
    else:
        g(list(a), list(b), c, bias, count=3)
    torch.testing.assert_close(c, torch.einsum("bik,bkj->ij", a, b) + bias, rtol=1e-5, atol=1e-5)
    assert c._version > 0
    with pytest.raises(OperandError, match="operand c is a tensor that requires grad"):
        g(list(a) if batch == "address" else a, list(b) if batch == "address" else b,
          torch.empty(4, 6, requires_grad=True), *([offsets] if batch == "offset" else []), bias, count=3)


def test_bf16_tensor_views_share_memory():
    t = torch.zeros(2, 3, dtype=torch.bfloat16)
    v = as_ndarray(t)
    assert v.dtype == D("bf16") and v.ctypes.data == t.data_ptr()
    v[1, 2] = 1.5
    assert t[1, 2].item() == 1.5


RELU = tpp.relu(4, 8)


@pytest.mark.parametrize("make, message", [
    (lambda: (torch.randn(8, 4).t(), torch.empty(4, 8)), r"x.contiguous\(\)"),
    (lambda: (torch.randn(4, 8, dtype=torch.float64), torch.empty(4, 8)), r"convert with .to\(torch.float32\)"),
    (lambda: (torch.randn(4, 8, dtype=torch.bfloat16), torch.empty(4, 8)), r"or build the kernel with dtype='bf16'"),
    (lambda: (torch.randn(4, 8), torch.empty(4, 8, dtype=torch.float64)), "pass a float32 output"),
    (lambda: (torch.randn(4, 8), torch.empty(4, 16)[:, ::2]), "pass a contiguous output and copy it"),
    (lambda: (torch.randn(4, 8), torch.empty(8, 4).t()), "pass a contiguous output"),
    (lambda: (torch.randn(4, 8), torch.empty(4, 7)), r"expected \(4, 8\)"),
    (lambda: (torch.randn(4, 8, requires_grad=True), torch.empty(4, 8)), r"requires grad.*x.detach\(\)"),
    (lambda: (torch.randn(4, 8), torch.empty(4, 8, requires_grad=True)), r"writes it in place.*detach\(\)"),
    (lambda: (torch.randn(4, 8, device="meta"), torch.empty(4, 8)), r"on meta; .*pass x.cpu\(\)"),
    (lambda: (torch.randn(4, 8), torch.empty(4, 8, device="meta")), "allocate it there"),
    (lambda: (torch.randn(4, 8).to_sparse(), torch.empty(4, 8)), r"sparse_coo tensor.*to_dense\(\)"),
    (lambda: (torch.randn(4, 8), [[0.0] * 8] * 4), r"must be a NumPy array, a torch tensor.*tppasm.empty"),
    (lambda: (torch.zeros(4, 8, dtype=torch.complex64).conj(), torch.empty(4, 8)), "conjugate bit"),
    (lambda: (torch._neg_view(torch.ones(4, 8)), torch.empty(4, 8)), r"negative bit.*x\.resolve_neg\(\)"),
    (lambda: (torch.ones(4, 8), torch._neg_view(torch.empty(4, 8))), "negative bit.*would not receive the result"),
])
def test_refusals_say_what_to_pass(make, message):
    x, out = make()
    with pytest.raises(OperandError, match=message):
        RELU(x, out)


def test_reading_a_tensor_that_requires_grad_is_fine_without_grad_mode():
    w = torch.randn(4, 8, requires_grad=True)
    out = torch.empty(4, 8)
    with torch.no_grad():
        RELU(w, out)
    assert torch.equal(out, torch.relu(w.detach()))
    with torch.inference_mode():
        RELU(w, out)


def test_inference_tensors_are_written_only_in_inference_mode():
    with torch.inference_mode():
        out = torch.empty(4, 8)
        RELU(torch.ones(4, 8), out)
    with pytest.raises(OperandError, match="inference tensor"):
        RELU(torch.ones(4, 8), out)


def test_autograd_sees_a_kernel_overwrite_a_saved_tensor():
    w = torch.ones(4, 8, requires_grad=True)
    c = torch.ones(4, 8)
    y = (w * c).sum()                     # saves c for the backward
    RELU(-torch.ones(4, 8), c)            # overwrites c behind autograd's back...
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()                      # ...which it notices, as for torch's own in-place ops


RELU_BLOCK = tpp.relu(4, 8, ldx=16, ldo=16)


@kernel("Ab", Loop(0, 4), Loop(0, 2))
def relu_blocks(i, j, X, Y):
    RELU_BLOCK(X[i, :, 8 * j:8 * j + 8], Y[i, :, 8 * j:8 * j + 8])


def test_loop_kernels_take_tensors():
    x, y = torch.randn(4, 4, 16), torch.full((4, 4, 16), float("nan"))
    version = y._version
    relu_blocks(x, y)
    assert torch.equal(y, torch.relu(x)) and y._version > version
    y.fill_(float("nan"))
    relu_blocks(x.numpy(), y)             # a mix of arrays and tensors
    assert torch.equal(y, torch.relu(x))
    y.fill_(float("nan"))
    relu_blocks.python(x, y)
    assert torch.equal(y, torch.relu(x))
    assert "relu" in relu_blocks.explain(x, y)


def test_loop_kernels_refuse_what_they_cannot_write():
    x = torch.randn(4, 4, 16)
    with pytest.raises(OperandError, match=r"relu_blocks: operand Y is a tensor that requires grad"):
        relu_blocks(x, torch.empty(4, 4, 16, requires_grad=True))
    with torch.no_grad(), pytest.raises(OperandError, match=r"operand Y .* writes it in place"):
        relu_blocks(x, torch.empty(4, 4, 16, requires_grad=True))
    with pytest.raises(TypeError, match="NumPy arrays .*, torch tensors and objects with __dlpack__; got list"):
        relu_blocks([1.0], torch.empty(4, 4, 16))
    with torch.no_grad():
        w = torch.randn(4, 4, 16, requires_grad=True)
        relu_blocks(w, torch.empty(4, 4, 16))     # reading one is fine without grad mode


@pytest.mark.parametrize("dtype, fix", [(torch.float32, r"pass bias\.float\(\)$"),
                                        (torch.bfloat16, r"pass bias\.bfloat16\(\) or bias\.float\(\)$")])
def test_a_float64_bias_is_told_the_dtype_that_fits_x(dtype, fix):
    x, w = torch.ones(2, 3, dtype=dtype), torch.ones(4, 3, dtype=dtype)
    with pytest.raises(TypeError, match=fix):
        linear(x, w, torch.ones(4, dtype=torch.float64))
