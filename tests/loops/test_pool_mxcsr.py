"""Every thread of a pool region runs under the caller's floating-point control (x86 MXCSR:
FTZ/DAZ and the rounding mode; AArch64 FPCR under qemu), whatever its workers had when they
started: one call's rows never flush or round differently depending on the thread that ran them."""
import ctypes

import numpy as np
import pytest

import tppasm
from isa.cpu import host
from isa.pool import Pool
from loops import Loop, kernel
from tests.mxcsr import DEFAULT, mxcsr

X86 = host().arch == "x86_64"
FTZ_DAZ = DEFAULT | 1 << 15 | 1 << 6
ROUND_UP, ROUND_ZERO = DEFAULT | 2 << 13, DEFAULT | 3 << 13
FLAGS = 0x3F                    # the sticky exception flags (a thread's own)
ROWS, COLS = 8, 64
DENORMAL = np.float32(1e-39)
x86_only = pytest.mark.skipif(not X86, reason="MXCSR is x86's; the AArch64 pool is tested under qemu below")


def _read_function():
    """A region function: out[tid] = this thread's MXCSR."""
    from isa.x86 import Function, eax, rax, rsp
    read = Function("read_mxcsr", ["ptr", "i64", "i64"])
    out, tid, _ = read.args
    read.stack(16)
    read.asm.stmxcsr([rsp])
    read.asm.mov(eax, [rsp])
    read.asm.mov([out + tid * 8], rax)
    return read.finalize()


READ = _read_function() if X86 else None


@pytest.fixture
def pool():
    p = Pool(2, spin_us=0)      # tid 1 always runs on the worker thread
    yield p
    p.close()


def threads_mxcsr(pool):
    """Each thread's MXCSR control bits inside one region of ``pool``."""
    seen = (ctypes.c_int64 * pool.nthreads)()
    pool.run(READ.address, ctypes.addressof(seen))
    return [v & ~FLAGS for v in seen]


@x86_only
@pytest.mark.parametrize("started_under", [DEFAULT, FTZ_DAZ], ids=["started-default", "started-ftz-daz"])
def test_every_thread_runs_under_the_callers_mxcsr(pool, started_under):
    with mxcsr(started_under):
        assert threads_mxcsr(pool) == [started_under] * 2      # the worker starts here, inheriting it
    for value in (FTZ_DAZ, ROUND_UP, ROUND_ZERO, DEFAULT, started_under):
        with mxcsr(value):
            seen = threads_mxcsr(pool)
        assert seen == [value] * 2, [hex(v) for v in seen]


def _row_nest(pool):
    add = tppasm.binary("add", 1, COLS)

    @kernel("A", Loop(0, ROWS), pool=pool)
    def nest(i, X, Y, Z):
        add(X[i:i + 1], Y[i:i + 1], Z[i:i + 1])
    return nest


def _rows(x, y, control, run):
    """Z = X + Y (row by row, by ``run``) under ``control``; compared only after MXCSR is restored
    (NumPy under DAZ would read denormals as 0)."""
    X, Y = np.full((ROWS, COLS), x, np.float32), np.full((ROWS, COLS), y, np.float32)
    Z = np.full((ROWS, COLS), -1, np.float32)
    with mxcsr(control):
        run(X, Y, Z)
    return Z


CASES = [  # x, y, control, every row's expected value
    pytest.param(DENORMAL, 0, FTZ_DAZ, 0.0, id="ftz-daz"),
    pytest.param(DENORMAL, 0, DEFAULT, DENORMAL, id="denormal-kept"),
    pytest.param(1, 2.0 ** -30, ROUND_UP, 1 + 2.0 ** -23, id="round-up"),
    pytest.param(1, 2.0 ** -30, DEFAULT, 1.0, id="nearest"),
    pytest.param(1, -2.0 ** -30, ROUND_ZERO, 1 - 2.0 ** -24, id="round-zero"),
    pytest.param(1, -2.0 ** -30, DEFAULT, 1.0, id="nearest-below"),
]


@x86_only
@pytest.mark.parametrize("x, y, control, want", CASES)
def test_nest_rows_all_flush_or_round_alike(pool, x, y, control, want):
    nest = _row_nest(pool)
    _rows(1, 1, DEFAULT, nest)                       # the worker started under the default
    Z = _rows(x, y, control, nest)
    assert (Z == np.float32(want)).all(), Z[:, 0].tolist()


@x86_only
@pytest.mark.parametrize("x, y, control, want", CASES)
def test_run_native_shares_flush_or_round_alike(pool, x, y, control, want):
    add = tppasm.binary("add", ROWS // 2, COLS)       # as tppasm.fc: one share of rows per thread

    def run(X, Y, Z):
        half = ROWS // 2
        pool.run_native([[add.raw_call(X[:half], Y[:half], Z[:half])],
                         [add.raw_call(X[half:], Y[half:], Z[half:])]])
    _rows(1, 1, FTZ_DAZ, run)                        # the worker started under FTZ/DAZ
    Z = _rows(x, y, control, run)
    assert (Z == np.float32(want)).all(), Z[:, 0].tolist()


# -- AArch64: the same protocol under qemu-aarch64 (FPCR: FZ is bit 24, RMode bits 22-23) --------------
FPCR_FZ_UP = 1 << 24 | 1 << 22


def _read_fpcr_fn():
    from isa.aarch64 import Assembler, mem, x
    a = Assembler()                                  # region: out[tid] = this thread's FPCR
    a.mrs(x[9], "fpcr")
    a.str(x[9], mem(x[0], x[1], lsl=3))
    a.ret()
    return a.code()


def test_aarch64_workers_take_the_callers_fpcr():
    from isa.aarch64.emulate import qemu_skip_reason
    if qemu_skip_reason():
        pytest.skip(qemu_skip_reason())
    from isa.aarch64 import x
    from isa.aarch64.elf import DATA_BASE
    from tests.aarch64.test_pool_aarch64 import PoolProgram
    prog = PoolProgram(2, 0, bytes(32))              # out[0:2]: region 1, out[2:4]: region 2
    fn, s = prog.code(_read_fpcr_fn()), prog.stub
    prog.call("run", DATA_BASE + prog.state, fn, DATA_BASE)          # the workers started with FPCR 0
    s.mov_imm(x[9], FPCR_FZ_UP)
    s.msr("fpcr", x[9])
    prog.call("run", DATA_BASE + prog.state, fn, DATA_BASE + 16)
    assert prog.run().view(np.int64).tolist() == [0, 0, FPCR_FZ_UP, FPCR_FZ_UP]
