"""What a loop body (or an init/fini hook) may be: a Python function whose parameters the nest
fills by position, the loop indices first, then the arrays.

>>> check_body(lambda i, X: None); parameters(lambda i, X: None)
['i', 'X']
"""
import functools
import inspect


def check_body(body):
    """Refuse bodies whose call would not run the loop body: generators, coroutines, non-callables."""
    fn = body
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not callable(fn):
        raise TypeError(f"a loop body must be a function, not {type(body).__name__} {body!r}")
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else getattr(type(fn), "__call__", fn)
    for test, what in ((inspect.isgeneratorfunction, "a generator function (it has 'yield')"),
                       (inspect.iscoroutinefunction, "an 'async def' coroutine function"),
                       (inspect.isasyncgenfunction, "an async generator function")):
        if test(fn) or test(target):
            raise TypeError(f"loop body {getattr(body, '__name__', type(body).__name__)!r} is {what}: calling it "
                            "runs nothing; "
                            "write the body as a plain 'def' that calls the kernels directly (no yield, "
                            "async or await)")


def parameters(body, varargs=False):
    """The names of ``body``'s parameters, which the nest fills by position (loop indices, then
    arrays); TypeError unless ``body`` is a Python function (a ``def``, lambda, method, partial or
    object with a Python ``__call__``) whose parameters can all be passed so. ``varargs``: a
    ``*args`` parameter is allowed (hooks take "as many arrays as they name"); it ends the names.

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
        raise TypeError(f"loop body {name!r} is a {type(fn).__name__} ({fn!r}), not a Python function: a body "
                        "receives one loop index per declared Loop, then the arrays, and calls tppasm kernels "
                        "on views of them; write it as a def, e.g. 'def body(i, X, Y): relu(X[i], Y[i])'")
    try:
        params = list(inspect.signature(body).parameters.values())
    except (TypeError, ValueError) as e:
        raise TypeError(f"loop body {name!r}: its parameters cannot be read ({e}); write it as a def that names "
                        "one parameter per loop index, then one per array: 'def body(i, X, Y): ...'") from None
    names = []
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind == p.VAR_POSITIONAL and varargs:
            break
        elif p.kind == p.KEYWORD_ONLY and p.default is not p.empty:
            continue                          # a keyword with a default (e.g. bound by a partial): never passed
        else:
            what = {p.VAR_POSITIONAL: f"'*{p.name}'", p.VAR_KEYWORD: f"'**{p.name}'",
                    p.KEYWORD_ONLY: f"the keyword-only parameter {p.name!r} (after '*')"}[p.kind]
            raise TypeError(f"loop body {name!r} takes {what}: the nest passes the loop indices, then the arrays, "
                            "by position, one named parameter each; write e.g. 'def body(i, X, Y):' "
                            "(no '*', '*args' or '**kwargs')")
    return names
