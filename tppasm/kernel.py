"""A TPP kernel: descriptor -> JIT'd machine code, cached, callable on NumPy arrays.

Every descriptor is a frozen dataclass that says which arrays the kernel takes (:meth:`operands`), which integer
scalars follow them (``scalars``), and how to compute the same thing with NumPy (:meth:`reference`).
:func:`get_kernel` JITs it once per (descriptor, ISA) and returns the same :class:`Kernel` object afterwards, while
the kernel is among the :func:`set_kernel_cache_limit` most recently used ones or referenced elsewhere; its code
comes from the disk cache (:mod:`tppasm.cache`) when an earlier process generated it.
"""
import ctypes
import dataclasses
import functools
import os
import sys
import threading
import time
import types
import typing
import weakref

import numpy as np

from isa.cpu import host
from isa.listing import Listing

from . import backends, buffers, display, forking, operand
from .cache import kernel_code
from .cache.lru import DEFAULT_LIMIT, KernelLRU
from .dtypes import NUMPY_NAMES, imported, name_of
from .generate_errors import offset_error
from .keywords import dtype_hint
from .layout import empty_for
from .lazy import CodeAddress, OnFirstRead
from .operand import OperandError, check, scalar_arg      # (scalar_arg: kernel.scalar_arg for its users)
from .x86.entry import NATIVE_CHECKS, Addresses, Vectorcall, build_entry, make_builtin

# kernels whose work is below this many bytes+flops hold the interpreter lock during the call
# (entering with the lock held is ~0.1 µs cheaper; releasing it matters only for long calls)
_GIL_RELEASE_WORK = 1 << 20

# set by loops.trace: called as TRACE_HOOK(kernel, arrays, scalar_values) for calls the native
# entry refuses (traced views in a loop body); returning True means the call was handled
TRACE_HOOK = None
BODY_MODE = None     # set by loops.trace: BODY_MODE() is this thread's "trace" or "python", None outside bodies
TRACING = 0      # bodies traced or run by .python() in all threads (loops.trace counts): calls then reach TRACE_HOOK
_DIVERT = ctypes.c_int32(0)      # TRACING, where the builtin entries read it
builtin_entry = True             # False: new kernels are called through ctypes (the pre-3.11 path)


def in_body():
    """Whether this thread runs a loop body (tracing it, or in ``.python()``): other threads' bodies
    never make its calls body calls. TRACING, nonzero while any thread does, is the cheap first test."""
    return TRACING > 0 and BODY_MODE is not None and BODY_MODE() is not None


DTYPE_FIELDS = ("dtype", "out_dtype", "c_dtype")


class ISAUnavailableError(RuntimeError, ValueError):
    """A kernel built for an ISA level this host lacks (``isa="amx"`` on a host without AMX, say) was called: its
    code would die on an illegal instruction, so it is never run. A RuntimeError (what these calls raised before)
    and a ValueError (a wrong argument: ``isa=``).

    >>> issubclass(ISAUnavailableError, RuntimeError) and issubclass(ISAUnavailableError, ValueError)
    True
    """


def _dtype_like(value):
    """A string, or something NumPy (or torch) reads as a dtype: what a dtype field may hold."""
    torch_dtype = imported("torch", "dtype")
    if isinstance(value, str) or (torch_dtype is not None and isinstance(value, torch_dtype)):
        return True
    try:
        hash(value)
        np.dtype(value)
        return not isinstance(value, bool)
    except (TypeError, ValueError):
        return False


_INT_LIMIT = 1 << 63


@functools.cache
def _fields(cls):
    """[(field, its type, its plain type)] of descriptor class ``cls``: a value of exactly the plain type (an int
    below 2**63, a dtype field's tppasm name) needs no conversion or check in ``_normalize``; None for the other
    field types, whose values always take the full check."""
    try:
        hints = typing.get_type_hints(cls)    # (a module with postponed annotations gives f.type as a string)
    except (NameError, TypeError):
        hints = {}
    types_ = [(f, hints.get(f.name, f.type)) for f in dataclasses.fields(cls)]
    return [(f, t, t if t in (bool, int, str) else None) for f, t in types_]


