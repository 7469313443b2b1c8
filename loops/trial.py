"""One candidate of a tuning search: build its configuration, check its result, time it.

A configuration is what ``make(**knobs)`` returns (:func:`loops.tune.search`): a loop kernel, its
arrays and optionally ``output()``. :class:`Built` keeps the arrays' initial contents and the
reference result; :func:`measure` runs a candidate spec from those contents (the arrays the nest
writes but never reads poisoned with NaN when the reference overwrites them all), compares its
result (:func:`same`), and times it by wall or CPU clock (:func:`elapsed`).

A candidate spec other than the kernel's own is bound with ``races="refuse"`` whatever the
kernel declares (:func:`variant`): the race analysis of :mod:`loops.races` that a bind runs
refuses it, so a spec that races is skipped (its note says where), never timed nor chosen, also
for kernels declared ``races="warn"`` or ``"allow"`` (the tuner cannot know which races a body's
own synchronization covers; the kernel's own spec runs as declared).

The arrays a loop kernel declares scratch (``loops.kernel(..., scratch=...)``, :mod:`loops.scratch`)
are not compared: a spec that splits the loops differently leaves other values in a slot per thread.
"""
import time
from dataclasses import dataclass

import numpy as np

from isa.pool_calls import on_the_pools_threads

from .signature import as_arrays, signature
from .spec import SpecError
from .trace import TraceError

# A candidate's repeats stop once they have taken this long: a run of 40 ms (a 2048^3 GEMM) is timed
# by its checking run and one repeat instead of three (a lucky one still meets the final round-robin
# rounds of the search). Measured at 2048^3 bf16 on Zen 5: 54 candidates timed in 20 s, not 42; the
# check, the JIT and restoring the arrays take most of the rest.
REPEAT_SECONDS = 0.03


@dataclass
class Candidate:
    """One point of the search: ``config`` (knob values), ``spec``, its ``predicted`` and measured
    ``seconds`` (None: not timed, or skipped with the reason in ``note``; ``error``: the
    :class:`SpecError` that refused it, if one did)."""

    config: dict
    spec: str
    predicted: float = None
    seconds: float = None
    note: str = ""
    error: Exception = None


class Built:
    """One configuration: its kernel and arrays (torch tensors and DLPack objects viewed as NumPy
    arrays), their initial contents, and how to read the result."""

    def __init__(self, made):
        self.lk = made[0]
        self.arrays = as_arrays(tuple(made[1]), self.lk.array_names, self.lk.__name__)
        self.output = made[2] if len(made) > 2 else None
        signature(self.arrays)     # TypeError unless arrays
        self.writable = [i for i, a in enumerate(self.arrays) if a.flags.writeable]
        scratch = getattr(self.lk, "scratch", ())
        # the arrays compared: a declared scratch array holds no result (loops.scratch)
        self.compared = [i for i in self.writable if self.lk.array_names[i] not in scratch]
        self.access = {}           # array name -> "read" / "written" / "read and written" (the reference's)
        self.initial = [self.arrays[i].copy() for i in self.writable]
        self.poison = False
        self.outputs = set()       # the arrays the nest writes but never reads: poisoned when self.poison
        self.own = None            # this configuration's reference result (when no output())
        self.own_seconds = None    # the time of the reference's first run
        self.holding = None        # the spec whose result the arrays hold (None: unknown or initial)

    def restore(self):
        self.holding = None
        for i, init in zip(self.writable, self.initial):
            a = self.arrays[i]
            if self.poison and i in self.outputs and (a.dtype.kind == "f" or a.dtype.name == "bfloat16"):
                a[...] = np.nan
            else:
                a[...] = init

    def result(self):
        if self.output is not None:
            out = as_arrays((self.output(),), ["output()"], self.lk.__name__)[0]
            return [np.asarray(out).astype(np.float64)]
        return [self.arrays[i].astype(np.float64) for i in self.compared]

    def difference(self, got, want, rtol):
        """The note of a candidate whose result ``got`` differs from ``want``: the array that
        differs and, when the nest also reads it (working memory, e.g. a slot per thread), how to
        declare it scratch so that it is not compared."""
        if self.output is not None:
            return "different result, skipped"
        for i, g, w in zip(self.compared, got, want):
            if same([g], [w], rtol):
                continue
            name = self.lk.array_names[i]
            if self.access.get(name) != "read and written":
                return f"different result ({name}), skipped"
            return (f"different result ({name}), skipped; if {name} is scratch (e.g. {name}[thread().tid]: its contents "
                    f"depend on the spec), declare it: loops.kernel(..., scratch=({name!r},))")
        return "different result, skipped"

    def reference(self, deadline=float("inf"), clock="wall"):
        """Run the kernel's own spec (not one tuned earlier) from the initial contents; check whether
        it overwrites the arrays it only writes (then candidates start with those full of NaN, so
        an element they leave unwritten shows). That check runs it again, unless the first run
        ended past ``deadline`` (the search's budget is spent: candidates start from the initial
        contents); ``own_seconds`` is the first run's time (by ``clock``)."""
        own = self.lk.with_spec(self.lk.spec.text)
        access = self.access = own.accesses(*self.arrays)
        self.outputs = {i for i, name in enumerate(own.array_names) if access[name] == "written"}
        self.restore()
        self.own_seconds = elapsed(own, self.arrays, clock)
        want = self.result()
        if time.perf_counter() > deadline:
            self.poison, self.own, self.holding = False, want, own.spec.text   # the arrays hold its result
            return want
        self.poison = bool(self.outputs)
        self.restore()
        own(*self.arrays)
        self.poison = self.poison and all(np.array_equal(g, w, equal_nan=True) for g, w in zip(self.result(), want))
        if not self.poison:
            self.restore()          # NaN reached the result: the nest leaves part of an output as it was
        self.own = want
        return want


