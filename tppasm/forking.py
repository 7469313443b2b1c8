"""Locks that survive ``fork``: a forked child has only the forking thread, so a lock another
thread held at the fork would stay taken in the child forever.

Every lock of the process and what happens to it at a fork (``os.register_at_fork``):

- ``tppasm.kernel._LOCK`` (kernel generation) and ``tppasm.backends._LOCK`` (loading the
  generator modules): before the fork the forking thread waits, at most ``wait_s`` (10 s), for a
  kernel being generated, so the child never inherits a half-imported generator module; the
  child gets new locks (:func:`guard`);
- the in-process kernel cache's lock (:class:`tppasm.cache.lru.KernelLRU`), the disk cache's
  module and store locks, its pending writes and counts (:func:`tppasm.cache.after_fork_in_child`:
  the parent writes what it had pending, not the child);
- ``TRACING``, the count of loop-body traces in progress (:mod:`loops.trace`): only the forking
  thread's own traces go on in the child;
- every loop nest's context lock (:mod:`loops.decorator`);
- every thread pool and the lock that creates the process's pool (:mod:`isa.pool`): a child
  starts its own workers at its first parallel region and never waits on the parent's.

>>> import threading, types
>>> m = types.SimpleNamespace(LOCK=threading.Lock())
>>> guard(m, "LOCK", threading.Lock, wait_s=1.0)
"""
import os


def guard(owner, name, new_lock, wait_s=10.0):
    """Make ``owner.<name>`` (a lock) fork safe: before a fork, acquire it (waiting at most
    ``wait_s`` for a thread that holds it); in the parent release it; in the child replace it
    with ``new_lock()``. ``owner`` is a module (or any object); ``wait_s`` is read at each fork
    from ``owner._FORK_WAIT_S`` when that exists."""
    held = []

    def before():
        lock = getattr(owner, name)
        if lock.acquire(timeout=getattr(owner, "_FORK_WAIT_S", wait_s)):
            held.append(lock)

    def after_in_parent():
        while held:
            held.pop().release()

    def after_in_child():
        held.clear()
        setattr(owner, name, new_lock())

    os.register_at_fork(before=before, after_in_parent=after_in_parent, after_in_child=after_in_child)
