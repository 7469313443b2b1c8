"""Round 12 fixes of the native pool and the loop DSL: a signal handler that raises while a pool
starts or stops its workers, set_num_threads from a handler just before a region, the per-thread
block check of the race analysis, huge thread counts in messages, None in a loop body's index.

The scenarios that hung (or crashed) before the fixes run in a subprocess with a timeout."""
import ctypes
import itertools
import os
import random
import textwrap

import numpy as np
import pytest

import isa.pool as ip
import tppasm as tpp
from isa.x86 import Function, qword
from loops import Loop, TraceError, kernel, race_search, set_num_threads
from loops.affine import Affine
from tests import scripts


SETUP = """
import ctypes, os, signal, isa.pool as ip
from isa.x86 import Function, qword
f = Function("count", ["ptr", "i64", "i64"]); counts, tid, _ = f.args
f.asm.inc(qword[counts + tid * 8]); count = f.finalize()
def os_threads():
    return len(os.listdir("/proc/self/task"))
def counted(pool):
    hits = (ctypes.c_int64 * pool.nthreads)()
    pool.run(count.address, ctypes.addressof(hits))
    return list(hits) == [1] * pool.nthreads
def interrupted(call):
    try:
        call()
    except KeyboardInterrupt:
        return True
    return False
base = os_threads()
pool = ip.Pool(4)
"""


def run_script(body, timeout=30):
    """The script's output (a hang: AssertionError after ``timeout`` s)."""
    return scripts.run(textwrap.dedent(SETUP) + textwrap.dedent(body), timeout=timeout).strip()


def test_a_handler_raising_as_the_start_restores_the_signal_mask_leaves_a_started_pool():
    # restoring the mask runs pending Python handlers: Ctrl-C or a SIGALRM timeout raises there
    assert run_script("""
real = signal.pthread_sigmask
def restore_then_raise(how, mask):
    old = real(how, mask)
    if how == signal.SIG_SETMASK:
        signal.pthread_sigmask = real
        raise KeyboardInterrupt
    return old
signal.pthread_sigmask = restore_then_raise
print(interrupted(lambda: pool.run(count.address, 0)), os_threads() - base, counted(pool), counted(pool),
      os_threads() - base)
""") == "True 3 True True 3"


def test_a_stop_cut_short_leaves_the_workers_to_the_next_start():
    # a handler that raises once the workers were told to quit, or after the first join
    assert run_script("""
code = pool._workers.code
def quit_then_raise(state):
    code["quit"](state)
    raise KeyboardInterrupt
real_join = ip._join
def join_then_raise(*args):
    ip._join = real_join
    real_join(*args)
    raise KeyboardInterrupt
out = []
for cut in ("quit", "join"):
    counted(pool)
    if cut == "quit":
        pool._workers.code = dict(code, quit=quit_then_raise)
    else:
        ip._join = join_then_raise
    out.append(interrupted(pool._stop))
    pool._workers.code = code
    out += [counted(pool), counted(pool), os_threads() - base]
print(out)
""") == "[True, True, True, 3, True, True, True, 3]"


def test_a_handler_raising_right_after_a_worker_was_created_loses_no_worker():
    assert run_script("""
real = ip._libc.pthread_create
calls = []
def create_then_raise(*args):
    err = real(*args)
    calls.append(1)
    if len(calls) == 2:
        raise KeyboardInterrupt
    return err
ip._libc.pthread_create = create_then_raise
print(interrupted(lambda: pool.run(count.address, 0)), pool._threads, os_threads() - base)
ip._libc.pthread_create = real
print(counted(pool), os_threads() - base)
""") == "True [] 0\nTrue 3"


def count_fn():
    f = Function("count", ["ptr", "i64", "i64"])
    counts, tid, _ = f.args
    f.asm.inc(qword[counts + tid * 8])
    return f.finalize()


