"""The buffers tppasm.empty reuses (tppasm.buffers): one comes back only once nothing is on it."""
import ctypes
import gc
import os
import threading

import numpy as np
import pytest

import tppasm
from tppasm import buffers

from . import scripts

SIZE = (buffers.FROM // 4 + 1,)            # float32 elements: just past the pool's threshold

HOLDERS = {
    "slice": lambda a: a[1:],
    "transposed reshape": lambda a: a[:-1].reshape(-1, 16).T,
    "dtype view": lambda a: a.view(np.int32),
    "np.asarray of a memoryview": lambda a: np.asarray(memoryview(a)),
    "memoryview": memoryview,
    "np.frombuffer": lambda a: np.frombuffer(a, np.uint8),
    "np.from_dlpack": np.from_dlpack,
    "as_strided": lambda a: np.lib.stride_tricks.as_strided(a, (10,), (4,)),
    "ctypes.data_as": lambda a: a.ctypes.data_as(ctypes.c_void_p),
    "np.ctypeslib.as_ctypes": np.ctypeslib.as_ctypes,
    "a view of a view": lambda a: a[2:][::2],
    "the base": lambda a: a.base,
    "np.frombuffer of the base": lambda a: np.frombuffer(a.base, np.uint8),
    "a dtype view's base": lambda a: a.view(np.int32).base,
}
TORCH_HOLDERS = ("from_numpy", "frombuffer", "as_tensor", "from_dlpack")


@pytest.fixture(autouse=True)
def _pool_on():
    buffers.set_buffer_cache_limit(buffers.DEFAULT_MIB << 20)
    gc.collect()        # (earlier tests' pooled garbage, given back during a test, would come back first)
    yield
    buffers.set_buffer_cache_limit(buffers.DEFAULT_MIB << 20)


def _reused_while(hold):
    """Whether a new array takes the buffer of a dropped one that ``hold`` still refers to; the
    held contents are checked unchanged after the new array is written."""
    a = tppasm.empty(SIZE, "f32")
    a[:] = 7.0
    held = hold(a)
    address = a.ctypes.data
    del a
    gc.collect()
    b = tppasm.empty(SIZE, "f32")
    b[:] = -1.0
    return b.ctypes.data == address, held


def test_a_dropped_buffer_is_reused():
    # the control for the tests below: with nothing holding it, the buffer does come back
    reused, _ = _reused_while(lambda a: None)
    assert reused


@pytest.mark.parametrize("name", HOLDERS)
def test_a_buffer_is_not_reused_while_anything_refers_to_it(name):
    reused, held = _reused_while(HOLDERS[name])
    assert not reused
    if isinstance(held, np.ndarray) and held.dtype == np.float32:
        assert (held == 7.0).all()


@pytest.mark.parametrize("name", TORCH_HOLDERS)
def test_a_torch_tensor_on_a_buffer_holds_it(name):
    torch = pytest.importorskip("torch")
    make = {"from_numpy": torch.from_numpy, "frombuffer": lambda a: torch.frombuffer(a, dtype=torch.float32),
            "as_tensor": torch.as_tensor, "from_dlpack": torch.from_dlpack}[name]
    reused, held = _reused_while(make)
    assert not reused
    assert bool((held == 7.0).all())


def test_arrays_are_aligned_and_sized_as_asked():
    for shape, dtype in (((1 << 14,), "f32"), ((300, 257), "bf16"), ((3, 70000), np.uint8)):
        for _ in range(3):
            a = tppasm.empty(shape, dtype)
            assert a.shape == shape and a.flags.c_contiguous and a.flags.writeable
            assert a.ctypes.data % 64 == 0
            a[...] = 1                                  # writes every byte the array has
            del a


def test_the_limit_caps_what_the_pool_owns():
    buffers.set_buffer_cache_limit(3 * buffers.FROM)
    arrays = [tppasm.empty(SIZE, "f32") for _ in range(4)]     # 2 fit (pages round up), the rest are NumPy's
    assert buffers._POOL.owned <= 3 * buffers.FROM
    for i, a in enumerate(arrays):
        a[:] = i
    assert [float(a[0]) for a in arrays] == [0.0, 1.0, 2.0, 3.0]
    del arrays, a
    gc.collect()
    assert sum(map(len, buffers._POOL.free.values())) >= 1


def test_a_zero_limit_keeps_nothing():
    a = tppasm.empty(SIZE, "f32")
    buffers.set_buffer_cache_limit(0)
    assert buffers._POOL.free == {}
    del a
    gc.collect()
    assert buffers._POOL.free == {}
    b = tppasm.empty(SIZE, "f32")
    b[:] = 1.0
    assert buffers._POOL.free == {} and not buffers._POOL.out.get(id(b))


@pytest.mark.parametrize("limit", [-1, 1.5, "128", True, None])
def test_a_bad_limit_names_the_fix(limit):
    with pytest.raises(ValueError, match="expected an int >= 0"):
        tppasm.set_buffer_cache_limit(limit)


def test_threads_never_share_a_live_buffer():
    errors = []

    def work(tid):
        for i in range(200):
            arrays = [tppasm.empty(SIZE, "f32") for _ in range(3)]
            for j, a in enumerate(arrays):
                a[:] = tid * 10000 + i * 10 + j
            os.sched_yield()
            for j, a in enumerate(arrays):
                if not (a == tid * 10000 + i * 10 + j).all():
                    errors.append((tid, i, j))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_the_environment_sets_the_limit_and_a_bad_value_names_the_fix():
    out = scripts.run("""
        from tppasm import buffers
        print(buffers._POOL.limit)
    """, env={"TPPASM_BUFFER_CACHE_MIB": "3"})
    assert int(out) == 3 << 20
    with pytest.raises(AssertionError, match=r"TPPASM_BUFFER_CACHE_MIB='lots': expected the MiB"):
        scripts.run("import tppasm; tppasm.empty((1 << 20,), 'f32')", env={"TPPASM_BUFFER_CACHE_MIB": "lots"})
    scripts.run("import tppasm", env={"TPPASM_BUFFER_CACHE_MIB": "lots"})      # read at first use: cache clear works


def test_a_forked_child_allocates_and_reuses():
    a = tppasm.empty(SIZE, "f32")
    a[:] = 5.0
    pid = os.fork()
    if pid == 0:                                    # the child: its copy of a stays, new arrays work
        code = 0
        try:
            b = tppasm.empty(SIZE, "f32")
            b[:] = 1.0
            code = 0 if (a == 5.0).all() and b.ctypes.data != a.ctypes.data else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_buffers_a_cut_short_callback_lost_are_counted_again(monkeypatch):
    """A KeyboardInterrupt in the weakref callback (Ctrl-C; Python ignores it there) leaves a dead
    entry counted against the limit: the next array asked for past the limit counts again."""
    buffers.set_buffer_cache_limit(3 * buffers.FROM)

    def interrupted(ref):
        raise KeyboardInterrupt
    monkeypatch.setattr(buffers, "_give_back", interrupted)               # what the next arrays' refs call
    monkeypatch.setattr("sys.unraisablehook", lambda unraisable: None)   # (Python would print it)
    lost = [tppasm.empty(SIZE, "f32") for _ in range(2)]
    del lost
    gc.collect()
    monkeypatch.undo()
    buffers._POOL.full_calls = 0
    a = tppasm.empty(SIZE, "f32")
    assert any(0 <= a.ctypes.data - entry[3] < entry[1] for entry in buffers._POOL.out.values())   # pooled
