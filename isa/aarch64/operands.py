"""Operand kinds of the AArch64 encoding table, and the operand values users pass that are not registers.

An operand *kind* knows, for one operand slot of one instruction form: whether a value fits
(``match``), which instruction bits it sets (``encode``), how capstone prints it (``text``), the
name used in error messages (``name``), and how to build a random valid value from an integer source
(``sample``, used by the property tests). Bit placements are lists of ``(lowest bit, width)`` fields,
most significant part first, so a value split over several fields (``immhi:immlo``) is one kind.

User operand values: :class:`Mem` (and its helpers :func:`mem`, :func:`pre`, :func:`post`,
:func:`vl`), :class:`Shift` (``LSL(3)``), :class:`Label`, plain ``int``/``float`` immediates and
strings for predicate patterns (``"all"``, ``"vl4"``) and conditions (``"eq"``).

>>> from isa.aarch64.registers import x1, x2, sp
>>> str(mem(x1, 8)), str(mem(x1, x2, lsl=3)), str(pre(sp, -16)), str(post(sp, 16)), str(vl(x1, 2))
('[x1, #8]', '[x1, x2, lsl #3]', '[sp, #-0x10]!', '[sp], #0x10', '[x1, #2, mul vl]')
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Callable, Sequence

from .registers import GPR, PReg, VReg, ZLane, ZReg

Fields = Sequence[tuple[int, int]]
Draw = Callable[[int, int], int]


def put(value: int, fields: Fields) -> int:
    """Split ``value`` over ``fields`` (most significant first) and return the instruction bits.

    >>> hex(put(0b10110, [(29, 2), (5, 3)]))  # 2 high bits at 29, 3 low bits at 5
    '0x400000c0'
    """
    bits = 0
    for lo, width in reversed(fields):
        bits |= (value & ((1 << width) - 1)) << lo
        value >>= width
    return bits


def imm_text(value: int) -> str:
    """Immediate as capstone prints it: decimal up to 9, hex beyond.

    >>> imm_text(9), imm_text(16), imm_text(-1), imm_text(-16)
    ('#9', '#0x10', '#-1', '#-0x10')
    """
    if -9 <= value <= 9:
        return f"#{value}"
    return f"#-0x{-value:x}" if value < 0 else f"#0x{value:x}"


# ---------------------------------------------------------------- user operand values

@dataclass(frozen=True)
class Shift:
    """A register shift operand, ``LSL(3)`` prints as ``lsl #3``."""
    op: str
    amount: int

    def __str__(self) -> str:
        return f"{self.op} #{self.amount}"


def LSL(n: int) -> Shift:
    """``lsl #n`` shift operand. ``str(LSL(3))`` is ``'lsl #3'``."""
    return Shift("lsl", n)


def LSR(n: int) -> Shift:
    """``lsr #n`` shift operand."""
    return Shift("lsr", n)


def ASR(n: int) -> Shift:
    """``asr #n`` shift operand."""
    return Shift("asr", n)


@dataclass(frozen=True)
class Mem:
    """Memory operand: ``[base, #offset]``, ``[base, index, lsl #shift]``, pre/post-indexed, or SVE
    ``[base, #offset, mul vl]`` (offset counted in vector lengths)."""
    base: GPR
    offset: int = 0
    index: GPR | None = None
    shift: int = 0
    mode: str | None = None          # None, "pre" or "post"
    mul_vl: bool = False

    def __str__(self) -> str:
        if self.index is not None:
            sh = f", lsl #{self.shift}" if self.shift else ""
            return f"[{self.base}, {self.index}{sh}]"
        if self.mode == "post":
            return f"[{self.base}], {imm_text(self.offset)}"
        if self.mul_vl:
            return f"[{self.base}, {imm_text(self.offset)}, mul vl]" if self.offset else f"[{self.base}]"
        if self.mode == "pre":
            return f"[{self.base}, {imm_text(self.offset)}]!"
        return f"[{self.base}, {imm_text(self.offset)}]" if self.offset else f"[{self.base}]"


