"""Who runs which iteration, and which iterations a barrier separates: the spec's schedule as NumPy
functions of the loop values, for the race analysis (:mod:`loops.races`).

An iteration is identified by the values of the declared loops (``x[k]`` for loop ``k``): a
blocked loop visits each value once, so every occurrence of a loop (each letter) has a value,
position and trip count that are functions of ``x[k]`` alone (:meth:`Schedule.levels_of`).

What the native nest does (:mod:`loops.x86.nest`, :mod:`loops.nest_plan`), written as functions:

- serial levels outside every parallel level run on every thread alike;
- collapsed run, ``schedule(static)``: iteration ``q`` of the run's ``N`` (mixed radix of the run's
  positions) goes to the thread of OpenMP's contiguous split (:func:`loops.nest_plan.static_share`);
  ``static,c``: chunk ``q // c`` to thread ``(q // c) % T``; ``dynamic,c``: chunk ``q // c`` of
  that instance of the run to whichever thread takes it;
- grid: a team level gives coordinate ``position // ceil(trip / teams)`` on its axis; thread
  ``layer * R * C + row * C + col``;
- barriers (``|``) sit after levels that all threads run alike; two iterations are separated by
  one exactly when they differ in a level enclosing a barrier: the *epoch* is the tuple of values
  of the first ``prefix`` levels.

>>> from loops.spec import Loop, parse
>>> s = Schedule(parse("aBC|", 3), (Loop(0, 2), Loop(0, 3), Loop(0, 2)), 2)
>>> x = {"a": np.array([0, 1]), "b": np.array([2, 2]), "c": np.array([1, 1])}
>>> s.thread(x).tolist(), [e.tolist() for e in s.epoch(x)]
([1, 1], [[0, 1]])
"""
import numpy as np

from .spec import LETTERS

THREAD_VARS = ("tid", "row", "col", "layer")


