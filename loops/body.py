"""What a loop body (or an init/fini hook) may be: a Python function whose parameters the nest
fills by position, the loop indices first, then the arrays.

>>> check_body(lambda i, X: None); parameters(lambda i, X: None)
['i', 'X']
"""
import functools
import inspect

_HOOK_RECEIVES = ("a hook receives no loop indices, only the nest's first arrays, by position, as many as it names "
                  "(or all of them with '*arrays'); write it as a def, e.g. 'def setup(X, Y): ...'")


def check_body(body, what="loop body"):
    """Refuse bodies whose call would not run the loop body: generators, coroutines, non-callables
    (``what``: "loop body", or "init hook"/"fini hook" for a hook, as the messages call it)."""
    fn = body
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not callable(fn):
        raise TypeError(f"a{'n' if what[0] in 'aeiou' else ''} {what} must be a function, not "
                        f"{type(body).__name__} {body!r}")
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else getattr(type(fn), "__call__", fn)
    for test, kind in ((inspect.isgeneratorfunction, "a generator function (it has 'yield')"),
                       (inspect.iscoroutinefunction, "an 'async def' coroutine function"),
                       (inspect.isasyncgenfunction, "an async generator function")):
        if test(fn) or test(target):
            raise TypeError(f"{what} {getattr(body, '__name__', type(body).__name__)!r} is {kind}: calling it "
                            f"runs nothing; write the {what.split()[-1]} as a plain 'def' that calls the kernels "
                            "directly (no yield, async or await)")


def parameters(body, varargs=False, what="loop body"):
    """The names of ``body``'s parameters, which the nest fills by position (loop indices, then
    arrays); TypeError unless ``body`` is a Python function (a ``def``, lambda, method, partial or
    object with a Python ``__call__``) whose parameters can all be passed so. ``varargs``: a
    ``*args`` parameter is allowed (hooks take "as many arrays as they name"); it ends the names.
    ``what``: how messages call ``body`` ("loop body", "init hook", "fini hook").

    >>> parameters(lambda i, X, Y: None)
    ['i', 'X', 'Y']
    """
    fn = body
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(body, "__name__", type(body).__name__)
    call = getattr(type(fn), "__call__", None)
    python = (inspect.isfunction(fn) or (inspect.ismethod(fn) and inspect.isfunction(fn.__func__))
              or (not isinstance(fn, type) and not inspect.isroutine(fn) and inspect.isfunction(call)))
    if not python:
        receives = (_HOOK_RECEIVES if varargs else
                    "a body receives one loop index per declared Loop, then the arrays, and calls tppasm "
                    "kernels on views of them; write it as a def, e.g. 'def body(i, X, Y): relu(X[i], Y[i])'")
        raise TypeError(f"{what} {name!r} is a {type(fn).__name__} ({fn!r}), not a Python function: {receives}")
    try:
        params = list(inspect.signature(body).parameters.values())
    except (TypeError, ValueError) as e:
        raise TypeError(f"{what} {name!r}: its parameters cannot be read ({e}); " + (_HOOK_RECEIVES if varargs else
                        "write it as a def that names one parameter per loop index, then one per array: "
                        "'def body(i, X, Y): ...'")) from None
    names = []
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind == p.VAR_POSITIONAL and varargs:
            break
        elif p.kind == p.KEYWORD_ONLY and p.default is not p.empty:
            continue                          # a keyword with a default (e.g. bound by a partial): never passed
        else:
            bad = {p.VAR_POSITIONAL: f"'*{p.name}'", p.VAR_KEYWORD: f"'**{p.name}'",
                   p.KEYWORD_ONLY: f"the keyword-only parameter {p.name!r} (after '*')"}[p.kind]
            passes = (_HOOK_RECEIVES if varargs else "the nest passes the loop indices, then the arrays, by "
                      "position, one named parameter each; write e.g. 'def body(i, X, Y):' (no '*', '*args' or "
                      "'**kwargs')")
            raise TypeError(f"{what} {name!r} takes {bad}: {passes}")
    return names
