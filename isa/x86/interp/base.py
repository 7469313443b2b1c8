"""Shared pieces of the x86 interpreter: errors, the semantics registry, operand access.

A *semantic* is a builder ``build(machine, ins) -> step`` where ``step()`` executes the decoded
instruction once against the machine state and returns the next ip. Builders run once per
instruction address (the decode cache keeps the closure), so everything that depends only on the
encoding (register numbers, widths, dtypes, immediates) is resolved there, not per step.
"""

from __future__ import annotations

import iced_x86
from iced_x86 import OpKind, Register, RegisterExt

import numpy as np

M64 = (1 << 64) - 1
_FMT = iced_x86.Formatter(iced_x86.FormatterSyntax.INTEL)
MNEMONIC_NAME = {getattr(iced_x86.Mnemonic, n): n.lower()
                 for n in dir(iced_x86.Mnemonic) if not n.startswith("_")}


class InterpError(Exception):
    """Base of interpreter errors; carries the faulting instruction once the run loop knows it."""

    def __init__(self, message: str, ip: int | None = None, text: str | None = None):
        self.message, self.ip, self.text = message, ip, text
        super().__init__(self._full())

    def _full(self) -> str:
        where = "" if self.ip is None else f" at {self.ip:#x}: {self.text}"
        return self.message + where

    def locate(self, ip: int, text: str) -> None:
        if self.ip is None:
            self.ip, self.text = ip, text
            self.args = (self._full(),)

    def __reduce__(self):
        # pickle (multiprocessing re-raises a worker's error so) would call cls(*self.args), which
        # does not match the subclasses' signatures: rebuild without __init__, then restore the fields
        return _rebuilt, (type(self), self.args), self.__dict__


def _rebuilt(cls, args):
    """An interpreter error of class ``cls`` with ``args``, its fields still to be restored (pickle).

    >>> import pickle
    >>> e = MemoryFault(0x1000, 8, ip=0x40, text="mov rax, [rbx]")
    >>> back = pickle.loads(pickle.dumps(e))
    >>> str(back) == str(e), back.address, back.ip
    (True, 4096, 64)
    """
    return cls.__new__(cls, *args)


class UnsupportedInstruction(InterpError):
    """The interpreter does not model this opcode or operand form (it refuses, never guesses)."""

    def __init__(self, mnemonic: str, why: str = "", ip: int | None = None, text: str | None = None):
        self.mnemonic = mnemonic
        super().__init__(f"unsupported instruction {mnemonic}" + (f" ({why})" if why else ""), ip, text)


class MemoryFault(InterpError):
    """An access outside the mapped regions (or a write to code, or a misaligned aligned move)."""

    def __init__(self, address: int, size: int, why: str = "unmapped", ip=None, text=None):
        self.address, self.size, self.why = address, size, why
        super().__init__(f"memory fault ({why}) accessing {size} bytes at {address:#x}", ip, text)


class InvalidOpcode(InterpError):
    """What the hardware signals with #UD or #GP (bad tile shapes, unconfigured tiles, ...)."""


def text_of(ins) -> str:
    return _FMT.format(ins)


def refuse(ins, why: str = ""):
    raise UnsupportedInstruction(MNEMONIC_NAME.get(ins.mnemonic, "?"), why, ins.ip, text_of(ins))


def sem(ref: str):
    """Decorate a builder with its one-line reference semantics (kept beside each table entry)."""

    def wrap(build):
        build.ref = ref
        return build

    return wrap


def with_ref(build, ref: str):
    """A builder closure with its own reference line (for table entries made by factories)."""

    def b(m, ins):
        return build(m, ins)

    b.ref = ref
    return b


# ---- operands -------------------------------------------------------------------------------

def kinds(ins) -> tuple:
    return tuple(ins.op_kind(i) for i in range(ins.op_count))


IMM_KINDS = {OpKind.IMMEDIATE8, OpKind.IMMEDIATE16, OpKind.IMMEDIATE32, OpKind.IMMEDIATE64,
             OpKind.IMMEDIATE8TO16, OpKind.IMMEDIATE8TO32, OpKind.IMMEDIATE8TO64,
             OpKind.IMMEDIATE32TO64}


def imm_of(ins, i: int) -> int:
    """The immediate of operand i as an unsigned 64-bit value (iced already sign-extended it)."""
    return ins.immediate(i) & M64


def gpr_index(reg: int) -> int:
    return RegisterExt.full_register(reg) - Register.RAX


