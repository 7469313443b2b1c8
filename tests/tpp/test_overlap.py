"""Outputs that overlap other operands are refused (they gave wrong values silently), except an
element-wise kind's output that is the very array one of its inputs is (in place)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tppasm as tpp
import tppasm.kernel as tk
from tppasm.operand import IN_PLACE_KINDS, OperandError

F32 = np.float32
rng = np.random.default_rng(11)


def rand(*shape):
    return rng.standard_normal(shape).astype(F32)


def shifted(shape, by=1):
    """(x, y): two C-contiguous float32 views of ``shape`` into one buffer, y starting ``by`` elements after x."""
    size = int(np.prod(shape))
    buf = rand(size + abs(by))
    lo, hi = (0, by) if by >= 0 else (-by, 0)
    return buf[lo:lo + size].reshape(shape), buf[hi:hi + size].reshape(shape)


def _tuple_entry_kernel(kernel):
    """The same kernel behind the ctypes tuple entry (as on Pythons without PyObject_Vectorcall)."""
    previous, tk.builtin_entry = tk.builtin_entry, False
    try:
        return tk.Kernel(kernel.desc, kernel.isa)
    finally:
        tk.builtin_entry = previous


ENTRIES = [pytest.param(lambda k: k, id="builtin"), pytest.param(_tuple_entry_kernel, id="tuple")]


def _refusals():
    """(name, kernel, arrays): calls whose output overlaps another operand."""
    m, n = 4, 16
    x, out = shifted((m, n))
    yield "relu out = x shifted by one", tpp.relu(m, n), (x, out)
    out, x = shifted((m, n))
    yield "relu out = x shifted back by one", tpp.relu(m, n), (x, out)
    a, out = shifted((m, n), 3)
    yield "binary out over a", tpp.binary("add", m, n), (a, rand(m, n), out)
    b, out = shifted((m, n), 5)
    yield "binary out over b", tpp.binary("mul", m, n), (rand(m, n), b, out)
    bias = rand(m * n)
    yield "binary out over a broadcast row", tpp.binary("add", m, n, bcast_b="row"), (
        rand(m, n), bias[:n], bias.reshape(m, n))
    a, c = shifted((m, n), 2)
    yield "ternary c over a", tpp.ternary("muladd", m, n), (a, rand(m, n), c)
    x, out = shifted((m, n), n)
    yield "softmax out one row down", tpp.softmax(m, n), (x, out)
    x, out = shifted((m, n), 1)
    yield "layernorm out shifted", tpp.layernorm(m, n), (x, rand(n), rand(n), out)
    x = rand(m, n)
    yield "rmsnorm out over gamma", tpp.rmsnorm(m, n), (rand(m, n), x[1], x)
    x = rand(m, n)
    yield "layernorm out over beta", tpp.layernorm(m, n), (rand(m, n), rand(n), x[0], x)
    cos, sin = tpp.rope_tables(np.arange(m), 8)
    x, out = shifted((m, n))
    yield "rotary out = x shifted by one", tpp.rotary(m, n, 8), (x, cos, sin, out)
    x = rand(m, n)
    yield "quantize scale over x", tpp.quantize(m, n), (x, np.empty((m, n), np.uint8), x.reshape(-1)[3:3 + m])
    buf = np.zeros(m * n + 16, np.uint8)
    yield "quantize q and scale overlap", tpp.quantize(m, n), (rand(m, n), buf[:m * n].reshape(m, n),
                                                              buf[m * n - 16:m * n].view(F32))
    a = rand(16, 16)
    yield "gemm_nt c is a", tpp.gemm_nt(16, 16, 16), (a, rand(16, 16), a)
    b, c = shifted((16, 16), 16)
    yield "gemm_nt c over b", tpp.gemm_nt(16, 16, 16), (rand(16, 16), b, c)
    A, B = rand(2, 16, 16), rand(2, 16, 16)
    yield "brgemm C is a block of A", tpp.brgemm(16, 16, 16), (A, B, A[1])
    yield "brgemm C is the first block of B", tpp.brgemm(16, 16, 16), (A, B, B[0])
    yield "brgemm beta=1 C is a block of A", tpp.brgemm(16, 16, 16, beta=1), (A, B, A[1])
    A3 = rand(3, 16, 16)
    yield "brgemm C over the last block of A, count=3", tpp.brgemm(16, 16, 16), (A3, rand(3, 16, 16), A3[2])
    x = rand(8, 8)
    yield "transpose in place", tpp.transform("transpose", 8, 8), (x, x)
    yield "dequant out over row_scale", tpp.dequant(m, n), (
        np.ones((m, n), np.int32), np.zeros(n, np.int32), x.reshape(-1)[:m], np.ones(n, F32), x.reshape(m, n))


REFUSALS = list(_refusals())


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("case", range(len(REFUSALS)), ids=[name for name, *_ in REFUSALS])
def test_overlapping_outputs_are_refused(case, entry):
    name, kernel, arrays = REFUSALS[case]
    kernel = entry(kernel)
    before = [a.copy() for a in arrays]
    with pytest.raises(OperandError, match="overlaps|same array") as e:
        kernel(*arrays)
    assert "separate array" in str(e.value) and "np.empty_like" in str(e.value)
    for a, b in zip(arrays, before):                    # refused before the kernel ran
        np.testing.assert_array_equal(a, b)


def test_the_message_names_both_operands():
    A, B = rand(2, 4, 4), rand(2, 4, 4)
    with pytest.raises(OperandError, match=r"brgemm: output c overlaps operand a in memory.*c = np.empty_like\(c\)"):
        tpp.brgemm(4, 4, 4)(A, B, A[1])
    x = rand(4, 4)
    with pytest.raises(OperandError, match="gemm_nt: output c is the same array as operand a, and a gemm_nt kernel "
                                           "cannot run in place"):
        tpp.gemm_nt(4, 4, 4)(x, rand(4, 4), x)
    x, out = shifted((2, 16))
    with pytest.raises(OperandError, match="runs in place only on the very same array"):
        tpp.relu(2, 16)(x, out)


def test_an_explicit_count_is_checked_too():
    A, B = rand(3, 4, 4), rand(3, 4, 4)
    with pytest.raises(OperandError, match="overlaps operand a"):
        tpp.brgemm(4, 4, 4)(A, B, A[2], count=3)


def test_only_the_blocks_count_reads_matter():
    """The blocks past ``count`` are not read: an output there does not overlap what the kernel reads."""
    A, B = rand(3, 4, 4), rand(3, 4, 4)
    want = A[0] @ B[0] + A[1] @ B[1]
    tpp.brgemm(4, 4, 4)(A, B, A[2], count=2)
    np.testing.assert_allclose(A[2], want, rtol=1e-5, atol=1e-5)


# -- what stays allowed ---------------------------------------------------------------------------

def _allowed():
    """(name, kernel, arrays, index of the output, expected output)."""
    m, n = 3, 24
    x = rand(m, n)
    yield "relu in place", tpp.relu(m, n), (x, x), 1, np.maximum(x, 0)
    a, b = rand(m, n), rand(m, n)
    yield "binary out is a", tpp.binary("add", m, n), (a, b, a), 2, a + b
    a, b = rand(m, n), rand(m, n)
    yield "binary out is b", tpp.binary("sub", m, n), (a, b, b), 2, a - b
    a = rand(m, n)
    yield "binary a, b and out one array", tpp.binary("mul", m, n), (a, a, a), 2, a * a
    a, b, c = rand(m, n), rand(m, n), rand(m, n)
    yield "ternary c and a one array", tpp.ternary("muladd", m, n), (c, b, c), 2, c + c * b
    g, u = rand(m, n), rand(m, n)
    yield "swiglu out is gate", tpp.swiglu(m, n), (g, u, g), 2, g / (1 + np.exp(-g)) * u
    x = rand(m, n)
    e = np.exp(x - x.max(1, keepdims=True))
    yield "softmax in place", tpp.softmax(m, n), (x, x), 1, e / e.sum(1, keepdims=True)
    x, gamma, beta = rand(m, n), rand(n), rand(n)
    mu, var = x.mean(1, keepdims=True), x.var(1, keepdims=True)
    want = (x - mu) / np.sqrt(var + 1e-5) * gamma + beta
    yield "layernorm in place", tpp.layernorm(m, n), (x, gamma, beta, x), 3, want
    x, gamma = rand(m, n), rand(n)
    want = x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-6) * gamma
    yield "rmsnorm in place", tpp.rmsnorm(m, n), (x, gamma, x), 2, want
    cos, sin = tpp.rope_tables(np.arange(m), 8)
    x = rand(m, n)
    want = np.empty_like(x)
    tpp.rotary(m, n, 8).reference(x.copy(), cos, sin, want)
    yield "rotary in place", tpp.rotary(m, n, 8), (x, cos, sin, x), 3, want
    a = rand(8, 8)
    yield "gemm_nt a and b one array", tpp.gemm_nt(8, 8, 8), (a, a, np.empty((8, 8), F32)), 2, a @ a.T
    A = rand(2, 8, 8)
    C = rand(8, 8)
    yield ("brgemm beta=1 C += A B, A and B one array", tpp.brgemm(8, 8, 8, beta=1), (A, A, C), 2,
           C + A[0] @ A[0] + A[1] @ A[1])
    buf = rand(m, 2 * n)                  # interleaved: the spans intersect, the elements do not
    yield ("relu on halves of each row", tpp.relu(m, n, ldx=2 * n, ldo=2 * n), (buf[:, :n], buf[:, n:]), 1,
           np.maximum(buf[:, :n], 0))
    A, B = rand(2, 8, 16)[:, :, :8], rand(2, 8, 8)     # C in the columns of A that a k=8 block leaves unread
    yield ("brgemm C beside A's blocks", tpp.brgemm(8, 8, 8, lda=16, ldc=16), (A, B, A.base[0, :, 8:]), 2,
           A[0] @ B[0] + A[1] @ B[1])


ALLOWED = list(_allowed())


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("case", range(len(ALLOWED)), ids=[name for name, *_ in ALLOWED])
def test_in_place_calls_stay_allowed(case, entry):
    name, kernel, arrays, out, want = ALLOWED[case]
    state = [a.copy() for a in arrays]
    try:
        entry(kernel)(*arrays)
        np.testing.assert_allclose(arrays[out], want, rtol=1e-4, atol=1e-5, err_msg=name)
    finally:
        for a, s in zip(arrays, state):     # (the module-level cases run once per entry)
            a[...] = s


def test_in_place_kinds_are_the_element_wise_ones():
    assert IN_PLACE_KINDS == {"unary", "binary", "ternary", "swiglu", "softmax", "layernorm", "rmsnorm", "rotary"}


@settings(max_examples=60, deadline=None)
@given(shift_x=st.integers(0, 40), shift_out=st.integers(0, 40), ldo_pad=st.sampled_from([0, 1, 16]))
def test_relu_overlap_rule(shift_x, shift_out, ldo_pad):
    """Refused exactly when the elements the output covers meet those x covers, unless it is x itself."""
    m, n = 3, 8
    ld = n + ldo_pad
    k = tpp.relu(m, n, ldx=ld, ldo=ld)
    buf = rand(m * ld + 64)
    x = np.lib.stride_tricks.as_strided(buf[shift_x:], (m, n), (4 * ld, 4))
    out = np.lib.stride_tricks.as_strided(buf[shift_out:], (m, n), (4 * ld, 4))
    touched = lambda s: {s + i * ld + j for i in range(m) for j in range(n)}
    meets = bool(touched(shift_x) & touched(shift_out))
    want = np.maximum(x, 0)
    if meets and shift_x != shift_out:
        with pytest.raises(OperandError, match="overlaps"):
            k(x, out)
    else:
        k(x, out)
        np.testing.assert_array_equal(out, want)


@settings(max_examples=40, deadline=None)
@given(block=st.integers(0, 2), row=st.integers(0, 3), count=st.integers(1, 3), operand=st.sampled_from("ab"))
def test_brgemm_c_inside_a_batch_operand(block, row, count, operand):
    A, B = rand(3, 4, 4), rand(3, 4, 4)
    src = A if operand == "a" else B
    C = src.reshape(-1)[block * 16 + row * 4:][:16].reshape(4, 4) if block * 16 + row * 4 + 16 <= 48 else None
    if C is None:
        return
    reads = set(range(count * 16))
    writes = set(range(block * 16 + row * 4, block * 16 + row * 4 + 16))
    if reads & writes:
        with pytest.raises(OperandError, match=f"overlaps operand {operand}"):
            tpp.brgemm(4, 4, 4)(A, B, C, count=count)
    else:
        want = sum(A[i] @ B[i] for i in range(count))
        tpp.brgemm(4, 4, 4)(A, B, C, count=count)
        np.testing.assert_allclose(C, want, rtol=1e-5, atol=1e-5)


# -- torch tensors: the Python path applies the same rule -------------------------------------------

def test_torch_overlaps_are_refused():
    torch = pytest.importorskip("torch")
    buf = torch.randn(4 * 16 + 1)
    x, out = buf[:-1].view(4, 16), buf[1:].view(4, 16)
    with pytest.raises(OperandError, match=r"unary: output out overlaps operand x.*torch.empty_like\(out\)"):
        tpp.relu(4, 16)(x, out)
    A, B = torch.randn(2, 8, 8), torch.randn(2, 8, 8)
    with pytest.raises(OperandError, match="brgemm: output c overlaps operand b"):
        tpp.brgemm(8, 8, 8)(A, B, B[1])
    a = torch.randn(8, 8)
    with pytest.raises(OperandError, match="gemm_nt: output c is the same array as operand a"):
        tpp.gemm_nt(8, 8, 8)(a, torch.randn(8, 8), a)
    x = torch.randn(4, 16)
    with pytest.raises(OperandError, match="quantize: output scale overlaps operand x"):
        tpp.quantize(4, 16)(x, torch.empty(4, 16, dtype=torch.uint8), x.view(-1)[5:9])


def test_torch_in_place_stays_allowed():
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 16)
    want = torch.relu(x)
    tpp.relu(4, 16)(x, x)
    assert torch.equal(x, want)
    x, gamma, beta = torch.randn(4, 16), torch.randn(16), torch.randn(16)
    want = torch.nn.functional.layer_norm(x, (16,), gamma, beta)
    tpp.layernorm(4, 16)(x, gamma, beta, x)
    torch.testing.assert_close(x, want, rtol=1e-4, atol=1e-5)


def test_offset_and_address_batches_are_checked_in_python():
    A, B = rand(64), rand(64)
    offsets = np.array([[0, 0], [16, 16]], np.int64)
    g = tpp.brgemm(4, 4, 4, batch="offset")
    with pytest.raises(OperandError, match="output c overlaps operand a"):
        g(A, B, A[48:].reshape(4, 4), offsets)
    C = np.zeros((4, 4), F32)
    g(A, B, C, offsets)
    np.testing.assert_allclose(C, A[:16].reshape(4, 4) @ B[:16].reshape(4, 4) + A[16:32].reshape(4, 4)
                               @ B[16:32].reshape(4, 4), rtol=1e-5, atol=1e-5)
    blocks_a, blocks_b = [rand(4, 4), rand(4, 4)], [rand(4, 4), rand(4, 4)]
    g = tpp.brgemm(4, 4, 4, batch="address")
    with pytest.raises(OperandError, match="output c is the same array as operand b"):
        g(blocks_a, blocks_b, blocks_b[1])
    C = np.zeros((4, 4), F32)
    g(blocks_a, blocks_b, C)
    np.testing.assert_allclose(C, blocks_a[0] @ blocks_b[0] + blocks_a[1] @ blocks_b[1], rtol=1e-5, atol=1e-5)
