"""``LoopKernel.explain``: the nest of a loop kernel as pseudo-code, per thread: which loops each
thread runs, which share of a parallel loop it takes (static, dynamic, grid team), where the
barriers are, and the body's kernel calls.

>>> import numpy as np, tppasm as tpp
>>> from loops import Loop, kernel
>>> zero = tpp.zero(2, 2)
>>> k = kernel("A", Loop(0, 4))(lambda i, X: zero(X[i]))
>>> "zero(X[i])" in k.explain(np.ones((4, 2, 2), np.float32))
True
"""
import itertools


def explain(lk, inst):
    """Pseudo-code of the nest of ``lk`` (body from the bound instance ``inst`` when given)."""
    spec, loops = lk.spec, lk.resolved
    names, taken = {}, set(lk.index_names)
    for lv in spec.levels:          # a block's index: the loop's name and its level, unless the body has that name
        name = lk.index_names[lv.loop]
        if not lv.last:
            name = f"{name}{lv.occurrence}"
            while name in taken:
                name += "_"
            taken.add(name)
        names[lv.name] = name
    T = inst.nthreads if inst else (lk.pool.nthreads if spec.mode != "serial" else 1)
    threads = f"{T} thread{'s' if T != 1 else ''}"
    head = {"serial": "serial: runs on the calling thread only",
            "collapse": f"{threads}; the collapsed loop is split with schedule({spec.schedule[0]}"
                        f"{',' + str(spec.schedule[1]) if spec.schedule[1] else ''})",
            "grid": f"{threads} on a {spec.grid[0]} rows x {spec.grid[1]} cols x {spec.grid[2]} layers grid"}
    out = [f"# nest {spec.text!r}: {head[spec.mode]}", "def thread_body(tid):"]
    if spec.mode == "grid":
        r, c, l = spec.grid
        out.append(f"  layer, row, col = tid // {r * c}, tid % {r * c} // {c}, tid % {c}   "
                   f"# threads >= {r * c * l} idle")
    ind = "  "
    if inst and inst.init.all_calls() and list(inst.init.all_calls()):
        out.append(ind + "# init (once on each thread taking part)")
        out += [ind + line for line in inst.init.pretty().splitlines()]
    i = 0
    while i < len(spec.levels):
        lv = spec.levels[i]
        if spec.mode == "collapse" and i == spec.run[0]:
            members = spec.levels[spec.run[0]:spec.run[1] + 1]
            ranges = " x ".join(_range_text(m, loops, names) for m in members)
            out.append(f"{ind}for ({', '.join(names[m.name] for m in members)}) in share(tid, {ranges}):"
                       f"   # collapsed parallel{' then barrier' if members[-1].barrier else ''}")
            i = spec.run[1] + 1
        elif lv.axis:
            axis = {"R": "row", "C": "col", "L": "layer"}[lv.axis]
            out.append(f"{ind}for {names[lv.name]} in block({axis}, {lv.teams}, {_range_text(lv, loops, names)}):"
                       f"   # grid axis {lv.axis}{' then barrier' if lv.barrier else ''}")
            i += 1
        else:
            out.append(f"{ind}for {names[lv.name]} in {_range_text(lv, loops, names)}:"
                       f"{'   # then barrier' if lv.barrier else ''}")
            i += 1
        ind += "  "
    body = inst.body.pretty() if inst else f"{lk.__name__}({', '.join(lk.index_names)}, ...)"
    out += [ind + line for line in body.splitlines()] or [ind + "pass"]
    if inst and list(inst.fini.all_calls()):
        out.append("  # fini (once on each thread taking part)")
        out += ["  " + line for line in inst.fini.pretty().splitlines()]
    if spec.mode == "collapse":
        out.append("# share(tid, ...): " + {
            "static": "iterations [tid*N/T, (tid+1)*N/T) of the N collapsed ones" if not spec.schedule[1]
            else f"chunks of {spec.schedule[1]} iterations, round robin",
            "dynamic": f"chunks of {spec.schedule[1] or 1} iterations taken from a shared counter (lock xadd)"}
            [spec.schedule[0]])
    if spec.mode == "grid":
        out.append("# block(axis, n, range): the range cut into n contiguous chunks of ceil(len/n); chunk [axis]")
    out += _shares(spec, loops, names, T)
    return "\n".join(out)


