"""Calls while another thread imports numpy.ma or torch for the first time: the module is then in
sys.modules half initialized, without MaskedArray, Tensor or dtype yet. Simulated here by a bare
module in sys.modules; tppasm must treat it as not imported (no AttributeError)."""
import sys
import types

import numpy as np
import pytest

import tppasm as tpp
from tppasm import dtypes, operand


class Sub(np.ndarray):
    pass


@pytest.fixture
def half_imported_numpy_ma(monkeypatch):
    monkeypatch.setitem(sys.modules, "numpy.ma", types.ModuleType("numpy.ma"))


@pytest.fixture
def half_imported_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.setattr(dtypes, "_KNOWN", {})          # spellings seen before are not looked up again


def test_block_while_numpy_ma_is_being_imported(half_imported_numpy_ma):
    a = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    blocked = tpp.block(a, 32, 32)
    assert blocked.size == a.size
    operand.refuse_masked(a.view(Sub), "kernel: operand x")        # not a masked array: no error


def test_operands_while_torch_is_being_imported(half_imported_torch):
    x = np.ones((8, 8), np.float32)
    assert operand.origin_of(x.view(Sub)) == "numpy" and operand.origin_of([1.0]) is None
    assert type(operand.as_ndarray(x.view(Sub), writes=True)) is np.ndarray
    operand.refuse_write(x)
    operand.mark_written([x])


def test_kernel_on_a_subclass_while_torch_is_being_imported(half_imported_torch):
    relu = tpp.relu(8, 8)
    x = -np.ones((8, 8), np.float32)
    assert (relu(x.view(Sub)) == 0).all()


def test_dtypes_while_torch_is_being_imported(half_imported_torch):
    assert dtypes.name_of(np.float32) == "f32" and dtypes.name_of(np.dtype("int8")) == "i8"
    with pytest.raises(dtypes.DtypeError, match="float64"):
        dtypes.name_of(np.float64)


def test_imported_reads_an_attribute_without_importing():
    assert dtypes.imported("numpy", "ndarray") is np.ndarray
    assert dtypes.imported("tppasm_no_such_module", "x") is None
    assert "tppasm_no_such_module" not in sys.modules
