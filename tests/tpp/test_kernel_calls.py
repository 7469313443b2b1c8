"""The public call path refuses every malformed argument with an explanation, never a crash."""
import sys
import threading

import numpy as np
import pytest

import tppasm as tpp
import tppasm.kernel as tk
from tppasm.brgemm import Brgemm
from tppasm.operand import OperandError
from tppasm.x86.entry import Vectorcall

G = tpp.brgemm(m=4, n=4, k=4)
A = np.ones((2, 4, 4), np.float32)
B = np.ones((2, 4, 4), np.float32)


@pytest.mark.parametrize("count", [True, 0, -1, 2**40, 2.0, "2"])
def test_bad_counts_are_refused(count):
    C = np.zeros((4, 4), np.float32)
    with pytest.raises(OperandError, match="count"):
        G(A, B, C, count=count)


def test_numpy_integer_counts_are_accepted():
    C = np.zeros((4, 4), np.float32)
    G(A, B, C, count=np.int64(2))
    assert (C == 8).all()


@pytest.mark.parametrize("args, message", [
    (([[1.0]], B, np.zeros((4, 4), np.float32)), "must be a NumPy array"),
    ((np.float32(1), B, np.zeros((4, 4), np.float32)), "must be a NumPy array"),
    ((A, B, np.asfortranarray(np.zeros((4, 4), np.float32))), "strides"),
    ((A, B, np.zeros((4, 4), np.float32)[::-1]), "strides"),
    ((A, B, np.zeros((4, 4), np.float64)), "dtype"),
    ((A[:, :3], B, np.zeros((4, 4), np.float32)), "shape"),
])
def test_bad_arrays_are_explained(args, message):
    with pytest.raises(OperandError, match=message):
        G(*args, count=1)


def test_read_only_output_and_wrong_arity():
    ro = np.zeros((4, 4), np.float32)
    ro.setflags(write=False)
    with pytest.raises(OperandError, match="read-only"):
        G(A, B, ro, count=1)
    with pytest.raises(TypeError, match="takes 3 arrays"):
        G(A)


# -- the two native entries: a CPython builtin (3.11+) and the ctypes tuple entry ---------------

def _tuple_entry_kernel(desc):
    """A kernel built with the ctypes entry, as on Pythons without ``PyObject_Vectorcall``."""
    previous, tk.builtin_entry = tk.builtin_entry, False
    try:
        return tk.Kernel(desc, G.isa)
    finally:
        tk.builtin_entry = previous


@pytest.mark.skipif(not Vectorcall.available(), reason="this CPython does not export PyObject_Vectorcall")
def test_kernels_are_entered_as_builtins():
    assert type(type(G).__dict__["__call__"]).__name__ == "builtin_function_or_method"
    assert isinstance(G, tk.Kernel)


@pytest.mark.parametrize("make", [lambda d: tk.get_kernel(d), _tuple_entry_kernel], ids=["builtin", "tuple"])
def test_both_entries_compute_and_explain(make):
    g = make(Brgemm(m=5, n=3, k=7))
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((3, 5, 7), np.float32), rng.standard_normal((3, 7, 3), np.float32)
    for count, call in ((3, lambda c: g(a, b, c)), (1, lambda c: g(a, b, c, count=1)),
                        (2, lambda c: g(a, b, c, count=np.int32(2)))):
        c = np.full((5, 3), np.nan, np.float32)
        call(c)
        np.testing.assert_allclose(c, np.einsum("bik,bkj->ij", a[:count], b[:count]), rtol=1e-5, atol=1e-5)
    with pytest.raises(OperandError, match="count"):
        g(a, b, np.zeros((5, 3), np.float32), count=4)
    with pytest.raises(TypeError, match="unexpected keyword"):
        g(a, b, np.zeros((5, 3), np.float32), cnt=1)
    with pytest.raises(TypeError, match="takes 3 arrays"):
        g(a, b, np.zeros((5, 3), np.float32), 1)


