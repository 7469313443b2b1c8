"""The ``kernel`` decorator: a loop body + loop declarations + a spec -> a native parallel nest.

>>> import numpy as np
>>> from tppasm.eltwise import Unary
>>> from tppasm.kernel import get_kernel
>>> from loops import Loop, kernel
>>> relu = get_kernel(Unary("relu", 4, 8, ldi=16, ldo=16))
>>> @kernel("Ab", Loop(0, 4), Loop(0, 2))
... def blocks(i, j, X, Y):
...     relu(X[i, :, 8 * j:8 * j + 8], Y[i, :, 8 * j:8 * j + 8])
>>> X = np.random.randn(4, 4, 16).astype(np.float32); Y = np.empty_like(X)
>>> blocks(X, Y); bool((Y == np.maximum(X, 0)).all())
True
"""
import ctypes
import inspect
import os
import threading
import warnings
import weakref

import numpy as np

import isa.pool as pool_module
from isa.cpu import host
from isa.x86 import Function, qword, rax
from isa.x86.function import INT_ARGS
from tppasm.dtypes import name_of
from tppasm.kernel import ISAUnavailableError
from tppasm.operand import OperandSpec, data_address, mark_written
from tppasm.x86.entry import NATIVE_CHECKS, build_entry

from . import display, races as _races
from .bind import arity, box_of, check_grid, traced_trees
from .body import check_body as _check_body, parameters as _parameters
from .explain import explain
from .nest_plan import Layout
from .recent import NESTS, VARIANTS, Recent
from .signature import as_arrays, signature, written_objects
from .spec import LETTERS, Loop, SpecError, parse, serial_order
from .trace import PyArray, TraceError, run_python


# The nest generator of the host; both run on the native pool (isa.pool picks its machine code).
ON_AARCH64 = host().arch == "aarch64"
if ON_AARCH64:                 # only the host's generator is imported (the other toolchain: ~40 ms)
    from .aarch64 import nest as GENERATOR
else:
    from .x86 import nest as GENERATOR


def kernel(spec, *loops, pool=None, races="refuse"):
    """Decorate ``body(i_a, i_b, ..., *arrays)``: loop ``a`` is ``loops[0]`` and so on.

    ``pool`` overrides the process's thread pool (:func:`isa.pool.get_pool`). ``races`` says what
    the first call does when the spec lets two iterations that may run at the same time touch the
    same block, one writing (:mod:`loops.races`): ``"refuse"`` raises :class:`loops.races.RaceError`
    naming the pair and the fixes, ``"warn"`` issues a :class:`loops.races.RaceWarning` and runs,
    ``"allow"`` skips the analysis (for bodies that synchronize themselves, e.g. atomic kernels).

    >>> from loops import Loop, kernel
    >>> @kernel("a", Loop(0, 3))
    ... def nothing(i):
    ...     pass
    >>> nothing()
    """
    _check_pool(pool)
    _check_races(races)

    def wrap(body):
        return LoopKernel(spec, loops, body, pool=pool, races=races)
    return wrap


def _check_pool(pool):
    if pool is not None and not isinstance(pool, pool_module.Pool):
        raise TypeError(f"pool={pool!r}: expected an isa.pool.Pool (e.g. Pool(4)) or None for the process's "
                        "pool (isa.pool.get_pool())")


def _check_races(races):
    if races not in _races.MODES:
        raise ValueError(f"races={races!r}: expected one of {', '.join(map(repr, _races.MODES))}")


_ALL = weakref.WeakSet()       # every loop kernel: set_num_threads drops their compiled nests


def _forget_nests():
    for lk in list(_ALL):
        if lk.pool_override is None:
            lk._bound.clear()
            lk._fast = lk._last = None


pool_module.ON_NEW_POOL.append(_forget_nests)


