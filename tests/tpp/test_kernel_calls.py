"""The public call path refuses every malformed argument with an explanation, never a crash."""
import numpy as np
import pytest

import tppasm as tpp
from tppasm.operand import OperandError

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
        G(A, B)
