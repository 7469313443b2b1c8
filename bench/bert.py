"""all-MiniLM-L6-v2 on tppasm (:class:`bench.models.minilm.MiniLM`) against torch, in the same run.

``python -m bench bert [--shapes 1x32,8x128] [--threads 1,2] [--dtypes f32,bf16] [--runs N] [--clock wall|cpu]
[--profile | --corpus N] [--json FILE]``

Each row times ``model.forward(input_ids, attention_mask)`` (the last hidden state, the encoder
only: tokenization aside) beside the same checkpoint as Hugging Face's ``BertModel`` in
``torch.inference_mode()`` (bf16 under ``torch.autocast("cpu", dtype=torch.bfloat16)``), on random
token ids with a full mask, ``runs`` rounds interleaved (ours, torch, ours, ...), each a calibrated
number of calls (:mod:`bench.interleave`; ``--clock cpu``: the calling thread's CPU time, 1 thread).
Printed: medians in ms per batch and the median of the per-round ratios torch/ours (> 1: tppasm
faster); threads are our pool's size and ``torch.set_num_threads``. The dtype's peak loop, run on
as many threads in the same interleaving, puts both forwards' GEMM flops (:func:`step_flops`) in %
of what the cores delivered, and the issue's goal for the row (:func:`goal`: 2x torch at 1 x 32,
else 1.25x in fp32 and 1.5x in bf16) as the % of peak it would take; near or above 100%, the goal
is out of reach by arithmetic on that host. Before timing, both outputs are
compared (max abs difference). ``--profile`` prints instead where one layer's time goes: each step
(QKV, the attention's steps, output projection, norms, MLP) as its own nest over the same loops,
ms per layer, its share of the forward, and the GEMM steps' GFLOP/s against the measured peak (the
dtype's peak loop on as many threads, timed in the same interleaving and on the same clock:
medians of the per-round fractions). A measured % of peak over 100 is marked "!" (a disturbed
round or a wrong peak); records with a % of peak carry the peak (``peak_gflops``: the loop's median
rate) and its unit (``peak_unit``, :func:`bench.peaks.peak_unit`).
``--corpus N`` times instead a pass over N sentences of 3 to 29 words (:func:`corpus`), as
``encode`` forms them: sorted by length, batches of 8, each batch at its longest sentence's
length (ours) and padded to the same length (torch's, as its tokenizer's ``padding="longest"``).

>>> from bench.bert import MiniLM
>>> MiniLM.load("f32").encode(["tppasm"]).shape
(1, 384)
"""
import argparse
import os
import time

import numpy as np

from bench.common import Report, pool_of, write_json
from bench.interleave import add_clock_option, check_clock, interleaved, use_threads
from bench.models.minilm import POSITIONS, MiniLM, model_dir  # noqa: F401  (MiniLM: the public entry)
from bench.options import count, dtypes_option, json_option, shapes, summary, threads_option


def parse_shapes(text):
    """'1x32,8x128' -> [(1, 32), (8, 128)] as (batch, tokens) (``--shapes``' type: argparse's error
    for anything else, or more tokens than the model has positions).

    >>> parse_shapes("1x32,8x128")
    [(1, 32), (8, 128)]
    """
    return _SHAPES(text)


_SHAPES = shapes("batch x tokens pairs", "--shapes 1x32,8x128", 2, most=(None, POSITIONS))


