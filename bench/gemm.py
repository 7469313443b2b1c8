"""GEMM of any shape written in the loop DSL, tuned per shape, against numpy (OpenBLAS) and torch.

``python -m bench gemm [--sizes 512,1024,2048,4096x1024x1024,1000x700x300] [--threads 1,2]
[--dtypes f32,bf16[,i8]] [--no-tune] [--tune-seconds S] [--fresh] [--quick] [--json FILE]``

The DSL GEMM is DESIGN.md's: A blocked (Mb, Kb, bm, bk), B (Nb, Kb, bk, bn), C (Mb, Nb, bm, bn),
padded with zeros to whole blocks (``tpp.block(..., pad=True)``; ``tpp.unblock(C, shape=(M, N))``
crops), so any M, N, K runs; the last row and column blocks get BRGEMMs of their own size
(``edges=True``, the default: measured 1.01-1.02x faster than computing the padding at 1000-2000,
1.2-1.3x at 100-800) or compute their zero padding too (``edges=False``: no edge code at all).
The K loop steps by ``kstep`` blocks (one BRGEMM of that count per step; the first step's BRGEMM
writes C with beta=0, the others add to it: 1-2% faster than zeroing C first). By default every
(shape, dtype, thread count) is tuned with :func:`loops.tune.search` over the spec, the block
sizes of the M and N loops and the knobs of :func:`gemm_configs` (bm, bn, bk, kstep, edges; on
AMX hosts prefetch), the cost model choosing what is timed, for :func:`tune_budget` seconds,
resuming the search an earlier run remembered in tppasm's cache (so repeated runs add up their
budgets; ``--fresh``: not, and nothing remembered); the table shows the winner beside the fixed
configuration (spec ``aBC``, bm = bk = 64, bn = two vectors (:func:`n_block`), kstep 8). On n
threads the search also times the winner of the first thread count (its spec and knobs: a hint of
:func:`loops.tune.search`). Every row times the tuned and fixed GEMM, numpy and
torch (and, on n threads, the 1-thread row's tuned GEMM) back to back in interleaved rounds: GFLOP/s are
medians, ratios the medians of the per-round ratios. Our pool is sized to the thread count,
OpenBLAS limited with threadpoolctl, torch with ``torch.set_num_threads``. The 1-thread row runs
first whatever the order of ``--threads``: "nT/1T" is the row's speed over that row's (its n in
the threads column; NaN without a 1-thread row). On n threads the rounds also time the peak loop
on n threads and on one: "peak nT/1T" is the ratio of their rates, what the host's other cores add
at that moment, the ceiling of our own "nT/1T".

int8 (``--dtypes i8``, not in the default list): u8 A x s8 B -> int32, exact, against
``torch._int_mm`` (s8 x s8 -> int32, oneDNN) on the same bytes; a line counts the peer's sums that
differ from the exact ones (:func:`inexact`: oneDNN without VNNI saturates int16 pairs). No numpy
peer for bf16 and int8.

"%pk" on 1 thread is the median and "q90" the 90th percentile of kernel/peak ratios timed back to
back on the thread's CPU time (:func:`bench.peaks.interleaved_ratios`; a % of peak over 100 is
marked "!": a disturbed round, see :func:`bench.peaks.ratio_stats`). A record's ``peak_gflops`` is
the peak that row's "%pk" is of (its ``gflops`` / "%pk"), so the plot's peak line agrees with the
table, and ``peak_unit`` its unit (:mod:`bench.gemm_table`); on n threads it is what the peak loop
ran at on n threads in the row's rounds, not one core's peak times n (n threads on fewer CPUs share them).
"""
import argparse
import contextlib
import functools

import numpy as np

import tppasm as tpp
import bench.tpp_gemm as tg
from bench.common import interleaved, pool_of, progress, write_json
from bench.gemm_table import add_row, gemm_report, resumed_text, winner_text
from bench.interleave import use_threads
from bench.options import (MAX_SIDE, check_memory, check_tuning, checked, dtypes_option, items, json_option, once,
                           summary, threads_option, tuning_options, whole)
from bench.versus import peak_loop as versus_peak_loop
from loops import Loop, kernel
from isa.pool import get_pool  # noqa: F401  (gemm_maker's example)
from loops.tune import search
from tppasm.brgemm import A_DTYPE, B_DTYPE, C_DTYPES, VNNI