class Builds:
    """``make`` called once per configuration while it is in use (arrays can be large)."""

    def __init__(self, make):
        self.make, self.cache = make, {}

    def get(self, config):
        k = tuple(sorted(config.items()))
        if k not in self.cache:
            try:
                made = self.make(**config)
            except TypeError as e:
                if "argument" not in str(e):
                    raise
                raise TypeError(f"make(**{config}) failed: {e}; every knob must name a parameter of make") from None
            if not isinstance(made, tuple) or len(made) not in (2, 3):
                raise TypeError("make(**knobs) must return (loop kernel, arrays) or (loop kernel, arrays, output), "
                                f"got {type(made).__name__}")
            if not hasattr(made[0], "with_spec") or not isinstance(made[1], (tuple, list)):   # (a LoopKernel)
                raise TypeError("make(**knobs) must return (loop kernel, arrays) or (loop kernel, arrays, output): "
                                f"a loops.kernel nest and a tuple of its arrays, got ({type(made[0]).__name__}, "
                                f"{type(made[1]).__name__}, ...)")
            while len(self.cache) >= 2:
                self.cache.pop(next(iter(self.cache)))
            self.cache[k] = Built(made)
        return self.cache[k]

    def drop(self, config):
        self.cache.pop(tuple(sorted(config.items())), None)


def measure(c, builds, reference, reps, rtol, clock="wall", probe=None, deadline=float("inf")):
    """Time candidate ``c`` (the min of its checking run and up to ``reps`` more, kept if lower than
    before; the repeats stop after :data:`REPEAT_SECONDS`, one at least, and at ``deadline``); with a
    :class:`Probe`, scaled by the machine's speed of the moment. Past ``deadline``, the kernel's
    own spec takes its reference run's time instead of running again (that run was its check)."""
    try:
        built = builds.get(c.config)
        if built.own is None:
            built.reference(deadline, clock)
        if (time.perf_counter() > deadline and c.spec == built.lk.spec.text
                and built.own_seconds is not None and not c.seconds):
            c.seconds = built.own_seconds
            return
        variant = candidate_variant(built.lk, c.spec)
        built.restore()
        runs = [elapsed(variant, built.arrays, clock)]
        want = reference if built.output is not None else built.own
        got = built.result()
        if not same(got, want, rtol):
            c.seconds, c.note = None, built.difference(got, want, rtol)
            return
        scale = probe.scale() if probe is not None else 1.0
        spent = 0.0
        while len(runs) <= reps and (len(runs) < 2 or spent < REPEAT_SECONDS) and time.perf_counter() <= deadline:
            runs.append(elapsed(variant, built.arrays, clock))
            spent += runs[-1]
        c.seconds = min(min(runs) * scale, c.seconds or float("inf"))
    except (SpecError, TraceError, IndexError, ValueError) as e:
        c.seconds, c.note = None, first_line(e)
        c.error = e if isinstance(e, SpecError) else None


