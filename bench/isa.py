"""Foundation figures: entering a JIT'd function from Python, and encoding speed.

``python -m bench isa``
"""
import argparse
import ctypes
import time

import numpy as np

from .common import Report, median_time, write_json


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench isa")
    p.add_argument("--json")
    args = p.parse_args(argv)
    from isa.x86 import Function, eax, rax, rcx, ymm0, ymm1
    from tppasm.eltwise import Binary, Unary
    from tppasm.kernel import get_kernel

    calls = Report("Calling a JIT'd function from Python (1 thread)", ["call", "ns/call", "vs numpy ufunc floor"])
    x = np.zeros((32, 32), np.float32)
    y, z = x.copy(), x.copy()
    floor = median_time(lambda: np.add(x[:1, :4], 0, out=y[:1, :4]))
    empty = Function("empty", [], returns="i32")
    empty.asm.xor(eax, eax)
    f0 = empty.finalize()
    f0c = ctypes.PYFUNCTYPE(ctypes.c_int32)(f0.address)
    t = median_time(f0c)
    calls.add("ctypes, no arguments", t * 1e9, t / floor)
    three = Function("three", ["ptr"] * 3, returns="i32")
    three.asm.xor(eax, eax)
    f3 = three.finalize()
    t = median_time(lambda: f3.cfunc(x.ctypes.data, y.ctypes.data, z.ctypes.data))
    calls.add("ctypes, 3 arrays via arr.ctypes.data", t * 1e9, t / floor)
    k = get_kernel(Unary("copy", 1, 1))
    a1, b1, c1 = (np.zeros((1, 1), np.float32) for _ in range(3))
    t = median_time(lambda: k(a1, b1))
    calls.add("tppasm kernel, 2 arrays checked natively (1x1 copy)", t * 1e9, t / floor)
    add = get_kernel(Binary("add", 1, 1))
    t = median_time(lambda: add(a1, b1, c1))
    calls.add("tppasm kernel, 3 arrays checked natively (1x1 add)", t * 1e9, t / floor)
    calls.add("numpy ufunc floor: np.add on 4 floats", floor * 1e9, 1.0)

    enc = Report("Encoding", ["function", "instructions", "ms"])
    for n in (300, 3000):
        def build():
            fn = Function("big", ["ptr"])
            a = fn.asm
            for i in range(n // 3):
                a.vmovups(ymm1, [rax + rcx * 4 + 32 * (i % 50)])
                a.vfmadd231ps(ymm0, ymm1, ymm1)
                a.add(rax, 8)
            return fn.finalize()
        build()
        t0 = time.perf_counter()
        reps = 5
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            build()
            ts.append(time.perf_counter() - t0)
        enc.add("vmovups/vfmadd231ps/add", n, float(np.median(ts)) * 1e3)
    write_json(args.json, [calls, enc])
