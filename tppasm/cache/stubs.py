"""Entry-stub templates: a kernel's native entry built once, with placeholders, patched per process.

A stub (:func:`tppasm.x86.entry.build_entry`) embeds this process's addresses (``numpy.ndarray``,
the dtype objects, C API functions, the raw kernel, ...) as 64-bit immediates, so it cannot be
stored as it is, and building it costs about 1 ms of assembling. Instead it is built once with a
distinct placeholder in place of each address (:class:`Placeholders`); the template records
where each placeholder sits (always the imm64 of a ``mov r64, imm64``, so any real value fits)
and which address it stands for; :func:`instantiate` writes this process's addresses there
(:class:`tppasm.x86.entry.Addresses`), in microseconds.

A template is refused (None) unless every 64-bit immediate of the stub is one of the placeholders
and each placeholder occurrence is such an immediate, so no address can be left unpatched.

>>> from tppasm.eltwise import Unary
>>> desc = Unary("relu", 2, 3)
>>> t = template(desc.kind, tuple(desc.operands()), (), None, "entry")
>>> sorted({symbol[0] for _, symbol in t.relocations})
['dtype', 'ndarray', 'raw']
"""
import struct
from dataclasses import dataclass

from isa.x86.function import JitFunction

from ..x86.entry import CAPI, Addresses, Vectorcall, build_entry
from .position import audit

FORMS = ("entry", "call", "call-nogil")     # the ctypes entry; the builtin entry, holding or releasing the GIL
_BASE = 0x7E57_AB1E_0000_0000               # placeholder i is _BASE + 16 * i: never a user-space address
# what a placeholder may stand for: Addresses method -> whether its argument is valid
SYMBOLS = {"raw": None, "ndarray": None, "int": None, "none": None, "divert": None, "fallback": None,
           "dtype": lambda i: isinstance(i, int) and 0 <= i < 8, "keyword": lambda j: isinstance(j, int) and 0 <= j < 8,
           "capi": lambda name: name in CAPI}


class Placeholders(Addresses):
    """Answers every address request with a fresh placeholder and remembers what it stands for."""

    def __init__(self):
        super().__init__((), (), 0)
        self.symbols = {}                  # (method, *args) -> placeholder value

    def _value(self, *symbol):
        return self.symbols.setdefault(symbol, _BASE + 16 * len(self.symbols))

    def raw(self):
        return self._value("raw")

    def ndarray(self):
        return self._value("ndarray")

    def dtype(self, i):
        return self._value("dtype", i)

    def int(self):
        return self._value("int")

    def keyword(self, j):
        return self._value("keyword", j)

    def none(self):
        return self._value("none")

    def capi(self, name):
        return self._value("capi", name)

    def divert(self):
        return self._value("divert")

    def fallback(self):
        return self._value("fallback")


@dataclass(frozen=True)
class Template:
    """A stub's code with placeholders, and [(offset, symbol)] of each 8-byte slot to patch."""

    name: str
    code: bytes
    relocations: tuple
    argtypes: tuple
    restype: str

    def as_meta(self):
        return {"name": self.name, "relocations": [[off, list(sym)] for off, sym in self.relocations],
                "argtypes": list(self.argtypes), "restype": self.restype}

    @staticmethod
    def from_meta(code, meta):
        """The template stored as (code, meta); ValueError if the metadata is malformed."""
        try:
            relocs = tuple((int(off), tuple(sym)) for off, sym in meta["relocations"])
            t = Template(str(meta["name"]), bytes(code), relocs, tuple(meta["argtypes"]), meta["restype"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed stub template metadata: {e}") from None
        for off, sym in relocs:
            if not (2 <= off <= len(code) - 8 and _is_imm64_slot(code, off)):
                raise ValueError(f"stub template relocation {off}, {sym} is not a mov r64, imm64 slot")
            if not (sym and sym[0] in SYMBOLS and (len(sym) == 1 if SYMBOLS[sym[0]] is None
                                                    else len(sym) == 2 and SYMBOLS[sym[0]](sym[1]))):
                raise ValueError(f"stub template relocation {off}: {sym} names no address")
        return t


def template(kind, operands, scalars, count_scalar, form):
    """The :class:`Template` of the stub for these arguments of ``build_entry`` (``form``: one of
    :data:`FORMS`), or None when there is no stub or it cannot be templated."""
    call = None if form == "entry" else Vectorcall(None, 0, release_gil=form == "call-nogil")
    ph = Placeholders()
    fn = build_entry(kind, operands, scalars, 0, count_scalar, call=call, addresses=ph)
    if fn is None:
        return None
    code = fn.code
    fn.memory.free()
    values = {v: sym for sym, v in ph.symbols.items()}
    relocs = []
    for value, sym in values.items():
        pattern, start = struct.pack("<Q", value), 0
        while (off := code.find(pattern, start)) >= 0:
            if not _is_imm64_slot(code, off):
                return None
            relocs.append((off, sym))
            start = off + 1
    marker = struct.pack("<Q", _BASE)[4:]         # the placeholders' high half: each one accounted for
    if code.count(marker) != len(relocs) or audit(code, "x86", imm64_ok=values) is not None:
        return None
    restype, argtypes = fn.signature
    return Template(fn.name, code, tuple(sorted(relocs)), argtypes, restype)


def instantiate(t, addresses):
    """The stub of template ``t`` with ``addresses`` (a :class:`~tppasm.x86.entry.Addresses`) patched in."""
    buf = bytearray(t.code)
    for off, (method, *args) in t.relocations:
        struct.pack_into("<Q", buf, off, getattr(addresses, method)(*args))
    return JitFunction(t.name, bytes(buf), t.argtypes, t.restype)


def _is_imm64_slot(code, off):
    """``code[off:off + 8]`` is the immediate of ``mov r64, imm64`` (REX.W + B8+r)."""
    return off >= 2 and code[off - 2] in (0x48, 0x49) and code[off - 1] & 0xF8 == 0xB8
