"""Kernel code on disk: raw kernels and entry-stub templates in a :class:`~.disk.DiskStore`.

A raw kernel's key is the SHA-256 of the descriptor (every field, recursively, with its class),
the ISA, the generators' source version (:func:`tppasm.backends.source_version`), tppasm's
version, the machine, the host's features and whether it runs the ISA (all that
``target_features`` reads, without importing the generators). Only
position-independent code (:mod:`.position`) is stored; the raw kernel comes back through the
same constructor the generator used (:class:`isa.x86.function.JitFunction`,
:class:`tppasm.sve.raw.SveCode`). Entry stubs are stored as templates (:mod:`.stubs`) keyed by
what ``build_entry`` reads, the x86 source version and the Python and NumPy versions (the stub
depends on their object layouts).
"""
import dataclasses
import hashlib
import platform
import sys
import warnings

import numpy as np

from isa.cpu import host
from isa.x86.function import CTYPES, INT_ARGS, STACK_ARGS, JitFunction

from .. import backends
from ..version import __version__
from ..sve.raw import SveCode
from ..x86.entry import build_entry
from . import stubs
from .position import audit

FORMAT = "tppasm-kernel-cache-1"
MAX_ARGS = len(INT_ARGS) + len(STACK_ARGS)          # what an x86 kernel's prologue takes
_TYPE_NAMES = frozenset(n for n in CTYPES if n is not None)
_PLAIN = (str, int, float, bool, type(None))


def describe(value):
    """Text that determines ``value`` (a descriptor: a dataclass of plain values, tuples and
    dataclasses); None if some part has no faithful text (then nothing is stored).

    >>> from tppasm.eltwise import Unary
    >>> describe(Unary("relu", 2, 3))[:50]
    "tppasm.eltwise.Unary(op='relu', m=2, n=3, ldi=3, l"
    >>> describe(Unary("relu", 2, 3)) == describe(Unary("relu", 2, 4))
    False
    """
    if isinstance(value, int) and value.bit_length() > 2000:
        return None                  # (str() refuses it; no valid descriptor holds one)
    if isinstance(value, _PLAIN):
        return repr(value)
    if isinstance(value, tuple):
        parts = [describe(v) for v in value]
        return None if None in parts else "(" + ", ".join(parts) + ",)"
    cls = type(value)
    head = _HEADS.get(cls)
    if head is None:
        if not dataclasses.is_dataclass(cls):
            return None
        head = _HEADS[cls] = (f"{cls.__module__}.{cls.__qualname__}", tuple(f.name for f in dataclasses.fields(cls)))
    parts = [describe(getattr(value, name)) for name in head[1]]
    if None in parts:
        return None
    return head[0] + "(" + ", ".join(f"{n}={p}" for n, p in zip(head[1], parts)) + ")"


_HEADS = {}      # dataclass -> (qualified name, field names)


def _features(isa):
    """What of the host code generation can read: its features and whether it runs ``isa``
    (``tppasm.x86.brgemm.target_features`` is a function of these)."""
    h = host()
    return f"{isa in h.levels}:" + ",".join(sorted(f for f, on in h.features.items() if on))


def _digest(*parts):
    return hashlib.sha256("\0".join(map(str, parts)).encode()).hexdigest()


