"""When the operating system says no: thread limits (``ulimit -u``), a W^X policy, file-size and
descriptor limits, an address-space limit, no usable /dev/shm, a garbage collection at the wrong
moment, and interpreter exit. Each gives a clean error or warning naming the fix, or just works;
none crashes the process or blames the wrong thing."""
import ctypes
import errno
import gc
import os
import shutil
import signal
import subprocess
import sys
import weakref

import numpy as np
import pytest

from isa import memory
from tests.scripts import ROOT
from tppasm import buffers, layout
from tppasm.cache import disk, trust


def _child(script, env=None, user=None, timeout=30):
    """(returncode, stdout, stderr) of ``script`` in a fresh interpreter (as uid ``user`` if given)."""
    env = {**os.environ, "TPPASM_CACHE": "0", "OPENBLAS_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
           **(env or {})}
    command = [sys.executable, "-c", f"import sys; sys.path.insert(0, {ROOT!r})\n{script}"]
    if user is not None:        # (reading the interpreter's files wherever they live needs the capability)
        command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--inh-caps=+dac_read_search",
                   "--ambient-caps=+dac_read_search"] + command
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


# -- threads: pthread_create refused (fz17b 1) ------------------------------------------------------

_NPROC = """
import os, resource, isa.pool as ip
pool = ip.Pool(6)
hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
resource.setrlimit(resource.RLIMIT_NPROC, (len(os.listdir("/proc/self/task")) + 2, hard))   # 2 workers more
for attempt in range(2):
    try:
        pool.run_native([])
        print("ran")
    except OSError as e:
        print("refused", e.errno, e)
ip.set_num_threads(3)
ip.get_pool().run_native([[]] * 3)
print("3 threads ok", ip.get_pool()._threads != [])
resource.setrlimit(resource.RLIMIT_NPROC, (hard, hard))
pool.run_native([])
print("6 threads ok", len(pool._threads))
"""


def test_a_refused_worker_thread_is_a_clean_error_naming_the_count_that_fits():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv: RLIMIT_NPROC binds only an unprivileged uid")
    user = 40000 + os.getpid() % 20000          # a uid with no other process: the count is this child's
    code, out, err = _child(_NPROC, user=user)
    if "Operation not permitted" in err and "setpriv" in err:
        pytest.skip("setpriv cannot switch users here")
    assert code == 0, f"exit status {code} (a segfault joining a thread that never ran?)\n{out}\n{err}"
    lines = out.splitlines()
    assert lines[0] == lines[1] and lines[0].startswith(f"refused {errno.EAGAIN} ")      # (again: no stale handle)
    assert "only 3 of 6 threads could be started" in lines[0]
    assert "TPPASM_NUM_THREADS=3" in lines[0] and "loops.set_num_threads(3)" in lines[0] and "ulimit -u" in lines[0]
    assert lines[2:] == ["3 threads ok True", "6 threads ok 5"]


# -- a late region at exit (fz17c 7) ----------------------------------------------------------------

_LATE = """
import atexit, numpy as np, tppasm as tpp, isa.pool as ip
relu = tpp.relu(8, 8)
def late():                     # registered before the pool's exit hook: runs after it
    xs, ys = [-np.ones((8, 8), np.float32) for _ in range(2)], [np.ones((8, 8), np.float32) for _ in range(2)]
    pool = ip.get_pool()
    pool.run_native([[relu.raw_call(x, y)] for x, y in zip(xs, ys)])
    print("late region", all((y == 0).all() for y in ys), "workers left", len(pool._threads))
atexit.register(late)
ip.get_pool().run_native([])     # the first parallel call: the pool's exit hook is registered now
print("main done")
"""


def test_an_atexit_handler_registered_before_the_pool_still_runs_parallel_work():
    code, out, err = _child(_LATE, env={"TPPASM_NUM_THREADS": "2"})
    assert code == 0 and out.splitlines() == ["main done", "late region True workers left 0"], f"{out}\n{err}"


# -- W^X refused (fz17b 5) --------------------------------------------------------------------------

def test_an_os_error_of_the_jit_says_the_cause_in_words():
    ctypes.set_errno(errno.ENOMEM)
    message = str(memory._os_error("mmap", 4096))
    assert "Cannot allocate memory" in message and "b'" not in message and "ulimit -v" in message


_MDWE = """
import ctypes
if ctypes.CDLL(None).prctl(65, 1, 0, 0, 0) != 0:      # PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN (Linux 6.3)
    print("unsupported")
    raise SystemExit
from isa.memory import ExecutableMemory
try:
    ExecutableMemory(b"\\xc3")
    print("mapped")
except PermissionError as e:
    print(e)
"""


def test_a_w_xor_x_policy_is_named_with_the_fix():
    code, out, err = _child(_MDWE)
    assert code == 0, err
    if out.strip() == "unsupported":
        pytest.skip("this kernel has no PR_SET_MDWE")
    assert "W^X policy" in out and "MemoryDenyWriteExecute" in out and "b'" not in out, out


# -- the disk cache under process limits (fz17b 2, 3, 4, 6) ---------------------------------------

def test_the_index_read_asks_for_the_file_size_not_the_limit(tmp_path, monkeypatch):
    store = disk.DiskStore(tmp_path, cap_bytes=1 << 20)
    store.put("kernel/a", b"\xc3", {})
    assert store.flush()
    asked, real_read = [], os.read
    monkeypatch.setattr(os, "read", lambda fd, n: asked.append(n) or real_read(fd, n))
    assert disk.DiskStore(tmp_path, cap_bytes=1 << 20).get("kernel/a") == (b"\xc3", {})
    assert asked and max(asked) <= os.path.getsize(tmp_path / "index.json") + 1   # (64 MiB fail under ulimit -v)


