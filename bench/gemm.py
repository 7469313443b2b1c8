"""Blocked GEMM and an MLP written in the loop DSL, against numpy (OpenBLAS) and torch in the same run.

``python -m bench gemm [--sizes 512,1024,2048,4096x1024x1024] [--threads 1,2] [--dtypes f32,bf16]
[--quick] [--no-mlp] [--json FILE]``

GFLOP/s are medians of auto-calibrated runs (:func:`bench.common.median_time`); every row is
measured with 1 and 2 threads: our pool sized to the count, OpenBLAS limited with threadpoolctl,
torch with ``torch.set_num_threads``. The DSL GEMM is DESIGN.md's: A blocked (Mb, Kb, bm, bk),
B (Nb, Kb, bk, bn) with bm = bk = 64 and bn = two vectors (:func:`n_block`); the K loop steps by 8 blocks (one BRGEMM of count 8 per step, C zeroed at
``ik == 0``), spec ``aBC`` unless ``--spec`` says otherwise (M and N may be blocked twice, by 8 and 4). The MLP is a chain of fully connected
layers with bias + relu fused into the BRGEMM epilogue, against ``nn.Linear`` + ``relu``.
"""
import argparse
import contextlib
import time

import numpy as np

import tppasm as tpp
import bench.tpp_gemm as tg
from bench.common import Report, median_time, write_json
from loops import Loop, kernel
from loops.pool import Pool, get_pool

BLOCK = 64
KSTEP = 8          # K blocks per BRGEMM call: A and B panels of 128 KiB stay in L2


def n_block():
    """Columns per block of B and C: two vectors of the host's fp32 width (16 on AVX2, 32 on
    AVX-512). Then a B block row is exactly the microkernel's B panel row, so each kernel reads
    its B panel sequentially (what OpenBLAS gets by packing); 64-column blocks measured 0.75-0.85x
    of that on this AVX2 host, whose tiles read 64 of every 256 bytes.

    >>> n_block() in (16, 32)
    True
    """
    from isa.cpu import host
    return 32 if host().isa in ("avx512", "amx") else 16


clock = "wall"


def gflops(fn, flops, runs):
    """GFLOP/s of ``fn``: median of calibrated runs, or a single run when one call takes over a second
    (torch's bf16 on a machine without bf16 instructions, say). With ``--clock cpu`` the time is the
    calling thread's CPU time (median of the calls in ~0.3 s): on a busy machine it leaves out the
    time other processes held the core; it is only meaningful for 1-thread rows.
    """
    t, c = time.perf_counter(), time.thread_time()
    fn()
    once, once_cpu = time.perf_counter() - t, time.thread_time() - c
    if once > 1.0:
        return flops / (once_cpu if clock == "cpu" else once) / 1e9
    if clock == "cpu":
        samples = []
        for _ in range(max(runs, int(0.3 / max(once, 1e-6)))):
            t = time.thread_time()
            fn()
            samples.append(time.thread_time() - t)
        return flops / max(float(np.median(samples)), 1e-9) / 1e9
    return flops / median_time(fn, runs=runs) / 1e9


def parse_sizes(text):
    """'512,4096x1024x1024' -> [(512, 512, 512), (4096, 1024, 1024)] as (M, N, K).

    >>> parse_sizes("512,64x32x16")
    [(512, 512, 512), (64, 32, 16)]
    """
    out = []
    for item in text.split(","):
        dims = [int(x) for x in item.lower().split("x")]
        out.append(tuple(dims * 3) if len(dims) == 1 else tuple(dims))
    return out


def _pool(n):
    return get_pool() if get_pool().nthreads == n else Pool(n)