@pytest.mark.parametrize("make", [lambda d: tk.get_kernel(d), _tuple_entry_kernel], ids=["builtin", "tuple"])
def test_one_block_views_enter_natively(make, monkeypatch):
    """For one block the batch stride is free (``a[None]`` has stride 0): such calls stay native;
    for more blocks a batch stride the kernel was not built with is explained."""
    g = make(Brgemm(m=4, n=6, k=5))
    slow = []
    python_path = tk.Kernel._slow_call
    monkeypatch.setattr(tk.Kernel, "_slow_call", lambda self, *args: slow.append(1) or python_path(self, *args))
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((4, 5), np.float32), rng.standard_normal((5, 6), np.float32)
    spaced = rng.standard_normal((2, 8, 5), np.float32)[:, :4]        # batch stride 40 elements, not 20
    bb = rng.standard_normal((2, 5, 6), np.float32)
    for x, y, count in ((a[None], b[None], None), (a[None], b[None], 1), (spaced, bb, 1)):
        c = np.full((4, 6), np.nan, np.float32)
        g(x, y, c) if count is None else g(x, y, c, count=count)
        np.testing.assert_allclose(c, x[0] @ y[0], rtol=1e-5, atol=1e-5)
    assert slow == [] or not tk.NATIVE_CHECKS
    with pytest.raises(OperandError, match="stride_a=40"):
        g(spaced, bb, np.zeros((4, 6), np.float32))


def test_builtin_entry_keeps_reference_counts():
    c = np.zeros((4, 4), np.float32)
    before = sys.getrefcount(None), sys.getrefcount(A), sys.getrefcount(c)
    for _ in range(1000):
        G(A, B, c, count=2)
        G(A, B, c)
    assert (sys.getrefcount(None), sys.getrefcount(A), sys.getrefcount(c)) == before


def test_long_calls_release_the_interpreter_lock():
    """A kernel above the GIL-release size runs in two Python threads at once, correctly."""
    g = tpp.brgemm(m=128, n=128, k=128)
    assert g.desc.work() >= tk._GIL_RELEASE_WORK
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((2, 128, 128), np.float32), rng.standard_normal((2, 128, 128), np.float32)
    want = np.einsum("bik,bkj->ij", a, b)
    outs = [np.full((128, 128), np.nan, np.float32) for _ in range(2)]

    def work(c):
        for _ in range(20):
            g(a, b, c, count=2)
    threads = [threading.Thread(target=work, args=(c,)) for c in outs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in outs:
        np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-3)


# -- operands a kernel cannot use as given -----------------------------------------------------

def test_block_spmm_takes_torch_tensors():
    torch = pytest.importorskip("torch")
    spmm = tpp.block_spmm(2, 2, 4, 2)
    rowptr, colidx = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)
    values, b = torch.ones(1, 2, 2), torch.arange(16, dtype=torch.float32).reshape(4, 4)
    c = torch.full((2, 4), float("nan"))
    spmm(rowptr, colidx, values, b, c)                     # count inferred: the blocks colidx holds
    assert torch.equal(c, (values[0] @ b[2:]).float())     # the result lands in the tensor
    with pytest.raises(OperandError, match=r"dtype int64, expected int32.*\.to\(torch\.int32\)"):
        spmm(rowptr.long(), colidx, values, b, c, count=1)
    with pytest.raises(OperandError, match=r"x\.contiguous\(\)"):
        spmm(rowptr, colidx, values, b.t(), c, count=1)
    with pytest.raises(ValueError, match="colidx\\[0\\] = 5"):
        spmm(rowptr, torch.tensor([5], dtype=torch.int32), values, b, c, count=1)
    with pytest.raises(OperandError, match="requires grad"):
        spmm(rowptr, colidx, values, b, torch.zeros(2, 4, requires_grad=True), count=1)
    for call in (spmm, spmm.reference):         # count is keyword-only, as every kernel's
        with pytest.raises(TypeError, match="positional"):
            call(rowptr, colidx, values, b, c, 1)


def test_offset_batches_explain_tensor_refusals_in_torch_terms():
    torch = pytest.importorskip("torch")
    with pytest.raises(OperandError, match=r"dtype int32, expected int64.*\.to\(torch\.int64\)"):
        tpp.brgemm(2, 3, 4, batch="offset")(torch.ones(8), torch.ones(12), torch.empty(2, 3),
                                             torch.zeros(1, 2, dtype=torch.int32))


@pytest.mark.parametrize("position", [0, 1])
def test_masked_arrays_are_refused_not_read_without_their_mask(position):
    x = np.ones((2, 4), np.float32)
    arrays = [x, np.empty_like(x)]
    arrays[position] = np.ma.masked_array(arrays[position], mask=True)
    with pytest.raises(OperandError, match="masked array.*" + ("x.filled" if position == 0 else "x.data")):
        tpp.relu(2, 4)(*arrays)
    with pytest.raises(OperandError, match="masked array"):
        G(np.ma.masked_array(A), B, np.zeros((4, 4), np.float32))


class ClaimsWritable(np.ndarray):
    @property
    def flags(self):
        return np.ones(1).flags


