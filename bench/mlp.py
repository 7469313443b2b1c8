"""An MLP written in the loop DSL (fully connected layers, bias + relu fused), tuned, against torch.

``python -m bench mlp [--rows 1024] [--channels 1024] [--layers 4] [--threads 1,2] [--dtypes f32,bf16]
[--no-tune] [--tune-seconds 20] [--fresh] [--quick] [--json FILE]``

Each layer is one loop kernel: the rows (bm per block) by the output channels (bc per block), one
BRGEMM over all input-channel blocks per output block with the bias and relu in its epilogue. A
layer's output blocks are the next layer's input blocks, so bc is both n and k of the BRGEMM. Any
row and channel count works: activations and weights are padded with zeros to whole blocks, and a
padded channel stays zero through every layer (zero weights, zero bias, relu(0) = 0). All layers
have one shape, so one tuning (:func:`loops.tune.search` over bm, bc, the spec and its block
sizes) serves every layer; like ``bench gemm``, it resumes the search an earlier run remembered
(``--fresh``: not). Compared with ``torch.nn.Sequential(Linear, ReLU, ...)`` in the same run.

Every row times the tuned and the fixed MLP, torch, the dtype's peak loop on as many threads (what
those threads delivered in the same rounds, not one core's peak times n) and, on n threads, the
1-thread row's tuned MLP, back to back in interleaved rounds. GFLOP/s are medians; every ratio
(tuned/torch, aBC/torch, nT/1T, and "tuned %pk": the tuned MLP's rate over the peak loop's, "!"
after a figure over 100) is the median of its per-round ratios (:func:`round_ratio`). A record's
``peak_gflops`` is the peak its "tuned %pk" is of (GFLOP/s / fraction: the plot's peak line) and
``peak_unit`` its unit (:func:`bench.peaks.peak_unit`). The 1-thread row runs first whatever the
order of ``--threads``: "nT/1T" is the row's speed over its (NaN without a 1-thread row).
"""
import argparse

import numpy as np

import tppasm as tpp
from bench.common import Report, pool_of, write_json
from bench.interleave import interleaved, use_threads
from bench.options import (MAX_LAYERS, MAX_ROWS, MAX_SIDE, check_memory, check_tuning, count, dtypes_option,
                           json_option, summary, threads_option, tuning_options)
import bench.gemm as bench_gemm_module
from bench.gemm import _torch, fitted, n_block, one_thread_first, tuned, winner_text, with_unprefetched
from bench.gemm_table import implied_peak
from bench.peaks import peak_legend, peak_unit
from bench.versus import peak_loop
from loops import Loop, kernel
from isa.pool import get_pool

BLOCK = 64


def mlp_weights(C, layers, seed=1):
    """Random (weights (C, C), biases (C,)) per layer, fp32, scaled to keep activations O(1)."""
    rng = np.random.default_rng(seed)
    return [((rng.standard_normal((C, C), np.float32) / np.sqrt(C)).astype(np.float32),
             rng.standard_normal(C, np.float32)) for _ in range(layers)]


def layer_maker(x, params, dtype, pool, spec="aBC"):
    """``make(bm, bc)`` for :func:`loops.tune.search`: one layer ``relu(x @ W + b)`` of ``params[0]``
    as (loop kernel, (X, W, Bias, Y), output), blocked and padded.

    >>> rng = np.random.default_rng(0)
    >>> x = rng.standard_normal((50, 40), np.float32); params = mlp_weights(40, 1)
    >>> lk, arrays, out = layer_maker(x, params, "f32", get_pool())(bm=32, bc=16)
    >>> lk(*arrays); w, b = params[0]
    >>> bool(np.allclose(out(), np.maximum(x @ w + b, 0), rtol=1e-4, atol=1e-5))
    True
    """
    make_layers = mlp_maker(x, params[:1], dtype, pool, spec)

    def make(bm=BLOCK, bc=None, prefetch=True):
        layer, acts, weights, biases, output = make_layers(bm, bc, prefetch)
        return layer, (acts[0], weights[0], biases[0], acts[1]), output
    return make


