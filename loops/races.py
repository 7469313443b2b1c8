"""Data races a loop spec would cause, found when a loop kernel is bound (its first call).

The tracer knows the block of every argument each kernel call of the body reads and writes, per
axis of the argument: a start affine in the loop indices (and ``thread()`` coordinates), an
extent and a step (:meth:`loops.trace.View.box`), and the ``if`` conditions that lead to the call.
:mod:`loops.schedule` knows which thread runs each iteration and which iterations a barrier
separates. Two iterations *may run at the same time* when no barrier separates them and

- ``schedule(static)`` / ``static,c`` / grids: they are on different threads (the split is fixed:
  computed, not guessed), or
- ``schedule(dynamic,c)``: they are in different chunks (two chunks may go to two threads);

iterations of one thread run in the serial order of the spec. A *race* is such a pair where one
writes a block the other reads or writes: :func:`check` returns every kind it finds, each with a
concrete pair of iterations and their threads; :class:`RaceError` (a :class:`loops.SpecError`)
refuses the spec at bind time, naming the fixes that the same analysis accepts. Without races,
every thread's work commutes with the others', so the nest computes what its serial order does.

The analysis is per pair of accesses to one array: the overlap of two blocks is a condition per
axis, which for the usual ``A[i, j]`` indexing pins each loop to a small window of differences
(``x_k - x'_k``); a loop whose values decide no thread, chunk or epoch only has to admit one pair;
the rest is searched with NumPy over the loops that do decide them, where a loop absent from the
indices needs only its extreme values per block (the thread is monotone in it). When even that
search would exceed :data:`BUDGET` pairs, the spec is refused as unproven (``races="allow"``
overrides). Aliasing arguments (two arrays sharing memory) are compared by byte ranges.

>>> import numpy as np, tppasm as tpp
>>> from loops import Loop, kernel
>>> zero, gemm = tpp.zero(4, 4), tpp.brgemm(4, 4, 4, beta=1)
>>> @kernel("aBC@schedule(dynamic,1)", Loop(0, 2), Loop(0, 2), Loop(0, 2), races="allow")
... def mm(ik, im, jn, A, B, C):
...     if ik == 0:
...         zero(C[im, jn])
...     gemm(A[im, ik:ik + 1], B[jn, ik:ik + 1], C[im, jn], count=1)
>>> A = np.ones((2, 2, 4, 4), np.float32); C = np.zeros((2, 2, 4, 4), np.float32)
>>> sorted({c.array for c in check(mm, (A, A, C), nthreads=2)})
['C']
>>> check(mm, (A, A, C), "aBC|@schedule(dynamic,1)", nthreads=2)
[]
"""
import itertools
import re
from dataclasses import dataclass

import numpy as np

from .bind import bound_trees
from .schedule import THREAD_VARS, Schedule
from .signature import signature
from .spec import LETTERS, SpecError, parse
from .trace import Affine

LISTED = 1 << 22            # loops up to this many iterations have their values listed
BUDGET = 1 << 20            # iteration pairs the exhaustive part of the search may evaluate
_CHUNK = 1 << 16            # pairs per NumPy batch
_WINDOW = 4096              # largest window of index differences enumerated per loop
MODES = ("refuse", "warn", "allow")


class RaceError(SpecError):
    """A loop spec under which two iterations that may run at the same time touch the same block,
    one of them writing; ``conflicts`` holds each :class:`Conflict` found, ``fixes`` specs that the
    analysis accepts instead."""

    def __init__(self, message, conflicts=(), fixes=()):
        super().__init__(message)
        self.conflicts, self.fixes = list(conflicts), list(fixes)


class RaceWarning(UserWarning):
    """``races="warn"``: the spec races (the message says where) but runs as written."""


@dataclass(frozen=True)
class Access:
    """One operand of one kernel call: the block of argument ``arg`` it covers."""

    arg: int
    write: bool
    box: tuple          # per axis of the argument: (start Affine, extent, step)
    path: tuple         # (Compare, outcome) conditions that lead to the call
    text: str           # the call, as traced
    operand: str
    where: str          # "body", "init" or "fini"