class Descriptor:
    """Base of TPP descriptors (subclasses are frozen dataclasses)."""

    kind = ""
    scalars = ()
    count_scalar = None
    checked_call = True     # False: the native entry cannot vouch for a call (then desc.unchecked_error(how))

    def operands(self):
        raise NotImplementedError

    def _normalize(self):
        """Called first by every descriptor's ``__post_init__``: NumPy scalars become Python ones, and
        a field whose value has the wrong type (a bool for an int, a list, ...) raises ValueError.

        >>> import numpy as np
        >>> from tppasm.eltwise import Unary
        >>> type(Unary("relu", np.int64(2), 3).m)
        <class 'int'>
        """
        for f, ftype, plain in _fields(type(self)):
            value = getattr(self, f.name)
            if type(value) is plain and (plain is not int or -_INT_LIMIT < value < _INT_LIMIT) and (
                    plain is not str or f.name not in DTYPE_FIELDS or value in NUMPY_NAMES or value == ""):
                continue                        # (the common case, first: a constructor's call checks every field)
            if f.name in DTYPE_FIELDS and value is None and f.default == "":
                value = ""                                     # None: the default, as ""
            if isinstance(value, str) and type(value) is not str:
                value = str.__str__(value)          # a str Enum, np.str_: as plain text (the kernel is shared)
            # (an array's == is elementwise: compare only strings with "")
            if f.name in DTYPE_FIELDS and not (isinstance(value, str) and value == "") and _dtype_like(value):
                value = name_of(value, self.kind, f.name)     # every spelling: np.float32, "float32", ...
            if ftype is bool:
                value = bool(value) if isinstance(value, np.bool_) else value
                ok, legal = isinstance(value, bool), "True or False"
            elif ftype is int:
                # NumPy ints and int subclasses (an IntEnum) as plain ints (the cached kernel is shared by other
                # callers), and beta=1.0 as BLAS users write it
                if isinstance(value, (int, np.integer)) and not isinstance(value, bool) or (
                        f.name == "beta" and isinstance(value, (float, np.floating)) and value in (0, 1)):
                    value = int(value)
                ok = isinstance(value, int) and not isinstance(value, bool)
                legal = "an int, 0 or 1" if f.name == "beta" else "an int"
                if ok and abs(value) >= _INT_LIMIT:     # (and the validation's own messages: str(10**5000) raises)
                    ok, legal = False, legal + " below 2**63"
            elif ftype is str:
                ok, legal = isinstance(value, str) or (value is None and f.default is None), "a string"
                if f.name in DTYPE_FIELDS:
                    legal += " (a dtype such as 'f32', 'bf16', 'i8' or np.float32)"
            else:
                try:
                    ok, legal = hash(value) is not None, "a hashable value"
                except TypeError:
                    ok, legal = False, "a hashable value (not a list or array)"
            if not ok:
                raise ValueError(f"{self.kind}: {display.public_name(self, f.name)}={display.shown(value)}; expected "
                                 f"{legal}{dtype_hint(self, value) if ftype is int else ''}")
            object.__setattr__(self, f.name, value)

    def reference(self, *arrays, **scalars):
        raise NotImplementedError

    def unspecified(self, *arrays):
        """Elements of the outputs whose values this TPP leaves unspecified, given the operands after ``reference``
        ran on them: {output name: boolean mask}; none by default. Checks (``tppasm.testing``) skip them.

        >>> from tppasm.eltwise import Unary
        >>> Unary("relu", 1, 2).unspecified()
        {}
        """
        return {}

    def allocated(self):
        """Names of the operands ``kernel(inputs...)`` allocates: the outputs it only writes (not ternary's c)."""
        return tuple(s.name for s in self.operands() if s.writable)

    def work(self):
        """Rough bytes+flops of one call, to choose whether the call releases the GIL."""
        return sum(s.nbytes() for s in self.operands())

    def validate(self):
        """Raise ValueError naming the parameter when the descriptor is inconsistent."""