def mlp_maker(x, params, dtype, pool, spec="aBC"):
    """``build(bm, bc) -> (layer kernel, activations, weights, biases, output)`` for the whole chain:
    ``activations[i]`` is layer i's input (blocked (Tb, Cb, bm, bc), zero padded), ``output()`` the
    last one cropped to (T, C)."""
    T, C = x.shape
    dt = tpp.dtypes.dtype(dtype)
    for i, (w, b) in enumerate(params):     # padded to whole blocks, a misfit would not fail: it would be wrong
        if np.shape(w) != (C, C) or np.shape(b) != (C,):
            raise ValueError(f"mlp_maker: layer {i} has weights {np.shape(w)} and biases {np.shape(b)}; x has {C} "
                             f"channels, so every layer takes weights ({C}, {C}) and biases ({C},)")

    def build(bm=BLOCK, bc=None, prefetch=True):
        bc = n_block() if bc is None else bc
        Tb, Cb = tpp.nblocks(T, bm), tpp.nblocks(C, bc)
        acts = [tpp.block(x.astype(dt), bm, bc, pad=True)]
        for _ in params:
            acts.append(tpp.empty((Tb, Cb, bm, bc), dt))
            acts[-1][...] = 0
        weights, biases = [], []
        for w, b in params:
            wb = tpp.block(w.astype(dt), bc, bc, outer="n", pad=True)
            weights.append(tpp.vnni_pack(wb, 2) if dtype == "bf16" else wb)
            bias = np.zeros((Cb, bc), np.float32)
            bias.reshape(-1)[:C] = b
            biases.append(bias)
        fc = tpp.brgemm(m=bm, n=bc, k=bc, dtype=dtype, c_dtype=dtype, bias=True, act="relu", prefetch=prefetch)

        @kernel(spec, Loop(0, Cb, Cb, parallel=False), Loop(0, Tb, blocks=[8]), Loop(0, Cb, blocks=[4]), pool=pool)
        def layer(ik, it, jc, X, W, Bias, Y):
            fc(X[it, ik:], W[jc, ik:], Y[it, jc], Bias[jc], count=Cb)    # one call: the epilogue needs all of K

        def output():
            return tpp.unblock(acts[-1], shape=(T, C)).astype(np.float32)
        return layer, acts, weights, biases, output
    return build


