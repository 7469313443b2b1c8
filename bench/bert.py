"""all-MiniLM-L6-v2 on tppasm (:class:`bench.models.minilm.MiniLM`) against torch, in the same run.

``python -m bench bert [--shapes 1x32,8x128] [--threads 1,2] [--dtypes f32,bf16] [--runs N] [--clock wall|cpu]
[--json FILE]``

Each row times ``model.forward(input_ids, attention_mask)`` (the last hidden state, the encoder
only: tokenization aside) beside the same checkpoint as Hugging Face's ``BertModel`` in
``torch.inference_mode()`` (bf16 under ``torch.autocast("cpu", dtype=torch.bfloat16)``), on random
token ids with a full mask, ``runs`` rounds interleaved (ours, torch, ours, ...), each a calibrated
number of calls (:mod:`bench.interleave`; ``--clock cpu``: the calling thread's CPU time, 1 thread).
Printed: medians in ms per batch and the median of the per-round ratios torch/ours (> 1: tppasm
faster); threads are our pool's size and ``torch.set_num_threads``. Before timing, both outputs are
compared (max abs difference).

>>> from bench.bert import MiniLM
>>> MiniLM.load("f32").encode(["tppasm"]).shape
(1, 384)
"""
import argparse
import os
import time

import numpy as np

from bench.common import Report, write_json
from bench.interleave import add_clock_option, check_clock, interleaved
from bench.models.minilm import MiniLM, model_dir  # noqa: F401  (MiniLM: the public entry)
from loops.pool import Pool, get_pool


def parse_shapes(text):
    """'1x32,8x128' -> [(1, 32), (8, 128)] as (batch, tokens).

    >>> parse_shapes("1x32,8x128")
    [(1, 32), (8, 128)]
    """
    return [tuple(int(v) for v in item.lower().split("x")) for item in text.split(",")]


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


def _pool(n):
    return get_pool() if get_pool().nthreads == n else Pool(n)


def bench_bert(shapes, threads, dtypes, runs, clock="wall"):
    import torch
    rep = Report("all-MiniLM-L6-v2 encoder forward, ms per batch (median of interleaved runs); "
                 "torch = HF BertModel, inference_mode (bf16: autocast)",
                 ["dtype", "batch x tokens", "threads", "tppasm ms", "torch ms", "torch/tppasm", "max |diff|"])
    rng = np.random.default_rng(0)
    for dtype in dtypes:
        _, run_torch = torch_model(dtype)
        for nt in threads:
            torch.set_num_threads(nt)
            model = MiniLM.load(dtype, pool=_pool(nt))
            for B, L in shapes:
                ids = rng.integers(1000, 30000, (B, L))
                ids[:, 0], ids[:, -1] = 101, 102
                mask = np.ones((B, L), np.int64)
                tid, tmask = torch.from_numpy(ids), torch.from_numpy(mask)
                diff = float(np.abs(model.forward(ids, mask) - run_torch(tid, tmask).float().numpy()).max())
                ours, theirs = interleaved([lambda: model.forward(ids, mask), lambda: run_torch(tid, tmask)], runs,
                                           clock=clock)
                rep.add(dtype, f"{B}x{L}", nt, 1e3 * float(np.median(ours)), 1e3 * float(np.median(theirs)),
                        float(np.median(theirs / ours)), diff)
    return rep


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench bert", description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="1x32,8x128", help="batch x tokens, comma separated")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--dtypes", default="f32,bf16")
    p.add_argument("--runs", type=int, default=7, help="interleaved timing runs per row")
    add_clock_option(p)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    check_clock(p, args)
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        print("torch and transformers are needed for the comparison: pip install -e .[bench]")
        return 1
    start = time.perf_counter()
    rep = bench_bert(parse_shapes(args.shapes), [int(t) for t in args.threads.split(",")],
                     args.dtypes.split(","), args.runs, args.clock)
    print(f"\n({time.perf_counter() - start:.0f} s)")
    write_json(args.json, [rep])
    return 0


if __name__ == "__main__":
    main()
