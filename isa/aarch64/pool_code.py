"""Machine code of the native thread pool for AArch64 (AAPCS64, Linux): the same seven functions,
state layout (:mod:`isa.pool_state`) and protocol as the x86-64 pool.

- ``worker(rec)``, ``run(state, fn, arg)``, ``barrier(state, tid)``, ``quit(state)``, ``spin(n)``,
  ``rawcall(table, tid, nthreads)``, ``leave_cpu(state)``: see :mod:`isa.x86.pool_code`. Waits spin
  ``SPIN`` iterations of ``yield`` (a ``sched_yield`` every ``YIELD_EVERY``), then sleep on a futex
  (``svc #0``, x8 = 98); a waker calls ``FUTEX_WAKE`` only when a sleeper announced itself, and
  ``run`` then records its CPU and yields so that a worker woken there moves away (a new worker
  also moves off the CPU the pool was started from). One difference: ``SPIN`` = 0 sleeps at once
  here (the x86 counter would wrap; the pool stores >= 1). As MXCSR there, the caller's FPCR (FZ,
  RMode) goes with the region (``FP_CONTROL``) and every worker loads it before its share.

Memory ordering. Every read-modify-write is an LSE atomic with acquire and release semantics
(``ldaddal``, ``swpal``, always with a real destination register: with wzr the load would lose
its acquire semantics), and every read that waits for another thread's write is ``ldar``:

- publishing: ``run`` stores FN, ARG, FP_CONTROL and REMAIN, then bumps GEN with a release; a
  worker reads GEN with an acquire before it reads them. A worker's region writes are released by its REMAIN
  decrement and acquired by the caller's ``ldar`` that sees 0; barriers likewise (BCOUNT, BGEN).
- no lost wake-up (Dekker): a sleeper announces itself with a RMW, then re-reads the word; a waker
  changes the word with a RMW, then reads the sleeper count. The RMW's store is a release and the
  re-read an acquire (``ldar``), and AArch64 keeps a release followed by an acquire in order
  (RCsc), so at least one side sees the other's write, as the x86 locked instructions guarantee.
- plain stores (BCOUNT = 0, QUIT = 1, CALLER_SLEEPS = 0) reach the other threads before the
  release RMW that follows them, as x86 keeps stores in order.

A system call keeps every register but x0. ``code()`` gives position-independent bytes for the
emulator tests (``tests/aarch64/test_pool_aarch64.py``); ``build()`` maps them executable on an
AArch64 host.

>>> blob, entries = code()
>>> sorted(entries), len(blob) % 64
(['barrier', 'leave_cpu', 'quit', 'rawcall', 'run', 'spin', 'worker'], 0)
"""
from isa.aarch64 import LSL, Function, disassemble, mem, sp, w, wzr, x, xzr
from isa.x86.function import JitFunction      # ExecutableMemory + ctypes: nothing x86-specific

from ..pool_state import (ARG, BCOUNT, BGEN, BSLEEPERS, CALLER_CPU, CALLER_SLEEPS, FN, FP_CONTROL,
                        FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE, GEN, MASK_BYTES, NTHREADS, QUIT, RAW_COUNT,
                        RAW_LISTS, RAW_RECORD_SIZE, REMAIN, SLEEPERS, SPIN, WAKE_ALL, YIELD_EVERY)

SYS_FUTEX = 98
SYS_SCHED_SETAFFINITY, SYS_SCHED_GETAFFINITY, SYS_SCHED_YIELD, SYS_GETCPU = 122, 123, 124, 168
LEAVE_STACK = 16 + 2 * MASK_BYTES      # _leave_callers_cpu's frame: the CPU, the mask, the narrowed mask
SEEN = w[9]           # the value a wait just read
WORD = x[10]          # address of the futex word being waited on or woken
SIGNATURES = {"worker": (["ptr"], "ptr"), "run": (["ptr", "ptr", "ptr"], None),
              "barrier": (["ptr", "i64"], None), "quit": (["ptr"], None), "spin": (["i64"], None),
              "rawcall": (["ptr", "i64", "i64"], None), "leave_cpu": (["ptr"], None)}


def _futex(a, op, value):
    """futex(WORD, op, value, NULL); clobbers x0-x3 and x8."""
    a.mov(x[0], WORD)
    a.mov_imm(x[1], op)
    if isinstance(value, int):
        a.mov_imm(x[2], value)
    else:
        a.mov(w[2], value)
    a.mov(x[3], xzr)
    a.movz(x[8], SYS_FUTEX)
    a.svc(0)


def _syscall(a, number):
    a.movz(x[8], number)
    a.svc(0)


