"""``python -m tppasm info [--json]`` describes the host; ``python -m tppasm demo`` JITs a BRGEMM,
checks it against NumPy and times it beside numpy's matmul; ``python -m tppasm cache info|list|clear``
shows the disk cache of generated kernels, lists its records (the tuner's remembered results) or
empties it; ``python -m tppasm`` alone lists the commands."""
import argparse
import json
import math
import os
import sys
import time
import warnings

import numpy as np


def info(as_json=False):
    from isa.cpu import host, verification
    h = host()
    if as_json:
        print(json.dumps(h.as_dict(), indent=2))
        return
    v = verification(h)
    print(f"arch      {h.arch} ({h.vendor})")
    print(f"isa       {h.isa} (best available: {h.best_isa}; levels: {', '.join(h.levels) or 'none'})")
    print(f"native    {' '.join(v['native']) or 'none'} (code of these levels runs on this CPU; the tests run "
          "the TPP, loop and demo tests at each)")
    if v["interpreter"]:
        print(f"interp    {' '.join(v['interpreter'])} (the host lacks them: their kernels are tested in "
              "isa.x86.interp, which interprets the generated code)")
    if v["emulator"]:
        how = [f"qemu-aarch64 ({v['qemu']})" if v["qemu"] else f"qemu-aarch64 {v['runners']['qemu-aarch64']}",
               "unicorn for fp32" if v["runners"]["unicorn"] is None else f"unicorn: {v['runners']['unicorn']}"]
        print(f"emulated  {' '.join(v['emulator'])} (tested under {'; '.join(how)})")
    if h.sve_vector_bits:
        print(f"sve       {h.sve_vector_bits}-bit vectors")
    on = [k for k, v in h.features.items() if v]
    off = [k for k, v in h.features.items() if not v]
    print(f"features  {' '.join(on) or 'none detected'}")
    if off:
        print(f"absent    {' '.join(off)}")
    for what, why in h.notes.items():
        print(f"note      {what}: {why}")
    if "amx" in h.levels:
        from tppasm.x86 import amx, amx_probe
        how = "TPPASM_AMX_CHUNKS" if amx_probe.setting() != "auto" else "timed once on this CPU, kept in the cache"
        print(f"amx       batch chunks {'on' if amx.chunks_on() else 'off'} ({how}; tppasm.x86.amx_probe)")


def demo():
    import tppasm as tpp
    from isa.cpu import host
    from tppasm.timing import median_time
    m = n = k = 32          # libxsmm's typical block; 16 of them stay in L2 with their B blocks
    count = 16
    rng = np.random.default_rng(0)
    A = rng.standard_normal((count, m, k), dtype=np.float32)
    B = rng.standard_normal((count, k, n), dtype=np.float32)
    C = np.full((m, n), np.nan, np.float32)
    t = time.perf_counter()
    host()                                   # once per process (a kernel's instruction forms: as it is generated)
    setup_ms = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    gemm = tpp.brgemm(m=m, n=n, k=k, dtype="f32", beta=0)
    jit_ms = (time.perf_counter() - t) * 1e3
    print(f"host ISA: {host().isa} (CPU probe: {setup_ms:.0f} ms, once per process)")
    t = time.perf_counter()
    tpp.brgemm(m=m, n=n, k=k, dtype="f32", beta=1)
    again_ms = (time.perf_counter() - t) * 1e3
    how = f"loaded BRGEMM {m}x{n}x{k} from the disk cache" if gemm.from_disk else f"JIT'd BRGEMM {m}x{n}x{k}"
    print(f"{how}, batch-reduce over {count} blocks, in {jit_ms:.1f} ms ({len(gemm.raw.code)} bytes of machine "
          f"code; first kernel of the process: the next one, beta=1, took {again_ms:.1f} ms"
          f"{'' if not gemm.from_disk else '; TPPASM_CACHE=0 times a real JIT'})")
    gemm(A, B, C, count=count)
    expect = np.einsum("bmk,bkn->mn", A.astype(np.float64), B.astype(np.float64))
    err = float(np.max(np.abs(C - expect)) / np.max(np.abs(expect)))
    ok = err < 1e-5
    print(f"check against NumPy (float64): max relative error {err:.2e} -> {'OK' if ok else 'WRONG'}")
    A2 = np.ascontiguousarray(A.transpose(1, 0, 2).reshape(m, count * k))   # the same sum as one matmul
    B2 = B.reshape(count * k, n)
    C2 = np.empty((m, n), np.float32)
    flops = 2.0 * m * n * k * count
    ours = median_time(lambda: gemm(A, B, C, count=count))
    theirs = median_time(lambda: np.matmul(A2, B2, out=C2))
    print(f"tppasm  {ours * 1e6:8.2f} us/call  {flops / ours / 1e9:7.1f} GFLOP/s")
    print(f"numpy   {theirs * 1e6:8.2f} us/call  {flops / theirs / 1e9:7.1f} GFLOP/s  (one matmul, K={count * k})")
    print(f"ratio   {theirs / ours:.2f}x numpy's speed (1 thread, median of 5)")
    return 0 if ok else 1


