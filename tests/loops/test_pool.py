"""The native thread pool: each tid once per region, barriers, Python threads, fork, env, exit."""
import ctypes
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from isa.x86 import Assembler, Function, OperandError, disassemble, qword, rax, rbx, rcx, rdi, rsi
from isa.x86.registers import eax, r12, r13, r14, r15
from isa import pool_state
from isa.pool import Pool, default_threads, get_pool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))


# -- native region bodies ----------------------------------------------------------------------
def count_fn():
    """fn(counts, tid, n): counts[tid] += 1."""
    f = Function("count", ["ptr", "i64", "i64"])
    counts, tid, _ = f.args
    f.asm.inc(qword[counts + tid * 8])
    return f.finalize()


class PhaseArgs(ctypes.Structure):
    _fields_ = [("slots", ctypes.c_void_p), ("barrier_fn", ctypes.c_void_p),
                ("barrier_state", ctypes.c_void_p), ("errors", ctypes.c_void_p), ("rounds", ctypes.c_int64)]


def phases_fn():
    """fn(args, tid, n): for r in 1..rounds: slots[tid] = r; barrier; check every slot == r; barrier.

    Mismatches are counted in *errors; without a working barrier a thread sees stale slots.
    """
    f = Function("phases", ["ptr", "i64", "i64"])
    f.stack(8)
    a = f.asm
    args, tid, n, r, slots = rbx, r12, r13, r14, r15
    for dst, src in zip((args, tid, n), f.args):
        a.mov(dst, src)
    a.mov(slots, [args])
    a.mov(r, 1)

    def barrier():
        a.mov(rdi, [args + 16])
        a.mov(rsi, tid)
        a.call(qword[args + 8])

    loop, check, ok = a.label("loop"), a.label("check"), a.label("ok")
    a.bind(loop)
    a.mov([slots + tid * 8], r)
    barrier()
    a.mov(rcx, 0)
    a.bind(check)
    a.cmp([slots + rcx * 8], r)
    a.je(ok)
    a.mov(rax, [args + 24])
    a.inc(qword[rax], lock=True)
    a.bind(ok)
    a.inc(rcx)
    a.cmp(rcx, n)
    a.jl(check)
    barrier()
    a.inc(r)
    a.cmp(r, [args + 32])
    a.jle(loop)
    return f.finalize()


def check_counts(pool, regions):
    fn = count_fn()
    counts = (ctypes.c_int64 * pool.nthreads)()
    for _ in range(regions):
        pool.run(fn.address, ctypes.addressof(counts))
    assert list(counts) == [regions] * pool.nthreads


def check_phases(pool, regions, rounds):
    fn = phases_fn()
    slots = (ctypes.c_int64 * pool.nthreads)()
    errors = ctypes.c_int64(0)
    args = PhaseArgs(ctypes.addressof(slots), pool.barrier_fn, pool.barrier_state,
                     ctypes.addressof(errors), rounds)
    for _ in range(regions):
        pool.run(fn.address, ctypes.addressof(args))
    assert errors.value == 0
    assert list(slots) == [rounds] * pool.nthreads


