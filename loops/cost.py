"""A cost model of loop nests: the predicted seconds of a spec without compiling or running it.

The tuner uses it to rank thousands of (spec, block sizes) candidates so that only the most
promising are timed. For one loop kernel on given arrays the body is traced once: its kernel calls,
the bytes each operand touches, and how far each operand's offset moves per step of each loop.
For a spec the model then walks the nest from the innermost level outward and counts the distinct
bytes one execution of each level touches (its working set). For each cache level (sizes from
:func:`isa.cpu.caches`), the innermost loop whose working set no longer fits brings everything it
touches in again on every one of its executions; those bytes cost their time at the bandwidth of
the level beyond. A kernel call costs what it was measured to cost with its operands hot (or its
flops at the core's peak), so what happens inside one call is the kernel's business and the model
counts only the traffic between calls. Per thread: a parallel run of loops is divided among the
threads, the shared last-level cache too; the nest takes as long as its busiest thread.

>>> import numpy as np, tppasm as tpp
>>> from loops import Loop, kernel
>>> gemm = tpp.brgemm(m=32, n=32, k=32, beta=1)
>>> @kernel("aBC", Loop(0, 4), Loop(0, 8), Loop(0, 8))
... def mm(ik, im, jn, A, B, C):
...     gemm(A[im, ik:ik + 1], B[jn, ik:ik + 1], C[im, jn], count=1)
>>> A = B = np.zeros((8, 4, 32, 32), np.float32); C = np.zeros((8, 8, 32, 32), np.float32)
>>> model = Model(mm, (A, B, C), Machine.assumed(threads=1))
>>> model.predict("aBC").seconds > 0, model.predict("BCa").seconds <= model.predict("aBC").seconds
(True, True)
"""
import functools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from isa.cpu import caches

from .spec import LETTERS, parse
from .trace import trace

OVERLAP = 0.5          # share of the memory time hidden behind the kernels' compute (prefetchers)
FILL = 0.75            # share of a cache a working set may fill and still stay (associativity, others)
LAUNCH_SECONDS = 3e-6  # starting a nest on the pool and joining it


@dataclass(frozen=True)
class Machine:
    """What the model knows of the host: ``caches`` (:class:`isa.cpu.Cache`, innermost first),
    ``bandwidth`` (bytes/s one core moves from cache level 2, 3, ... and from memory: one entry per
    cache level, the level that serves its misses), ``flops`` (one core's fp32 peak, for kernels
    whose time is not measured) and the ``threads`` a parallel nest runs on."""

    caches: tuple
    bandwidth: tuple
    flops: float
    threads: int = 1

    @staticmethod
    def assumed(threads=1, cache_levels=None):
        """The host's caches with round figures for the rest (no measurement: for tests and docs).

        >>> Machine.assumed().bandwidth[0] > Machine.assumed().bandwidth[-1]
        True
        """
        return Machine(tuple(cache_levels or caches()), (64e9, 32e9, 16e9), 100e9, threads)

    @staticmethod
    def host(threads=1):
        """The host's caches and the bandwidths measured here (once per process, ~0.2 s)."""
        return Machine(caches(), _measured_bandwidth(), _assumed_flops(), threads)


# bytes per array of the bandwidth probes (2 x a 32 MiB L3: as before for such hosts); a VM shown its
# whole socket's L3 (480 MiB on a Xeon guest) took 4-7 s over two 960 MiB arrays, 0.6 s capped
L3_PROBE_MAX, MEMORY_PROBE_MAX = 32 << 20, 64 << 20


