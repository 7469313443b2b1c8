"""One call at a time per model object: its buffers (MiniLM's plans, a LlamaLayer's steps and
cache) serve one call, so a second thread calling while one runs waits (a model per thread runs
them at once). A forked child makes its own lock: one another thread held at the fork would stay
taken there.

>>> s = Serial()
>>> with s:
...     pass
"""
import os
import threading


class Serial:
    """A lock for ``with``, made anew in a forked child."""

    def __init__(self):
        self._lock, self._pid = threading.Lock(), os.getpid()

    def __enter__(self):
        if self._pid != os.getpid():
            self._lock, self._pid = threading.Lock(), os.getpid()
        self._lock.acquire()
        return self

    def __exit__(self, *exc):
        self._lock.release()
