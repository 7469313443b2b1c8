"""AArch64 assembler: one method per mnemonic of the encoding table, labels with fixups, an AAPCS64
function builder and capstone disassembly.

Methods are named after mnemonics (``b.eq`` is ``b_eq``, ``and`` is ``and_``); each picks the first
table form whose operand kinds accept the arguments, and raises :class:`OperandError` listing the
accepted forms otherwise.

>>> from isa.aarch64.registers import x0, x1, z0, z1, z2, p0
>>> from isa.aarch64.operands import vl
>>> a = Assembler()
>>> loop = a.label("loop")
>>> a.ptrue(p0.s); a.bind(loop)
>>> a.ld1w(z1.s, p0.z, vl(x0)); a.fmla(z0.s, p0.m, z1.s, z2.s); a.subs(x1, x1, 1); a.b_ne(loop)
>>> for line in a.disassemble().splitlines():
...     print(line.split()[1:3])          # our encoding, capstone's mnemonic
['2598e3e0', 'ptrue']
['a540a001', 'ld1w']
['65a20020', 'fmla']
['f1000421', 'subs']
['54ffffa1', 'b.ne']
"""
from __future__ import annotations

import keyword
import struct

from .encodings import FORMS, Form
from .operands import Label, LabelKind, Mem
from .registers import GPR, VReg, ZLane, ZReg, sp, x

__all__ = ["Assembler", "Function", "OperandError", "disassemble"]


class OperandError(TypeError):
    """No form of a mnemonic accepts the given operands."""


def _pyname(mnemonic: str) -> str:
    name = mnemonic.replace(".", "_")
    return name + "_" if keyword.iskeyword(name) else name


# SVE condition aliases of b.cond (after ptest/whilelo set the flags)
SVE_CONDS = {"first": "mi", "nfrst": "pl", "none": "eq", "any": "ne", "last": "lo", "nlast": "hs",
             "pmore": "hi", "plast": "ls", "tcont": "ge", "tstop": "lt"}


