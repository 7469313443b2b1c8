"""Executable memory is never writable and executable at once, and is returned when freed."""
import gc
import re

import numpy as np

from isa.memory import ExecutableMemory
from isa.x86 import Function, rax


def _mappings():
    out = {}
    with open("/proc/self/maps") as f:
        for line in f:
            addr, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in addr.split("-"))
            out[lo] = (hi, perms)
    return out


def _perms_at(address):
    for lo, (hi, perms) in _mappings().items():
        if lo <= address < hi:
            return perms
    return None


def test_no_mapping_is_writable_and_executable_after_jit():
    fns = []
    for i in range(20):
        fn = Function(f"f{i}", [], returns="i64")
        fn.asm.mov(rax, i)
        fns.append(fn.finalize())
    assert [f() for f in fns] == list(range(20))
    for f in fns:
        assert _perms_at(f.address).startswith("r-x")
    wx = [(hex(lo), p) for lo, (hi, p) in _mappings().items() if re.match(r"..?w.?x|.wx", p)]
    assert not [m for m in wx if "w" in m[1] and "x" in m[1]], wx


def test_freeing_returns_the_pages():
    mem = ExecutableMemory(b"\xc3" * 10000)
    addr = mem.address
    assert _perms_at(addr) == "r-xp" and mem.size == 12288
    del mem
    gc.collect()
    assert _perms_at(addr) is None or not _perms_at(addr).startswith("r-x")


def test_explicit_free_and_empty_code():
    mem = ExecutableMemory(b"\xc3")
    mem.free()
    assert not mem.alive
    try:
        ExecutableMemory(b"")
    except ValueError as e:
        assert "at least one byte" in str(e)
    else:
        raise AssertionError("empty code accepted")


def test_code_is_position_independent_bytes():
    fn = Function("k", ["ptr"], returns="i64")
    (p,) = fn.args
    fn.asm.mov(rax, [p + 8])
    f = fn.finalize()
    again = ExecutableMemory(f.code)          # the same bytes run from another address
    import ctypes
    g = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p)(again.address)
    x = np.array([1, 42], np.int64)
    assert f(x.ctypes.data) == g(x.ctypes.data) == 42