def cache(action, as_json=False, only=None):
    """``cache info``: where the disk cache is, what it holds, its counts; ``cache clear``: empty it
    (``only``: just the records of that namespace, e.g. "tune")."""
    import tppasm.cache as tc
    from tppasm.display import printable
    if action == "list":
        found = tc.records(only)
        if as_json:
            print(json.dumps([{"namespace": ns, "record": _strict(r)} for ns, r in found], indent=2))
            return 0
        for namespace, record in found:
            print(f"{namespace:6s} {printable(_record_text(namespace, record))}")
        if not found:
            off = "" if tc.info()["enabled"] else " (the cache is off)"
            print(f"no {only + ' ' if only else ''}records{off}")
        return 0
    if action == "clear" and only is not None:        # "" too: tc.forget refuses it, never a full clear
        n = tc.forget(only)
        print(json.dumps({"forgot": n, "namespace": only}) if as_json else
              f"forgot {n} {only} record{'' if n == 1 else 's'}")
        return 0
    if action == "clear":
        done = tc.clear_directory()         # also when TPPASM_CACHE=0 turned the cache off
        off = "" if tc.info()["enabled"] else " (the cache is off: TPPASM_CACHE=0)"
        if as_json:
            print(json.dumps({"cleared": done is not None, "directory": tc.directory(),
                              "entries": done["entries"] if done else 0, "bytes": done["bytes"] if done else 0}))
        elif done is not None:
            print(f"cleared {printable(done['directory'])} ({done['entries']} entries, {_size(done['bytes'])}){off}")
        else:
            why = tc.info()["why"]
            print("nothing to clear: " + printable(f"no directory {tc.directory()}" if why.startswith("off") else
                                                    f"the cache is {why}"))
        return 0
    missing = _missing_directory(tc)
    i = tc.info() if missing is None else {"directory": missing[0], "enabled": False, "why": missing[1]}
    if as_json:
        print(json.dumps(i, indent=2))
        return 0
    if not i["enabled"]:
        print(f"directory {printable(i['directory'])}\nstate     {printable(i['why'])}")
        return 0
    entries = ", ".join(f"{ns} {n}" for ns, n in sorted(i["entries"].items())) or "none"
    stats = ", ".join(f"{k} {v}" for k, v in i["stats"].items())
    print(f"directory {printable(i['directory'])}")
    print(f"entries   {entries}")
    print(f"size      {_size(i['live_bytes'])} stored, {_size(i['disk_bytes'])} on disk in {i['segments']} "
          f"segments; cap {_size(i['cap_bytes'])} (TPPASM_CACHE_MB)")
    print(f"counts    {stats} (all processes so far)")
    for problem in i.get("problems", []):
        print(f"problem   {printable(problem)}")
    print("list its records with: python -m tppasm cache list; clear it with: python -m tppasm cache clear "
          "[--only tune]; turn it off with TPPASM_CACHE=0")
    return 0