def _shares(spec, loops, names, T):
    """Per-thread lines for parallel loops whose ranges do not depend on outer loops."""
    lines = []
    if spec.mode == "collapse":
        members = spec.levels[spec.run[0]:spec.run[1] + 1]
        if any(m.occurrence for m in members):
            return ["# (the collapsed ranges depend on outer blocks: shares vary per block)"]
        ranges = [range(loops[m.loop].start, loops[m.loop].end,
                        loops[m.loop].step if m.last else loops[m.loop].blocks[0]) for m in members]
        n = 1
        for r in ranges:
            n *= len(r)
        kind, chunk = spec.schedule
        vars_ = ", ".join(names[m.name] for m in members)
        for t in range(T):
            if kind == "dynamic":
                lines.append(f"# thread {t}: chunks of {chunk or 1} of the {n} iterations as it takes them")
                continue
            count, first = _static_share(t, T, n, chunk)
            pts = [_point(q, ranges) for q in first]
            shown = ", ".join(map(str, pts)) + (", ..." if count > len(pts) else "")
            lines.append(f"# thread {t}: {count} of {n} iterations ({vars_}) = {shown}")
    elif spec.mode == "grid":
        r, c, l = spec.grid
        for t in range(T):
            if t >= r * c * l:
                lines.append(f"# thread {t}: idle (outside the {r}x{c}x{l} grid)")
                continue
            coord = {"L": t // (r * c), "R": t % (r * c) // c, "C": t % c}
            parts = [f"row {coord['R']}, col {coord['C']}, layer {coord['L']}"]
            for lv in spec.levels:
                if lv.axis and lv.occurrence == 0:
                    lp = loops[lv.loop]
                    vals = range(lp.start, lp.end, lp.step if lv.last else lp.blocks[0])
                    size = -(-len(vals) // lv.teams)
                    mine = vals[coord[lv.axis] * size:(coord[lv.axis] + 1) * size]
                    parts.append(f"{names[lv.name]} in {list(mine) if len(mine) <= 6 else mine}")
            lines.append(f"# thread {t}: " + "; ".join(parts))
    return lines


def _static_share(t, T, n, chunk, shown=4):
    """(how many of the ``n`` collapsed iterations thread ``t`` of ``T`` runs under a static schedule
    with ``chunk`` (0: one contiguous share each), its first ``shown`` iteration numbers): counted,
    not listed, so a nest of 2**40 iterations is explained at once.

    >>> _static_share(1, 2, 10, 0), _static_share(1, 2, 10, 3), _static_share(0, 4, 10**12, 0)[0]
    ((5, [5, 6, 7, 8]), (4, [3, 4, 5, 9]), 250000000000)
    """
    if not chunk:
        quot, rem = divmod(n, T)
        start = t * quot + min(t, rem)
        return quot + (t < rem), list(range(start, start + quot + (t < rem))[:shown])
    chunks = -(-n // chunk)
    mine = range(t, chunks, T)                          # the chunks thread t takes, round robin
    count = len(mine) * chunk - (-n % chunk if chunks - 1 in mine else 0)   # the last chunk may be short
    qs = (q for c in mine for q in range(c * chunk, min(n, c * chunk + chunk)))
    return count, list(itertools.islice(qs, shown))


def _point(q, ranges):
    digits = []
    for r in reversed(ranges):
        q, d = divmod(q, len(r))
        digits.append(r[d])
    return tuple(reversed(digits))


def _range_text(lv, loops, names):
    lp = loops[lv.loop]
    stride = lp.step if lv.last else lp.blocks[lv.occurrence]
    if lv.occurrence == 0:
        return f"range({lp.start}, {lp.end}, {stride})"
    outer = [names[f"{lv.letter}{o}"] for o in range(lv.occurrence)]     # the enclosing blocks' starts
    ends = [f"{start} + {lp.blocks[o]}" for o, start in reversed(list(enumerate(outer)))]
    return f"range({outer[-1]}, min({', '.join(ends)}, {lp.end}), {stride})"

