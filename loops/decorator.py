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
import functools
import inspect
import os
import threading
import types
import warnings
import weakref

import isa.pool as pool_module
from isa.cpu import host
from isa.x86 import Function, edx, esi, qword, r12, rax, rbx, rdi, rsp
from isa.x86.function import INT_ARGS
from tppasm.dtypes import name_of
from tppasm.kernel import ISAUnavailableError
from tppasm.operand import OperandSpec, data_address, mark_written
from tppasm.x86.entry import NATIVE_CHECKS, build_entry, capi_address

from . import display, races as _races
from .bind import arity, box_of, check_grid, traced_trees
from .bounds import BoundsError, check_calls as _check_calls, check_int64 as _check_int64
from .body import check_body as _check_body, parameters as _parameters
from .explain import explain
from .nest_plan import Layout
from .recent import NESTS, VARIANTS, Recent
from .scratch import check_scratch
from .signature import as_arrays, signature, written_objects
from .spec import Loop, SpecError, parse, serial_order
from .tile_state import check_tile_state
from .trace import PyArray, TraceError, run_python


# The nest generator of the host; both run on the native pool (isa.pool picks its machine code).
ON_AARCH64 = host().arch == "aarch64"
if ON_AARCH64:                 # only the host's generator is imported (the other toolchain: ~40 ms)
    from .aarch64 import nest as GENERATOR
else:
    from .x86 import nest as GENERATOR


def kernel(spec, *loops, pool=None, races="refuse", scratch=()):
    """Decorate ``body(i_a, i_b, ..., *arrays)``: loop ``a`` is ``loops[0]`` and so on.

    ``pool`` overrides the process's thread pool (:func:`isa.pool.get_pool`). ``races`` says what
    the first call does when the spec lets two iterations that may run at the same time touch the
    same block, one writing (:mod:`loops.races`): ``"refuse"`` raises :class:`loops.races.RaceError`
    naming the pair and the fixes, ``"warn"`` issues a :class:`loops.races.RaceWarning` and runs,
    ``"allow"`` skips the analysis (for bodies that synchronize themselves, e.g. atomic kernels).
    ``scratch``: names of array parameters the body uses as working memory (e.g. one slot per
    thread, ``S[thread().tid]``), whose contents after a call are no result: the checker of
    :mod:`tppasm.testing` and the tuner leave them out of their comparisons (:mod:`loops.scratch`).

    The body is traced once per array signature (shapes, strides, dtypes), as ``jax.jit`` traces:
    its globals, closure values and the kernel objects it calls are read then and compiled into the
    nest, and later calls on such arrays do not run the Python body again. After changing one of
    them, call :meth:`LoopKernel.retrace` so the next call traces the body anew.

    >>> from loops import Loop, kernel
    >>> @kernel("a", Loop(0, 3))
    ... def nothing(i):
    ...     pass
    >>> nothing()
    """
    _check_pool(pool)
    _check_races(races)

    def wrap(body):
        return LoopKernel(spec, loops, body, pool=pool, races=races, scratch=scratch)
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


class _TuneMethod:
    """``LoopKernel.tune``: :func:`loops.tune.tune` on the kernel, with its options' signature and
    docstring (what ``help(lk.tune)`` and a notebook's ``lk.tune?`` show); :mod:`loops.tune` is
    imported on first use (it would cost every ``import loops``)."""

    def __get__(self, lk, owner=None):
        fn = _tune_method()
        return fn if lk is None else types.MethodType(fn, lk)


@functools.cache
def _tune_method():
    from . import tune as tuning

    def tune(self, *arrays, **options):
        return tuning.tune(self, as_arrays(arrays, self.array_names, self.__name__), **options)
    P = inspect.Parameter
    options = [p.replace(kind=P.KEYWORD_ONLY) for p in list(inspect.signature(tuning.tune).parameters.values())[2:]
               if p.kind != P.VAR_KEYWORD]
    tune.__signature__ = inspect.Signature([P("self", P.POSITIONAL_ONLY), P("arrays", P.VAR_POSITIONAL)] + options)
    tune.__doc__ = "``lk.tune(*arrays, ...)`` is ``loops.tune.tune(lk, arrays, ...)``: " + inspect.getdoc(tuning.tune)
    tune.__qualname__ = "LoopKernel.tune"
    return tune


