"""Tuning results kept across processes: a search's record (:func:`loops.tune.search`) stored in
tppasm's disk cache (namespace ``tune``), so a later process on the same machine takes it instead
of searching again, or resumes the search from it.

The key holds everything the result depends on: the search's own key (by default the kernel's
name, the arrays' shapes and dtypes, the host's vendor, ISA and cache sizes, the thread count),
the configurations and specs searched, the code of ``make`` and of the kernel's body, the CPU's
model and microcode (:func:`isa.cpu.identity`), and the versions of the sources that generate the
kernels (:func:`tppasm.backends.source_version`) and the loop nests. A change to any of them is a
new key, so a record is never applied to code or to a machine it was not measured on. A record is
data, a spec string and knob values: the winner is generated again from it by the usual code
generators, and its result is checked against the reference before it is used, so a damaged or
stale record costs a search, never a wrong result.

>>> args = (("gemm", 64), [{"bm": 8}], None, True, load, store, 1)     # make, body: any functions
>>> disk_key(*args) == disk_key(*args) != disk_key(*args[:-1], 2)
True
"""
import hashlib
import json
import marshal

from isa.cpu import host, identity
from tppasm import backends, cache

NAMESPACE = "tune"
NEST_SOURCES = ("loops/**/*.py",)


def code_digest(fn):
    """SHA-256 (hex, 16 digits) of a function's compiled code (its nested functions included), or
    "" when it has none (a callable object).

    >>> code_digest(lambda: 1) != code_digest(lambda: 2)
    True
    """
    code = getattr(fn, "__code__", None)
    if code is None:
        return ""
    return hashlib.sha256(marshal.dumps(code)).hexdigest()[:16]


def disk_key(key, configs, specs, blocks, make, body, threads):
    """The text a search's record is stored under (see the module docstring)."""
    isa = host().isa
    parts = (repr(key), repr([sorted(c.items()) for c in configs]), repr(specs), repr(blocks),
             code_digest(make), code_digest(body), threads, identity(), isa, backends.source_version(isa),
             backends.code_options(isa), backends.tree_version(NEST_SOURCES))
    return "\n".join(str(p) for p in parts)


def load(key, configs):
    """The record stored under ``key`` whose knobs are one of ``configs``, or None."""
    record = cache.recall(NAMESPACE, key)
    if not isinstance(record, dict) or not isinstance(record.get("spec"), str):
        return None
    if record.get("knobs") not in configs:
        return None
    return record


def store(key, record):
    """Write ``record`` under ``key``; False when the cache is off or the record is not plain JSON
    (knob values such as tuples or arrays are kept in this process only)."""
    try:
        if json.loads(json.dumps(record)) != record:
            return False
    except (TypeError, ValueError):
        return False
    return cache.remember(NAMESPACE, key, record)
