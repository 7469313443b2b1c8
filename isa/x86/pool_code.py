"""Machine code of the native thread pool (x86-64 System V) over its shared state
(:mod:`isa.pool_state`); these functions read and write it:

- ``worker(rec)``: a ``pthread_create`` start routine. It waits for the region generation to change,
  loads the caller's MXCSR, calls ``fn(arg, tid, nthreads)``, counts itself done, and waits again,
  until ``QUIT`` is set.
- ``run(state, fn, arg)``: the caller's side of one region: publish ``fn``/``arg`` and its MXCSR,
  bump the generation, run tid 0, wait for the countdown to reach zero.
- ``barrier(state, tid)``: a generation-based barrier over the region's threads.
- ``quit(state)``: tell every worker to return.
- ``spin(n)``: ``n`` iterations of the wait loop's ``pause`` (and yields), to calibrate the spin budget.
- ``rawcall(table, tid, nthreads)``: the region of ``Pool.run_native``: thread ``tid`` makes its
  list of native calls (:mod:`isa.pool_state`'s ``RAW_*`` fields), one after the other.
- ``leave_cpu(state)``: what a worker does when it starts and when it wakes (and a test can call
  on its own thread): move off ``CALLER_CPU`` when this thread runs there.

Every wait spins ``SPIN`` iterations of ``pause``, with a ``sched_yield`` every ``YIELD_EVERY``
of them, and then sleeps on a futex (raw ``syscall``). A waker issues ``FUTEX_WAKE`` only when a
sleeper announced itself first, so the hot path has no system call but the yields of threads
that wait anyway. Announcing is a locked read-modify-write, then the sleeper re-reads the word
(the kernel does, in FUTEX_WAIT); the waker changes the word with a locked instruction, then reads
the sleeper count. Both orders are full fences, so a sleeper is never missed (Dekker's argument).

Caller and worker must not share a CPU. On the 2-vCPU VMs Linux often woke a sleeping worker onto
the caller's vCPU (an idle vCPU is halted and looks "preempted", so not idle, to the scheduler),
and both then spun there, each holding the CPU the other needed: forward steps of fc on 2
threads took 2.6-4 ms where 0.85 was usual, slower than 1 thread. So ``run``, when it wakes
sleepers, records its CPU and yields once, and a woken worker on that CPU narrows its affinity
mask to move away (``leave_cpu``); a new worker does the same against the CPU of the thread that
started the pool (a pool made after others had its worker start there, and 2-thread regions took
16.5 us for the first ~1,000, until Linux moved the caller). The yields in the wait loops hand a
shared CPU over within ~256 spins wherever two threads still meet.

Every thread of a region runs under the caller's MXCSR (``FP_CONTROL``): a worker otherwise keeps
the one it had when it started, and a caller that changed FTZ/DAZ or the rounding mode since
(``torch.set_flush_denormal``) would get rows flushed or rounded differently depending on the
thread that ran them. Loading it unconditionally costs a few cycles per region.

>>> code = build()
>>> sorted(code)
['barrier', 'leave_cpu', 'quit', 'rawcall', 'run', 'spin', 'worker']
"""
from isa.x86 import Function
from isa.x86.registers import (dword, eax, ebx, edi, edx, esi, qword, r8, r9, r9d, r10d, r12, r13, r14, r15,
                               rax, rcx, rdi, rdx, rsi, rsp)

from ..pool_state import (ARG, BCOUNT, BGEN, BSLEEPERS, CALLER_CPU, CALLER_SLEEPS, FN, FP_CONTROL,
                          FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE, GEN, MASK_BYTES, NTHREADS, QUIT, RAW_COUNT,
                          RAW_LISTS, RAW_RECORD_SIZE, REMAIN, SLEEPERS, SPIN, WAKE_ALL, YIELD_EVERY)

SYS_FUTEX = 202
SYS_SCHED_YIELD = 24
SYS_SCHED_SETAFFINITY, SYS_SCHED_GETAFFINITY, SYS_GETCPU = 203, 204, 309


