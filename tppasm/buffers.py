"""Memory that tppasm's arrays reuse: a buffer of :func:`tppasm.empty` of ``FROM`` bytes or more
goes back to a pool when the last array on it is freed, and the next array of that size (in
pages) takes it instead of asking malloc again.

Why: as a program's sizes change, glibc's malloc maps large blocks afresh (mmap) or hands the top
of its heap back to the system (trim), and then every 4 KiB page a call writes into a new buffer
costs a page fault, on every call. Measured on Zen 4, 1 thread, ``fc.backward`` of 128 x 512 ->
512 fp32 (dx and dw): 2.1 ms with 477 faults a call in one heap state, 1.3 ms with none in
another; with the pool 1.3 ms and no faults.

The pool holds each buffer (a NumPy allocation); an array is made on a new ctypes array over it
(its *owner*, the array's ``.base``), which every view, slice, reshape, ``torch.from_numpy``
tensor or ``np.frombuffer(a.base)`` holds, directly or through the array. A weak reference to the
owner tells when none of them is alive, and the buffer goes back to the pool then. (A weak
reference to the array itself would come too early for whoever holds ``a.base``; and on a
memoryview, NumPy 2 makes the views' base the NumPy array under it, so the buffer would come back
while views live.)

The pool owns at most ``limit`` bytes, handed out and free together
(:func:`set_buffer_cache_limit`; 128 MiB unless ``TPPASM_BUFFER_CACHE_MIB`` says otherwise);
beyond that, arrays get memory of their own as NumPy gives it. Threads share it without a lock:
taking and giving back are single list operations under the GIL (the byte count may be off
by a buffer when two threads add one at once).

>>> new = lambda: array((FROM,), np.dtype(np.uint8), FROM + 64, 64)
>>> a = new(); address = a.ctypes.data
>>> view = a[1:]; del a
>>> b = new(); b.ctypes.data == address       # a view of a holds its buffer
False
>>> del b, view                               # both buffers back, a's last
>>> new().ctypes.data == address
True
"""
import ctypes
import os
import weakref

import numpy as np

from .cache import lru

FROM = 64 << 10         # bytes: smaller blocks come from malloc's free lists, which do not fault
PAGE = 4096
DEFAULT_MIB = 128
RECOUNT_EVERY = 64      # arrays asked for past the limit between two recounts of the bytes owned


class _Pool:
    """The free buffers by size, and the bytes owned (free and handed out). The limit, until set, is
    read from ``TPPASM_BUFFER_CACHE_MIB`` when first needed (the first pooled array): a malformed
    value fails that call, not ``import tppasm`` (nor ``python -m tppasm cache clear``)."""

    def __init__(self):
        self._limit, self.owned = None, 0
        self.full_calls = 0     # arrays asked for while the pool was full (see _room)
        self.free = {}          # size -> [(buffer, address)]
        self.out = {}           # id(weak reference to the owner on it) -> (that reference, size, buffer, address)

    @property
    def limit(self):
        if self._limit is None:
            self._limit = env_limit("TPPASM_BUFFER_CACHE_MIB", "the MiB of memory tppasm's arrays may reuse",
                                    DEFAULT_MIB, "; 0 turns the reuse off") << 20
        return self._limit

    @limit.setter
    def limit(self, value):
        self._limit = value


def env_limit(name, what, default, note=""):
    """The int >= 0 that the environment variable ``name`` holds (``default`` if unset or blank), or
    ValueError naming it, ``what`` it counts and ``default`` (``note``: more about the values).

    >>> env_limit("TPPASM_NO_SUCH_VARIABLE", "things", 7)
    7
    """
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if text.isascii() and text.isdigit() and len(text) <= 30:    # (int() takes '1_000', other scripts' digits)
        return int(text)
    raise ValueError(f"{name}={text!r}: expected {what}, an int >= 0 (default {default}{note})")


def pool_limit():
    """The bytes of memory the pool may own (:func:`set_buffer_cache_limit`), read from the environment
    on first use (ValueError naming ``TPPASM_BUFFER_CACHE_MIB`` if malformed)."""
    return _POOL.limit


