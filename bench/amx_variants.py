"""The AMX BRGEMM's variants timed natively, on AMX hosts: what the kernel's design choices are worth.

``python -m bench tpp`` times the BRGEMM as a user calls it (Python's argument checks included:
~0.3 us a call); the cycle model of ``python -m bench amx-static`` estimates it. Here each variant
of :func:`tppasm.x86.amx.generate` runs from a native loop (:func:`driver`: the raw kernel called
``trips`` times, no Python between calls), its time per call set against the AMX peak loop of its
dtype (:func:`bench.peaks.peak_loop`) timed right after it in every round
(:func:`bench.peaks.interleaved_ratios`), so the core's clock (AMX lowers it) cancels in each
ratio. Every variant's result is checked against NumPy first (C poisoned before).

Variants (:data:`VARIANTS`): each macro block walking the whole batch with and without software
prefetch of the next blocks, the walk with its tiles configured once by the caller
(``tile_setup=False``: no ``sttilecfg`` check in each call, as a nest could run it; the cycle
model takes ``sttilecfg`` to wait for every tile instruction before it, which would drain the
previous call's work at every call), and batch chunks of 1, 2 and 4 blocks
(:mod:`tppasm.x86.amx_chunk`).

Cases (:data:`CASES`): issue #12's goal shape, its batch grown to 1 MiB, the int8 goal shape, the
GEMM bench's winning blocks, one macro block, the goal shape's work in blocks of k = 32 (each A
tile 1 KiB contiguous, as ``amx-micro``'s L2 loop reads them, where the goal shape's A tiles take
every other 64 bytes: whether the stride costs), and a LLaMA prefill projection (k = 2048 in one call)
with A's rows 4 KiB apart, as its activations are, and padded to 4160 bytes: 4 KiB apart, the 16
rows of a tile fall in one L1 set, which may be why the whole layer's first token ran at 375
GFLOP/s (19% of the AMX peak) on an Emerald Rapids core where this kernel's other shapes reach
1,100-1,450. Since then the kernel prefetches no lines that crowd an L1 set
(:func:`tppasm.x86.amx_pipe.crowded`), so at 4 KiB apart only B's are prefetched; the variant
"prefetch all" there is the kernel as it was, A's lines prefetched too.

Measured on an Emerald Rapids core (family 6 model 207, a 16-core KVM guest, 1 thread,
21 rounds; % of the AMX peak, median): goal shape unchunked 49.5, without prefetch 37.3, chunks of
1 / 2 / 4 43.1 / 42.1 / 41.7; the GEMM's blocks 63.5; one macro block 54-55. With ``python -m bench
amx-micro``'s loops on that core (a 2 x 2 k step 63.9 cycles from L1, 88.9 from L2; a round trip of
C after 8 / 16 ``tdp*`` ~100 cycles: 226 and 361 against 128 and 256): operands streamed from L2 cap
the 2 x 2 kernel near 72%, and the chunks, which keep them in L1, pay more in C round trips than
they save.

``python -m bench amx-variants [--rounds N] [--json FILE]``; where AMX is not native nothing is
timed (the variants' results are checked in the interpreter by the tests).

>>> [c.what for c in CASES][:2]
["issue #12's goal shape", 'its batch in L2 (1 MiB)']
"""
import argparse
import time
from dataclasses import dataclass, replace

import numpy as np

from .common import Report, write_json
from .options import count, json_option, summary

VARIANTS = {    # name: (batch blocks per chunk, prefetch: True / False / "all", tile_setup, stream hint)
    "unchunked": (0, True, True, True),
    "no prefetch": (0, False, True, True),
    "no stream hint": (0, True, True, False),
    "neither": (0, False, True, False),
    "configured once": (0, True, False, True),
    "prefetch all": (0, "all", True, True),
    "chunks of 1": (1, True, True, True),
    "chunks of 2": (2, True, True, True),
    "chunks of 4": (4, True, True, True),
}
WALKS = ("unchunked", "no prefetch", "no stream hint", "neither", "configured once")
TRIPS = 50                   # kernel calls per timed run of the native driver


