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
search would exceed :data:`loops.race_search.BUDGET` pairs, the spec is refused as unproven (``races="allow"``
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

import numpy as np

from .bind import bound_trees, box_of, check_grid, traced_trees
from .race_fixes import candidates, parallel, reorders
from .race_search import Access, Conflict, Undecided, pair
from .schedule import Schedule
from .signature import signature
from .spec import LETTERS, SpecError, parse
from .affine import Affine

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
        if (len(group) > 1 and not _same_layout(arrays, group)) or any(_self_overlapping(arrays[g]) for g in group):
            mine = [_flat_access(a, arrays) for a in mine]
        label = "/".join(array_names[g] for g in sorted(group))
        coarse = _merged(mine)
        if len(coarse) < len(mine) and not _pairs(sched, coarse, names, label, True):
            continue                # the merged blocks (supersets) never meet, so neither do their parts
        found += _pairs(sched, mine, names, label, first_only)
        if found and first_only:
            return found
    return _distinct(found)


def _pairs(sched, accesses, names, label, first_only):
    """The conflicts among ``accesses`` (one array), every pair with a write."""
    found = []
    for i, first in enumerate(accesses):
        for second in accesses[i:]:
            if first.write or second.write:
                hit = pair(sched, first, second, names, label)
                if hit is not None:
                    found.append(hit)
                    if first_only:
                        return found
    return found


def _merged(accesses):
    """Accesses that differ only in their blocks' constant offsets and extents (``for j in
    range(6): gemm(..., C[i, j * 64:j * 64 + 64])``) or in their ``if`` paths as one access
    covering all their blocks under the conditions every path shares. A superset of each, so when
    no merged pair conflicts no original pair does; a body of many calls is then checked in a few
    pairs instead of every pair (MiniLM's layer: ~40 calls; k ifs in a row trace each later call
    on 2^k paths: 8 ifs in a 16 x 16 nest took 18 s to bind on 2 threads, 98,000 pairs)."""
    groups = {}
    for a in accesses:
        key = (a.arg, a.write, a.where, tuple(start.terms for start, _, _ in a.box))
        groups.setdefault(key, []).append(a)
    return [parts[0] if len(parts) == 1 else _cover(parts) for parts in groups.values()]


def _cover(parts):
    """One access whose block holds the blocks of ``parts`` (same variable terms on every axis)."""
    box = []
    for axis in zip(*(a.box for a in parts)):
        lo = min(start.const for start, _, _ in axis)
        hi = max(start.const + (n - 1) * d for start, n, d in axis)
        steps = {d for _, _, d in axis}
        d = steps.pop() if len(steps) == 1 else 1
        if any((start.const - lo) % d for start, _, _ in axis):
            d = 1
        start = axis[0][0]
        box.append((Affine(start.terms, lo, start.names), (hi - lo) // d + 1, d))
    first = parts[0]
    shared = set.intersection(*({(t.key(), o) for t, o in a.path} for a in parts))
    path = tuple((t, o) for t, o in first.path if (t.key(), o) in shared)
    return Access(first.arg, first.write, tuple(box), path, first.text + f" (and {len(parts) - 1} more)",
                  first.operand, first.where)


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


def _self_overlapping(a):
    """True unless ``a``'s strides keep its elements apart (an ``as_strided`` view can put two
    indices on one address: blocks that look apart per axis may share bytes).

    >>> X = np.zeros((4, 4), np.float32)
    >>> _self_overlapping(X[::-1, ::2]), _self_overlapping(np.lib.stride_tricks.as_strided(X, (3, 2), (4, 4)))
    (False, True)
    """
    span = a.itemsize
    for s, n in sorted((abs(s), n) for n, s in zip(a.shape, a.strides) if n > 1):
        if s < span:
            return True
        span += (n - 1) * s
    return False


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
        same = [repr(f) for f in fixes if not reorders(spec.text, f)]
        other = [repr(f) for f in fixes if reorders(spec.text, f)]
        todo = ", or ".join(([" or ".join(same) + " (checked race-free)"] if same else []) +
                            ([" or ".join(other) + " (checked race-free; serial order changes: sums may round "
                              "differently)"] if other else []))
        todo = "fix: write " + todo + (f"; or {conflict.advice}" if getattr(conflict, "advice", None) else "")
    elif getattr(conflict, "advice", None):
        todo = f"fix: {conflict.advice}"
    else:
        todo = ("fix: put '|' after the parallel loops, use a static schedule, or make the loop the two "
                "iterations differ in serial (lower case) and outermost")
    return (f"{head}\n  {todo}; or pass races='warn' (run anyway, with a warning) or races='allow' to kernel() "
            "when the kernels synchronize themselves")


def fixes(lk, arrays, conflict, nthreads, limit=3):
    """Specs near ``lk``'s that :func:`check` accepts: :func:`loops.race_fixes.candidates` (a barrier,
    a static schedule, a parallel level made serial, a loop made serial or moved outermost, those of
    the loops the conflicting iterations differ in first), then pairs of edits (of those loops) when
    no single one keeps a loop parallel. Parallel fixes come first, those that keep the serial order
    before those that change it, then one serial fix in the spec's order (every loop serial, at
    worst), which is named whenever no parallel fix keeps the order.

    >>> import numpy as np, tppasm as tpp
    >>> from loops import Loop, kernel
    >>> relu = tpp.relu(4, 4)
    >>> @kernel("BA", Loop(0, 3), Loop(0, 3), races="allow")
    ... def k(i, j, X, Y):
    ...     relu(X[i, j], Y[j])                 # every i writes Y[j]; 'BA' splits j = 1 between threads
    >>> X, Y = np.ones((3, 3, 4, 4), np.float32), np.ones((3, 4, 4), np.float32)
    >>> fixes(k, (X, Y), check(k, (X, Y), nthreads=2)[0], nthreads=2)     # 'aB' runs i outermost
    ['Ba', 'aB']
    """
    spec = lk.spec
    differ = [k for k, name in enumerate(lk.index_names)
              if conflict.at_first.get(name) != conflict.at_second.get(name)]
    others = [k for k in range(len(lk.index_names)) if k not in differ]

    def rank(text):
        return not parallel(text), reorders(spec.text, text)
    races_of, found = _checker(lk, arrays, nthreads), []
    for edits, loops in ((1, differ + others), (2, differ)):         # pairs: of the differing loops' edits
        for text in candidates(spec, loops, edits):
            if not parallel(text) and (reorders(spec.text, text) or any(not parallel(t) for t in found)):
                continue                # one serial fix is enough, in the spec's order (every loop serial works)
            if text not in found and races_of(text) == []:
                found.append(text)
                if sum(rank(t) == (False, False) for t in found) >= limit:
                    break
        if any(parallel(t) for t in found):
            break
    found.sort(key=rank)                                  # stable: the search's order among equals
    if found and rank(found[0]) == (False, False):
        found = [t for t in found if parallel(t)]         # a parallel fix computes what the serial one does
    out = found[:limit]
    same = [t for t in found if not reorders(spec.text, t)]
    if same and not set(same) & set(out):
        out[-1] = same[0]
    return out


def _checker(lk, arrays, nthreads):
    """``text -> conflicts`` (the first only; None when the spec is refused otherwise) of ``lk`` on
    ``arrays``, as :func:`check` finds them, tracing the body once for all texts."""
    traced = traced_trees(lk, arrays)

    def races_of(text):
        try:
            spec = parse(text, len(lk.loops))
            loops = spec.resolve(lk.loops)
            check_grid(spec, nthreads)
            body, init, fini = (t.simplify(box_of(loops, spec, nthreads)) for t in traced)
            return analyze(spec, loops, nthreads, arrays, lk.index_names, lk.array_names, body, init, fini,
                           first_only=True)
        except (SpecError, TypeError, ValueError, IndexError):
            return None
    return races_of


__all__ = ["RaceError", "RaceWarning", "Conflict", "Undecided", "MODES", "check", "analyze", "describe", "fixes"]