class LoopKernel:
    """A traced-and-compiled loop nest; call it on arrays. See :func:`kernel`."""

    def __init__(self, spec, loops, body, pool=None, hooks=None, races="refuse", scratch=()):
        if isinstance(body, LoopKernel):
            raise TypeError(f"loop body {body.__name__!r} is already a loop kernel: decorate the plain body "
                            "function (or call k.with_spec(...) for the same body under another spec)")
        _check_body(body)
        _check_pool(pool)
        _check_races(races)
        for lp in loops:
            if not isinstance(lp, Loop):
                raise SpecError(f"loop declarations must be Loop(start, end, step=1, blocks=[...]), got {lp!r}")
        name = getattr(body, "__name__", None)
        if not isinstance(name, str):               # a callable object: its class names it
            name = type(body).__name__
        params = _parameters(body)
        if len(params) < len(loops):
            raise SpecError(f"{name} declares {len(params)} parameters but {len(loops)} loops: its first "
                            f"{len(loops)} parameters receive the loop indices, the rest the arrays")
        self.body, self.loops, self.pool_override, self.races = body, tuple(loops), pool, races
        self.index_names, self.array_names = params[:len(loops)], params[len(loops):]
        self.scratch = check_scratch(scratch, self.array_names, name)
        self.spec = parse(spec, len(loops))
        self.resolved = self.spec.resolve(self.loops)
        self.hooks = hooks if hooks is not None else {"init": [], "fini": [], "family": weakref.WeakSet()}
        self.hooks["family"].add(self)            # every live variant: a new hook invalidates all their nests
        self._tuned = {}          # (array signature, thread count) -> tuned spec; this kernel's alone
        self._ran_tuned = None    # the tuned variant the last call ran (explain() and the views show it)
        self._bound, self._variants, self._last, self._fast = Recent(NESTS), Recent(VARIANTS), None, None
        self.__name__, self.__doc__ = name, body.__doc__
        P = inspect.Parameter           # what inspect.signature(loop_kernel) shows: the arrays
        self.__signature__ = inspect.Signature([P(n, P.POSITIONAL_ONLY) for n in self.array_names])
        _ALL.add(self)

    # -- hooks and variants -------------------------------------------------------------------
    def init(self, fn):
        """Register ``fn(*arrays)`` to run before the nest once on each thread that takes part in it
        (e.g. AMX tile config): every thread of the pool for a parallel spec, the threads inside the
        grid for a grid spec (``B{R:2}a`` on 16 threads: 2; the others idle), the calling thread
        alone for a serial one. Per-thread state a hook sets up exists only for those threads.

        >>> from loops import Loop, kernel
        >>> @kernel("a", Loop(0, 1))
        ... def k(i): pass
        >>> @k.init
        ... def setup(): pass
        """
        _check_body(fn, "init hook")
        _parameters(fn, varargs=True, what="init hook")
        self.hooks["init"].append(fn)
        self._invalidate()
        return fn

    def fini(self, fn):
        """Register ``fn(*arrays)`` to run after the nest once on each thread that takes part in it
        (the threads :meth:`init` names)."""
        _check_body(fn, "fini hook")
        _parameters(fn, varargs=True, what="fini hook")
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
                                                 self.hooks, races, self.scratch)
        return v

    @property
    def pool(self):
        if self.pool_override is not None:
            return self.pool_override
        from isa.pool import get_pool
        return get_pool()

    # -- running ------------------------------------------------------------------------------
    def __call__(self, *arrays, **named):
        if named:           # (before the fast path, which would run on the positional arrays alone)
            raise TypeError(f"{self.__name__}({', '.join(self.array_names)}) takes its arrays by position, got "
                            f"{', '.join(f'{n}=' for n in named)}: write {self.__name__}"
                            f"({', '.join(self.array_names)})")
        fast = self._fast
        if fast is not None and fast.try_fast(arrays):
            return
        objs, arrays = arrays, as_arrays(arrays, self.array_names, self.__name__)
        key = signature(arrays)
        best = self._tuned.get((key, self.pool.nthreads)) if self._tuned else None
        if best is not None and best != self.spec.text:
            self._fast, self._ran_tuned = None, self.with_spec(best)
            return self._ran_tuned(*objs)
        self._ran_tuned = None
        inst = self._current(arrays, key)
        written = () if objs is arrays else written_objects(objs, inst.writes, self.array_names, self.__name__)
        inst.run(arrays)
        mark_written(written)

    def _check_count(self, arrays):
        if len(arrays) != len(self.array_names):
            raise TypeError(f"{self.__name__} takes {len(self.array_names)} arrays "
                            f"({', '.join(self.array_names)}), got {len(arrays)}{_defaults_hint(self.body)}")

    def _current(self, arrays, key):
        """The nest compiled for ``key``, bound now if there is none or if it was compiled for a
        process pool that was replaced (set_num_threads) or closed since."""
        for _ in range(3):          # (not forever: a body that calls set_num_threads may replace it each time)
            inst = self._bound.get(key) or self._bind(arrays, key)
            # _last is always the nest _fast holds, if any: the fast path needs not set it (explain())
            self._fast, self._last = (inst if inst.entry is not None else None), inst
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
        return inst

    def _inspected(self, arrays):
        """The nest bound for ``arrays`` (bound now if none is): what a call on them runs, never replaced."""
        key = signature(arrays)
        return self._bound.get(key) or self._bind(arrays, key)

    def retrace(self):
        """Drop every nest traced so far (of this kernel and its :meth:`with_spec` variants): the next call
        traces the body again, reading its globals, closure variables and kernels anew.

        A body is traced once per array signature (shapes, strides, dtypes), as ``jax.jit`` traces:
        what it reads then (a global kernel, a closure's count) is fixed in the compiled nest, and
        changing it later takes effect only after ``retrace()``.

        >>> import numpy as np, tppasm as tpp
        >>> from loops import Loop, kernel
        >>> op = tpp.relu(1, 2)
        >>> @kernel("A", Loop(0, 2))
        ... def k(i, X, Y):
        ...     op(X[i:i + 1], Y[i:i + 1])
        >>> X = -np.ones((2, 2), np.float32); Y = np.empty_like(X)
        >>> k(X, Y); op = tpp.unary("negate", 1, 2); k(X, Y); float(Y.sum())      # still relu
        0.0
        >>> k.retrace(); k(X, Y); float(Y.sum())
        4.0

        It also drops the specs :meth:`tune` chose (they were checked against the old trace, and
        may race or be refused under the new one): calls run the declared spec until tuned again.
        """
        self._invalidate()
        for member in list(self.hooks["family"]):
            member._tuned.clear()
            member._ran_tuned = None

    def python(self, *arrays):
        """Run the body in Python, kernels replaced by their NumPy references, in serial spec order.

        ``thread()`` reads 0 for every coordinate here, so an array kept per thread
        (``S[thread().tid]``) holds other values than after a native call on several threads:
        declare it scratch (``kernel(..., scratch=("S",))``, :mod:`loops.scratch`).

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
        """The nest as pseudo-code for each thread (traced on ``arrays``, else on the last call's):
        the nest a call runs, so where :meth:`tune` chose another spec for such arrays, that
        spec's, under a first line naming it.

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
        shown = self.shown(arrays)
        if shown is not self:
            head = f"# tuned: calls on these arrays run spec {shown.spec.text!r} (declared {self.spec.text!r})\n"
            return head + shown.explain(*arrays)
        return explain(self, self._inspected(arrays) if arrays else self._last)

    def shown(self, arrays=()):
        """The kernel whose nest a call on ``arrays`` runs (else the last call's): this one, or the
        :meth:`with_spec` variant of the spec :meth:`tune` chose for them."""
        if not arrays:
            return self._ran_tuned or self
        best = self._tuned.get((signature(arrays), self.pool.nthreads)) if self._tuned else None
        return self.with_spec(best) if best is not None and best != self.spec.text else self

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
        inst = self._inspected(as_arrays(arrays, self.array_names, self.__name__))
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

    tune = _TuneMethod()

    def __copy__(self):
        return self                 # as a TPP kernel: a compiled nest has nothing to copy

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise TypeError(f"loop kernel {self.__name__!r} cannot be pickled (its nests are native code bound to "
                        "this process): pickle the arrays, and build the kernel with loops.kernel(...) where it "
                        "runs (e.g. at the top level of a module that the other process imports)")

    def __repr__(self):
        return display.loop_kernel_repr(self)

    def _repr_html_(self):
        return display.loop_kernel_html(self)


def _defaults_hint(body):
    """For a count mismatch: the array parameters that have defaults, which the nest fills anyway."""
    try:
        params = inspect.signature(body).parameters.values()
    except (TypeError, ValueError):
        return ""
    named = [p.name for p in params if p.default is not p.empty and p.kind != p.KEYWORD_ONLY]
    if not named:
        return ""
    return (f" (the nest passes an array to every parameter after the indices, defaults included: capture "
            f"{', '.join(named)} as a global or closure variable instead of a default)")


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
        check_tile_state(self.body, self.init)
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
        # the serial launch calls the ctypes function itself: its arguments (a context address of
        # this instance, 0, 1) need not pass JitFunction.__call__'s checks (1.3 us of a 2.5 us call)
        self._serial = None if pool else self.code.cfunc
        self.runs_in_entry = pool is None and not self.lacking     # the fast entry runs the nest itself
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
        A serial nest's trampoline then runs the nest too (:meth:`_emit_serial_run`).
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
        if self.runs_in_entry:
            self._emit_serial_run(st)
        self._store = store.finalize()
        # no overlap check: a nest may update an array in place (the same array as input and output)
        self._entry_code = build_entry("loops", specs, (), self._store.address, overlap=False,
                                       store=None if in_registers else self.ctx_address + self.layout.array(0))
        if self._entry_code is None:
            return None
        return ctypes.PYFUNCTYPE(ctypes.c_int32, ctypes.py_object)(self._entry_code.address)

    def _emit_serial_run(self, st):
        """After the store: run the nest on this thread, as ctypes would (the interpreter lock
        released), sparing a serial call the second ctypes call (~0.4 µs of ~1.2)."""
        st.mov(rbx, rsp)
        st.and_(rsp, -16)                   # (the entry stub pushes nothing: rsp is 8 off the ABI alignment here)
        st.mov(rax, capi_address("PyEval_SaveThread"))
        st.call(rax)
        st.mov(r12, rax)
        st.mov(rdi, self.ctx_address)
        st.xor(esi, esi)
        st.mov(edx, 1)
        st.mov(rax, self.code.address)
        st.call(rax)
        st.mov(rdi, r12)
        st.mov(rax, capi_address("PyEval_RestoreThread"))
        st.call(rax)
        st.mov(rsp, rbx)

    def launch(self, address):
        if self.lacking:
            raise ISAUnavailableError(f"the nest calls {', '.join(self.lacking)} kernels this host cannot run; "
                                      "build them for its ISA (leave isa= unset) or run the nest on such a host")
        if self.pool is None:
            self._serial(address, 0, 1)
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
            if not self.runs_in_entry:
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


def _box(lk, spec, nthreads):
    """Range (inclusive) of every index and thread coordinate over the run of ``lk`` under ``spec``."""
    return box_of(lk.resolved, spec, nthreads)


__all__ = ["kernel", "LoopKernel", "Loop", "BoundsError", "SpecError", "TraceError"]
