"""Search loop specs for a kernel: enumerate candidates, time them, remember the fastest per shape.

Candidates come from the paper's enumerator (:mod:`loops.enumerate`) over the declared loops:
each loop blocked 0..len(blocks) times, loops declared ``parallel=True`` with more than one
iteration may be upper-cased. The first ``budget`` candidates after the current spec and the
unblocked ones are timed (median of ``reps`` runs); a candidate whose outputs differ from the
current spec's (a reduction split across threads, say) is reported and skipped.

>>> import numpy as np
>>> from tppasm.eltwise import Unary
>>> from tppasm.kernel import get_kernel
>>> from loops import Loop, kernel
>>> relu = get_kernel(Unary("relu", 8, 8))
>>> @kernel("ab", Loop(0, 4), Loop(0, 4))
... def k(i, j, X, Y):
...     relu(X[i, j], Y[i, j])
>>> X = np.random.randn(4, 4, 8, 8).astype(np.float32); Y = np.empty_like(X)
>>> best = k.tune(X, Y, budget=3, reps=1, progress=False)
>>> best in [r[0] for r in k.last_tuning]
True
"""
import random
import time

import numpy as np

from .enumerate import enumerate_union
from .signature import signature
from .spec import LETTERS, SpecError
from .trace import TraceError


def candidates(lk, budget, seed=0):
    """The current spec, then the unblocked enumerated ones, then a shuffled sample, ``budget`` in all.

    >>> from loops import Loop, kernel
    >>> k = kernel("ab", Loop(0, 4, parallel=False), Loop(0, 4))(lambda i, j: None)
    >>> candidates(k, 4)
    ['ab', 'Ba', 'aB']
    """
    loops = [(LETTERS[i], lp.parallel and lp.trip > 1) for i, lp in enumerate(lk.loops)]
    blockings = {LETTERS[i]: min(len(lp.blocks), 2) for i, lp in enumerate(lk.loops)}
    specs = enumerate_union(loops, blockings)
    unblocked = [s for s in specs if len(s) == len(lk.loops)]
    rest = [s for s in specs if len(s) != len(lk.loops)]
    random.Random(seed).shuffle(rest)
    out = [lk.spec.text]
    for s in unblocked + rest:
        if s not in out:
            out.append(s)
    return out[:budget]


def _time(fn, arrays, reps):
    fn(*arrays)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn(*arrays)
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def tune(lk, arrays, budget=16, reps=5, specs=None, progress=True, rtol=1e-4):
    """Time ``specs`` (default: :func:`candidates`) on ``arrays``; remember and return the best spec.

    ``lk.last_tuning`` holds (spec, seconds or None, note) per candidate after the call.
    """
    specs = list(specs) if specs is not None else candidates(lk, budget)
    writable = [i for i, a in enumerate(arrays) if a.flags.writeable]
    lk(*arrays)
    expect = [arrays[i].copy() for i in writable]
    bar = _progress(len(specs), progress)
    results = []
    for s in specs:
        try:
            variant = lk.with_spec(s)
            seconds = _time(variant, arrays, reps)
            same = all(np.allclose(arrays[i].astype(np.float64), e.astype(np.float64), rtol=rtol, atol=rtol)
                       for i, e in zip(writable, expect))
            results.append((s, seconds if same else None, "" if same else "different result, skipped"))
        except (SpecError, TraceError, IndexError) as e:
            results.append((s, None, str(e).splitlines()[0]))
        bar(s, results[-1][1])
    timed = [r for r in results if r[1] is not None]
    if not timed:
        raise RuntimeError("no candidate spec ran: " + "; ".join(f"{s}: {n}" for s, _, n in results[:3]))
    best = min(timed, key=lambda r: r[1])[0]
    lk._tuned[signature(arrays)] = best
    lk._fast = None
    lk.last_tuning = results
    for i, e in zip(writable, expect):
        arrays[i][...] = e
    return best


def _progress(total, enabled):
    if not enabled:
        return lambda spec, seconds: None
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        bar = tqdm(total=total, desc="tuning", unit="spec")
        best = [None]

        def step(spec, seconds):
            if seconds is not None and (best[0] is None or seconds < best[0][1]):
                best[0] = (spec, seconds)
            bar.set_postfix_str(f"best {best[0][0]} {best[0][1] * 1e3:.3f} ms" if best[0] else "")
            bar.update()
            if bar.n == total:
                bar.close()
        return step
    count = [0]

    def step(spec, seconds):
        count[0] += 1
        shown = f"{seconds * 1e3:.3f} ms" if seconds is not None else "skipped"
        print(f"[{count[0]}/{total}] {spec}: {shown}", flush=True)
    return step