def is_high8(reg: int) -> bool:
    return Register.AH <= reg <= Register.BH


def vec_index(reg: int) -> int:
    return RegisterExt.number(reg)


def addr_fn(m, ins):
    """A closure computing the effective address of the memory operand (no faults here)."""
    if ins.memory_segment in (Register.FS, Register.GS):
        refuse(ins, "fs/gs segment")
    if ins.is_vsib:
        refuse(ins, "vsib addressing")
    base, index = ins.memory_base, ins.memory_index
    disp = ins.memory_displacement & M64
    scale = ins.memory_index_scale
    if base == Register.RIP:
        return lambda: disp
    if (base != Register.NONE and not RegisterExt.is_gpr64(base)) or \
            (index != Register.NONE and not RegisterExt.is_gpr64(index)):
        refuse(ins, "non 64-bit address size")
    g = m.g
    if index == Register.NONE:
        if base == Register.NONE:
            return lambda: disp
        b = gpr_index(base)
        return lambda: (g[b] + disp) & M64
    i = gpr_index(index)
    if base == Register.NONE:
        return lambda: (g[i] * scale + disp) & M64
    b = gpr_index(base)
    return lambda: (g[b] + g[i] * scale + disp) & M64


def gpr_reader(m, reg: int):
    """Closure reading a general register as an unsigned int of its size."""
    g, i = m.g, gpr_index(reg)
    size = RegisterExt.size(reg)
    if size == 8:
        return lambda: g[i]
    if is_high8(reg):
        return lambda: (g[i] >> 8) & 0xFF
    mask = (1 << (8 * size)) - 1
    return lambda: g[i] & mask


def gpr_writer(m, reg: int):
    """Closure writing a general register with x86 width rules (32-bit writes zero-extend)."""
    g, i = m.g, gpr_index(reg)
    size = RegisterExt.size(reg)
    if size == 8:
        def w(v):
            g[i] = v & M64
    elif size == 4:
        def w(v):
            g[i] = v & 0xFFFFFFFF
    elif is_high8(reg):
        def w(v):
            g[i] = (g[i] & ~0xFF00) | ((v & 0xFF) << 8)
    else:
        keep = M64 ^ ((1 << (8 * size)) - 1)

        def w(v):
            g[i] = (g[i] & keep) | (v & ~keep & M64)
    return w


def operand_rw(m, ins, i: int, size: int | None = None):
    """(reader, writer) closures for integer operand i (register, memory or immediate)."""
    k = ins.op_kind(i)
    if k == OpKind.REGISTER:
        reg = ins.op_register(i)
        if not RegisterExt.is_gpr(reg):
            refuse(ins, "non-GPR register operand")
        return gpr_reader(m, reg), gpr_writer(m, reg)
    if k == OpKind.MEMORY:
        a = addr_fn(m, ins)
        n = size or iced_x86.MemorySizeExt.size(ins.memory_size)
        rd, wr = m.rd, m.wr
        return (lambda: rd(a(), n)), (lambda v: wr(a(), n, v))
    if k in IMM_KINDS:
        v = imm_of(ins, i)
        if size is not None and size < 8:
            v &= (1 << (8 * size)) - 1
        return (lambda: v), None
    refuse(ins, f"operand kind {k}")


def operand_size(ins, i: int) -> int:
    k = ins.op_kind(i)
    if k == OpKind.REGISTER:
        return RegisterExt.size(ins.op_register(i))
    if k == OpKind.MEMORY:
        return iced_x86.MemorySizeExt.size(ins.memory_size)
    return {OpKind.IMMEDIATE8: 1, OpKind.IMMEDIATE16: 2}.get(k, 4)


# ---- opmasks --------------------------------------------------------------------------------

_MASK_CACHE: dict = {}


def mask_bits(k: int, n: int) -> np.ndarray:
    """Boolean lane vector of the low n bits of k (cached: kernels use a handful of masks)."""
    key = (k, n)
    b = _MASK_CACHE.get(key)
    if b is None:
        b = np.array([(k >> j) & 1 for j in range(n)], dtype=bool)
        b.setflags(write=False)
        if len(_MASK_CACHE) < 4096:
            _MASK_CACHE[key] = b
    return b


def pack_bits(b: np.ndarray) -> int:
    """Inverse of mask_bits: lane booleans to an integer mask."""
    return int.from_bytes(np.packbits(b, bitorder="little").tobytes(), "little")