def torch_model(dtype):
    """(model, run(ids, mask) -> hidden) for the Hugging Face BertModel of the same checkpoint."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModel
    net = AutoModel.from_pretrained(model_dir()).eval()

    def run(ids, mask):
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            return net(input_ids=ids, attention_mask=mask).last_hidden_state
    return net, run


def goal(dtype, batch, tokens):
    """The issue's speed-up over torch for a row: 2x at 1 x 32 (per-operator overhead), else 1.25x
    in fp32 and 1.5x in bf16.

    >>> goal("bf16", 8, 128), goal("f32", 1, 32)
    (1.5, 2.0)
    """
    if batch * tokens <= 32:
        return 2.0
    return 1.5 if dtype == "bf16" else 1.25


def bench_bert(shapes, threads, dtypes, runs, clock="wall"):
    import torch
    from bench.models.minilm import LAYERS
    from bench.peaks import peak_legend, peak_loop_on
    rep = Report("all-MiniLM-L6-v2 encoder forward, ms per batch (median of interleaved runs); "
                 "torch = HF BertModel, inference_mode (bf16: autocast); GEMM flops as % of the dtype's peak "
                 "on as many threads, timed in the same interleaving; goal needs % peak: over 100, the goal is "
                 "out of reach (a requirement, not marked)",
                 ["dtype", "batch x tokens", "threads", "tppasm ms", "torch ms", "torch/tppasm", "ours % peak",
                  "torch % peak", "goal", "goal needs % peak", "max |diff|"],
                 marked=["ours % peak", "torch % peak"], legend=peak_legend(dtypes, "best"))
    rng = np.random.default_rng(0)
    for dtype in dtypes:
        _, run_torch = torch_model(dtype)
        for nt in threads:
            use_threads(nt, torch)
            loop, work = peak_loop_on(nt, dtype)
            model = MiniLM.load(dtype, pool=pool_of(nt))
            for B, L in shapes:
                ids = rng.integers(1000, 30000, (B, L))
                ids[:, 0], ids[:, -1] = 101, 102
                mask = np.ones((B, L), np.int64)
                tid, tmask = torch.from_numpy(ids), torch.from_numpy(mask)
                diff = float(np.abs(model.forward(ids, mask) - run_torch(tid, tmask).float().numpy()).max())
                ours, theirs, top = interleaved([lambda: model.forward(ids, mask), lambda: run_torch(tid, tmask),
                                                 loop], runs, clock=clock)
                rate, flops, want = work / top, LAYERS * sum(step_flops(B, L).values()), goal(dtype, B, L)
                pct = [100 * float(np.median(flops / t / rate)) for t in (ours, theirs, theirs / want)]
                rep.add(dtype, f"{B}x{L}", nt, 1e3 * float(np.median(ours)), 1e3 * float(np.median(theirs)),
                        float(np.median(theirs / ours)), *pct[:2], want, pct[2], diff, **peak_fields(dtype, rate))
    return rep


def peak_fields(dtype, rate):
    """A record's peak: ``peak_gflops`` (the median of the peak loop's per-round FLOP/s ``rate``, in
    GFLOP/s) and ``peak_unit`` (:func:`bench.peaks.peak_unit` of the loop's unit, ``dtype``'s best).

    >>> peak_fields("f32", np.array([2e9, 4e9, 3e9]))["peak_gflops"]
    3.0
    """
    from bench.peaks import peak_unit
    return {"peak_gflops": float(np.median(rate)) / 1e9, "peak_unit": peak_unit(dtype, unit="best")}


def step_flops(B, L):
    """{step: flops} of one encoder layer on B x L tokens (the GEMM steps; others are not counted)."""
    from bench.models.minilm import FFN, HEAD_DIM, HEADS, HIDDEN
    T = B * L
    att = 2 * B * HEADS * L * L * HEAD_DIM
    return {"qkv": 2 * T * HIDDEN * 3 * HIDDEN, "scores": att, "context": att, "out_proj": 2 * T * HIDDEN * HIDDEN,
            "up": 2 * T * HIDDEN * FFN, "down": 2 * T * FFN * HIDDEN}


# the profile's rows a forward, not a layer: what it does besides the layers, and the rest of its time
OUTSIDE_ROW = "(once a forward: input checks, embeddings, output copy)"
SEQUENCE_ROW = "(the layers as run, beyond the sum of their steps)"


def outside_layers(model, plan, ids, mask):
    """What ``model.forward(ids, mask)`` does besides running the layers, on ``plan``'s buffers."""
    from bench.models.minilm import _check_inputs
    model._embed(plan, *_check_inputs(ids, mask, model.word.shape[0]))
    return plan.H.copy()


def profile_bert(shapes, threads, dtypes, runs, clock="wall"):
    """Per-step breakdown of one layer (each step its own nest, same loops), beside the forward;
    the rows :data:`OUTSIDE_ROW` and :data:`SEQUENCE_ROW` are per forward."""
    from bench.models.minilm import LAYERS
    from bench.peaks import peak_legend, peak_loop_on
    rep = Report("all-MiniLM-L6-v2 per-step profile: one layer cut into one nest per step, ms per layer "
                 "(median of interleaved runs); GEMM steps as % of the dtype's peak loop on as many threads, "
                 "timed in the same interleaving on the same clock",
                 ["dtype", "batch x tokens", "threads", "step", "ms", "% of forward", "GFLOP/s", "% peak"],
                 marked=["% peak"], legend=peak_legend(dtypes, "best"))
    rng = np.random.default_rng(0)
    for dtype in dtypes:
        for nt in threads:
            loop, work = peak_loop_on(nt, dtype)
            model = MiniLM.load(dtype, pool=pool_of(nt))
            for B, L in shapes:
                ids = rng.integers(1000, 30000, (B, L))
                mask = np.ones((B, L), np.int64)
                model.forward(ids, mask)
                plan = model._plan(B, L)
                steps = plan.steps(*model.layers[0])
                fns = [lambda: model.forward(ids, mask)] + [call for _, call in steps]
                fns += [lambda: outside_layers(model, plan, ids, mask), loop]
                fwd, *times, around, top = interleaved(fns, runs, clock=clock)
                flops, rate = step_flops(B, L), work / top          # the peak's FLOP/s in each round
                total, peak = float(np.median(fwd)), peak_fields(dtype, rate)
                for (name, _), samples in zip(steps, times):
                    t = float(np.median(samples))
                    gf = flops[name] / t / 1e9 if name in flops else float("nan")
                    pct = 100 * float(np.median(flops[name] / samples / rate)) if name in flops else float("nan")
                    rep.add(dtype, f"{B}x{L}", nt, name, 1e3 * t, 100 * LAYERS * t / total, gf, pct, **peak)
                outside = float(np.median(around))
                rest = total - LAYERS * sum(float(np.median(t)) for t in times) - outside
                for name, t in ((OUTSIDE_ROW, outside), (SEQUENCE_ROW, rest)):
                    rep.add(dtype, f"{B}x{L}", nt, name, 1e3 * t, 100 * t / total, float("nan"), float("nan"), **peak)
                gemm_flops = sum(flops.values()) * LAYERS
                rep.add(dtype, f"{B}x{L}", nt, "forward", 1e3 * total, 100.0, gemm_flops / total / 1e9,
                        100 * float(np.median(gemm_flops / fwd / rate)), **peak)
    return rep