@dataclass(frozen=True)
class Case:
    """One BRGEMM shape (stride batch, beta 0, fp32 / int32 C) and the variants timed on it."""

    what: str
    m: int
    n: int
    k: int
    count: int
    dtype: str
    lda: int = 0
    variants: tuple = tuple(VARIANTS)

    def desc(self):
        from tppasm.brgemm import Brgemm
        lda = self.lda or self.k
        return Brgemm(m=self.m, n=self.n, k=self.k, lda=lda, stride_a=self.m * lda, dtype=self.dtype)

    @property
    def work(self):
        return 2.0 * self.m * self.n * self.k * self.count


CASES = [
    Case("issue #12's goal shape", 64, 64, 64, 16, "bf16"),
    Case("its batch in L2 (1 MiB)", 64, 64, 64, 64, "bf16"),
    Case("the int8 goal shape", 64, 64, 128, 16, "i8"),
    Case("the GEMM bench's blocks", 128, 32, 128, 8, "bf16", variants=WALKS + ("chunks of 2",)),
    Case("B's panel in L1 (32 KiB) for 4 macro rows", 128, 32, 64, 8, "bf16", variants=WALKS),
    Case("A's panel in L1 for 4 macro columns", 32, 128, 64, 8, "bf16", variants=WALKS),
    Case("one macro block", 32, 32, 64, 16, "bf16", variants=WALKS),
    Case("the goal's work, A tiles contiguous (k 32)", 64, 64, 32, 32, "bf16", variants=WALKS),
    Case("LLaMA prefill projection, rows 4 KiB apart", 64, 64, 2048, 1, "bf16", lda=2048,
         variants=WALKS + ("prefetch all",)),
    Case("the same, rows padded to 4160 bytes", 64, 64, 2048, 1, "bf16", lda=2080, variants=WALKS),
]


def generated(case, variant):
    """(kernel, setup) of ``variant`` of ``case``: the JitFunction, and the no-argument one that
    configures its tiles first where the kernel leaves that to its caller (``tile_setup=False``,
    as in a nest that calls ``tppasm.tileconfig`` once), else None."""
    from tppasm.x86.amx import generate
    from tppasm.x86.amx_config import tileconfig_function
    chunk, prefetch, tile_setup, stream = VARIANTS[variant]
    desc = replace(case.desc(), tile_setup=tile_setup)
    return generate(desc, chunk, prefetch, stream), None if tile_setup else tileconfig_function(desc)


def driver(kernel, setup=None):
    """A native ``drv(trips, a, b, c, count)`` that calls ``kernel(a, b, c, count)`` (a JitFunction
    of that signature) ``trips`` times: the kernel's time per call with no Python in between;
    ``setup`` (a no-argument JitFunction, e.g. a tile configuration) runs once before them (the
    tiles stay configured on return, as after a ``tile_setup=True`` kernel).

    >>> from isa.x86 import Function, qword, rdi
    >>> bump = Function("bump", ["ptr", "ptr", "ptr", "i64"]); bump.asm.add(qword[rdi], 1)
    >>> counter = np.zeros(1, np.int64)
    >>> _ = driver(bump.finalize())(5, counter.ctypes.data, 0, 0, 0); int(counter[0])
    5
    """
    from isa.x86 import Function, r12, r13, r14, r15, rax, rbx, rcx, rdi, rdx, rsi
    fn = Function(f"drive_{kernel.name}", ["i64", "ptr", "ptr", "ptr", "i64"])
    a = fn.asm
    fn.stack(16)                          # rsp 16-byte aligned at each call
    for saved, arg in zip((rbx, r12, r13, r14, r15), fn.args):
        a.mov(saved, arg)
    loop, done = a.label(), a.label()
    if setup is not None:
        a.mov(rax, setup.address)
        a.call(rax)
    a.test(rbx, rbx)
    a.jle(done)
    a.bind(loop)
    for arg, saved in zip((rdi, rsi, rdx, rcx), (r12, r13, r14, r15)):
        a.mov(arg, saved)
    a.mov(rax, kernel.address)
    a.call(rax)
    a.dec(rbx)
    a.jnz(loop)
    a.bind(done)
    out = fn.finalize()
    out.driven = (kernel, setup)           # their memory lives as long as the driver
    return out


