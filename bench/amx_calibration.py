"""The AMX cycle model against the one AMX measurement on record: which reading of the tile
dependencies fits the hardware.

Issue #12 timed, on an Emerald Rapids Xeon (one core, ``python -m bench tpp``, its first run), the
AMX BRGEMM of that time (commit ``999c59b``): bf16 64x64x64 x 16 at 1,346 GFLOP/s, against a
``tdpbf16ps`` loop on independent tiles at 2,800 GFLOP/s; and, later that day in a noisier
period, a call of the 32x32x32 x 1 kernel at ~0.87 us. That kernel had no software pipeline:
each k step ran ``A0 B0 tdp B1 tdp A1 tdp tdp`` (every operand tile loaded right before its first
``tdp*``), with one ``ldtilecfg`` and one ``tilerelease`` per call and no prefetch.
:func:`old_trace` rebuilds its tile instructions; :func:`calibrate` models both calls in each
reading of :mod:`bench.amx_model`, takes the small call's measured time minus its modelled time
as the cost of a call itself, and compares the large call's modelled time plus that cost with
its measured time. Cycles become microseconds at
the clock the peak implies (2,800 GFLOP/s / 1,024 flops per cycle = 2.73 GHz).

One measurement, and the clock is inferred, so this weighs the readings rather than fits the
model. The order does not hang on the call's cost: with none at all the ratios read 1.47, 0.80
and 0.66, ``ooo`` still the nearest. An AMX host should time the current kernels (``python -m
bench tpp``) and set this against them, and run ``python -m bench amx-micro``
(:mod:`bench.amx_micro`), whose loops isolate what the readings disagree on.

>>> rows = calibrate()
>>> [r["reading"] for r in rows], min(rows, key=lambda r: abs(r["model / measured"] - 1))["reading"]
(['in-order', 'ooo', 'renamed'], 'ooo')
"""
from .amx_model import READINGS
from .amx_model import TDP_WORK, simulate

MEASURED_GFLOPS = 1346.0          # bf16 64x64x64 x 16, the kernel of commit 999c59b
MEASURED_SMALL_US = 0.87          # a call of the bf16 32x32x32 x 1 kernel
PEAK_GFLOPS = 2800.0              # tdpbf16ps on independent tiles, same host
A_BASE, B_BASE, C_BASE = 1 << 30, 2 << 30, 3 << 30


def old_trace(m, n, k, count):
    """Tile instructions of one call of the unpipelined bf16 kernel (f32 C, beta 0): per 32 x 32
    region of C, ``tilezero`` x 4, the batch and k steps, ``tilestored`` x 4; tiles 0-3 C, 4-5 A,
    6-7 B (the kernel's allocation)."""
    ops = [("ldtilecfg", (), (), 0, 0, 0, 0)]
    for r0 in range(0, m, 32):
        for c0 in range(0, n, 32):
            ops += [("tilezero", (t,), (), 0, 0, 0, 0) for t in range(4)]
            for b in range(count):
                for s in range(k // 32):
                    def a(i):
                        addr = A_BASE + b * m * k * 2 + (r0 + 16 * i) * k * 2 + s * 64
                        return ("tileloadd", (4 + i,), (), addr, k * 2, 64, 16)

                    def bt(j):
                        addr = B_BASE + b * k * n * 2 + s * 16 * n * 4 + (c0 + 16 * j) * 4
                        return ("tileloadd", (6 + j,), (), addr, n * 4, 64, 16)

                    def tdp(i, j):
                        return ("tdp", (2 * i + j,), (2 * i + j, 4 + i, 6 + j), 0, 0, 64, 16)
                    ops += [a(0), bt(0), tdp(0, 0), bt(1), tdp(0, 1), a(1), tdp(1, 0), tdp(1, 1)]
            ops += [("tilestored", (), (2 * i + j,), C_BASE + ((r0 + 16 * i) * n + c0 + 16 * j) * 4, n * 4, 64, 16)
                    for i in range(2) for j in range(2)]
    return ops + [("tilerelease", (), (), 0, 0, 0, 0)]


def calibrate():
    """One record per reading: modelled and measured microseconds of the 64x64x64 x 16 call."""
    ghz = PEAK_GFLOPS / (TDP_WORK["bf16"] / 16)
    measured = 2 * 64 ** 3 * 16 / MEASURED_GFLOPS / 1e3
    small, large = old_trace(32, 32, 32, 1), old_trace(64, 64, 64, 16)
    rows = []
    for name, kw in READINGS.items():
        call = MEASURED_SMALL_US - simulate(small, **kw).cycles / ghz / 1e3
        res = simulate(large, **kw)
        us = res.cycles / ghz / 1e3 + call
        rows.append({"reading": name, "TMUL busy in the kernel %": round(100 * res.utilization(), 1),
                     "call us (0.87 - modelled small call)": round(call, 2), "modelled us": round(us, 2),
                     "measured us": round(measured, 2), "model / measured": round(us / measured, 2)})
    return rows