def first_line(e):
    """The first non-blank line of ``e``'s message, or its class name when it has none (a bare
    ``raise ValueError``): a skipped candidate's note, never empty.

    >>> first_line(ValueError("\\nbm=8 is not supported\\nmore")), first_line(IndexError())
    ('bm=8 is not supported', 'IndexError')
    """
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def candidate_variant(lk, spec):
    """``lk`` under ``spec``, bound with ``races="refuse"`` unless it is ``lk``'s own spec (see the
    module docstring): a racing candidate raises :class:`loops.races.RaceError` when bound."""
    return lk.with_spec(spec, races=None if spec == lk.spec.text else "refuse")


def time_again(c, builds, reps, clock="wall", deadline=float("inf")):
    """The minimum of up to ``reps`` runs of a candidate already checked by :func:`measure` (no
    check); as there, the runs stop after :data:`REPEAT_SECONDS` (one at least), so a large
    ``reps`` does not outlast the search's budget; None when ``deadline`` passed before the first."""
    built = builds.get(c.config)
    variant = candidate_variant(built.lk, c.spec)
    built.holding = None                            # runs on the arrays as they are
    runs, spent = [], 0.0
    while len(runs) < reps and (not runs or spent < REPEAT_SECONDS) and time.perf_counter() <= deadline:
        runs.append(elapsed(variant, built.arrays, clock))
        spent += runs[-1]
    return min(runs) if runs else None


class Probe:
    """The machine's speed of the moment: a fixed loop kernel (the reference configuration) timed
    again whenever ``every`` seconds have passed. :meth:`scale` is its first time over its latest,
    so a candidate's time times the scale is what it would have taken at the first probe's speed:
    a period in which another process slows the core (its SMT sibling, the shared cache) cancels
    instead of ranking every candidate timed in it last.

    >>> import numpy as np, tppasm as tpp
    >>> from loops import Loop, kernel
    >>> zero = tpp.zero(8, 8)
    >>> clear = kernel("A", Loop(0, 4))(lambda i, X: zero(X[i]))
    >>> probe = Probe(clear, (np.ones((4, 8, 8), np.float32),), reps=2, every=0.0)
    >>> probe.scale() > 0
    True
    """

    def __init__(self, fn, arrays, reps=2, clock="wall", every=0.5):
        self.fn, self.arrays, self.reps, self.clock, self.every = fn, arrays, reps, clock, every
        self.first = self.latest = self._time()
        self.at = time.perf_counter()

    def _time(self):
        return min(elapsed(self.fn, self.arrays, self.clock) for _ in range(self.reps))

    def scale(self):
        if time.perf_counter() - self.at >= self.every:
            self.latest = self._time()
            self.at = time.perf_counter()
        return self.first / self.latest


def elapsed(fn, arrays, clock="wall"):
    """Seconds of one run of the loop kernel ``fn`` on ``arrays``: wall clock, or (``clock="cpu"``)
    the largest CPU time of its pool's threads.

    >>> import numpy as np, tppasm as tpp
    >>> from loops import Loop, kernel
    >>> zero = tpp.zero(8, 8)
    >>> clear = kernel("A", Loop(0, 4))(lambda i, X: zero(X[i]))
    >>> X = np.ones((4, 8, 8), np.float32)
    >>> elapsed(clear, (X,), "cpu") > 0, float(X.sum())
    (True, 0.0)
    """
    if clock == "wall":
        t = time.perf_counter()
        fn(*arrays)
        return time.perf_counter() - t
    pool = fn.pool
    with on_the_pools_threads():            # (whose clocks cpu_seconds reads; not torch's OpenMP threads)
        before = pool.cpu_seconds()
        fn(*arrays)
        return max(b - a for a, b in zip(before, pool.cpu_seconds()))


def same(got, want, rtol):
    """True when each array of ``got`` matches ``want``'s: NaN where it holds NaN, the same
    infinities, and finite values within ``rtol`` times the largest finite magnitude of ``want``
    (1 at least). A candidate whose NaN or infinities fall elsewhere is different.

    >>> nan, inf = float("nan"), float("inf")
    >>> same([np.array([nan, 1.0])], [np.array([nan, 1.0])], 1e-4)
    True
    >>> same([np.array([inf, 12345.0])], [np.array([inf, 1.0])], 1e-4)
    False
    """
    for g, w in zip(got, want):
        if g.shape != w.shape:
            return False
        finite = w[np.isfinite(w)]
        scale = float(np.abs(finite).max()) if finite.size else 0.0
        if not np.allclose(g, w, rtol=rtol, atol=rtol * max(scale, 1.0), equal_nan=True):
            return False
    return True