def _futex(a, state, field, op, value):
    """futex(state + field, op, value, NULL); clobbers rax, rcx, rdx, rsi, rdi, r10, r11."""
    if value is not edx:
        a.mov(edx, value)
    a.lea(rdi, [state + field])
    a.mov(esi, op)
    a.xor(r10d, r10d)
    a.mov(eax, SYS_FUTEX)
    a.syscall()


def _pause(a, counter, again):
    """One iteration of a wait's spin: ``pause``, count ``counter`` down, and every YIELD_EVERY
    iterations ``sched_yield``; jumps to ``again`` while the budget lasts, else falls through.
    Clobbers rax, rcx, r11."""
    more = a.label("more")
    a.pause()
    a.sub(counter, 1)
    a.jz(more)
    a.test(counter, YIELD_EVERY - 1)
    a.jnz(again)
    _syscall(a, SYS_SCHED_YIELD)
    a.jmp(again)
    a.bind(more)


def _syscall(a, number, *args):
    """System call ``number`` with up to three arguments (rdi, rsi, rdx), each an int, a register,
    or a memory operand ``[...]`` (passed as its address); clobbers rax, rcx, r11 and those
    registers. The result is in rax (a negative errno on failure)."""
    for reg, low, arg in zip((rdi, rsi, rdx), (edi, esi, edx), args):
        if isinstance(arg, list):
            a.lea(reg, arg)
        elif type(arg) is int:
            a.xor(low, low) if arg == 0 else a.mov(low, arg)
        else:
            a.mov(reg, arg)
    a.mov(eax, number)
    a.syscall()


def _leave_callers_cpu(a, state, length):
    """A worker on CALLER_CPU (from which the caller woke it, or the pool was started) moves to
    another CPU it may use.

    Linux places a woken thread on the waker's CPU when it sees no idle one nearby, and a VM's idle
    vCPUs look busy to it (halted, "preempted"), so caller and worker then share one CPU for as
    long as both keep spinning. Narrowing the worker's affinity mask to exclude that CPU moves it
    at once; restoring the mask keeps it where it landed. Stack: [rsp] the CPU, [rsp + 16] the
    mask, [rsp + 16 + MASK_BYTES] the narrowed one (LEAVE_STACK bytes). ``state`` and ``length``
    must survive a syscall; clobbers ``length``, rax, rcx, rdx, rsi, rdi, r11."""
    out = a.label("stay")
    mask, narrowed = rsp + 16, rsp + 16 + MASK_BYTES
    _syscall(a, SYS_GETCPU, [rsp], 0, 0)
    a.test(eax, eax)
    a.jnz(out)
    a.mov(eax, [rsp])
    a.cmp(eax, [state + CALLER_CPU])
    a.jne(out)
    _syscall(a, SYS_SCHED_GETAFFINITY, 0, MASK_BYTES, [mask])   # the bytes written: the kernel's mask size
    a.test(rax, rax)
    a.jle(out)
    a.mov(length, rax)
    for offset in range(0, MASK_BYTES, 8):
        a.mov(rcx, [mask + offset])
        a.mov([narrowed + offset], rcx)
    a.mov(eax, [rsp])
    a.btr(qword[narrowed], rax)                   # a bit string: bit cpu of the whole mask
    _syscall(a, SYS_SCHED_SETAFFINITY, 0, length, [narrowed])
    a.test(eax, eax)
    a.jnz(out)                                    # refused (no other CPU allowed): stay
    _syscall(a, SYS_SCHED_SETAFFINITY, 0, length, [mask])
    a.bind(out)


LEAVE_STACK = 16 + 2 * MASK_BYTES


