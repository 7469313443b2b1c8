"""One LLaMA-style decoder layer (:mod:`bench.models.llama`) against the same layer in torch.

``python -m bench llm [--prompt 256] [--threads 1,2] [--dtypes bf16,i8] [--runs N] [--small] [--clock wall|cpu]
[--profile] [--json FILE]``

Shape: hidden 2048, 32 query heads, 8 KV heads of 64, MLP 8192 (a 1B-class layer), random weights
(seed 0). Rows: first-token latency (the prompt through the layer, causal, cache filled) and
next-token latency (one token at position ``prompt`` against the cache), ms, tppasm beside torch
timed interleaved (medians); next-token weight streaming in GB/s (layer weight bytes / latency) and
as a % of the host's read bandwidth, measured with the same threads in the same interleaving (the
faster of a reduce TPP over a 512 MiB array, row blocks split across the threads, and m = 1
BRGEMMs at the layer's pace over 512 MiB of weights), and the % of that bandwidth
which streaming our weights at 1.5x torch's speed would take (near or above 100%: out of reach).
``--clock cpu`` times with the calling thread's CPU clock (1 thread only: on a shared machine it
leaves out time other processes held the core). torch's layer: ``F.linear`` on bf16 weights, ``F.rms_norm``,
``scaled_dot_product_attention`` (GQA, causal), bf16 activations; its int8 peer is
``torch.ao.quantization.quantize_dynamic`` (fbgemm, per-channel int8 weights, dynamic per-tensor
activations). Our next-token projections take the ``pace`` (``tppasm.brgemm``'s hint) that
streams weights fastest on the host, and on AMX hosts the faster of the tile and AVX-512 kernels,
measured at each run (:mod:`bench.models.stream_pace`; a table lists the rate of every choice).
Before timing, outputs are compared (max |diff| / max |torch|). A third table puts first-token
latency against the dtype's measured peak (timed in the same interleaving): ours, torch's layer,
torch's projections alone, and the fraction of the peak that 1.5x torch would take; where that
is near or above 100%, the 1.5x goal is out of reach by arithmetic. A measured % of peak over 100
is marked "!" (a disturbed round or a wrong peak); its records carry the peak (``peak_gflops``:
the loop's median rate) and its unit (``peak_unit``, :func:`bench.peaks.peak_unit`).
``--profile`` prints instead each step's time (norms, projections, rope, cache, attention, ...).

>>> from bench.models.llama_weights import Config
>>> Config().hidden, Config().kv_heads
(2048, 8)
"""
import argparse
import time

import numpy as np

import tppasm as tpp
from bench.common import Report, pool_of, write_json
from bench.interleave import add_clock_option, check_clock, interleaved, use_threads
from bench.options import count, dtypes_option, json_option, summary, threads_option
from bench.models import stream_pace
from bench.models.llama import LlamaLayer
from bench.models.llama_weights import Config, random_weights
from loops import Loop, kernel


