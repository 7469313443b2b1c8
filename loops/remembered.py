"""Tuning results kept across processes: a search's record (:func:`loops.tune.search`) stored in
tppasm's disk cache (namespace ``tune``), so a later process on the same machine takes it instead
of searching again, or resumes the search from it.

The key holds everything the result depends on: the search's own key (by default the kernel's
name, the arrays' shapes and dtypes, the host's vendor, ISA and cache sizes, the thread count),
the configurations and specs searched, the code of ``make`` and of the kernel's body, the loops,
spec, races and arrays the kernel declares (:func:`declarations`), the CPU's
model and microcode (:func:`isa.cpu.identity`), and the versions of the sources that generate the
kernels (:func:`tppasm.backends.source_version`) and the loop nests. A change to any of them is a
new key, so a record is never applied to code or to a machine it was not measured on. A record is
data, a spec string and knob values: the winner is generated again from it by the usual code
generators, and its result is checked against the reference before it is used, so a damaged or
stale record costs a search, never a wrong result.

>>> import tppasm as tpp
>>> from loops import Loop, kernel
>>> zero = tpp.zero(8, 8)
>>> @kernel("A", Loop(0, 4))
... def clear(i, X):
...     zero(X[i])
>>> args = (("clear", 4), [{"bm": 8}], None, True, load, clear, 1)   # make: any function
>>> disk_key(*args) == disk_key(*args) != disk_key(*args[:-1], 2)
True
"""
import dataclasses
import hashlib
import json
import marshal
import math
import types

from isa.cpu import host, identity
from isa.int_text import int_text
from tppasm import backends, cache
from tppasm.cache.kernels import describe

NAMESPACE = "tune"
NEST_SOURCES = ("loops/**/*.py",)


def code_digest(fn, depth=0):
    """SHA-256 (hex, 16 digits) of a function's compiled code (its nested functions included) and of
    the values it closes over or defaults to (:func:`captured`), or "" when it has no code (a
    callable object). Where the code lies (file name, first line) is left out: a notebook cell's
    file is named after the kernel's process, new every session.

    >>> import tppasm as tpp
    >>> def make(k):
    ...     return lambda x, y: k(x, y)
    >>> code_digest(lambda: 1) != code_digest(lambda: 2)
    True
    >>> code_digest(make(tpp.relu(2, 2))) != code_digest(make(tpp.unary("exp", 2, 2)))
    True
    """
    code = getattr(fn, "__code__", None)
    if code is None:
        return ""
    text = marshal.dumps(_unplaced(code)) + repr(captured(fn, depth)).encode()
    return hashlib.sha256(text).hexdigest()[:16]


def captured(fn, depth=0):
    """Texts of the values ``fn`` closes over and its defaults, the same in every process: a TPP
    kernel's descriptor, a function's (or a loop kernel's body's) digest, a plain value's repr;
    for anything else, its type (an array: its data is no code)."""
    cells = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:                # an empty cell (a name not bound yet)
            cells.append(None)
    values = cells + list(getattr(fn, "__defaults__", None) or ()) + list((getattr(fn, "__kwdefaults__", None)
                                                                              or {}).values())
    return [_value_text(v, depth + 1) for v in values]


def _value_text(v, depth):
    if isinstance(v, (bool, float, str, bytes, type(None))):
        return repr(v)
    if isinstance(v, int):
        return int_text(v)
    if isinstance(v, tuple) and depth < 4:
        return "(" + ", ".join(_value_text(x, depth + 1) for x in v) + ")"
    desc = getattr(v, "desc", None)
    if desc is not None and dataclasses.is_dataclass(desc):
        return describe(desc) or type(desc).__qualname__
    body = getattr(v, "body", None)       # a loop kernel
    fn = body if callable(body) and hasattr(v, "spec") else v
    if isinstance(fn, types.FunctionType):
        return code_digest(fn, depth) if depth < 4 else fn.__qualname__
    return type(v).__qualname__


def _unplaced(code):
    """``code`` and the code objects among its constants with no file name and line 1."""
    consts = tuple(_unplaced(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename="", co_firstlineno=1, co_consts=consts)


def declarations(lk):
    """What a record depends on in the loop kernel ``lk`` besides its body's code: the loops, spec,
    races, arrays and scratch arrays (left out of the comparisons) it declares.

    >>> from loops import Loop, kernel
    >>> lk = kernel("A", Loop(0, 4))(lambda i, X: None)
    >>> declarations(lk) != declarations(lk.with_spec("A{R:2}"))
    True
    """
    return repr((lk.loops, lk.spec.text, lk.races, lk.array_names, lk.scratch))


def disk_key(key, configs, specs, blocks, make, lk, threads):
    """The text a search's record is stored under (see the module docstring); ``lk`` is the loop
    kernel of the first configuration."""
    isa = host().isa
    parts = (repr(key), _configs_text(configs), repr(specs), repr(blocks),
             code_digest(make), code_digest(lk.body), declarations(lk), threads, identity(), isa,
             backends.source_version(isa),
             backends.code_options(isa), backends.tree_version(NEST_SOURCES))
    return "\n".join(str(p) for p in parts)


def _configs_text(configs):
    """The configurations' part of the disk key: a :class:`loops.knob_grid.Grid` keys itself
    cheaply; a plain list is listed."""
    if hasattr(configs, "key_text"):
        return configs.key_text()
    return repr([sorted(c.items()) for c in configs])


def load(key, configs):
    """The record stored under ``key`` whose knobs are one of ``configs`` and whose every field has
    the type and range a search writes (:func:`valid`), or None.

    >>> load("no such key", [{}]) is None
    True
    """
    record = cache.recall(NAMESPACE, key)
    return record if valid(record, configs) else None


def _count(least):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= least


def _seconds(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _strings(v):
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


# every field of a search's record (loops.tune.search) and what it must hold
FIELDS = {"kernel": lambda v: isinstance(v, str), "key": lambda v: isinstance(v, str) or _strings(v),
          "threads": _count(1), "knobs": lambda v: isinstance(v, dict), "spec": lambda v: isinstance(v, str) and v,
          "seconds": _seconds, "reference_seconds": lambda v: v is None or _seconds(v),
          "candidates": _count(1), "timed": _count(1), "configurations": _count(1),
          "unmodelled_configurations": _count(0), "skipped": _count(0), "model": lambda v: isinstance(v, bool),
          "predicted_rank": _count(0), "modelling_seconds": _seconds, "clock": lambda v: v in ("wall", "cpu"),
          "elapsed": _seconds, "runs": _count(1), "tuning_seconds": _seconds,
          "resumed": lambda v: isinstance(v, bool), "explored": _strings}


def valid(record, configs):
    """True when ``record`` is a dict with a ``spec`` and ``knobs`` that are one of ``configs``, and
    every field of :data:`FIELDS` it holds has its type and range: a damaged record is searched
    again, never used.

    >>> valid({"spec": "A", "knobs": {}, "runs": 2}, [{}]), valid({"spec": "A", "knobs": {}, "runs": "2"}, [{}])
    (True, False)
    """
    if not isinstance(record, dict) or "spec" not in record or "knobs" not in record:
        return False
    if not all(ok(record[k]) for k, ok in FIELDS.items() if k in record):
        return False
    return record["knobs"] in configs


def store(key, record):
    """Write ``record`` under ``key``; False when the cache is off or the record is not plain JSON
    (knob values such as tuples or arrays are kept in this process only)."""
    try:
        if json.loads(json.dumps(record)) != record:
            return False
    except (TypeError, ValueError):
        return False
    return cache.remember(NAMESPACE, key, record)