@functools.lru_cache(maxsize=1)
def _measured_bandwidth():
    """Bytes/s of a tppasm copy whose two arrays sit in L2, in L3, and in memory (read + write);
    each array at most ``L3_PROBE_MAX`` / ``MEMORY_PROBE_MAX`` bytes, so where the OS reports an
    L3 larger than that (a VM shown its whole socket's) "memory" is partly that L3."""
    import tppasm as tpp
    from tppasm.timing import calibrate, time_runs
    levels = caches()
    out = []
    for size in (levels[1].size // 4, min(levels[-1].size // 4, L3_PROBE_MAX),
                 min(2 * levels[-1].size, MEMORY_PROBE_MAX)):
        cols = 1024
        rows = max(1, size // (4 * cols))
        src, dst = tpp.empty((rows, cols)), tpp.empty((rows, cols))
        src[...] = 1
        copy = tpp.copy(rows, cols)
        call = functools.partial(copy, src, dst)
        seconds = min(time_runs(call, calibrate(call, 0.01), 3))
        out.append(2 * src.nbytes / seconds)
    return tuple(out)


def _assumed_flops():
    """fp32 flop/s of one core for kernels whose time is not measured: 2 FMA units of the vector width."""
    from isa.cpu import host
    lanes = {"avx512": 16, "amx": 16, "avx2": 8}.get(host().isa, 4)
    return 2 * 2 * lanes * 3.0e9


@dataclass(frozen=True)
class Access:
    """One operand of a call: ``array`` index, ``offset`` (affine in the loop letters, elements),
    ``bytes`` touched, ``run`` = contiguous bytes per row, ``rows``, ``itemsize``, and whether the
    call writes it (then its bytes also travel back out)."""

    array: int
    offset: object
    bytes: int
    run: int
    rows: int
    itemsize: int
    written: bool = False

    def coef(self, letter):
        return dict(self.offset.terms).get(letter, 0)


@dataclass
class Estimate:
    """A prediction: ``seconds`` in all, of which ``compute`` (kernel calls) and ``memory`` (traffic
    between calls, before overlap); ``traffic`` = bytes brought into each cache level."""

    seconds: float
    compute: float
    memory: float
    traffic: tuple = field(default_factory=tuple)


def _footprint(spec, count, itemsize):
    """(bytes, contiguous bytes per row, rows) that one operand of a call touches."""
    shape, strides = spec.full_shape(count), spec.strides
    if any(d == 0 for d in shape):
        return 0, 0, 0
    dims = [(d, s) for d, s in zip(shape, strides) if d > 1] or [(1, 1)]
    run, inner = 1, 1                  # fold dimensions that are contiguous with the ones inside
    while dims and dims[-1][1] == inner:
        d, s = dims.pop()
        run *= d
        inner = d * s
    rows = math.prod(d for d, _ in dims)
    return rows * run * itemsize, run * itemsize, rows


def _path_share(path, loops):
    """The fraction of iterations on which a call's ``path`` of index tests holds (sampled)."""
    if not path:
        return 1.0
    letters = sorted({v for test, _ in path for v in test.expr.vars()})
    if any(v not in LETTERS[:len(loops)] for v in letters):
        return 0.5                      # a test on thread coordinates: unknown, count half
    grids = np.meshgrid(*[_sample(loops[LETTERS.index(v)]) for v in letters], indexing="ij")
    env = {v: g.ravel() for v, g in zip(letters, grids)}
    mask = np.ones(grids[0].size if grids else 1, bool)
    for test, outcome in path:
        mask &= test.holds(env) == outcome
    return float(mask.mean())


def _sample(lp, most=256):
    values = np.arange(lp.start, lp.end, lp.step, dtype=np.int64)
    if values.size > most:
        values = values[np.linspace(0, values.size - 1, most).astype(np.int64)]
    return values if values.size else np.array([lp.start], np.int64)


class Model:
    """Predicted seconds of ``lk`` on ``arrays`` for any spec (see the module docstring).

    ``kernel_seconds(kernel, scalars)`` gives one call's time with its operands hot (default
    :func:`flop_seconds`: from its work alone).
    """

    def __init__(self, lk, arrays, machine, kernel_seconds=None):
        self.lk, self.machine = lk, machine
        self.loops = tuple(lk.loops)
        tree = trace(lk.body, lk.index_names, arrays, lk.array_names)
        self.array_bytes = [a.nbytes for a in arrays]
        per_call = kernel_seconds or (lambda kernel, scalars: flop_seconds(kernel, scalars, machine))
        self.compute, unique = 0.0, {}
        for call in tree.all_calls():
            count = dict(zip(call.kernel.scalars, call.scalars)).get(call.kernel.desc.count_scalar, 1)
            share = _path_share(call.path, self.loops)
            self.compute += share * per_call(call.kernel, call.scalars)
            for spec, (arg, offset) in zip(call.kernel.operands, call.args):
                size, run, rows = _footprint(spec, count, arrays[arg].itemsize)
                key = (arg, offset.terms, offset.const, size)
                written = spec.writable or (key in unique and unique[key].written)
                unique[key] = Access(arg, offset, size, run, rows, arrays[arg].itemsize, written)
        self.accesses = list(unique.values())
        self.body_bytes = sum(a.bytes for a in self.accesses)
        # per loop: (access number, bytes its offset moves per index unit) of the accesses it moves
        self.moves = [[(j, abs(a.coef(LETTERS[k])) * a.itemsize) for j, a in enumerate(self.accesses)
                       if a.coef(LETTERS[k])] for k in range(len(self.loops))]
        self.weights = [2 if a.written else 1 for a in self.accesses]

    def predict(self, spec):
        """An :class:`Estimate` for ``spec`` (text; raises :class:`loops.SpecError` if invalid)."""
        parsed = _parse(spec, len(self.loops))
        trips, strides = _level_trips(parsed, self.loops)
        threads = self.machine.threads if parsed.mode != "serial" else 1
        trips, busy = _share(parsed, trips, threads)
        n = len(trips)
        # distinct bytes of each operand over one execution of levels i..n-1, innermost outward
        sizes = [a.bytes for a in self.accesses]
        weights, accesses = self.weights, self.accesses
        working, moving = [0.0] * (n + 1), [0.0] * (n + 1)
        working[n] = float(self.body_bytes)
        moving[n] = float(sum(w * b for w, b in zip(weights, sizes)))
        for i in range(n - 1, -1, -1):
            t = trips[i]
            if t <= 1:
                working[i], moving[i] = working[i + 1], moving[i + 1]
                continue
            for j, unit in self.moves[parsed.levels[i].loop]:
                acc, move = accesses[j], unit * strides[i]
                if move >= acc.run or move >= acc.bytes:
                    grown = t * sizes[j]
                else:                             # overlapping windows: only the new part of each row
                    grown = sizes[j] + (t - 1) * move * acc.rows
                sizes[j] = min(grown, self.array_bytes[acc.array])
            working[i] = sum(sizes)
            moving[i] = sum(w * b for w, b in zip(weights, sizes))
        runs = [1.0] * (n + 1)                    # executions of the sub-nest that starts at level i
        for i in range(n):
            runs[i + 1] = runs[i] * trips[i]
        compute = runs[n] * self.compute
        memory, traffic = 0.0, []
        levels = self.machine.caches
        for c, cache in enumerate(levels):
            size = cache.size * FILL / (min(busy, cache.shared) if cache.shared > 1 else 1)
            if working[n] > size or working[0] <= size:
                traffic.append(0.0)              # inside one call (the kernel's time has it), or all fits
                continue
            q = max(i for i in range(n + 1) if working[i] > size)
            moved = moving[q] * runs[q]
            traffic.append(moved)
            bandwidth = self.machine.bandwidth[min(c, len(self.machine.bandwidth) - 1)]
            if c == len(levels) - 1 and busy > 1:
                bandwidth *= min(1.0, 1.2 / busy)        # memory bandwidth is shared by the threads
            memory += moved / bandwidth
        seconds = max(compute, memory) + (1 - OVERLAP) * min(compute, memory) + LAUNCH_SECONDS
        return Estimate(seconds, compute, memory, tuple(traffic))


def flop_seconds(kernel, scalars, machine):
    """One call's time from its work alone: a BRGEMM's 2mnk flops per batch entry at the core's
    peak, any other kernel's operand bytes at the L2 bandwidth.

    >>> import tppasm as tpp
    >>> flop_seconds(tpp.brgemm(m=10, n=10, k=10), (2,), Machine.assumed()) * 1e9
    40.0
    """
    desc = kernel.desc
    count = dict(zip(kernel.scalars, scalars)).get(desc.count_scalar, 1)
    if desc.kind == "brgemm":
        return 2 * desc.m * desc.n * desc.k * count / machine.flops
    return sum(s.nbytes(count) for s in kernel.operands) / machine.bandwidth[0]


_parse = functools.lru_cache(maxsize=1 << 16)(parse)      # specs repeat across the tuner's configurations


def _level_trips(parsed, loops):
    """Average trip count and index stride of every level of the nest (baked bounds applied; a spec
    that blocks a loop more often than it has block sizes raises :class:`loops.SpecError`)."""
    trips, strides = [], []
    done = {}
    for lv in parsed.levels:
        lp = loops[lv.loop]
        start, end, step, blocks = parsed.bake[lv.loop]
        start, end = lp.start if start is None else start, lp.end if end is None else end
        step, blocks = lp.step if step is None else step, lp.blocks if blocks is None else blocks
        span = max(0, end - start)
        if not lv.last and lv.occurrence >= len(blocks):
            parsed.resolve(loops)                     # raises the error that says what is missing
        stride = step if lv.last else blocks[lv.occurrence]
        count = -(-span // stride) if span else 0
        outer = done.get(lv.loop)
        trips.append(count / outer if outer else float(count))
        strides.append(stride)
        done[lv.loop] = max(count, 1)
    return trips, strides


def _share(parsed, trips, threads):
    """Trips of the busiest thread's nest, and how many threads have work."""
    trips = list(trips)
    if threads <= 1:
        return trips, 1
    if parsed.mode == "grid":
        busy = 1
        for i, lv in enumerate(parsed.levels):
            if lv.axis and lv.occurrence == 0:
                busy *= min(lv.teams, max(1, math.ceil(trips[i])))
                trips[i] = math.ceil(trips[i] / lv.teams)
        return trips, min(busy, threads)
    first, last = parsed.run
    total = math.prod(trips[first:last + 1])
    busy = max(1, min(threads, int(total)))
    left = math.ceil(total / threads)
    for i in range(first, last + 1):
        inner = math.prod(trips[i + 1:last + 1])
        trips[i] = min(trips[i], max(1.0, left / inner)) if inner else 0.0
        left /= trips[i] or 1.0
    return trips, busy


def time_kernel(kernel, scalars, loop_kernel_type, seconds=0.005):
    """One call's seconds of ``kernel`` with its operands hot, called from a native loop (no Python
    per call): ``loop_kernel_type`` is :class:`loops.LoopKernel` (passed in: this module sits below it).

    >>> import tppasm as tpp
    >>> from loops import LoopKernel
    >>> time_kernel(tpp.zero(16, 16), (), LoopKernel) < 1e-3
    True
    """
    from .spec import Loop
    count = dict(zip(kernel.scalars, scalars)).get(kernel.desc.count_scalar, 1)
    arrays = []
    for spec in kernel.operands:
        shape, strides = spec.full_shape(count), spec.strides
        dt = spec.np_dtype
        span = 1 + sum((d - 1) * s for d, s in zip(shape, strides)) if all(shape) else 1
        base = np.zeros(span + 64 // dt.itemsize, dt)
        start = (-base.ctypes.data % 64) // dt.itemsize
        arrays.append(np.lib.stride_tricks.as_strided(base[start:], shape, [s * dt.itemsize for s in strides]))
    extra = dict(zip(kernel.scalars, scalars))
    call = (lambda *views: kernel(*views, **extra)) if extra else kernel
    body = _BODIES[len(arrays)](call)
    t = time.perf_counter()
    for _ in range(20):
        call(*arrays)
    guess = (time.perf_counter() - t) / 20          # with Python's calling cost: an upper bound
    reps = int(min(1 << 20, max(16, seconds / max(guess, 1e-8))))
    lk = loop_kernel_type("a", (Loop(0, reps),), body)
    lk(*arrays)
    best = float("inf")
    for _ in range(3):                  # the calling thread's CPU time: another process may preempt it
        t = time.thread_time()
        lk(*arrays)
        best = min(best, time.thread_time() - t)
    return best / reps


# a body with one named parameter per operand: the tracer reads the arrays from the signature
_BODIES = {
    1: lambda f: lambda i, x0: f(x0),
    2: lambda f: lambda i, x0, x1: f(x0, x1),
    3: lambda f: lambda i, x0, x1, x2: f(x0, x1, x2),
    4: lambda f: lambda i, x0, x1, x2, x3: f(x0, x1, x2, x3),
    5: lambda f: lambda i, x0, x1, x2, x3, x4: f(x0, x1, x2, x3, x4),
    6: lambda f: lambda i, x0, x1, x2, x3, x4, x5: f(x0, x1, x2, x3, x4, x5),
}
