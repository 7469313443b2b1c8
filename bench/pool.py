"""Fork-join cost of an empty parallel region: the native pool against Python pools and libgomp.

``python -m bench pool [--json FILE] [--runs 7] [--regions 10000]``

Every figure is the median over ``--runs`` runs of back-to-back empty regions issued from Python.
libgomp rows run in a subprocess each, since ``OMP_WAIT_POLICY`` is read when libgomp loads.
"""
import argparse
import concurrent.futures
import ctypes
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time

from .common import Report, write_json
from .options import count, json_option


def _per_region(issue, regions, runs):
    """Microseconds per region: median, min, max over ``runs`` runs of ``issue(regions)``."""
    issue(max(regions // 10, 10))                          # warm up: threads started, code hot
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        issue(regions)
        samples.append((time.perf_counter() - t) / regions * 1e6)
    return statistics.median(samples), min(samples), max(samples)


def _nop(nargs):
    from isa.x86 import Function
    return Function("nop", ["ptr"] * nargs).finalize()


def _barrier_loop():
    """fn(args, tid, n): call barrier(state, tid) args[2] times; args = {barrier_fn, state, count}."""
    from isa.x86 import Function, qword, rbx, rdi, rsi
    from isa.x86.registers import r12, r13
    f = Function("barriers", ["ptr", "i64", "i64"])
    f.stack(8)
    a = f.asm
    a.mov(rbx, f.args[0])
    a.mov(r12, f.args[1])
    a.mov(r13, [rbx + 16])
    top = a.label("top")
    a.bind(top)
    a.mov(rdi, [rbx + 8])
    a.mov(rsi, r12)
    a.call(qword[rbx])
    a.sub(r13, 1)
    a.jnz(top)
    return f.finalize()


def _pool_rows(report, regions, runs):
    from isa.pool import Pool
    nop, barriers = _nop(3), _barrier_loop()
    for n in (1, 2):
        pool = Pool(n)
        run, address = pool.run, nop.address

        def issue(k):
            for _ in range(k):
                run(address, 0)
        med, lo, hi = _per_region(issue, regions, runs)
        report.add("tppasm pool (JIT'd workers)", n, med, lo, hi, spin_iterations=pool.spin_iterations)
        if n == 2:
            count = 10_000
            args = (ctypes.c_uint64 * 3)(pool.barrier_fn, pool.barrier_state, count)
            region = lambda k: [run(barriers.address, ctypes.addressof(args)) for _ in range(k)]  # noqa: E731
            med_b, lo_b, hi_b = _per_region(region, 1, runs)
            report.add(f"tppasm barrier (1 region of {count} barriers), per barrier", n,
                       med_b / count, lo_b / count, hi_b / count)
        pool._at_exit()


def _python_rows(report, regions, runs):
    regions = max(regions // 10, 100)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        noop = lambda: None  # noqa: E731

        def issue(k):
            for _ in range(k):
                fut = ex.submit(noop)
                noop()                                      # tid 0 runs on the caller
                fut.result()
        report.add("ThreadPoolExecutor(1) + caller", 2, *_per_region(issue, regions, runs))

    jobs, done = queue.SimpleQueue(), queue.SimpleQueue()

    def worker():
        while jobs.get() is not None:
            done.put(True)
    t = threading.Thread(target=worker, daemon=True)
    t.start()

    def issue(k):
        for _ in range(k):
            jobs.put(True)
            done.get()
    report.add("persistent Python thread + SimpleQueue", 2, *_per_region(issue, regions, runs))
    jobs.put(None)
    t.join()


def _gomp_child(regions, runs, nthreads):
    """In a fresh process: libgomp's GOMP_parallel on an empty JIT'd function."""
    lib = ctypes.CDLL("libgomp.so.1")
    parallel = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint)(
        ("GOMP_parallel", lib))
    nop = _nop(1)

    def issue(k):
        for _ in range(k):
            parallel(nop.address, None, nthreads, 0)
    print(json.dumps(_per_region(issue, regions, runs)))


def _gomp_rows(report, regions, runs):
    try:
        ctypes.CDLL("libgomp.so.1")
    except OSError as e:
        report.add(f"libgomp GOMP_parallel: not available ({e})", 2, float("nan"), float("nan"), float("nan"))
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for policy in (None, "active", "passive"):
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        if policy:
            env["OMP_WAIT_POLICY"] = policy
        for n in (1, 2):
            code = f"import bench.pool as b; b._gomp_child({regions}, {runs}, {n})"
            proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                  timeout=300)
            if proc.returncode != 0:
                raise RuntimeError(f"libgomp child failed:\n{proc.stderr}")
            name = f"libgomp GOMP_parallel, OMP_WAIT_POLICY={policy or '(default)'}"
            report.add(name, n, *json.loads(proc.stdout.split("\n")[-2]))


def parse(argv=None):
    """The options of ``python -m bench pool``, checked (a bad one: argparse's error); no work done."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m bench pool")
    json_option(p)
    p.add_argument("--runs", type=count("runs", "--runs 7"), default=7,
                   help="runs per row; each figure is their median (default 7)")
    p.add_argument("--regions", type=count("regions", "--regions 10000"), default=10_000,
                   help="parallel regions per run of the tppasm pool and libgomp rows; the Python-thread rows run "
                        "a tenth of them (at least 100), the barrier row one region of 10000 barriers "
                        "(default 10000)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    report = Report(f"Empty parallel region issued from Python, µs (median of {args.runs} runs; "
                    f"{len(os.sched_getaffinity(0))} CPUs, load average {os.getloadavg()[0]:.1f} at start)",
                    ["engine", "threads", "µs/region", "min", "max"])
    _pool_rows(report, args.regions, args.runs)
    _python_rows(report, args.regions, args.runs)
    _gomp_rows(report, args.regions, args.runs)
    write_json(args.json, [report])


if __name__ == "__main__":
    main(sys.argv[1:])