class KernelCode:
    """What :class:`tppasm.kernel.Kernel` asks for its code when the disk cache is on.

    >>> import tempfile, tppasm.cache as cache
    >>> from tppasm.eltwise import Unary
    >>> with tempfile.TemporaryDirectory() as d, cache.using(d):
    ...     code = cache.kernel_code()                  # this class, over the store in d
    ...     code.raw_key(Unary("relu", 2, 3), "avx2").startswith("kernel/")
    True
    """

    def __init__(self, store):
        self.store = store
        self._envs = {}
        self._templates = {}           # key -> Template or None, this process's (bounded)
        self._warned = set()

    def _env(self, isa):
        env = self._envs.get(isa)
        if env is None:
            env = self._envs[isa] = (FORMAT, __version__, isa, backends.source_version(isa), platform.machine(),
                                     _features(isa))
        return env

    def raw_key(self, desc, isa):
        """The store key of ``desc``'s raw kernel on ``isa``; None if ``desc`` cannot be described."""
        text = describe(desc)
        if text is None:
            return None
        return "kernel/" + _digest(*self._env(isa), backends.code_options(isa, getattr(desc, "kind", None)), text)

    def raw(self, desc, isa, generate):
        """(raw kernel, loaded from disk?): the stored code if its key is there, else ``generate(desc, isa)``
        (stored when it is position independent)."""
        key = self.raw_key(desc, isa)
        if key is not None:
            hit = self.store.get(key)
            if hit is not None:
                raw = _rebuild(*hit)
                if raw is not None:
                    return raw, True
                self.store.discard(key)
        raw = generate(desc, isa)
        if key is not None:
            self._save(key, raw, desc, isa)
        return raw, False

    def _save(self, key, raw, desc, isa):
        if isinstance(raw, JitFunction):
            restype, argtypes = raw.signature
            meta = {"type": "x86", "name": raw.name, "argtypes": list(argtypes), "restype": restype}
        elif isinstance(raw, SveCode):
            meta = {"type": "sve", "name": raw.name}
        else:
            return
        why = audit(raw.code, backends.family(isa))
        if why is not None:
            if not _may_take_wide_immediates(desc) and desc.kind not in self._warned:
                self._warned.add(desc.kind)
                warnings.warn(f"tppasm: not caching the {isa} {desc.kind} kernel of {desc} on disk: its code is not "
                              f"position independent ({why}); this is a generator bug to report", RuntimeWarning,
                              stacklevel=4)
            return
        self.store.put(key, raw.code, meta)

    def stub_key(self, kind, operands, scalars, count_scalar, form):
        """The store key of an entry-stub template: the stub's arguments and the interpreter build it
        embeds offsets of. abiflags: a debug build (Py_TRACE_REFS) shares the cache tag but lays
        PyObject out differently. OperandSpec has every field in its repr."""
        return "stub/" + _digest(*self._env("avx2"), sys.implementation.cache_tag, getattr(sys, "abiflags", ""),
                                 np.__version__, kind, form, repr(tuple(operands)), scalars, count_scalar)

    def stub(self, kind, operands, scalars, count_scalar, form, addresses):
        """The entry stub (a JitFunction) for ``build_entry``'s arguments, from a stored template
        when there is one; None when ``build_entry`` makes none."""
        key = self.stub_key(kind, operands, scalars, count_scalar, form)
        t = self._templates.get(key, False)
        if t is False:
            hit = self.store.get(key)
            t = None
            if hit is not None:
                try:
                    t = stubs.Template.from_meta(*hit)
                except ValueError:
                    self.store.discard(key)
            if t is None:
                t = stubs.template(kind, operands, scalars, count_scalar, form)
                if t is not None:
                    self.store.put(key, t.code, t.as_meta())
            if len(self._templates) >= 4096:
                self._templates.clear()
            self._templates[key] = t
        if t is not None:
            try:
                return stubs.instantiate(t, addresses)
            except (IndexError, KeyError, TypeError):   # addresses these operands do not have: not our template
                self.store.discard(key)
                self._templates[key] = None
        return build_entry(kind, operands, scalars, addresses.raw(), count_scalar, call=addresses.call)


def _may_take_wide_immediates(desc):
    """Whether ``desc``'s code may hold a byte offset of 2^31 or more, which takes a 64-bit
    immediate the audit cannot tell from an address (such kernels run but are not cached, and that
    is no bug): a field that large, or one the generator multiplies into such an offset (a batch
    stride by a chunk of up to 1024 blocks of 8-byte elements, a leading dimension by the rows).

    >>> from tppasm.eltwise import Unary
    >>> _may_take_wide_immediates(Unary("relu", 64, 64)), _may_take_wide_immediates(Unary("relu", 1 << 31, 8))
    (False, True)
    """
    sizes = sorted(abs(v) for v in vars(desc).values() if isinstance(v, int) and not isinstance(v, bool))[-2:]
    widest = sizes[-1] if sizes else 0
    return widest * 8 * 1024 >= 1 << 31 or (len(sizes) == 2 and sizes[0] * sizes[1] * 8 >= 1 << 31)


def _rebuild(code, meta):
    """The raw kernel object for stored ``code``; None if the metadata is not one we wrote."""
    try:
        if meta["type"] == "x86":
            if not _is_signature(meta["argtypes"], meta["restype"]):
                return None
            return JitFunction(str(meta["name"]), code, list(meta["argtypes"]), meta["restype"])
        if meta["type"] == "sve":
            return SveCode(code, str(meta["name"]))
    except (KeyError, TypeError, ValueError):
        pass
    return None


def _is_signature(argtypes, restype):
    """Whether stored ``argtypes`` and ``restype`` are a signature a generator writes: type names
    of :data:`isa.x86.function.CTYPES`, at most as many arguments as a kernel's prologue reads.

    >>> _is_signature(["ptr", "i64"], None), _is_signature(["ptr", "int"], None), _is_signature("ptr", "f32")
    (True, False, False)
    """
    known = all(type(t) is str and t in _TYPE_NAMES for t in argtypes) if type(argtypes) is list else False
    return known and len(argtypes) <= MAX_ARGS and (restype is None or type(restype) is str and restype in _TYPE_NAMES)