@dataclass
class Conflict:
    """Two accesses to ``array`` from iterations that may overlap in time."""

    array: str
    first: Access
    second: Access
    at_first: dict      # loop index name -> value (or {"thread": t} for a hook)
    at_second: dict
    why: str

    def __str__(self):
        what = "writes" if self.first.write else "reads"
        other = "writes" if self.second.write else "reads"
        return (f"{_place(self.first, self.at_first)} {what} a block of {self.array} that "
                f"{_place(self.second, self.at_second)} {other} ({self.first.operand} of {self.first.text}; "
                f"{self.second.operand} of {self.second.text}); {self.why}")


class Undecided(Conflict):
    """A pair the bounded search could neither clear nor confirm (``why`` says what bound it hit)."""

    def __str__(self):
        return (f"{self.first.text} and {self.second.text} may touch the same block of {self.array} from "
                f"iterations that run at the same time, and the analysis could not rule it out ({self.why})")


def _place(acc, at):
    if acc.where != "body":
        return f"the {acc.where} hook on thread {at.get('thread', '?')}"
    shown = ", ".join(f"{k}={v}" for k, v in at.items() if k != "thread")
    return f"iteration ({shown}){' on thread ' + str(at['thread']) if 'thread' in at else ''}"


# -- entry points --------------------------------------------------------------------------------

def check(lk, arrays, spec=None, nthreads=None):
    """The races of loop kernel ``lk`` on ``arrays`` under ``spec`` (text; default ``lk``'s own) on
    ``nthreads`` threads (default: its pool's); ``[]`` when the spec is race-free.

    Traces the body (no kernel runs); a spec that does not parse raises :class:`SpecError`.

    >>> import numpy as np, tppasm as tpp
    >>> from loops import Loop, kernel
    >>> relu = tpp.relu(4, 4)
    >>> @kernel("AB", Loop(0, 3), Loop(0, 2))
    ... def k(i, j, X, Y):
    ...     relu(X[i], Y[i])                  # every j writes the same Y[i]
    >>> X = np.ones((3, 4, 4), np.float32)
    >>> print(check(k, (X, X.copy()), nthreads=2)[0])       # doctest: +ELLIPSIS
    iteration (i=1, j=0) on thread 0 writes a block of Y that iteration (i=1, j=1) on thread 1 writes ...
    >>> check(k, (X, X.copy()), "Ab", nthreads=2)
    []
    """
    if not all(hasattr(lk, a) for a in ("spec", "loops", "body", "hooks", "index_names", "array_names")):
        raise TypeError(f"check(lk, ...): lk={lk!r}; pass a loop kernel (what @loops.kernel(...) returns)")
    if spec is not None and not isinstance(spec, str):
        raise TypeError(f"check(..., spec={spec!r}): pass a loop spec string such as 'aBC', or None for the "
                        "kernel's own")
    spec = lk.spec if spec is None else parse(spec, len(lk.loops))
    loops = spec.resolve(lk.loops)
    if nthreads is None:
        nthreads = lk.pool.nthreads if spec.mode != "serial" else 1
    if not isinstance(nthreads, int) or isinstance(nthreads, bool) or nthreads < 1:
        raise TypeError(f"check(..., nthreads={nthreads!r}): pass a thread count >= 1, or None for the pool's")
    lk._check_count(arrays)
    signature(arrays)                           # TypeError unless NumPy arrays
    body, init, fini = bound_trees(lk, spec, loops, arrays, nthreads)
    return analyze(spec, loops, nthreads, arrays, lk.index_names, lk.array_names, body, init, fini)


def analyze(spec, loops, nthreads, arrays, index_names, array_names, body, init, fini, first_only=False):
    """:func:`check` on already traced and simplified trees (the decorator's bind path)."""
    if spec.mode == "serial" or nthreads < 2:
        return []
    sched = Schedule(spec, loops, nthreads)
    if sched.active < 2:
        return []
    if any(lp.trip == 0 for lp in loops):
        body = None                                  # the body never runs; hooks still do
    accesses = []
    for tree, where in ((body, "body"), (init, "init"), (fini, "fini")):
        if tree is not None:
            accesses += _accesses(tree, where)
    names = dict(zip(LETTERS, index_names))
    found = []
    for group in _alias_groups(arrays):
        mine = [a for a in accesses if a.arg in group]
        if not any(a.write for a in mine):
            continue
        if len(group) > 1:
            mine = [_flat_access(a, arrays) if not _same_layout(arrays, group) else a for a in mine]
        label = "/".join(array_names[g] for g in sorted(group))
        for i, first in enumerate(mine):
            for second in mine[i:]:
                if first.write or second.write:
                    hit = _pair(sched, first, second, names, label)
                    if hit is not None:
                        found.append(hit)
                        if first_only:
                            return found
    return _distinct(found)


