"""What binding a loop kernel to arrays traces: the body, init and fini trees, and the range of
every index and thread coordinate under a spec (shared by the decorator and the race analysis).

>>> import numpy as np, tppasm as tpp
>>> from loops import Loop, kernel
>>> from loops.spec import parse
>>> relu = tpp.relu(2, 4)
>>> k = kernel("A", Loop(0, 3))(lambda i, X: relu(X[i], X[i]))
>>> body, init, fini = traced_trees(k, [np.ones((3, 2, 4), np.float32)])
>>> print(body.pretty()), box_of(k.resolved, parse("A", 1), 2)["a"]
relu(X[i], X[i])
(None, (0, 2))
"""
import inspect

from isa.pool import MAX_THREADS

from .spec import LETTERS, SpecError
from .program import Node
from .trace import trace


def arity(fn):
    """How many arrays a hook takes (None: ``*args``, all of them): its positional parameters
    without a default (one with a default keeps it, as :func:`_check_arity` counts them).

    >>> arity(lambda X, Y, which=1: None), arity(lambda X, *more: None)
    (2, None)
    """
    params = inspect.signature(fn).parameters.values()
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return None
    return len([p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty])


def check_grid(spec, nthreads, own_pool=False):
    """SpecError when ``spec``'s thread grid needs more than ``nthreads`` threads (``own_pool``: the
    kernel's ``pool=`` override, which the thread settings of the process do not change)."""
    if spec.mode == "grid" and spec.nthreads_needed > nthreads:
        more = (f"pass a pool of {spec.nthreads_needed} threads or more (pool=Pool({spec.nthreads_needed}))"
                if own_pool else f"call loops.set_num_threads({spec.nthreads_needed}) (or set TPPASM_NUM_THREADS)")
        advice = f"shrink the grid or {more}"
        if spec.nthreads_needed > MAX_THREADS:      # no pool has that many: the grid itself must shrink
            advice = f"shrink the grid to at most {MAX_THREADS} threads (the most a pool has), e.g. fewer teams"
        raise SpecError(f"loop spec {spec.text!r} places loops on a {'x'.join(map(str, spec.grid))} thread grid "
                        f"({spec.nthreads_needed} threads) but the pool has {nthreads}; {advice}")


def traced_trees(lk, arrays):
    """The traced body, init and fini trees of loop kernel ``lk`` on ``arrays``."""
    return (trace(lk.body, lk.index_names, arrays, lk.array_names),
            hook_tree(lk.hooks["init"], arrays, lk.array_names),
            hook_tree(lk.hooks["fini"], arrays, lk.array_names))


def bound_trees(lk, spec, loops, arrays, nthreads):
    """:func:`traced_trees` simplified over the values the indices and thread coordinates take
    under ``spec`` (``loops``: its resolved loops) on ``nthreads`` threads."""
    check_grid(spec, nthreads)
    box = box_of(loops, spec, nthreads)
    return tuple(t.simplify(box) for t in traced_trees(lk, arrays))


def hook_tree(fns, arrays, names):
    """One traced tree of all the init (or fini) hooks ``fns``, in order."""
    if not fns:
        return Node()
    for fn in fns:
        _check_arity(fn, names)

    def all_hooks(*views):
        for fn in fns:
            n = arity(fn)
            fn(*(views if n is None else views[:n]))
    return trace(all_hooks, [], arrays, names)


def _check_arity(fn, names):
    """TypeError when hook ``fn`` needs more arrays than the nest has (it receives the first ones)."""
    need = [p.name for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    if len(need) > len(names):
        raise TypeError(f"hook {getattr(fn, '__name__', type(fn).__name__)!r} takes {len(need)} arrays "
                        f"({', '.join(need)}) but the nest has {len(names)} ({', '.join(names) or 'none'}): a "
                        "hook receives the nest's first arrays, as many as it names; drop the extra parameters "
                        "or take '*arrays'")


def box_of(loops, spec, nthreads):
    """Range (inclusive) of every index and thread coordinate over the run."""
    box = {}
    for k, lp in enumerate(loops):
        box[LETTERS[k]] = (lp.start, lp.start + (max(lp.trip, 1) - 1) * lp.step)
    rows, cols, layers = spec.grid if spec.mode == "grid" else (1, 1, 1)
    box.update(tid=(0, nthreads - 1), row=(0, rows - 1), col=(0, cols - 1), layer=(0, layers - 1))
    return box
