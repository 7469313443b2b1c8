"""A ResNet-50 layer's tuned choice (blocking and spec) kept across runs of ``python -m bench conv``,
in tppasm's disk cache beside the tuner's search records (namespace ``tune``, see
:mod:`loops.remembered`; ``python -m tppasm cache list`` shows them, ``cache clear --only tune``
drops them).

The next run times the remembered choice in its final round beside that run's finalists, once
its result matched a fresh finalist's, and remembers the faster: a pick that a noisy moment of
the host made is corrected by a later run, a good one is kept. A record is data (the knobs of a
:class:`bench.conv_nest.Blocking` and a spec string); the nest is generated again from it. The key
holds the layer's shape, the dtype, the thread count, the knob space searched (blockings and
specs), the CPU (:func:`isa.cpu.identity`), the ISA, the generators' source version and options,
and a version of the sources of the nests (``loops/``, ``bench/``): a record never applies
to other code, another knob space or another machine.

>>> from bench.conv_nest import Blocking, Conv
>>> shape, knobs = Conv(n=1, c=4, k=8, h=5, w=5, r=3, s=3, pad=1), [Blocking(bc=4, bk=8)]
>>> layer_key(shape, "f32", 1, knobs, ["Acdebfg"]) != layer_key(shape, "f32", 2, knobs, ["Acdebfg"])
True
"""
from dataclasses import asdict, dataclass

from isa.cpu import host, identity
from loops import remembered
from tppasm import backends, cache

from .conv_nest import Blocking

SOURCES = ("loops/**/*.py", "bench/*.py")


@dataclass(frozen=True)
class Choice:
    """A remembered (blocking, spec), its median seconds per call, and the runs and tuning seconds
    it sums up."""

    blocking: Blocking
    spec: str
    seconds: float
    runs: int
    tuning_seconds: float


def layer_key(shape, dtype, threads, knobs, specs):
    """The text a layer's choice is stored under (see the module docstring)."""
    isa = host().isa
    parts = ("conv", repr(shape), dtype, threads, repr(list(knobs)), repr(list(specs)), identity(),
             isa, backends.source_version(isa), backends.code_options(isa), backends.tree_version(SOURCES))
    return "\n".join(str(p) for p in parts)


def load(key, knobs, specs):
    """The :class:`Choice` stored under ``key`` when its blocking is one of ``knobs`` and its spec
    one of ``specs``, else None."""
    record = cache.recall(remembered.NAMESPACE, key)
    if (not isinstance(record, dict) or record.get("spec") not in specs
            or record.get("knobs") not in [asdict(b) for b in knobs]):
        return None
    try:
        return Choice(Blocking(**record["knobs"]), record["spec"], float(record["seconds"]),
                      int(record["runs"]), float(record["tuning_seconds"]))
    except (KeyError, TypeError, ValueError):
        return None


def store(key, what, choice):
    """Remember ``choice`` under ``key``; ``what`` names the layer in ``cache list``'s lines.
    False when the cache is off."""
    record = {"key": what, "spec": choice.spec, "knobs": asdict(choice.blocking), "seconds": choice.seconds,
              "runs": choice.runs, "tuning_seconds": choice.tuning_seconds}
    return remembered.store(key, record)


def update(key, what, prior, blocking, spec, seconds, tuning_seconds):
    """Remember this run's choice (``prior``: the one loaded, or None) with the runs and tuning
    seconds summed up; returns (how, runs): how is "first", "kept" (the prior won again) or "new".

    >>> update("doctest key", ["conv"], None, Blocking(), "Acdebfg", 0.001, 2.0)
    ('first', 1)
    """
    if prior is None:
        how, runs, before = "first", 1, 0.0
    else:
        how = "kept" if (prior.blocking, prior.spec) == (blocking, spec) else "new"
        runs, before = prior.runs + 1, prior.tuning_seconds
    store(key, what, Choice(blocking, spec, seconds, runs, before + tuning_seconds))
    return how, runs