def _out_of_descriptors(monkeypatch, names):
    real_open = os.open

    def refuse(path, *args, **kwargs):
        if os.path.basename(path) in names:
            raise OSError(errno.EMFILE, "Too many open files", path)
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(os, "open", refuse)


def test_running_out_of_descriptors_is_a_miss_and_names_ulimit_n(tmp_path, monkeypatch):
    store = disk.DiskStore(tmp_path, cap_bytes=1 << 20)
    store.put("kernel/a", b"\xc3", {})
    assert store.flush()
    segment = next(name for name in os.listdir(tmp_path) if name.startswith("seg-"))
    fresh = disk.DiskStore(tmp_path, cap_bytes=1 << 20)
    with monkeypatch.context() as m:
        _out_of_descriptors(m, {"index.json", segment})
        with pytest.warns(RuntimeWarning, match=r"Too many open files .*index\.json.*ulimit -n"):
            assert fresh.get("kernel/a") is None                # the index cannot be opened now: a miss
    fresh._warned.clear()
    with monkeypatch.context() as m:
        _out_of_descriptors(m, {segment})
        with pytest.warns(RuntimeWarning, match=r"ulimit -n"):
            assert fresh.get("kernel/a") is None                # the segment cannot be opened now: a miss
    assert fresh.get("kernel/a") == (b"\xc3", {})               # and its entry stays


def test_a_flush_out_of_descriptors_names_ulimit_n_not_the_files(tmp_path, monkeypatch):
    store = disk.DiskStore(tmp_path, cap_bytes=1 << 20)
    store.put("kernel/a", b"\xc3", {})
    assert store.flush()
    store.put("kernel/b", b"\xc3", {})
    _out_of_descriptors(monkeypatch, {"index.json", "stats.json", "lock"})
    with pytest.warns(RuntimeWarning) as seen:
        assert not store.flush()
    text = " ".join(str(w.message) for w in seen)
    assert "ulimit -n" in text and "not the kernel cache's" not in text and "nested too deeply" not in text, text
    assert "Fix the directory" not in text


def test_write_fixes_name_the_process_limit():
    assert trust.write_fix(OSError(errno.EFBIG, "File too large")).startswith("Raise this process's file-size limit")
    assert trust.write_fix(OSError(errno.EMFILE, "Too many open files")).startswith("Raise this process's open-file")
    assert trust.write_fix(OSError(errno.EROFS, "Read-only file system")) == "Fix the directory, or set"


_FSIZE = """
import resource, signal
resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)          # as an embedding host has it
import numpy as np, tppasm as tpp
x = -np.ones((64, 64), np.float32)
print("kernel ok", not tpp.relu(64, 64)(x).any(), flush=True)
"""


def test_a_file_size_limit_costs_cache_writes_not_the_process(tmp_path):
    code, out, err = _child(_FSIZE, env={"TPPASM_CACHE": "1", "TPPASM_CACHE_DIR": str(tmp_path / "cache")})
    assert code == 0, f"exit status {code} (-{int(signal.SIGXFSZ)}: killed by SIGXFSZ)\n{out}\n{err}"
    assert out == "kernel ok True\n" and "ulimit -f" in err, err


_NO_SHM = """
import _multiprocessing, warnings
class Refused:                                  # /dev/shm read-only (AWS Lambda, sandboxes)
    def __init__(self, *args, **kwargs):
        raise OSError(30, "Read-only file system")
_multiprocessing.SemLock = Refused
from tppasm.cache import disk
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    disk._ragged_mmap()
print([str(w.message) for w in seen if "joblib" in str(w.message)])
"""


def test_no_usable_dev_shm_gives_no_joblib_warning():
    code, out, err = _child(_NO_SHM)
    assert code == 0 and out == "[]\n", f"{out}\n{err}"


# -- the buffer pool (fz17c 3, fz17b 7) -------------------------------------------------------------

class _Link:
    """A reference cycle holding a pooled array: freed only by a collection."""

    def __init__(self, array):
        self.array, self.me = array, self


def test_a_recount_survives_collections_that_change_the_pool(monkeypatch):
    # each collection frees a cycle holding a pooled array (_give_back takes it out of pool.out), and
    # its weak reference's callback makes the next one (a new entry): so a collection at any
    # allocation during the recount changes pool.out (tuples come from a free list first: gc.collect
    # empties it, and 100 arrays out outlast what refills it)
    monkeypatch.setattr(buffers._POOL, "_limit", 1 << 40)
    new = lambda: buffers.array((16384,), np.dtype(np.float32), 65536 + 64, 64)     # noqa: E731
    out, made = [new() for _ in range(100)], []

    def garbage(_=None):
        if len(made) < 40:
            cycle = _Link(new())
            made.append(weakref.ref(cycle, garbage))
    gc.collect()
    threshold, enabled = gc.get_threshold(), gc.isenabled()
    gc.disable()
    try:
        garbage()                           # young: the first collection frees it
        gc.set_threshold(1)                 # a collection every other allocation of a tracked object
        gc.enable()
        buffers._recount(buffers._POOL)
    finally:
        gc.set_threshold(*threshold)
        (gc.enable if enabled else gc.disable)()
    assert len(made) > 3 and len(out) == 100    # (collections did run during the recount)
    del out
    gc.collect()


def test_a_pooled_allocation_that_fails_names_the_shape_asked_for(monkeypatch):
    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 5.00 MiB for an array with shape (5255168,) and data type uint8")
    monkeypatch.setattr(buffers._POOL, "_limit", 1 << 40)
    monkeypatch.setattr(buffers.np, "empty", no_memory)
    with pytest.raises(MemoryError, match=r"shape \(1310000,\) and data type float32"):
        layout.empty((1310000,), "f32")              # (a pooled size: buffers.array's np.empty fails)
