"""The persistent kernel cache: generated code kept on disk (mmap-ninja), so a second process
does not pay the JIT again; and a place for the tuner's results.

Where: ``TPPASM_CACHE_DIR`` (as written, blanks included), else ``$XDG_CACHE_HOME/tppasm``, else
``~/.cache/tppasm`` (none with an empty or relative ``HOME``). The directory is created with mode
0700, whatever the umask; one owned by another user or writable by group or others (or relative,
with no working directory to resolve it in) is refused with a warning saying what to fix, and
kernels are then generated in memory.
``TPPASM_CACHE=0`` turns the cache off; ``TPPASM_CACHE_MB`` caps its size (default 256; least
recently used entries go first). ``python -m tppasm cache info`` shows it, ``... cache clear``
empties it. These are read once per process, at the first kernel (:func:`reset` rereads them).
The store writes and deletes only its own files (a directory shared with other files is safe: a
user's ``index.json`` there is left alone, and the cache writes nothing there), and it loads only
files of this user's, in a directory checked whenever it is opened (:mod:`.trust`).
Writes are batched and flushed at exit; a multiprocessing child (whose workers end with
``os._exit``, or are terminated) writes each kernel at once instead.

What is stored: each raw kernel whose code is position independent (:mod:`.position`), under a
SHA-256 of the descriptor, the ISA, the generators' source version, tppasm's version and the host
features code generation reads (:mod:`.kernels`); each native entry stub as a template whose
addresses are patched per process (:mod:`.stubs`). Every blob's SHA-256 is checked before its
bytes are copied into executable memory; a blob that fails is discarded and regenerated. The
directory's format and its safety under concurrent and killed writers: :mod:`.disk`.

Only :func:`tppasm.get_kernel` (and so every ``tppasm.brgemm``, ``tppasm.unary``, ... and loop
body) reads the disk; ``Kernel(desc, isa)`` always generates, which is what code that changes a
generator's module settings at run time (tests, experiments) must use.

The tuner's records (a small API for any component with expensive, reusable decisions)::

    remember("tune", key, {"spec": "aBC", "us": 41.5})    # key: any string (hashed)
    recall("tune", key)                                    # -> the record, or None
    records("tune")                                        # [("tune", record)] of the namespace
    forget("tune")                                         # every record of the namespace

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as d, using(d):
...     remember("doc", "gemm 64x64", {"spec": "aBC"})
...     recall("doc", "gemm 64x64"), recall("doc", "never stored")
...     info()["entries"]
True
({'spec': 'aBC'}, None)
{'doc': 1}
"""
import contextlib
import hashlib
import os
import re
import threading
import warnings

from .disk import DiskStore, check_directory
from .kernels import KernelCode

DEFAULT_MB = 256
RESERVED = ("kernel", "stub")          # namespaces of the kernel cache itself
_ON, _OFF = ("", "1", "on", "yes", "true"), ("0", "off", "no", "false")

_lock = threading.Lock()
_state = None          # None: not decided yet; else (store, KernelCode), both None when off
_why_off = None


def directory():
    """The cache directory this process would use (TPPASM_CACHE_DIR, XDG_CACHE_HOME, ~/.cache).

    >>> os.path.basename(directory()) in ("tppasm", os.path.basename(os.environ.get("TPPASM_CACHE_DIR", "")))
    True
    """
    return _locate()[0]


def _locate():
    """(the cache directory, None), or (the directory asked for, why it cannot be used: a phrase that
    follows it). A relative one (no usable home: HOME relative or empty) is refused by :func:`_get`."""
    explicit = _path_setting("TPPASM_CACHE_DIR")
    if explicit:
        try:
            return os.path.abspath(os.path.expanduser(explicit)), None
        except OSError as e:        # relative, and the working directory is gone (getcwd fails)
            return explicit, (f"is relative and the working directory cannot be read ({e.strerror}); set "
                              "TPPASM_CACHE_DIR to an absolute path")
    xdg = _path_setting("XDG_CACHE_HOME")
    if os.path.isabs(xdg):
        return os.path.join(xdg, "tppasm"), None
    home = "~" if os.environ.get("HOME") == "" else os.path.expanduser("~")     # "" would make it /.cache
    return os.path.join(home, ".cache", "tppasm"), None


def _path_setting(name):
    """Environment variable ``name`` as a path: as written (a directory's name may end in a blank),
    "" when unset or only blanks."""
    value = os.environ.get(name, "")
    return value if value.strip() else ""


def _settings():
    """(enabled, cap in bytes) from the environment; ValueError naming the variable if malformed."""
    flag = os.environ.get("TPPASM_CACHE", "").strip().lower()
    if flag not in _ON + _OFF:
        raise ValueError(f"TPPASM_CACHE={flag!r}: expected 0 (cache off) or 1 (on, the default)")
    text = os.environ.get("TPPASM_CACHE_MB", "").strip()
    try:
        mb = _ascii_float(text) if text else DEFAULT_MB
    except ValueError:
        mb = -1
    if not 1 <= mb < 1 << 40:
        raise ValueError(f"TPPASM_CACHE_MB={text!r}: expected a size in MiB of at least 1 (default {DEFAULT_MB})")
    return flag not in _OFF, int(mb * (1 << 20))


