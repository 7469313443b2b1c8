"""The race analysis of one pair of accesses to one array (:mod:`loops.races` drives it).

``first`` at iteration ``x`` and ``second`` at ``x'`` conflict when their blocks meet on every
axis of the array, both ``if`` paths hold, no barrier separates them (same epoch) and they may run
at the same time (:mod:`loops.schedule`). Per axis, the overlap of ``a*x_k + c + d*[0, n)`` and
``a*x'_k + c' + d'*[0, n')`` is a window of differences ``x_k - x'_k`` (:func:`difference_window`), a
condition on one side only (a mask over the loop's values), or couples several loops (then
searched exactly). Loops that decide no thread, chunk or epoch only need one admitted pair; the
rest are searched with NumPy, first on a sample near the thread boundaries, then exhaustively
within :data:`BUDGET` pairs, every candidate checked exactly (:func:`holds`).

>>> difference_window(1, 0, 2, 1, 1, 2, 1).tolist()        # X[i:i+2] against X[i'+1:i'+3]: x - x' in {0, 1, 2}
[0, 1, 2]
"""
import math
from dataclasses import dataclass

import numpy as np

from .schedule import THREAD_VARS
from .spec import LETTERS

LISTED = 1 << 22            # loops up to this many iterations have their values listed
BUDGET = 1 << 20            # iteration pairs the exhaustive part of the search may evaluate
_CHUNK = 1 << 16            # pairs per NumPy batch
_WINDOW = 4096              # largest window of index differences enumerated per loop


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



# -- one pair of accesses --------------------------------------------------------------------------

def _loop_vars(expr):
    return {v for v in expr.vars() if v not in THREAD_VARS}


def _thread_vars(expr):
    return {v for v in expr.vars() if v in THREAD_VARS}


