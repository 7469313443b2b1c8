"""Objects that export DLPack (JAX, CuPy host arrays, ...) as kernel operands: zero-copy on the
CPU; other devices, read-only exports and dtypes NumPy cannot import are refused with the fix."""
import numpy as np
import pytest

import tppasm as tpp
from loops import Loop, kernel
from tppasm.operand import OperandError, as_ndarray


class Exported:
    """A DLPack producer that is not a NumPy array (stands in for a JAX array on the CPU)."""

    def __init__(self, array, device=(1, 0)):
        self.array, self.device = array, device

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.device


def test_kernels_read_and_write_dlpack_operands_in_place():
    x = np.arange(-3, 5, dtype=np.float32).reshape(2, 4)
    out = np.full((2, 4), np.nan, np.float32)
    tpp.relu(2, 4)(Exported(x), Exported(out))
    assert out.tolist() == np.maximum(x, 0).tolist()


RELU_ROW = tpp.relu(1, 4)


@kernel("A", Loop(0, 3))
def relu_rows(i, X, Y):
    RELU_ROW(X[i:i + 1], Y[i:i + 1])


def test_loop_kernels_take_dlpack_operands():
    x, y = np.arange(-6, 6, dtype=np.float32).reshape(3, 4), np.full((3, 4), np.nan, np.float32)
    relu_rows(Exported(x), Exported(y))
    assert y.tolist() == np.maximum(x, 0).tolist()


def test_views_share_memory_and_strides():
    base = np.zeros((4, 6), np.float32)
    v = as_ndarray(Exported(base[:, 1:5]))
    assert v.ctypes.data == base[:, 1:5].ctypes.data and v.strides == (24, 4)


def test_read_only_exports_are_not_written():
    out = np.zeros((2, 4), np.float32)
    out.setflags(write=False)
    with pytest.raises(OperandError, match="read-only .*exported it read-only"):
        tpp.relu(2, 4)(np.ones((2, 4), np.float32), Exported(out))


def test_other_devices_are_refused():
    with pytest.raises(OperandError, match="on the DLPack device CUDA; tppasm kernels run on the CPU"):
        tpp.relu(2, 4)(Exported(np.ones((2, 4), np.float32), device=(2, 0)), np.zeros((2, 4), np.float32))


def test_dtype_and_strides_refusals_use_dlpack_terms():
    with pytest.raises(OperandError, match="convert it to float32"):
        tpp.relu(2, 4)(Exported(np.ones((2, 4), np.float64)), np.zeros((2, 4), np.float32))
    with pytest.raises(OperandError, match="pass a C-contiguous array"):
        tpp.relu(2, 4)(Exported(np.ones((4, 2), np.float32).T), np.zeros((2, 4), np.float32))


def test_bf16_over_dlpack_names_the_way_around():
    torch = pytest.importorskip("torch", reason="torch is not installed: no bf16 DLPack producer to test with")
    with pytest.raises(OperandError, match="no bfloat16: pass a torch tensor"):
        as_ndarray(Exported(torch.zeros(2, 4, dtype=torch.bfloat16)))


def test_objects_without_dlpack_are_refused():
    with pytest.raises(OperandError, match="must be a NumPy array, a torch tensor or an object with __dlpack__, "
                                           "not tuple"):
        tpp.relu(1, 2)((1.0, 2.0), np.zeros((1, 2), np.float32))


class Broken(Exported):
    """A producer whose own methods fail: device() and export() say how."""

    def __init__(self, device, export=None):
        super().__init__(np.ones((2, 4), np.float32))
        self.device_call, self.export = device, export

    def __dlpack_device__(self):
        return self.device_call()

    def __dlpack__(self, **kwargs):
        return self.export() if self.export else super().__dlpack__(**kwargs)


def _raise(error):
    raise error


@pytest.mark.parametrize("producer, words", [
    (Broken(lambda: None), r"__dlpack_device__\(\) failed \(TypeError.*\(1, 0\) for the CPU"),
    (Broken(lambda: ("cpu", 0)), r"__dlpack_device__\(\) failed \(ValueError"),
    (Broken(lambda: _raise(RuntimeError("boom"))), r"__dlpack_device__\(\) failed \(RuntimeError: boom"),
    (Broken(lambda: (1, 0), lambda: _raise(KeyError("gone"))), "cannot import this DLPack object as a view: KeyError"),
])
def test_producers_whose_methods_fail_are_refused_with_the_reason(producer, words):
    with pytest.raises(OperandError, match=words):
        tpp.relu(2, 4)(producer, np.zeros((2, 4), np.float32))
