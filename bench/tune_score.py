"""How well the pruned search does: the tuner's pick in ``--seconds`` against the exhaustive best.

``python -m bench.tune_score [--size 1024] [--threads 2] [--exhaustive FILE] [--seconds 120] [--repeats 3]
[--lock /tmp/tppasm-bench.lock] [--json FILE]``

1. Exhaustive (offline, once; kept in ``--exhaustive FILE``, which a later run resumes; by default
   :func:`default_exhaustive` in the tppasm cache directory, never the working directory): every
   candidate of the joint space (:data:`SPACE` and :data:`EXTRA` knobs x specs x block sizes of the M
   and N loops) of the DSL GEMM at size^3 is checked and timed (:func:`loops.tune.search` with no limit, one
   configuration at a time, each holding the bench lock), with the model's prediction beside it;
   then the 20 fastest are timed again, round robin, and the lowest median is the exhaustive best.
2. Model: from those timings, the rank of the exhaustive best in the model's order and how close
   the best of the model's top N comes (what timing only N candidates would find).
3. Pruned: ``--repeats`` fresh searches with the default budget (``--seconds``, modelling included);
   each winner is timed back to back with the exhaustive best (median ratio of 7 rounds).
"""
import argparse
import contextlib
import fcntl
import json
import os

import numpy as np

from bench.common import pool_of
from bench.gemm import gemm_maker, winner_text
from bench.options import MAX_THREADS, count, json_option, seconds, summary, writable_file
from loops.tune import elapsed, search
from tppasm.cache import directory as cache_directory

SPACE = {"bm": [64, 32, 128], "bn": [32, 64], "bk": [64], "kstep": [8], "edges": [False]}
EXTRA = [{"bm": 64, "bn": 32, "bk": 128, "kstep": 4, "edges": False},     # K blocks of 128, 4 per BRGEMM
         {"bm": 64, "bn": 64, "bk": 128, "kstep": 4, "edges": False}]


@contextlib.contextmanager
def locked(path):
    """Hold ``path``'s flock (the bench lock) while timing; a no-op without a path."""
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def configs():
    """Every knob combination of :data:`SPACE`, in order, then :data:`EXTRA`.

    >>> len(configs()), configs()[0]["bm"]
    (8, 64)
    """
    out = [{}]
    for k in SPACE:
        out = [{**c, k: v} for c in out for v in SPACE[k]]
    return out + EXTRA


def operands(size):
    rng = np.random.default_rng(0)
    return rng.standard_normal((size, size), np.float32), rng.standard_normal((size, size), np.float32)


def exhaustive(size, threads, lock, path, reps=2, clock="wall"):
    """Time every candidate (see the module docstring), resuming ``path``: configurations already
    there are kept (each is written as soon as it is done); returns the data."""
    a, b = operands(size)
    make = gemm_maker(a, b, "f32", pool_of(threads))
    data = {"size": size, "threads": threads, "clock": clock, "rows": []}
    if os.path.exists(path):
        with open(path) as f:
            data = json.load(f)
        if (data["size"], data["threads"], data.get("clock", "wall")) != (size, threads, clock):
            raise SystemExit(f"{path} holds {data['size']}^3 on {data['threads']} threads by {data.get('clock')} "
                             f"clock; pass another --exhaustive file")
    rows = data["rows"]
    done = {_key(r["config"]) for r in rows}
    todo = [c for c in configs() if _key(c) not in done]
    for n, config in enumerate(todo):
        with locked(lock):
            found = search(make, [config], seconds=None, reps=reps, refine=0, progress=True, remember=False,
                           clock=clock)
        rows += [{"config": c.config, "spec": c.spec, "predicted": c.predicted, "seconds": c.seconds, "note": c.note}
                 for c in found.candidates]
        print(f"configuration {n + 1}/{len(todo)} {config}: {len(found.candidates)} candidates, fastest "
              f"{min(c.seconds for c in found.candidates if c.seconds) * 1e3:.2f} ms", flush=True)
        _save(data, path)
    if todo or not any(r.get("retimed") for r in rows):
        for r in rows:
            r.pop("retimed", None)
        timed = sorted((r for r in rows if r["seconds"]), key=lambda r: r["seconds"])
        with locked(lock):
            medians = retime(make, timed[:20], rounds=5, clock=clock)
        for r, m in zip(timed[:20], medians):
            r["retimed"] = m
        _save(data, path)
    return data


