"""Unusual array objects and overlaps are taken, or refused, alike everywhere: loop kernels take
ndarray subclasses as TPP kernels do, a kernel's NumPy reference refuses the overlaps and broadcast
outputs its call refuses, tppasm.torch.linear takes lazily negated tensors as torch's linear does,
and refusals are worded in the caller's terms."""
import numpy as np
import pytest
import torch

import tppasm as tpp
import tppasm.torch as tt
from loops import Loop, kernel
from tppasm.operand import OperandError
from tppasm.rotary import rope_tables

relu = tpp.relu(4, 8)


@kernel("A", Loop(0, 2))
def relu_blocks(i, X, Y):
    relu(X[i], Y[i])


class Tagged(np.ndarray):
    """A subclass as users write them (units, metadata)."""


@pytest.mark.parametrize("where", ["input", "output"])
def test_loop_kernels_take_ndarray_subclasses(tmp_path, where):
    X = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 4, 8)
    Y = np.full_like(X, np.nan)
    if where == "input":
        M = np.memmap(tmp_path / "x.bin", np.float32, "w+", shape=X.shape)
        M[...] = X
        relu_blocks(M, Y)
        del M
    else:
        relu_blocks(X, Y.view(Tagged))
    assert (Y == np.maximum(X, 0)).all()


def test_loop_kernels_refuse_masked_arrays_naming_the_fix():
    X = np.ma.masked_less(np.ones((2, 4, 8), np.float32), 0)
    with pytest.raises((TypeError, ValueError), match="mask"):
        relu_blocks(X, np.empty((2, 4, 8), np.float32))


def test_the_reference_refuses_the_overlaps_the_call_refuses():
    k = tpp.unary("exp", 2, 3)
    buf = np.zeros(7, np.float32)
    x, out = buf[:6].reshape(2, 3), buf[1:].reshape(2, 3)
    for run in (k, k.reference):
        with pytest.raises(OperandError, match="overlaps operand x"):
            run(x, out)
    same = np.zeros((2, 3), np.float32)
    k.reference(same, same)                                     # in place: the very same array, fine
    assert (same == 1).all()


def test_the_reference_refuses_a_broadcast_output():
    out = np.lib.stride_tricks.as_strided(np.zeros(3, np.float32), (2, 3), (0, 4))
    with pytest.raises(OperandError, match="stride 0 on axis 0"):
        tpp.relu(2, 3).reference(np.ones((2, 3), np.float32), out)


def test_linear_takes_a_contiguous_negated_view():
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(5, 4)
    xn = torch._neg_view(x)
    assert xn.is_contiguous() and xn.is_neg()
    torch.testing.assert_close(tt.linear(xn, torch._neg_view(w)), torch.nn.functional.linear(xn, -w))
    tt.linear(xn, w).sum().backward()
    torch.testing.assert_close(x.grad, -w.sum(0).expand(3, 4))


def test_block_spmm_words_an_overlap_of_torch_tensors_in_torch_terms():
    spmm = tpp.block_spmm(bm=4, bk=4, n=8, kb=2)
    rowptr, colidx = np.array([0, 1], np.int32), np.array([0], np.int32)
    values = torch.ones(1, 4, 4)
    storage = torch.zeros(8 * 8 + 4 * 8)
    b, c = storage[:64].view(8, 8), storage[32:64].view(4, 8)
    with pytest.raises(OperandError, match=r"torch\.empty_like\(c\)"):
        spmm(rowptr, colidx, values, b, c, count=1)


def test_rope_tables_names_the_dtype_it_was_given():
    with pytest.raises(ValueError, match="dtype bfloat16"):
        rope_tables(torch.zeros(2, 3, dtype=torch.bfloat16), 8)


@pytest.mark.parametrize("make", [lambda: tpp.relu(list(range(10 ** 6)), 8), lambda: tpp.brgemm(4, 4, "x" * 10 ** 6),
                                  lambda: tpp.unary("relu" * 10 ** 5, 4, 4), lambda: tpp.reduce("max" * 10 ** 5, 4, 4)])
def test_a_huge_argument_is_shown_cut_in_its_error(make):
    with pytest.raises(ValueError) as e:
        make()
    assert len(str(e.value)) < 400 and "..." in str(e.value)
