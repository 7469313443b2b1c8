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
import hashlib
import json
import marshal
import math
import types

from isa.cpu import host, identity
from tppasm import backends, cache

NAMESPACE = "tune"
NEST_SOURCES = ("loops/**/*.py",)


def code_digest(fn):
    """SHA-256 (hex, 16 digits) of a function's compiled code (its nested functions included), or
    "" when it has none (a callable object). Where the code lies (file name, first line) is left
    out: a notebook cell's file is named after the kernel's process, new every session.

    >>> code_digest(lambda: 1) != code_digest(lambda: 2)
    True
    """
    code = getattr(fn, "__code__", None)
    if code is None:
        return ""
    return hashlib.sha256(marshal.dumps(_unplaced(code))).hexdigest()[:16]


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