def _sched_yield_every(a, budget, again):
    """Every YIELD_EVERY iterations of a wait's spin (``budget`` counting down), ``sched_yield``;
    then branch to ``again``. Clobbers x0 and x8."""
    a.tst(budget, YIELD_EVERY - 1)
    a.b_ne(again)
    _syscall(a, SYS_SCHED_YIELD)
    a.b(again)


def _leave_callers_cpu(a, state):
    """A worker on CALLER_CPU (woken from there, or started) moves to another CPU it may use: its
    affinity mask narrowed to exclude that CPU, then restored (see :mod:`isa.x86.pool_code`).
    Frame: [sp] the CPU, [sp + 16] the mask, [sp + 16 + MASK_BYTES] the narrowed one
    (LEAVE_STACK bytes). Clobbers x0-x3, x8, x11-x15."""
    stay = a.label("stay")
    cpu, length, narrowed = x[14], x[15], x[13]
    a.mov(x[0], sp)
    a.mov(x[1], xzr)
    a.mov(x[2], xzr)
    _syscall(a, SYS_GETCPU)
    a.cbnz(x[0], stay)
    a.ldr(w[14], mem(sp))
    a.ldr(w[11], mem(state, CALLER_CPU))
    a.cmp(w[14], w[11])
    a.b_ne(stay)
    a.mov(x[0], xzr)
    a.mov_imm(x[1], MASK_BYTES)
    a.add(x[2], sp, 16)
    _syscall(a, SYS_SCHED_GETAFFINITY)              # the bytes written: the kernel's mask size
    a.cmp(x[0], xzr)
    a.b_le(stay)
    a.mov(length, x[0])
    for offset in range(16, 16 + MASK_BYTES, 16):
        a.ldp(x[11], x[12], mem(sp, offset))
        a.stp(x[11], x[12], mem(sp, offset + MASK_BYTES))
    a.add(narrowed, sp, 16 + MASK_BYTES)
    a.lsr(x[11], cpu, 6)                             # the mask's word of bit cpu
    a.movz(x[12], 1)
    a.lsl(x[12], x[12], cpu)                         # lslv: the shift is cpu mod 64
    a.ldr(x[0], mem(narrowed, x[11], lsl=3))
    a.orr(x[0], x[0], x[12])
    a.eor(x[0], x[0], x[12])                         # the bit cleared
    a.str(x[0], mem(narrowed, x[11], lsl=3))
    a.mov(x[0], xzr)
    a.mov(x[1], length)
    a.mov(x[2], narrowed)
    _syscall(a, SYS_SCHED_SETAFFINITY)
    a.cbnz(x[0], stay)                               # refused (no other CPU allowed): stay
    a.mov(x[1], length)
    a.add(x[2], sp, 16)
    _syscall(a, SYS_SCHED_SETAFFINITY)
    a.bind(stay)


def _fetch_add(a, state, field, value, old):
    """old = the u32 at state+field, which becomes old + value (ldaddal); clobbers x11, x12."""
    a.add(x[11], state, field)
    a.mov_imm(x[12], value)
    a.ldaddal(w[12], old, mem(x[11]))


def _load_acquire(a, dst, state, field):
    """dst = the u32 at state+field (ldar); clobbers x11."""
    a.add(x[11], state, field)
    a.ldar(dst, mem(x[11]))


def _wait(a, budget, ready, announce, retire, on_wake=None):
    """Spin ``budget`` iterations, then sleep on the u32 at WORD, until ``ready(label)`` branches.

    ``ready`` emits a branch to its label when SEEN (just read with ``ldar``) is the awaited value;
    ``announce``/``retire`` emit the sleeper's announcement and its withdrawal. ``budget`` and the
    registers ``ready`` reads must survive a system call and the helpers (not x0-x3, x8-x12).
    """
    spin, asleep, sleep, woke, done = (a.label(n) for n in ("spin", "asleep", "sleep", "woke", "done"))
    a.bind(spin)
    a.ldar(SEEN, mem(WORD))
    ready(done)
    a.cbz(budget, asleep)
    a.sub(budget, budget, 1)
    a.yield_()
    _sched_yield_every(a, budget, spin)
    a.bind(asleep)
    announce()
    a.bind(sleep)
    a.ldar(SEEN, mem(WORD))                # after the announcing release: Dekker's re-read
    ready(woke)
    _futex(a, FUTEX_WAIT_PRIVATE, SEEN)
    a.b(sleep)                             # woken, EAGAIN or EINTR: look again
    a.bind(woke)
    retire()
    if on_wake:
        on_wake()
    a.bind(done)


def _wait_change(a, state, field, seen, budget, sleepers, on_wake=None):
    """Wait until the u32 at state+field != ``seen``; leaves the new value in SEEN."""
    def ready(label):
        a.cmp(SEEN, seen)
        a.b_ne(label)
    a.add(WORD, state, field)
    a.ldr(budget, mem(state, SPIN))
    _wait(a, budget, ready, lambda: _fetch_add(a, state, sleepers, 1, w[12]),
          lambda: _fetch_add(a, state, sleepers, -1, w[12]), on_wake)


