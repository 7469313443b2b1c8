"""The AArch64 thread pool (isa/aarch64/pool_code.py) under qemu-aarch64, with real threads.

One static ELF per case: the data segment holds the test's data, the pool state (filled as
``Pool._start`` does), a count of live workers and the workers' stacks. The entry stub starts
T-1 workers with the raw ``clone`` system call (each runs ``worker(rec)`` on its own stack, then
decrements the live count and calls ``exit``), runs regions on the main thread (tid 0), calls
``quit``, waits for the live count to reach 0, writes the test's data to stdout and calls
``exit_group``. qemu-user runs guest threads as host threads, so regions and barriers really
race; the checks count, they never time.
"""
import os

import numpy as np
import pytest

from isa.aarch64 import Assembler, Function, Label, mem, x, xzr
from isa.aarch64.elf import DATA_BASE
from loops.nest_plan import Layout
from isa.pool_state import (CALLER_CPU, MASK_BYTES, NTHREADS, RAW_COUNT, RAW_LIST_SIZE, RAW_LISTS, RAW_RECORD_SIZE, RECORD_SIZE, RECORDS,
                            SPIN, state_size)
from isa.aarch64.pool_code import code as pool_code
from loops.spec import parse

from .marks import needs_qemu
from .test_nest_aarch64 import (CASES, GEMM_LOOPS, check_recorded, link, nest_image, read_arrays, run_elf,
                                store_addresses, write_and_exit)

pytestmark = needs_qemu

SYS_CLONE, SYS_EXIT, SYS_EXIT_GROUP = 220, 93, 94
# CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM: a thread
CLONE_THREAD_FLAGS = 0x100 | 0x200 | 0x400 | 0x800 | 0x10000 | 0x40000
STACK = 32 * 1024
MAX_THREADS = 8
SPINS = [0, 1000]                   # 0: every wait sleeps on the futex


def _align(n, a):
    return (n + a - 1) // a * a


