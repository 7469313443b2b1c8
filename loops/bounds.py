"""Bind-time checks of a loop nest: every access of its body and hooks stays inside its array over
every iteration (:class:`BoundsError` otherwise, naming an iteration where it does not), and the
native nest's 64-bit offset and comparison arithmetic is exact.

>>> import numpy as np, tppasm as tpp
>>> from loops import Loop, kernel
>>> relu = tpp.relu(1, 4)
>>> k = kernel("a", Loop(0, 4))(lambda i, X: relu(X[i:i + 1], X[i:i + 1]))
>>> try:
...     k(np.zeros((3, 4), np.float32))
... except BoundsError as e:
...     print(str(e).split("; ")[-1])
fails at i=3
"""
import numpy as np

from .spec import LETTERS


INT64 = 1 << 63            # native nests compute offsets and comparisons in int64

class BoundsError(IndexError, ValueError):
    """An access in a loop body that reaches outside its array for some iteration, found when the
    nest is bound (its first call on arrays of these shapes), before any of it runs. The message
    names the access, the range it must stay in and an iteration where it does not. An IndexError
    (what NumPy raises for an index out of range) and a ValueError (a rejected shape).

    >>> import numpy as np, tppasm as tpp
    >>> from loops import BoundsError, Loop, kernel
    >>> relu = tpp.relu(1, 4)
    >>> k = kernel("a", Loop(0, 3))(lambda i, X, Y: relu(X[i + 1:i + 2], Y[i:i + 1]))
    >>> X = np.zeros((3, 4), np.float32)
    >>> try:
    ...     k(X, X.copy())
    ... except BoundsError as e:
    ...     print(str(e).split(";")[1])
     fails at i=2
    """


def check_calls(lk, arrays, body, init, fini, box):
    if any(lp.trip == 0 for lp in lk.resolved):
        body = None                           # the body never runs
    for tree in (body, init, fini):
        if tree is None:
            continue
        for call in tree.all_calls():
            _check_call(lk, call, arrays, box)


def _check_call(lk, call, arrays, box):
    count = dict(zip(call.kernel.scalars, call.scalars)).get(call.kernel.desc.count_scalar, 1)
    needs = list(call.checks)
    for spec, (arg, offset) in zip(call.kernel.operands, call.args):
        a = arrays[arg]
        if spec.writable and not a.flags.writeable:
            raise ValueError(f"{call.text}: {lk.array_names[arg]} is read-only but the kernel writes it; pass a "
                             "writable array")
        item = a.itemsize
        lo_el = sum(min(0, (d - 1) * s // item) for d, s in zip(a.shape, a.strides))
        hi_el = sum(max(0, (d - 1) * s // item) for d, s in zip(a.shape, a.strides))
        extent = sum((d - 1) * s for d, s in zip(spec.full_shape(count), spec.strides))
        if 0 in a.shape:
            lo_el, hi_el = 0, -1
        needs.append((offset, lo_el, hi_el - extent,
                      f"{call.text}: operand {spec.name} reaches outside {lk.array_names[arg]} {a.shape}"))
    for expr, lo, hi, message in needs:
        low, high = expr.bounds(box)
        if lo <= low and high <= hi:
            continue
        bad = _counterexample(expr, lo, hi, call.path, box, lk)
        if bad is not None:
            allowed = f">= {lo}" if hi >= 1 << 61 else f"in [{lo}, {hi}]"
            raise BoundsError(f"out of bounds: {message}: {expr} must be {allowed}; fails at {bad}")


def _counterexample(expr, lo, hi, path, box, lk):
    """An iteration where ``lo <= expr <= hi`` fails on the call's path, or None (exact when small)."""
    loop_vars = list(LETTERS[:len(lk.loops)])
    uses_thread = expr.vars() | {v for t, _ in path for v in t.expr.vars()}
    if np.prod([lp.trip for lp in lk.resolved], dtype=float) > 1 << 22 or uses_thread - set(loop_vars):
        return _describe(expr, box, lk)           # conservative: over the box of index values
    grids = np.meshgrid(*[np.arange(lp.start, lp.end, lp.step) for lp in lk.resolved], indexing="ij")
    env = dict(zip(loop_vars, (g.ravel() for g in grids)))
    if max([expr.magnitude(box)] + [t.expr.magnitude(box) for t, _ in path]) >= INT64:
        env = {v: g.astype(object) for v, g in env.items()}      # int64 would overflow: Python ints
    mask = np.ones(grids[0].size if grids else 1, bool)
    for test, outcome in path:
        mask &= test.holds(env) == outcome
    vals = np.broadcast_to(expr.evaluate(env), mask.shape)
    bad = mask & ((vals < lo) | (vals > hi))
    if not bad.any():
        return None
    j = int(np.argmax(bad))
    return ", ".join(f"{n}={int(env[v][j])}" for n, v in zip(lk.index_names, loop_vars))


def check_int64(lk, arrays, trees, box):
    """ValueError unless the native nest's 64-bit arithmetic is exact: each byte offset of a call and
    each compared expression, evaluated term by term over every iteration, stays within +-2**63."""
    names = dict(zip(LETTERS, lk.index_names))
    fix = ("shift the loop to start near 0 (Loop(0, n) with X[i] rather than Loop(b, b + n) with "
           "X[i - b]), or use smaller constants")
    if any(lp.trip == 0 for lp in lk.resolved):
        trees = trees[1:]                     # the body never runs (as in check_calls)
    tests = {}
    for tree in trees:
        for call in tree.all_calls():
            for test, _ in call.path:
                tests[test.key()] = test
            for (arg, offset), spec in zip(call.args, call.kernel.operands):
                item = arrays[arg].itemsize
                reach = (offset * item).magnitude(box)
                if reach >= INT64:
                    raise ValueError(f"{call.text}: the byte offset of operand {spec.name} in "
                                     f"{lk.array_names[arg]} ({item} * ({offset})) reaches {reach} over the "
                                     f"loops' ranges ({_ranges(offset, box, names)}); native nests compute "
                                     f"byte offsets in 64-bit integers, within +-2**63: {fix}")
    for test in tests.values():
        reach = test.expr.magnitude(box)
        if reach >= INT64:
            raise ValueError(f"'if {test!r}': the comparison reaches {reach} over the loops' ranges "
                             f"({_ranges(test.expr, box, names)}); native nests compare in 64-bit integers, "
                             f"within +-2**63: {fix}")


def _ranges(expr, box, names):
    return ", ".join(f"{names.get(v, v)} in [{box[v][0]}, {box[v][1]}]" for v in sorted(expr.vars())) or "constant"


def _describe(expr, box, lk):
    names = dict(zip(LETTERS, lk.index_names))
    return "some iteration (" + ", ".join(f"{names.get(v, v)} in [{box[v][0]}, {box[v][1]}]"
                                         for v in sorted(expr.vars())) + ")"
