"""x86-64 registers as objects, and memory operands written naturally.

``[rax + rcx*4 + 64]`` (a one-element list, PeachPy's style) or ``ptr(rax + rcx*4 + 64)`` is a
memory operand; ``bcst(rax + 8)`` is an AVX-512 embedded broadcast; ``zmm0.mask(k1)`` and
``zmm0.mask(k1, zero=True)`` are masked destinations.

>>> from isa.x86.registers import rax, rcx, ptr
>>> ptr(rax + rcx*4 + 64)
[rax + rcx*4 + 64]
"""
import iced_x86 as ix


class Register:
    """One architectural register: ``kind`` is r64/r32/r16/r8/xmm/ymm/zmm/k/tmm, ``num`` its number.

    >>> from isa.x86 import zmm17
    >>> zmm17, zmm17.kind, zmm17.num
    (zmm17, 'zmm', 17)
    """

    __slots__ = ("name", "kind", "num", "iced", "signature")

    def __init__(self, name, kind, num):
        self.name, self.kind, self.num = name, kind, num
        self.iced = getattr(ix.Register, name.upper())
        # what form selection depends on: kind, needs EVEX, and the name for fixed-register forms
        self.signature = (kind, num >= 16, name if kind in ("r8", "r16", "r32", "r64") else None)

    def __repr__(self):
        return self.name

    # registers are singletons: identity equality and hashing (fast in the assembler's hot path)

    # address arithmetic: rax + 8, rax + rcx*4, rcx*4 + rax
    def __add__(self, other):
        return MemExpr(base=self) + other

    __radd__ = __add__

    def __sub__(self, other):
        return MemExpr(base=self) - other

    def __mul__(self, scale):
        if self.kind != "r64":
            raise TypeError(f"only 64-bit registers can index memory, not {self.name}")
        if scale not in (1, 2, 4, 8):
            raise ValueError(f"index scale must be 1, 2, 4 or 8, not {scale!r}")
        return MemExpr(index=self, scale=scale)

    __rmul__ = __mul__

    def mask(self, k, zero=False):
        """This vector register as a destination written under opmask ``k`` (merging or zeroing)."""
        if self.kind not in ("xmm", "ymm", "zmm", "k"):
            raise TypeError(f"only vector and opmask registers take an opmask, not {self.name}")
        return Masked(self, k, zero)

    @property
    def is_vector(self):
        return self.kind in ("xmm", "ymm", "zmm")


class Masked:
    """A register or memory destination with an AVX-512 opmask.

    >>> from isa.x86 import k1, zmm0
    >>> zmm0.mask(k1), zmm0.mask(k1, zero=True)
    (zmm0{k1}, zmm0{k1}{z})
    """

    __slots__ = ("operand", "k", "zero")

    def __init__(self, operand, k, zero):
        if not (isinstance(k, Register) and k.kind == "k") or k.num == 0:
            raise TypeError(f"an opmask must be one of k1..k7, not {k!r}")
        self.operand, self.k, self.zero = operand, k, zero

    def __repr__(self):
        return f"{self.operand!r}{{{self.k!r}}}" + ("{z}" if self.zero else "")


class MemExpr:
    """base + index*scale + disp, built with + and * on registers.

    >>> from isa.x86 import rax, rdi
    >>> e = rdi + rax * 4 + 8; e, e.scale, e.disp
    (rdi + rax*4 + 8, 4, 8)
    """

    __slots__ = ("base", "index", "scale", "disp")

    def __init__(self, base=None, index=None, scale=1, disp=0):
        self.base, self.index, self.scale, self.disp = base, index, scale, disp

    def __add__(self, other):
        if isinstance(other, int):
            return MemExpr(self.base, self.index, self.scale, self.disp + other)
        if isinstance(other, Register):
            other = MemExpr(base=other)
        if not isinstance(other, MemExpr):
            return NotImplemented
        bases = [r for r in (self.base, other.base) if r is not None]
        scaled = [(r, s) for r, s in ((self.index, self.scale), (other.index, other.scale)) if r is not None]
        if len(bases) + len(scaled) > 2 or len(scaled) > 1:
            raise ValueError(f"an x86 address has one base and one scaled index: {self!r} + {other!r}")
        if len(bases) == 2:
            base, (index, scale) = bases[0], (bases[1], 1)
        else:
            base = bases[0] if bases else None
            index, scale = scaled[0] if scaled else (None, 1)
        return MemExpr(base, index, scale, self.disp + other.disp)

    __radd__ = __add__

    def __sub__(self, other):
        if not isinstance(other, int):
            return NotImplemented
        return self + (-other)

    def __repr__(self):
        parts = [repr(self.base)] if self.base is not None else []
        if self.index is not None:
            parts.append(f"{self.index!r}*{self.scale}" if self.scale != 1 else repr(self.index))
        if self.disp or not parts:
            parts.append(str(self.disp))
        return " + ".join(parts).replace("+ -", "- ")


