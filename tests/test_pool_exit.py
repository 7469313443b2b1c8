"""The thread pool at interpreter exit (:mod:`isa.pool_exit`) and callbacks into Python that stop
the pool: the process always exits, every pool is stopped, and a closed pool refuses work.
Exit behaviour runs in a child with a deadline: a hang fails the test instead of stalling it."""
import ctypes
import os
import subprocess
import sys
import threading

import pytest

from isa import pool_exit
from isa.pool import Pool
from tests.scripts import ROOT

_PRELUDE = """
import atexit, ctypes, os, sys, threading, isa.pool as ip
from isa.x86 import Function, qword
f = Function("count", ["ptr", "i64", "i64"]); counts_at, tid, _ = f.args
f.asm.inc(qword[counts_at + tid * 8]); count = f.finalize()
def region(pool=None):
    pool = pool or ip.get_pool()
    hits = (ctypes.c_int64 * pool.nthreads)()
    pool.run(count.address, ctypes.addressof(hits))
    return list(hits) == [1] * pool.nthreads
"""


def _child(script, timeout=4):
    """(returncode, stdout, stderr) of ``script`` after :data:`_PRELUDE`, on 2 threads; a child
    that does not exit in ``timeout`` seconds fails the test."""
    env = {**os.environ, "TPPASM_CACHE": "0", "TPPASM_NUM_THREADS": "2", "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        run = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {ROOT!r})\n{_PRELUDE}{script}"],
                             capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the child hung at exit:\n{e.stdout}\n{e.stderr}")
    return run.returncode, run.stdout, run.stderr


def test_a_thread_that_an_earlier_atexit_handler_waits_for_runs_its_region():
    code, out, err = _child("""
import queue
q = queue.Queue()
def serve():                        # a daemon thread serving requests, drained at exit
    while True:
        q.get(); print("served", region(), flush=True); q.task_done()
threading.Thread(target=serve, daemon=True).start()
def drain():
    q.put(1); q.join()
    t = threading.Thread(target=lambda: print("helper", region(), flush=True)); t.start(); t.join()
    print("workers left", len(ip.get_pool()._threads))
atexit.register(drain)              # registered before the pool: runs after its exit hook
q.put(0); q.join()
""")
    assert code == 0 and out.split("\n") == ["served True", "served True", "helper True", "workers left 0", ""], \
        f"{out}\n{err}"


def test_a_late_region_on_another_thread_holds_the_interpreter_lock_once_finalizing(monkeypatch):
    """Finalization starts only on a thread holding the interpreter lock: a region started after it
    began keeps the lock, so it cannot overlap it; before, while atexit handlers run, a region
    releases it as usual (its workers may call back into Python)."""
    assert pool_exit._HOLDING_GIL._flags_ & ctypes._FUNCFLAG_PYTHONAPI      # ctypes keeps the lock for those
    calls = []
    monkeypatch.setattr(pool_exit, "_HOLDING_GIL", lambda address: lambda *args: calls.append(address))
    pool = Pool(2)
    pool._at_exit()
    assert pool._exited and not pool._threads
    nop = ctypes.cast(ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(lambda *a: None),
                      ctypes.c_void_p)
    pool.run(nop.value, 0)                          # the main thread: as usual
    assert calls == [] and not pool._threads        # joined at the region's end
    for finalizing, want in ((False, []), (True, [pool._code["run"].address])):
        monkeypatch.setattr(pool_exit.sys, "is_finalizing", lambda: finalizing)
        thread = threading.Thread(target=pool.run, args=(nop.value, 0), daemon=True)
        thread.start()
        thread.join(5)
        assert calls == want and not pool._threads
    pool.close()


def test_a_daemon_threads_regions_calling_back_into_python_at_exit_end_cleanly():
    code, out, err = _child("""
import time
atexit.register(lambda: (time.sleep(0.2), print("late handler done", flush=True)))
body = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(lambda arg, tid, n: None)
pool = ip.get_pool()
def spin():
    while True:
        pool.run(ctypes.cast(body, ctypes.c_void_p).value, 0)
threading.Thread(target=spin, daemon=True).start()
time.sleep(0.2)
print("main done", flush=True)
""")
    assert code == 0 and out.split() == ["main", "done", "late", "handler", "done"], f"{out}\n{err}"