BLOCK = 64
KSTEP = 8          # K blocks per BRGEMM call: A and B panels of 128 KiB stay in L2


def n_block(isa=None):
    """Columns per block of B and C: two vectors of the fp32 width of ``isa`` (default: the
    host's; 16 on AVX2, 32 on AVX-512). Then a B block row is exactly the microkernel's B panel
    row, so each kernel reads its B panel sequentially (what OpenBLAS gets by packing); 64-column
    blocks measured 0.75-0.85x of that on an AVX2 host, whose tiles read 64 of every 256 bytes.

    >>> n_block() in (16, 32), n_block("avx2")
    (True, 16)
    """
    from isa.cpu import host
    return 32 if (isa or host().isa) in ("avx512", "amx") else 16


def parse_sizes(text):
    """'512,4096x1024x1024' -> [(512, 512, 512), (4096, 1024, 1024)] as (M, N, K); argparse's
    error, naming the form, for anything else (``--sizes``' type).

    >>> parse_sizes("512,64x32x16")
    [(512, 512, 512), (64, 32, 16)]
    """
    return _SIZES(text)


def _size(item):
    """'512' -> (512, 512, 512), '64x32x16' -> (64, 32, 16); ValueError for anything else."""
    dims = [whole(x, limit=MAX_SIDE) for x in item.lower().split("x")]
    if len(dims) not in (1, 3):
        raise ValueError(f"{len(dims)} sizes")
    return tuple(dims * 3) if len(dims) == 1 else tuple(dims)


_SIZES = checked(lambda text: once([_size(s) for s in items(text)]),
                 "sizes N or MxNxK (positive), comma separated, each once", "--sizes 512,1000x700x300")


def largest_divisor(n, most):
    """The largest divisor of ``n`` not above ``most`` (the K step that needs no remainder call).

    >>> largest_divisor(16, 8), largest_divisor(5, 4), largest_divisor(12, 8)
    (8, 1, 6)
    """
    return max(d for d in range(1, min(n, most) + 1) if n % d == 0)


def gemm_maker(a, b, dtype, pool, spec="aBC"):
    """``make(bm, bn, bk, kstep, edges)`` for :func:`loops.tune.search`: the DSL GEMM ``a @ b`` of any
    shape as (loop kernel, (A, B, C), output) with ``output()`` the (M, N) result. Blocked operands
    are cached per block size.

    >>> rng = np.random.default_rng(0)
    >>> a, b = rng.random((50, 30), np.float32), rng.random((30, 40), np.float32)
    >>> make = gemm_maker(a, b, "f32", get_pool())
    >>> for edges in (False, True):
    ...     gemm, arrays, output = make(bm=32, bn=32, bk=16, kstep=2, edges=edges)
    ...     gemm(*arrays)
    ...     print(bool(np.allclose(output(), a @ b, rtol=1e-5)))
    True
    True
    """
    a, b = _converted(a, b, dtype)
    if a.shape[1] == 0:                  # K = 0: a @ b is zeros, which one K block of zeros writes (beta=0)
        a, b = np.zeros((a.shape[0], 1), a.dtype), np.zeros((1, b.shape[1]), b.dtype)
    (M, K), N = a.shape, b.shape[1]
    blocked = {}

    def layout(name, rows, cols):
        if (name, rows, cols) not in blocked:
            if name == "A":
                blocked[name, rows, cols] = tpp.block(a, rows, cols, pad=True)
            else:
                Bb = tpp.block(b, rows, cols, outer="n", pad=True)
                blocked[name, rows, cols] = tpp.vnni_pack(Bb, VNNI[dtype]) if VNNI[dtype] > 1 else Bb
        return blocked[name, rows, cols]

    def make(bm=BLOCK, bn=None, bk=BLOCK, kstep=KSTEP, edges=True, prefetch=True):
        bn = n_block() if bn is None else bn
        Mb, Nb, Kb = tpp.nblocks(M, bm), tpp.nblocks(N, bn), tpp.nblocks(K, bk)
        if isinstance(kstep, bool) or not isinstance(kstep, (int, np.integer)) or kstep < 1:
            raise ValueError(f"gemm_maker: kstep={kstep!r}; expected a positive int (K blocks per BRGEMM call)")
        ks = largest_divisor(Kb, kstep)
        A, B = layout("A", bm, bk), layout("B", bk, bn)
        C = tpp.empty((Mb, Nb, bm, bn), C_DTYPES[dtype][0])
        C[...] = 0
        mt, nt = M - (Mb - 1) * bm, N - (Nb - 1) * bn
        if not edges or (mt, nt) == (bm, bn):
            kinds = {(False, False): (bm, bn)}
        else:
            kinds = {(r, c): (mt if r else bm, nt if c else bn) for r in (False, True) for c in (False, True)}
        stride_b = int(np.prod(B.shape[2:]))        # bf16 / int8: bk packed in whole pairs / quads of rows
        kernels = {key: tuple(tpp.brgemm(m=m, n=n, k=bk, dtype=dtype, beta=beta, lda=bk, ldb=bn, ldc=bn,
                                         stride_a=bm * bk, stride_b=stride_b, prefetch=prefetch)
                              for beta in (0, 1)) + (m, n)
                   for key, (m, n) in kinds.items()}
        loops = (Loop(0, Kb, ks, parallel=False), Loop(0, Mb, blocks=[8, 4]), Loop(0, Nb, blocks=[8, 4]))

        def step(k, ik, im, jn, A, B, C):
            first, more, m, n = k                # the first K step writes C, the others add to it
            mm = first if ik == 0 else more
            mm(A[im, ik:ik + ks, :m], B[jn, ik:ik + ks, :, :n], C[im, jn, :m, :n], count=ks)

        if len(kernels) == 1:
            @kernel(spec, *loops, pool=pool)
            def gemm(ik, im, jn, A, B, C):
                step(kernels[False, False], ik, im, jn, A, B, C)
        else:
            @kernel(spec, *loops, pool=pool)
            def gemm(ik, im, jn, A, B, C):
                last_m = im == Mb - 1
                last_n = jn == Nb - 1
                step(kernels[bool(last_m), bool(last_n)], ik, im, jn, A, B, C)
        return gemm, (A, B, C), lambda: tpp.unblock(C, shape=(M, N))
    return make