def _wait_change(a, state, field, seen, counter, sleepers, on_wake=None):
    """Spin, then sleep, until dword [state+field] != seen; leaves the new value in eax.

    ``counter`` is a scratch register for the spin budget; it must survive ``sched_yield`` (not
    rax, rcx, r11), and ``state`` and ``seen`` any syscall (not rax, rcx, rdx, rsi, rdi, r10, r11).
    ``on_wake`` emits what a thread that slept does first.
    """
    spin, sleep, woke, done = a.label("spin"), a.label("sleep"), a.label("woke"), a.label("done")
    a.mov(counter, [state + SPIN])
    a.bind(spin)
    a.mov(eax, [state + field])
    a.cmp(eax, seen)
    a.jne(done)
    _pause(a, counter, spin)
    a.inc(dword[state + sleepers], lock=True)
    a.bind(sleep)
    a.mov(eax, [state + field])
    a.cmp(eax, seen)
    a.jne(woke)
    _futex(a, state, field, FUTEX_WAIT_PRIVATE, seen)
    a.jmp(sleep)                      # woken, EAGAIN or EINTR: look again
    a.bind(woke)
    a.dec(dword[state + sleepers], lock=True)
    if on_wake:
        on_wake()
    a.mov(eax, [state + field])
    a.bind(done)


def _worker():
    f = Function("pool_worker", ["ptr"], returns="ptr")
    f.stack(LEAVE_STACK)                          # _leave_callers_cpu's; rsp stays 16-byte aligned
    a, (rec,) = f.asm, f.args
    state, tid, seen = r12, r13, ebx
    a.mov(state, [rec])
    a.mov(tid, [rec + 8])
    a.mov(seen, [rec + 16])
    _leave_callers_cpu(a, state, r15)             # started on the CPU of the thread that started it
    wait, exit_ = a.label("wait"), a.label("exit")
    a.bind(wait)
    _wait_change(a, state, GEN, seen, r14, SLEEPERS, lambda: _leave_callers_cpu(a, state, r15))
    a.mov(seen, eax)
    a.cmp(dword[state + QUIT], 0)
    a.jne(exit_)
    a.ldmxcsr([state + FP_CONTROL])               # the caller's FTZ/DAZ and rounding mode
    a.mov(rdi, [state + ARG])
    a.mov(rsi, tid)
    a.mov(rdx, [state + NTHREADS])
    a.call(qword[state + FN])
    a.mov(eax, -1)
    a.xadd([state + REMAIN], eax, lock=True)
    a.cmp(eax, 1)
    a.jne(wait)                                   # not the last one
    a.cmp(dword[state + CALLER_SLEEPS], 0)
    a.je(wait)
    _futex(a, state, REMAIN, FUTEX_WAKE_PRIVATE, 1)
    a.jmp(wait)
    a.bind(exit_)
    a.xor(eax, eax)
    return f.finalize()


def _run():
    f = Function("pool_run", ["ptr", "ptr", "ptr"])
    f.stack(8)
    a = f.asm
    state, fn, arg = r12, r13, r14
    for dst, src in zip((state, fn, arg), f.args):
        a.mov(dst, src)
    solo, call0, spin, sleep, woke, done = map(a.label, ("solo", "call0", "spin", "sleep", "woke", "done"))
    a.mov(rcx, [state + NTHREADS])
    a.cmp(rcx, 1)
    a.jle(solo)
    a.mov([state + FN], fn)
    a.mov([state + ARG], arg)
    a.stmxcsr([state + FP_CONTROL])
    a.lea(eax, [rcx - 1])
    a.mov([state + REMAIN], eax)
    a.inc(dword[state + GEN], lock=True)          # publishes FN/ARG/FP_CONTROL/REMAIN (stores stay in order)
    a.cmp(dword[state + SLEEPERS], 0)
    a.je(call0)
    _syscall(a, SYS_GETCPU, [state + CALLER_CPU], 0, 0)   # for _leave_callers_cpu
    _futex(a, state, GEN, FUTEX_WAKE_PRIVATE, WAKE_ALL)
    _syscall(a, SYS_SCHED_YIELD)                  # a worker woken onto this CPU runs now, and leaves
    a.bind(call0)
    a.mov(rdi, arg)
    a.xor(esi, esi)
    a.mov(rdx, [state + NTHREADS])
    a.call(fn)
    a.mov(r15, [state + SPIN])
    a.bind(spin)
    a.mov(eax, [state + REMAIN])
    a.test(eax, eax)
    a.jz(done)
    _pause(a, r15, spin)
    a.mov(eax, 1)
    a.xchg([state + CALLER_SLEEPS], eax)          # implicitly locked: a full fence before the re-read
    a.bind(sleep)
    a.mov(eax, [state + REMAIN])
    a.test(eax, eax)
    a.jz(woke)
    _futex(a, state, REMAIN, FUTEX_WAIT_PRIVATE, eax)
    a.jmp(sleep)
    a.bind(woke)
    a.mov(dword[state + CALLER_SLEEPS], 0)
    a.jmp(done)
    a.bind(solo)
    a.mov(rdi, arg)
    a.xor(esi, esi)
    a.mov(edx, 1)
    a.call(fn)
    a.bind(done)
    return f.finalize()