def test_daemon_threads_running_regions_at_exit_end_cleanly():
    code, out, err = _child("""
import time
def hammer():
    while True:
        region()
for _ in range(2):
    threading.Thread(target=hammer, daemon=True).start()
atexit.register(lambda: print("late", region(), flush=True))
time.sleep(0.1)
print("main done", region(), flush=True)
""")
    assert code == 0 and out.split("\n") == ["main done True", "late True", ""], f"{out}\n{err}"


def test_during_finalization_a_held_lock_is_a_runtime_error_not_a_hang(monkeypatch):
    pool, held, done = Pool(2), threading.Event(), threading.Event()

    def hold():                     # as a daemon thread that ended in a region at finalization
        with pool._lock:
            held.set()
            done.wait(10)
    threading.Thread(target=hold, daemon=True).start()
    held.wait(5)
    monkeypatch.setattr(pool_exit.sys, "is_finalizing", lambda: True)
    monkeypatch.setattr(pool_exit, "GRACE_S", 0.05)
    raised = []

    def region():
        try:
            pool.run(pool._code["spin"].address, 1)      # (a harmless function, should it run)
        except RuntimeError as e:
            raised.append(str(e))
    waiter = threading.Thread(target=region, daemon=True)      # (so that a hang fails the test)
    waiter.start()
    waiter.join(3)
    done.set()
    assert raised and "held by another thread at interpreter exit" in raised[0]
    pool.close()


@pytest.mark.parametrize("call", ["close", "setn", "cpu"])
def test_a_callback_on_a_worker_that_stops_the_pool_does_not_deadlock(call):
    code, out, err = _child(f"""
pool = ip.get_pool(); seen = []
@ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
def body(arg, tid, n):
    if tid == 1:
        try:
            {{"close": pool.close, "setn": lambda: ip.set_num_threads(3), "cpu": pool.cpu_seconds}}[{call!r}]()
            seen.append("ok")
        except RuntimeError as e:
            seen.append(str(e))
pool.run(ctypes.cast(body, ctypes.c_void_p).value, 0)
print(seen, pool.closed, len(pool._threads), region(), ip.get_num_threads())
""")
    assert code == 0, f"{out}\n{err}"
    if call == "close":           # refused on the worker, as on the region's own thread
        assert "Pool.close called on a thread already inside this pool" in out and "False 1 True 2" in out, out
    elif call == "cpu":
        assert "Pool.cpu_seconds called on a thread already inside this pool" in out, out
    else:                          # the old pool's workers are joined at its region's end
        assert out.strip() == "['ok'] False 0 True 3", out


def test_an_exception_in_the_exit_hook_still_stops_every_pool():
    code, out, err = _child("""
def late():                         # registered before the pools: runs after their exit hook
    print([region(p) for p in pools], [p._exited for p in pools], [len(p._threads) for p in pools], flush=True)
atexit.register(late)
pools = [ip.get_pool(), ip.Pool(3)]
for p in pools: region(p)
first = list(ip._POOLS)[0]; real = first._stop
def interrupted_once():            # as if Ctrl-C arrived while the hook stops the first pool
    first._stop = real
    raise KeyboardInterrupt
first._stop = interrupted_once
""")
    assert code == 0 and out.strip() == "[True, True] [True, True] [0, 0]", f"{out}\n{err}"
    assert "KeyboardInterrupt" in err and "another thread" not in err + out


def test_close_after_the_exit_hook_refuses_work():
    code, out, err = _child("""
def late():
    pool = ip.get_pool(); pool.close()
    try:
        region(pool)
    except ValueError as e:
        print("refused:", e)
    print("closed", pool.closed, "new pool", region())
atexit.register(late)
region()
""")
    assert code == 0 and out.startswith("refused: this pool was closed") and "closed True new pool True" in out, \
        f"{out}\n{err}"