class Kernel:
    """A JIT'd TPP. Call it on arrays; ``reference`` runs NumPy; ``disassemble`` shows the code.

    Each kernel is an instance of its own subclass (``ReluKernel``, ``BrgemmKernel``...) whose docstring and
    ``__signature__`` name its operands, shapes and dtypes (``help(kernel)``). Call it with every operand
    (``k(x, out)``), or with the inputs only (``out = k(x)``): the outputs it only writes are then allocated (64-byte
    aligned) and returned, as torch tensors when an input is one (bf16 ones too; NumPy arrays otherwise). A batched
    kernel's ``count`` defaults to the number of blocks its batched operands hold. Kernels pickle as their
    descriptor and ISA and are rebuilt (from the cache) on load. ``code_cache`` (a
    :class:`tppasm.cache.kernels.KernelCode`, what :func:`get_kernel` passes) loads the code from the disk cache and
    stores what it generates; without it the code is generated here (``from_disk`` tells which happened).

    >>> import numpy as np, tppasm
    >>> relu = tppasm.relu(2, 3)                   # a Kernel, built by get_kernel
    >>> x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    >>> type(relu).__name__, relu(x).tolist()
    ('ReluKernel', [[0.0, 2.0, 0.0], [4.0, 0.0, 6.0]])
    """

    # defaults for kernels assembled by hand (tests build some with Kernel.__new__)
    _infer, _alloc, _stub, _builtin, jit_seconds, runnable = False, (), None, None, 0.0, True
    _releases_gil, allocated_names, _address = False, None, None

    def __init__(self, desc, isa, *, code_cache=None):
        _check_descriptor(desc, "Kernel").validate()       # (before operands(), which trusts the fields)
        isa = backends.level(isa)                 # None: the host's level, as get_kernel reads it
        self.desc, self.isa = desc, isa
        self.operands = tuple(desc.operands())
        self.scalars = tuple(desc.scalars)
        self.allocated_names = tuple(desc.allocated())     # (descriptors build their operands anew each time)
        start = time.perf_counter()
        self.checked_call = desc.checked_call
        self._releases_gil = desc.work() >= _GIL_RELEASE_WORK      # big enough to run without the GIL
        if code_cache is None:
            self.raw, self.from_disk = _generate(desc, isa), False
        else:
            self.raw, self.from_disk = code_cache.raw(desc, isa, _generate)
        # code for an ISA this host lacks (AMX for the interpreter, say) never runs: it would die (SIGILL)
        self.runnable = isa in host().levels
        # the x86 entry stub exists for x86 kernels only; others (sve) take the Python-checked path
        x86 = isa in ("avx2", "avx512", "amx")
        self.entry = self._stub = None
        if x86 and self.runnable and builtin_entry and Vectorcall.available() and self.checked_call:
            self._become_builtin(code_cache)
        if x86 and self._stub is None and self.checked_call:
            self.entry = _entry_stub(code_cache, desc, self.operands, self.scalars, self.raw.address)
        self.jit_seconds = time.perf_counter() - start
        functype = ctypes.CFUNCTYPE if self._releases_gil else ctypes.PYFUNCTYPE
        self._native = NATIVE_CHECKS and self.entry is not None and self.runnable
        if self._native:
            self._entry = functype(ctypes.c_int32, ctypes.py_object)(self.entry.address)
        self._n = len(self.operands)
        self._defaults = (1,) * len(self.scalars)
        # count left out: inferred from the batched operands (never silently 1)
        self._infer = desc.count_scalar in self.scalars and any(s.batch for s in self.operands)
        self._batched = tuple((i, len(s.shape) + 1) for i, s in enumerate(self.operands) if s.batch)
        self._alloc = tuple(i for i, s in enumerate(self.operands) if s.name in self.allocated_names)
        self._raw = None if self.raw.address is None else ctypes.CFUNCTYPE(   # None: foreign ISA code
            None, *([ctypes.c_void_p] * len(self.operands)), *([ctypes.c_int64] * len(self.scalars)))(self.raw.address)
        if not self.runnable:         # callers of _raw (BatchedBrgemm) get the error, never the code
            self._raw = functools.partial(_unavailable, desc.kind, isa)
        self._present(self._builtin)

    @property
    def raw_address(self):
        """Address of the raw kernel (args: operand pointers, then scalars), a CodeAddress holding this kernel."""
        if self._address is None and self.raw.address is not None:
            self._address = CodeAddress(self.raw.address, self)    # (a cycle, as the builtin entry's)
        return self._address

    def _become_builtin(self, code_cache):
        """Make calls enter the native stub directly: this object's class becomes a subclass whose
        ``__call__`` is a CPython builtin implemented by the stub (about 0.5 µs less per call than
        a Python method calling ctypes); whatever the stub refuses goes to the Python path."""
        self._fallback = types.MethodType(Kernel.__call__, self)
        call = Vectorcall(self._fallback, ctypes.addressof(_DIVERT), self._releases_gil)
        self._stub = _entry_stub(code_cache, self.desc, self.operands, self.scalars, self.raw.address, call)
        if self._stub is not None:
            # the builtin holds the fallback, hence this kernel, its stub and the method def
            text_sig = display.text_signature(self)
            params = f"$self, {text_sig[1:]}" if text_sig != "()" else "$self)"
            doc = f"__call__({params}\n--\n\nCall the kernel: {display.call_forms(self)}."
            self._builtin = make_builtin("__call__", self._stub, self._fallback, doc)

    def _present(self, builtin):
        """Become an instance of this kernel's own class (its name, docstring and call), with a
        signature that names the operands: what ``help()`` and ``inspect.signature()`` show
        (both made when first read: a process loading its kernels from the disk cache would
        otherwise spend a third of its time writing docstrings nobody reads)."""
        me = weakref.ref(self)
        cls = type(display.class_name(self.desc), (Kernel,),
                   {"__call__": builtin if builtin is not None else Kernel.__call__,
                    "__doc__": OnFirstRead(lambda: me() and display.docstring(me())),
                    "__signature__": OnFirstRead(lambda: me() and display.signature(me())),
                    "__module__": Kernel.__module__})
        self.__class__ = cls

    def __call__(self, *arrays, count=None, **wrong):
        """Run the kernel on ``arrays`` (and ``count=`` for batched kernels)."""
        if wrong:
            raise TypeError(display.wrong_call(self, len(arrays), wrong))
        # the hot path without a builtin entry: one tuple for the native entry
        if len(arrays) == self._n and not TRACING:
            if count is None:
                if self._infer:
                    count = self._count_of(arrays)
                    if self._stub is not None:
                        return type(self).__call__(*arrays, count=count)    # the native entry, with count
                    args = arrays + (count,)
                else:
                    args = arrays + self._defaults if self._defaults else arrays
            elif self.scalars == ("count",):
                args = arrays + (count,)
            else:
                raise TypeError(display.wrong_call(self, len(arrays), {"count": count}))
            if not self._native or self._entry(args):
                return self._slow_call(arrays, args[self._n:])
            return None
        inputs = self._allocating(arrays)
        if inputs is not None:
            return self._allocating_call(inputs, count)
        values = self._values(arrays, count)
        if TRACING and TRACE_HOOK is not None and TRACE_HOOK(self, arrays, values):
            return None                  # recorded by the loop tracer (or run in Python), not run here
        self._slow_call(arrays, values)

    def _slow_call(self, arrays, values):
        """Explain a refusal, or call through pointers for inputs the native check cannot vouch for; with None for
        every output the kernel can allocate (its signature's ``= None``), allocate them as ``k(inputs)`` does."""
        if self._alloc and operand.nones_at(arrays, self._alloc) and not in_body():
            return self._allocating_call(operand.without(arrays, self._alloc), values[0] if self.scalars == ("count",)
                                         and values else None)
        if TRACE_HOOK is not None and TRACE_HOOK(self, arrays, values):
            return
        if not self.checked_call:
            raise self.desc.unchecked_error("")
        if not all(type(a) is np.ndarray for a in arrays):
            return operand.call(self, arrays, values)      # torch tensors, DLPack objects, ndarray subclasses
        self._raw(*self._checked_args(arrays, values))

    def _checked_args(self, arrays, values):
        """The raw kernel's arguments for NumPy ``arrays`` and scalar ``values``, once every operand passed its
        check (OperandError / TypeError naming the fix otherwise)."""
        values = self._check_operands(arrays, values)
        if self._raw is None or not self.runnable:
            _unavailable(self.desc.kind, self.isa)
        return tuple(map(operand.data_address, arrays)) + values

    def raw_call(self, *arrays, count=None, check=True):
        """``(address, args)``: this call checked (NumPy arrays only, as a call checks them) and spelled as the
        raw kernel's address and its integer arguments (operand data pointers, then the scalars), for native
        code to make later without the interpreter (:meth:`isa.pool.Pool.run_native`); the address
        (:attr:`raw_address`) holds this kernel, and the arrays must outlive the call. ``check=False`` skips the
        operand checks (~15 µs for a BRGEMM): only for callers whose arrays are views of checked ones (fc's).

        >>> import numpy as np, tppasm
        >>> k = tppasm.unary("relu", 2, 3); x = np.ones((2, 3), np.float32); out = np.empty_like(x)
        >>> address, args = k.raw_call(x, out)
        >>> args == (x.ctypes.data, out.ctypes.data)
        True
        """
        if not self.checked_call:
            raise self.desc.unchecked_error(".raw_call")
        if not all(type(a) is np.ndarray for a in arrays):
            raise TypeError(f"{self.desc.kind}.raw_call: pass NumPy arrays (np.asarray(t) for a tensor): the "
                            "native call that it prepares holds data pointers only")
        values = self._values(arrays, count)
        trusted = not check and self.runnable and self._raw is not None
        args = tuple(map(operand.data_address, arrays)) + values if trusted else self._checked_args(arrays, values)
        return self.raw_address, args

    def _values(self, arrays, count):
        """The scalars' values of a call with every operand (``count`` inferred), else TypeError."""
        if count is None and self._infer and len(arrays) == self._n:
            count = self._count_of(arrays)
        values = self._defaults if count is None else (count,)
        if len(arrays) != self._n or len(values) != len(self.scalars):
            raise TypeError(display.wrong_call(self, len(arrays), {} if count is None else {"count": count}))
        return values

    def _check_operands(self, arrays, values, origins=None, layout=True):
        """The scalars' ``values`` as ints, once every NumPy array passed its operand check and no output
        overlaps another operand (OperandError naming the fix, in terms of ``origins``, otherwise);
        ``layout=False`` (NumPy's reference) takes any strides."""
        kind = self.desc.kind
        values = tuple(scalar_arg(kind, name, v) for name, v in zip(self.scalars, values))
        count = dict(zip(self.scalars, values)).get(self.desc.count_scalar, 1)
        for spec, arr, origin in zip(self.operands, arrays, origins or [None] * len(arrays)):
            check(spec if layout else operand.any_strides(spec, arr), arr, count, kind, origin)   # (None: NumPy's)
        operand.refuse_overlap(kind, self.operands, arrays, count, origins, repeats=not layout)
        return values

    def _count_of(self, arrays):
        """``count`` when the call leaves it out: the number of blocks the batched operands hold, if
        they all hold the same (known) number; else TypeError asking for ``count=``."""
        counts = []
        for i, rank in self._batched:
            shape = getattr(arrays[i], "shape", None)
            if shape is not None and len(shape) == rank:
                counts.append(shape[0])
        if not counts:
            return 1                  # no batched operand has its batch axis: the operand check explains
        known = all(isinstance(n, (int, np.integer)) for n in counts)
        if known and len(set(counts)) == 1:
            return int(counts[0])
        held = " and ".join(f"{self.operands[i].name} holds {getattr(arrays[i], 'shape', (None,))[0]}"
                            for i, _ in self._batched)
        if not known:                 # (traced lengths that depend on a loop index)
            raise TypeError(f"{self.desc.kind}: the batched operands hold a number of blocks that depends on the "
                            f"loop indices ({held}), and a kernel's count cannot vary with the loop indices (it is "
                            "fixed when the body is traced): pass count= an int (the first count blocks, no more than "
                            "any iteration holds), or, for a causal or triangular sum, reduce over all the blocks "
                            "with the unused ones zero (zeros add nothing)")
        raise TypeError(f"{self.desc.kind}: pass count= (how many blocks to reduce over): it is inferred only "
                        f"when the batched operands hold the same number of blocks, and {held}")

    def _allocating_call(self, arrays, count, run=None):
        """``out = k(inputs...)``: new aligned outputs for the operands the kernel only writes (``run``: the
        kernel, or its reference), NumPy arrays, or torch tensors when an input is a tensor."""
        if in_body():
            names = ", ".join(self.operands[i].name for i in self._alloc)
            raise TypeError(f"{self.desc.kind}: inside a loop body pass the output ({names}) as a view of a "
                            "body argument; the allocating form k(inputs) runs outside loop bodies only")
        given, run = iter(arrays), run or self
        full = [empty_for(s) if i in self._alloc else next(given) for i, s in enumerate(self.operands)]
        run(*full, **({} if count is None else {"count": count}))
        made = full[self._alloc[0]] if len(self._alloc) == 1 else tuple(full[i] for i in self._alloc)
        return operand.like_inputs(made, arrays)

    def _allocating(self, arrays):
        """The inputs of an allocating call (``k(x)``, or ``k(x, None)``: None for the outputs), else None."""
        if self._alloc and len(arrays) == self._n - len(self._alloc):
            return arrays
        if self._alloc and len(arrays) == self._n and operand.nones_at(arrays, self._alloc):
            return operand.without(arrays, self._alloc)
        return None

    def __reduce__(self):
        """Pickle as (descriptor, ISA): the kernel is rebuilt, or found in the cache, on load."""
        return _rebuild, (self.desc, self.isa, self.runnable)

    def __repr__(self):
        return display.kernel_repr(self)

    def _repr_html_(self):
        return display.kernel_html(self)

    def reference(self, *arrays, count=None, **wrong):
        """The same computation with NumPy (the test oracle), on a call's arguments: in place on the outputs
        passed, or, given the inputs only, on new outputs that it returns, as ``out = k(x)`` does; count
        inferred and operands checked as the call does (it refuses alike, though it takes any strides).

        >>> import numpy as np, tppasm
        >>> g = tppasm.brgemm(m=1, n=1, k=2); A = np.ones((3, 1, 2), np.float32); B = np.ones((3, 2, 1), np.float32)
        >>> g.reference(A, B).tolist(), g.reference(A, B, count=2).tolist()      # count: all 3 blocks, or 2
        ([[6.0]], [[4.0]])
        """
        if wrong:
            raise TypeError(display.wrong_call(self, len(arrays), wrong))
        inputs = self._allocating(arrays)
        if inputs is not None:
            return self._allocating_call(inputs, count, self.reference)
        values = self._values(arrays, count)
        views = self._views(arrays)
        values = self._check_operands(views, values, [operand.origin_of(a) for a in arrays], layout=False)
        self.desc.reference(*views, **dict(zip(self.scalars, values)))
        operand.mark_written([a for s, a in zip(self.operands, arrays) if s.writable])

    def _views(self, objs):
        """NumPy views of the operands (:func:`tppasm.operand.as_ndarray`), refused as a call refuses them."""
        if all(type(a) is np.ndarray for a in objs):
            return objs
        kind = self.desc.kind
        try:
            return tuple(operand.as_ndarray(a, s.name, kind, s.writable) for s, a in zip(self.operands, objs))
        except OperandError:
            for spec, obj in zip(self.operands, objs):
                if operand.origin_of(obj) is None:
                    check(spec, obj, who=kind)       # not an array at all: say which shape and dtype to pass
            raise

    def disassemble(self) -> str:
        """The kernel's machine code as text (Intel syntax on x86); notebooks show it highlighted."""
        return Listing(display.machine_code(self))        # (SVE without capstone: says what to install)

    def instruction_mix(self) -> dict:
        """How many times each instruction occurs in the code (static counts), most frequent first.

        >>> import tppasm
        >>> mix = tppasm.relu(8, 16).instruction_mix()
        >>> mix["ret"]
        1
        """
        return display.instruction_mix(self)