def mlp_configs(T, C, quick=False, dtype="f32"):
    """Knob values for the MLP layer: the fixed (bm 64, bc two vectors) first, then the others
    that pad T and C by at most 1/8 or no more than the least padding any candidate size gives
    (a C of 40 has no channel block within 1/8: 48 pads least), among them the sizes
    :func:`bench.gemm.fitted` to T and C; where ``dtype`` runs on AMX tiles, each also with
    ``prefetch=False`` (:func:`bench.gemm.with_unprefetched`).

    >>> mlp_configs(1024, 1024)[0] == {"bm": 64, "bc": n_block()}
    True
    >>> sorted({c["bm"] for c in mlp_configs(1000, 1024)})
    [32, 63, 64, 125, 128]
    >>> len(mlp_configs(100, 40)) > 1
    True
    """
    nb = n_block()
    bms = [64, 32] if quick else [64, 32, 128]
    bcs = [nb, 2 * nb] if quick else [nb, 2 * nb, nb // 2 * 3]
    bms += [b for b in fitted(T, bms) if b not in bms]
    bcs += [b for b in fitted(C, bcs, nb // 2) if b not in bcs]
    padded = lambda size, b: tpp.nblocks(size, b) * b        # noqa: E731
    t_most = max(T * 9 / 8, min(padded(T, bm) for bm in bms))
    c_most = max(C * 9 / 8, min(padded(C, bc) for bc in bcs))
    out = []
    for bm in bms:
        for bc in bcs:
            if (bm, bc) == (64, nb) or (padded(T, bm) <= t_most and padded(C, bc) <= c_most):
                out.append({"bm": bm, "bc": bc})
    return with_unprefetched(out, dtype)


def bench_mlp(T, C, L, threads, dtypes, quick, tune_seconds, bar=True):
    torch = _torch()
    if torch is None:
        print("\n(torch not installed: MLP comparison skipped; pip install torch==2.13.0)")
        return None
    rounds = 5 if quick else 9
    rep = Report(f"MLP: {L} x (FC {C}->{C} + bias + relu) on {T} rows, GFLOP/s: tuned DSL and the fixed aBC "
                 f"(bm 64, bc {n_block()}) against torch nn.Linear+ReLU, timed back to back (medians of {rounds} "
                 f"interleaved rounds; ratios: medians of per-round ratios); tuned %pk: of the dtype's peak loop "
                 f"on as many threads in the same rounds",
                 ["dtype", "threads", "tuned", "aBC", "torch", "tuned/torch", "aBC/torch", "nT/1T", "tuned %pk",
                  "winner"], marked=["tuned %pk"], legend=peak_legend(dtypes))
    flops = 2 * T * C * C * L
    x = np.random.default_rng(0).standard_normal((T, C), np.float32)
    params = mlp_weights(C, L)
    for dtype in dtypes:
        one, first_win = None, None
        for nt in one_thread_first(threads):
            pool = pool_of(nt)
            configs = mlp_configs(T, C, quick, dtype)
            fixed = _chain(mlp_maker(x, params, dtype, pool)(**configs[0]))
            fixed()
            _check(fixed.output(), x, params, dtype)
            run, win = fixed, None
            if tune_seconds:
                found = tuned(layer_maker(x, params, dtype, pool), configs, tune_seconds, ("mlp", dtype, T, C, nt), bar,
                              hints=[first_win] if first_win else [])
                win = found.record
                layer, acts, weights, biases, output = mlp_maker(x, params, dtype, pool)(**win["knobs"])
                run = _chain((layer.with_spec(win["spec"]), acts, weights, biases, output))
                run()
                _check(run.output(), x, params, dtype)
            use_threads(nt, torch)
            td = torch.float32 if dtype == "f32" else torch.bfloat16
            net = torch.nn.Sequential(*[m for _ in range(L) for m in (torch.nn.Linear(C, C), torch.nn.ReLU())]).to(td)
            xt = torch.from_numpy(x).to(td)
            loop, calls = peak_loop(dtype, flops, nt)
            fns = [run, fixed, torch.no_grad()(lambda: net(xt)), loop] + ([one] if one is not None else [])
            samples = interleaved(fns, rounds, 0.03)
            rate = [flops / float(np.median(t)) / 1e9 for t in samples]
            pct = 100 * calls * round_ratio(samples[3], samples[0])     # the peak loop's time / ours, per round
            rep.add(dtype, nt, rate[0], rate[1], rate[2], round_ratio(samples[2], samples[0]),
                    round_ratio(samples[2], samples[1]),
                    round_ratio(samples[4], samples[0]) if one is not None else float("nan"), pct,
                    winner_text(win) if win else "-",
                    x=f"{dtype} {T}x{C}x{L} {nt}T", gflops=rate[0], fixed_gflops=rate[1], torch_gflops=rate[2],
                    peak_gflops=implied_peak(rate[0], pct), peak_unit=peak_unit(dtype), tuning=win)
            one = run if nt == 1 else one
            first_win = first_win or win
    return rep


def round_ratio(slow, fast):
    """Median over rounds of ``slow[i] / fast[i]`` (per-round seconds): how many times faster the
    second is, each round's drift cancelled. A ratio of the two medians is not that: seconds
    (1, 4, 4) over (1, 1, 4) give 1.0 here, and 4.0 as the medians' ratio.

    >>> round_ratio(np.array([1.0, 4.0, 4.0]), np.array([1.0, 1.0, 4.0]))
    1.0
    """
    return float(np.median(np.asarray(slow) / np.asarray(fast)))


class _chain:
    """Run every layer in turn (each layer's kernel is the same loop kernel on other arrays)."""

    def __init__(self, built):
        self.layer, self.acts, self.weights, self.biases, self.output = built

    def __call__(self):
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            self.layer(self.acts[i], w, b, self.acts[i + 1])


def _check(got, x, params, dtype):
    ref = x
    for w, b in params:
        ref = np.maximum(ref @ w + b, 0)
    err = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
    if not err <= (1e-3 if dtype == "f32" else 5e-2):          # (a NaN error fails too)
        raise AssertionError(f"DSL MLP {dtype}: relative error {err}")


def parse(argv=None):
    """The options of ``python -m bench mlp``, checked (a bad one: argparse's error); no work done."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m bench mlp", description=summary(__doc__))
    p.add_argument("--rows", type=count("rows", "--rows 512", limit=MAX_ROWS), default=None,
                   help="default 1024 (--quick 512)")
    p.add_argument("--channels", type=count("channels", "--channels 512", limit=MAX_SIDE), default=None,
                   help="default 1024 (--quick 512)")
    p.add_argument("--layers", type=count("layers", "--layers 4", limit=MAX_LAYERS), default=4,
                   help="fully connected layers (default 4)")
    threads_option(p)
    dtypes_option(p, ("f32", "bf16"))
    tuning_options(p, "tuning budget per dtype and thread count (0: no tuning; default 20, --quick 6)")
    p.add_argument("--quick", action="store_true", help="512 rows and channels, a shorter tuning budget")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (shown on a terminal with tqdm)")
    json_option(p)
    args = p.parse_args(argv)
    check_tuning(p, args)
    T, C = sizes(args)
    given = [flag for flag, value in (("--rows", args.rows), ("--channels", args.channels),
                                      ("--layers", args.layers != 4)) if value]
    if given:
        check_memory(p, "/".join(given), f"{T} rows, {C} channels, {args.layers} layers", mlp_bytes(T, C, args.layers),
                     "--rows 1024 --channels 1024")
    return args


def sizes(args):
    """(rows, channels) of a run: the options', or the defaults (1024, --quick 512)."""
    return args.rows or (512 if args.quick else 1024), args.channels or (512 if args.quick else 1024)


def mlp_bytes(T, C, L):
    """Bytes an MLP of ``L`` layers of ``C`` channels on ``T`` rows allocates at least: fp32 input and
    weights, the blocked weights and the ``L + 1`` activations (2 bytes an element or more).

    >>> mlp_bytes(1024, 1024, 4) / 2 ** 20
    38.0
    """
    return 4 * T * C + 6 * L * C * C + 2 * (L + 1) * T * C


def main(argv=None):
    args = parse(argv)
    bench_gemm_module.TUNE_CLOCK, bench_gemm_module.FRESH = args.tune_clock, args.fresh
    T, C = sizes(args)
    budget = 0 if args.no_tune else args.tune_seconds if args.tune_seconds is not None else 6 if args.quick else 20
    rep = bench_mlp(T, C, args.layers, args.threads, args.dtypes, args.quick, budget, not args.no_progress)
    write_json(args.json, [rep] if rep else [])
    return 0


if __name__ == "__main__":
    main()