def _ascii_float(text):
    """float(text) for plain ASCII spellings only (float() also takes '1_000' and other scripts' digits)."""
    if not text.isascii() or "_" in text:
        raise ValueError(text)
    return float(text)


def _get():
    global _state, _why_off
    state = _state
    if state is None:
        with _lock:
            if _state is None:
                enabled, cap = _settings()
                root, problem = _locate()
                why = None if enabled else "off (TPPASM_CACHE=0)"
                if why is None and problem is None and not os.path.isabs(root):
                    why = f"no home directory to put {root} in; set TPPASM_CACHE_DIR"
                if why is None:
                    problem = problem or check_directory(root)
                    if problem is not None:
                        why = f"{root} {problem}"
                        warnings.warn(f"tppasm: not using the kernel cache: {why}; kernels are generated in memory "
                                      "meanwhile (TPPASM_CACHE=0 turns the cache off)", RuntimeWarning, stacklevel=4)
                store = None if why else DiskStore(root, cap)
                _state, _why_off = (store, KernelCode(store) if store else None), why
            state = _state
    return state


def store():
    """The process's :class:`~.disk.DiskStore`, or None when the cache is off or refused.

    >>> import tempfile, tppasm.cache as cache
    >>> with tempfile.TemporaryDirectory() as d, cache.using(d):
    ...     cache.store().root == d
    True
    """
    return _get()[0]


def kernel_code():
    """The process's :class:`~.kernels.KernelCode` (what ``get_kernel`` gives ``Kernel``), or None.

    >>> import tempfile, tppasm.cache as cache
    >>> with tempfile.TemporaryDirectory() as d, cache.using(d):
    ...     cache.kernel_code().store is cache.store()
    True
    """
    return _get()[1]


def reset():
    """Forget the process's store (writing what it has pending, closing its files): the
    environment is read again.

    >>> import tempfile, tppasm.cache as cache
    >>> with tempfile.TemporaryDirectory() as d, cache.using(d) as before:
    ...     cache.reset(); cache.store() is before, cache.store().root == before.root
    (False, True)
    """
    global _state, _why_off
    with _lock:
        if _state is not None and _state[0] is not None:
            _state[0].close()
        _state, _why_off = None, None


@contextlib.contextmanager
def using(path):
    """Use the cache in directory ``path`` inside the ``with`` block (tests, experiments); the
    previous setting afterwards. Sets ``TPPASM_CACHE_DIR`` for the block: not for threaded code.

    >>> import tempfile, tppasm.cache as cache
    >>> with tempfile.TemporaryDirectory() as d:
    ...     with cache.using(d) as s:
    ...         cache.directory() == d == s.root
    ...     cache.directory() == d
    True
    False
    """
    saved = os.environ.get("TPPASM_CACHE_DIR")
    os.environ["TPPASM_CACHE_DIR"] = os.fspath(path)
    reset()
    try:
        yield store()
    finally:
        if saved is None:
            os.environ.pop("TPPASM_CACHE_DIR", None)
        else:
            os.environ["TPPASM_CACHE_DIR"] = saved
        reset()


def after_fork_in_child():
    """A forked child: new locks (the parent's holders do not exist here), nothing pending."""
    global _lock
    _lock = threading.Lock()
    if _state is not None and _state[0] is not None:
        _state[0].after_fork_in_child()


os.register_at_fork(after_in_child=after_fork_in_child)


def _check_namespace(namespace):
    if not isinstance(namespace, str) or not re.fullmatch(r"[a-z0-9_.-]{1,64}", namespace) or namespace in RESERVED:
        raise ValueError(f"namespace {namespace!r}: expected a short lowercase name (letters, digits, '_', '.', "
                         f"'-'), not one of {', '.join(RESERVED)}, e.g. 'tune'")


def _record_key(namespace, key):
    _check_namespace(namespace)
    if not isinstance(key, str):
        raise TypeError(f"key {key!r}: expected a string (e.g. repr of what the record depends on)")
    return f"{namespace}/{hashlib.sha256(key.encode()).hexdigest()[:40]}"


def remember(namespace, key, record):
    """Store the JSON-able ``record`` under (``namespace``, ``key``) on disk now; whether it got there
    (False if the cache is off or the directory cannot be written: a warning says why, once; False
    with a warning naming ``TPPASM_CACHE_MB`` if its JSON is larger than 80% of the cap, which
    eviction keeps: nothing else is evicted for it). A record nests at most
    :data:`~.files.MAX_RECORD_DEPTH` (32) lists and dicts deep: a deeper one is a TypeError.

    >>> import tempfile, tppasm.cache as cache
    >>> with tempfile.TemporaryDirectory() as d, cache.using(d):
    ...     cache.remember("doc", "gemm 64x64 f32", {"spec": "aBC", "us": 41.5})
    ...     cache.recall("doc", "gemm 64x64 f32")
    True
    {'spec': 'aBC', 'us': 41.5}
    """
    k = _record_key(namespace, key)
    s = store()
    if s is None:
        return False
    try:
        return s.put_record(k, record)
    except (TypeError, ValueError) as e:
        what = "" if "MAX_RECORD_DEPTH" in str(e) else "; pass dicts, lists, strings, numbers, booleans and None only"
        raise TypeError(f"record for {namespace}/{key!r}: {e}{what}") from None


