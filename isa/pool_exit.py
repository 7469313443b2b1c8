"""The thread pools (:mod:`isa.pool`) at interpreter exit.

The exit hook (registered by every new pool, so it runs before the atexit handlers registered
earlier) waits, for every live pool, for a region in flight (at most :data:`GRACE_S`: one that
runs longer goes on, unprotected from finalization), tells the workers to quit and joins them; a
signal handler that raises in the middle of one pool leaves the others stopped all the same (the
exception goes on once they are). From then on a region
(``pool._exited``) starts the workers again and joins them at its end, so none outlives
it, on any thread: an atexit handler registered before the pool may do parallel work, on the
main thread or on a thread it waits for.

While atexit handlers run, a late region releases the interpreter lock as any region does, so its
workers may call back into Python and a handler may wait for another thread's region (one that
held the lock throughout hung both: a daemon thread's region with Python callbacks at exit). A
daemon thread's region still running when finalization begins goes on over it, on the arrays its
thread holds. A region started once finalization has begun (after the last atexit handler) holds
the lock throughout (:func:`run_late`), so none can overlap what finalization frees; the region
lock is then waited for at most :data:`GRACE_S` (a daemon thread may have ended holding it), then
``RuntimeError``.

>>> lock_wait()          # not at exit yet: no deadline
-1
"""
import ctypes
import os
import sys
import threading

GRACE_S = 2.0           # for a region in flight, and for workers to return
hook_ran = False        # a pool made after the exit hook (set_num_threads in a late handler) is exited at once
_HOLDING_GIL = ctypes.PYFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)

HELD_AT_EXIT = ("the pool is held by another thread at interpreter exit (a region that did not end, or a daemon "
                "thread that ended in one): do this work before the program ends, or in an atexit handler")


def lock_wait():
    """How long a region waits for a pool's lock: for ever (-1), or :data:`GRACE_S` once
    finalization has begun.

    >>> lock_wait()
    -1
    """
    return GRACE_S if sys.is_finalizing() else -1


def run_late(pool, fn, arg):
    """Run ``pool``'s region after the exit hook: as usual, but on another thread than the main one
    once finalization has begun, holding the interpreter lock throughout (see the module docstring)."""
    if threading.current_thread() is threading.main_thread() or not sys.is_finalizing():
        pool._run(pool._state, fn, arg)
    else:
        _HOLDING_GIL(pool._code["run"].address)(pool._state, fn, arg)


def stop_at_exit(pool):
    """The exit hook's work for one pool: wait for a region in flight, join the workers, and mark
    the pool exited (also where the wait ran out: the end of that region joins them)."""
    try:
        if os.getpid() == pool._pid and pool._lock.acquire(timeout=GRACE_S):
            try:
                pool._exited = True
                pool._stop()
            finally:
                pool._lock.release()
    finally:
        pool._exited = True


def stop_all(pools):
    """:func:`stop_at_exit` for each of ``pools``; an exception raised in one (a signal handler's)
    is raised again once every pool is stopped."""
    global hook_ran
    hook_ran, raised = True, None
    for pool in pools:
        try:
            stop_at_exit(pool)
        except BaseException as e:          # noqa: BLE001  (raised again below)
            raised = raised or e
    if raised is not None:
        raise raised
