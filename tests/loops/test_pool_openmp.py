"""isa.pool.share_openmp_threads: the process pool's regions (tables of native calls, tppasm.fc's
products; loop nests, barriers included) made on the threads of the GNU OpenMP runtime torch
loaded, under the caller's MXCSR, each thread's own MXCSR given back; on the pool where libgomp
gives a team of another size, and in a forked child."""
import ctypes
import multiprocessing

import numpy as np
import pytest

import isa.pool as ip
from isa import pool_calls
from isa.cpu import host
from tests.mxcsr import DEFAULT, mxcsr

pytestmark = pytest.mark.skipif(host().arch != "x86_64", reason="OpenMP regions are built for x86-64 only")
pytest.importorskip("torch")            # (which loads libgomp)
FTZ_DAZ = DEFAULT | 1 << 15 | 1 << 6
FLAGS = 0x3F


@pytest.fixture
def openmp():
    regions = pool_calls.openmp_regions()
    if regions is None:
        pytest.skip("torch's build loads no libgomp here")
    return regions


def _mxcsr_reader():
    """read(out, i): out[i] = this thread's MXCSR, and out[i + 8] = its thread id (gettid)."""
    from isa.x86 import Function, eax, rax, rsp
    f = Function("read_mxcsr_and_tid", ["ptr", "i64"])
    out, i = f.args
    f.stack(16)
    a = f.asm
    a.stmxcsr([rsp])
    a.mov(eax, [rsp])
    a.mov([out + i * 8], rax)
    a.mov(eax, 186)                                  # SYS_gettid (clobbers rcx, r11: not the arguments)
    a.syscall()
    a.mov([out + i * 8 + 64], rax)
    return f.finalize()


READ = _mxcsr_reader() if host().arch == "x86_64" else None


def _table(lists, out):
    """A table of ``lists`` lists of one call each: list i reads into out[i]."""
    return pool_calls.call_table([[(READ.address, (ctypes.addressof(out), i))] for i in range(lists)], lists)


def _in_a_process(code, **env):
    """(exit status, stdout words, stderr) of ``code`` in a fresh Python under ``env`` (besides
    this one's): a deadlock there times out instead of taking the suite down."""
    import os
    import subprocess
    import sys
    got = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True, text=True,
                         timeout=120)
    return got.returncode, got.stdout.split(), got.stderr


RAWCALL = ip._shared_code()["rawcall"].address
BLOCK = (ctypes.c_uint64 * pool_calls.DATA_WORDS)()         # a region's block (a pool's: in its state)


@pytest.mark.parametrize("lists, nthreads", [(2, 2), (1, 2), (3, 3), (2, 4)])
def test_every_list_runs_once_on_a_thread_of_its_own(openmp, lists, nthreads):
    out = (ctypes.c_uint64 * 16)()
    table, n = _table(lists, out)
    assert openmp.run(RAWCALL, table.buffer_info()[0], nthreads, ctypes.addressof(BLOCK))
    assert all(out[i] for i in range(lists)) and not any(out[i] for i in range(lists, 8))
    assert len({out[8 + i] for i in range(lists)}) == lists


@pytest.mark.parametrize("control", [FTZ_DAZ, DEFAULT | 2 << 13, DEFAULT], ids=["ftz-daz", "round-up", "default"])
def test_lists_run_under_the_callers_mxcsr_and_threads_get_theirs_back(openmp, control):
    before = openmp_threads_mxcsr()
    out = (ctypes.c_uint64 * 16)()
    table, n = _table(2, out)
    with mxcsr(control):
        assert openmp.run(RAWCALL, table.buffer_info()[0], n, ctypes.addressof(BLOCK))
    assert [out[i] & ~FLAGS for i in range(2)] == [control] * 2
    assert openmp_threads_mxcsr() == before            # torch's next operator runs under theirs


