"""A TPP kernel: descriptor -> JIT'd machine code, cached, callable on NumPy arrays.

Every descriptor is a frozen dataclass that says which arrays the kernel takes
(:meth:`operands`), which integer scalars follow them (``scalars``), and how to compute the same
thing with NumPy (:meth:`reference`). :func:`get_kernel` JITs it once per (descriptor, ISA) and
returns the same :class:`Kernel` object afterwards.
"""
import ctypes
import dataclasses
import operator
import threading
import time
import types

import numpy as np

from isa.cpu import host

from . import backends, operand
from .operand import OperandError, check
from .x86.entry import NATIVE_CHECKS, Vectorcall, build_entry, make_builtin

# kernels whose work is below this many bytes+flops hold the interpreter lock during the call
# (entering with the lock held is ~0.1 µs cheaper; releasing it matters only for long calls)
_GIL_RELEASE_WORK = 1 << 20

# set by loops.trace: called as TRACE_HOOK(kernel, arrays, scalar_values) for calls the native
# entry refuses (traced views in a loop body); returning True means the call was handled
TRACE_HOOK = None
TRACING = 0      # > 0 while some thread traces a loop body: calls then go to TRACE_HOOK first
_DIVERT = ctypes.c_int32(0)      # TRACING, where the builtin entries read it
builtin_entry = True             # False: new kernels are called through ctypes (the pre-3.11 path)


def tracing(delta):
    """Count a loop-body trace in (+1) or out (-1); while any runs, every call reaches TRACE_HOOK."""
    global TRACING
    TRACING += delta
    _DIVERT.value = TRACING


class Descriptor:
    """Base of TPP descriptors (subclasses are frozen dataclasses)."""

    kind = ""
    scalars = ()
    count_scalar = None
    checked_call = True     # False: the native entry cannot vouch for a call (offset or address batches)

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
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type is bool:
                value = bool(value) if isinstance(value, np.bool_) else value
                ok, legal = isinstance(value, bool), "True or False"
            elif f.type is int:
                value = int(value) if isinstance(value, np.integer) else value
                ok, legal = isinstance(value, int) and not isinstance(value, bool), "an int"
            elif f.type is str:
                ok, legal = isinstance(value, str) or (value is None and f.default is None), "a string"
            else:
                try:
                    ok, legal = hash(value) is not None, "a hashable value"
                except TypeError:
                    ok, legal = False, "a hashable value (not a list or array)"
            if not ok:
                raise ValueError(f"{self.kind}: {f.name}={value!r}; expected {legal}")
            object.__setattr__(self, f.name, value)

    def reference(self, *arrays, **scalars):
        raise NotImplementedError

    def work(self):
        """Rough bytes+flops of one call, to choose whether the call releases the GIL."""
        return sum(s.nbytes() for s in self.operands())

    def validate(self):
        """Raise ValueError naming the parameter when the descriptor is inconsistent."""


