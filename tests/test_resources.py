"""Resources and lifetimes: what the disk cache and the thread pools hold is released (files,
threads, memory), an interrupted or failed write costs cache writes and never kernels, the cache
deletes only its own files, multiprocessing workers reach the disk, and the environment's numbers
are plain ASCII integers."""
import ctypes
import errno
import gc
import json
import os
import warnings

import numpy as np
import pytest

import isa.pool as ip
import tppasm.cache as tc
from isa import memory
from tests.scripts import run
from tests.test_fork import FORK
from tppasm import kernel as tk
from tppasm.cache import disk, files
from tppasm.eltwise import Unary


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


def _threads():
    return len(os.listdir("/proc/self/task"))


def _relu_kernel(n):
    return tk.Kernel(Unary("relu", 2, n), tk.host().isa, code_cache=tc.kernel_code())


def _check_relu(k, n):
    x = -np.ones((2, n), np.float32)
    k(x, x)
    assert not x.any()


# -- the disk cache --------------------------------------------------------------------------

def test_interrupted_import_of_the_writer_stops_writes_and_kernels_still_come(tmp_path, monkeypatch):
    """Ctrl-C while put imports mmap-ninja (half-imported tqdm / asyncio fail at every later
    import): the KeyboardInterrupt reaches the caller, writes stop, later kernels are made."""
    def interrupted():
        raise KeyboardInterrupt
    with tc.using(tmp_path) as store:       # (first: leaving the process's store writes what it has pending)
        monkeypatch.setattr(disk, "_ragged_mmap", interrupted)
        with pytest.raises(KeyboardInterrupt), pytest.warns(RuntimeWarning, match="KeyboardInterrupt"):
            store.put("kernel/a", b"\xc3", {})
        assert isinstance(store.failure, KeyboardInterrupt)

        def broken():
            raise NameError("name 'base_events' is not defined")
        monkeypatch.setattr(disk, "_ragged_mmap", broken)
        _check_relu(_relu_kernel(17), 17)          # no import attempted again, no error
        assert store.flush() is False


def test_a_failed_import_of_the_writer_warns_and_stops_writes(tmp_path, monkeypatch):
    def broken():
        raise NameError("name 'coroutines' is not defined")
    monkeypatch.setattr(disk, "_ragged_mmap", broken)
    store = disk.DiskStore(tmp_path, 1 << 20)
    with pytest.warns(RuntimeWarning, match="coroutines"):
        store.put("kernel/a", b"\xc3", {})
    store.put("kernel/b", b"\xc3", {})            # quietly nothing: writing stopped
    assert isinstance(store.failure, NameError) and not store._pending


def test_a_failed_segment_write_deletes_its_temporary_directory(tmp_path, monkeypatch):
    """ENOSPC inside the segment write: its partial directory must not keep the disk full."""
    class FullDisk:
        @staticmethod
        def from_lists(path, lists, dtype):
            os.makedirs(path)
            with open(os.path.join(path, "data.ninja"), "wb") as f:
                f.write(b"x" * 4096)
            raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(disk, "_ragged_mmap", lambda: FullDisk)
    store = disk.DiskStore(tmp_path, 1 << 20)
    store.put("kernel/a", b"\xc3", {})
    with pytest.warns(RuntimeWarning, match="No space left"):
        assert store.flush() is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lock"]


def test_a_segment_that_does_not_fit_is_not_written(tmp_path, monkeypatch):
    """mmap-ninja writes through a mapping: on a full disk that is SIGBUS, not an error to catch."""
    class Full:
        f_bavail, f_frsize = 10, 4096
    monkeypatch.setattr(files.os, "statvfs", lambda path: Full)
    store = disk.DiskStore(tmp_path, 1 << 20)
    store.put("kernel/a", b"\xc3" * 1000, {})
    with pytest.warns(RuntimeWarning, match="40960 bytes free"):
        assert store.flush() is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lock"]


USERS_FILES = ["seg-photos/a.jpg", "tmp-notes.txt", "index.json.tmp-mine", "stats.json.tmp-1-mine",
               "tmp-seg-photos/b.jpg", "seg-0123456789abcdeg/c.jpg"]


def _users_files(root):
    for name in USERS_FILES:
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_text("mine")