def _converted(a, b, dtype):
    """``a`` (M, K), ``b`` (K, N) in the operand dtypes of ``dtype``'s GEMM, or the ValueError naming the fix
    (shapes that do not multiply, complex values, values int8's u8 A or s8 B cannot hold: not wrapped)."""
    if dtype not in A_DTYPE:
        raise ValueError(f"gemm_maker: dtype={dtype!r}; expected one of {', '.join(A_DTYPE)}")
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"gemm_maker: a {a.shape} @ b {b.shape} is not a matrix product; pass a (M, K) and b (K, N)")
    out = []
    for name, x, dt in (("a", a, tpp.dtypes.dtype(A_DTYPE[dtype])), ("b", b, tpp.dtypes.dtype(B_DTYPE[dtype]))):
        if x.dtype.kind == "c":
            raise ValueError(f"gemm_maker: {name} is complex ({x.dtype}); pass its real part ({name}.real)")
        with np.errstate(invalid="ignore"):      # (NaN as an int: refused below)
            out.append(x.astype(dt))
        if dt.kind in "iu" and not np.array_equal(out[-1], x):
            raise ValueError(f"gemm_maker: {name} holds values that {dt.name} ({np.iinfo(dt).min}..{np.iinfo(dt).max}) "
                             f"cannot hold; pass integers in that range (then {name}.astype(np.{dt.name}))")
    return out