def _wake_if_sleepers(a, state, field, sleepers, count, skip, first=None):
    """FUTEX_WAKE ``count`` sleepers of state+field (``first()`` emitted before it), or branch to
    ``skip`` when the u32 at state+sleepers is 0."""
    _load_acquire(a, w[11], state, sleepers)    # after the waker's release RMW: Dekker's read
    a.cbz(w[11], skip)
    if first:
        first()
    a.add(WORD, state, field)
    _futex(a, FUTEX_WAKE_PRIVATE, count)


def _worker():
    f = Function(nargs=1, frame=LEAVE_STACK)
    a, (rec,) = f.asm, f.args
    state, tid, seen, budget = x[19], x[20], w[21], x[22]
    a.ldr(state, mem(rec))
    a.ldr(tid, mem(rec, 8))
    a.ldr(seen, mem(rec, 16))
    _leave_callers_cpu(a, state)                 # started on the CPU of the thread that started it
    wait, exit_ = a.label("wait"), a.label("exit")
    a.bind(wait)
    _wait_change(a, state, GEN, seen, budget, SLEEPERS, lambda: _leave_callers_cpu(a, state))
    a.mov(seen, SEEN)
    a.ldr(w[9], mem(state, QUIT))
    a.cbnz(w[9], exit_)
    a.ldr(x[9], mem(state, FP_CONTROL))
    a.msr("fpcr", x[9])                          # the caller's FZ and rounding mode
    a.ldr(x[0], mem(state, ARG))
    a.mov(x[1], tid)
    a.ldr(x[2], mem(state, NTHREADS))
    a.ldr(x[16], mem(state, FN))
    a.blr(x[16])
    _fetch_add(a, state, REMAIN, -1, w[9])      # releases the region's writes to the caller
    a.cmp(w[9], 1)
    a.b_ne(wait)                                 # not the last one
    _wake_if_sleepers(a, state, REMAIN, CALLER_SLEEPS, 1, wait)
    a.b(wait)
    a.bind(exit_)
    a.mov(x[0], xzr)
    return f.code()


def _call(a, fn, arg, nthreads):
    """fn(arg, 0, nthreads): tid 0 is the caller."""
    a.mov(x[0], arg)
    a.mov(x[1], xzr)
    if isinstance(nthreads, int):
        a.movz(x[2], nthreads)
    else:
        a.ldr(x[2], nthreads)
    a.blr(fn)


def _run():
    f = Function(nargs=3)
    a = f.asm
    state, fn, arg, budget = x[19], x[20], x[21], x[22]
    for dst, src in zip((state, fn, arg), f.args):
        a.mov(dst, src)
    solo, call0, done = a.label("solo"), a.label("call0"), a.label("done")
    a.ldr(x[9], mem(state, NTHREADS))
    a.cmp(x[9], 1)
    a.b_le(solo)
    a.str(fn, mem(state, FN))
    a.str(arg, mem(state, ARG))
    a.sub(w[9], w[9], 1)
    a.str(w[9], mem(state, REMAIN))
    a.mrs(x[9], "fpcr")
    a.str(x[9], mem(state, FP_CONTROL))
    _fetch_add(a, state, GEN, 1, w[9])          # releases FN/ARG/FP_CONTROL/REMAIN to the workers
    def record_cpu():                           # for _leave_callers_cpu
        a.add(x[0], state, CALLER_CPU)
        a.mov(x[1], xzr)
        a.mov(x[2], xzr)
        _syscall(a, SYS_GETCPU)
    _wake_if_sleepers(a, state, GEN, SLEEPERS, WAKE_ALL, call0, record_cpu)
    _syscall(a, SYS_SCHED_YIELD)                # a worker woken onto this CPU runs now, and leaves
    a.bind(call0)
    _call(a, fn, arg, mem(state, NTHREADS))
    a.add(WORD, state, REMAIN)
    a.ldr(budget, mem(state, SPIN))

    def announce():
        a.add(x[11], state, CALLER_SLEEPS)
        a.movz(w[12], 1)
        a.swpal(w[12], w[12], mem(x[11]))
    _wait(a, budget, lambda label: a.cbz(SEEN, label), announce,
          lambda: a.str(wzr, mem(state, CALLER_SLEEPS)))
    a.b(done)
    a.bind(solo)
    _call(a, fn, arg, 1)
    a.bind(done)
    return f.code()


