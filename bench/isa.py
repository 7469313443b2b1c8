"""Foundation figures: entering a JIT'd function from Python, and encoding speed.

``python -m bench isa``
"""
import argparse
import ctypes
import time

import numpy as np

from .common import Report, median_time, write_json
from .options import json_option


def parse(argv=None):
    """The options of ``python -m bench isa``, checked (a bad one: argparse's error); no work done."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m bench isa")
    json_option(p)
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
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

    operands = operand_costs()

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
    write_json(args.json, [calls, operands, enc])


class Exported:
    """A DLPack producer that is not a NumPy array (as a JAX CPU array is): it hands out
    ``array``'s capsule."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def operand_costs(rounds=7):
    """ns per call of a 1x1 copy kernel and of a one-iteration loop kernel on NumPy arrays, torch
    tensors (f32, bf16) and DLPack objects; the variants are timed in turn, ``rounds`` times, and
    each row gives the median time and the median of its per-round ratios to NumPy's.

    >>> rep = operand_costs(rounds=1)  # doctest: +ELLIPSIS
    <BLANKLINE>
    ## Calling a kernel on NumPy arrays, torch tensors, DLPack objects ...
    >>> rep.rows[0]["operands"]
    'NumPy arrays'
    """
    import tppasm as tpp
    from loops import Loop, kernel
    f32 = np.zeros((1, 1), np.float32), np.zeros((1, 1), np.float32)
    bf16 = tuple(tpp.empty((1, 1), "bf16") for _ in range(2))
    copy, copy16 = tpp.copy(1, 1), tpp.copy(1, 1, dtype="bf16", out_dtype="bf16")

    @kernel("a", Loop(0, 1))
    def nest(i, X, Y):
        copy(X, Y)
    variants = [("NumPy arrays", copy, f32), ("NumPy bf16 arrays", copy16, bf16),
                ("DLPack objects", copy, tuple(Exported(a) for a in f32))]
    try:
        import torch
        variants += [("torch tensors", copy, tuple(torch.from_numpy(a) for a in f32)),
                     ("torch bf16 tensors", copy16, tuple(torch.zeros(1, 1, dtype=torch.bfloat16) for _ in range(2)))]
    except ImportError:
        print("(torch not installed: its rows are left out; pip install torch==2.13.0)")
    variants += [(f"{name}, loop kernel", nest, args) for name, k, args in variants if k is copy]
    rep = Report("Calling a kernel on NumPy arrays, torch tensors, DLPack objects (1x1 copy; 1 thread)",
                 ["operands", "ns/call", "vs NumPy arrays"])
    times = {name: [] for name, _, _ in variants}
    for _ in range(rounds):
        for name, k, args in variants:
            times[name].append(median_time(lambda: k(*args), min_run=0.01, warmup=0.005, runs=3))
    base = {False: times["NumPy arrays"], True: times["NumPy arrays, loop kernel"]}
    for name, _, _ in variants:
        ratios = [t / b for t, b in zip(times[name], base["loop kernel" in name])]
        rep.add(name, float(np.median(times[name])) * 1e9, float(np.median(ratios)))
    return rep