class LoopKernel:
    """A traced-and-compiled loop nest; call it on arrays. See :func:`kernel`."""

    def __init__(self, spec, loops, body, pool=None, hooks=None, races="refuse"):
        _check_body(body)
        _check_pool(pool)
        _check_races(races)
        for lp in loops:
            if not isinstance(lp, Loop):
                raise SpecError(f"loop declarations must be Loop(start, end, step=1, blocks=[...]), got {lp!r}")
        name = getattr(body, "__name__", type(body).__name__)
        params = _parameters(body)
        if len(params) < len(loops):
            raise SpecError(f"{name} declares {len(params)} parameters but {len(loops)} loops: its first "
                            f"{len(loops)} parameters receive the loop indices, the rest the arrays")
        self.body, self.loops, self.pool_override, self.races = body, tuple(loops), pool, races
        self.index_names, self.array_names = params[:len(loops)], params[len(loops):]
        self.spec = parse(spec, len(loops))
        self.resolved = self.spec.resolve(self.loops)
        self.hooks = hooks if hooks is not None else {"init": [], "fini": [], "family": weakref.WeakSet()}
        self.hooks["family"].add(self)            # every live variant: a new hook invalidates all their nests
        self._tuned = {}          # (array signature, thread count) -> tuned spec; this kernel's alone
        self._bound, self._variants, self._last, self._fast = Recent(NESTS), Recent(VARIANTS), None, None
        self.__name__, self.__doc__ = name, body.__doc__
        P = inspect.Parameter           # what inspect.signature(loop_kernel) shows: the arrays
        self.__signature__ = inspect.Signature([P(n, P.POSITIONAL_ONLY) for n in self.array_names])
        _ALL.add(self)

    # -- hooks and variants -------------------------------------------------------------------
    def init(self, fn):
        """Register ``fn(*arrays)`` to run once per thread before the nest (e.g. AMX tile config).

        >>> from loops import Loop, kernel
        >>> @kernel("a", Loop(0, 1))
        ... def k(i): pass
        >>> @k.init
        ... def setup(): pass
        """
        _check_body(fn)
        _parameters(fn, varargs=True)
        self.hooks["init"].append(fn)
        self._invalidate()
        return fn

    def fini(self, fn):
        """Register ``fn(*arrays)`` to run once per thread after the nest."""
        _check_body(fn)
        _parameters(fn, varargs=True)
        self.hooks["fini"].append(fn)
        self._invalidate()
        return fn

    def _invalidate(self):
        for member in list(self.hooks["family"]):
            member._bound.clear()
            member._fast = member._last = None

    def with_spec(self, spec, pool=None, races=None):
        """The same body and loops with another spec (cached per spec), run even where tune chose another.

        >>> from loops import Loop, kernel
        >>> @kernel("ab", Loop(0, 2), Loop(0, 2))
        ... def k(i, j): pass
        >>> k.with_spec("ba").spec.text
        'ba'
        """
        races = self.races if races is None else races
        key = (spec, pool, races)
        v = self._variants.get(key)
        if v is None:
            v = self._variants[key] = LoopKernel(spec, self.loops, self.body, pool or self.pool_override,
                                                 self.hooks, races)
        return v

    @property
    def pool(self):
        if self.pool_override is not None:
            return self.pool_override
        from isa.pool import get_pool
        return get_pool()

    # -- running ------------------------------------------------------------------------------
    def __call__(self, *arrays):
        fast = self._fast
        if fast is not None and fast.try_fast(arrays):
            return
        objs, arrays = arrays, as_arrays(arrays, self.array_names, self.__name__)
        key = signature(arrays)
        best = self._tuned.get((key, self.pool.nthreads)) if self._tuned else None
        if best is not None and best != self.spec.text:
            self._fast = None
            return self.with_spec(best)(*objs)
        inst = self._current(arrays, key)
        written = () if objs is arrays else written_objects(objs, inst.writes, self.array_names, self.__name__)
        inst.run(arrays)
        mark_written(written)

    def _check_count(self, arrays):
        if len(arrays) != len(self.array_names):
            raise TypeError(f"{self.__name__} takes {len(self.array_names)} arrays "
                            f"({', '.join(self.array_names)}), got {len(arrays)}")

    def _current(self, arrays, key):
        """The nest compiled for ``key``, bound now if there is none or if it was compiled for a
        process pool that was replaced (set_num_threads) or closed since."""
        for _ in range(3):          # (not forever: a body that calls set_num_threads may replace it each time)
            inst = self._bound.get(key) or self._bind(arrays, key)
            self._fast = inst if inst.entry is not None else None
            # checked after storing it: a pool replaced after this check is followed by
            # _forget_nests, which drops what was stored (no lock on the call path)
            if not inst.outdated():
                return inst
            pool_module.get_pool()          # replaces a closed one, which drops every nest built for it
            self._bound.pop(key, None)
        return inst

    def _bind(self, arrays, key):
        self._check_count(arrays)
        inst = self._bound[key] = _Instance(self, arrays)
        self._last = inst
        return inst

    def python(self, *arrays):
        """Run the body in Python, kernels replaced by their NumPy references, in serial spec order.

        ``thread()`` reads 0 for every coordinate here.

        >>> import numpy as np, tppasm as tpp
        >>> from loops import Loop, kernel
        >>> zero = tpp.zero(1, 2)
        >>> @kernel("A", Loop(0, 3))
        ... def clear(i, X):
        ...     zero(X[i:i + 1])
        >>> X = np.ones((3, 2), np.float32); clear.python(X); float(X.sum())
        0.0
        """
        arrays = as_arrays(arrays, self.array_names, self.__name__)
        self._check_count(arrays)
        signature(arrays)                     # TypeError unless NumPy arrays
        views = [a.view(PyArray) for a in arrays]
        for fn in self.hooks["init"]:
            run_python(fn, views[:arity(fn)])
        for idx in serial_order(self.spec, self.loops):
            run_python(self.body, list(idx) + views)
        for fn in self.hooks["fini"]:
            run_python(fn, views[:arity(fn)])

    def explain(self, *arrays):
        """The nest as pseudo-code for each thread (traced on ``arrays``, else on the last call's).

        >>> from loops import Loop, kernel
        >>> @kernel("ba", Loop(0, 2), Loop(0, 3))
        ... def k(i, j): pass
        >>> print(k.explain())
        # nest 'ba': serial: runs on the calling thread only
        def thread_body(tid):
          for j in range(0, 3, 1):
            for i in range(0, 2, 1):
              k(i, j, ...)
        """
        arrays = as_arrays(arrays, self.array_names, self.__name__)
        inst = self._bind(arrays, signature(arrays)) if arrays else self._last
        return explain(self, inst)

    def accesses(self, *arrays):
        """How the nest uses each array (by parameter name): "read", "written" or "read and
        written", from the operands of the kernel calls in its body and hooks. An array only
        written (no call reads it) is an output that every run overwrites.

        >>> import numpy as np, tppasm as tpp
        >>> from loops import Loop, kernel
        >>> relu = tpp.relu(1, 4)
        >>> @kernel("A", Loop(0, 3))
        ... def k(i, X, Y):
        ...     relu(X[i:i + 1], Y[i:i + 1])
        >>> X = np.zeros((3, 4), np.float32)
        >>> k.accesses(X, np.empty_like(X))
        {'X': 'read', 'Y': 'written'}
        """
        arrays = as_arrays(arrays, self.array_names, self.__name__)
        key = signature(arrays)
        inst = self._bound.get(key) or self._bind(arrays, key)
        read, written = set(), set()
        for tree in (inst.body, inst.init, inst.fini):
            for call in tree.all_calls():
                alloc = set(call.kernel.desc.allocated())
                for spec, (arg, _) in zip(call.kernel.operands, call.args):
                    if spec.writable:
                        written.add(arg)
                    if not spec.writable or spec.name not in alloc:
                        read.add(arg)
        words = {(True, False): "read", (False, True): "written", (True, True): "read and written",
                 (False, False): "unused"}
        return {name: words[i in read, i in written] for i, name in enumerate(self.array_names)}

    def tune(self, *arrays, **options):
        """Time candidate specs on ``arrays`` and remember the fastest for these shapes; see :func:`loops.tune.tune`."""
        from .tune import tune
        return tune(self, as_arrays(arrays, self.array_names, self.__name__), **options)

    def __repr__(self):
        return display.loop_kernel_repr(self)

    def _repr_html_(self):
        return display.loop_kernel_html(self)