def _key(config):
    return tuple(sorted(config.items()))


def _save(data, path):
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def retime(make, rows, rounds=5, reps=3, clock="wall"):
    """Median over ``rounds`` (round robin) of the min of ``reps`` runs, per row's (config, spec)."""
    runs = []
    for r in rows:
        lk, arrays, _ = make(**r["config"])
        variant = lk.with_spec(r["spec"])
        variant(*arrays)
        runs.append((variant, arrays))
    samples = [[] for _ in rows]
    for _ in range(rounds):
        for i, (variant, arrays) in enumerate(runs):
            samples[i].append(min(elapsed(variant, arrays, clock) for _ in range(reps)))
    return [float(np.median(s)) for s in samples]


def repredict(make, rows, threads):
    """The current model's predictions for ``rows`` (the model may have changed since they were timed)."""
    from loops.cost import Machine
    from loops.trial import Builds
    from loops.tune import predictor
    builds, machine = Builds(make), Machine.host(threads)
    predictors = {}
    for r in rows:
        key = tuple(sorted(r["config"].items()))
        if key not in predictors:
            predictors[key] = predictor(builds.get(r["config"]), machine, threads)
            builds.drop(r["config"])
        try:
            r["predicted"] = predictors[key](r["spec"])
        except ValueError:
            r["predicted"] = None


def model_scores(rows, best_seconds):
    """Rank of the exhaustive best in the model's order, and best-of-top-N / exhaustive best.

    >>> rows = [{"predicted": 1.0, "seconds": 2.0}, {"predicted": 2.0, "seconds": 1.0}, {"predicted": 3.0, "seconds": 3.0}]
    >>> model_scores(rows, 1.0)["rank_of_best"], model_scores(rows, 1.0)["top"]["1"]
    (1, 2.0)
    """
    timed = [r for r in rows if r["seconds"] and r["predicted"] is not None]
    order = sorted(timed, key=lambda r: r["predicted"])
    fastest = min(timed, key=lambda r: r["seconds"])
    top = {}
    for n in (1, 10, 30, 100, 300, 1000, 3000):
        if n <= len(order):
            top[str(n)] = min(r["seconds"] for r in order[:n]) / best_seconds
    p = np.argsort(np.argsort([r["predicted"] for r in timed]))
    s = np.argsort(np.argsort([r["seconds"] for r in timed]))
    return {"rank_of_best": order.index(fastest), "top": top, "spearman": float(np.corrcoef(p, s)[0, 1]),
            "timed": len(timed)}


def default_exhaustive(size, threads, clock="wall"):
    """Where the exhaustive timings of (``size``, ``threads``, ``clock``) are kept without ``--exhaustive``: a
    file in the tppasm cache directory (:func:`tppasm.cache.directory`), one per setting.

    >>> import os
    >>> os.path.basename(default_exhaustive(1024, 2))
    'tune_exhaustive-1024-2t-wall.json'
    >>> os.path.dirname(default_exhaustive(1024, 2)) == cache_directory()
    True
    """
    return os.path.join(cache_directory(), f"tune_exhaustive-{size}-{threads}t-{clock}.json")