def _distinct(found):
    seen, out = set(), []
    for c in found:
        key = (c.array, c.first.text, c.first.operand, c.second.text, c.second.operand)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _accesses(tree, where):
    out = []
    for call in tree.all_calls():
        for spec, (arg, _), box in zip(call.kernel.operands, call.args, call.boxes):
            out.append(Access(arg, spec.writable, box, call.path, call.text, spec.name, where))
    return out


# -- arrays that share memory --------------------------------------------------------------------

def _alias_groups(arrays):
    """Argument indices grouped by shared memory; identical arrays (same pointer, shape, strides)
    are one argument."""
    parent = list(range(len(arrays)))

    def root(i):
        while parent[i] != i:
            i = parent[i]
        return i
    for i, j in itertools.combinations(range(len(arrays)), 2):
        a, b = arrays[i], arrays[j]
        if a.size and b.size and np.may_share_memory(a, b):
            parent[root(j)] = root(i)
    groups = {}
    for i in range(len(arrays)):
        groups.setdefault(root(i), set()).add(i)
    return list(groups.values())


def _same_layout(arrays, group):
    a0 = arrays[min(group)]
    return all(arrays[g].__array_interface__["data"][0] == a0.__array_interface__["data"][0]
               and arrays[g].shape == a0.shape and arrays[g].strides == a0.strides
               and arrays[g].dtype.itemsize == a0.dtype.itemsize for g in group)


def _flat_access(acc, arrays):
    """The access as one byte range of the shared buffer (a superset of its elements)."""
    a = arrays[acc.arg]
    base = a.__array_interface__["data"][0]
    start, extent = Affine.of(base), a.itemsize
    for (s, n, step), stride in zip(acc.box, a.strides):
        span = (n - 1) * step * stride
        start = start + s * stride + min(span, 0)
        extent += abs(span)
    return Access(acc.arg, acc.write, ((start, extent, 1),), acc.path, acc.text + " (as bytes of the shared "
                  "buffer)", acc.operand, acc.where)


# -- one pair of accesses --------------------------------------------------------------------------

def _loop_vars(expr):
    return {v for v in expr.vars() if v not in THREAD_VARS}


def _thread_vars(expr):
    return {v for v in expr.vars() if v in THREAD_VARS}