def dsl_gemm(M, N, K, dtype, pool, spec="aBC", bm=BLOCK, bn=None, bk=BLOCK):
    """(gemm, arrays, check) for DESIGN.md's GEMM on random operands; ``check()`` is the relative error.
    ``bn`` defaults to :func:`n_block`.

    >>> gemm, arrays, check = dsl_gemm(64, 64, 64, "f32", get_pool(), bm=32, bn=32, bk=32)
    >>> gemm(*arrays); check() < 1e-3
    True
    """
    bn = bn or n_block()
    Mb, Nb, Kb = M // bm, N // bn, K // bk
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K), np.float32)
    b = rng.standard_normal((K, N), np.float32)
    A = tpp.block(a.astype(tpp.dtypes.dtype(dtype)), bm, bk)
    Bb = tpp.block(b.astype(tpp.dtypes.dtype(dtype)), bk, bn, outer="n")
    B = tpp.vnni_pack(Bb, 2) if dtype == "bf16" else Bb
    C = tpp.empty((Mb, Nb, bm, bn))
    kstep = min(Kb, KSTEP)
    brgemm = tpp.brgemm(m=bm, n=bn, k=bk, dtype=dtype, beta=1)
    zero = tpp.zero(bm, bn)

    @kernel(spec, Loop(0, Kb, kstep, parallel=False), Loop(0, Mb, blocks=[8, 4]), Loop(0, Nb, blocks=[8, 4]),
            pool=pool)
    def gemm(ik, im, jn, A, B, C):
        if ik == 0:
            zero(C[im, jn])
        brgemm(A[im, ik:ik + kstep], B[jn, ik:ik + kstep], C[im, jn], count=kstep)

    def check():
        ref = a.astype(tpp.dtypes.dtype(dtype)).astype(np.float32) @ b.astype(tpp.dtypes.dtype(dtype)).astype(np.float32)
        return float(np.abs(tpp.unblock(C) - ref).max() / np.abs(ref).max())
    return gemm, (A, B, C), check


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
            return "avx512_bf16" in f.read() or "amx_bf16" in f.read()
    except OSError:
        return False


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def bench_gemm(sizes, threads, dtypes, spec, quick, tune=0):
    torch = _torch()
    rep = Report(f"GEMM GFLOP/s, {clock} clock (DSL = loops.kernel around tppasm.brgemm); % of the FMA "
                 f"peak on 1 thread: median / 90th percentile of 15 ratios timed back to back with the peak loop",
                 ["dtype", "M x N x K", "threads", "DSL", "numpy", "torch", "DSL/numpy", "DSL/torch", "DSL 2T/1T",
                  "DSL %pk", "DSL q90", "numpy %pk", "numpy q90"])
    tg.fma_peak()
    peak_loop = tg.LOOPS["fma_peak"]
    runs = 3 if quick else 5
    for dtype in dtypes:
        for M, N, K in sizes:
            one, best = None, spec
            for nt in threads:
                gemm, arrays, check = dsl_gemm(M, N, K, dtype, _pool(nt), spec)
                if tune and nt == threads[0]:
                    best = gemm.tune(*arrays, budget=tune, reps=3, progress=False)
                    print(f"# tuned {dtype} {M}x{N}x{K}: best spec {best!r} of {tune}")
                gemm = gemm.with_spec(best)

                def run():
                    gemm(*arrays)
                run()
                err = check()
                if err > (1e-4 if dtype == "f32" else 1e-2):
                    raise AssertionError(f"DSL GEMM {dtype} {M}x{N}x{K}: relative error {err}")
                flops = 2 * M * N * K
                ours = gflops(run, flops, runs)
                np_g = th_g = float("nan")
                pct = [float("nan")] * 4
                if nt == 1:
                    pct[:2] = (100 * x for x in tg.ratio_stats(tg.interleaved_ratios(run, flops, peak_loop, 15, 0.05)))
                if dtype == "f32":
                    a = np.random.rand(M, K).astype(np.float32)
                    b = np.random.rand(K, N).astype(np.float32)
                    c = np.empty((M, N), np.float32)
                    with blas_threads(nt):
                        np_g = gflops(lambda: a @ b, flops, runs)
                        if nt == 1:
                            pct[2:] = (100 * x for x in tg.ratio_stats(
                                tg.interleaved_ratios(lambda: np.matmul(a, b, out=c), flops, peak_loop, 15, 0.05)))
                if torch is not None and (dtype == "f32" or M * N * K <= 1024 ** 3 or _has_bf16()):
                    torch.set_num_threads(nt)
                    td = torch.float32 if dtype == "f32" else torch.bfloat16
                    ta, tb = torch.rand(M, K, dtype=td), torch.rand(K, N, dtype=td)
                    with torch.no_grad():
                        th_g = gflops(lambda: ta @ tb, flops, runs)
                one = ours if nt == threads[0] else one
                rep.add(dtype, f"{M}x{N}x{K}", nt, ours, np_g, th_g, ours / np_g, ours / th_g,
                        ours / one if nt != threads[0] else float("nan"), *pct)
    return rep


