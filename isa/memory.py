"""Executable memory that is never writable and executable at the same time (W^X).

Code is copied into pages mapped read+write, then the pages are switched to read+execute with
``mprotect``. The pages are unmapped when the owning :class:`ExecutableMemory` is collected, or
freed with :meth:`~ExecutableMemory.free`; :func:`mapped` counts what is mapped now.
"""
import ctypes
import errno as _errno
import mmap
import os
import platform
import weakref

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)

PAGE = mmap.PAGESIZE
_MAP_FAILED = ctypes.c_void_p(-1).value
_live = {}          # address -> size of every mapping not yet freed (dict updates are atomic)


def mapped():
    """(mappings, bytes) of executable memory mapped by :class:`ExecutableMemory` and not yet freed.

    >>> n, size = mapped(); mem = ExecutableMemory(b"\\xc3")
    >>> mapped() == (n + 1, size + mem.size)
    True
    >>> mem.free(); mapped() == (n, size)
    True
    """
    sizes = list(_live.values())
    return len(sizes), sum(sizes)


def _unmap(addr, size):
    _live.pop(addr, None)
    _libc.munmap(addr, size)


_W_XOR_X_REFUSED = ("this system forbids making written memory executable (a W^X policy: systemd's "
                    "MemoryDenyWriteExecute=yes, prctl PR_SET_MDWE, SELinux's execmem / deny_execmem); tppasm writes "
                    "machine code at run time, so lift that policy for this process")


def _os_error(what, size):
    """OSError of the failed ``what`` (mmap or mprotect of ``size`` bytes) with errno, naming the cause."""
    errno = ctypes.get_errno()
    message = f"{what} of {size} bytes of code failed: {os.strerror(errno)}"
    if what == "mprotect" and errno in (_errno.EACCES, _errno.EPERM):
        message += f": {_W_XOR_X_REFUSED}"
    elif errno == _errno.ENOMEM:
        message += " (the address space is full: ulimit -v, or too many mappings: vm.max_map_count)"
    return OSError(errno, message)


def _flush_icache(address, size):
    """AArch64 needs the instruction cache synchronized with the data just written."""
    if platform.machine() not in ("aarch64", "arm64"):
        return
    for name in ("libgcc_s.so.1", None):
        lib = ctypes.CDLL(name)
        fn = getattr(lib, "__clear_cache", None) or getattr(lib, "__aarch64_sync_cache_range", None)
        if fn is not None:
            fn.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
            fn(address, address + size)
            return
    raise OSError("cannot synchronize the instruction cache: __clear_cache not found in libgcc_s")


class ExecutableMemory:
    """Read+execute pages holding ``code`` (bytes); unmapped when this object is collected.

    >>> mem = ExecutableMemory(b"\\xc3")      # ret
    >>> mem.size >= 1 and mem.address % 4096 == 0
    True
    """

    __slots__ = ("address", "size", "_finalizer", "__weakref__")

    def __init__(self, code: bytes):
        if not isinstance(code, (bytes, bytearray, memoryview)):      # (ctypes would copy a str's characters)
            raise TypeError(f"ExecutableMemory takes the code as bytes, got {type(code).__name__}: pass bytes(code)")
        code = bytes(code)
        if not code:
            raise ValueError("ExecutableMemory needs at least one byte of code")
        size = (len(code) + PAGE - 1) // PAGE * PAGE
        addr = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE,
                          mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if addr in (None, _MAP_FAILED):
            raise _os_error("mmap", size)
        ctypes.memmove(addr, code, len(code))
        if _libc.mprotect(addr, size, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
            err = _os_error("mprotect", size)
            _libc.munmap(addr, size)
            raise err
        _flush_icache(addr, len(code))
        self.address = addr
        self.size = size
        _live[addr] = size
        self._finalizer = weakref.finalize(self, _unmap, addr, size)
        # not at interpreter exit: an atexit handler registered before this finalizer's own hook
        # (before the first finalize of the process), or a daemon thread still in a kernel, would
        # then jump into unmapped pages (SIGSEGV); the process's end unmaps them
        self._finalizer.atexit = False

    def free(self):
        """Unmap now (the object must not be called afterwards)."""
        self._finalizer()

    def __copy__(self):
        return self         # the pages have one owner: a copy would unmap them a second time

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise TypeError("executable memory cannot be pickled: the code is bound to this process (its address "
                        "means nothing in another); rebuild the function there (a TPP kernel pickles by its "
                        "descriptor: pickle the kernel, not its .raw)")

    @property
    def alive(self):
        return self._finalizer.alive