def mem(base: GPR, offset: "int | GPR" = 0, lsl: int = 0) -> Mem:
    """``[base, #offset]`` or, with a register offset, ``[base, index, lsl #lsl]``.

    >>> from isa.aarch64.registers import x0, x1
    >>> str(mem(x0)), str(mem(x0, x1))
    ('[x0]', '[x0, x1]')
    """
    if isinstance(offset, GPR):
        return Mem(base, index=offset, shift=lsl)
    return Mem(base, _offset(offset))


def pre(base: GPR, offset: int) -> Mem:
    """Pre-indexed ``[base, #offset]!`` (base is updated before the access)."""
    return Mem(base, _offset(offset), mode="pre")


def post(base: GPR, offset: int) -> Mem:
    """Post-indexed ``[base], #offset`` (base is updated after the access)."""
    return Mem(base, _offset(offset), mode="post")


def vl(base: GPR, offset: int = 0) -> Mem:
    """SVE ``[base, #offset, mul vl]``: offset in whole vectors (contiguous loads/stores, ldr/str z)."""
    return Mem(base, _offset(offset), mul_vl=True)


def _offset(offset):
    """An immediate offset as an int (NumPy integers too); a float or bool would be cut silently."""
    if isinstance(offset, bool) or not isinstance(offset, numbers.Integral):
        raise TypeError(f"offset {offset!r} ({type(offset).__name__}): expected an int number of bytes (or "
                        "vectors for vl)")
    return int(offset)


class Label:
    """A branch target; create with ``Assembler.label()``, place with ``Assembler.bind()``."""

    def __init__(self, name: str = ""):
        self.name = name
        self.offset: int | None = None
        self.owner = None                   # the assembler that bound it

    def __repr__(self) -> str:
        return f"Label({self.name!r} @ {self.offset})"


# ---------------------------------------------------------------- kinds

class Kind:
    """Base of operand kinds; ``default`` is not None for an optional trailing operand."""
    name = "?"
    default = None

    def match(self, op, ops) -> bool:
        raise NotImplementedError

    def encode(self, op, ops) -> int:
        raise NotImplementedError

    def text(self, op, pc: int) -> str:
        return str(op)

    def sample(self, draw: Draw, ops):
        raise NotImplementedError


def _range_ok(v, lo, hi, step=1):
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi and v % step == 0


class Gpr(Kind):
    """A general register in a 5-bit field; ``sp`` says whether number 31 means sp (else xzr/wzr)."""

    def __init__(self, lo: int, bits: int = 64, sp: bool = False, role: str = "d", default=None):
        self.lo, self.bits, self.sp, self.default = lo, bits, sp, default
        p = "X" if bits == 64 else "W"
        self.name = f"{p}{role}" + ("|SP" if sp else "")

    def match(self, op, ops):
        if not isinstance(op, GPR) or op.bits != self.bits:
            return False
        return op.num < 31 or op.is_sp == self.sp

    def encode(self, op, ops):
        return op.num << self.lo

    def sample(self, draw, ops):
        return GPR(draw(0, 30), self.bits)


class Zr(Kind):
    """An SVE vector register with element size ``size`` (None: printed without suffix)."""

    def __init__(self, lo: int, size: str | None, width: int = 5, role: str = "d"):
        self.lo, self.size, self.width = lo, size, width
        self.name = f"Z{role}" + (f".{size.upper()}" if size else "") + ("" if width == 5 else f"(z0-z{(1 << width) - 1})")

    def match(self, op, ops):
        return isinstance(op, ZReg) and op.size == self.size and op.num < (1 << self.width)

    def encode(self, op, ops):
        return op.num << self.lo

    def sample(self, draw, ops):
        return ZReg(draw(0, (1 << self.width) - 1), self.size)