def recall(namespace, key):
    """The record stored under (``namespace``, ``key``), or None (absent, evicted, or the cache off).

    >>> import tempfile, tppasm.cache as cache
    >>> with tempfile.TemporaryDirectory() as d, cache.using(d):
    ...     _ = cache.remember("doc", "gemm 64x64 f32", {"spec": "aBC"})
    ...     cache.recall("doc", "gemm 64x64 f32"), cache.recall("doc", "gemm 32x32 f32")
    ({'spec': 'aBC'}, None)
    """
    k = _record_key(namespace, key)
    s = store()
    return None if s is None else s.get_record(k)


def info():
    """What the cache holds and its counts (as ``python -m tppasm cache info`` prints them).

    >>> import tempfile, tppasm.cache as cache
    >>> with tempfile.TemporaryDirectory() as d, cache.using(d):
    ...     _ = cache.remember("doc", "k", [1])
    ...     cache.info()["enabled"], cache.info()["directory"] == d, cache.info()["entries"]
    (True, True, {'doc': 1})
    """
    s = store()
    if s is None:
        return {"directory": directory(), "enabled": False, "why": _why_off}
    return {"enabled": True, **s.info()}


def records(namespace=None):
    """[(namespace, record)] stored for ``namespace`` (every one when None), least recently used first;
    [] when the cache is off.

    >>> import tempfile, tppasm.cache as cache
    >>> with tempfile.TemporaryDirectory() as d, cache.using(d):
    ...     for ns, key, rec in [("doc", "a", 1), ("doc", "b", 2), ("other", "a", 3)]:
    ...         _ = cache.remember(ns, key, rec)
    ...     cache.records("doc"), len(cache.records())
    ([('doc', 1), ('doc', 2)], 3)
    """
    if namespace is not None:
        _check_namespace(namespace)
    s = store()
    return [] if s is None else [(k.split("/", 1)[0], r) for k, r in s.records(namespace)]


def forget(namespace):
    """Delete the records of ``namespace`` (e.g. "tune": every remembered tuning result), keeping the
    kernels and other records; how many were deleted (0 when the cache is off).

    >>> import tempfile, tppasm.cache as cache
    >>> with tempfile.TemporaryDirectory() as d, cache.using(d):
    ...     _ = cache.remember("doc", "a", 1); _ = cache.remember("other", "a", 2)
    ...     cache.forget("doc"), cache.recall("doc", "a"), cache.recall("other", "a")
    (1, None, 2)
    """
    _check_namespace(namespace)
    s = store()
    return 0 if s is None else s.forget(namespace)


def clear():
    """Delete the store's files in this process's cache directory (none of the user's); the bytes
    deleted (0 when the cache is off: :func:`clear_directory` clears it anyway).

    >>> import tempfile, tppasm.cache as cache
    >>> with tempfile.TemporaryDirectory() as d, cache.using(d):
    ...     _ = cache.remember("doc", "a", 1)
    ...     cache.clear() > 0, cache.recall("doc", "a")
    (True, None)
    """
    s = store()
    return 0 if s is None else s.clear()


def clear_directory():
    """Empty the cache directory of the store's files, also when ``TPPASM_CACHE=0`` turned the
    cache off: {"directory", "entries" (how many there were), "bytes" (deleted)}; None when there
    is nothing to clear (no directory, or one refused: ``info()["why"]`` says why). OSError naming
    the fix if the directory is unsafe or something stays.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d, using(d):
    ...     _ = remember("doc", "k", [1]); clear_directory()["entries"]
    1
    """
    s = store()
    if s is None:
        root = directory()
        if _settings()[0] or not os.path.isabs(root) or not os.path.isdir(root):
            return None
        s = DiskStore(root, _settings()[1])             # the cache is off: this store only clears
    before = s.info()
    return {"directory": s.root, "entries": sum(before["entries"].values()), "bytes": s.clear()}


def flush():
    """Write now what this process keeps pending for the disk (done anyway at exit).

    >>> import os, tempfile, tppasm.cache as cache
    >>> from tppasm.eltwise import Unary
    >>> from tppasm.kernel import Kernel
    >>> with tempfile.TemporaryDirectory() as d, cache.using(d):
    ...     _ = Kernel(Unary("relu", 2, 3), None, code_cache=cache.kernel_code())     # as get_kernel stores it
    ...     "index.json" in os.listdir(d), cache.flush(), "index.json" in os.listdir(d)
    (False, None, True)
    """
    s = store()
    if s is not None:
        s.flush()