def read_sweep(pool, mib=512):
    """(run, bytes): one read of a ``mib`` MiB fp32 array (row sums, row blocks split across the
    pool): the host's read bandwidth, the ceiling of weight streaming."""
    cols, bm = 4096, 64
    rows = (mib << 20) // (4 * cols)
    x = tpp.empty((rows, cols))
    x[...] = 1.0
    out = tpp.empty(rows)
    total = tpp.reduce("add", bm, cols, over="cols")

    @kernel("A", Loop(0, rows // bm), pool=pool)
    def sweep(i, X, Out):
        total(X[i * bm:i * bm + bm], Out[i * bm:i * bm + bm])
    return (lambda: sweep(x, out)), x.nbytes


def int8_inner_loops(runs=7, reps=200):
    """GB/s of int8 weights two inner loops consume from L1, 1 thread: ``vpdpbusd`` (u8 activations
    x s8 weights, the design used) against dequantizing in registers (``vpmovsxbd`` + ``vcvtdq2ps``
    + an fp32 FMA per 16 weights). The second cannot outrun DRAM, so it was not taken. AVX-512
    hosts with VNNI only (else None)."""
    from isa.cpu import host
    from isa.x86 import Function, ptr, rax, vec, xword
    if host().isa not in ("avx512", "amx") or not host().features.get("avx512_vnni"):
        return None
    buf = tpp.empty(16384, "i8")
    buf[...] = 1

    def build(kind):
        fn = Function("int8_" + kind, ["ptr", "i64"])
        a, (src, iters) = fn.asm, fn.args
        acc, tmp, x = [vec(512, i) for i in range(8)], [vec(512, 8 + i) for i in range(8)], vec(512, 20)
        for r in acc + [x]:
            a.vpxord(r, r, r)
        outer, top = a.label(), a.label()
        a.bind(outer)
        a.xor(rax, rax)
        a.bind(top)
        for i in range(8):
            if kind == "dequant":
                a.vpmovsxbd(tmp[i], xword[src + rax + 16 * i])
                a.vcvtdq2ps(tmp[i], tmp[i])
                a.vfmadd231ps(acc[i], tmp[i], x)
            else:
                a.vpdpbusd(acc[i], x, ptr(src + rax + 64 * i))
        a.add(rax, 128 if kind == "dequant" else 512)
        a.cmp(rax, buf.nbytes)
        a.jb(top)
        a.dec(iters)
        a.jnz(outer)
        return fn.finalize()
    out = {}
    for kind in ("vpdpbusd", "dequant"):
        f = build(kind)
        f(buf.ctypes.data, reps)
        best = min(_timed(lambda: f(buf.ctypes.data, reps)) for _ in range(runs))
        out[kind] = buf.nbytes * reps / best / 1e9
    return out


def _timed(fn):
    t = time.thread_time()
    fn()
    return time.thread_time() - t


def weight_bytes(layer):
    lins = (layer.qkv, layer.o, layer.gu, layer.down)
    extra = sum(lin.scale.nbytes + lin.offset.nbytes for lin in lins) if layer.dtype == "i8" else 0
    return sum(lin.blocks.nbytes for lin in lins) + extra


class TorchLayer:
    """The same layer in torch (see the module docstring); ``run(x, start)`` -> the output rows of
    the torch tensor ``x`` (T, hidden) at positions start..start+T-1, causal, against its cache of
    the earlier positions (as llama_weights.reference_layer)."""

    def __init__(self, cfg, w, dtype):
        import torch
        self.torch, self.cfg = torch, cfg
        if dtype == "bf16":
            self.dt = torch.bfloat16
            t = {k: torch.from_numpy(np.ascontiguousarray(v.T)).to(self.dt) for k, v in w.items() if v.ndim == 2}
            self.lin = {k: (lambda x, W=W: torch.nn.functional.linear(x, W)) for k, W in t.items()}
        else:
            self.dt = torch.float32
            mods = torch.nn.ModuleDict()
            for k, v in w.items():
                if v.ndim == 2:
                    m = torch.nn.Linear(v.shape[0], v.shape[1], bias=False)
                    m.weight.data = torch.from_numpy(np.ascontiguousarray(v.T))
                    mods[k] = m
            from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
            mods = quantize_dynamic(mods, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
            self.lin = {k: mods[k] for k in mods}
        self.g1, self.g2 = (torch.from_numpy(w[k]).to(self.dt) for k in ("rms1", "rms2"))
        cos, sin = tpp.rope_tables(np.arange(cfg.max_len), cfg.head_dim, cfg.rope_base)
        self.cos, self.sin = (torch.from_numpy(np.concatenate([c, c], 1)).to(self.dt) for c in (cos, sin))
        self.k = torch.zeros(1, cfg.kv_heads, cfg.max_len, cfg.head_dim, dtype=self.dt)
        self.v = torch.zeros_like(self.k)

    def _rope(self, x, pos):                     # x (1, heads, T, d)
        torch = self.torch
        d = self.cfg.head_dim
        c, s = self.cos[pos][None, None], self.sin[pos][None, None]
        rot = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
        return x * c + rot * s

    def run(self, x, start):
        torch, cfg = self.torch, self.cfg
        F = torch.nn.functional
        with torch.inference_mode():
            T = x.shape[0]
            pos = torch.arange(start, start + T)
            h = x.to(self.dt)
            xn = F.rms_norm(h, (cfg.hidden,), self.g1, cfg.eps)
            q = self.lin["wq"](xn).view(1, T, cfg.heads, cfg.head_dim).transpose(1, 2)
            k = self.lin["wk"](xn).view(1, T, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
            v = self.lin["wv"](xn).view(1, T, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
            q, k = self._rope(q, pos), self._rope(k, pos)
            self.k[:, :, start:start + T], self.v[:, :, start:start + T] = k, v
            L = start + T
            # causal at any start: row i (position start + i) sees keys 0..start + i
            mask = None if start == 0 else torch.ones(T, L, dtype=torch.bool).tril(start)
            att = F.scaled_dot_product_attention(q, self.k[:, :, :L], self.v[:, :, :L], attn_mask=mask,
                                                 is_causal=start == 0, enable_gqa=True)
            h = h + self.lin["wo"](att.transpose(1, 2).reshape(T, cfg.hidden))
            hn = F.rms_norm(h, (cfg.hidden,), self.g2, cfg.eps)
            return h + self.lin["w2"](F.silu(self.lin["w1"](hn)) * self.lin["w3"](hn))




ATTENTION_DTYPE = "bf16"        # both layers' attention, whatever their weights' dtype


def layer_flops(cfg, T):
    """(projection flops, attention flops) of a prompt of T rows; attention counts the whole T x T
    square that both implementations compute (the causal mask zeroes its upper half)."""
    D, F = cfg.hidden, cfg.ffn
    proj = 2 * T * D * (cfg.qkv_dim + D + 2 * F) + 2 * T * F * D
    return proj, 4 * T * T * cfg.head_dim * cfg.heads


def torch_projections(peer, cfg, T):
    """A call running torch's projections of the layer alone (its 7 matmuls on T rows)."""
    import torch
    x = torch.randn(T, cfg.hidden).to(peer.dt)
    y = torch.randn(T, cfg.ffn).to(peer.dt)

    def run():
        with torch.inference_mode():
            for name in ("wq", "wk", "wv", "wo", "w1", "w3"):
                peer.lin[name](x)
            peer.lin["w2"](y)
    return run


def first_token_ceiling(cfg, prompt, nt, dtype, layer, peer, runs, clock, rep):
    """A row of ``rep``: ours, torch's layer and torch's projections alone as % of the dtype's peak
    (the peak loop run on as many threads, timed in the same interleaving), and the % of peak that
    1.5x torch's layer would need. A % of peak is the time at the peak over the time taken; an int8
    layer's attention runs in bf16 (both layers), so its flops are timed at the bf16 peak, a loop
    timed in the same rounds, and its integer operations (the projections) at the int8 peak."""
    from bench.peaks import peak_loop_on, peak_unit
    x = np.random.default_rng(2).standard_normal((prompt, cfg.hidden)).astype(np.float32)
    import torch
    tx = torch.from_numpy(x)
    loops = [peak_loop_on(nt, d) for d in dict.fromkeys((dtype, ATTENTION_DTYPE))]
    proj, att = layer_flops(cfg, prompt)
    ours, theirs, mm, *tops = interleaved([lambda: layer.prefill(x), lambda: peer.run(tx, 0),
                                           torch_projections(peer, cfg, prompt)] + [loop for loop, _ in loops],
                                          runs, clock=clock)
    rates = [work / top for (_, work), top in zip(loops, tops)]     # peaks, per second, of nt cores as they ran
    rate, att_rate = rates[0], rates[-1]
    ideal = proj / rate + att / att_rate                    # the layer's seconds at the peaks, per round
    pct = [100 * float(np.median(i / t)) for i, t in ((ideal, ours), (ideal, theirs), (proj / rate, mm))]
    need = 100 * float(np.median(ideal / (theirs / 1.5)))
    attention = {} if len(loops) == 1 else {
        "attention_peak_gflops": float(np.median(att_rate)) / 1e9,
        "attention_peak_unit": peak_unit(ATTENTION_DTYPE, unit="best")}
    rep.add(dtype, nt, (proj + att) / 1e9, float(np.median(rate)) / 1e9, *pct, need,
            peak_gflops=float(np.median(rate)) / 1e9, peak_unit=peak_unit(dtype, unit="best"), **attention)


def inputs(cfg, prompt):
    """(weights, prompt rows, next-token row): seeded, the same for every table."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((prompt, cfg.hidden)).astype(np.float32)
    return random_weights(cfg), x, rng.standard_normal((1, cfg.hidden)).astype(np.float32)


def bench_llm(cfg, prompt, threads, dtypes, runs, clock="wall"):
    import torch
    ceiling = []
    rep = Report(f"LLaMA-style layer (hidden {cfg.hidden}, {cfg.heads}/{cfg.kv_heads} heads, MLP {cfg.ffn}): "
                 f"first token = prompt of {prompt}, next token at position {prompt}; ms, interleaved medians",
                 ["dtype", "threads", "phase", "tppasm ms", "torch ms", "torch/tppasm", "weights GB/s",
                  "% read BW", "read BW GB/s", "1.5x torch needs % read BW", "max rel diff"])
    w, x, x1 = inputs(cfg, prompt)
    paces = []
    for nt in threads:
        pool = pool_of(nt)
        use_threads(nt, torch)
        sweep, swept = read_sweep(pool)
        for dtype in dtypes:
            pace, rates = stream_pace.best(dtype, pool)
            paces.append((dtype, nt, pace, rates))
            layer, peer = LlamaLayer(cfg, w, dtype, pool, pace=pace), TorchLayer(cfg, w, dtype)
            tx, tx1 = torch.from_numpy(x), torch.from_numpy(x1)
            ours, theirs = layer.prefill(x), peer.run(tx, 0).float().numpy()
            diff = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
            a, b = interleaved([lambda: layer.prefill(x), lambda: peer.run(tx, 0)], runs, clock=clock)
            rep.add(dtype, nt, "first token", 1e3 * np.median(a), 1e3 * np.median(b), float(np.median(b / a)),
                    float("nan"), float("nan"), float("nan"), float("nan"), diff)
            ceiling.append((nt, dtype, layer, peer))
            ours, theirs = layer.decode(x1, prompt), peer.run(tx1, prompt).float().numpy()
            diff = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
            stream, streamed = stream_pace.sweep(dtype, pace, pool, mib=512)
            a, b, c, e = interleaved([lambda: layer.decode(x1, prompt), lambda: peer.run(tx1, prompt), sweep, stream],
                                     runs, clock=clock)
            gbs, bw = weight_bytes(layer) / a / 1e9, np.maximum(swept / c, streamed / e) / 1e9
            needs = 1.5 * weight_bytes(layer) / b / 1e9 / bw          # our weight bytes at 1.5x torch's speed
            rep.add(dtype, nt, "next token", 1e3 * np.median(a), 1e3 * np.median(b), float(np.median(b / a)),
                    float(np.median(gbs)), 100 * float(np.median(gbs / bw)), float(np.median(bw)),
                    100 * float(np.median(needs)), diff)
    taken = Report("Decoding pace: tppasm.brgemm's pace (cycles per k group) of the next-token projections, the "
                   "fastest of stream_pace.measure's interleaved sweeps of m = 1 BRGEMMs over "
                   f"{stream_pace.default_mib()} MiB of weights, GB/s at each pace (AMX hosts: also the tile "
                   "kernels, which take no pace, against the AVX-512 ones at each pace)",
                   ["dtype", "threads", "pace taken", "AMX tiles GB/s"] + [f"pace {p} GB/s" for p in stream_pace.PACES])
    for dtype, nt, pace, rates in paces:
        taken.add(dtype, nt, pace, rates.get(stream_pace.TILES, "not measured (no AMX)"),
                  *(rates.get(p, float("nan")) for p in stream_pace.PACES))
    top = ceiling_report(dtypes)
    for nt, dtype, layer, peer in ceiling:
        use_threads(nt, torch)
        first_token_ceiling(cfg, prompt, nt, dtype, layer, peer, runs, clock, top)
    return [rep, taken, top]


def ceiling_report(dtypes=("bf16", "i8")):
    """The first-token ceiling table (:func:`first_token_ceiling` fills its rows); int8 rows in GOP, GOP/s."""
    from bench.peaks import peak_legend
    return Report("First token against the peak: the layer's flops (projections + the T x T attention) per second "
                 "as % of the measured peak of the dtype's best unit on as many threads, the peak loop run on "
                 "them interleaved with the layers; 'torch matmuls': its 7 projections alone (their flops "
                 "only); the last column is what 1.5x torch's layer would need (a requirement, not marked); i8 "
                 "rows count the projections' integer operations (GOP, GOP/s) and time the bf16 attention's "
                 "flops at the bf16 peak (a % of peak: the time at the peaks over the time taken)",
                 ["dtype", "threads", "GFLOP (i8: GOP)", "peak GFLOP/s (i8: GOP/s)", "tppasm % peak", "torch % peak",
                  "torch matmuls % peak", "1.5x torch needs % peak"],
                 marked=["tppasm % peak", "torch % peak", "torch matmuls % peak"],
                 legend=peak_legend(dtypes, "best"))


def profile_llm(cfg, prompt, threads, dtypes, runs, clock="wall"):
    """Per-step breakdown of first and next token: each nest of the layer timed on its own
    (interleaved), ms and % of the phase; projections as GFLOP/s (first token) or weight GB/s
    (next token)."""
    from bench.models.llama import KEY_BLOCK
    rep = Report(f"LLaMA-style layer per-step profile (prompt {prompt}; next token at {prompt}): ms per step "
                 f"(median of interleaved runs); projections in GFLOP/s (i8: GOP/s; first token) or weight GB/s "
                 f"(next token)",
                 ["dtype", "threads", "phase", "step", "ms", "% of phase", "GFLOP/s or GB/s"])
    w, x, x1 = inputs(cfg, prompt)
    for nt in threads:
        pool = pool_of(nt)
        for dtype in dtypes:
            layer = LlamaLayer(cfg, w, dtype, pool, pace=stream_pace.best(dtype, pool)[0])
            layer.prefill(x)
            keys = min(-(-(prompt + 1) // KEY_BLOCK) * KEY_BLOCK, cfg.max_len)
            lins = {"qkv": layer.qkv, "o": layer.o, "gate_up": layer.gu, "down": layer.down}
            for phase, T, step, args in (("first token", prompt, layer._step(prompt, None), (x, 0)),
                                         ("next token", 1, layer._step(1, keys), (x1, prompt))):
                steps = step.steps(*args)
                whole, *times = interleaved([lambda: step.run(*args)] + [c for _, c in steps], runs, clock=clock)
                total = float(np.median(whole))
                for (name, _), t in zip(steps, times):
                    t = float(np.median(t))
                    rate = float("nan")
                    if name in lins:
                        lin = lins[name]
                        rate = (2 * T * lin.k * lin.n if T > 1 else lin.blocks.nbytes) / t / 1e9
                    rep.add(dtype, nt, phase, name, 1e3 * t, 100 * t / total, rate)
                rep.add(dtype, nt, phase, "whole step", 1e3 * total, 100.0, float("nan"))
    return rep


def parse(argv=None):
    """The options of ``python -m bench llm``, checked (a bad one: argparse's error); no work done."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m bench llm", description=summary(__doc__))
    p.add_argument("--prompt", type=count("prompt tokens", "--prompt 64"), default=None,
                   help="first-token prompt length (default 256; 64 with --small, whose cache holds 128)")
    threads_option(p)
    dtypes_option(p, ("bf16", "i8"))
    p.add_argument("--runs", type=count("runs", "--runs 5"), default=5,
                   help="timed runs per row; the figures are their median (default 5)")
    p.add_argument("--small", action="store_true", help="the test shape (hidden 128) instead of the 1B-class one")
    p.add_argument("--profile", action="store_true", help="instead: each step's time (no torch needed)")
    add_clock_option(p)
    json_option(p)
    args = p.parse_args(argv)
    check_clock(p, args)
    args.config = Config.small() if args.small else Config()
    if args.prompt is None:
        args.prompt = 64 if args.small else 256
    if not 1 <= args.prompt < args.config.max_len:
        p.error(f"--prompt {args.prompt}: the next token goes at position prompt, so it must lie in "
                f"[1, {args.config.max_len - 1}] for this shape (its cache holds {args.config.max_len}), e.g. "
                f"--prompt {64 if args.small else 256}")
    return args


def main(argv=None):
    args = parse(argv)
    cfg = args.config
    if args.profile:
        write_json(args.json, [profile_llm(cfg, args.prompt, args.threads, args.dtypes, args.runs, args.clock)])
        return 0
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is needed for the comparison: pip install -e .[bench]")
        return 1
    start = time.perf_counter()
    reps = bench_llm(cfg, args.prompt, args.threads, args.dtypes, args.runs, args.clock)
    loops = int8_inner_loops()
    if loops:
        print(f"\nint8 weights consumed from L1 by one core: vpdpbusd {loops['vpdpbusd']:.0f} GB/s, dequantized in "
              f"registers (vpmovsxbd + vcvtdq2ps + FMA) {loops['dequant']:.0f} GB/s: the latter is no faster than "
              "DRAM, hence u8 x s8 BRGEMMs with a dequant epilogue")
    print(f"\n({time.perf_counter() - start:.0f} s)")
    write_json(args.json, reps)
    return 0


if __name__ == "__main__":
    main()