def check_limit(limit, who="set_buffer_cache_limit:"):
    """``limit`` as an int >= 0; ValueError saying what to pass otherwise."""
    return lru.check_limit(limit, who, f"the bytes of memory tppasm's arrays may reuse; 0 turns the reuse off; "
                                       f"default {DEFAULT_MIB} << 20")


_POOL = _Pool()


def array(shape, dtype, nbytes, align):
    """A new uninitialized array of ``shape`` and ``dtype`` (a NumPy dtype) starting at a multiple
    of ``align`` bytes of a pooled buffer of at least ``nbytes`` (its size and the alignment slack,
    ``FROM`` or more), or None where the pool is full."""
    pool = _POOL
    size = -(-nbytes // PAGE) * PAGE
    free = pool.free.get(size)
    try:
        raw, address = free.pop()
    except (AttributeError, IndexError):           # none of that size free (another thread may take the last)
        if not _room(pool, size):
            return None
        raw = np.empty(size, np.uint8)              # (a MemoryError: tppasm.layout.empty names the shape asked for)
        address = raw.ctypes.data
        pool.owned += size
    owner = (ctypes.c_char * size).from_buffer(raw)
    ref = weakref.ref(owner, _give_back)
    pool.out[id(ref)] = (ref, size, raw, address)
    return np.ndarray(shape, dtype, owner, -address % align)


def _room(pool, size):
    """Whether ``size`` more bytes fit the pool's limit, dropping its free buffers if they must go
    (and, every RECOUNT_EVERY time, bytes counted for buffers a cut-short callback lost)."""
    if pool.owned + size <= pool.limit:
        return True
    _drop_free(pool)
    pool.full_calls += 1
    if pool.full_calls % RECOUNT_EVERY == 1:
        _recount(pool)
    return pool.owned + size <= pool.limit


def _recount(pool):
    """Count ``pool.owned`` again from its buffers, out and free. A KeyboardInterrupt that lands in
    :func:`_give_back` (Python then ignores it there, Ctrl-C in a notebook) may cut it short: the
    buffer stays listed as out with its owner gone, or is dropped but still counted.

    It walks copies: ``dict.copy`` allocates no object per item, so no garbage collection runs while
    it copies (a collection that frees pooled arrays runs :func:`_give_back`, which changes the dicts;
    ``list(d.items())`` makes a tuple per item, and one of them may start a collection)."""
    for key, entry in pool.out.copy().items():
        if entry[0]() is None:
            pool.out.pop(key, None)
    pool.owned = (sum(entry[1] for entry in pool.out.copy().values())
                  + sum(size * len(held) for size, held in pool.free.copy().items()))


def _drop_free(pool):
    for size in list(pool.free):
        held = pool.free.pop(size, ())
        pool.owned -= size * len(held)


def _give_back(ref, pool=_POOL):
    """The weak reference's callback: the owner, and so every array on the buffer, is gone."""
    entry = pool.out.pop(id(ref), None)
    if entry is None:                               # (dropped already by _recount in another thread)
        return
    _, size, raw, address = entry
    if pool.owned > pool.limit:                     # the limit was lowered meanwhile
        pool.owned -= size
    else:
        pool.free.setdefault(size, []).append((raw, address))


def set_buffer_cache_limit(nbytes):
    """Let the arrays of :func:`tppasm.empty` (and so the outputs and scratch of tppasm's calls)
    reuse at most ``nbytes`` of memory: 128 MiB unless ``TPPASM_BUFFER_CACHE_MIB`` says otherwise;
    0 turns the reuse off and frees what it keeps. Arrays alive keep their memory either way.

    >>> import tppasm
    >>> from tppasm.buffers import pool_limit
    >>> before = pool_limit()                   # 128 << 20 by default
    >>> tppasm.set_buffer_cache_limit(0); pool_limit()     # each array gets fresh memory, freed when dropped
    0
    >>> tppasm.set_buffer_cache_limit(before)
    """
    _POOL.limit = check_limit(nbytes)
    _drop_free(_POOL)
