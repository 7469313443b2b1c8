"""Data-parallel training of the paper's MLP with tppasm kernels, scaled out by torch.distributed.

``python -m bench ddp [--ranks 2] [--steps 20] [--batch 256] [--width 512] [--layers 4]
[--dtype f32|bf16] [--lr 0.003] [--json FILE]``

The MLP is the paper's chain of fully connected ``width -> width`` layers with bias + ReLU fused
(the last layer without ReLU: it regresses a fixed random teacher network's outputs, MSE loss).
Every rank builds two copies from one seed: one of :class:`tppasm.torch.Linear` layers (forward
and backward on tppasm kernels) and the same in plain ``torch.nn.Linear`` + ``ReLU``, wraps each
in ``DistributedDataParallel`` (gloo), and trains both with Adam on the same batches (each rank its
own shard of ``--batch`` rows), alternating which goes first each step. The script prints both
loss curves (averaged over the ranks), their largest difference, and the median time per step of
each (forward, backward with DDP's gradient all-reduce, optimizer step; the slowest rank's).

One machine: ``--ranks`` processes are started with ``torch.multiprocessing.spawn`` and meet
through a file (``init_method="file://..."``). Several machines, unchanged: when ``torchrun`` has
set ``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR``/``MASTER_PORT``, the script joins that group
instead of spawning::

    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m bench.ddp_mlp --steps 20

Threads per process: the CPUs this process may use divided by the ranks on this machine
(``LOCAL_WORLD_SIZE``), at least 1, for both torch (``torch.set_num_threads``) and tppasm
(``TPPASM_NUM_THREADS``); 1 with 2 ranks on 2 cores.
"""
import argparse
import gc
import math
import os
import statistics
import tempfile
import time

from .common import Report, write_json
from .options import MAX_LAYERS, MAX_ROWS, MAX_SEED, MAX_SIDE, checked, count, json_option, real, summary

TOLERANCE = {"f32": 1e-4, "bf16": 5e-2}     # largest relative loss difference that counts as the same curve
MAX_RANKS = 256             # processes --ranks spawns on one machine, each a Python with torch: more swamps it


def parse(argv=None):
    """The options of ``python -m bench ddp``, checked (a bad one: argparse's error); no work done."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m bench ddp", description=summary(__doc__))
    p.add_argument("--ranks", type=count("ranks", "--ranks 2", most=MAX_RANKS), default=2,
                   help="processes to spawn on this machine (ignored under torchrun)")
    p.add_argument("--steps", type=count("steps", "--steps 20"), default=20, help="training steps (default 20)")
    p.add_argument("--batch", type=count("rows", "--batch 256", limit=MAX_ROWS), default=256,
                   help="rows per rank and step")
    p.add_argument("--width", type=count("features", "--width 512", limit=MAX_SIDE), default=512,
                   help="features of every layer")
    p.add_argument("--layers", type=count("layers", "--layers 4", limit=MAX_LAYERS), default=4,
                   help="fully connected layers (default 4)")
    p.add_argument("--dtype", choices=sorted(TOLERANCE), default="f32",
                   help="weights, activations and data: f32 or bf16 (default f32)")
    p.add_argument("--lr", type=checked(lambda text: real(text, strict=True), "a positive learning rate", "--lr 0.003"),
                   default=0.003, help="Adam's learning rate")
    p.add_argument("--seed", type=count("seed", "--seed 0", least=0, limit=MAX_SEED), default=0,
                   help="seed of the weights and data (default 0)")
    json_option(p)
    return p.parse_args(argv)


def main(argv=None):
    """Train under torchrun's group when its variables are set, else spawn ``--ranks`` processes."""
    args = parse(argv)
    try:
        import torch.distributed  # noqa: F401
    except ImportError:
        print("torch is needed to train with torch.distributed: pip install -e .[bench]")
        return 1
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        result = train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
    else:
        result = spawn(args)
    if result is not None:
        report(result, args)
    return 0


def spawn(args):
    """Run :func:`train` in ``args.ranks`` local processes; rank 0's result. They meet through a
    file (no port to choose, so none can be taken by another program meanwhile)."""
    import torch.multiprocessing as mp
    os.environ["LOCAL_WORLD_SIZE"] = str(args.ranks)
    results = mp.get_context("spawn").SimpleQueue()
    with tempfile.TemporaryDirectory(prefix="tppasm-ddp-") as tmp:
        rendezvous = "file://" + os.path.join(tmp, "rendezvous")
        mp.spawn(_worker, args=(args, rendezvous, results), nprocs=args.ranks, join=True)
    return results.get()


def _worker(rank, args, rendezvous, results):
    result = train(rank, args.ranks, args, rendezvous)
    if result is not None:
        results.put(result)


def train(rank, world, args, rendezvous="env://"):
    """Train both models on this rank; rank 0 returns the curves and times (others None).
    ``rendezvous``: torch.distributed's init_method (torchrun's variables by default)."""
    threads = max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    os.environ["TPPASM_NUM_THREADS"] = str(threads)
    import torch
    import torch._dynamo.utils  # noqa: F401  (before the group exists: see _end_group)
    import torch.distributed as dist
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world)
    try:
        result = _train_both(rank, world, args)
    finally:
        _end_group(dist)
    return {**result, "threads": threads, "gloo_threads_left": len(gloo_threads())} if result is not None else None