def ap_meet(s1, n1, d1, s2, n2, d2):
    """Whether ``{s1 + d1*t : 0 <= t < n1}`` and ``{s2 + d2*t : 0 <= t < n2}`` share a value
    (NumPy arrays broadcast; steps are positive ints).

    >>> ap_meet(np.array([0, 1]), 4, 2, 5, 3, 1).tolist(), ap_meet(0, 4, 2, 1, 3, 2)
    ([True, True], False)
    """
    scalar = isinstance(s1, int) and isinstance(s2, int)   # plain ints: no NumPy (most calls; ~10x faster)
    if not scalar:
        s1, s2 = np.asarray(s1, np.int64), np.asarray(s2, np.int64)
    lo = max(s1, s2) if scalar else np.maximum(s1, s2)
    hi = (min if scalar else np.minimum)(s1 + d1 * (n1 - 1), s2 + d2 * (n2 - 1))
    if d1 == 1 and d2 == 1:
        return lo <= hi
    g = math.gcd(d1, d2)
    ok = (lo <= hi) & ((s2 - s1) % g == 0)
    if d1 == d2:
        return ok
    # the common values form the progression x0 + lcm*t; x0 by the Chinese remainder theorem
    m1, m2 = d1 // g, d2 // g
    lcm = d1 * m2
    inv = pow(m1, -1, m2) if m2 > 1 else 0
    k = (((s2 - s1) // g) % m2) * inv % m2 if m2 > 1 else 0 * (s1 - s2)
    x0 = s1 + d1 * k                                   # first value of AP1 that AP2's lattice holds
    first = x0 + -(-(lo - x0) // lcm) * lcm            # the first such value >= lo
    return ok & (first <= hi)


def apart(sched, first, second):
    """Whether the blocks of ``first`` and ``second`` lie apart on some axis whatever the loops'
    and threads' values (their ranges over all of them do not meet), so they never share an
    element: per-thread scratch rows (``S[2 * tid]``) beside rows indexed by a loop (``S[8 + j]``)
    in one array, which the search would otherwise have to walk pair by pair."""
    box = {LETTERS[k]: tuple(sorted((lp.start, lp.start + (lp.trip - 1) * lp.step)))
           for k, lp in enumerate(sched.loops) if lp.trip}
    rows, cols, layers = sched.grid
    box.update(tid=(0, max(sched.T, sched.active) - 1), row=(0, rows - 1), col=(0, cols - 1), layer=(0, layers - 1))
    for (s1, n1, d1), (s2, n2, d2) in zip(first.box, second.box):
        if n1 < 1 or n2 < 1:
            return True                                  # an empty block
        if not (s1.vars() | s2.vars()) <= box.keys():
            continue
        (lo1, hi1), (lo2, hi2) = s1.bounds(box), s2.bounds(box)
        span1, span2 = (n1 - 1) * d1, (n2 - 1) * d2
        if hi1 + max(span1, 0) < lo2 + min(span2, 0) or hi2 + max(span2, 0) < lo1 + min(span1, 0):
            return True
    return False


def pair(sched, first, second, names, label):
    """A :class:`Conflict` between ``first`` (at x) and ``second`` (at x'), an :class:`Undecided` when
    the bounded search cannot tell, or None when they never run at the same time on a shared block."""
    if apart(sched, first, second):
        return None
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
    # a longer loop is listed only at the few values an '==' or a constant block pins it to on both sides
    ranges = [np.arange(lp.start, lp.end, lp.step, dtype=np.int64) if lp.trip <= LISTED else
              _pinned_range(k, lp, first, second, hook) for k, lp in enumerate(loops)]
    sparse = {k for k, lp in enumerate(loops) if lp.trip > LISTED and ranges[k] is not None}
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
                w = difference_window(a1, s1.const, n1, d1, s2.const, n2, d2)
                if w is not None:
                    window[k] = w if window[k] is None else np.intersect1d(window[k], w)
                    if not len(window[k]):
                        return None
                    continue
        coupled |= {LETTERS.index(v) for v in l1 | l2}
    if any(m is not None and not m.any() for m in U + (V if hook is None else [])):
        return None
    for k in sparse:
        window[k] = None                                 # a pinned range is no progression: match values
    return _search(sched, first, second, hook, ranges, U, V, window, coupled, uses_threads, names, label)


def _pinned_range(k, lp, first, second, hook):
    """The values of the long loop ``k`` that a conflicting pair can have (sorted), when each side's
    path (``i == c``) or block (``X[i]`` against a constant ``X[5]``) pins it to a few; else None.
    Any value outside both sides' pinned sets fails a path or a block, so the search stays exact."""
    v = LETTERS[k]
    mine = _pinned_values(v, first, second)
    theirs = _pinned_values(v, second, first) if hook is None else np.empty(0, np.int64)
    if mine is None or theirs is None:
        return None
    vals = np.union1d(mine, theirs)
    return vals[(vals >= lp.start) & (vals < lp.end) & ((vals - lp.start) % lp.step == 0)]


def _pinned_values(v, acc, other):
    """The values of loop ``v`` that ``acc``'s path and blocks (against ``other``'s) admit, when an
    equality or a constant block pins them to at most :data:`_WINDOW`; None when nothing does."""
    found = None
    for test, outcome in acc.path:
        e = test.expr
        if e.vars() != {v} or (test.op == "==") != outcome or test.op not in ("==", "!="):
            continue
        a = dict(e.terms)[v]
        vals = np.array([-e.const // a] if e.const % a == 0 else [], np.int64)
        found = vals if found is None else np.intersect1d(found, vals)
    for (s1, n1, d1), (s2, n2, d2) in zip(acc.box, other.box):
        if s1.vars() != {v} or s2.vars():
            continue
        vals = difference_window(dict(s1.terms)[v], s1.const, n1, d1, s2.const, n2, d2)
        if vals is not None:
            found = vals if found is None else np.intersect1d(found, vals)
    return found


def _unlisted(sched, first, second, hook, found, coupled, uses_threads, names, label):
    """A long loop nothing pins: look for a real conflict among a sample of its values (found pairs
    are checked exactly), else report the pair as unproven, saying what would make it provable."""
    ranges, U, V, window = (list(f) for f in found)
    long = [k for k, r in enumerate(ranges) if r is None]
    sample = list(ranges)
    for k in long:
        lp = sched.loops[k]
        edge = lp.start + lp.step * np.arange(4, dtype=np.int64)          # the trip is over LISTED
        tail = lp.start + lp.step * (lp.trip - 1 - np.arange(4, dtype=np.int64))
        pins = [p for p in (_pinned_values(LETTERS[k], first, second), _pinned_values(LETTERS[k], second, first))
                if p is not None]
        inside = [p[(p >= lp.start) & (p < lp.end) & ((p - lp.start) % lp.step == 0)] for p in pins]
        sample[k] = np.unique(np.concatenate([edge, tail, sched.boundary_values(k)] + inside))
        U[k], V[k], window[k] = np.ones(len(sample[k]), bool), np.ones(len(sample[k]), bool), None
    found = _search(sched, first, second, hook, sample, U, V, window, coupled | set(long), uses_threads,
                    names, label)                         # every sampled value is tried (the masks are not exact)
    if found is not None and not isinstance(found, Undecided):
        return found
    loop = names[LETTERS[long[0]]]
    trip = sched.loops[long[0]].trip
    out = _undecided(first, second, label, f"loop {loop} has {trip} iterations, more than the {LISTED} the "
                     f"search lists, and neither call pins {loop} to a few values")
    out.advice = (f"guard the calls with 'if {loop} == <value>:' or index the blocks by {loop} (e.g. X[{loop}]) "
                  f"so that the analysis needs no list of {loop}'s values, or split the loop into loops of at "
                  f"most {LISTED} iterations")
    return out


def _tid_window_zero(s1, n1, d1, s2, n2, d2, T):
    """True when the two blocks indexed by ``tid`` overlap only for equal thread ids. Whether the
    blocks of ``t1`` and ``t2`` meet depends only on ``t1 - t2`` (both start ``c*t2`` further), so
    the ``2T-2`` nonzero differences stand for the ``T*(T-1)`` pairs."""
    c = dict(s1.terms)["tid"]
    return not any(ap_meet(s1.const + c * delta, n1, d1, s2.const, n2, d2) for delta in range(1 - T, T) if delta)


def difference_window(a, c1, n1, d1, c2, n2, d2):
    """The differences ``x - x'`` for which ``a*x + c1 + d1*[0,n1)`` meets ``a*x' + c2 + d2*[0,n2)``;
    None when there are too many to list."""
    lo, hi = c2 - c1 - d1 * (n1 - 1), c2 - c1 + d2 * (n2 - 1)     # a*delta must lie in [lo, hi]
    if a > 0:
        first, last = -(-lo // a), hi // a
    else:
        first, last = -(-hi // a), lo // a
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
        return _unlisted(sched, first, second, hook, (ranges, U, V, window), coupled, uses_threads, names, label)
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
                ok = holds(sched, first, second, full_x, full_y, tp)
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


def meet(first, ex, second, ey, n):
    """Where ``first`` at the values ``ex`` (var -> array) and ``second`` at ``ey`` both follow their
    paths and their blocks share an element (a bool array of ``n``)."""
    ok = np.ones(n, bool)
    for test, outcome in first.path:
        ok &= test.holds(ex) == outcome
    for test, outcome in second.path:
        ok &= test.holds(ey) == outcome
    for (s1, n1, d1), (s2, n2, d2) in zip(first.box, second.box):
        ok &= ap_meet(s1.evaluate(ex), n1, d1, s2.evaluate(ey), n2, d2)
    return ok


def holds(sched, first, second, x, y, tp):
    """Which pairs overlap on every axis, follow both paths, share an epoch and may run together."""
    tx = _tvars(sched, x, tp[0] if tp else None)
    ty = _tvars(sched, y, tp[1] if tp else None)
    ok = meet(first, dict(x, **tx), second, dict(y, **ty), len(next(iter(x.values()))))
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
            ok = meet(body, dict(x, **tb), hook_acc, th, n)
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
            if meet(first, sched.hook_tvars(np.array([t])), second, sched.hook_tvars(np.array([u])), 1).all():
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
        chunk = f",{sched.chunk}" if sched.chunk else ""
        how = {"grid": "the thread grid", "collapse": f"schedule(static{chunk})"}
        why = f"{how[sched.mode]} puts them on different threads"
    why += (", and no barrier ('|') separates them" if not sched.barriers else
            ", and they lie between the same two barriers")
    return Conflict(label, first, second, at_x, at_y, why)


def _undecided(first, second, label, reason):
    return Undecided(label, first, second, {}, {}, reason)