def test_the_cache_deletes_only_the_files_it_names(tmp_path):
    """A directory that also holds the user's files: a flush (its garbage collection) and
    clear() delete the store's own leftovers, and none of the user's files."""
    _users_files(tmp_path)
    leftovers = ["tmp-seg-0123456789abcdef/data.ninja", "seg-fedcba9876543210/data.ninja",
                 "index.json.tmp-123-abcdef12", "stats.json.tmp-9-00000000"]
    for name in leftovers:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("left by a killed writer")
    store = disk.DiskStore(tmp_path, 1 << 20)
    store.put("kernel/a", b"\xc3", {})
    assert store.flush()
    assert all((tmp_path / name).read_text() == "mine" for name in USERS_FILES)
    assert not any((tmp_path / name.split("/")[0]).exists() for name in leftovers)
    store.clear()
    assert all((tmp_path / name).read_text() == "mine" for name in USERS_FILES)
    assert not any(disk.is_segment(p.name) for p in tmp_path.iterdir())


def test_stores_that_are_replaced_or_dropped_close_their_files(tmp_path):
    with tc.using(tmp_path):
        for n in range(1, 6):
            _relu_kernel(n)
    before = _open_fds()
    for i in range(20):
        with tc.using(tmp_path) as store:
            assert store.get(next(k for k in store._load_index()[0]["entries"])) is not None   # opens a segment
    store = disk.DiskStore(tmp_path, 1 << 20)
    store.get(next(iter(store._load_index()[0]["entries"])))
    del store
    gc.collect()
    assert _open_fds() == before


def test_close_writes_what_is_pending_and_the_store_still_reads(tmp_path):
    store = disk.DiskStore(tmp_path, 1 << 20)
    store.put("kernel/a", b"\x90\xc3", {"n": 1})
    store.close()
    assert not store._segments and store.get("kernel/a") == (b"\x90\xc3", {"n": 1})
    assert disk.DiskStore(tmp_path, 1 << 20).get("kernel/a")[0] == b"\x90\xc3"


def test_kernels_made_in_multiprocessing_workers_reach_the_disk(tmp_path):
    """Pool workers end with os._exit, or are terminated by ``with Pool(...)``: no atexit there."""
    out = run("""
        import multiprocessing as mp
        import tppasm as tpp
        def work(n):
            return tpp.relu(2, 100 + n).from_disk
        if __name__ == "__main__":
            with mp.get_context("fork").Pool(2) as p:
                print(sum(p.map(work, range(4))))
            print(sum(tpp.relu(2, 100 + n).from_disk for n in range(4)))
    """, {"TPPASM_CACHE_DIR": str(tmp_path)})
    assert out.split() == ["0", "4"]


def test_a_read_only_cache_that_every_load_hit_does_not_warn_at_exit(tmp_path, monkeypatch):
    store = disk.DiskStore(tmp_path, 1 << 20)
    store.put("kernel/a", b"\xc3", {})
    store.flush()
    store = disk.DiskStore(tmp_path, 1 << 20)
    assert store.get("kernel/a") is not None
    store._touched["kernel/a"] += 2 * disk.TOUCH_S         # a cache baked into an image long ago

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")
    with warnings.catch_warnings(), monkeypatch.context() as m:
        warnings.simplefilter("error")
        m.setattr(disk.os, "open", read_only)
        assert store.flush() is False              # only the counts were due: dropped quietly
    assert store.failure is None


# -- the thread pools ------------------------------------------------------------------------

def _nop():
    from isa.x86 import Function
    return Function("nop", ["ptr", "i64", "i64"]).finalize()


def _maps():
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def test_set_num_threads_frees_the_pools_it_replaces():
    before_n = ip.get_num_threads()
    ip.get_pool()
    gc.collect()
    before = memory.mapped(), _maps(), _threads(), _open_pools()
    try:
        for i in range(60):
            ip.set_num_threads(1 + i % 2)
            ip.get_pool().run(_NOP.address, 0)
    finally:
        ip.set_num_threads(before_n)
    gc.collect()
    assert memory.mapped() == before[0]
    assert _maps() <= before[1] + 8 and _threads() <= before[2] + 2
    assert _open_pools() <= before[3] + 1        # (other tests' pools, held by their kernels, stay open)


def _open_pools():
    return sum(1 for p in ip._POOLS if not p.closed)


_NOP = _nop()


