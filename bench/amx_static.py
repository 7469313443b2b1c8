"""AMX BRGEMM static mix: tile ops per tile load, and no tile load repeated within a batch step.

Kernels run in :mod:`isa.x86.interp` (no AMX needed); its ``stats`` give the executed instruction
counts and the address of every ``tileloadd``. A load is attributed to a batch step by the block
of A or B it reads; within one batch step of one macro block, every address must be loaded once.

``python -m bench amx-static [--json FILE]``
"""
import argparse
import time
from collections import Counter

import numpy as np

from .common import Report, write_json

CASES = [  # (m, n, k, count, dtype, beta, c_dtype)
    (64, 64, 64, 16, "bf16", 0, "f32"),
    (64, 64, 64, 16, "bf16", 1, "bf16"),
    (32, 32, 32, 16, "bf16", 0, "f32"),
    (64, 64, 128, 8, "i8", 0, "i32"),
    (40, 40, 64, 8, "bf16", 0, "f32"),
    (40, 24, 70, 8, "bf16", 1, "f32"),
    (17, 33, 36, 8, "i8", 1, "i32"),
    (64, 64, 136, 4, "i8", 0, "i32"),
]


def repeated_loads(tile_loads, blocks):
    """Tile loads that repeat an address within one batch step (``[]`` when there are none).

    ``tile_loads`` is the interpreter's ``stats.tile_loads`` ((ip, mnemonic, address) in order);
    ``blocks`` maps an operand name to (first address, bytes per batch block, count). A step is a
    maximal run of loads from A and B blocks of the same batch index; loads from elsewhere (C,
    the scratch) end a run. Needs count >= 2 and distinct blocks, so that consecutive steps differ.

    >>> repeated_loads([(0, "tileloadd", 100), (1, "tileloadd", 100)], {"a": (100, 50, 2)})
    [(0, 100)]
    """
    out, run, seen = [], None, set()
    for _, _, addr in tile_loads:
        step = None
        for start, size, count in blocks.values():
            if start <= addr < start + size * count:
                step = (addr - start) // size
        if step != run:
            run, seen = step, set()
        if step is None:
            continue
        if addr in seen:
            out.append((step, addr))
        seen.add(addr)
    return out


def run_case(m, n, k, count, dtype, beta, c_dtype):
    """Generate and interpret one kernel; returns (stats, blocks, jit seconds)."""
    import ml_dtypes
    from isa.x86.interp import Machine
    from tppasm.brgemm import Brgemm
    from tppasm.layout import vnni_pack
    from tppasm.x86.amx import generate

    d = Brgemm(m=m, n=n, k=k, dtype=dtype, beta=beta, c_dtype=c_dtype)
    d.validate()
    t = time.perf_counter()
    fn = generate(d)
    jit = time.perf_counter() - t
    rng = np.random.default_rng(0)
    if dtype == "bf16":
        a = rng.standard_normal((count, m, k)).astype(ml_dtypes.bfloat16)
        b = vnni_pack(rng.standard_normal((count, k, n)).astype(ml_dtypes.bfloat16), 2)
    else:
        a = rng.integers(0, 256, (count, m, k)).astype(np.uint8)
        b = vnni_pack(rng.integers(-128, 128, (count, k, n)).astype(np.int8), 4)
    c = np.zeros((m, n), {"f32": np.float32, "i32": np.int32, "bf16": ml_dtypes.bfloat16}[c_dtype])
    mach = Machine()
    pa, pb, pc = mach.map(a), mach.map(b), mach.map(c)
    mach.call(fn.code, args=[pa, pb, pc, count])
    blocks = {"a": (pa, a[0].nbytes, count), "b": (pb, b[0].nbytes, count)}
    return mach.stats, blocks, jit


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench amx-static")
    p.add_argument("--json")
    args = p.parse_args(argv)
    from tppasm.brgemm import Brgemm
    from tppasm.x86.amx import plan

    rep = Report("AMX BRGEMM static mix (interpreted; per call)",
                 ["kernel", "blocking", "tdp", "tileloadd A+B", "tileloadd C", "tdp/load",
                  "repeats in a step", "JIT ms"])
    run_case(16, 16, 32, 2, "bf16", 0, "f32")           # warm-up: imports, the assembler's tables
    for case in CASES:
        m, n, k, count, dtype, beta, c_dtype = case
        stats, blocks, jit = run_case(*case)
        counts = Counter(stats.counts)
        tdp = sum(v for name, v in counts.items() if name.startswith("tdp"))
        ab = sum(1 for _, _, addr in stats.tile_loads
                 if any(s <= addr < s + z * c for s, z, c in blocks.values()))
        loads = counts["tileloadd"]
        pl = plan(Brgemm(m=m, n=n, k=k, dtype=dtype))
        blocking = f"{pl.gm}x{pl.gn}, {pl.steps}x{pl.step}" + (f"+{pl.tail}" if pl.tail else "") + " groups"
        name = f"{dtype} {m}x{n}x{k} count {count} beta {beta} C {c_dtype}"
        rep.add(name, blocking, tdp, ab, loads - ab, round(tdp / ab, 3),
                len(repeated_loads(stats.tile_loads, blocks)), round(jit * 1e3, 1))
    write_json(args.json, [rep])
    return 0


if __name__ == "__main__":
    main()
