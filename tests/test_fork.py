"""A forked child never hangs on a lock a thread of its parent held, and gets a working pool.

Each scenario runs in a fresh interpreter (forking the test process, with its threads, would test
pytest), with a timeout: a hang is a failure, not a stuck suite.
"""
from tests.scripts import run

# fork now; the child runs CHILD (it must print "child ok"), the parent waits at most 30 s for it
FORK = r"""
import os, signal, time
def fork_and_check(child):
    pid = os.fork()
    if pid == 0:
        try:
            child()
            print("child ok", flush=True)
            os._exit(0)
        except BaseException as e:
            print("child failed:", repr(e), flush=True)
            os._exit(1)
    deadline = time.time() + 30
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0, "the child failed"
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    raise SystemExit("the child hung")
"""


def test_child_forked_while_the_kernel_lock_is_held_makes_kernels():
    """The reproducer of the audit: a thread keeps generating kernels; fork while it holds
    ``tppasm.kernel._LOCK``; the child's first new kernel must not wait for that thread."""
    out = run(FORK + r"""
import threading
import numpy as np, tppasm as tpp, tppasm.kernel as tk
stop = False
def churn():
    n = 1
    while not stop:
        tpp.unary("copy", 3, n)
        n += 1
t = threading.Thread(target=churn, daemon=True)
t.start()
while not tk._LOCK.locked():
    pass
def child():
    x = np.arange(-4, 4, dtype=np.float32).reshape(2, 4)
    y = np.full_like(x, np.nan)
    tpp.relu(2, 4)(x, y)
    assert (y == np.maximum(x, 0)).all()
fork_and_check(child)
stop = True
print("parent ok")
""", {"TPPASM_CACHE": "0"})
    assert "child ok" in out and "parent ok" in out


def test_every_lock_is_renewed_in_a_child():
    """Another thread holds every lock of the process (kernel cache, generator registry, disk
    cache, in-process cache, pool, a nest's context) and a trace is in progress at the fork."""
    out = run(FORK + r"""
import threading
import numpy as np, tppasm as tpp, tppasm.kernel as tk, tppasm.backends as tb, tppasm.cache as tc
import isa.pool as lp, loops.decorator as ld
from loops import Loop, kernel
relu = tpp.relu(2, 3)
@kernel("A", Loop(0, 2))
def nest(i, X, Y):
    relu(X[i], Y[i])
X = np.ones((2, 2, 3), np.float32); Y = np.empty_like(X)
nest(X, Y)
store, pool = tc.store(), lp.get_pool()
inst = next(iter(ld._INSTANCES))
tk._FORK_WAIT_S = tb._FORK_WAIT_S = 0.1          # the holder below does not let go: do not wait for it
locks = lambda: [tk._LOCK, tb._LOCK, tc._lock, store._lock, tk._CACHE._lock, lp._pool_lock, pool._lock, inst.lock]
held, release = threading.Event(), threading.Event()
def holder():
    for lock in locks():
        lock.acquire()
    held.set()
    release.wait()
    for lock in locks():
        lock.release()
threading.Thread(target=holder, daemon=True).start()
held.wait()
tracing, go_on = threading.Event(), threading.Event()
@kernel("A", Loop(0, 2))
def slow_to_trace(i, X, Y):
    tracing.set()
    go_on.wait()
    relu(X[i], Y[i])
threading.Thread(target=lambda: slow_to_trace(X, Y), daemon=True).start()
tracing.wait()
def taken(lock):
    free = lock.acquire(False)
    if free:
        lock.release()
    return not free
assert tk.TRACING == 1 and all(taken(lock) for lock in locks())
def child():
    for lock in locks():
        assert lock.acquire(timeout=5), lock
        lock.release()
    assert tk.TRACING == 0 and tk._DIVERT.value == 0
    Y[...] = 0
    nest(X, Y)                                  # the nest, its pool and its context lock
    assert (Y == 1).all()
    tpp.unary("tanh", 2, 7)                     # a new kernel through the disk cache
    tc.flush()
fork_and_check(child)
release.set(); go_on.set()
print("parent ok")
""", {"TPPASM_NUM_THREADS": "2"})
    assert "child ok" in out and "parent ok" in out


def test_parallel_loop_kernel_runs_in_a_forked_child():
    """The parent's pool has workers; the child cannot use them (they do not exist there): it
    starts its own, runs the parent's nest and a new one, and exits without waiting on anything."""
    out = run(FORK + r"""
import numpy as np, tppasm as tpp
from loops import Loop, kernel
zero, relu = tpp.zero(4, 8), tpp.relu(4, 8)
@kernel("A", Loop(0, 16))
def clear(i, X):
    zero(X[i])
X = np.ones((16, 4, 8), np.float32)
clear(X)
assert not X.any()
def child():
    X[...] = 1
    clear(X)
    assert not X.any()
    @kernel("A", Loop(0, 16))
    def rect(i, X, Y):
        relu(X[i], Y[i])
    Z = np.full_like(X, -1); W = np.full_like(X, np.nan)
    rect(Z, W)
    assert (W == 0).all()
for _ in range(3):
    fork_and_check(child)
print("parent ok")
""", {"TPPASM_NUM_THREADS": "2"})
    assert out.count("child ok") == 3 and "parent ok" in out


def test_child_does_not_write_what_its_parent_has_pending(tmp_path):
    out = run(FORK + r"""
import json, os
import tppasm as tpp, tppasm.cache as tc
tpp.unary("sigmoid", 2, 5)                       # pending in the parent at the fork
def child():
    assert not tc.store()._pending
    tpp.unary("exp", 2, 5)
    tc.flush()
fork_and_check(child)
tc.flush()
root = os.environ["TPPASM_CACHE_DIR"]
index, stats = (json.load(open(os.path.join(root, name))) for name in ("index.json", "stats.json"))
print("stores", stats["stores"], "kernels", sum(k.startswith("kernel/") for k in index["entries"]))
""", {"TPPASM_CACHE_DIR": str(tmp_path)})
    assert "stores 3 kernels 2" in out, out     # parent: sigmoid + its stub; child: exp (same stub)
