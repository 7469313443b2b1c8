"""Executable memory is never writable and executable at once, and is returned when freed."""
import gc

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


_WX_SCRIPT = r"""
import numpy as np, tppasm as tpp
from isa.x86 import Function, rax
fns = []
for i in range(20):
    fn = Function(f"f{i}", [], returns="i64")
    fn.asm.mov(rax, i)
    fns.append(fn.finalize())
assert [f() for f in fns] == list(range(20))
gemm = tpp.brgemm(m=8, n=8, k=8)
A = np.ones((2, 8, 8), np.float32); B = np.ones((2, 8, 8), np.float32); C = np.empty((8, 8), np.float32)
gemm(A, B, C, count=2)
assert (C == 16).all()
from loops import Loop, kernel
zero = tpp.zero(8, 8)
@kernel("A", Loop(0, 4))
def clear(i, X):
    zero(X[i])
X = np.ones((4, 8, 8), np.float32)
clear(X)
assert not X.any()
bad = []
for line in open("/proc/self/maps"):
    addr, perms = line.split()[:2]
    if "w" in perms and "x" in perms:
        bad.append(line.strip())
print("WX:", bad)
"""


def test_no_mapping_is_writable_and_executable_after_jit():
    """In a fresh process (other libraries in the test run, e.g. unicorn, map RWX themselves)."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-c", _WX_SCRIPT], capture_output=True, text=True, env=env, cwd=root)
    assert r.returncode == 0, r.stderr
    assert "WX: []" in r.stdout, r.stdout


def test_jit_code_is_read_and_execute():
    fn = Function("f", [], returns="i64")
    fn.asm.mov(rax, 3)
    f = fn.finalize()
    assert f() == 3 and _perms_at(f.address).startswith("r-x")


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


def test_collected_kernels_free_their_builtin_entry_safely():
    """A kernel whose ``__call__`` is a native builtin sits in a reference cycle; collecting it must
    not free the builtin's PyMethodDef before the builtin (a read after free: glibc's perturbed
    frees turned it into a segfault in every run)."""
    from tests.scripts import run
    out = run("""
        import gc, numpy as np, tppasm
        tppasm.set_kernel_cache_limit(1)
        x = np.ones((1, 40), np.float32)
        for n in range(1, 40):
            k = tppasm.unary("exp", 1, n)
            k(x[:, :n])
            del k
            gc.collect()
        print("survived")
    """, env={"PYTHONMALLOC": "malloc", "MALLOC_PERTURB_": "255", "TPPASM_CACHE": "0"})
    assert "survived" in out


_EXIT_SCRIPT = """
import atexit, sys, threading, time, numpy as np, tppasm as tpp
def at_exit():                       # registered before the process's first weakref.finalize
    print("at exit", bool((relu(-np.ones((64, 64), np.float32)) == 0).all()), flush=True)
atexit.register(at_exit)
relu, big = tpp.relu(64, 64), tpp.relu(1024, 1024)
x, y = np.ones((1024, 1024), np.float32), np.empty((1024, 1024), np.float32)
def loop():
    while True:
        big(x, y)                     # a daemon thread inside a kernel while the interpreter ends
threading.Thread(target=loop, daemon=True).start()
time.sleep(0.05)
"""


def test_kernels_stay_mapped_while_the_interpreter_ends():
    """An atexit handler calling a kernel, and a daemon thread inside one, once found the code
    unmapped by the finalizers' own exit hook (SIGSEGV)."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT], capture_output=True, text=True, env=env, cwd=root,
                           timeout=120)
        assert r.returncode == 0 and "at exit True" in r.stdout, (r.returncode, r.stdout, r.stderr)