class Mem:
    """A memory operand; ``bcst`` marks an AVX-512 embedded broadcast.

    >>> from isa.x86 import Mem, rax
    >>> Mem(rax + 64), Mem(rax, bcst=True)
    ([rax + 64], bcst[rax])
    """

    __slots__ = ("expr", "bcst", "size")

    def __init__(self, expr, bcst=False, size=None):
        if isinstance(expr, Register):
            expr = MemExpr(base=expr)
        elif isinstance(expr, int):
            expr = MemExpr(disp=expr)
        if not isinstance(expr, MemExpr):
            raise TypeError(f"a memory operand is [base + index*scale + disp], not {expr!r}")
        for r in (expr.base, expr.index):
            if r is not None and r.kind != "r64":
                raise TypeError(f"addresses use 64-bit registers, not {r.name}")
        if not -2**31 <= expr.disp < 2**31:
            raise ValueError(f"displacement {expr.disp} does not fit in 32 bits")
        self.expr, self.bcst, self.size = expr, bcst, size

    def mask(self, k):
        """This memory destination written under opmask ``k`` (stores merge only)."""
        return Masked(self, k, False)

    def iced(self):
        e = self.expr
        return ix.MemoryOperand(e.base.iced if e.base else ix.Register.NONE,
                                e.index.iced if e.index else ix.Register.NONE,
                                e.scale, e.disp, 1 if e.disp else 0, self.bcst)

    def __repr__(self):
        size = _SIZE_NAMES.get(self.size, "")
        return ("bcst" if self.bcst else "") + size + f"[{self.expr!r}]"


class _Sized:
    """``dword[rax + 4]``: a memory operand of an explicit size, for forms the registers leave open."""

    def __init__(self, size):
        self.size = size

    def __getitem__(self, expr):
        return Mem(expr, size=self.size)


_SIZE_NAMES = {1: "byte", 2: "word", 4: "dword", 8: "qword", 16: "xword", 32: "yword", 64: "zword"}
byte, word, dword, qword, xword, yword, zword = (_Sized(n) for n in _SIZE_NAMES)


def ptr(expr):
    """A memory operand: ``ptr(rax + 64)`` is the same as ``[rax + 64]``.

    >>> from isa.x86 import ptr, rax
    >>> ptr(rax + 64)
    [rax + 64]
    """
    if isinstance(expr, list):
        (expr,) = expr
    return Mem(expr)


def bcst(expr):
    """An AVX-512 embedded-broadcast memory operand (``{1toN}``): ``bcst(rax + 4)``.

    >>> from isa.x86 import bcst, rax
    >>> bcst(rax + 4)
    bcst[rax + 4]
    """
    return Mem(ptr(expr).expr, bcst=True)


_GPR64 = ["rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi"] + [f"r{i}" for i in range(8, 16)]
_GPR32 = ["eax", "ecx", "edx", "ebx", "esp", "ebp", "esi", "edi"] + [f"r{i}d" for i in range(8, 16)]
_GPR16 = ["ax", "cx", "dx", "bx", "sp", "bp", "si", "di"] + [f"r{i}w" for i in range(8, 16)]
_GPR8 = ["al", "cl", "dl", "bl", "spl", "bpl", "sil", "dil"] + [f"r{i}l" for i in range(8, 16)]

REGISTERS = {}
for _kind, _names in (("r64", _GPR64), ("r32", _GPR32), ("r16", _GPR16), ("r8", _GPR8),
                      ("xmm", [f"xmm{i}" for i in range(32)]), ("ymm", [f"ymm{i}" for i in range(32)]),
                      ("zmm", [f"zmm{i}" for i in range(32)]), ("k", [f"k{i}" for i in range(8)]),
                      ("tmm", [f"tmm{i}" for i in range(8)])):
    for _num, _name in enumerate(_names):
        REGISTERS[_name] = Register(_name, _kind, _num)
REGISTERS["rip"] = Register("rip", "rip", 0)
globals().update(REGISTERS)

GPR64 = [REGISTERS[n] for n in _GPR64]
XMM = [REGISTERS[f"xmm{i}"] for i in range(32)]
YMM = [REGISTERS[f"ymm{i}"] for i in range(32)]
ZMM = [REGISTERS[f"zmm{i}"] for i in range(32)]
K = [REGISTERS[f"k{i}"] for i in range(8)]
TMM = [REGISTERS[f"tmm{i}"] for i in range(8)]


def vec(width_bits, num):
    """The vector register of ``width_bits`` (128/256/512) with number ``num``: ``vec(256, 3)`` is ymm3.

    >>> from isa.x86 import vec
    >>> vec(256, 3), vec(512, 31)
    (ymm3, zmm31)
    """
    return {128: XMM, 256: YMM, 512: ZMM}[width_bits][num]


def gpr(num, bits=64):
    """The general-purpose register ``num`` viewed at ``bits`` (64/32/16/8): ``gpr(0, 32)`` is eax.

    >>> from isa.x86 import gpr
    >>> gpr(0, 32), gpr(8), gpr(7, 8)
    (eax, r8, dil)
    """
    return REGISTERS[{64: _GPR64, 32: _GPR32, 16: _GPR16, 8: _GPR8}[bits][num]]