_INSTANCES = weakref.WeakSet()      # every compiled nest: its context lock is renewed in a forked child


def _after_fork_in_child():
    for inst in list(_INSTANCES):
        inst.lock = threading.Lock()   # a parent's thread held it at the fork: it would stay taken


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Instance:
    """One compiled nest for one array signature: trace, checks, code, context template."""

    def __init__(self, lk, arrays):
        self.lk, spec = lk, lk.spec
        self.parallel = spec.mode != "serial"
        pool = lk.pool if self.parallel else None
        self.nthreads = pool.nthreads if pool else 1
        check_grid(spec, self.nthreads, lk.pool_override is not None)
        traced = traced_trees(lk, arrays)
        calls = [c for t in traced for c in t.all_calls()]
        self.kernels = list({id(c.kernel): c.kernel for c in calls}.values())
        self.lacking = sorted({k.isa for k in self.kernels if not getattr(k, "runnable", True)})
        box = box_of(lk.resolved, spec, self.nthreads)
        self.body, self.init, self.fini = (t.simplify(box) for t in traced)
        _check_calls(lk, arrays, self.body, self.init, self.fini, box)
        _check_int64(lk, arrays, (self.body, self.init, self.fini), box)
        if lk.races != "allow":
            _check_races_of(lk, arrays, self)
        self.layout = Layout(len(arrays), len(self.kernels), len(lk.loops))
        itemsizes = [a.itemsize for a in arrays]
        self.code = GENERATOR.build(spec, lk.resolved, self.body, self.init, self.fini, self.layout, itemsizes,
                               self.kernels)
        bfn, bstate = (pool.barrier_fn, pool.barrier_state) if pool else (0, 0)
        self.ctx = self.layout.template(lk.resolved, [k.raw_address for k in self.kernels], bfn, bstate)
        self.ctx_address = ctypes.addressof(self.ctx)
        self.pool = pool
        self.lock = threading.Lock()
        _INSTANCES.add(self)
        self.first_array = self.layout.array(0) // 8
        self.writes = {arg for c in calls for spec, (arg, _) in zip(c.kernel.operands, c.args) if spec.writable}
        self.entry = self._fast_entry(arrays, self.writes)

    def _fast_entry(self, arrays, writes):
        """A native stub that checks the arrays against this signature and stores their data pointers.

        Reuses the kernels' native entry (:func:`tppasm.x86.entry.build_entry`) with one operand per
        whole array; its "kernel" is a trampoline that writes the pointers into the context block.
        Past 6 arrays (the argument registers) the stub writes them there itself (the Python launch
        it spares cost a 9-array attention nest 24 µs a call with an empty body, now 3.5 µs).
        """
        if not NATIVE_CHECKS or ON_AARCH64 or not arrays:
            return None
        try:
            specs = [OperandSpec(f"arg{i}", name_of(a.dtype), a.shape, tuple(s // a.itemsize for s in a.strides),
                                 writable=i in writes) for i, a in enumerate(arrays)]
        except (KeyError, TypeError):
            return None
        in_registers = len(arrays) <= len(INT_ARGS)
        store = Function("loops.store", ["ptr"] * len(arrays) if in_registers else [])
        st = store.asm
        st.mov(rax, self.ctx_address)
        for i, reg in enumerate(store.args):
            st.mov(qword[rax + self.layout.array(i)], reg)
        st.mov(qword[rax + Layout.COUNTER], 0)
        self._store = store.finalize()
        # no overlap check: a nest may update an array in place (the same array as input and output)
        self._entry_code = build_entry("loops", specs, (), self._store.address, overlap=False,
                                       store=None if in_registers else self.ctx_address + self.layout.array(0))
        if self._entry_code is None:
            return None
        return ctypes.PYFUNCTYPE(ctypes.c_int32, ctypes.py_object)(self._entry_code.address)

    def launch(self, address):
        if self.lacking:
            raise ISAUnavailableError(f"the nest calls {', '.join(self.lacking)} kernels this host cannot run; "
                                      "build them for its ISA (leave isa= unset) or run the nest on such a host")
        if self.pool is None:
            self.code(address, 0, 1)
        else:
            self.pool.run(self.code.address, address)

    def try_fast(self, arrays):
        """Run on ``arrays`` if they match this instance's signature (native check); else False
        (also when the process's pool was closed or replaced: the caller binds again)."""
        if not self.lock.acquire(False):
            return False
        try:
            if self.entry(arrays):
                return False
            self.launch(self.ctx_address)
            return True
        except (ValueError, RuntimeError):      # the pool's "closed" or "already inside this pool"
            if self.outdated():
                return False
            raise
        finally:
            self.lock.release()

    def outdated(self):
        """Whether this nest runs on a process pool that was closed or replaced since it was built."""
        return self.pool is not None and self.lk.pool_override is None and not pool_module.is_current(self.pool)

    def run(self, arrays):
        mine = self.lock.acquire(False)
        ctx = self.ctx if mine else self.layout.template(self.lk.resolved, [k.raw_address for k in self.kernels],
                                                         self.ctx[0], self.ctx[1])
        try:
            i = self.first_array
            for a in arrays:
                ctx[i] = data_address(a)
                i += 1
            ctx[Layout.COUNTER // 8] = 0
            self.launch(self.ctx_address if mine else ctypes.addressof(ctx))
        finally:
            if mine:
                self.lock.release()


def _check_races_of(lk, arrays, inst):
    found = _races.analyze(lk.spec, lk.resolved, inst.nthreads, arrays, lk.index_names, lk.array_names,
                           inst.body, inst.init, inst.fini, first_only=True)
    if not found:
        return
    fixes = _races.fixes(lk, arrays, found[0], inst.nthreads)
    message = _races.describe(lk.spec, found[0], inst.nthreads, fixes)
    if lk.races == "warn":
        warnings.warn(message, _races.RaceWarning, stacklevel=5)
        return
    raise _races.RaceError(message, found, fixes)


# -- bind-time checks: every access stays inside its array, over every iteration ----------------

INT64 = 1 << 63            # native nests compute offsets and comparisons in int64

def _box(lk, spec, nthreads):
    """Range (inclusive) of every index and thread coordinate over the run of ``lk`` under ``spec``."""
    return box_of(lk.resolved, spec, nthreads)


class BoundsError(IndexError, ValueError):
    """An access in a loop body that reaches outside its array for some iteration, found when the
    nest is bound (its first call on arrays of these shapes), before any of it runs. The message
    names the access, the range it must stay in and an iteration where it does not. An IndexError
    (what NumPy raises for an index out of range) and a ValueError (a rejected shape).

    >>> import numpy as np, tppasm as tpp
    >>> from loops import BoundsError, Loop, kernel
    >>> relu = tpp.relu(1, 4)
    >>> k = kernel("a", Loop(0, 3))(lambda i, X, Y: relu(X[i + 1:i + 2], Y[i:i + 1]))
    >>> X = np.zeros((3, 4), np.float32)
    >>> try:
    ...     k(X, X.copy())
    ... except BoundsError as e:
    ...     print(str(e).split(";")[1])
     fails at i=2
    """


def _check_calls(lk, arrays, body, init, fini, box):
    if any(lp.trip == 0 for lp in lk.resolved):
        body = None                           # the body never runs
    for tree in (body, init, fini):
        if tree is None:
            continue
        for call in tree.all_calls():
            _check_call(lk, call, arrays, box)


def _check_call(lk, call, arrays, box):
    count = dict(zip(call.kernel.scalars, call.scalars)).get(call.kernel.desc.count_scalar, 1)
    needs = list(call.checks)
    for spec, (arg, offset) in zip(call.kernel.operands, call.args):
        a = arrays[arg]
        if spec.writable and not a.flags.writeable:
            raise ValueError(f"{call.text}: {lk.array_names[arg]} is read-only but the kernel writes it; pass a "
                             "writable array")
        item = a.itemsize
        lo_el = sum(min(0, (d - 1) * s // item) for d, s in zip(a.shape, a.strides))
        hi_el = sum(max(0, (d - 1) * s // item) for d, s in zip(a.shape, a.strides))
        extent = sum((d - 1) * s for d, s in zip(spec.full_shape(count), spec.strides))
        if 0 in a.shape:
            lo_el, hi_el = 0, -1
        needs.append((offset, lo_el, hi_el - extent,
                      f"{call.text}: operand {spec.name} reaches outside {lk.array_names[arg]} {a.shape}"))
    for expr, lo, hi, message in needs:
        low, high = expr.bounds(box)
        if lo <= low and high <= hi:
            continue
        bad = _counterexample(expr, lo, hi, call.path, box, lk)
        if bad is not None:
            allowed = f">= {lo}" if hi >= 1 << 61 else f"in [{lo}, {hi}]"
            raise BoundsError(f"out of bounds: {message}: {expr} must be {allowed}; fails at {bad}")


def _counterexample(expr, lo, hi, path, box, lk):
    """An iteration where ``lo <= expr <= hi`` fails on the call's path, or None (exact when small)."""
    loop_vars = list(LETTERS[:len(lk.loops)])
    uses_thread = expr.vars() | {v for t, _ in path for v in t.expr.vars()}
    if np.prod([lp.trip for lp in lk.resolved], dtype=float) > 1 << 22 or uses_thread - set(loop_vars):
        return _describe(expr, box, lk)           # conservative: over the box of index values
    grids = np.meshgrid(*[np.arange(lp.start, lp.end, lp.step) for lp in lk.resolved], indexing="ij")
    env = dict(zip(loop_vars, (g.ravel() for g in grids)))
    if max([expr.magnitude(box)] + [t.expr.magnitude(box) for t, _ in path]) >= INT64:
        env = {v: g.astype(object) for v, g in env.items()}      # int64 would overflow: Python ints
    mask = np.ones(grids[0].size if grids else 1, bool)
    for test, outcome in path:
        mask &= test.holds(env) == outcome
    vals = np.broadcast_to(expr.evaluate(env), mask.shape)
    bad = mask & ((vals < lo) | (vals > hi))
    if not bad.any():
        return None
    j = int(np.argmax(bad))
    return ", ".join(f"{n}={int(env[v][j])}" for n, v in zip(lk.index_names, loop_vars))


def _check_int64(lk, arrays, trees, box):
    """ValueError unless the native nest's 64-bit arithmetic is exact: each byte offset of a call and
    each compared expression, evaluated term by term over every iteration, stays within +-2**63."""
    names = dict(zip(LETTERS, lk.index_names))
    fix = ("shift the loop to start near 0 (Loop(0, n) with X[i] rather than Loop(b, b + n) with "
           "X[i - b]), or use smaller constants")
    if any(lp.trip == 0 for lp in lk.resolved):
        trees = trees[1:]                     # the body never runs (as in _check_calls)
    tests = {}
    for tree in trees:
        for call in tree.all_calls():
            for test, _ in call.path:
                tests[test.key()] = test
            for (arg, offset), spec in zip(call.args, call.kernel.operands):
                item = arrays[arg].itemsize
                reach = (offset * item).magnitude(box)
                if reach >= INT64:
                    raise ValueError(f"{call.text}: the byte offset of operand {spec.name} in "
                                     f"{lk.array_names[arg]} ({item} * ({offset})) reaches {reach} over the "
                                     f"loops' ranges ({_ranges(offset, box, names)}); native nests compute "
                                     f"byte offsets in 64-bit integers, within +-2**63: {fix}")
    for test in tests.values():
        reach = test.expr.magnitude(box)
        if reach >= INT64:
            raise ValueError(f"'if {test!r}': the comparison reaches {reach} over the loops' ranges "
                             f"({_ranges(test.expr, box, names)}); native nests compare in 64-bit integers, "
                             f"within +-2**63: {fix}")


def _ranges(expr, box, names):
    return ", ".join(f"{names.get(v, v)} in [{box[v][0]}, {box[v][1]}]" for v in sorted(expr.vars())) or "constant"


def _describe(expr, box, lk):
    names = dict(zip(LETTERS, lk.index_names))
    return "some iteration (" + ", ".join(f"{names.get(v, v)} in [{box[v][0]}, {box[v][1]}]"
                                         for v in sorted(expr.vars())) + ")"


__all__ = ["kernel", "LoopKernel", "Loop", "BoundsError", "SpecError", "TraceError"]