def openmp_threads_mxcsr():
    """The MXCSR control bits of each thread of a 2-thread libgomp region of a reader's own
    (``GOMP_parallel`` of a function that sets nothing)."""
    from isa.x86 import Function, eax, ecx, r12, rax, rcx, rsp
    lib = ctypes.CDLL(pool_calls.loaded_openmp())
    thread_num = ctypes.cast(lib.omp_get_thread_num, ctypes.c_void_p).value
    f = Function("read_openmp_mxcsr", ["ptr"])
    f.stack(16)
    a = f.asm
    a.mov(r12, f.args[0])
    a.stmxcsr([rsp])
    a.mov(rax, thread_num)
    a.call(rax)
    a.mov(ecx, [rsp])
    a.movsxd(rax, eax)
    a.mov([r12 + rax * 8], rcx)
    read = f.finalize()
    parallel = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint)(
        ctypes.cast(lib.GOMP_parallel, ctypes.c_void_p).value)
    out = (ctypes.c_uint64 * 2)()
    parallel(read.address, ctypes.addressof(out), 2, 0)
    return [v & ~FLAGS for v in out]


def test_shared_tables_are_made_on_openmp_threads(monkeypatch):
    made = []
    run = pool_calls.OpenMPRegions.run
    monkeypatch.setattr(pool_calls.OpenMPRegions, "run", lambda self, *a: made.append(a) or run(self, *a))
    pool = ip.get_pool()
    if pool.nthreads < 2:
        pytest.skip("one thread: tables run on the calling thread")
    try:
        if not ip.share_openmp_threads():
            pytest.skip("torch's build loads no libgomp here")
        out = (ctypes.c_uint64 * 16)()
        pool.run_native([[(READ.address, (ctypes.addressof(out), i))] for i in range(2)])
        assert made and out[0] and out[1]
        made.clear()
        ip.share_openmp_threads(False)
        pool.run_native([[(READ.address, (ctypes.addressof(out), i))] for i in range(2)])
        assert not made
    finally:
        import tppasm.torch  # noqa: F401
        ip.share_openmp_threads()              # as importing tppasm.torch left it


def test_importing_tppasm_torch_shares_them():
    import tppasm.torch  # noqa: F401
    assert bool(pool_calls._openmp) == (pool_calls.loaded_openmp() is not None)


def _fc_in_child():
    from tppasm import fc
    x, w = np.ones((300, 700), np.float32), np.ones((300, 700), np.float32)
    return pool_calls.openmp_team(2) is None, fc.forward(x, w, threads=2)[0]


def test_a_forked_child_runs_tables_on_its_pool():
    import tppasm.torch  # noqa: F401
    from tppasm import fc
    fc.forward(np.ones((300, 700), np.float32), np.ones((300, 700), np.float32), threads=2)
    with multiprocessing.get_context("fork").Pool(1) as pool:
        on_pool, y = pool.apply(_fc_in_child)
    assert on_pool and (y == 700).all()


_BARRIERS = """
import numpy as np
import tppasm.torch  # noqa: F401
import isa.pool as ip
from isa import pool_calls
from loops import Loop, kernel
from tests.loops.test_nest import recording_body
made, run = [], pool_calls.OpenMPRegions.run
pool_calls.OpenMPRegions.run = lambda self, *a: made.append(a) or run(self, *a)
n = ip.get_pool().nthreads
k = kernel("aB|@schedule(dynamic)", Loop(0, 6), Loop(0, 64), races="allow")(recording_body(2, True))
cnt, order = np.zeros((n, 1, 1), np.int32), np.full((6, 64, 1, 1), -1, np.int32)
hits = np.zeros((n, 6, 64, 1, 1), np.int32)
k(cnt, order, hits)
first, last = order[..., 0, 0].min(axis=1), order[..., 0, 0].max(axis=1)
assert made and (hits.sum(0) == 1).all() and hits[1].any() and (last[:-1] < first[1:]).all()
print("ordered")
"""


def test_a_loop_nest_with_barriers_runs_on_openmp_threads(openmp):
    """A nest of the process's pool ("aB|": a barrier after each row's parallel loop) on libgomp's
    threads, as the first region of a process (the pool's state, which its barriers read, set up):
    every iteration once, and each row's iterations all before the next row's."""
    code, out, err = _in_a_process(_BARRIERS, TPPASM_NUM_THREADS="2")
    assert code == 0 and out == ["ordered"], err