def fitted(size, targets, granule=1):
    """Block sizes that cover ``size`` with as many blocks as each target size would, made as even
    as ``granule`` allows: ``ceil(size / ceil(size / t))`` rounded up to a multiple of ``granule``.
    A K of 65 in blocks of 64 computes 128 (half of it zero padding); in blocks of 33 or 65 it
    computes 66 or 65 (measured 1.9x faster at 127x1000x65 on a Zen 4).

    >>> fitted(65, (64, 128)), fitted(100, (64, 32)), fitted(1024, (64, 128)), fitted(100, (32,), 16)
    ([33, 65], [50, 25], [64, 128], [32])
    """
    out = []
    for t in targets:
        b = -(-size // -(-size // t))
        b = -(-b // granule) * granule
        if b not in out:
            out.append(b)
    return out


def k_granule(dtype):
    """The multiple a K block of ``dtype`` is rounded up to: bf16 pairs and int8 quads (VNNI), a whole
    AMX tile row (32 bf16, 64 int8) on AMX hosts (else the kernel pads k itself), any f32.

    >>> k_granule("f32"), k_granule("i8") in (4, 64)
    (1, True)
    """
    if dtype == "f32":
        return 1
    return {"bf16": 32, "i8": 64}[dtype] if on_tiles(dtype) else VNNI[dtype]


def on_tiles(dtype):
    """Whether this host's BRGEMMs of ``dtype`` are AMX tile kernels (bf16 and int8 on AMX hosts).

    >>> on_tiles("f32")
    False
    """
    from isa.cpu import host
    from tppasm.x86.brgemm import tile_kernel
    return tile_kernel(dtype, host().isa)


def with_unprefetched(configs, dtype):
    """``configs``, and where ``dtype`` runs on AMX tiles (:func:`on_tiles`) each again with
    ``prefetch=False`` (no software prefetches in the kernels: faster where the nest keeps the
    blocks in L2, slower where they come from L3; see :func:`tppasm.brgemm`).

    >>> with_unprefetched([{"bm": 64}], "f32")
    [{'bm': 64}]
    """
    return configs + [dict(c, prefetch=False) for c in configs] if on_tiles(dtype) else configs


def gemm_configs(M, N, K, dtype, quick=False):
    """The knob values :func:`gemm_maker` is tuned over, the fixed configuration first: block sizes
    that pad each dimension by at most 1/8 (or the fixed ones), among them the sizes
    :func:`fitted` to M, N and K, K steps that differ once made divisors of the K blocks, and edge
    kernels when a dimension does not divide; on AMX tiles each also without software prefetches
    (:func:`with_unprefetched`).

    >>> gemm_configs(1024, 1024, 1024, "f32", quick=True)[0] == {"bm": 64, "bn": n_block(), "bk": 64, "kstep": 8, "edges": True}
    True
    >>> sorted({c["bk"] for c in gemm_configs(127, 1000, 65, "f32")})
    [33, 64, 65]
    """
    nb = n_block()
    grid = {"bm": [64, 32, 128], "bn": [nb, 2 * nb], "bk": [64, 128], "kstep": [8, 4, 16]}
    if quick:
        grid = {"bm": [64, 32], "bn": [nb, 2 * nb], "bk": [64, 128], "kstep": [8, 16]}
    for name, size, granule in (("bm", M, 1), ("bn", N, nb // 2), ("bk", K, k_granule(dtype))):
        grid[name] += [b for b in fitted(size, grid[name], granule) if b not in grid[name]]
    if k_granule(dtype) >= 16 and k_granule(dtype) not in grid["bk"]:     # AMX rows: K blocks of one tile
        grid["bk"].append(k_granule(dtype))                               # row pad K by less than one
    fixed = {"bm": 64, "bn": nb, "bk": 64, "kstep": 8, "edges": True}

    def fits(size, b, first, granule=1):      # a K block is whole granules: up to one of padding is fine
        return b == first or tpp.nblocks(size, b) * b <= max(size * 9 / 8, size + granule - 1) and b <= max(size, first)
    out, seen = [fixed], set()
    for bm in (b for b in grid["bm"] if fits(M, b, 64)):
        for bn in (b for b in grid["bn"] if fits(N, b, nb)):
            for bk in (b for b in grid["bk"] if fits(K, b, 64, k_granule(dtype))):
                for kstep in grid["kstep"]:
                    ks = largest_divisor(tpp.nblocks(K, bk), kstep)
                    for edges in ([True, False] if M % bm or N % bn else [True]):
                        key = (bm, bn, bk, ks, edges)
                        if key not in seen:
                            seen.add(key)
                            config = {"bm": bm, "bn": bn, "bk": bk, "kstep": kstep, "edges": edges}
                            if config != fixed:
                                out.append(config)
    return with_unprefetched(out, dtype)


@contextlib.contextmanager
def blas_threads(n):
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(limits=n):
        yield


def _has_bf16():
    """True when the CPU has bf16 dot instructions (else torch's bf16 GEMM takes minutes: large sizes skipped)."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        return "avx512_bf16" in text or "amx_bf16" in text
    except OSError:
        return False


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def dtype_peak(dtype):
    """(GFLOP/s of one core, the peak loop, its share of the peak) for ``dtype``: the loop of the unit
    tppasm's BRGEMM uses (``bench.peaks`` where present), else the fp32 FMA loop, whose rate a bf16
    dot (``vdpbf16ps``) doubles on AVX512-BF16 hosts (the anchors measured 1 zmm/cycle for both;
    assumed, not timed, without ``bench.peaks``). The GFLOP/s are the best of the loop's runs:
    another process slows a run, never speeds it up."""
    try:
        from bench import peaks
    except ImportError:
        factor = 2.0 if dtype == "bf16" and _has_bf16() else 1.0
        return tg.fma_peak()[1] * factor, tg.LOOPS["fma_peak"], factor
    unit = peaks.kernel_unit(dtype)
    return peaks.peak_stats(dtype, unit)[1], peaks.peak_loop(dtype, unit), 1.0


TUNE_CLOCK = "wall"      # --tune-clock: how the tuner times candidates (cpu: leaves out other processes)
FRESH = False            # --fresh: search from nothing, neither reading nor writing remembered results


def tuned(make, configs, seconds, key, progress_bar, hints=()):
    """:func:`loops.tune.search` over ``configs``, resuming the search an earlier run remembered on
    disk (its winner timed first and kept in the final rounds; ``--fresh``: not), ``hints`` (records
    of other searches, e.g. the winner on one thread) timed first too; prints and returns its
    :class:`loops.tune.Tuned`."""
    found = search(make, configs, seconds=seconds, key=key, progress=progress_bar, clock=TUNE_CLOCK,
                   remember=not FRESH, resume=not FRESH, hints=list(hints))
    r = found.record
    print(f"# tuned {' '.join(map(str, key))}: {winner_text(r)} of {r['candidates']} modelled, "
          f"{r['timed']} timed in {r['elapsed']:.0f} s ({r['seconds'] * 1e3:.2f} ms vs the fixed "
          f"{r['reference_seconds'] * 1e3:.2f} ms){resumed_text(r)}", flush=True)
    return found


def tune_budget(M, N, K, base=20.0):
    """Default tuning seconds of one (shape, dtype, threads): ``base`` up to 1024^3 multiply-adds,
    growing with the square root of the work beyond, at most 3 x ``base``. A run of a larger GEMM
    takes longer, so a fixed budget times fewer candidates: at 2048^3 (bf16, 1 thread, Zen 5) 20 s
    timed 36-54 of them and found 85-88% of the peak, 90 s timed 350 and found 96%.

    >>> tune_budget(512, 512, 512), round(tune_budget(2048, 2048, 2048), 1), tune_budget(8192, 8192, 8192)
    (20.0, 56.6, 60.0)
    """
    return base * min(3.0, max(1.0, (M * N * K / 1024 ** 3) ** 0.5))


def one_thread_first(threads):
    """``threads`` with 1 (if there) moved to the front: the reference of every row's "nT/1T".

    >>> one_thread_first([2, 1, 4]), one_thread_first([2, 4])
    ([1, 2, 4], [2, 4])
    """
    return sorted(threads, key=lambda n: n != 1)


def bench_gemm(sizes, threads, dtypes, quick, tune_seconds, bar=True):
    torch = _torch()
    rounds = 5 if quick else 9
    rep = gemm_report(rounds, dtypes)
    rng = np.random.default_rng(0)
    for dtype in dtypes:
        _, peak_loop, share = dtype_peak(dtype)
        fp32_loop = dtype_peak("f32")[1]
        for M, N, K in progress(sizes, f"gemm {dtype}", bar):
            a, b = operands(rng, M, N, K, dtype)
            configs = gemm_configs(M, N, K, dtype, quick)
            ref = reference(a, b, dtype)
            flops = 2 * M * N * K
            one, first_win = None, None
            for nt in one_thread_first(threads):
                torch_wrong = None
                make = gemm_maker(a, b, dtype, pool_of(nt))
                fixed, fixed_arrays, fixed_out = make(**configs[0])
                run_fixed = functools.partial(fixed, *fixed_arrays)
                run_fixed()
                _check(fixed_out(), ref, dtype, f"{dtype} {M}x{N}x{K}, fixed")
                run, win = run_fixed, None
                if tune_seconds:
                    budget = tune_seconds(M, N, K) if callable(tune_seconds) else tune_seconds
                    found = tuned(make, configs, budget, ("gemm", dtype, M, N, K, nt), bar,
                                  hints=[first_win] if first_win else [])
                    run, win = found, found.record
                    run()
                    _check(found.output(), ref, dtype, f"{dtype} {M}x{N}x{K}, tuned")
                named = {"tuned": run, "fixed": run_fixed}
                if dtype == "f32":
                    c = np.empty((M, N), np.float32)
                    named["numpy"] = functools.partial(np.matmul, a, b, out=c)
                if torch is not None and (dtype != "bf16" or M * N * K <= 1024 ** 3 or _has_bf16()):
                    torch.set_num_threads(nt)
                    named["torch"] = torch_peer(torch, a, b, dtype)
                    torch_wrong = inexact(named["torch"], a, b, dtype, f"{M}x{N}x{K} on {nt} threads")
                if one is not None:
                    named["1T"] = one
                if nt > 1:                      # what nt cores delivered in the same rounds
                    named["peak"], peak_calls = versus_peak_loop(dtype, flops, nt)
                use_threads(nt, torch)          # and a pause between the peers on 2 threads
                pct = [float("nan")] * 3
                host_scaling = float("nan")
                with blas_threads(nt):
                    times, ratios = interleaved(list(named.values()), rounds)
                    if nt > 1:                  # the median over rounds of (peak loop's time / ours)
                        pct[0] = 100 * peak_calls * ratios[list(named).index("peak")] / share
                    if nt == 1:
                        pct[:2] = (100 * x / share
                                   for x in tg.ratio_stats(tg.interleaved_ratios(run, flops, peak_loop, 15, 0.05)))
                        if dtype == "f32":
                            pct[2] = 100 * tg.ratio_stats(tg.interleaved_ratios(named["numpy"], flops, fp32_loop, 15,
                                                                                  0.05))[0]
                if nt > 1:
                    host_scaling = peak_scaling(dtype, nt, rounds)
                res = {n: (flops / t / 1e9, r) for n, t, r in zip(named, times, ratios)}
                one = run if nt == 1 else one
                first_win = first_win or win
                add_row(rep, dtype, (M, N, K), nt, res, pct, host_scaling, win, torch_wrong)
    return rep


def peak_scaling(dtype, threads, rounds):
    """The rate of ``dtype``'s peak loop on ``threads`` threads over its rate on one, timed back to
    back (no pauses: both are ours) in ``rounds`` rounds, median of the per-round ratios: what the
    host's cores add at the moment, the ceiling of a kernel's own n-thread speed-up.

    >>> s = peak_scaling("f32", 2, 3); bool(np.isfinite(s) and s > 0)   # (a busy core can halve it)
    True
    """
    from bench import peaks
    from bench.interleave import interleaved as timed
    unit = peaks.kernel_unit(dtype)
    (one, one_work), (many, many_work) = (peaks.peak_loop_on(n, dtype, unit) for n in (1, threads))
    t1, tn = timed([one, many], rounds, 0.03, settle=0.0)
    return float(np.median((many_work / tn) / (one_work / t1)))


def operands(rng, M, N, K, dtype):
    """(A, B) of ``dtype``'s GEMM: standard normal fp32 (bf16 rounds them as it blocks them), or for
    int8 uniform u8 A and s8 B."""
    if dtype == "i8":
        return rng.integers(0, 256, (M, K), dtype=np.uint8), rng.integers(-128, 128, (K, N), dtype=np.int8)
    return rng.standard_normal((M, K), np.float32), rng.standard_normal((K, N), np.float32)


def reference(a, b, dtype):
    """A @ B as the GEMM of ``dtype`` computes it: fp32 of bf16-rounded operands, or int8's exact sums
    (float64 holds them exactly: |sum| <= 255 * 128 * K < 2**53)."""
    if dtype == "i8":
        return a.astype(np.float64) @ b.astype(np.float64)
    cast = tpp.dtypes.dtype(dtype)
    return a.astype(cast).astype(np.float32) @ b.astype(cast).astype(np.float32)


def torch_peer(torch, a, b, dtype):
    """torch's matmul of the same work: fp32 or bf16 ``torch.matmul``; int8 ``torch._int_mm`` (s8 x
    s8 -> int32; A's bytes read as s8: the same work on other values)."""
    if dtype == "i8":
        ta, tb = torch.from_numpy(a.view(np.int8)), torch.from_numpy(b)
        return functools.partial(torch._int_mm, ta, tb)
    td = torch.float32 if dtype == "f32" else torch.bfloat16
    return functools.partial(torch.matmul, torch.from_numpy(a).to(td), torch.from_numpy(b).to(td))


def inexact(run, a, b, dtype, what):
    """int8: how many of the peer's sums differ from the exact ones (None for other dtypes); a
    line says so when some do. oneDNN on AVX2 hosts (no VNNI) adds pairs of products in int16,
    saturating: at 1024^3 on Zen 4 capped at AVX2, 1,048,559 of its 1,048,576 sums were wrong; ours,
    and VNNI's, are exact."""
    if dtype != "i8":
        return None
    got = run().numpy()
    wrong = int((got != (a.view(np.int8).astype(np.float64) @ b.astype(np.float64))).sum())
    if wrong:
        print(f"# torch._int_mm {what}: {wrong} of {got.size} int32 sums differ from the exact ones")
    return wrong


def _check(got, ref, dtype, what):
    if dtype == "i8":
        wrong = int((got != ref).sum())
        if wrong:
            raise AssertionError(f"DSL GEMM {what}: {wrong} int32 sums differ from the exact ones")
        return
    err = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
    if not err <= (1e-4 if dtype == "f32" else 1e-2):          # (a NaN error fails too)
        raise AssertionError(f"DSL GEMM {what}: relative error {err}")


def parse(argv=None):
    """The options of ``python -m bench gemm``, checked (a bad one: argparse's error); no work done."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m bench gemm", description=summary(__doc__))
    p.add_argument("--sizes", type=parse_sizes, default=None,
                   help="comma list of N or MxNxK (default 512,1024,2048,4096x1024x1024,1000x700x300)")
    threads_option(p)
    dtypes_option(p, ("f32", "bf16", "i8"), "f32,bf16")
    tuning_options(p, "tuning budget per shape, dtype and thread count (0: no tuning; default: 20, growing with "
                      "the square root of the work past 1024^3 up to 60 (tune_budget); --quick 6)")
    p.add_argument("--quick", action="store_true", help="sizes 512,1024, fewer runs and knobs")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (shown on a terminal with tqdm)")
    json_option(p)
    args = p.parse_args(argv)
    check_tuning(p, args)
    if args.sizes:
        M, N, K = max(args.sizes, key=lambda size: gemm_bytes(*size))
        check_memory(p, "--sizes", f"{M}x{N}x{K}", gemm_bytes(M, N, K, args.dtypes), "--sizes 4096")
    return args


def gemm_bytes(M, N, K, dtypes=("f32",)):
    """Bytes a row of size M x N x K allocates at least: fp32 A, B, the reference, C, its
    unblocked copy and NumPy's C, and the blocked A and B (2 bytes an element or more); with int8
    among ``dtypes`` its float64 reference and operand copies (8 bytes an element) instead.

    >>> gemm_bytes(1024, 1024, 1024) / 2 ** 20, gemm_bytes(1024, 1024, 1024, ["i8"]) / 2 ** 20
    (24.0, 36.0)
    """
    a_b, c = (10, 16) if "i8" in dtypes else (6, 12)
    return a_b * (M * K + K * N) + c * M * N


def main(argv=None):
    args = parse(argv)
    global TUNE_CLOCK, FRESH
    TUNE_CLOCK, FRESH = args.tune_clock, args.fresh
    sizes = args.sizes or parse_sizes("512,1024" if args.quick else "512,1024,2048,4096x1024x1024,1000x700x300")
    budget = 0 if args.no_tune else args.tune_seconds if args.tune_seconds is not None else 6 if args.quick else \
        tune_budget
    rep = bench_gemm(sizes, args.threads, args.dtypes, args.quick, budget, not args.no_progress)
    write_json(args.json, [rep])
    return 0


if __name__ == "__main__":
    main()