class PoolProgram:
    """A static ELF around the pool: data = the test's ``image`` | pool state | live count | stacks.

    Emit the main thread's regions with :meth:`call` (``self.stub``, ``self.state``), then
    :meth:`run` returns the ``image`` part of the data as left in memory.
    """

    def __init__(self, nthreads, spin, image):
        self.nthreads, self.out_len = nthreads, len(image)
        self.state = _align(len(image), 4096)
        self.alive = self.state + _align(state_size(nthreads), 64)
        stacks = self.alive + 64
        self.image = np.zeros(stacks + STACK * nthreads, np.uint8)
        self.image[:len(image)] = np.frombuffer(bytes(image), np.uint8)
        self.stack_top = [DATA_BASE + stacks + STACK * (t + 1) for t in range(nthreads)]
        self.word(self.state + NTHREADS, nthreads)
        self.word(self.state + SPIN, spin)
        self.word(self.alive, nthreads - 1)
        for tid in range(1, nthreads):
            self.word(self.record(tid), DATA_BASE + self.state)
            self.word(self.record(tid) + 8, tid)   # initial generation: 0
        self.stub, self.blobs, self.labels = Assembler(), [], []
        blob, self.entries = pool_code()
        self.pool = self.code(blob)
        self.fail, self.child = Label("fail"), Label("child")
        self._start_workers()

    def word(self, offset, value):
        """Store the int64 ``value`` at ``offset`` of the data segment (before the program starts)."""
        self.image[offset:offset + 8] = np.frombuffer(int(value).to_bytes(8, "little", signed=True), np.uint8)

    def record(self, tid):
        return self.state + RECORDS + RECORD_SIZE * tid

    def code(self, blob):
        """A label at which ``blob`` (position-independent code) is placed."""
        self.labels.append(self.stub.label())
        self.blobs.append(blob)
        return self.labels[-1]

    def address(self, reg, target):
        """reg = a code address: a label, or the name of a pool function."""
        if isinstance(target, str):
            self.stub.adr(reg, self.pool)
            self.stub.add(reg, reg, self.entries[target])
        else:
            self.stub.adr(reg, target)

    def call(self, target, *args):
        """Call ``target`` (see :meth:`address`) with int or label arguments."""
        for reg, arg in zip(x, args):
            if isinstance(arg, Label):
                self.address(reg, arg)
            else:
                self.stub.mov_imm(reg, arg)
        self.address(x[16], target)
        self.stub.blr(x[16])

    def _start_workers(self):
        s = self.stub
        for tid in range(1, self.nthreads):
            s.mov_imm(x[19], DATA_BASE + self.record(tid))    # the child keeps its registers
            for reg, value in zip(x, (CLONE_THREAD_FLAGS, self.stack_top[tid], 0, 0, 0)):
                s.mov_imm(reg, value)
            s.movz(x[8], SYS_CLONE)
            s.svc(0)
            s.cbz(x[0], self.child)
            s.cmp(x[0], 0)
            s.b_lt(self.fail)

    def _finish(self):
        s = self.stub
        self.call("quit", DATA_BASE + self.state)
        wait = s.label("wait")
        s.mov_imm(x[9], DATA_BASE + self.alive)
        s.bind(wait)
        s.yield_()
        s.ldar(x[10], mem(x[9]))
        s.cbnz(x[10], wait)
        write_and_exit(s, self.out_len, SYS_EXIT_GROUP)
        s.bind(self.fail)                      # clone failed: status 1
        s.movz(x[0], 1)
        s.movz(x[8], SYS_EXIT_GROUP)
        s.svc(0)
        s.bind(self.child)                     # a worker thread: worker(rec), then leave
        s.mov(x[0], x[19])
        self.call("worker")
        s.mov_imm(x[9], DATA_BASE + self.alive)
        s.mov_imm(x[10], -1)
        s.ldaddal(x[10], x[11], mem(x[9]))
        s.movz(x[0], 0)
        s.movz(x[8], SYS_EXIT)
        s.svc(0)

    def run(self):
        self._finish()
        out = run_elf(link(self.stub, self.labels, self.blobs), self.image.tobytes())
        return np.frombuffer(out, np.uint8)[:self.out_len]


def repeat(s, count, body):
    """Emit ``for x23 in range(count): body()`` (x23 is callee-saved: calls keep it)."""
    top = s.label("repeat")
    s.mov(x[23], xzr)
    s.bind(top)
    body()
    s.add(x[23], x[23], 1)
    s.cmp(x[23], count)
    s.b_lt(top)


# -- (a) every tid once per region ---------------------------------------------------------------
REGION, EXPECT_T, HITS, ERRORS = 0, 8, 16, 16 + 8 * MAX_THREADS


def count_fn():
    """fn(args, tid, T): hits[tid] must equal the region number and T the expected count (else
    errors[tid] += 1); then hits[tid] += 1. A tid run twice or skipped in a region trips it."""
    a = Assembler()
    bad, ok = a.label("bad"), a.label("ok")
    a.ldr(x[9], mem(x[0], REGION))
    a.ldr(x[10], mem(x[0], EXPECT_T))
    a.add(x[11], x[0], HITS)
    a.add(x[12], x[0], ERRORS)
    a.ldr(x[13], mem(x[11], x[1], lsl=3))
    a.cmp(x[13], x[9])
    a.b_ne(bad)
    a.cmp(x[2], x[10])
    a.b_ne(bad)
    a.bind(ok)
    a.add(x[13], x[13], 1)
    a.str(x[13], mem(x[11], x[1], lsl=3))
    a.ret()
    a.bind(bad)
    a.ldr(x[14], mem(x[12], x[1], lsl=3))
    a.add(x[14], x[14], 1)
    a.str(x[14], mem(x[12], x[1], lsl=3))
    a.b(ok)
    return a.code()