class ZList(Zr):
    """A one-register list ``{z0.s}`` of SVE loads/stores (the user passes ``z0.s``)."""

    def __init__(self, lo: int, size: str):
        super().__init__(lo, size, role="t")
        self.name = "{" + self.name + "}"

    def text(self, op, pc):
        return "{" + str(op) + "}"


class ZIndexed(Kind):
    """An indexed lane ``zm.s[i]``: the register in a narrow field, the index split over ``fields``."""

    def __init__(self, size: str, reg_width: int, index_fields: Fields, reg_lo: int = 16):
        self.size, self.reg_width, self.index_fields, self.reg_lo = size, reg_width, index_fields, reg_lo
        self.nidx = 1 << sum(w for _, w in index_fields)
        self.name = f"Z{'m' if reg_lo == 16 else 'n'}.{size.upper()}[0-{self.nidx - 1}]" + (
            f"(z0-z{(1 << reg_width) - 1})" if reg_width < 5 else "")

    def match(self, op, ops):
        return (isinstance(op, ZLane) and op.reg.size == self.size and op.reg.num < (1 << self.reg_width)
                and 0 <= op.index < self.nidx)

    def encode(self, op, ops):
        return (op.reg.num << self.reg_lo) | put(op.index, self.index_fields)

    def text(self, op, pc):
        return f"{op.reg}[{imm_text(op.index)[1:]}]"

    def sample(self, draw, ops):
        return ZReg(draw(0, (1 << self.reg_width) - 1), self.size)[draw(0, self.nidx - 1)]


class Pr(Kind):
    """A predicate: governing (``qual`` 'm'/'z', 3-bit field: p0-p7), sized (``p0.s``) or plain."""

    def __init__(self, lo: int, width: int = 4, size: str | None = None, qual: str | None = None):
        self.lo, self.width, self.size, self.qual = lo, width, size, qual
        self.name = ("Pg" if width == 3 else "P") + (f"/{qual.upper()}" if qual else "") + (
            f".{size.upper()}" if size else "") + (f"(p0-p{(1 << width) - 1})" if width < 4 else "")

    def match(self, op, ops):
        return (isinstance(op, PReg) and op.size == self.size and op.qual == self.qual
                and op.num < (1 << self.width))

    def encode(self, op, ops):
        return op.num << self.lo

    def sample(self, draw, ops):
        return PReg(draw(0, (1 << self.width) - 1), self.size, self.qual)


class Vr(Kind):
    """A SIMD&FP scalar view register (``d8``) in a 5-bit field."""

    def __init__(self, lo: int, width: str = "d", role: str = "t"):
        self.lo, self.width, self.name = lo, width, f"{width.upper()}{role}"

    def match(self, op, ops):
        return isinstance(op, VReg) and op.width == self.width

    def encode(self, op, ops):
        return op.num << self.lo

    def sample(self, draw, ops):
        return VReg(draw(0, 31), self.width)


class Tied(Kind):
    """The same register as operand ``index`` (destructive SVE forms: ``fadd z0.s, p0/m, z0.s, z1.s``)."""

    def __init__(self, index: int):
        self.index, self.name = index, f"<same as operand {index + 1}>"

    def match(self, op, ops):
        return op == ops[self.index]

    def encode(self, op, ops):
        return 0

    def sample(self, draw, ops):
        return ops[self.index]