class Schedule:
    """The schedule of ``spec`` over the resolved ``loops`` on ``nthreads`` threads."""

    def __init__(self, spec, loops, nthreads):
        self.spec, self.loops, self.T = spec, tuple(loops), int(nthreads)
        self.mode, levels = spec.mode, spec.levels
        self.kind, chunk = spec.schedule
        self.chunk = chunk or (1 if self.kind == "dynamic" else 0)
        if self.mode == "collapse":
            self.parallel = list(range(spec.run[0], spec.run[1] + 1))
        else:
            self.parallel = [i for i, lv in enumerate(levels) if lv.parallel]
        self.first_par = self.parallel[0] if self.parallel else len(levels)
        prefix, runs = 0, False
        for i, lv in enumerate(levels):
            if lv.barrier:
                enclosing = spec.run[0] if self.mode == "collapse" and spec.run[0] <= i <= spec.run[1] else i
                prefix = max(prefix, enclosing)
                runs = runs or all(self.loops[o.loop].trip > 0 for o in levels[:enclosing])
        self.prefix = prefix                       # levels 0..prefix-1 enclose every barrier
        # a barrier inside an empty loop never runs: then nothing separates the init and fini hooks
        self.barriers = runs
        rows, cols, layers = spec.grid if self.mode == "grid" else (1, 1, 1)
        self.grid = (rows, cols, layers)
        self._bounds = {}
        self._letters = [[i for i, lv in enumerate(levels) if lv.loop == k] for k in range(spec.nloops)]
        self.active = rows * cols * layers if self.mode == "grid" else (self.T if self.mode == "collapse" else 1)

    # -- per loop ---------------------------------------------------------------------------------
    def letter_levels(self, k):
        """Indices of the levels (letters) of loop ``k``, outer first."""
        return self._letters[k]

    def levels_of(self, k, x):
        """Per level of loop ``k`` (outer first): ``(value, position, trip)`` arrays for values ``x``.

        >>> from loops.spec import Loop, parse
        >>> s = Schedule(parse("aa", 1), (Loop(0, 7, blocks=[4]),), 1)
        >>> [[a.tolist() for a in t] for t in s.levels_of(0, np.array([5]))]
        [[[4], [1], [2]], [[5], [1], [3]]]
        """
        lp = self.loops[k]
        x = np.asarray(x, np.int64)
        lo, top = np.full_like(x, lp.start), np.full_like(x, lp.end)
        occurrences = self.spec.occurrences[k]
        out = []
        for o in range(occurrences):
            stride = lp.step if o == occurrences - 1 else lp.blocks[o]
            pos = (x - lo) // stride
            value = lo + pos * stride
            trip = np.maximum(0, -(-(top - lo) // stride))
            out.append((value, pos, trip))
            if o + 1 < occurrences:
                top = np.minimum(value + lp.blocks[o], top)
                lo = value
        return out

    def _level_table(self, x):
        """Level index -> (value, position, trip) for the loop values ``x`` (var -> array)."""
        table = {}
        for k in range(len(self.loops)):
            for i, vals in zip(self.letter_levels(k), self.levels_of(k, x[LETTERS[k]])):
                table[i] = vals
        return table

    # -- roles ------------------------------------------------------------------------------------
    def schedule_loops(self):
        """Loops whose values decide a thread, a chunk or an epoch."""
        levels = self.spec.levels
        if self.mode == "collapse" and self.kind == "dynamic":
            chosen = range(self.spec.run[1] + 1)           # the outer levels name the run's instance
        else:
            chosen = list(range(self.prefix)) + self.parallel
        return sorted({levels[i].loop for i in chosen})

    def pinned_when_equal(self):
        """Loops that, once equal in two iterations, leave them on one thread (or chunk)."""
        return sorted({self.spec.levels[i].loop for i in
                       (range(self.spec.run[1] + 1) if self.mode == "collapse" and self.kind == "dynamic"
                        else self.parallel)})

    def in_prefix(self, k):
        """True when every value of loop ``k`` has its own epoch (its last letter encloses a barrier)."""
        return any(i < self.prefix and self.spec.levels[i].last for i in self.letter_levels(k))

    def segment(self, k, x):
        """Key of the values of loop ``k`` that share its letters before the first parallel level."""
        keys = [v for i, (v, _, _) in zip(self.letter_levels(k), self.levels_of(k, x)) if i < self.first_par]
        if not keys:
            return np.zeros(len(np.atleast_1d(x)), np.int64)
        return keys[-1]                           # inner blocks lie inside outer ones: the last one decides

    def monotone(self, k):
        """True when, other loops fixed, the thread/chunk is monotone in loop ``k`` inside a segment."""
        if self.mode == "collapse" and self.kind == "static" and self.chunk:
            return False
        par = [i for i in self.letter_levels(k) if i in self.parallel]
        before = [i for i in self.letter_levels(k) if i < (par[0] if par else 0)]
        return len(par) == 1 and all(i < self.first_par for i in before)

    def boundary_values(self, k):
        """Values of loop ``k`` next to where the thread changes (a guess that finds most races at once)."""
        if k in self._bounds:
            return self._bounds[k]
        lp, out = self.loops[k], []
        trips, strides, members = [], [], []
        for i in self.parallel:
            lv = self.spec.levels[i]
            loop = self.loops[lv.loop]
            stride = loop.step if lv.last else loop.blocks[lv.occurrence]
            span = loop.end - loop.start if lv.occurrence == 0 else loop.blocks[lv.occurrence - 1]
            trips.append(max(1, -(-span // stride)))
            strides.append(stride)
            members.append(lv)
        positions = []
        if self.mode == "grid":
            for lv, n in zip(members, trips):
                size = -(-n // lv.teams)
                positions.append([p for c in range(1, lv.teams) for p in (c * size - 1, c * size)])
        elif self.kind == "static" and not self.chunk:
            n = int(np.prod(trips))
            quot, rem = divmod(n, self.T)
            cuts = [t * quot + min(t, rem) for t in range(1, self.T)]
            digits = [[] for _ in members]
            for q in cuts + [c - 1 for c in cuts]:
                for j in reversed(range(len(members))):
                    digits[j].append(q % trips[j])
                    q //= trips[j]
            positions = digits
        for lv, stride, pos in zip(members, strides, positions):
            if lv.loop == k:
                out += [lp.start + p * stride + d for p in pos for d in (0, stride - lp.step)]
        self._bounds[k] = np.unique(np.array(out, np.int64))
        return self._bounds[k]

    def has_parallel_level(self, k):
        return any(i in self.parallel for i in self.letter_levels(k))

    # -- functions of an iteration ----------------------------------------------------------------
    def epoch(self, x):
        """Values of the levels that enclose barriers (equal tuples: no barrier between)."""
        if not self.prefix:
            return ()
        table = self._level_table(x)
        return tuple(table[i][0] for i in range(self.prefix))

    def first_epoch(self):
        """The epoch of the first iteration (the one the init hooks share with the body)."""
        if not self.prefix:
            return ()
        x = {LETTERS[k]: np.array([lp.start], np.int64) for k, lp in enumerate(self.loops)}
        return tuple(int(e[0]) for e in self.epoch(x))

    def _run_index(self, table):
        q = np.zeros_like(next(iter(table.values()))[0]) if table else np.zeros(1, np.int64)
        n = np.ones_like(q)
        for i in self.parallel:
            _, pos, trip = table[i]
            q = q * trip + pos
            n = n * trip
        return q, n

    def thread(self, x):
        """The thread of each iteration (int64 array), or None under a dynamic schedule."""
        table = self._level_table(x)
        if self.mode == "serial":
            return np.zeros_like(x["a"])
        if self.mode == "grid":
            return self.tvars(x, table)["tid"]
        if self.kind == "dynamic":
            return None
        q, n = self._run_index(table)
        if self.chunk:
            return (q // self.chunk) % self.T
        quot, rem = n // self.T, n % self.T
        big = rem * (quot + 1)
        return np.where(q < big, q // (quot + 1), rem + (q - big) // np.maximum(quot, 1))

    def chunk_key(self, x):
        """Under a dynamic schedule: arrays naming the chunk of each iteration (run instance, q // c)."""
        table = self._level_table(x)
        q, _ = self._run_index(table)
        return tuple(table[i][0] for i in range(self.spec.run[0])) + (q // self.chunk,)

    def tvars(self, x, table=None):
        """``thread()`` coordinates of each iteration (static and grid schedules)."""
        table = self._level_table(x) if table is None else table
        if self.mode == "grid":
            coord = {}
            for i in self.parallel:
                lv = self.spec.levels[i]
                _, pos, trip = table[i]
                coord[lv.axis] = pos // np.maximum(1, -(-trip // lv.teams))
            shape = np.shape(x["a"])
            row, col, layer = (coord.get(a, np.zeros(shape, np.int64)) for a in "RCL")
            rows, cols, _ = self.grid
            return {"tid": layer * rows * cols + row * cols + col, "row": row, "col": col, "layer": layer}
        tid = self.thread(x)
        zero = np.zeros_like(tid)
        return {"tid": tid, "row": zero, "col": zero, "layer": zero}

    def hook_tvars(self, t):
        """``thread()`` coordinates of threads ``t`` in an init/fini hook."""
        t = np.asarray(t, np.int64)
        if self.mode == "grid":
            rows, cols, _ = self.grid
            return {"tid": t, "layer": t // (rows * cols), "row": t % (rows * cols) // cols, "col": t % cols}
        zero = np.zeros_like(t)
        return {"tid": t, "row": zero, "col": zero, "layer": zero}