def _barrier():
    f = Function("pool_barrier", ["ptr", "i64"])
    a = f.asm
    state, seen = r8, r9d                         # caller-saved, untouched by the syscall
    a.mov(state, f.args[0])
    a.mov(seen, [state + BGEN])                   # read before arriving: the last arrival bumps it
    a.mov(eax, 1)
    a.xadd([state + BCOUNT], eax, lock=True)
    a.inc(eax)
    a.cmp(eax, dword[state + NTHREADS])
    wait, out = a.label("wait"), a.label("out")
    a.jne(wait)
    a.mov(dword[state + BCOUNT], 0)               # reset before release: x86 keeps the order
    a.inc(dword[state + BGEN], lock=True)
    a.cmp(dword[state + BSLEEPERS], 0)
    a.je(out)
    _futex(a, state, BGEN, FUTEX_WAKE_PRIVATE, WAKE_ALL)
    a.jmp(out)
    a.bind(wait)
    _wait_change(a, state, BGEN, seen, rdx, BSLEEPERS)
    a.bind(out)
    return f.finalize()


def _quit():
    f = Function("pool_quit", ["ptr"])
    a = f.asm
    state = r8
    a.mov(state, f.args[0])
    a.mov(dword[state + QUIT], 1)
    a.inc(dword[state + GEN], lock=True)
    _futex(a, state, GEN, FUTEX_WAKE_PRIVATE, WAKE_ALL)
    return f.finalize()


def _leave_cpu():
    f = Function("pool_leave_cpu", ["ptr"])
    f.stack(LEAVE_STACK)
    a = f.asm
    a.mov(r8, f.args[0])
    _leave_callers_cpu(a, r8, r9)
    return f.finalize()


def _spin():
    f = Function("pool_spin", ["i64"])
    a, (n,) = f.asm, f.args
    loop, out = a.label("loop"), a.label("out")
    a.test(n, n)
    a.jle(out)
    a.bind(loop)
    a.mov(eax, [rsp - 8])             # the wait loops' load, so the timing matches theirs
    _pause(a, n, loop)
    a.bind(out)
    return f.finalize()


def _rawcall():
    f = Function("pool_rawcall", ["ptr", "i64", "i64"])
    f.stack(8)
    a, (table, tid, _) = f.asm, f.args
    loop, out = a.label("loop"), a.label("out")
    a.cmp(tid, qword[table + RAW_COUNT])
    a.jge(out)
    a.shl(tid, 4)                                 # * RAW_LIST_SIZE (16)
    a.mov(r12, qword[table + tid + RAW_LISTS])    # r12, r13: two pushes and 8 bytes of frame keep rsp aligned
    a.mov(r13, qword[table + tid + RAW_LISTS + 8])
    a.test(r13, r13)
    a.jz(out)
    a.bind(loop)
    for reg, offset in zip((rdi, rsi, rdx, rcx, r8, r9), range(8, RAW_RECORD_SIZE, 8)):
        a.mov(reg, qword[r12 + offset])
    a.call(qword[r12])
    a.add(r12, RAW_RECORD_SIZE)
    a.sub(r13, 1)
    a.jnz(loop)
    a.bind(out)
    return f.finalize()


def build():
    """JIT the pool's functions: {name: JitFunction}. Their code is never unmapped (see pool.py)."""
    return {"worker": _worker(), "run": _run(), "barrier": _barrier(), "quit": _quit(), "spin": _spin(),
            "rawcall": _rawcall(), "leave_cpu": _leave_cpu()}
