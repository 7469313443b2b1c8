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

from tppasm.display import html_table


def loop_text(lp):
    """``Loop(0, 8, blocks=[4])``: a loop as it is declared, defaults left out."""
    parts = [str(lp.start), str(lp.end)] + ([str(lp.step)] if lp.step != 1 else [])
    if lp.blocks:
        parts.append(f"blocks={list(lp.blocks)}")
    if not lp.parallel:
        parts.append("parallel=False")
    return f"Loop({', '.join(parts)})"


def _threads(lk):
    if lk.spec.mode == "serial":
        return 1
    return lk.pool.nthreads


def loop_kernel_repr(lk):
    loops = ", ".join(f"{name} in {loop_text(lp)}" for name, lp in zip(lk.index_names, lk.loops))
    n = _threads(lk)
    tuned = sorted(set(lk._tuned.values()))
    tuned = f"; tuned: {', '.join(map(repr, tuned))} for {len(lk._tuned)} shape(s)" if tuned else ""
    return (f"<LoopKernel {lk.__name__}({', '.join(lk.array_names)}) spec {lk.spec.text!r}: {loops}; "
            f"{n} thread{'s' if n != 1 else ''}{tuned}>")


def tuning_rows(lk):
    """(spec, milliseconds or "", note) per candidate of the last :meth:`tune`, fastest first."""
    results = getattr(lk, "last_tuning", None) or []
    timed = sorted((r for r in results if r[1] is not None), key=lambda r: r[1])
    rest = [r for r in results if r[1] is None]
    return [(s, f"{t * 1e3:.3f}" if t is not None else "", note) for s, t, note in timed + rest]


def loop_kernel_html(lk):
    loops = [(name, lp.start, lp.end, lp.step, list(lp.blocks) or "", "yes" if lp.parallel else "no")
             for name, lp in zip(lk.index_names, lk.loops)]
    try:
        nest = lk.explain()
    except Exception as e:            # a body that cannot be traced without arrays: say why
        nest = f"(no pseudo-code: {e})"
    parts = [f"<div><b>{html.escape(lk.__name__)}</b>({html.escape(', '.join(lk.array_names))}) "
             f"&mdash; spec <code>{html.escape(lk.spec.text)}</code>, {lk.spec.mode}, {_threads(lk)} thread(s)",
             html_table(loops, ("index", "start", "end", "step", "blocks", "parallel")),
             "<details open><summary>nest (pseudo-code per thread)</summary>"
             f"<pre>{html.escape(nest)}</pre></details>"]
    inst = lk._last
    if inst is not None:
        parts.append(html_table([(repr(k),) for k in inst.kernels], ("kernels called",)))
    rows = tuning_rows(lk)
    if rows:
        parts.append("<details open><summary>last tuning (fastest first)</summary>"
                     + html_table(rows, ("spec", "ms", "note")) + "</details>")
    return "".join(parts) + "</div>"