class ClaimsDense(np.ndarray):
    @property
    def strides(self):
        return (self.shape[1] * self.itemsize, self.itemsize)


@pytest.mark.parametrize("lie, ldo, words", [(ClaimsWritable, 16, "read-only"), (ClaimsDense, 0, r"strides \(16, 1\)")])
def test_subclasses_are_checked_as_numpy_sees_them_not_as_they_say(lie, ldo, words):
    """A subclass's properties may say anything: the memory is described by NumPy's own fields."""
    big = np.zeros((2, 16), np.float32)
    big.setflags(write=lie is not ClaimsWritable)
    out = big[:, :4].view(lie)
    with pytest.raises(OperandError, match=words):
        tpp.relu(2, 4, ldo=ldo)(np.ones((2, 4), np.float32), out)
    assert not big.any()                                   # nothing written, inside or outside the view
    fine = np.zeros((2, 4), np.float32).view(ClaimsDense)  # where they tell the truth, they are operands
    tpp.relu(2, 4)(np.ones((2, 4), np.float32), fine)
    assert np.asarray(fine).sum() == 8


def test_offset_batches_check_subclasses_as_numpy_sees_them():
    c = np.zeros((2, 4), np.float32)
    c.setflags(write=False)
    with pytest.raises(OperandError, match="read-only"):
        tpp.brgemm(2, 4, 4, batch="offset")(np.ones(8, np.float32), np.ones(16, np.float32), c.view(ClaimsWritable),
                                            np.zeros((1, 2), np.int64))
    assert not c.any()


def test_none_for_the_outputs_allocates_them_as_leaving_them_out_does():
    """The signature says ``out=None``: an explicit None is the allocating call (it was refused)."""
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 3
    assert np.array_equal(tpp.relu(2, 4)(x, None), np.maximum(x, 0))
    assert np.array_equal(tpp.binary("add", 2, 4)(x, x, None), 2 * x)
    g = tpp.brgemm(2, 3, 4)
    a, b = np.ones((2, 2, 4), np.float32), np.ones((2, 4, 3), np.float32)
    assert (g(a, b, None) == 8).all() and (g(a, b, None, count=1) == 4).all()
    with pytest.raises(OperandError, match="operand x must be .* not NoneType"):
        tpp.relu(2, 4)(None, None)                       # an input None is still refused


@pytest.mark.parametrize("make, inputs", [
    (lambda: tpp.relu(2, 4, ldo=16), (np.ones((2, 4), np.float32),)),
    (lambda: tpp.gemm_nt(2, 3, 4, ldc=5), (np.ones((2, 4), np.float32), np.ones((3, 4), np.float32))),
    (lambda: tpp.quantize(2, 4, ldo=8), (np.ones((2, 4), np.float32),)),
])
def test_allocated_outputs_have_the_row_stride_the_kernel_was_built_for(make, inputs):
    k = make()
    made = k(*inputs)
    made = made if isinstance(made, tuple) else (made,)
    for spec, out in zip([s for s in k.operands if s.name in k.allocated_names], made):
        assert out.shape == spec.shape and out.ctypes.data % 64 == 0
        assert tuple(st // out.itemsize for st in out.strides) == spec.strides
    want = [np.empty(s.shape, s.np_dtype) for s in k.operands if s.name in k.allocated_names]
    k.reference(*inputs, *want)
    assert all((got == w).all() for got, w in zip(made, want))


@pytest.mark.skipif(tk.host().isa == "amx", reason="the host runs AMX")
def test_code_for_a_level_the_host_lacks_raises_isa_unavailable():
    x = np.ones((2, 4), np.float32)
    for call, words in ((lambda: tpp.relu(2, 4, isa="amx")(x), "leave isa= unset"),
                        (lambda: tpp.tilerelease()(), "only where")):
        with pytest.raises(tpp.ISAUnavailableError, match="amx code cannot run on this host.*" + words) as e:
            call()
        assert isinstance(e.value, RuntimeError) and isinstance(e.value, ValueError)


def test_the_kernel_class_reads_isa_and_desc_as_get_kernel_does():
    from tppasm.eltwise import Unary
    assert tk.Kernel(Unary("relu", 2, 4), None).isa == tk.host().isa
    assert tk.Kernel(Unary("relu", 2, 4), " AVX2").isa == "avx2"
    with pytest.raises(TypeError, match=r"Kernel\(desc\): desc='relu' is not a TPP descriptor"):
        tk.Kernel("relu", "avx512")
    with pytest.raises(ValueError, match="isa='x86'.*or None for the host's level"):
        tk.Kernel(Unary("relu", 2, 4), "x86")