def _end_group(dist):
    """Destroy the process group, so that gloo joins its worker threads now. Left running until
    the interpreter finalizes, a worker dropping its last all-reduce needs the GIL for the tensors'
    Python objects, and a thread that asks for it then is ended by a forced unwind that C++'s
    noexcept destructors turn into ``std::terminate`` (SIGABRT in about one run of ten with a cold
    kernel cache). Two things keep the group alive past ``destroy_process_group``: DDP's reference
    cycles (collected here; the models died with :func:`_train_both`'s frame) and
    ``torch._dynamo``, which keeps ten references to the default group when its first import (by
    DDP's constructor) finds one, so :func:`train` imports it before the group exists."""
    gc.collect()
    dist.destroy_process_group()
    gc.collect()


def gloo_threads():
    """Names of this process's gloo threads (Linux; none elsewhere): none once a group has ended.

    >>> gloo_threads()
    []
    """
    tasks = "/proc/self/task"
    names = []
    for task in os.listdir(tasks) if os.path.isdir(tasks) else ():
        try:
            with open(os.path.join(tasks, task, "comm")) as f:
                names.append(f.read().strip())
        except OSError:         # the thread ended meanwhile
            pass
    return sorted(name for name in names if "gloo" in name)


def _train_both(rank, world, args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    ours, plain = models(args.width, args.layers, dtype, args.seed)
    runs = {name: (DDP(m), torch.optim.Adam(m.parameters(), lr=args.lr)) for name, m in
            (("tppasm", ours), ("torch", plain))}
    teacher = torch.nn.Linear(args.width, args.width).to(dtype)
    data = torch.Generator().manual_seed(args.seed * 7919 + rank + 1)
    losses = {name: [] for name in runs}
    times = {name: [] for name in runs}
    for step in range(args.steps):
        x = torch.randn(args.batch, args.width, generator=data).to(dtype)
        with torch.no_grad():
            target = teacher(x)
        order = list(runs) if step % 2 == 0 else list(runs)[::-1]
        for name in order:
            model, opt = runs[name]
            start = time.perf_counter()
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), target)
            loss.backward()
            opt.step()
            times[name].append(time.perf_counter() - start)
            mean = loss.detach().float().reshape(1)
            dist.all_reduce(mean)
            losses[name].append(mean.item() / world)
    # the first step JITs the kernels: leave it out when there are others
    medians = torch.tensor([statistics.median(times[name][1:] or times[name]) for name in runs])
    dist.all_reduce(medians, op=dist.ReduceOp.MAX)
    if rank != 0:
        return None
    return {"world": world, "losses": losses, "step_s": dict(zip(runs, medians.tolist()))}


def models(width, layers, dtype, seed):
    """(tppasm MLP, plain torch MLP) with the same initial parameters."""
    import torch
    import tppasm.torch as tt
    torch.manual_seed(seed)
    plain = []
    for i in range(layers):
        plain.append(torch.nn.Linear(width, width))
        if i < layers - 1:
            plain.append(torch.nn.ReLU())
    plain = torch.nn.Sequential(*plain).to(dtype)
    ours = torch.nn.Sequential(*[tt.Linear(width, width, act="relu" if i < layers - 1 else None)
                                 for i in range(layers)]).to(dtype)
    linears = [m for m in plain if isinstance(m, torch.nn.Linear)]
    for mine, theirs in zip(ours, linears):
        mine.load_state_dict(theirs.state_dict())
    return ours, plain


def max_relative_difference(a, b):
    """The largest ``|a_i - b_i| / |b_i|`` of two loss curves; NaN where a step's losses are not
    both finite (a NaN difference would be dropped by max unless it came first).

    >>> max_relative_difference([1.0, 2.0], [1.0, 2.5]), max_relative_difference([1.0, float("nan")], [1.0, 0.9])
    (0.2, nan)
    """
    diffs = [abs(x - y) / max(abs(y), 1e-30) if math.isfinite(x) and math.isfinite(y) else math.nan
             for x, y in zip(a, b)]
    return math.nan if any(map(math.isnan, diffs)) else max(diffs)


def report(result, args):
    """Print the curves and times; True when the curves agree within :data:`TOLERANCE`."""
    world, losses, step = result["world"], result["losses"], result["step_s"]
    curves = Report(f"DDP MLP training: {args.layers} x FC {args.width} ({args.dtype}), {world} ranks x "
                    f"{result['threads']} threads, {args.batch} rows per rank; loss averaged over ranks",
                    ["step", "loss tppasm", "loss torch", "relative difference"])
    for i, (a, b) in enumerate(zip(losses["tppasm"], losses["torch"])):
        curves.add(i, a, b, abs(a - b) / max(abs(b), 1e-30))
    diff = max_relative_difference(losses["tppasm"], losses["torch"])
    same = diff <= TOLERANCE[args.dtype]
    print(f"\nlargest relative loss difference {diff:.3g} ({'within' if same else 'OVER'} the {args.dtype} "
          f"tolerance {TOLERANCE[args.dtype]:g}); loss {losses['tppasm'][0]:.4g} -> {losses['tppasm'][-1]:.4g}")
    flops = 3 * 2 * args.batch * args.width ** 2 * args.layers    # forward, dX and dW GEMMs per rank
    times = Report("Time per training step (median over steps after the first, slowest rank)",
                   ["model", "ms/step", "GFLOP/s per rank", "tppasm/torch speed"])
    for name in ("tppasm", "torch"):
        times.add(name, step[name] * 1e3, flops / step[name] / 1e9, step["torch"] / step[name])
    write_json(args.json, [curves, times])
    if not same:
        raise SystemExit(f"the tppasm loss curve differs from torch's by {diff:.3g} (relative), over "
                         f"{TOLERANCE[args.dtype]:g}")
    return same


if __name__ == "__main__":
    raise SystemExit(main())