def _unavailable(kind, isa, *args):
    """Raise :class:`ISAUnavailableError` for a ``kind`` kernel whose ``isa`` code this host cannot run."""
    if kind.startswith("amx_"):         # tileconfig/tilerelease: no other level has tiles
        fix = "call it only where isa.cpu.host().isa == 'amx' (a nest built for this host needs no tile setup)"
    else:
        fix = f"build the kernel for the host's level (leave isa= unset: {host().isa})"
    raise ISAUnavailableError(
        f"{kind}: this kernel's {isa} code cannot run on this host (its levels: "
        f"{', '.join(host().levels) or 'none'}): {fix}, or run this code in the interpreter (isa.x86.interp) "
        "or an emulator")


def _rebuild(desc, isa, runnable):
    """Unpickle a kernel: the same descriptor for the same ISA level, or for this host's level when the kernel ran
    natively where it was pickled and this host lacks that level."""
    if runnable and isa not in host().levels:
        isa = None
    return get_kernel(desc, isa)


def _entry_stub(code_cache, desc, operands, scalars, raw_address, call=None):
    """The native entry of a kernel (:func:`tppasm.x86.entry.build_entry`): from a stored template with
    ``code_cache``, else assembled here."""
    if code_cache is None:
        return build_entry(desc.kind, operands, scalars, raw_address, desc.count_scalar, call=call)
    form = "entry" if call is None else "call-nogil" if call.release_gil else "call"
    return code_cache.stub(desc.kind, operands, scalars, desc.count_scalar, form,
                           Addresses(operands, scalars, raw_address, call))