class Assembler:
    """Collects instruction words; labels are resolved when :meth:`code` is called."""

    def __init__(self):
        self.words: list[int] = []
        self.fixups: list[tuple[int, LabelKind, Label]] = []
        self.used: set[tuple[str, int]] = set()   # ("x", n) / ("v", n) registers touched
        self.mnemonics: list[str] = []            # one per emitted instruction (raw words: "")

    # -- core
    def emit(self, mnemonic: str, *ops) -> None:
        """Encode one instruction, e.g. ``emit("fmla", z0.s, p0.m, z1.s, z2.s)``."""
        forms: list[Form] = FORMS.get(mnemonic, [])
        if not forms:
            raise OperandError(f"unknown mnemonic {mnemonic!r}")
        for form in forms:
            full = form.fill(ops)
            if full is not None and form.match(full):
                break
        else:
            accepted = "\n  ".join(f.signature() for f in forms)
            given = ", ".join(str(o) for o in ops)
            raise OperandError(f"{mnemonic} {given}: no form accepts these operands; accepted forms:\n  {accepted}")
        if mnemonic in ("bl", "blr"):
            self.used.add(("x", 30))
        for k, op in zip(form.kinds, full):
            if isinstance(op, Label):
                self.fixups.append((len(self.words), k, op))
            self._track(op)
        self.words.append(form.encode(full))
        self.mnemonics.append(mnemonic)

    def _track(self, op) -> None:
        if isinstance(op, GPR) and op.num < 31:
            self.used.add(("x", op.num))
        elif isinstance(op, (ZReg, VReg)):
            self.used.add(("v", op.num))
        elif isinstance(op, ZLane):
            self.used.add(("v", op.reg.num))
        elif isinstance(op, Mem):
            self._track(op.base)
            if op.index is not None:
                self._track(op.index)

    def word(self, value: int) -> None:
        """Emit a raw 32-bit word."""
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 32:
            raise OperandError(f"word({value!r}): expected an int from 0 to 2**32 - 1 (one instruction's bits)")
        self.words.append(value)
        self.mnemonics.append("")

    def raw(self, code: bytes) -> None:
        """Append already assembled, position-independent code (length a multiple of 4)."""
        if len(code) % 4:
            raise ValueError(f"raw: {len(code)} bytes of code; AArch64 instructions are 4 bytes each, so the length "
                             "must be a multiple of 4")
        self.words += struct.unpack(f"<{len(code) // 4}I", code)
        self.mnemonics += [""] * (len(code) // 4)

    @property
    def pc(self) -> int:
        """Current offset in bytes."""
        return 4 * len(self.words)

    def label(self, name: str = "") -> Label:
        """A new unbound label."""
        return Label(name)

    def bind(self, label: Label) -> None:
        """Place ``label`` at the current offset."""
        if label.offset is not None:
            raise ValueError(f"label {label.name!r} bound twice")
        label.offset, label.owner = self.pc, self

    def code(self) -> bytes:
        """The machine code with all branch targets resolved."""
        words = list(self.words)
        for index, kind, label in self.fixups:
            if label.offset is None:
                raise ValueError(f"label {label.name!r} used but never bound")
            if label.owner is not None and label.owner is not self:      # (None: an offset set by hand)
                raise ValueError(f"label {label.name!r} was bound in another assembler (its offset there means "
                                 "nothing here): make a label of this one (asm.label()) and bind it here")
            words[index] |= kind.patch(label.offset - 4 * index)
        return struct.pack(f"<{len(words)}I", *words)

    def disassemble(self, address: int = 0) -> str:
        """The code as text via capstone (a ``ModuleNotFoundError`` naming the pip command when capstone
        is not installed)."""
        return disassemble(self.code(), address)

    # -- helpers built from table instructions
    def mov_imm(self, reg: GPR, value: int) -> None:
        """Load any 64-bit (or 32-bit for a w register) constant with movz/movn + movk.

        >>> from isa.aarch64.registers import x3
        >>> a = Assembler(); a.mov_imm(x3, 0x123400005678); len(a.words)
        2
        """
        from .operands import LSL
        bits = reg.bits
        if isinstance(value, bool) or not isinstance(value, int) or not -(1 << (bits - 1)) <= value < 1 << bits:
            raise OperandError(f"mov_imm({reg}, {value!r}): expected an int that fits {bits} bits "
                               f"({-(1 << (bits - 1))} to {(1 << bits) - 1}); it would be cut silently")
        value &= (1 << bits) - 1
        chunks = [(value >> s) & 0xFFFF for s in range(0, bits, 16)]
        inverted = sum(c == 0xFFFF for c in chunks) > sum(c == 0 for c in chunks)
        fill = 0xFFFF if inverted else 0
        first = True
        for i, c in enumerate(chunks):
            if c == fill and not (first and i == len(chunks) - 1):
                continue
            if first:
                self.emit("movn" if inverted else "movz", reg, (c ^ fill) if inverted else c, LSL(16 * i))
                first = False
            else:
                self.emit("movk", reg, c, LSL(16 * i))
        if first:
            self.emit("movn" if inverted else "movz", reg, 0, LSL(0))


def _make_method(mnemonic: str):
    def method(self, *ops):
        self.emit(mnemonic, *ops)
    method.__name__ = _pyname(mnemonic)
    method.__doc__ = "\n".join(["Forms:"] + [f"    {f.signature()}" for f in FORMS[mnemonic]])
    return method


for _mn in FORMS:
    setattr(Assembler, _pyname(_mn), _make_method(_mn))
for _alias, _cond in SVE_CONDS.items():
    setattr(Assembler, f"b_{_alias}", _make_method(f"b.{_cond}"))
del _mn, _alias, _cond


def disassemble(code: bytes, address: int = 0) -> str:
    """Disassemble AArch64 code with capstone, one ``address: word  text`` line per instruction.

    >>> disassemble(bytes.fromhex("c0035fd6")).split()[:3]
    ['0:', 'd65f03c0', 'ret']
    """
    try:
        import capstone
    except ModuleNotFoundError as e:
        if e.name != "capstone":
            raise
        raise ModuleNotFoundError("disassembling AArch64 code needs capstone, an optional package: "
                                  "pip install capstone (or tppasm[test])", name="capstone") from e
    md = capstone.Cs(capstone.CS_ARCH_ARM64, capstone.CS_MODE_ARM)
    lines = []
    for off in range(0, len(code) - len(code) % 4, 4):
        word = int.from_bytes(code[off:off + 4], "little")
        ins = list(md.disasm(code[off:off + 4], address + off))
        text = f"{ins[0].mnemonic} {ins[0].op_str}".strip() if ins else f".word 0x{word:08x}"
        lines.append(f"{address + off:8x}: {word:08x}  {text}")
    return "\n".join(lines)


class Function:
    """An AAPCS64 function: integer/pointer arguments arrive in x0-x7; the callee-saved registers the
    body touches (x19-x28, x29/x30, and the low 64 bits of v8-v15 / z8-z15) are saved in a
    prologue that keeps sp 16-byte aligned; ``frame`` bytes of scratch stack sit at ``[sp]``.

    >>> from isa.aarch64.registers import x19, x0
    >>> f = Function(nargs=1)
    >>> f.asm.mov(x19, f.args[0]); f.asm.add(x0, x19, 1); f.ret()
    >>> [line.split()[1:3] for line in disassemble(f.code()).splitlines()]
    [['f81f0ff3', 'str'], ['aa0003f3', 'mov'], ['91000660', 'add'], ['14000001', 'b'], ['f84107f3', 'ldr'], ['d65f03c0', 'ret']]
    """

    def __init__(self, nargs: int = 0, frame: int = 0):
        if not 0 <= nargs <= 8:
            raise ValueError("at most 8 register arguments (x0-x7)")
        if type(frame) is not int or not (0 <= frame < 4096 or frame % 4096 == 0 and frame < 1 << 24):
            raise ValueError(f"Function(frame={frame!r}): expected an int number of bytes, 0 to 4095 or a multiple of "
                             "4096 below 16 MiB (what sub sp, sp, #imm12{, lsl 12} reserves); keep larger buffers "
                             "in arrays")
        self.asm = Assembler()
        self.args = tuple(x[:nargs])
        self.frame = (frame + 15) & ~15
        self._exit = Label("epilogue")

    def ret(self) -> None:
        """Return from the function (branches to the shared epilogue)."""
        self.asm.b(self._exit)

    def saved(self) -> tuple[list[GPR], list[VReg]]:
        """Callee-saved registers the body uses: general, then SIMD&FP (d views)."""
        from .registers import d
        gp = [x[n] for n in range(19, 31) if ("x", n) in self.asm.used]
        fp = [d[n] for n in range(8, 16) if ("v", n) in self.asm.used]
        return gp, fp

    def _save_restore(self, a: Assembler, regs: list, store: bool) -> None:
        from .operands import post, pre
        pairs = [regs[i:i + 2] for i in range(0, len(regs), 2)]
        for pair in (pairs if store else reversed(pairs)):
            if len(pair) == 2:
                (a.stp(*pair, pre(sp, -16)) if store else a.ldp(*pair, post(sp, 16)))
            else:
                (a.str(pair[0], pre(sp, -16)) if store else a.ldr(pair[0], post(sp, 16)))

    def code(self) -> bytes:
        """Prologue + body + epilogue as bytes (position independent)."""
        gp, fp = self.saved()
        pro, epi = Assembler(), Assembler()
        self._save_restore(pro, gp, True)
        self._save_restore(pro, fp, True)
        if self.frame:
            pro.sub(sp, sp, self.frame)
            epi.add(sp, sp, self.frame)
        self._save_restore(epi, fp, False)
        self._save_restore(epi, gp, False)
        epi.ret()
        self._exit.offset = None            # (re)bound at the body's end: code may have been added since a last call
        self.asm.bind(self._exit)
        return pro.code() + self.asm.code() + epi.code()