@pytest.mark.parametrize("spin", SPINS)
@pytest.mark.parametrize("nthreads", [1, 2, 3, 4])
def test_each_tid_once_per_region(nthreads, spin):
    regions = 200
    args = np.zeros(2 + 2 * MAX_THREADS, np.int64)
    args[EXPECT_T // 8] = nthreads
    prog = PoolProgram(nthreads, spin, args.tobytes())
    fn, s = prog.code(count_fn()), prog.stub

    def region():
        s.mov_imm(x[9], DATA_BASE + REGION)
        s.str(x[23], mem(x[9]))              # published to the workers by run's generation bump
        prog.call("run", DATA_BASE + prog.state, fn, DATA_BASE)
    repeat(s, regions, region)
    out = prog.run().view(np.int64)
    hits, errors = out[HITS // 8:ERRORS // 8], out[ERRORS // 8:]
    assert hits.tolist() == [regions] * nthreads + [0] * (MAX_THREADS - nthreads)
    assert not errors.any()


# -- (b) barriers order phases -------------------------------------------------------------------
BFN, BSTATE, PREGION, ROUNDS, BUF, SEEN = 0, 8, 16, 24, 32, 32 + 16 * MAX_THREADS


def phases_fn():
    """fn(args, tid, T): for each round k: buf[k % 2][tid] = stamp(k, tid); barrier; count the j < T
    with buf[k % 2][j] == stamp(k, j) into seen[tid]. stamp = (region * rounds + k) * 8 + j + 1, so
    stale or missing values do not count. Two buffers: a thread one round ahead writes the other."""
    f = Function(nargs=3)
    a = f.asm
    arg, tid, nt, k, stamp0, j, good, buf, stamp = (x[n] for n in range(19, 28))
    a.mov(arg, x[0])
    a.mov(tid, x[1])
    a.mov(nt, x[2])
    a.ldr(stamp0, mem(arg, PREGION))
    a.ldr(x[9], mem(arg, ROUNDS))
    a.mul(stamp0, stamp0, x[9])
    a.mov(good, xzr)
    a.mov(k, xzr)
    round_, check, skip = a.label("round"), a.label("check"), a.label("skip")
    a.bind(round_)
    a.and_(x[9], k, 1)
    a.lsl(x[9], x[9], 6)                                    # * 8 * MAX_THREADS bytes
    a.add(x[9], x[9], arg)
    a.add(buf, x[9], BUF)
    a.add(x[10], stamp0, k)
    a.lsl(x[10], x[10], 3)
    a.add(stamp, x[10], 1)                                  # stamp of tid 0
    a.add(x[10], stamp, tid)
    a.str(x[10], mem(buf, tid, lsl=3))
    a.ldr(x[0], mem(arg, BSTATE))
    a.mov(x[1], tid)
    a.ldr(x[16], mem(arg, BFN))
    a.blr(x[16])
    a.mov(j, xzr)
    a.bind(check)
    a.ldr(x[10], mem(buf, j, lsl=3))
    a.add(x[11], stamp, j)
    a.cmp(x[10], x[11])
    a.b_ne(skip)
    a.add(good, good, 1)
    a.bind(skip)
    a.add(j, j, 1)
    a.cmp(j, nt)
    a.b_lt(check)
    a.add(k, k, 1)
    a.ldr(x[9], mem(arg, ROUNDS))
    a.cmp(k, x[9])
    a.b_lt(round_)
    a.add(x[9], arg, SEEN)
    a.ldr(x[10], mem(x[9], tid, lsl=3))
    a.add(x[10], x[10], good)
    a.str(x[10], mem(x[9], tid, lsl=3))
    return f.code()


@pytest.mark.parametrize("spin", SPINS)
@pytest.mark.parametrize("nthreads", [1, 2, 3, 4])
def test_barriers_order_phases(nthreads, spin):
    regions, rounds = 10, 30
    args = np.zeros(SEEN // 8 + MAX_THREADS, np.int64)
    args[ROUNDS // 8] = rounds
    prog = PoolProgram(nthreads, spin, args.tobytes())
    prog.word(BSTATE, DATA_BASE + prog.state)
    fn, s = prog.code(phases_fn()), prog.stub
    prog.address(x[9], "barrier")
    s.mov_imm(x[10], DATA_BASE + BFN)
    s.str(x[9], mem(x[10]))

    def region():
        s.mov_imm(x[9], DATA_BASE + PREGION)
        s.str(x[23], mem(x[9]))
        prog.call("run", DATA_BASE + prog.state, fn, DATA_BASE)
    repeat(s, regions, region)
    seen = prog.run().view(np.int64)[SEEN // 8:]
    assert seen.tolist() == [regions * rounds * nthreads] * nthreads + [0] * (MAX_THREADS - nthreads)


# -- (c) rawcall: the region of Pool.run_native ---------------------------------------------------
def args_stub():
    """fn(slots, a1, ..., a5): slots[a1] = a1 + 2 a2 + 3 a3 + 4 a4 + 5 a5."""
    a = Assembler()
    a.mov(x[9], xzr)
    for weight in range(1, 6):
        for _ in range(weight):
            a.add(x[9], x[9], x[weight])
    a.str(x[9], mem(x[0], x[1], lsl=3))
    a.ret()
    return a.code()


@pytest.mark.parametrize("nthreads, shares", [(1, 1), (2, 2), (3, 2), (4, 4)])
def test_rawcall_makes_each_threads_calls_in_order(nthreads, shares):
    """Share s holds s + 1 calls writing slots 8 s + i; the table is laid out as Pool.run_native does."""
    slots, records = 0, 8 * 32
    lists = records + RAW_RECORD_SIZE * 16
    data = np.zeros((lists + RAW_LISTS + RAW_LIST_SIZE * MAX_THREADS) // 8, np.int64)
    data[(lists + RAW_COUNT) // 8] = shares
    r = 0
    for share in range(shares):
        data[(lists + RAW_LISTS + RAW_LIST_SIZE * share) // 8:][:2] = DATA_BASE + records + RAW_RECORD_SIZE * r, share + 1
        for i in range(share + 1):
            data[(records + RAW_RECORD_SIZE * r) // 8:][1:7] = DATA_BASE + slots, 8 * share + i, 1, 2, 3, 4
            r += 1
    prog = PoolProgram(nthreads, 100, data.tobytes())
    s = prog.stub
    prog.address(x[9], prog.code(args_stub()))
    for i in range(r):
        s.mov_imm(x[10], DATA_BASE + records + RAW_RECORD_SIZE * i)
        s.str(x[9], mem(x[10]))
    s.mov_imm(x[0], DATA_BASE + prog.state)
    prog.address(x[1], "rawcall")
    s.mov_imm(x[2], DATA_BASE + lists)
    prog.address(x[16], "run")
    s.blr(x[16])
    out = prog.run().view(np.int64)[:32]
    expect = np.zeros(32, np.int64)
    for share in range(shares):
        expect[8 * share:8 * share + share + 1] = np.arange(share + 1) + 8 * share + 40
    assert out.tolist() == expect.tolist()


# -- (c') a woken worker leaves the caller's CPU -----------------------------------------------------
WAS, PINNED_CPU, MOVED_CPU, FULL, PINNED, PINNED_MASK, MOVED_MASK = 0, 8, 16, 64, 192, 320, 448
SYS_GETCPU, SYS_SETAFFINITY, SYS_GETAFFINITY = 168, 122, 123


def _mask(cpus):
    bits = np.zeros(MASK_BYTES * 8, np.uint8)
    bits[list(cpus)] = 1
    return np.packbits(bits, bitorder="little")


def _cpus(mask):
    return set(np.flatnonzero(np.unpackbits(mask, bitorder="little")).tolist())


def test_leave_cpu_moves_a_thread_off_the_callers_cpu():
    """leave_cpu on the main thread of a qemu process: pinned to one CPU it stays there; with its
    whole mask and CALLER_CPU its own CPU, it moves to another CPU and keeps the mask."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    image = np.zeros(MOVED_MASK + MASK_BYTES, np.uint8)
    image[FULL:FULL + MASK_BYTES], image[PINNED:PINNED + MASK_BYTES] = _mask(cpus), _mask(cpus[:1])
    prog = PoolProgram(1, 100, image.tobytes())
    s = prog.stub

    def syscall(number, *args):
        for reg, arg in zip(x, args):
            s.mov_imm(reg, arg)
        s.movz(x[8], number)
        s.svc(0)

    def leave_from(mask, cpu_slot, mask_slot):
        syscall(SYS_SETAFFINITY, 0, MASK_BYTES, DATA_BASE + mask)
        syscall(SYS_GETCPU, DATA_BASE + WAS, 0, 0)
        s.mov_imm(x[9], DATA_BASE + WAS)
        s.ldr(x[10], mem(x[9]))
        s.mov_imm(x[9], DATA_BASE + prog.state + CALLER_CPU)
        s.str(x[10], mem(x[9]))                 # CALLER_CPU: this CPU (and the u32 after it: 0)
        prog.call("leave_cpu", DATA_BASE + prog.state)
        syscall(SYS_GETCPU, DATA_BASE + cpu_slot, 0, 0)
        syscall(SYS_GETAFFINITY, 0, MASK_BYTES, DATA_BASE + mask_slot)
    leave_from(PINNED, PINNED_CPU, PINNED_MASK)
    leave_from(FULL, MOVED_CPU, MOVED_MASK)
    out = prog.run()
    word = out[:24].view(np.int64)
    assert word[PINNED_CPU // 8] == cpus[0] and _cpus(out[PINNED_MASK:][:MASK_BYTES]) == {cpus[0]}
    assert word[MOVED_CPU // 8] != word[WAS // 8] and _cpus(out[MOVED_MASK:][:MASK_BYTES]) == set(cpus)


# -- (d) AArch64 loop nests on the pool ----------------------------------------------------------
def run_on_pool(spec_text, loops, body, arrays, nthreads, spin=100):
    """Like :func:`tests.aarch64.test_nest_aarch64.run_nest`, but one region on the pool: every
    thread runs ``nest(ctx, tid, T)`` at the same time; barriers are the pool's."""
    img = nest_image(spec_text, loops, body, arrays, nthreads)
    prog = PoolProgram(img.nthreads, spin, img.image)
    prog.word(Layout.BARRIER_STATE, DATA_BASE + prog.state)
    nest = prog.code(img.nest)
    store_addresses(prog.stub, [prog.code(blob) for blob in img.blobs], img.slots)
    prog.address(x[9], "barrier")
    prog.stub.mov_imm(x[10], DATA_BASE + Layout.BARRIER_FN)
    prog.stub.str(x[9], mem(x[10]))
    prog.call("run", DATA_BASE + prog.state, nest, DATA_BASE)
    out = prog.run()
    read_arrays(out.tobytes(), arrays, img.offsets)


NEST_CASES = [(spec, loops) for spec, loops, _, _ in CASES if parse(spec, len(loops)).mode != "serial"]
NEST_CASES += [("aB{R:2}C{C:2}", GEMM_LOOPS), ("ABC|@schedule(dynamic,1)", GEMM_LOOPS)]


@pytest.mark.parametrize("spec_text,loops", NEST_CASES, ids=[c[0] for c in NEST_CASES])
def test_nest_on_pool_each_iteration_once(spec_text, loops):
    check_recorded(spec_text, loops, 4, runner=run_on_pool)