_CACHE = KernelLRU()
_LIMIT_UNREAD = True      # TPPASM_KERNEL_CACHE is read at the first kernel built: import tppasm never fails on it
_LOCK = threading.Lock()
_HERE = threading.local()      # .generating: this thread holds _LOCK (see get_kernel)


def get_kernel(desc, isa=None):
    """The kernel for ``desc`` on ``isa`` (default: the host's level), JIT'd once per process (or loaded from the
    disk cache, :mod:`tppasm.cache`).

    >>> from tppasm.eltwise import Unary
    >>> k = get_kernel(Unary(op="relu", m=2, n=3)); k is get_kernel(Unary(op="relu", m=2, n=3))
    True
    """
    _check_descriptor(desc)
    isa = backends.level(isa)
    key = (desc, isa)
    kernel = _CACHE.get(key)
    if kernel is None:
        if _LIMIT_UNREAD:      # (and TPPASM_BUFFER_CACHE_MIB's, not ignored while no array is pooled)
            set_kernel_cache_limit(buffers.env_limit("TPPASM_KERNEL_CACHE", "the number of kernels to keep",
                                                     DEFAULT_LIMIT))
            buffers.pool_limit()
        desc.validate()
        if getattr(_HERE, "generating", False):
            # a signal handler that interrupted this thread's own generation, which holds _LOCK and maybe
            # the disk cache's locks (none reentrant: waiting would hang): generated in memory, without them
            return _keep(key, Kernel(desc, isa))
        with _LOCK:
            _HERE.generating = True       # (no call between the acquire and this: a handler cannot miss it)
            try:
                kernel = _CACHE.get(key) or _keep(key, Kernel(desc, isa, code_cache=kernel_code()))
            finally:
                _HERE.generating = False
    return kernel