def start_script(body, env=None):
    """Start ``body`` in a fresh interpreter with this test module importable."""
    script = f"import sys; sys.path[:0] = [{ROOT!r}, {HERE!r}]\n" + textwrap.dedent(body)
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("TPPASM_NUM_THREADS", "OMP_NUM_THREADS", "TPPASM_SPIN_US")}
    full_env.update(env or {})
    return subprocess.Popen([sys.executable, "-c", script], env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def run_script(body, env=None, timeout=30):
    """Run ``body`` as :func:`start_script` does and wait; returns the finished process."""
    proc = start_script(body, env)
    try:
        proc.stdout_text, proc.stderr_text = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return proc


def ok(proc):
    assert proc.returncode == 0, proc.stdout_text + proc.stderr_text
    return proc.stdout_text


# -- the assembler's LOCK option -----------------------------------------------------------------
def test_lock_prefix():
    a = Assembler()
    a.xadd([rdi + 64], eax, lock=True)
    a.inc(qword[rdi], lock=True)
    a.add([rdi], rax)
    text = disassemble(a.encode())
    assert text.count("lock ") == 2 and "lock xadd" in text and "lock inc" in text
    with pytest.raises(OperandError, match="LOCK"):
        a.add(rax, rax, lock=True)


# -- in process ----------------------------------------------------------------------------------
def test_singleton_and_threads():
    pool = get_pool()
    assert pool is get_pool()
    assert pool.nthreads == default_threads() >= 1


def test_each_tid_once_per_region():
    pool = get_pool()
    check_counts(pool, 1)
    check_counts(pool, 5000)


def test_barrier_orders_phases():
    pool = get_pool()
    check_phases(pool, regions=1, rounds=2000)
    check_phases(pool, regions=300, rounds=3)       # back-to-back regions, barriers in each


def test_explicit_pools_of_several_sizes():
    for n in (1, 2, 3, 4):
        pool = Pool(n)
        check_counts(pool, 300)
        check_phases(pool, regions=20, rounds=20)
        pool._at_exit()                              # join its workers now


def test_after_idle_workers_sleep_and_wake():
    pool = Pool(3, spin_us=1)
    sleepers = ctypes.c_uint32.from_address(pool.barrier_state + pool_state.SLEEPERS)
    caller_cpu = ctypes.c_uint32.from_address(pool.barrier_state + pool_state.CALLER_CPU)
    for i in range(3):
        assert i == 0 or caller_cpu.value in os.sched_getaffinity(0)   # run() woke sleepers from there
        check_counts(pool, 3)
        deadline = time.monotonic() + 5
        while sleepers.value != 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert sleepers.value == 2                   # both workers parked on the futex
        check_phases(pool, regions=2, rounds=5)
    pool._at_exit()


_sched_getcpu = ctypes.CDLL(None, use_errno=True).sched_getcpu


def test_leave_cpu_moves_a_thread_off_the_callers_cpu():
    """leave_cpu (what a woken worker runs first) on a Python thread: on CALLER_CPU it moves to
    another CPU of its mask and keeps the mask; elsewhere, or with no other CPU allowed, it stays."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    leave = get_pool()._code["leave_cpu"]
    state = (ctypes.c_uint8 * pool_state.state_size(1))()
    caller_cpu = ctypes.c_uint32.from_address(ctypes.addressof(state) + pool_state.CALLER_CPU)
    seen = {}

    def thread(_):
        os.sched_setaffinity(0, {cpus[0]})
        caller_cpu.value = _sched_getcpu()
        leave(ctypes.addressof(state))               # the only CPU allowed: stays
        seen["pinned"] = (_sched_getcpu(), os.sched_getaffinity(0))
        os.sched_setaffinity(0, cpus)
        caller_cpu.value = pool_state.NO_CPU
        leave(ctypes.addressof(state))
        seen["elsewhere"] = os.sched_getaffinity(0)
        seen["moved"] = []
        for _ in range(5):      # (a loaded host may migrate it back before it looks: one move in five suffices)
            caller_cpu.value = _sched_getcpu()
            leave(ctypes.addressof(state))
            seen["moved"].append((caller_cpu.value, _sched_getcpu(), os.sched_getaffinity(0)))

    in_threads(thread, [None], 10)
    assert seen["pinned"] == (cpus[0], {cpus[0]})
    assert seen["elsewhere"] == set(cpus)
    assert all(mask == set(cpus) for _, _, mask in seen["moved"])
    assert any(now != was for was, now, _ in seen["moved"]), seen["moved"]


def in_threads(target, args, timeout):
    """Run target(arg) for each of ``args`` on a Python thread of its own, all at once; wait for
    them (at most ``timeout`` seconds each)."""
    threads = [threading.Thread(target=target, args=(arg,)) for arg in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)


def test_concurrent_python_threads():
    pool, fn = get_pool(), count_fn()
    arrays = [(ctypes.c_int64 * pool.nthreads)() for _ in range(4)]
    errors = []

    def caller(counts):
        try:
            for _ in range(500):
                pool.run(fn.address, ctypes.addressof(counts))
        except Exception as e:          # pragma: no cover - reported below
            errors.append(e)

    in_threads(caller, arrays, 30)
    assert not errors
    for counts in arrays:
        assert list(counts) == [500] * pool.nthreads


def test_reentrant_run_is_an_error():
    pool = get_pool()
    nop = Function("nop", ["ptr", "i64", "i64"]).finalize()
    seen = []

    @ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
    def body(arg, tid, n):
        try:
            pool.run(nop.address, 0)
            seen.append((tid, None))
        except RuntimeError as e:
            seen.append((tid, str(e)))

    pool.run(ctypes.cast(body, ctypes.c_void_p).value, 0)
    assert sorted(t for t, _ in seen) == list(range(pool.nthreads))
    assert all(msg and "inside a parallel region" in msg for _, msg in seen)
    check_counts(pool, 10)                           # and the pool still works


def args_fn():
    """fn(slots, a1, ..., a5): slots[a1] = a1 + 2 a2 + 3 a3 + 4 a4 + 5 a5 (every argument register read)."""
    f = Function("args", ["ptr", "i64", "i64", "i64", "i64", "i64"])
    slots, *rest = f.args
    a = f.asm
    a.mov(rax, 0)
    for weight, reg in enumerate(rest, 1):
        for _ in range(weight):
            a.add(rax, reg)
    a.mov(qword[slots + rest[0] * 8], rax)
    return f.finalize()


@pytest.mark.parametrize("nthreads, shares", [(1, 2), (2, 1), (2, 3), (3, 5)])
def test_run_native_makes_every_call_with_its_six_arguments(nthreads, shares):
    pool, fn = Pool(nthreads), args_fn()
    slots = (ctypes.c_int64 * 64)()
    calls = [[(fn.address, (ctypes.addressof(slots), 8 * s + i, 1, 2, 3, 4)) for i in range(s + 1)]
             for s in range(shares)]
    pool.run_native(calls)
    expect = [0] * 64
    for s in range(shares):
        for i in range(s + 1):
            expect[8 * s + i] = 8 * s + i + 2 + 6 + 12 + 20
    assert list(slots) == expect
    with pytest.raises(TypeError, match="at most 6 integer arguments"):
        pool.run_native([[(fn.address, (1, 2, 3, 4, 5, 6, 7))]])
    with pytest.raises(TypeError, match="a call is .address, args."):
        pool.run_native([[fn.address]])
    with pytest.raises(TypeError, match="a call is .address, args."):       # a float argument (was cut to 1)
        pool.run_native([[(fn.address, (ctypes.addressof(slots), 1.5))]])
    with pytest.raises(TypeError, match="shares=None; expected a list of lists"):
        pool.run_native(None)


def test_run_native_from_several_python_threads_at_once():
    """Regions of run_native from four Python threads at once: each call runs exactly once, with
    its own arguments."""
    pool, fn, errors = get_pool(), args_fn(), []
    rows = [(ctypes.c_int64 * 8)() for _ in range(4)]

    def caller(row):
        try:
            for r in range(200):
                pool.run_native([[(fn.address, (ctypes.addressof(row), i, r, 0, 0, 0))] for i in range(6)])
                assert list(row[:6]) == [i + 2 * r for i in range(6)]
        except Exception as e:          # pragma: no cover - reported below
            errors.append(e)

    in_threads(caller, rows, 60)
    assert not errors


@pytest.mark.parametrize("fn, arg, error", [(0, 0, ValueError), (1 << 64, 0, ValueError), ("code", 0, TypeError),
                                           (b"\xc3", 0, TypeError), (1.5, 0, TypeError), ("nop", "x", TypeError),
                                           ("nop", -1, ValueError), ("nop", 1 << 64, ValueError)])
def test_what_is_no_function_address_is_refused(fn, arg, error):
    """ctypes would run a str's or bytes' characters as code, and wrap 2**64 to 0: refused first."""
    if fn == "nop":
        fn = Function("nop", ["ptr", "i64", "i64"]).finalize().address
    with pytest.raises(error, match=r"Pool.run: (fn|arg)=.*expected .*2\*\*64"):
        get_pool().run(fn, arg)


@pytest.mark.parametrize("n", [2, 3])
def test_futex_paths_without_spinning(n):
    """No spinning: every wait (worker, caller, barrier) goes to sleep on the futex at once."""
    pool = Pool(n, spin_us=0)
    assert pool.spin_iterations == 1
    check_counts(pool, 2000)
    check_phases(pool, regions=20, rounds=100)
    pool._at_exit()


def test_oversubscribed():
    pool = Pool(len(os.sched_getaffinity(0)) + 1)
    assert pool.spin_iterations == 1                # the default when threads outnumber CPUs
    check_counts(pool, 500)
    check_phases(pool, regions=20, rounds=50)
    pool._at_exit()


def test_thread_count_fallbacks(monkeypatch):
    for name in ("TPPASM_NUM_THREADS", "OMP_NUM_THREADS", "TPPASM_SPIN_US"):
        monkeypatch.delenv(name, raising=False)
    assert default_threads() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("OMP_NUM_THREADS", "3,2")
    assert default_threads() == 3
    monkeypatch.setenv("TPPASM_NUM_THREADS", "5")
    assert default_threads() == 5
    for bad in ("zero", "0", "-2"):
        monkeypatch.setenv("TPPASM_NUM_THREADS", bad)
        with pytest.raises(ValueError, match="TPPASM_NUM_THREADS"):
            default_threads()
    monkeypatch.setenv("TPPASM_SPIN_US", "fast")
    with pytest.raises(ValueError, match="TPPASM_SPIN_US"):
        Pool(2)


def test_spin_defaults(monkeypatch):
    """Workers spin SPIN_US (long enough for a VM's halted vCPU not to be woken every call), none
    when threads outnumber CPUs; TPPASM_SPIN_US overrides."""
    from isa.pool import SPIN_US, _spin_us
    monkeypatch.delenv("TPPASM_SPIN_US", raising=False)
    cpus = len(os.sched_getaffinity(0))
    assert SPIN_US >= 500 and _spin_us(cpus) == SPIN_US and _spin_us(cpus + 1) == 0
    monkeypatch.setenv("TPPASM_SPIN_US", "20")
    assert _spin_us(cpus) == 20


# -- in subprocesses -----------------------------------------------------------------------------
def test_thread_count_from_env():
    script = """
        from isa.pool import get_pool
        from test_pool import check_counts, check_phases
        pool = get_pool()
        check_counts(pool, 300)
        check_phases(pool, regions=10, rounds=30)
        print(pool.nthreads)
    """
    procs = {n: start_script(script, {"TPPASM_NUM_THREADS": str(n), "OMP_NUM_THREADS": "7"})
             for n in (1, 2, 3)}
    for n, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, out + err
        assert out.split() == [str(n)]


def test_fork_child_gets_a_working_pool():
    """Children forked while another thread of the parent keeps issuing regions."""
    ok(run_script("""
        import ctypes, os, threading
        from isa.pool import get_pool
        from test_pool import check_counts, check_phases, count_fn
        pool, fn = get_pool(), count_fn()
        check_counts(pool, 100)
        addresses = (pool.barrier_fn, pool.barrier_state)
        counts, stop = (ctypes.c_int64 * pool.nthreads)(), threading.Event()
        def spam():
            while not stop.is_set():
                pool.run(fn.address, ctypes.addressof(counts))
        spammer = threading.Thread(target=spam)
        spammer.start()
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                try:
                    assert get_pool() is pool and (pool.barrier_fn, pool.barrier_state) == addresses
                    check_counts(pool, 300)
                    check_phases(pool, regions=10, rounds=30)
                except BaseException:
                    import traceback; traceback.print_exc()
                    os._exit(1)
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, status
        stop.set()
        spammer.join()
        assert len(set(counts)) == 1 and counts[0] > 0
        check_counts(pool, 300)                      # the parent's pool is untouched
    """, env={"TPPASM_NUM_THREADS": "2"}))


def test_exit_is_clean_and_quick():
    start = time.monotonic()
    out = ok(run_script("""
        import atexit
        from isa.pool import get_pool
        from test_pool import check_counts
        # registered first, so it runs after the pool's handler: the workers must be joined by then
        atexit.register(lambda: print("joined" if not get_pool()._threads else "workers left"))
        check_counts(get_pool(), 100)
        assert len(get_pool()._threads) == 1
        print("done")
    """, env={"TPPASM_NUM_THREADS": "2"}, timeout=20))
    assert out.split() == ["done", "joined"]
    assert time.monotonic() - start < 10


def test_exit_while_daemon_threads_issue_regions():
    ok(run_script("""
        import ctypes, threading, time
        from isa.pool import get_pool
        from test_pool import count_fn
        pool, fn = get_pool(), count_fn()
        counts = (ctypes.c_int64 * pool.nthreads)()
        def spam():
            while True:
                pool.run(fn.address, ctypes.addressof(counts))
        for _ in range(2):
            threading.Thread(target=spam, daemon=True).start()
        time.sleep(0.2)
    """, env={"TPPASM_NUM_THREADS": "2"}, timeout=20))
