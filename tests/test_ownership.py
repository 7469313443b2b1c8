"""Who holds what: prepared native calls hold their kernel's code, raw calls are checked as calls
are, packed panels are checked on any thread count, and helpers hand out no view of memory they or
their caller keep using (.devx/fz17c items 1, 2, 4, 5, 6; fz17b item 7)."""
import gc
import pickle
import weakref

import numpy as np
import pytest

import tppasm as tpp
import tppasm.fc_parallel
from isa.pool import get_pool
from tppasm import fc
from tppasm.conv_layout import unblock_activations
from tppasm.fc_operands import PackedWeight
from tppasm.kernel import set_kernel_cache_limit
from tppasm.lazy import CodeAddress
from tppasm.operand import OperandError


@pytest.fixture
def no_kernel_cache():
    """The kernel cache keeps nothing: a kernel lives only while something else references it."""
    set_kernel_cache_limit(0)
    try:
        yield
    finally:
        set_kernel_cache_limit(512)


def _relu(n):
    """A relu kernel of (2, n) that no other test builds (so that only the test holds it)."""
    return tpp.unary("relu", 2, n, ldx=n + 37, ldo=n + 41)


def _relu_operands(n):
    x = -np.ones((2, n + 37), np.float32)
    out = np.ones((2, n + 41), np.float32)
    return x, out


def test_raw_call_holds_its_kernel_while_the_call_is_kept(no_kernel_cache):
    x, out = _relu_operands(5)
    k = _relu(5)
    gone = weakref.ref(k)
    call = k.raw_call(x[:, :5], out[:, :5])
    del k
    gc.collect()
    assert gone() is not None                      # the call holds it: its code stays mapped
    get_pool().run_native([[call]])
    assert (out[:, :5] == 0).all() and (out[:, 5:] == 1).all()
    address, args = call                            # a plain (address, args) pair, whose address holds it
    assert type(address) is CodeAddress and address.owner is gone()
    del call, address
    gc.collect()
    assert gone() is None                           # and nothing else: evicted once the call goes


def test_raw_address_holds_its_kernel_in_a_hand_built_call(no_kernel_cache):
    x, out = _relu_operands(6)
    k = _relu(6)
    gone = weakref.ref(k)
    call = (k.raw_address, (x.ctypes.data, out.ctypes.data))
    assert type(call[0]) is CodeAddress and call[0] == k.raw.address
    del k
    gc.collect()
    assert gone() is not None
    get_pool().run_native([[call]])
    assert (out[:, :6] == 0).all()
    assert type(pickle.loads(pickle.dumps(call[0]))) is int      # a pickle is the plain address


def _offset_gemm():
    g = tpp.brgemm(4, 4, 4, batch="offset")
    a, b, c = (np.ones(32, np.float32), np.ones(32, np.float32), np.zeros((4, 4), np.float32))
    return g, a, b, c


def test_raw_call_of_an_offset_batch_checks_the_offsets_as_a_call_does():
    g, a, b, c = _offset_gemm()
    bad = np.array([[1 << 40, 0]], np.int64)
    with pytest.raises(OperandError) as called:
        g(a, b, c, bad)
    with pytest.raises(OperandError) as raw:
        g.raw_call(a, b, c, bad, count=1)
    assert str(raw.value) == str(called.value)
    with pytest.raises(OperandError, match="out of range"):
        g.raw_call(a, b, c, bad, check=False)       # an offset batch is always checked


def test_raw_call_of_an_offset_batch_runs_what_it_checked():
    g, a, b, c = _offset_gemm()
    offsets = np.array([[0, 0], [16, 16]], np.int64)
    address, args = g.raw_call(a, b, c, offsets)   # (unpacked: the address holds what args point into)
    assert isinstance(address, CodeAddress) and address.owner[0] is g.kernel
    offsets[:] = 1 << 40                            # edited after the check: the call holds its copy
    gc.collect()
    get_pool().run_native([[(address, args)]])
    assert (c == 8).all()