def _keep(key, kernel):
    """Cache ``kernel`` for ``key`` and return it, or the one a signal handler's call cached meanwhile."""
    kernel = _CACHE.get(key) or kernel
    _CACHE.put(key, kernel)
    return kernel


def set_kernel_cache_limit(n):
    """Keep at most ``n`` kernels (the most recently used) in this process's cache; 512 unless
    ``TPPASM_KERNEL_CACHE`` says otherwise. Kernels beyond it stay valid while referenced, and
    their executable memory is freed once nothing references them.

    >>> import tppasm
    >>> from tppasm.cache.lru import DEFAULT_LIMIT
    >>> tppasm.set_kernel_cache_limit(64)              # a process that builds many kernels, keeping fewer
    >>> tppasm.set_kernel_cache_limit(DEFAULT_LIMIT)   # the default (512) again
    """
    global _LIMIT_UNREAD
    _CACHE.set_limit(n)
    _LIMIT_UNREAD = False


def cache_clear():
    """Drop every kernel this process keeps (see :func:`set_kernel_cache_limit`; the disk cache
    stays: ``python -m tppasm cache clear`` empties that).

    >>> from tppasm.eltwise import Unary
    >>> k = get_kernel(Unary("relu", 2, 5)); cache_clear()
    >>> get_kernel(Unary("relu", 2, 5)) is k          # still referenced here: the same kernel
    True
    """
    _CACHE.clear()


_FORK_WAIT_S = 10.0
forking.guard(sys.modules[__name__], "_LOCK", threading.Lock)     # every lock at a fork: tppasm.forking
os.register_at_fork(after_in_child=_CACHE.after_fork_in_child)


def _check_descriptor(desc, who="get_kernel"):
    if isinstance(desc, Descriptor):
        return desc
    if isinstance(desc, Kernel):
        raise TypeError(f"{who}({desc!r}): this is already a kernel; call it directly")
    raise TypeError(f"{who}(desc): desc={desc!r} is not a TPP descriptor; pass one such as "
                    "tppasm.brgemm.Brgemm(m, n, k) or tppasm.eltwise.Unary('relu', m, n), or build the kernel "
                    "with a constructor: tppasm.brgemm(m, n, k), tppasm.relu(m, n), tppasm.unary('relu', m, n), ...")


def _generate(desc, isa):
    try:
        return backends.generate(desc, isa)
    except (TypeError, ValueError) as e:
        wrapped = offset_error(desc, isa, e)       # the x86 encoder's refusal of a huge offset, explained
        if wrapped is None:
            raise
        raise wrapped from e
