"""The process pool replaced, closed or re-entered while nests use it: a signal handler that runs
a nest (or a region) while its own thread holds the pool's lock, set_num_threads during another
thread's first call of a nest, a nest called after its pool was closed, a nest inside .python().

The re-entry scenarios run in a subprocess with a timeout, so that a deadlock fails the test."""
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import isa.pool as ip
import tppasm as tpp
from loops import Loop, TraceError, decorator, get_num_threads, kernel, set_num_threads

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SETUP = """
import os, signal, numpy as np, tppasm as tpp, loops, isa.pool as ip
from isa.x86 import Function
from loops import Loop, kernel
relu = tpp.relu(4, 8)
nest = kernel("A", Loop(0, 8))(lambda i, X, Y: relu(X[i], Y[i]))
X = np.random.randn(8, 4, 8).astype(np.float32); Y = np.empty_like(X)
nop = Function("nop", ["ptr", "i64", "i64"]).finalize()
outcomes = []
def interrupt(method):
    # the signal's handler runs inside method, on this thread, while the pool's lock is held
    real = getattr(ip.Pool, method)
    def interrupted(self, *args):
        signal.raise_signal(signal.SIGUSR1)
        return real(self, *args)
    setattr(ip.Pool, method, interrupted)
def on_signal(handler):
    def run(*_):
        try:
            outcomes.append(handler())
        except RuntimeError as e:
            outcomes.append(str(e))
    signal.signal(signal.SIGUSR1, run)
"""

SCENARIOS = {
    # set_num_threads joins the old pool's workers; the handler's nest was compiled for that pool
    "nest while set_num_threads stops the old pool": """
loops.set_num_threads(2); nest(X, Y)
def handler():
    Y[...] = 5; nest(X, Y)
    return bool((Y == np.maximum(X, 0)).all()) and next(iter(nest._bound.values())).pool is ip._pool
on_signal(handler); interrupt("_stop")
loops.set_num_threads(1)
print(outcomes)
""",
    "region while set_num_threads stops the old pool": """
loops.set_num_threads(2); old = ip.get_pool(); old.run(nop.address, 0)
on_signal(lambda: old.run(nop.address, 0)); interrupt("_stop")
loops.set_num_threads(1)
print(outcomes)
""",
    "region while the workers start": """
pool = ip.Pool(2)
on_signal(lambda: pool.run(nop.address, 0)); interrupt("_start")
pool.run(nop.address, 0)
print(outcomes)
""",
}


def run_script(body, timeout=20):
    script = textwrap.dedent(SETUP) + textwrap.dedent(body)
    try:
        done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"deadlock: the script did not end within {timeout} s")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_a_signal_handler_nest_during_set_num_threads_runs_on_the_new_pool():
    assert run_script(SCENARIOS["nest while set_num_threads stops the old pool"]) == "[True]"


@pytest.mark.parametrize("scenario", ["region while set_num_threads stops the old pool",
                                      "region while the workers start"])
def test_a_signal_handler_region_on_a_pool_its_thread_holds_is_an_error(scenario):
    out = run_script(SCENARIOS[scenario])
    assert "already inside this pool" in out and "signal handler" in out


def test_a_nest_called_after_its_pool_was_closed_gets_a_new_pool():
    assert run_script("""
nest(X, Y); ip.get_pool().close()
for _ in range(2):
    Y[...] = 5; nest(X, Y); outcomes.append(bool((Y == np.maximum(X, 0)).all()))
print(outcomes, ip._pool.closed)
""") == "[True, True] False"


@pytest.fixture
def two_threads():
    before = get_num_threads()
    set_num_threads(2)
    yield
    set_num_threads(before)


def test_set_num_threads_during_a_first_call_in_another_thread_is_not_lost(monkeypatch, two_threads):
    relu = tpp.relu(4, 8)
    nest = kernel("A", Loop(0, 8))(lambda i, X, Y: relu(X[i], Y[i]))
    X = np.random.randn(8, 4, 8).astype(np.float32); Y = np.empty_like(X)
    tracing, switched = threading.Event(), threading.Event()
    trace = decorator.traced_trees

    def trace_after_the_switch(lk, arrays):       # the binding thread has read lk.pool already
        if threading.current_thread() is not threading.main_thread():
            tracing.set()
            switched.wait(5)
        return trace(lk, arrays)

    monkeypatch.setattr(decorator, "traced_trees", trace_after_the_switch)
    old = ip.get_pool()
    first_call = threading.Thread(target=nest, args=(X, Y))
    first_call.start()
    assert tracing.wait(5)
    set_num_threads(1)
    switched.set()
    first_call.join(5)
    (inst,) = nest._bound.values()
    assert inst.pool is ip.get_pool() and inst.nthreads == 1 and nest._fast in (None, inst)
    assert old._threads == []                     # the replaced pool's workers were not started again
    assert (Y == np.maximum(X, 0)).all()


def test_a_nest_inside_python_explains_that_nests_do_not_nest():
    relu = tpp.relu(4, 8)
    inner = kernel("A", Loop(0, 6))(lambda i, X, Y: relu(X[i], Y[i]))
    outer = kernel("A", Loop(0, 2))(lambda i, X, Y: inner(X, Y))
    X = np.ones((6, 4, 8), np.float32)
    for run in (outer, outer.python):
        with pytest.raises(TraceError, match="cannot run inside another nest's body"):
            run(X, np.zeros_like(X))