def test_raw_call_of_an_address_batch_checks_the_blocks():
    g = tpp.brgemm(4, 4, 4, batch="address")
    c = np.zeros((4, 4), np.float32)
    with pytest.raises(OperandError):
        g.raw_call([np.ones((4, 3), np.float32)], [np.ones((4, 4), np.float32)], c)
    address, args = g.raw_call([np.full((4, 4), 2, np.float32)] * 2, [np.ones((4, 4), np.float32)] * 2, c)
    gc.collect()                                    # the blocks and their address arrays: held by the address
    get_pool().run_native([[(address, args)]])
    assert (c == 16).all()


def test_the_raw_kernel_of_an_offset_batch_refuses_raw_call():
    g, a, b, c = _offset_gemm()
    with pytest.raises(TypeError, match=r"does not check its offsets.*gemm\.raw_call"):
        g.kernel.raw_call(a, b, c, np.zeros((1, 2), np.int64), count=1, check=False)


def test_a_packing_with_panels_of_another_shape_is_refused_on_any_thread_count(monkeypatch):
    monkeypatch.setattr(tppasm.fc_parallel, "CHECK_RAW_CALLS", False)     # as outside the tests
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 256)).astype(np.float32)
    other = fc.pack(rng.standard_normal((256, 272)).astype(np.float32))   # same columns, more k rows
    assert other.panels.keys() == fc.pack(w).panels.keys()
    bad = PackedWeight(w, "f32", other.panels)
    x = rng.standard_normal((128, 256)).astype(np.float32)
    for threads in (2, 1):
        with pytest.raises(ValueError, match=r"panel for columns 0\.\.\d+ is \(272, \d+\) float32"):
            fc.forward(x, bad, threads=threads)


def test_key_mask_cannot_be_used_to_change_the_layer():
    from bench.models.llama import LlamaLayer
    from bench.models.llama_weights import Config, random_weights
    cfg = Config.small()
    layer = LlamaLayer(cfg, random_weights(cfg), "bf16")
    mask = layer.key_mask(0, 8)
    assert mask.tolist() == [0.0] + [-np.inf] * 7
    with pytest.raises(ValueError):
        mask[...] = 0.0
    with pytest.raises(ValueError):
        mask.flags.writeable = True
    assert layer.key_mask(0, 8).tolist() == [0.0] + [-np.inf] * 7


@pytest.mark.parametrize("name, helper, x", [
    ("block, one block", lambda a: tpp.block(a, 64, 64), np.ones((64, 64), np.float32)),
    ("block, row blocks", lambda a: tpp.block(a, 8, 64), np.ones((64, 64), np.float32)),
    ("block, grid", lambda a: tpp.block(a, 32, 32), np.ones((64, 64), np.float32)),
    ("unblock, Nb = 1", tpp.unblock, tpp.empty((4, 1, 16, 64))),
    ("unblock, Nb = 1, cropped", lambda a: tpp.unblock(a, shape=(50, 64)), tpp.empty((4, 1, 16, 64))),
    ("unblock, Nb = 2", tpp.unblock, tpp.empty((4, 2, 16, 32))),
    ("vnni_unpack, n = 1", tpp.vnni_unpack, tpp.empty((8, 1, 2))),
    ("vnni_unpack, n = 4", tpp.vnni_unpack, tpp.empty((8, 4, 2))),
    ("unblock_activations, bc = 1", unblock_activations, tpp.empty((1, 4, 5, 5, 1))),
    ("unblock_activations, bc = 4", unblock_activations, tpp.empty((1, 1, 5, 5, 4))),
])
def test_layout_helpers_return_new_arrays(name, helper, x):
    x[...] = 2
    y = helper(x)
    assert not np.shares_memory(x, y), name
    assert y.flags.c_contiguous and y.ctypes.data % 64 == 0
    x[...] = 7
    assert (y == 2).all()


def test_empty_out_of_memory_names_the_shape_and_dtype_asked_for():
    with pytest.raises(MemoryError, match=r"shape \(1152921504606846976,\) and data type int8: free memory"):
        tpp.empty((1 << 60,), "i8")             # past any address space: refused whatever the overcommit