class Kernel:
    """A JIT'd TPP. Call it on arrays; ``reference`` runs NumPy; ``disassemble`` shows the code."""

    def __init__(self, desc, isa):
        self.desc, self.isa = desc, isa
        self.operands = tuple(desc.operands())
        self.scalars = tuple(desc.scalars)
        start = time.perf_counter()
        self.checked_call = desc.checked_call
        self.raw = _generate(desc, isa)
        # code for an ISA this host lacks (AVX-512 or AMX generated for the interpreter, say) is
        # never called: an illegal instruction would kill the process
        self.runnable = isa in host().levels
        # the x86 entry stub exists for x86 kernels only; others (sve) take the Python-checked path
        x86 = isa in ("avx2", "avx512", "amx")
        self.entry = self._stub = None
        if x86 and self.runnable and builtin_entry and Vectorcall.available() and self.checked_call:
            self._become_builtin()
        if x86 and self._stub is None and self.checked_call:
            self.entry = build_entry(desc.kind, self.operands, self.scalars, self.raw.address, desc.count_scalar)
        self.jit_seconds = time.perf_counter() - start
        functype = ctypes.CFUNCTYPE if desc.work() >= _GIL_RELEASE_WORK else ctypes.PYFUNCTYPE
        self._native = NATIVE_CHECKS and self.entry is not None and self.runnable
        if self._native:
            self._entry = functype(ctypes.c_int32, ctypes.py_object)(self.entry.address)
        self._n = len(self.operands)
        self._defaults = (1,) * len(self.scalars)
        self._raw = None if self.raw.address is None else ctypes.CFUNCTYPE(   # None: foreign ISA code
            None, *([ctypes.c_void_p] * len(self.operands)), *([ctypes.c_int64] * len(self.scalars)))(self.raw.address)

    @property
    def raw_address(self):
        """Address of the raw kernel: System V args are the operand data pointers, then the scalars."""
        return self.raw.address

    def _become_builtin(self):
        """Make calls enter the native stub directly: this object's class becomes a subclass whose
        ``__call__`` is a CPython builtin implemented by the stub (about 0.5 µs less per call than
        a Python method calling ctypes); whatever the stub refuses goes to the Python path."""
        self._fallback = types.MethodType(Kernel.__call__, self)
        call = Vectorcall(self._fallback, ctypes.addressof(_DIVERT), self.desc.work() >= _GIL_RELEASE_WORK)
        self._stub = build_entry(self.desc.kind, self.operands, self.scalars, self.raw.address,
                                 self.desc.count_scalar, call=call)
        if self._stub is not None:
            # the builtin holds the fallback, hence this kernel, its stub and the method def
            builtin, self._method_def = make_builtin(self.desc.kind, self._stub, self._fallback,
                                                     Kernel.__call__.__doc__)
            self.__class__ = type(type(self).__name__, (type(self),), {"__call__": builtin})

    def __call__(self, *arrays, count=None):
        """Run the kernel on ``arrays`` (and ``count=`` for batched kernels)."""
        # the hot path without a builtin entry: no **kwargs dict, one tuple for the native entry
        if len(arrays) == self._n and not TRACING:
            if count is None:
                args = arrays + self._defaults if self._defaults else arrays
            elif self.scalars == ("count",):
                args = arrays + (count,)
            else:
                return self._explain(arrays, {"count": count})
            if not self._native or self._entry(args):
                self._slow_call(arrays, args[self._n:])
            return None
        values = self._defaults if count is None else (count,)
        if len(arrays) != self._n or len(values) != len(self.scalars):
            return self._explain(arrays, {} if count is None else {"count": count})
        if TRACING and TRACE_HOOK is not None and TRACE_HOOK(self, arrays, values):
            return None                  # recorded by the loop tracer (or run in Python), not run here
        self._slow_call(arrays, values)

    def _slow_call(self, arrays, values):
        """Explain a refusal, or call through pointers for inputs the native check cannot vouch for."""
        if TRACE_HOOK is not None and TRACE_HOOK(self, arrays, values):
            return
        if not self.checked_call:
            raise TypeError(f"{self.desc.kind}: this raw kernel (batch={self.desc.batch!r}) does not check its "
                            "offsets or addresses; call the object tppasm.brgemm(...) returns, which does")
        if not all(isinstance(a, np.ndarray) for a in arrays):
            return operand.call(self, arrays, values)      # torch tensors, DLPack objects
        values = tuple(scalar_arg(self.desc.kind, name, v) for name, v in zip(self.scalars, values))
        count = dict(zip(self.scalars, values)).get(self.desc.count_scalar, 1)
        for spec, arr in zip(self.operands, arrays):
            check(spec, arr, count, who=self.desc.kind)
        if self._raw is None or not self.runnable:
            raise RuntimeError(f"{self.desc.kind}: {self.isa} code cannot run on this host (its levels: "
                               f"{', '.join(host().levels) or 'none'}); run it in an emulator or interpreter")
        self._raw(*(a.ctypes.data for a in arrays), *values)

    def _explain(self, arrays, scalars):
        names = ", ".join(s.name for s in self.operands)
        extra = "".join(f", {s}=..." for s in self.scalars)
        raise TypeError(f"{self.desc.kind} takes {len(self.operands)} arrays ({names}){extra}; "
                        f"got {len(arrays)} arrays and {sorted(scalars)}")

    def reference(self, *arrays, **scalars):
        """The same computation with NumPy, in place on the same arrays (the test oracle)."""
        return self.desc.reference(*arrays, **scalars)

    def disassemble(self) -> str:
        """The kernel's machine code as Intel-syntax text."""
        return self.raw.disassemble()

    def __repr__(self):
        return f"<{type(self.desc).__name__} kernel {self.desc} for {self.isa}>"


def unchecked_in_body(desc):
    """Why a kernel whose native entry cannot vouch for its calls (``desc.checked_call`` False)
    is refused in a loop body."""
    return (f"{desc.kind} with batch={desc.batch!r} cannot run in a loop body: its offsets or addresses "
            "are checked in Python on each call; in a body use batch='stride' with views of the blocks "
            "(A[i, k0:k1] and count=...)")


def scalar_arg(kind, name, value):
    """``value`` as a Python int in [1, 2**30) (NumPy integers welcome, bools not)."""
    try:
        v = operator.index(value)
    except TypeError:
        v = None
    if v is None or isinstance(value, (bool, np.bool_)) or not 1 <= v < 1 << 30:
        raise OperandError(f"{kind}: {name}={value!r}, expected an int from 1 to 2**30 - 1")
    return v


_CACHE = {}
_LOCK = threading.Lock()


def get_kernel(desc, isa=None):
    """The kernel for ``desc`` on ``isa`` (default: the host's level), JIT'd once per process.

    >>> from tppasm.eltwise import Unary
    >>> k = get_kernel(Unary(op="relu", m=2, n=3))
    >>> k is get_kernel(Unary(op="relu", m=2, n=3))
    True
    """
    isa = isa or host().isa
    key = (desc, isa)
    kernel = _CACHE.get(key)
    if kernel is None:
        desc.validate()
        with _LOCK:
            kernel = _CACHE.get(key)
            if kernel is None:
                kernel = _CACHE[key] = Kernel(desc, isa)
    return kernel


def _generate(desc, isa):
    try:
        return backends.generate(desc, isa)
    except (TypeError, ValueError) as e:
        if not any(abs(v) >= 1 << 25 for v in vars(desc).values() if isinstance(v, int)):
            raise
        raise ValueError(f"{desc.kind}: {desc} needs an address offset the {isa} code cannot encode (x86 "
                         "displacements and immediates are 32-bit): keep leading dimensions, rows and "
                         "strides under 2 GiB, or split the operand into smaller calls") from e
