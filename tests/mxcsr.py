"""The calling thread's MXCSR (x86's SSE/AVX control and status register) for tests: read it, or
run a block under another value (restored after it, also when the block raises).

>>> from isa.cpu import host
>>> host().arch != "x86_64" or read() & DEFAULT == DEFAULT        # exceptions masked: Python's default
True
"""
import contextlib
import functools

DEFAULT = 0x1F80                # all exceptions masked, round to nearest, no FTZ/DAZ
RC_SHIFT = 13                   # MXCSR.RC, bits 13-14: 0 nearest, 1 down, 2 up, 3 toward zero
RC_BITS = 3 << RC_SHIFT


@functools.lru_cache(maxsize=None)
def _functions():
    """(get, put): two tiny JIT functions, built on first use (x86 only)."""
    from isa.x86 import Function, eax, edi, rsp
    get = Function("get_mxcsr", [], returns="i64")
    get.stack(16)
    get.asm.stmxcsr([rsp])
    get.asm.mov(eax, [rsp])
    put = Function("set_mxcsr", ["i64"])
    put.stack(16)
    put.asm.mov([rsp], edi)
    put.asm.ldmxcsr([rsp])
    return get.finalize(), put.finalize()


def read():
    """This thread's MXCSR."""
    return _functions()[0]()


@contextlib.contextmanager
def mxcsr(value):
    """Run the block with this thread's MXCSR set to ``value``; the caller's is restored after."""
    get, put = _functions()
    saved = get()
    put(value)
    try:
        yield
    finally:
        put(saved)


def rounding(mode):
    """:func:`mxcsr` with only the rounding control changed to ``mode`` (0-3, see RC_SHIFT)."""
    return mxcsr((read() & ~RC_BITS) | mode << RC_SHIFT)