def test_set_num_threads_from_a_handler_just_before_the_region_joins_the_workers_after_it(monkeypatch):
    pool = ip.Pool(3)
    monkeypatch.setattr(ip, "_pool", pool)
    real, workers_in_region = pool._run, []

    def handler_then_region(*args):          # a signal handler runs between the start and the region
        set_num_threads(2)
        workers_in_region.append(len(pool._threads))
        if workers_in_region == [2]:
            real(*args)                      # (without its workers the region would wait forever)

    pool._run = handler_then_region
    count = count_fn()
    hits = (ctypes.c_int64 * 3)()
    pool.run(count.address, ctypes.addressof(hits))
    assert workers_in_region == [2] and list(hits) == [1, 1, 1]
    assert pool._threads == [] and ip._pool is not pool and ip._pool.nthreads == 2


def brute_force_tid_window_zero(s1, n1, d1, s2, n2, d2, T):
    c = dict(s1.terms)["tid"]
    return not any(race_search.ap_meet(s1.const + c * t1, n1, d1, s2.const + c * t2, n2, d2)
                   for t1, t2 in itertools.product(range(T), repeat=2) if t1 != t2)


def test_the_per_thread_block_check_tries_each_thread_difference_once(monkeypatch):
    rnd, real = random.Random(12), race_search.ap_meet
    for _ in range(300):
        c, T = rnd.choice([-8, -3, -1, 1, 2, 4, 16]), rnd.randint(1, 9)
        s1, s2 = (Affine([("tid", c)], rnd.randint(-20, 20)) for _ in range(2))
        n1, d1, n2, d2 = rnd.randint(1, 9), rnd.randint(1, 5), rnd.randint(1, 9), rnd.randint(1, 5)
        expected = brute_force_tid_window_zero(s1, n1, d1, s2, n2, d2, T)
        assert race_search._tid_window_zero(s1, n1, d1, s2, n2, d2, T) == expected
    calls = []
    monkeypatch.setattr(race_search, "ap_meet", lambda *args: calls.append(1) or real(*args))
    race_search._tid_window_zero(Affine([("tid", 16)]), 16, 1, Affine([("tid", 16)]), 16, 1, 4096)
    assert len(calls) <= 2 * 4096


@pytest.mark.parametrize("call, name", [(set_num_threads, r"set_num_threads\("), (ip.Pool, r"Pool\(nthreads=")],
                         ids=["set_num_threads", "Pool"])
@pytest.mark.parametrize("sign, digits, shown", [(1, 5001, "<an int of 5001 digits>"),
                                                 (-1, 5001, "-<an int of 5001 digits>"), (1, 5, "10000")])
def test_a_huge_thread_count_gets_the_usual_message(call, name, sign, digits, shown):
    with pytest.raises(ValueError, match=f"^{name}{shown}\\).*4096"):
        call(sign * 10 ** (digits - 1))


def test_a_huge_thread_count_in_the_environment_gets_the_usual_message(monkeypatch):
    monkeypatch.setenv("TPPASM_NUM_THREADS", "7" * 5000)
    with pytest.raises(ValueError, match="expected a number of threads from 1 to 4096"):
        ip.default_threads()


ADVICE = (r"None \(np.newaxis\) is not supported .* B2 with it \(B2\[None\] for a leading axis"
          r".*np.expand_dims\(B2, axis\)")


def test_none_in_a_loop_body_index_says_how_to_get_the_axis():
    g = tpp.brgemm(4, 4, 4)
    A, B2, C = np.ones((1, 4, 4), np.float32), np.ones((4, 8), np.float32), np.zeros((4, 8), np.float32)
    bodies = [lambda j, A, B2, C: g(A, B2[None, :, j * 4:j * 4 + 4], C[:, j * 4:j * 4 + 4]),
              lambda j, A, B2, C: g(A, B2[None], C[:, j * 4:j * 4 + 4]),
              lambda j, A, B2, C: g(A, B2[:, None][:, 0, j * 4:j * 4 + 4][None], C[:, j * 4:j * 4 + 4])]
    messages = set()
    for body in bodies:
        with pytest.raises(TraceError, match=ADVICE) as info:
            kernel("A", Loop(0, 2))(body)(A, B2, C)
        messages.add(str(info.value).split("B2", 1)[1])
    assert len(messages) == 1