class Imm(Kind):
    """An integer immediate ``lo..hi`` in steps of ``step``; encodes ``(v - bias) // step`` into
    ``fields`` unless ``enc`` (value -> bits) is given. ``fmt`` builds the printed text."""

    def __init__(self, fields: Fields, lo: int, hi: int, step: int = 1, bias: int = 0,
                 enc: Callable[[int], int] | None = None, fmt: Callable[[int], str] = imm_text,
                 name: str = "#imm", default=None):
        self.fields, self.lo, self.hi, self.step, self.bias = fields, lo, hi, step, bias
        self.enc, self.fmt, self.default = enc, fmt, default
        self.name = f"{name}({lo}..{hi}" + (f" step {step}" if step > 1 else "") + ")"

    def match(self, op, ops):
        return _range_ok(op, self.lo, self.hi, self.step) and (self.enc is None or self.enc(op) is not None)

    def encode(self, op, ops):
        return self.enc(op) if self.enc else put((op - self.bias) // self.step, self.fields)

    def text(self, op, pc):
        return self.fmt(op)

    def sample(self, draw, ops):
        return draw(self.lo // self.step, self.hi // self.step) * self.step


class Choice(Kind):
    """One of a fixed set of values (floats like 0.0/1.0, shift names, patterns, conditions)."""

    def __init__(self, lo: int, table: dict, name: str, fmt: Callable = str, default=None):
        self.lo, self.table, self.name, self.fmt, self.default = lo, table, name, fmt, default
        self.keys = list(table)

    def _key(self, op):
        if isinstance(op, bool):
            return None
        if isinstance(self.keys[0], float):
            return float(op) if isinstance(op, (int, float)) and float(op) in self.table else None
        return op if type(op) is type(self.keys[0]) and op in self.table else None

    def match(self, op, ops):
        return self._key(op) is not None

    def encode(self, op, ops):
        return self.table[self._key(op)] << self.lo

    def text(self, op, pc):
        return self.fmt(self._key(op))

    def sample(self, draw, ops):
        return self.keys[draw(0, len(self.keys) - 1)]


class ShiftKind(Kind):
    """Optional register shift ``lsl|lsr|asr #n``: type at ``type_lo``, amount in a 6-bit field."""

    def __init__(self, ops: Sequence[str], bits: int = 64, type_lo: int = 22, amount_lo: int = 10):
        self.ops, self.bits, self.type_lo, self.amount_lo = list(ops), bits, type_lo, amount_lo
        self.default = Shift("lsl", 0)
        self.name = "{" + "|".join(self.ops) + f" #0..{bits - 1}" + "}"

    def match(self, op, ops):
        return isinstance(op, Shift) and op.op in self.ops and 0 <= op.amount < self.bits

    def encode(self, op, ops):
        return (["lsl", "lsr", "asr", "ror"].index(op.op) << self.type_lo) | (op.amount << self.amount_lo)

    def sample(self, draw, ops):
        return Shift(self.ops[draw(0, len(self.ops) - 1)], draw(0, self.bits - 1))


class LabelKind(Kind):
    """A pc-relative target (Label or byte offset int), ``scale``-byte units in ``fields``."""

    def __init__(self, fields: Fields, scale: int = 4):
        self.fields, self.scale = fields, scale
        self.bits = sum(w for _, w in fields)
        self.name = f"label(±{(1 << (self.bits - 1)) * scale} bytes)"

    def match(self, op, ops):
        if isinstance(op, Label):
            return True
        lim = (1 << (self.bits - 1)) * self.scale
        return _range_ok(op, -lim, lim - self.scale, self.scale)

    def encode(self, op, ops):
        return 0 if isinstance(op, Label) else self.patch(op)

    def patch(self, offset: int) -> int:
        lim = (1 << (self.bits - 1)) * self.scale
        if not (-lim <= offset < lim) or offset % self.scale:
            raise ValueError(f"branch offset {offset} out of range for {self.name}")
        return put(offset // self.scale, self.fields)

    def text(self, op, pc):
        return imm_text(pc + op)

    def sample(self, draw, ops):
        return draw(-(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1) * self.scale


class MemKind(Kind):
    """A memory operand: base in bits 5-9 plus one of: immediate offset (``scale``-byte units, ``bits``
    wide, signed or not; ``mode`` None/pre/post; ``mul_vl``), or index register in bits 16-20 with
    the allowed ``shifts`` ({amount: extra bits}). ``zr_index`` False rejects xzr as index (SVE)."""

    def __init__(self, *, scale: int = 1, bits: int = 0, signed: bool = True, fields: Fields = (),
                 mode: str | None = None, mul_vl: bool = False, shifts: dict | None = None,
                 zr_index: bool = True):
        self.scale, self.bits, self.signed, self.fields = scale, bits, signed, fields
        self.mode, self.mul_vl, self.shifts, self.zr_index = mode, mul_vl, shifts, zr_index
        if shifts is not None:
            nz = [s for s in shifts if s]
            if 0 in shifts and nz:
                self.name = f"[Xn|SP, Xm{{, lsl #{nz[0]}}}]"
            else:
                self.name = f"[Xn|SP, Xm, lsl #{nz[0]}]" if nz else "[Xn|SP, Xm]"
        else:
            lo, hi = self.imm_range()
            body = f"#{lo}..{hi}" + (f" step {scale}" if scale > 1 and not mul_vl else "") + (", mul vl" if mul_vl else "")
            self.name = {"pre": f"[Xn|SP, {body}]!", "post": f"[Xn|SP], {body}"}.get(mode, f"[Xn|SP, {body}]")

    def imm_range(self):
        unit = 1 if self.mul_vl else self.scale
        if self.signed:
            return -(1 << (self.bits - 1)) * unit, ((1 << (self.bits - 1)) - 1) * unit
        return 0, ((1 << self.bits) - 1) * unit

    def match(self, op, ops):
        if not isinstance(op, Mem) or not (op.base.is_sp or (op.base.bits == 64 and op.base.num < 31)):
            return False
        if op.base.bits != 64 or not (op.index is None or isinstance(op.index, GPR)):
            return False
        if self.shifts is not None:
            return (op.index is not None and op.index.bits == 64 and not op.index.is_sp and op.mode is None
                    and not op.mul_vl and op.shift in self.shifts and (self.zr_index or op.index.num < 31))
        if op.index is not None or op.mode != self.mode or op.mul_vl != self.mul_vl:
            return False
        lo, hi = self.imm_range()
        return _range_ok(op.offset, lo, hi, 1 if self.mul_vl else self.scale)

    def encode(self, op, ops):
        bits = op.base.num << 5
        if self.shifts is not None:
            return bits | (op.index.num << 16) | self.shifts[op.shift]
        return bits | put(op.offset // (1 if self.mul_vl else self.scale), self.fields)

    def sample(self, draw, ops):
        n = draw(0, 31)
        base = GPR(31, 64, True) if n == 31 else GPR(n)
        if self.shifts is not None:
            keys = list(self.shifts)
            return Mem(base, index=GPR(draw(0, 30)), shift=keys[draw(0, len(keys) - 1)])
        lo, hi = self.imm_range()
        unit = 1 if self.mul_vl else self.scale
        return Mem(base, draw(lo // unit, hi // unit) * unit, mode=self.mode, mul_vl=self.mul_vl)


class ZMemKind(Kind):
    """A gather address ``[Xn|SP, Zm.s, uxtw]`` (32-bit byte offsets, zero-extended) or
    ``[Xn|SP, Zm.d]`` (64-bit byte offsets): base in bits 5-9, offset vector in bits 16-20. The
    user writes ``Mem(base, index=z5.s)``."""

    def __init__(self, size: str):
        self.size = size
        self.name = f"[Xn|SP, Zm.{size.upper()}" + (", uxtw]" if size == "s" else "]")

    def match(self, op, ops):
        return (isinstance(op, Mem) and isinstance(op.index, ZReg) and op.index.size == self.size
                and op.mode is None and not op.mul_vl and op.shift == 0 and op.offset == 0
                and (op.base.is_sp or (op.base.bits == 64 and op.base.num < 31)))

    def encode(self, op, ops):
        return (op.base.num << 5) | (op.index.num << 16)

    def text(self, op, pc):
        return f"[{op.base}, {op.index}" + (", uxtw]" if self.size == "s" else "]")

    def sample(self, draw, ops):
        n = draw(0, 31)
        return Mem(GPR(31, 64, True) if n == 31 else GPR(n), index=ZReg(draw(0, 31), self.size))