_LIMITED = """
import numpy as np, torch, tppasm.torch
from isa import pool_calls
from tppasm import fc
x, w = np.ones((300, 700), np.float32), np.ones((300, 700), np.float32)
shared = pool_calls.openmp_team(2) is not None
print(shared, (fc.forward(x, w, threads=2)[0] == 700).all(), pool_calls.openmp_team(2) is None,
      (fc.forward(2 * x, w, threads=2)[0] == 1400).all())
"""


def test_a_team_of_another_size_runs_on_the_pool():
    """Under OMP_THREAD_LIMIT=1 libgomp gives a team of one: nothing runs there, the pool runs it,
    and the next regions go to the pool straight away."""
    code, out, err = _in_a_process(_LIMITED, OMP_THREAD_LIMIT="1", TPPASM_NUM_THREADS="2")
    assert code == 0 and out in (["True", "True", "True", "True"], ["False", "True", "True", "True"]), err


def test_a_team_of_another_size_calls_nothing(openmp):
    """A region entered from inside another where libgomp nests none (a team of one) calls nothing
    and says so."""
    out = (ctypes.c_uint64 * 16)()
    table, _ = _table(2, out)
    lib = ctypes.CDLL(pool_calls.loaded_openmp())
    parallel = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint)(
        ctypes.cast(lib.GOMP_parallel, ctypes.c_void_p).value)
    blocks, got = (ctypes.c_uint64 * (2 * pool_calls.DATA_WORDS))(), []

    @ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    def outer(_):                                       # each thread of an outer region enters one
        i = lib.omp_get_thread_num()
        block = ctypes.addressof(blocks) + 8 * pool_calls.DATA_WORDS * i
        got.append(openmp.run(RAWCALL, table.buffer_info()[0], 2, block))
    levels = lib.omp_get_max_active_levels()
    lib.omp_set_max_active_levels(1)                    # (libgomp's default may nest)
    try:
        parallel(ctypes.cast(outer, ctypes.c_void_p).value, None, 2, 0)
    finally:
        lib.omp_set_max_active_levels(levels)
    assert got and not any(got) and blocks[4] == 1 and not any(out[i] for i in range(8))


_REENTER = """
import ctypes
import tppasm.torch  # noqa: F401
from isa import pool_calls
from isa.pool import get_pool
from isa.x86 import Function
pool, seen = get_pool(), []
nop = Function("nop", ["ptr", "i64", "i64"]).finalize()
@ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
def body(arg, tid, n):
    for call in (lambda: pool.run(nop.address, 0), pool.cpu_seconds, pool.close):
        try:
            call()
            seen.append((tid, "no error"))
        except RuntimeError as e:
            seen.append((tid, str(e)))
assert pool_calls.openmp_team(2) is not None
pool.run(ctypes.cast(body, ctypes.c_void_p).value, 0)
assert sorted(t for t, _ in seen) == [0, 0, 0, 1, 1, 1], seen
assert all("inside a parallel region" in m for _, m in seen), seen
assert not pool.closed and pool.cpu_seconds()
print("refused")
"""


def test_a_callback_on_openmp_threads_entering_the_pool_is_refused(openmp):
    """A region's callback into Python on libgomp's threads that calls Pool.run, cpu_seconds or
    close raises RuntimeError: the region lock is held, so waiting for it would never end (run in a
    process of its own, which a deadlock would not take down with the suite)."""
    code, out, err = _in_a_process(_REENTER, TPPASM_NUM_THREADS="2")
    assert code == 0 and out == ["refused"], err


def test_cpu_clocked_trials_run_on_the_pools_threads(monkeypatch):
    """loops.trial.elapsed(clock="cpu") reads the pool's threads' clocks: its run is theirs, even
    where regions are shared, while a wall-clocked one runs on libgomp's threads."""
    from loops import Loop, kernel
    from loops.trial import elapsed
    made = []
    run = pool_calls.OpenMPRegions.run
    monkeypatch.setattr(pool_calls.OpenMPRegions, "run", lambda self, *a: made.append(a) or run(self, *a))
    if ip.get_pool().nthreads < 2 or not ip.share_openmp_threads():
        pytest.skip("one thread, or no libgomp loaded")
    k = kernel("A", Loop(0, 4))(lambda i, X: None)
    X = np.zeros(4)
    assert elapsed(k, (X,), "cpu") >= 0 and not made
    assert elapsed(k, (X,), "wall") >= 0 and made