def corpus(count, seed=0):
    """``count`` sentences of 3 to 29 words from a fixed vocabulary, the same for a ``seed``.

    >>> len(corpus(3)), corpus(2) == corpus(2)
    (3, True)
    """
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(CORPUS_WORDS, rng.integers(3, 30))) for _ in range(count)]


CORPUS_WORDS = ("the quick brown fox jumps over a lazy dog while seven tired engineers measure kernels on noisy "
                "machines and nobody sleeps before the numbers hold").split()
CORPUS_BATCH = 8


def bench_corpus(count, threads, dtypes, runs, clock="wall"):
    """``--corpus``: one pass over :func:`corpus` (``count`` sentences) in batches of CORPUS_BATCH
    by length, ours against torch on the same token ids and masks."""
    import torch
    rep = Report(f"all-MiniLM-L6-v2 encoder over {count} sentences of 3 to 29 words in batches of {CORPUS_BATCH} "
                 "by length (each at its longest sentence), ms per pass (median of interleaved runs)",
                 ["dtype", "threads", "sentences", "mean tokens", "tppasm ms", "torch ms", "torch/tppasm",
                  "max |diff|"])
    texts = corpus(count)
    for dtype in dtypes:
        _, run_torch = torch_model(dtype)
        for nt in threads:
            use_threads(nt, torch)
            model = MiniLM.load(dtype, pool=pool_of(nt))
            lengths = [len(e.ids) for e in model.tok.encode_batch(texts)]
            order = np.argsort(lengths, kind="stable")[::-1]
            batches = [model.tokenize([texts[i] for i in order[s:s + CORPUS_BATCH]])
                       for s in range(0, count, CORPUS_BATCH)]
            tensors = [(torch.from_numpy(ids), torch.from_numpy(mask)) for ids, mask in batches]
            ids, mask = batches[0]
            keep = mask.astype(bool)
            diff = float(np.abs(model.forward(ids, mask)[keep] - run_torch(*tensors[0]).float().numpy()[keep]).max())
            ours, theirs = interleaved([lambda: [model.forward(*b) for b in batches],
                                        lambda: [run_torch(*t) for t in tensors]], runs, clock=clock)
            rep.add(dtype, nt, count, float(np.mean(lengths)), 1e3 * float(np.median(ours)),
                    1e3 * float(np.median(theirs)), float(np.median(theirs / ours)), diff)
    return rep


def parse(argv=None):
    """The options of ``python -m bench bert``, checked (a bad one: argparse's error); no work done."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m bench bert", description=summary(__doc__))
    p.add_argument("--shapes", type=parse_shapes, default="1x32,8x128",
                   help=f"batch x tokens, comma separated (tokens at most {POSITIONS}; default 1x32,8x128)")
    threads_option(p)
    dtypes_option(p, ("f32", "bf16"))
    p.add_argument("--runs", type=count("runs", "--runs 7"), default=7, help="interleaved timing runs per row")
    add_clock_option(p)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--profile", action="store_true", help="instead: a per-step breakdown of one layer")
    mode.add_argument("--corpus", type=count("sentences", "--corpus 256"), default=0,
                      help="instead: a pass over this many sentences of 3 to 29 words, batches of 8 by length")
    json_option(p)
    args = p.parse_args(argv)
    check_clock(p, args)
    return args


def main(argv=None):
    args = parse(argv)
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        print("torch and transformers are needed for the comparison: pip install -e .[bench]")
        return 1
    start = time.perf_counter()
    if args.corpus:
        rep = bench_corpus(args.corpus, args.threads, args.dtypes, args.runs, args.clock)
    else:
        run = profile_bert if args.profile else bench_bert
        rep = run(args.shapes, args.threads, args.dtypes, args.runs, args.clock)
    print(f"\n({time.perf_counter() - start:.0f} s)")
    write_json(args.json, [rep])
    return 0


if __name__ == "__main__":
    main()