def dsl_mlp(T, C, layers, dtype, pool, bm=BLOCK, bc=None):
    """``run()`` for ``layers`` fused FC + bias + relu layers on a random (T, C) input, blocked:
    ``bm`` rows by ``bc`` channels (default :func:`n_block`; one layer's output blocks are the next
    one's input blocks, so ``bc`` is also the k of each batch step).

    >>> run = dsl_mlp(64, 64, 2, "f32", get_pool(), bm=32, bc=32); run()
    """
    bc = bc or n_block()
    Tb, Cb = T // bm, C // bc
    rng = np.random.default_rng(1)
    dt = tpp.dtypes.dtype(dtype)
    acts = [tpp.block(rng.standard_normal((T, C), np.float32).astype(dt), bm, bc)]
    acts += [tpp.empty((Tb, Cb, bm, bc), dt) for _ in range(layers)]
    weights, biases = [], []
    for _ in range(layers):
        w = (rng.standard_normal((C, C), np.float32) / np.sqrt(C)).astype(dt)
        wb = tpp.block(w, bc, bc, outer="n")
        weights.append(tpp.vnni_pack(wb, 2) if dtype == "bf16" else wb)
        biases.append(rng.standard_normal((Cb, bc), np.float32))
    fc = tpp.brgemm(m=bm, n=bc, k=bc, dtype=dtype, c_dtype=dtype, bias=True, act="relu")

    @kernel("aBC", Loop(0, Cb, Cb), Loop(0, Tb), Loop(0, Cb, blocks=[4]), pool=pool)
    def layer(ik, it, jc, X, W, Bias, Y):
        fc(X[it, ik:], W[jc, ik:], Y[it, jc], Bias[jc], count=Cb)       # one call: the epilogue needs all of K

    def run():
        for i in range(layers):
            layer(acts[i], weights[i], biases[i], acts[i + 1])
    return run


def bench_mlp(threads, dtypes, quick):
    torch = _torch()
    if torch is None:
        print("\n(torch not installed: MLP comparison skipped; pip install torch==2.13.0)")
        return None
    T, C, L = (512, 512, 4) if quick else (1024, 1024, 4)
    rep = Report(f"MLP: {L} x (FC {C}->{C} + bias + relu) on {T} rows, GFLOP/s",
                 ["dtype", "threads", "DSL", "torch nn.Linear+relu", "DSL/torch"])
    flops = 2 * T * C * C * L
    for dtype in dtypes:
        for nt in threads:
            run = dsl_mlp(T, C, L, dtype, _pool(nt))
            ours = gflops(run, flops, 3 if quick else 5)
            torch.set_num_threads(nt)
            td = torch.float32 if dtype == "f32" else torch.bfloat16
            net = torch.nn.Sequential(*[m for _ in range(L) for m in (torch.nn.Linear(C, C), torch.nn.ReLU())]).to(td)
            x = torch.rand(T, C, dtype=td)
            with torch.no_grad():
                theirs = gflops(lambda: net(x), flops, 3 if quick else 5)
            rep.add(dtype, nt, ours, theirs, ours / theirs)
    return rep


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench gemm", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default=None, help="comma list of N or MxNxK (default 512,1024,2048,4096x1024x1024)")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--dtypes", default="f32,bf16")
    p.add_argument("--spec", default="aBC", help="loop spec of the DSL GEMM")
    p.add_argument("--tune", type=int, default=0, metavar="N",
                   help="per size, time N candidate specs (loops' tuner) and use the best")
    p.add_argument("--quick", action="store_true", help="sizes 512,1024, fewer runs, small MLP")
    p.add_argument("--no-mlp", action="store_true")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="wall time (default) or the calling thread's CPU time (busy machine; needs --threads 1)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    global clock
    clock = args.clock
    if clock == "cpu" and args.threads != "1":
        p.error("--clock cpu measures the calling thread only: use it with --threads 1")
    sizes = parse_sizes(args.sizes or ("512,1024" if args.quick else "512,1024,2048,4096x1024x1024"))
    threads = [int(t) for t in args.threads.split(",")]
    dtypes = args.dtypes.split(",")
    reports = [bench_gemm(sizes, threads, dtypes, args.spec, args.quick, args.tune)]
    if not args.no_mlp:
        reports.append(bench_mlp(threads, dtypes, args.quick))
    write_json(args.json, [r for r in reports if r is not None])
    return 0


if __name__ == "__main__":
    main()
