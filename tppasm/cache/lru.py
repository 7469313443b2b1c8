"""The in-process kernel cache: the most recently used kernels, at most ``limit`` of them.

An evicted kernel is dropped from the cache only: whoever still holds it (a user, a loop nest, a
``BatchedBrgemm``) keeps a valid kernel, and while anyone does, a lookup finds that same object
again (a weak map), so one descriptor never has two live kernels. A kernel nobody holds is
collected with its executable memory (kernels are in reference cycles through their builtin
entry, so that happens at the next cyclic garbage collection, or at once with ``gc.collect()``).

>>> c = KernelLRU(limit=2)
>>> class K: pass
>>> a, b, d = K(), K(), K()
>>> c.put("a", a); c.put("b", b); c.get("a") is a       # "a" becomes the most recent
True
>>> c.put("d", d); len(c), "b" in c.keys()             # "b" is evicted
(2, False)
>>> c.get("b") is b                                    # still alive here: found again
True
"""
import operator
import threading
import weakref
from collections import OrderedDict

from ..display import shown

DEFAULT_LIMIT = 512


class KernelLRU:
    """At most ``limit`` kernels held, least recently used evicted first (``limit=0``: none held)."""

    def __init__(self, limit=DEFAULT_LIMIT):
        self._held = OrderedDict()
        self._alive = weakref.WeakValueDictionary()
        # reentrant: a kernel dropped under it may run a finalizer, and a signal handler may call
        # get_kernel, on this thread, either reaching put again
        self._lock = threading.RLock()
        self.limit = check_limit(limit)

    def get(self, key):
        """The kernel for ``key`` if this process has it (held or still referenced elsewhere), else None."""
        kernel = self._held.get(key)
        if kernel is not None:
            try:
                self._held.move_to_end(key)
            except KeyError:             # evicted by another thread meanwhile: it is still ours to return
                pass
            return kernel
        kernel = self._alive.get(key)
        if kernel is not None:
            self.put(key, kernel)
        return kernel

    def put(self, key, kernel):
        with self._lock:
            self._alive[key] = kernel
            if self.limit:
                self._held[key] = kernel
                self._held.move_to_end(key)
            self._trim()

    def set_limit(self, limit):
        with self._lock:
            self.limit = check_limit(limit)
            self._trim()

    def _trim(self):
        while len(self._held) > self.limit:
            self._held.popitem(last=False)

    def clear(self):
        """Hold nothing (kernels referenced elsewhere stay valid and are still found)."""
        with self._lock:
            self._held.clear()

    def keys(self):
        return list(self._held)

    def __len__(self):
        return len(self._held)

    def after_fork_in_child(self):
        self._lock = threading.RLock()


def check_limit(limit, what="kernel cache limit", meaning="the number of kernels kept; 0 keeps none beyond those "
                "referenced elsewhere"):
    """``limit`` as an int >= 0; ValueError saying what to pass otherwise (``what`` names the limit,
    ``meaning`` says what it counts)."""
    try:
        value = None if isinstance(limit, bool) else operator.index(limit)
    except TypeError:
        value = None
    if value is None or value < 0:
        raise ValueError(f"{what} {shown(limit)}: expected an int >= 0 ({meaning})")
    return value