def ap_meet(s1, n1, d1, s2, n2, d2):
    """Whether ``{s1 + d1*t : 0 <= t < n1}`` and ``{s2 + d2*t : 0 <= t < n2}`` share a value
    (NumPy arrays broadcast; steps are positive ints).

    >>> ap_meet(np.array([0, 1]), 4, 2, 5, 3, 1).tolist(), ap_meet(0, 4, 2, 1, 3, 2).tolist()
    ([True, True], False)
    """
    s1, s2 = np.asarray(s1, np.int64), np.asarray(s2, np.int64)
    lo = np.maximum(s1, s2)
    hi = np.minimum(s1 + d1 * (n1 - 1), s2 + d2 * (n2 - 1))
    if d1 == 1 and d2 == 1:
        return lo <= hi
    g = int(np.gcd(d1, d2))
    ok = (lo <= hi) & ((s2 - s1) % g == 0)
    if d1 == d2:
        return ok
    # the common values form the progression x0 + lcm*t; x0 by the Chinese remainder theorem
    m1, m2 = d1 // g, d2 // g
    lcm = d1 * m2
    inv = pow(m1, -1, m2) if m2 > 1 else 0
    k = (((s2 - s1) // g) % m2) * inv % m2 if m2 > 1 else np.zeros_like(s1 - s2)
    x0 = s1 + d1 * k                                   # first value of AP1 that AP2's lattice holds
    first = x0 + -(-(lo - x0) // lcm) * lcm            # the first such value >= lo
    return ok & (first <= hi)


def _pair(sched, first, second, names, label):
    """A Conflict between ``first`` (at x) and ``second`` (at x'), or None when none can happen."""
    if first.where != "body" and second.where != "body":
        return _hooks_pair(sched, first, second, label)
    if first.where != "body":
        first, second = second, first                  # the body access goes first
    hook = second.where if second.where != "body" else None
    if hook == "fini" and sched.barriers:
        return None                                    # the last barrier precedes every fini hook
    loops = sched.loops
    L = len(loops)
    # loops too long to list take part in the proof only (their conditions are left out, which
    # can only add pairs); a search over them reports the pair as unproven
    ranges = [np.arange(lp.start, lp.end, lp.step, dtype=np.int64) if lp.trip <= LISTED else None for lp in loops]
    U = [np.ones(len(r), bool) if r is not None else None for r in ranges]   # x_k the first's path admits
    V = [np.ones(len(r), bool) if r is not None else None for r in ranges]   # x'_k the second's path admits
    window = [None] * L                                  # allowed x_k - x'_k (array) or None: any
    coupled, uses_threads = set(), False

    def unary(expr, side_masks, test):
        nonlocal coupled, uses_threads
        lv = _loop_vars(expr)
        if _thread_vars(expr):
            uses_threads = True
            coupled |= {LETTERS.index(v) for v in lv}
            return True
        if len(lv) == 1:
            k = LETTERS.index(next(iter(lv)))
            if ranges[k] is not None:
                side_masks[k] &= test({next(iter(lv)): ranges[k]})
            return True
        if not lv:
            return bool(np.all(test({})))
        coupled |= {LETTERS.index(v) for v in lv}
        return True

    for (test, outcome) in first.path:
        if not unary(test.expr, U, lambda env, t=test, o=outcome: t.holds(env) == o):
            return None
    if hook is None:
        for (test, outcome) in second.path:
            if not unary(test.expr, V, lambda env, t=test, o=outcome: t.holds(env) == o):
                return None
    axes = list(zip(first.box, second.box))
    for (s1, n1, d1), (s2, n2, d2) in axes:
        l1, l2 = _loop_vars(s1), _loop_vars(s2)
        t1, t2 = _thread_vars(s1), _thread_vars(s2)
        if t1 or t2:
            uses_threads = True
            if not l1 and not l2 and t1 == t2 == {"tid"} and s1.terms == s2.terms and \
                    _tid_window_zero(s1, n1, d1, s2, n2, d2, sched.T):
                return None                              # only equal thread ids overlap: never concurrent
            coupled |= {LETTERS.index(v) for v in l1 | l2}
            continue
        if not l1 and not l2:
            if not ap_meet(s1.const, n1, d1, s2.const, n2, d2):
                return None
            continue
        if len(l1) == 1 and not l2:
            k = LETTERS.index(next(iter(l1)))
            if ranges[k] is not None:
                U[k] &= ap_meet(s1.evaluate({next(iter(l1)): ranges[k]}), n1, d1, s2.const, n2, d2)
            continue
        if len(l2) == 1 and not l1:
            k = LETTERS.index(next(iter(l2)))
            if ranges[k] is not None:
                V[k] &= ap_meet(s1.const, n1, d1, s2.evaluate({next(iter(l2)): ranges[k]}), n2, d2)
            continue
        if len(l1) == 1 and l1 == l2:
            v = next(iter(l1))
            k = LETTERS.index(v)
            a1, a2 = dict(s1.terms)[v], dict(s2.terms)[v]
            if a1 == a2:
                w = _window(a1, s1.const, n1, d1, s2.const, n2, d2)
                if w is not None:
                    window[k] = w if window[k] is None else np.intersect1d(window[k], w)
                    if not len(window[k]):
                        return None
                    continue
        coupled |= {LETTERS.index(v) for v in l1 | l2}
    if any(m is not None and not m.any() for m in U + (V if hook is None else [])):
        return None
    return _search(sched, first, second, hook, ranges, U, V, window, coupled, uses_threads, names, label)


def _tid_window_zero(s1, n1, d1, s2, n2, d2, T):
    """True when the two blocks indexed by ``tid`` overlap only for equal thread ids."""
    c = dict(s1.terms)["tid"]
    return not any(ap_meet(s1.const + c * t1, n1, d1, s2.const + c * t2, n2, d2)
                   for t1 in range(T) for t2 in range(T) if t1 != t2)


def _window(a, c1, n1, d1, c2, n2, d2):
    """The differences ``x - x'`` for which ``a*x + c1 + d1*[0,n1)`` meets ``a*x' + c2 + d2*[0,n2)``;
    None when there are too many to list."""
    lo, hi = c2 - c1 - d1 * (n1 - 1), c2 - c1 + d2 * (n2 - 1)     # a*delta must lie in [lo, hi]
    if a < 0:
        a, lo, hi = -a, -hi, -lo
    first, last = -(-lo // a), hi // a
    if last - first > _WINDOW:
        return None
    deltas = np.arange(first, last + 1, dtype=np.int64)
    return deltas[ap_meet(c1 + a * deltas, n1, d1, c2, n2, d2)]


# -- the search ------------------------------------------------------------------------------------

def _search(sched, first, second, hook, ranges, U, V, window, coupled, uses_threads, names, label):
    L = len(ranges)
    role = set(sched.schedule_loops())
    if hook is None and not uses_threads:
        # proof without search: loops that decide the thread (or chunk) are equal in any overlapping pair
        equal = {k for k in range(L)
                 if (window[k] is not None and window[k].tolist() == [0])
                 or sched.in_prefix(k)
                 or (U[k] is not None and U[k].sum() == 1 and V[k].sum() == 1 and np.array_equal(U[k], V[k]))}
        if set(sched.pinned_when_equal()) <= equal:
            return None
    if any(r is None for r in ranges):
        return _undecided(first, second, label, f"a loop of more than {LISTED} iterations")
    joint = sorted(role | coupled)
    if not joint:
        return None                                      # nothing decides a thread: one thread runs all
    free = [k for k in range(L) if k not in joint]
    rep_x, rep_y = {}, {}
    for k in free:                                       # loops that decide nothing: any admitted pair
        pair = _some_pair(ranges[k], U[k], V[k] if hook is None else np.ones_like(U[k]), window[k])
        if pair is None:
            return None
        rep_x[k], rep_y[k] = pair
    xs, cands = [], []
    for k in joint:
        seg = sched.segment(k, ranges[k])
        exact = k in coupled or uses_threads
        mask_y = V[k] if hook is None else U[k]
        if hook is None and window[k] is not None:
            xs.append(ranges[k][U[k]])
            cands.append(("window", window[k]))
            continue
        # a loop absent from the overlap conditions: only its effect on threads and epochs matters
        if exact:
            pick = None
        elif not sched.has_parallel_level(k):
            pick = ("first",)                            # constant inside a segment
        elif sched.monotone(k):
            pick = ("first", "last")                     # the thread is monotone inside a segment
        else:
            pick = None
        xs.append(ranges[k][U[k]] if pick is None else _per_segment(ranges[k], U[k], seg, pick))
        cands.append(("values", ranges[k][mask_y] if pick is None else _per_segment(ranges[k], mask_y, seg, pick)))
    if hook is not None:
        return _search_hook(sched, first, second, hook, joint, [c[1] for c in cands], rep_x, names, label)
    dynamic = sched.mode == "collapse" and sched.kind == "dynamic"
    tpairs = [(t, u) for t in range(sched.T) for u in range(sched.T) if t != u] if dynamic and uses_threads else [None]
    sampled_x = [_sample(v, sched.boundary_values(k)) for v, k in zip(xs, joint)]
    sampled_c = [c if c[0] == "window" else ("values", _sample(c[1], sched.boundary_values(k)))
                 for c, k in zip(cands, joint)]
    for attempt_x, attempt_c, bounded in ((sampled_x, sampled_c, False), (xs, cands, True)):
        nx = int(np.prod([len(v) for v in attempt_x], dtype=float))
        ny = int(np.prod([len(c[1]) for c in attempt_c], dtype=float))
        if nx == 0 or ny == 0:
            return None
        if bounded and nx * ny * len(tpairs) > BUDGET:
            return _undecided(first, second, label, f"the search needs more than {BUDGET} iteration pairs")
        for x, y in _pairs(attempt_x, attempt_c, joint, ranges, V):
            full_x = {LETTERS[k]: x[i] for i, k in enumerate(joint)}
            full_y = {LETTERS[k]: y[i] for i, k in enumerate(joint)}
            n = len(x[0])
            for k in free:
                full_x[LETTERS[k]] = np.full(n, rep_x[k], np.int64)
                full_y[LETTERS[k]] = np.full(n, rep_y[k], np.int64)
            for tp in tpairs:
                ok = _holds(sched, first, second, full_x, full_y, tp)
                if ok.any():
                    j = int(np.argmax(ok))
                    return _conflict(sched, first, second, full_x, full_y, j, tp, names, label)
    return None


def _sample(values, extra, edge=2):
    """A few of ``values`` (sorted): the first and last ``edge`` and those in ``extra``."""
    if len(values) <= 2 * edge + len(extra):
        return values
    return np.unique(np.concatenate([values[:edge], values[-edge:], values[np.isin(values, extra)]]))


def _some_pair(values, mx, my, window):
    xs, ys = values[mx], values[my]
    if not len(xs) or not len(ys):
        return None
    if window is None:
        return int(xs[0]), int(ys[0])
    for d in window:
        hit = np.isin(xs - d, ys)
        if hit.any():
            x = int(xs[np.argmax(hit)])
            return x, x - int(d)
    return None


def _per_segment(values, mask, seg, which):
    """The first and/or last admitted value of each segment."""
    vals, keys = values[mask], seg[mask]
    if not len(vals):
        return vals
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    ends = np.r_[starts[1:], len(vals)] - 1
    picks = []
    if "first" in which:
        picks.append(vals[starts])
    if "last" in which:
        picks.append(vals[ends])
    return np.unique(np.concatenate(picks))


def _pairs(xs, cands, joint, ranges, V):
    """Batches of (x values per joint loop, x' values per joint loop), candidates expanded."""
    grids_x = [np.asarray(v) for v in xs]
    fixed = [c for c in cands]
    nx = int(np.prod([len(v) for v in grids_x]))
    ny_each = [len(c[1]) for c in fixed]
    per_x = int(np.prod(ny_each))
    step = max(1, _CHUNK // max(per_x, 1))
    lookups = []
    for k in joint:
        r = ranges[k]
        lookups.append((r[0] if len(r) else 0, (r[1] - r[0]) if len(r) > 1 else 1, V[k]))
    for start in range(0, nx, step):
        flat = np.arange(start, min(nx, start + step), dtype=np.int64)
        idx = np.unravel_index(flat, [len(v) for v in grids_x])
        x = [g[i] for g, i in zip(grids_x, idx)]
        rep = np.repeat(np.arange(len(flat)), per_x)
        cidx = np.unravel_index(np.tile(np.arange(per_x), len(flat)), ny_each)
        X = [v[rep] for v in x]
        Y, keep = [], np.ones(len(rep), bool)
        for i, (kind, vals) in enumerate(fixed):
            if kind == "window":
                y = X[i] - vals[cidx[i]]
                lo, st, mask = lookups[i]
                pos = (y - lo) // st
                ok = ((y - lo) % st == 0) & (pos >= 0) & (pos < len(mask))
                ok[ok] = mask[pos[ok]]
                keep &= ok
                Y.append(y)
            else:
                Y.append(vals[cidx[i]])
        if keep.any():
            yield [v[keep] for v in X], [v[keep] for v in Y]


def _holds(sched, first, second, x, y, tp):
    """Which pairs overlap on every axis, follow both paths, share an epoch and may run together."""
    tx = _tvars(sched, x, tp[0] if tp else None)
    ty = _tvars(sched, y, tp[1] if tp else None)
    ex, ey = dict(x, **tx), dict(y, **ty)
    ok = np.ones(len(next(iter(x.values()))), bool)
    for test, outcome in first.path:
        ok &= test.holds(ex) == outcome
    for test, outcome in second.path:
        ok &= test.holds(ey) == outcome
    for (s1, n1, d1), (s2, n2, d2) in zip(first.box, second.box):
        ok &= ap_meet(s1.evaluate(ex), n1, d1, s2.evaluate(ey), n2, d2)
    for a, b in zip(sched.epoch(x), sched.epoch(y)):
        ok &= a == b
    if sched.mode == "collapse" and sched.kind == "dynamic":
        same = np.ones_like(ok)
        for a, b in zip(sched.chunk_key(x), sched.chunk_key(y)):
            same &= a == b
        ok &= ~same
    else:
        ok &= sched.thread(x) != sched.thread(y)
    return ok


def _tvars(sched, x, t):
    n = len(next(iter(x.values())))
    if sched.mode == "collapse" and sched.kind == "dynamic":
        t = 0 if t is None else t
        return sched.hook_tvars(np.full(n, t, np.int64))
    return sched.tvars(x)


def _search_hook(sched, body, hook_acc, hook, joint, values, rep, names, label):
    """A body access against an init/fini hook access of each active thread."""
    samples = [_sample(v, sched.boundary_values(k)) for v, k in zip(values, joint)]
    for attempt, bounded in ((samples, False), (values, True)):
        total = int(np.prod([len(v) for v in attempt], dtype=float)) * sched.active * sched.T
        if bounded and total > BUDGET:
            return _undecided(body, hook_acc, label, f"the search needs more than {BUDGET} iterations")
        hit = _scan_hook(sched, body, hook_acc, hook, joint, attempt, rep, names, label)
        if hit is not None:
            return hit
    return None


def _scan_hook(sched, body, hook_acc, hook, joint, values, rep, names, label):
    grids = np.meshgrid(*values, indexing="ij")
    x = {LETTERS[k]: g.ravel() for k, g in zip(joint, grids)}
    n = len(next(iter(x.values())))
    for k, v in rep.items():
        x[LETTERS[k]] = np.full(n, v, np.int64)
    first_epoch = sched.first_epoch()
    dynamic = sched.mode == "collapse" and sched.kind == "dynamic"
    for t in range(sched.active):
        for u in (range(sched.T) if dynamic else [None]):
            if u == t:
                continue
            tb = sched.hook_tvars(np.full(n, u, np.int64)) if dynamic else sched.tvars(x)
            th = sched.hook_tvars(np.full(n, t, np.int64))
            ex, eh = dict(x, **tb), th
            ok = np.ones(n, bool)
            for test, outcome in body.path:
                ok &= test.holds(ex) == outcome
            for test, outcome in hook_acc.path:
                ok &= test.holds(eh) == outcome
            for (s1, n1, d1), (s2, n2, d2) in zip(body.box, hook_acc.box):
                ok &= ap_meet(s1.evaluate(ex), n1, d1, s2.evaluate(eh), n2, d2)
            if hook == "init":
                for e, want in zip(sched.epoch(x), first_epoch):
                    ok &= e == want
            if not dynamic:
                ok &= tb["tid"] != t
            if ok.any():
                j = int(np.argmax(ok))
                at = {names[LETTERS[k]]: int(x[LETTERS[k]][j]) for k in range(len(sched.loops))}
                at["thread"] = int(tb["tid"][j])
                why = (f"the {hook} hook of thread {t} runs while other threads run the body"
                       + ("" if hook == "fini" else " (no barrier before it)"))
                return Conflict(label, body, hook_acc, at, {"thread": t}, why)
    return None


def _hooks_pair(sched, first, second, label):
    """init/fini accesses of two different threads."""
    if first.where != second.where and sched.barriers:
        return None
    T = sched.active
    for t in range(T):
        for u in range(T):
            if t == u:
                continue
            ex = sched.hook_tvars(np.array([t]))
            ey = sched.hook_tvars(np.array([u]))
            ok = np.ones(1, bool)
            for test, outcome in first.path:
                ok &= test.holds(ex) == outcome
            for test, outcome in second.path:
                ok &= test.holds(ey) == outcome
            for (s1, n1, d1), (s2, n2, d2) in zip(first.box, second.box):
                ok &= ap_meet(s1.evaluate(ex), n1, d1, s2.evaluate(ey), n2, d2)
            if ok.all():
                return Conflict(label, first, second, {"thread": t}, {"thread": u},
                                "hooks of different threads run at the same time; index per-thread blocks "
                                "with thread().tid")
    return None


def _conflict(sched, first, second, x, y, j, tp, names, label):
    L = len(sched.loops)
    at_x = {names[LETTERS[k]]: int(x[LETTERS[k]][j]) for k in range(L)}
    at_y = {names[LETTERS[k]]: int(y[LETTERS[k]][j]) for k in range(L)}
    one = lambda d: {k: v[j:j + 1] for k, v in d.items()}
    if sched.mode == "collapse" and sched.kind == "dynamic":
        if tp:
            at_x["thread"], at_y["thread"] = tp
        why = (f"under schedule(dynamic{',' + str(sched.chunk) if sched.chunk else ''}) they are in "
               f"different chunks, which two threads may take at once")
    else:
        at_x["thread"] = int(sched.thread(one(x))[0])
        at_y["thread"] = int(sched.thread(one(y))[0])
        how = {"grid": "the thread grid", "collapse": f"schedule(static{',' + str(sched.chunk) if sched.chunk else ''})"}
        why = f"{how[sched.mode]} puts them on different threads"
    why += (", and no barrier ('|') separates them" if not sched.barriers else
            ", and they lie between the same two barriers")
    return Conflict(label, first, second, at_x, at_y, why)


def _undecided(first, second, label, reason):
    return Undecided(label, first, second, {}, {}, reason)


# -- messages and fixes ----------------------------------------------------------------------------

def describe(spec, conflict, nthreads, fixes=()):
    """The RaceError message: the spec, the pair, the loops they differ in, why they overlap in
    time, and what to write instead."""
    if isinstance(conflict, Undecided):
        head = f"loop spec {spec.text!r} cannot be shown race-free on {nthreads} threads: {conflict}"
    else:
        differ = [name for name, v in conflict.at_first.items()
                  if name != "thread" and conflict.at_second.get(name, v) != v]
        roles = []
        for name in differ:
            k = list(conflict.at_first).index(name)
            letters = [spec.text[lv.pos] for lv in spec.levels if lv.loop == k]
            roles.append(f"{name} (loop {LETTERS[k]!r}, written {''.join(letters)!r})")
        head = (f"loop spec {spec.text!r} has a data race on {nthreads} threads: {conflict}"
                + (f"; the two iterations differ in {', '.join(roles)}" if roles else ""))
    if fixes:
        todo = "fix: write " + " or ".join(repr(f) for f in fixes) + " (checked race-free)"
    else:
        todo = ("fix: put '|' after the parallel loops, use a static schedule, or make the loop the two "
                "iterations differ in serial (lower case) and outermost")
    return (f"{head}\n  {todo}; or pass races='warn' (run anyway, with a warning) or races='allow' to kernel() "
            "when the kernels synchronize themselves")


def fixes(lk, arrays, conflict, nthreads, limit=3):
    """Specs near ``lk``'s that :func:`check` accepts: a barrier after the parallel loops, a static
    schedule, the loops the conflicting iterations differ in made serial (in place or outermost)."""
    spec = lk.spec
    differ = [k for k, name in enumerate(lk.index_names)
              if conflict.at_first.get(name) != conflict.at_second.get(name)]
    out = []
    for text in _candidates(spec, differ):
        if text in out or text == spec.text:
            continue
        try:
            if not check(lk, arrays, text, nthreads):
                out.append(text)
        except (SpecError, TypeError, ValueError, IndexError):
            continue
    out.sort(key=lambda t: not _parallel(t))                # fixes that keep threads busy first
    return out[:limit]


def _parallel(text):
    """True when ``text`` has an upper-case loop letter (grid axes and bounds aside)."""
    letters = re.sub(r"\{[^}]*\}|\[[^\]]*\]|@.*", "", text)
    return any(c.isupper() for c in letters)


def _candidates(spec, differ):
    text = spec.text
    at = text.find("@")
    body, tail = (text[:at], text[at:]) if at >= 0 else (text, "")
    starts = [lv.pos for lv in spec.levels] + [len(body)]
    tokens = [body[a:b] for a, b in zip(starts, starts[1:])]
    par = [i for i, lv in enumerate(spec.levels) if lv.parallel]
    if par:
        last = spec.run[1] if spec.mode == "collapse" else par[0]
        if not tokens[last].endswith("|"):
            with_barrier = list(tokens)
            with_barrier[last] += "|"
            yield "".join(with_barrier) + tail
    if tail.startswith("@schedule(dynamic"):
        yield body
        chunk = tail[len("@schedule(dynamic"):].rstrip(")")
        if chunk:
            yield body + "@schedule(static" + chunk + ")"
    for k in differ:
        mine = [i for i, lv in enumerate(spec.levels) if lv.loop == k]
        serial = [_serial_token(t) if i in mine else t for i, t in enumerate(tokens)]
        moved = [_serial_token(tokens[i]).replace("|", "") for i in mine] + \
                [t for i, t in enumerate(tokens) if i not in mine]
        for cand in (serial, moved):
            joined = "".join(cand)
            yield joined + (tail if _parallel(joined) else "")


def _serial_token(token):
    """A spec token (letter, bounds, grid, barrier) as a serial loop: lower case, off the grid."""
    brace = token.find("{")
    if brace >= 0:
        token = token[:brace] + token[token.index("}", brace) + 1:]
    return token[0].lower() + token[1:]
