"""The kernel caches: a warm process loading 100 kernels from the disk cache against generating them,
the cost of a miss, entry stubs from templates against assembling them, and what the bounded
in-process cache keeps mapped after 2,000 distinct kernels.

``python -m bench cache [--repeat R] [--json FILE]``

Every process figure comes from a fresh interpreter (``python -m bench.cache --child MODE``) with
its own cache directory; the modes run interleaved, R times each, and the table shows medians
(and minima: on a shared machine the minimum is the least disturbed run). The children write and
reuse Python bytecode in a directory of their own (a warm-up child fills it), as a user's
installation does, even where PYTHONDONTWRITEBYTECODE is set: otherwise every child would compile
the modules it imports on its first kernels (~50 ms here), a cost no kernel cache can save.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from .common import Report, median_time, write_json
from .options import count, json_option


def kernel_mix():
    """100 distinct descriptors: element-wise (of several ops and widths), reductions, transposes, BRGEMMs."""
    from tppasm.brgemm import Brgemm
    from tppasm.eltwise import Binary, Reduce, Transform, Unary
    out = [Unary(op, 8, n) for op in ("relu", "tanh", "gelu", "copy") for n in range(17, 27)]
    out += [Binary(op, 8, n) for op in ("add", "mul", "max") for n in range(33, 43)]
    out += [Reduce("add", 8, n, "rows") for n in range(5, 15)]
    out += [Transform("transpose", 8, n) for n in range(3, 13)]
    out += [Brgemm(m, n, 32) for m in (16, 32) for n in (8, 16, 24, 32, 48)]
    return out


def _child(mode):
    """Time the kernels of :func:`kernel_mix` in this process; print the figures as JSON."""
    t = time.perf_counter()
    import tppasm.cache as tc
    from isa.cpu import host
    from tppasm.kernel import get_kernel
    host()                                  # (the instruction forms: as a process builds them, while generating)
    mix = kernel_mix()
    setup = time.perf_counter() - t
    if mode.startswith("memory"):
        return _memory(mode)
    t, cpu = time.perf_counter(), time.process_time()
    first = get_kernel(mix[0])
    first_s = time.perf_counter() - t
    kernels = [first] + [get_kernel(d) for d in mix[1:]]
    total, cpu = time.perf_counter() - t, time.process_time() - cpu
    t = time.perf_counter()
    tc.flush()
    flush = time.perf_counter() - t
    print(json.dumps({"setup_ms": setup * 1e3, "first_ms": first_s * 1e3, "total_ms": total * 1e3, "cpu_ms": cpu * 1e3,
                      "flush_ms": flush * 1e3, "from_disk": sum(k.from_disk for k in kernels)}))


def _memory(mode):
    import gc

    import tppasm
    from isa.memory import mapped
    if mode == "memory-unbounded":
        tppasm.set_kernel_cache_limit(10 ** 9)
    base = mapped()[1], _rss()
    for n in range(1, 2001):
        tppasm.unary("copy", 1, n)
    gc.collect()
    print(json.dumps({"exec_bytes": mapped()[1] - base[0], "rss_bytes": _rss() - base[1]}))


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _run(mode, cache_dir, extra_env=None):
    env = {**os.environ, "TPPASM_CACHE_DIR": cache_dir, **(extra_env or {})}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = os.path.join(os.path.dirname(cache_dir), "bytecode")
    out = subprocess.run([sys.executable, "-m", "bench.cache", "--child", mode], env=env, check=True,
                         capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__))).stdout
    return json.loads(out.splitlines()[-1])


def _stats(values):
    return float(np.median(values)), float(np.min(values))


def parse(argv=None):
    """The options of ``python -m bench cache``, checked (a bad one: argparse's error); no work done."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m bench cache")
    p.add_argument("--repeat", type=count("repeats", "--repeat 5"), default=5,
                   help="fresh processes of each kind (default 5)")
    json_option(p)
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    if args.child:
        return _child(args.child)

    runs = {"off": [], "cold": [], "warm": []}
    with tempfile.TemporaryDirectory() as root:
        _run("time", os.path.join(root, "warm-up"))             # fills the children's bytecode directory
        for r in range(args.repeat):
            cold_dir = os.path.join(root, f"cold{r}")
            runs["off"].append(_run("time", os.path.join(root, "unused"), {"TPPASM_CACHE": "0"}))
            runs["cold"].append(_run("time", cold_dir))
            runs["warm"].append(_run("time", cold_dir))
        memory = {m: _run(m, os.path.join(root, "memory")) for m in ("memory-unbounded", "memory")}

    rep = Report("100 kernels in a fresh process (mix: 40 unary, 30 binary, 10 reduce, 10 transpose, "
                 "10 BRGEMM; ms, median / min of runs)",
                 ["process", "kernels from disk", "all 100 (ms)", "min", "CPU (ms)", "first kernel (ms)",
                  "exit flush (ms)", "vs generating"])
    off_ms = _stats([x["total_ms"] for x in runs["off"]])
    for name, label in (("off", "generating, TPPASM_CACHE=0"), ("cold", "generating + storing (empty cache)"),
                        ("warm", "loading from the disk cache")):
        med, low = _stats([x["total_ms"] for x in runs[name]])
        rep.add(label, runs[name][0]["from_disk"], med, low, _stats([x["cpu_ms"] for x in runs[name]])[0],
                _stats([x["first_ms"] for x in runs[name]])[0],
                _stats([x["flush_ms"] for x in runs[name]])[0], off_ms[0] / med)

    from tppasm.cache import disk, kernels
    from tppasm.eltwise import Unary
    miss = Report("A lookup that misses (in process, µs)", ["step", "µs"])
    with tempfile.TemporaryDirectory() as root:
        code = kernels.KernelCode(disk.DiskStore(root, 1 << 20))
        desc = Unary("relu", 3, 5)
        code.raw_key(desc, "avx2")
        miss.add("key (descriptor text + SHA-256)", median_time(lambda: code.raw_key(desc, "avx2")) * 1e6)
        key = code.raw_key(desc, "avx2")
        miss.add("store lookup, absent (index dict + stat of index.json)",
                 median_time(lambda: code.store.get(key)) * 1e6)

    stub = Report("Native entry stub of a kernel (in process, µs)", ["how", "µs"])
    import ctypes

    from tppasm.cache import stubs
    from tppasm.kernel import _DIVERT
    from tppasm.x86.entry import Addresses, Vectorcall, build_entry
    ops = tuple(desc.operands())
    call = Vectorcall(print, ctypes.addressof(_DIVERT), False)
    stub.add("assembled (build_entry)", median_time(lambda: build_entry(desc.kind, ops, (), 0x7F0000001000, None,
                                                                        call=call)) * 1e6)
    t = stubs.template(desc.kind, ops, (), None, "call")
    addresses = Addresses(ops, (), 0x7F0000001000, call)
    stub.add("patched from its template (instantiate)", median_time(lambda: stubs.instantiate(t, addresses)) * 1e6)

    mem = Report("After 2,000 distinct kernels, all dropped (one process each)",
                 ["in-process cache", "executable MiB", "RSS growth MiB"])
    for mode, label in (("memory-unbounded", "unbounded (as before)"), ("memory", "bounded: 512 kernels (default)")):
        mem.add(label, memory[mode]["exec_bytes"] / 2 ** 20, memory[mode]["rss_bytes"] / 2 ** 20)
    write_json(args.json, [rep, miss, stub, mem])
    return 0


if __name__ == "__main__":
    sys.exit(main())