def operands(case, rng):
    """(A, B packed, C poisoned, reference C) of ``case``: A (count, m, lda) with its first k
    columns used, B VNNI-packed, C fp32 NaN or int32 minimum."""
    import tppasm as tpp
    lda = case.lda or case.k
    if case.dtype == "bf16":
        A = rng.standard_normal((case.count, case.m, lda), dtype=np.float32).astype(tpp.dtypes.dtype("bf16"))
        Bp = rng.standard_normal((case.count, case.k, case.n), dtype=np.float32).astype(tpp.dtypes.dtype("bf16"))
        B, C = tpp.vnni_pack(Bp, 2), tpp.empty((case.m, case.n), "f32")
        C[...] = np.nan
    else:
        A = rng.integers(0, 256, (case.count, case.m, lda), dtype=np.uint8)
        Bp = rng.integers(-128, 128, (case.count, case.k, case.n), dtype=np.int8)
        B, C = tpp.vnni_pack(Bp, 4), tpp.empty((case.m, case.n), "i32")
        C[...] = np.iinfo(np.int32).min
    ref = np.einsum("bmk,bkn->mn", A[..., :case.k].astype(np.float64), Bp.astype(np.float64))
    return tpp.aligned(A), tpp.aligned(B), C, ref


def relative_error(got, ref):
    """max |got - ref| / max |ref| (NaN anywhere in ``got``: inf).

    >>> relative_error(np.array([1.0, 2.0]), np.array([1.0, 2.5])), relative_error(np.array([np.nan]), np.ones(1))
    (0.2, inf)
    """
    got = np.asarray(got, np.float64)
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


def time_case(case, rounds, rng, trips=TRIPS):
    """[record] per variant of ``case``: % of the AMX peak (median, 90th percentile of per-round
    ratios to the peak loop timed back to back, :func:`bench.peaks.interleaved_ratios`), us a call,
    GFLOP/s (GOP/s) and the relative error of its first call (AMX hosts)."""
    from .peaks import interleaved_ratios, peak_loop, ratio_stats
    A, B, C0, ref = operands(case, rng)
    loop = peak_loop(case.dtype, "AMX")
    out = []
    for name in case.variants:
        drive, C = driver(*generated(case, name)), C0.copy()

        def call(n=trips):
            drive(n, A.ctypes.data, B.ctypes.data, C.ctypes.data, case.count)
        call(1)
        error = relative_error(C, ref)
        median, q90 = ratio_stats(interleaved_ratios(call, trips * case.work, loop, rounds, seconds=0.002))
        t = time.perf_counter()
        call()
        seconds = (time.perf_counter() - t) / trips
        out.append({"case": case.what, "m": case.m, "n": case.n, "k": case.k, "count": case.count,
                    "dtype": case.dtype, "lda": case.lda or case.k, "variant": name,
                    "pct_peak": round(100 * median, 1), "pct_peak_q90": round(100 * q90, 1),
                    "us": round(1e6 * seconds, 3), "gflops": round(case.work / seconds / 1e9, 1),
                    "max_rel_err": error})
    return out


def run(rounds=21):
    """Print and return the Report; on a host without native AMX, None."""
    from isa.cpu import host
    if "amx" not in host().levels:
        print("amx-variants: this host has no native AMX, so nothing is timed (the variants are generated and "
              "checked in the interpreter by tests/test_amx_variants.py); run it on an AMX host")
        return None
    rng = np.random.default_rng(0)
    rep = Report("AMX BRGEMM variants, each called from a native loop: % of the dtype's AMX peak loop timed "
                 f"back to back ({rounds} rounds; median, 90th percentile), us a call, GFLOP/s (int8: GOP/s)",
                 ["case", "m x n x k x count", "dtype", "lda", "variant", "% peak", "q90", "us", "GFLOP/s",
                  "max rel err"])
    for case in CASES:
        for r in time_case(case, rounds, rng):
            rep.add(r["case"], f"{r['m']}x{r['n']}x{r['k']}x{r['count']}", r["dtype"], r["lda"], r["variant"],
                    r["pct_peak"], r["pct_peak_q90"], r["us"], r["gflops"], f"{r['max_rel_err']:.2g}", **r)
    return rep


def parse(argv=None):
    """The options of ``python -m bench amx-variants``, checked (a bad one: argparse's error)."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m bench amx-variants", description=summary(__doc__))
    p.add_argument("--rounds", type=count("rounds", "--rounds 21"), default=21,
                   help="interleaved timing rounds per case (AMX hosts)")
    json_option(p)
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    rep = run(args.rounds)
    if args.json and rep is not None:
        write_json(args.json, [rep])


if __name__ == "__main__":
    main()
