"""How a loop kernel presents itself: a one-line ``repr`` and a notebook HTML view (its spec, its
loops, the nest as pseudo-code per thread, the kernels it calls and its last tuning as a table).

>>> from loops import Loop, kernel
>>> @kernel("ab", Loop(0, 4), Loop(0, 8, blocks=[4]))
... def k(i, j, X):
...     pass
>>> repr(k)
"<LoopKernel k(X) spec 'ab': i in Loop(0, 4), j in Loop(0, 8, blocks=[4]); 1 thread>"
"""
import html

from loops.trial import first_line
from tppasm.display import html_table, printable


def loop_text(lp):
    """``Loop(0, 8, blocks=[4])``: a loop as it is declared, defaults left out."""
    parts = [str(lp.start), str(lp.end)] + ([str(lp.step)] if lp.step != 1 else [])
    if lp.blocks:
        parts.append(f"blocks={list(lp.blocks)}")
    if not lp.parallel:
        parts.append("parallel=False")
    return f"Loop({', '.join(parts)})"


def _threads(lk):
    """``1 thread``, ``4 threads``; with a malformed TPPASM_NUM_THREADS (or OMP_NUM_THREADS) before
    the pool exists, ``? threads (TPPASM_NUM_THREADS='abc': expected ...)``: a repr must not raise
    (a call and explain() do)."""
    if lk.spec.mode == "serial":
        return "1 thread"
    try:
        n = lk.pool.nthreads
    except ValueError as e:           # the pool is created on first use, from the environment
        return f"? threads ({printable(first_line(e))})"
    return f"{n} thread{'s' if n != 1 else ''}"


def _name(lk):
    """The kernel's name for display: a body's ``__name__`` that is not a string gives its class's."""
    name = lk.__name__ if isinstance(lk.__name__, str) else type(lk.body).__name__
    return printable(name)


_PARTS = ("index_names", "loops", "spec", "array_names", "_tuned", "__name__")


def _half_built(lk):
    """The repr of a loop kernel whose construction has not finished (a debugger showing ``self``)."""
    if all(hasattr(lk, a) for a in _PARTS):
        return None
    return f"<LoopKernel (not built: {', '.join(sorted(vars(lk))) or 'no attributes'} set)>"


def loop_kernel_repr(lk):
    half = _half_built(lk)
    if half is not None:
        return half
    loops = ", ".join(f"{name} in {loop_text(lp)}" for name, lp in zip(lk.index_names, lk.loops))
    return (f"<LoopKernel {_name(lk)}({', '.join(lk.array_names)}) spec {lk.spec.text!r}: {loops}; "
            f"{_threads(lk)}{_tuned_text(lk)}>")


def _tuned_text(lk):
    """``; tuned: 'aB' for 1 shape(s) on 2 threads``: what calls run instead of the declared spec."""
    if not lk._tuned:
        return ""
    specs = sorted(set(lk._tuned.values()))
    shapes = len({sig for sig, _ in lk._tuned})
    threads = sorted({n for _, n in lk._tuned})
    on = " and ".join(map(str, threads))
    return (f"; tuned: {', '.join(map(repr, specs))} for {shapes} shape(s) on {on} "
            f"thread{'s' if threads != [1] else ''}")


def tuning_rows(lk):
    """(spec, milliseconds or "", note) per candidate of the last :meth:`tune`, fastest first (the
    spec chosen noted "chosen": the fastest may lose to the kernel's own spec by the margin)."""
    results = getattr(lk, "last_tuning", None) or []
    timed = sorted((r for r in results if r[1] is not None), key=lambda r: r[1])
    rest = [r for r in results if r[1] is None]
    return [(s, f"{t * 1e3:.3f}" if t is not None else "", note) for s, t, note in timed + rest]


def loop_kernel_html(lk):
    half = _half_built(lk)
    if half is not None:
        return f"<div>{html.escape(half)}</div>"
    loops = [(name, lp.start, lp.end, lp.step, list(lp.blocks) or "", "yes" if lp.parallel else "no")
             for name, lp in zip(lk.index_names, lk.loops)]
    shown = lk.shown()                # the tuned variant the last call ran, if it ran one
    try:
        nest = shown.explain()
    except Exception as e:            # a body that cannot be traced without arrays: say why
        nest = f"(no pseudo-code: {e})"
    ran = ("" if shown is lk else f" (the last call ran the tuned spec <code>{html.escape(shown.spec.text)}</code>"
           f", {shown.spec.mode}, {html.escape(_threads(shown))}: shown below)")
    parts = [f"<div><b>{html.escape(_name(lk))}</b>({html.escape(', '.join(lk.array_names))}) "
             f"&mdash; spec <code>{html.escape(lk.spec.text)}</code>, {lk.spec.mode}, {html.escape(_threads(lk))}{ran}",
             html_table(loops, ("index", "start", "end", "step", "blocks", "parallel")),
             "<details open><summary>nest (pseudo-code per thread)</summary>"
             f"<pre>{html.escape(nest)}</pre></details>"]
    inst = shown._last
    if inst is not None:
        parts.append(html_table([(repr(k),) for k in inst.kernels], ("kernels called",)))
    rows = tuning_rows(lk)
    if rows:
        parts.append("<details open><summary>last tuning (fastest first; calls run the one noted chosen)</summary>"
                     + html_table(rows, ("spec", "ms", "note")) + "</details>")
    return "".join(parts) + "</div>"