def _barrier():
    f = Function(nargs=2)
    a = f.asm
    state, seen, budget = x[13], w[14], x[15]      # caller-saved: the barrier calls nothing
    a.mov(state, f.args[0])
    a.ldr(seen, mem(state, BGEN))       # before arriving (the arrival's release keeps it first)
    _fetch_add(a, state, BCOUNT, 1, w[9])
    a.add(w[9], w[9], 1)
    a.ldr(w[10], mem(state, NTHREADS))
    a.cmp(w[9], w[10])
    wait, out = a.label("wait"), a.label("out")
    a.b_ne(wait)
    a.str(wzr, mem(state, BCOUNT))     # reset before the releasing bump below
    _fetch_add(a, state, BGEN, 1, w[9])
    _wake_if_sleepers(a, state, BGEN, BSLEEPERS, WAKE_ALL, out)
    a.b(out)
    a.bind(wait)
    _wait_change(a, state, BGEN, seen, budget, BSLEEPERS)
    a.bind(out)
    return f.code()


def _quit():
    f = Function(nargs=1)
    a = f.asm
    state = x[13]
    a.mov(state, f.args[0])
    a.movz(w[9], 1)
    a.str(w[9], mem(state, QUIT))
    _fetch_add(a, state, GEN, 1, w[9])
    a.add(WORD, state, GEN)
    _futex(a, FUTEX_WAKE_PRIVATE, WAKE_ALL)
    return f.code()


def _spin():
    f = Function(nargs=1)
    a, n = f.asm, x[13]                 # not x0: a system call's result
    a.mov(n, f.args[0])
    loop, out = a.label("loop"), a.label("out")
    a.bind(loop)
    a.ldar(SEEN, mem(sp))               # the wait loops' load, so the timing matches theirs
    a.yield_()
    a.subs(n, n, 1)
    a.b_le(out)
    _sched_yield_every(a, n, loop)
    a.bind(out)
    return f.code()


def _leave_cpu():
    f = Function(nargs=1, frame=LEAVE_STACK)
    a = f.asm
    a.mov(x[19], f.args[0])
    _leave_callers_cpu(a, x[19])
    return f.code()


def _rawcall():
    f = Function(nargs=3)
    a, (table, tid, _) = f.asm, f.args
    loop, out = a.label("loop"), a.label("out")
    record, left = x[19], x[20]
    a.ldr(x[9], mem(table, RAW_COUNT))
    a.cmp(tid, x[9])
    a.b_ge(out)
    a.add(x[9], table, RAW_LISTS)
    a.add(x[9], x[9], tid, LSL(4))                # * RAW_LIST_SIZE (16)
    a.ldr(record, mem(x[9]))
    a.ldr(left, mem(x[9], 8))
    a.cbz(left, out)
    a.bind(loop)
    for n in range(6):
        a.ldr(x[n], mem(record, 8 * (n + 1)))
    a.ldr(x[9], mem(record))
    a.blr(x[9])
    a.add(record, record, RAW_RECORD_SIZE)
    a.subs(left, left, 1)
    a.b_ne(loop)
    a.bind(out)
    return f.code()


def functions():
    """{name: position-independent code bytes} of the pool's seven functions.

    >>> sorted(functions())
    ['barrier', 'leave_cpu', 'quit', 'rawcall', 'run', 'spin', 'worker']
    """
    return {"worker": _worker(), "run": _run(), "barrier": _barrier(), "quit": _quit(), "spin": _spin(),
            "rawcall": _rawcall(), "leave_cpu": _leave_cpu()}


def code():
    """The seven functions in one position-independent blob, each 64-byte aligned: (bytes, {name: offset}).

    >>> blob, entries = code()
    >>> entries["worker"], all(offset % 64 == 0 for offset in entries.values())
    (0, True)
    """
    blob, entries = b"", {}
    for name, body in functions().items():
        entries[name] = len(blob)
        blob += body + bytes(-len(body) % 64)
    return blob, entries


class NativeFunction(JitFunction):
    """AArch64 code in executable memory (the instruction cache synchronized), callable via ctypes.

    >>> from isa.aarch64 import Assembler, x0, x1
    >>> from isa.cpu import host
    >>> a = Assembler(); a.add(x0, x0, x1); a.ret()
    >>> add = NativeFunction("add", a.code(), ["i64", "i64"], "i64")
    >>> print(add.disassemble())
           0: 8b010000  add x0, x0, x1
           4: d65f03c0  ret
    >>> host().arch != "aarch64" or add(2, 40) == 42
    True
    """

    def disassemble(self) -> str:
        return disassemble(self.code)


def build():
    """JIT the pool's functions on an AArch64 host: {name: NativeFunction}, as :func:`isa.x86.pool_code.build`.

    >>> from isa.cpu import host
    >>> host().arch != "aarch64" or sorted(build()) == sorted(functions())
    True
    """
    return {name: NativeFunction(f"pool_{name}", body, *SIGNATURES[name]) for name, body in functions().items()}