def _missing_directory(tc):
    """(the cache directory, what to say) when the cache is on and the directory does not exist
    (``cache info`` reports it rather than creating it: "not created yet", or why it cannot be),
    else None."""
    from tppasm.cache.trust import why_not_creatable
    root = tc.directory()
    on = tc._settings()[0]              # raises ValueError naming a malformed TPPASM_CACHE / TPPASM_CACHE_MB
    if not (on and os.path.isabs(root) and not os.path.lexists(root)):
        return None
    return root, why_not_creatable(root) or "not created yet (it is made when a kernel is first cached)"


def _record_text(namespace, record):
    """One line for a stored record: a tuning result as what was tuned -> the winner (any other
    record, or one whose fields have other types, as its JSON)."""
    if namespace == "tune" and isinstance(record, dict) and "spec" in record:
        try:
            return _tuning_text(record)
        except (AttributeError, TypeError, ValueError, OverflowError):
            pass
    return json.dumps(record)


def _strict(value):
    """``value`` (a record: JSON types) with NaN and infinities as null, which strict JSON parsers
    take (``tppasm.cache.remember`` stores them as Python's json writes them).

    >>> _strict({"s": [float("nan"), 1.5], "n": float("inf")})
    {'s': [None, 1.5], 'n': None}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strict(v) for v in value]
    return value


def _tuning_text(record):
    key = record.get("key", "")
    what = " ".join(map(str, key)) if isinstance(key, list) else str(key)
    knobs = "".join(f" {k}={v}" for k, v in (record.get("knobs") or {}).items())
    tuning = record.get("tuning_seconds", record.get("elapsed", 0))
    return (f"{what} -> {record['spec']}{knobs}: {record.get('seconds', 0) * 1e3:.3f} ms, "
            f"{record.get('runs', 1)} run(s), {tuning:{'.2f' if tuning < 10 else '.0f'}} s of tuning")


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def main(argv=None):
    import tppasm
    from tppasm.display import printable
    p = argparse.ArgumentParser(prog="python -m tppasm",
                                description=f"tppasm {tppasm.__version__}: TPP kernels and loop nests JIT'd from Python")
    p.add_argument("--version", action="version", version=f"tppasm {tppasm.__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    pi = sub.add_parser("info", help="describe the host CPU and the ISA tppasm targets")
    pi.add_argument("--json", action="store_true", help="machine-readable output")
    sub.add_parser("demo", help="JIT a BRGEMM, check it against NumPy, time it beside numpy")
    pc = sub.add_parser("cache", help="show (info), list the records of (list) or empty (clear) the disk cache")
    pc.add_argument("action", choices=("info", "list", "clear"))
    pc.add_argument("--json", action="store_true", help="machine-readable output")
    pc.add_argument("--only", metavar="NAMESPACE", help="list, clear: only the records of NAMESPACE (tune: the "
                    "tuner's remembered results; amx: the AMX verdict); clear keeps the kernels")
    args = p.parse_args(argv)
    if args.cmd is None:
        p.print_help()
        return 0
    if args.cmd == "cache" and args.only is not None and args.action == "info":
        p.error("--only goes with list or clear: python -m tppasm cache list --only tune")
    try:
        with warnings.catch_warnings(record=True) as said:      # the cache's warnings as one line each
            warnings.simplefilter("default")
            status = info(args.json) if args.cmd == "info" else cache(args.action, args.json, args.only) \
                if args.cmd == "cache" else demo()
            sys.stdout.flush()          # a closed pipe raises here, not at exit
        for w in said:
            print(f"python -m tppasm {args.cmd}: {printable(w.message)}", file=sys.stderr)
        return status
    except BrokenPipeError:             # the reader left (python -m tppasm info | head -1): quiet, as Unix tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())     # no second error at exit
        return 141                      # 128 + SIGPIPE, what a tool killed by the closed pipe returns
    except ValueError as e:             # a malformed setting (TPPASM_ISA, TPPASM_CACHE_MB, ...): the message names it
        print(f"python -m tppasm {args.cmd}: {printable(e)}", file=sys.stderr)
        return 2
    except OSError as e:                # the cache directory cannot be written
        print(f"python -m tppasm {args.cmd}: {printable(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