def test_pools_nothing_references_release_their_workers():
    gc.collect()
    before = _threads(), _maps()
    for _ in range(30):
        pool = ip.Pool(3)
        pool.run(_NOP.address, 0)
        del pool
    gc.collect()
    assert _threads() <= before[0] and _maps() <= before[1] + 4      # (<=: another test's thread may end meanwhile)


def test_close_joins_the_workers_and_a_closed_pool_refuses_work():
    gc.collect()
    before = _threads()
    pool = ip.Pool(3)
    pool.run(_NOP.address, 0)
    assert _threads() == before + 2
    pool.close()
    pool.close()                                    # again: nothing
    assert _threads() == before and pool.closed and "closed" in repr(pool)
    with pytest.raises(ValueError, match=r"was closed \(Pool.close\(\)\); make a new Pool\(3\)"):
        pool.run(_NOP.address, 0)
    with pytest.raises(ValueError, match="was closed"):
        pool.run_native([[(_NOP.address, (0, 0, 1))]])


def test_a_closed_process_pool_is_replaced():
    old = ip.get_pool()
    old.close()
    new = ip.get_pool()
    assert new is not old and not new.closed and new.nthreads == old.nthreads
    counts = (ctypes.c_int64 * 1)()
    new.run(_NOP.address, ctypes.addressof(counts))


def test_forked_child_uses_and_closes_pools_made_before_the_fork():
    out = run(FORK + r"""
import gc
import isa.pool as ip
from isa.x86 import Function
nop = Function("nop", ["ptr", "i64", "i64"]).finalize()
mine = ip.Pool(3); mine.run(nop.address, 0)
for n in (1, 2, 3):
    ip.set_num_threads(n); ip.get_pool().run(nop.address, 0)
def child():
    mine.run(nop.address, 0); mine.close()
    ip.get_pool().run(nop.address, 0); ip.get_pool().close(); ip.get_pool().run(nop.address, 0)
    ip.set_num_threads(2); ip.get_pool().run(nop.address, 0)
fork_and_check(child)
mine.run(nop.address, 0)
print("parent ok")
""")
    assert "child ok" in out and "parent ok" in out


def test_set_num_threads_takes_numpy_ints_and_names_itself_in_errors():
    before = ip.get_num_threads()
    try:
        ip.set_num_threads(np.int64(1))
        assert ip.get_num_threads() == 1
    finally:
        ip.set_num_threads(before)
    with pytest.raises(ValueError, match=r"set_num_threads\(5000\): expected an int >= 1 .*at most 4096"):
        ip.set_num_threads(5000)
    for bad in (True, 2.0, "2"):
        with pytest.raises(TypeError, match="set_num_threads"):
            ip.set_num_threads(bad)


# -- the environment -------------------------------------------------------------------------

@pytest.mark.parametrize("name, value", [("TPPASM_NUM_THREADS", ","), ("TPPASM_NUM_THREADS", "\u0663"),
                                         ("OMP_NUM_THREADS", "1_0"), ("TPPASM_SPIN_US", "1_0"),
                                         ("TPPASM_SPIN_US", "\u0663")])
def test_thread_settings_are_plain_ascii_numbers(name, value, monkeypatch):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        ip.default_threads() if "THREADS" in name else ip.Pool(2)


def test_cache_sizes_are_plain_ascii_numbers():
    out = run("""
        import os, subprocess, sys
        for name, value in [("TPPASM_KERNEL_CACHE", "1_000"), ("TPPASM_BUFFER_CACHE_MIB", "\\u0663"),
                            ("TPPASM_CACHE_MB", "1_000"), ("TPPASM_ISA", " ")]:
            r = subprocess.run([sys.executable, "-c", "import tppasm; tppasm.relu(2, 2)"], capture_output=True,
                               text=True, env={**os.environ, name: value})
            print(name, r.returncode, json.dumps(r.stderr.strip().splitlines()[-1:]))
    """.replace("import os,", "import json, os,"))
    lines = dict(line.split(" ", 1) for line in out.splitlines())
    for name in ("TPPASM_KERNEL_CACHE", "TPPASM_BUFFER_CACHE_MIB", "TPPASM_CACHE_MB"):
        assert lines[name].startswith("1 ") and name in json.loads(lines[name][2:])[0]
    assert lines["TPPASM_ISA"].startswith("0 ")          # blank: unset, like every other variable
