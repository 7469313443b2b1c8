"""isa.pool.share_openmp_threads: tables of native calls (tppasm.fc's products) made on the threads
of the GNU OpenMP runtime torch loaded, every list of calls once whatever team libgomp gives,
under the caller's MXCSR, each thread's own MXCSR given back; never in a forked child."""
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
    regions = pool_calls.openmp_regions(ip._shared_code()["rawcall"].address)
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


@pytest.mark.parametrize("lists, team", [(2, None), (3, 2), (3, 1), (2, 4)])
def test_every_list_runs_once_whatever_the_team(openmp, lists, team):
    out = (ctypes.c_uint64 * 16)()
    table, n = _table(lists, out)
    openmp.run(table.buffer_info()[0], n, team)
    assert all(out[i] for i in range(lists)) and not any(out[i] for i in range(lists, 8))
    tids = {out[8 + i] for i in range(lists)}
    assert len(tids) == min(lists, team or lists)          # one thread per team member


@pytest.mark.parametrize("control", [FTZ_DAZ, DEFAULT | 2 << 13, DEFAULT], ids=["ftz-daz", "round-up", "default"])
def test_lists_run_under_the_callers_mxcsr_and_threads_get_theirs_back(openmp, control):
    before = openmp_threads_mxcsr()
    out = (ctypes.c_uint64 * 16)()
    table, n = _table(2, out)
    with mxcsr(control):
        openmp.run(table.buffer_info()[0], n)
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