def parse(argv=None):
    """The options of ``python -m bench.tune_score``, checked (a bad one: argparse's error); no work done."""
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m bench.tune_score", description=summary(__doc__))
    p.add_argument("--size", type=count("rows and columns", "--size 1024"), default=1024,
                   help="the f32 GEMM's M = N = K (default 1024)")
    p.add_argument("--threads", type=count("threads", "--threads 2", most=MAX_THREADS), default=2,
                   help="threads of the loop nests (default 2)")
    p.add_argument("--exhaustive", type=writable_file("--exhaustive tune_exhaustive.json"), metavar="FILE",
                   help="the exhaustive timings, written as they are made and resumed by a later run (default: "
                        "tune_exhaustive-SIZE-THREADSt-CLOCK.json in the tppasm cache directory: $TPPASM_CACHE_DIR, "
                        "else $XDG_CACHE_HOME/tppasm, else ~/.cache/tppasm)")
    p.add_argument("--seconds", type=seconds("--seconds 120", strict=True), default=120,
                   help="time budget of each pruned search, modelling included (default 120)")
    p.add_argument("--repeats", type=count("repeats", "--repeats 3"), default=3,
                   help="how many pruned searches to run and score (default 3)")
    p.add_argument("--reps", type=count("runs", "--reps 2"), default=2,
                   help="exhaustive: timed runs per candidate (the minimum counts)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="cpu: the largest CPU time of the nest's threads (a busy machine; see loops.tune.elapsed)")
    p.add_argument("--lock", type=writable_file("--lock /tmp/tppasm-bench.lock", empty=True),
                   default="/tmp/tppasm-bench.lock", help="bench lock file ('' for none)")
    json_option(p)
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    path = args.exhaustive
    if path is None:
        path = default_exhaustive(args.size, args.threads, args.clock)
        if not os.path.isabs(path):
            raise SystemExit(f"no cache directory for the exhaustive timings ({path} is relative: HOME is empty); "
                             "pass --exhaustive FILE or set TPPASM_CACHE_DIR")
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        print(f"exhaustive timings: {path}", flush=True)
    data = exhaustive(args.size, args.threads, args.lock, path, args.reps, args.clock)
    rows = data["rows"]
    size, threads, clock = data["size"], data["threads"], data.get("clock", "wall")
    a, b = operands(size)
    make = gemm_maker(a, b, "f32", pool_of(threads))
    repredict(make, rows, threads)
    flops = 2 * size ** 3
    best = min((r for r in rows if r.get("retimed")), key=lambda r: r["retimed"])
    print(f"\nexhaustive: {len(rows)} candidates at {size}^3 on {threads} threads; best "
          f"{winner_text({'spec': best['spec'], 'knobs': best['config']})}: {flops / best['retimed'] / 1e9:.1f} GFLOP/s")
    scores = model_scores(rows, min(r["seconds"] for r in rows if r["seconds"]))
    print(f"model: the exhaustive best is number {scores['rank_of_best'] + 1} of {scores['timed']} in the model's "
          f"order; Spearman rank correlation {scores['spearman']:.2f}; best of the model's top N / exhaustive best: "
          + ", ".join(f"N={n}: {v:.3f}" for n, v in scores["top"].items()))
    pruned = []
    for i in range(args.repeats):
        with locked(args.lock):
            found = search(make, configs(), seconds=args.seconds, progress=True, remember=False, clock=clock)
            r = found.record
            ratios = []
            pair = retime(make, [{"config": r["knobs"], "spec": r["spec"]}, best], rounds=7, clock=clock)
            ratios.append(pair[0] / pair[1])
        pruned.append({**r, "vs_exhaustive": ratios[0]})
        print(f"pruned search {i + 1}: {winner_text(r)} after {r['timed']} timed of {r['candidates']} in "
              f"{r['elapsed']:.0f} s: {ratios[0]:.3f}x the exhaustive best's time", flush=True)
    within = sum(1 for x in pruned if x["vs_exhaustive"] <= 1.05)
    print(f"\n{within} of {len(pruned)} pruned searches within 5% of the exhaustive best")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"size": size, "threads": threads, "exhaustive_best": best, "model": scores,
                       "pruned": pruned}, f, indent=1)
    return 0


if __name__ == "__main__":
    main()
