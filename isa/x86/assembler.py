"""A PeachPy-style x86-64 assembler whose encoder is iced-x86.

Instructions are methods named after their mnemonics; operands are register objects, memory
operands (``[rax + rcx*4 + 64]``), integers and labels. The form is chosen from the table in
:mod:`isa.x86.forms`; an operand combination no form accepts raises :class:`OperandError` listing
the accepted forms.

>>> from isa.x86.registers import rax, rdi
>>> a = Assembler()
>>> a.lea(rax, [rdi + 1]); a.ret()
>>> a.encode().hex()
'488d4701c3'
"""
import iced_x86 as ix

from .forms import ALIASES, forms
from .registers import Masked, Mem, Register


class OperandError(TypeError):
    """No form of the mnemonic accepts the operands given."""


class Label:
    """A position in the code; bind it with :meth:`Assembler.bind`, branch to it with ``jcc``."""

    __slots__ = ("name", "bound_at")

    def __init__(self, name=""):
        self.name, self.bound_at = name, None

    def __repr__(self):
        return f"Label({self.name or id(self):})"


def _operand_signature(op):
    if isinstance(op, Register):
        return (op.kind, op.num >= 16, op.name if op.kind in ("r8", "r16", "r32", "r64") else None)
    if isinstance(op, Mem):
        return ("mem", op.bcst, op.size)
    if isinstance(op, int):
        return ("imm", op.bit_length() if op >= 0 else -((-op - 1).bit_length()) - 1)
    if isinstance(op, Label):
        return ("label",)
    return ("?", type(op).__name__)


_CREATE = {}


def _creator(kinds):
    """iced's Instruction.create_* for an operand pattern such as ('reg', 'mem', 'u32')."""
    fn = _CREATE.get(kinds)
    if fn is None:
        fn = _CREATE[kinds] = getattr(ix.Instruction, "create_" + "_".join(kinds)) if kinds else ix.Instruction.create
    return fn


class Assembler:
    """Collects instructions; :meth:`encode` returns position-independent machine code."""

    def __init__(self):
        self.instructions = []
        self._branches = []      # (instruction index, label)
        self._labels = []        # bound labels
        self._cache = {}
        self.used = set()        # registers written or read, for the function builder

    # -- labels -----------------------------------------------------------------------------
    def label(self, name=""):
        """A new unbound label."""
        return Label(name)

    def bind(self, label):
        """Bind ``label`` to the next instruction emitted."""
        if label.bound_at is not None:
            raise ValueError(f"{label!r} is already bound")
        label.bound_at = len(self.instructions)
        self._labels.append(label)

    # -- emission ---------------------------------------------------------------------------
    def emit(self, mnemonic, *operands):
        """Encode ``mnemonic`` with ``operands``; the methods named after mnemonics call this."""
        mask = None
        ops = []
        for op in operands:
            if isinstance(op, list):
                (op,) = op
                op = Mem(op)
            elif isinstance(op, Masked):
                if mask is not None:
                    raise OperandError(f"{mnemonic}: only the destination takes an opmask")
                mask = op
                op = op.operand
                if isinstance(op, list):
                    op = Mem(op[0])
            if isinstance(op, bool):
                raise OperandError(f"{mnemonic}: {op!r} is not an operand")
            ops.append(op)
        key = (mnemonic, mask is not None, mask is not None and mask.zero) + tuple(map(_operand_signature, ops))
        form = self._cache.get(key)
        if form is None:
            form = self._cache[key] = self._select(mnemonic, ops, mask)
        self._append(form, ops, mask)

    def _select(self, mnemonic, ops, mask):
        candidates = forms(mnemonic)
        mnemonic = ALIASES.get(mnemonic, mnemonic)
        if not candidates:
            raise OperandError(f"unknown mnemonic {mnemonic!r}")
        masked, zero = mask is not None, mask is not None and mask.zero
        ok = [f for f in candidates if f.accepts(ops, masked, zero)]
        if not ok:
            accepted = "\n  ".join(sorted({f.text for f in candidates}))
            raise OperandError(f"{mnemonic} {', '.join(map(repr, ops))}: no form accepts these operands"
                               f"{' with an opmask' if masked else ''}; accepted forms:\n  {accepted}")
        mem = [op for op in ops if isinstance(op, Mem)]
        if mem and mem[0].size is None:
            sizes = {f.bcst_bytes if mem[0].bcst else f.mem_bytes for f in ok}
            if len(sizes) > 1:
                raise OperandError(f"{mnemonic} {', '.join(map(repr, ops))}: the memory size is ambiguous "
                                   f"({sorted(sizes)} bytes); write byte[...], word[...], dword[...] or qword[...]")
        return ok[0]

    def _append(self, form, ops, mask):
        kinds, args = [], [form.code]
        for slot, op in zip(form.ops, ops):
            if isinstance(op, Register):
                kinds.append("reg")
                args.append(op.iced)
                self.used.add(op)
            elif isinstance(op, Mem):
                kinds.append("mem")
                args.append(op.iced())
                self.used.update(r for r in (op.expr.base, op.expr.index) if r is not None)
            elif isinstance(op, Label):
                kinds = ["branch"]
                args.append(0)
            else:
                wide = slot.imm[0] == 64
                kinds.append(("i64" if wide else "i32") if op < 0 else ("u64" if wide else "u32"))
                args.append(op)
        ins = _creator(tuple(kinds))(*args)
        if mask is not None:
            ins.op_mask = mask.k.iced
            ins.zeroing_masking = mask.zero
        if kinds == ["branch"]:
            self._branches.append((len(self.instructions), ops[0]))
        self.instructions.append(ins)

    def __getattr__(self, mnemonic):
        if mnemonic in ("and_", "or_", "not_"):          # Python keywords
            mnemonic = mnemonic[:-1]
        if mnemonic.startswith("_") or not forms(mnemonic):
            raise AttributeError(f"no x86 mnemonic {mnemonic!r}")

        def instruction(*operands):
            self.emit(mnemonic, *operands)
        instruction.__name__ = mnemonic
        return instruction

    # -- output -----------------------------------------------------------------------------
    def prepend(self, other):
        """Put ``other``'s instructions (a prologue, say) before this assembler's."""
        shift = len(other.instructions)
        for label in self._labels:
            label.bound_at += shift
        self._branches = other._branches + [(i + shift, lbl) for i, lbl in self._branches]
        self._labels = other._labels + self._labels
        self.instructions = other.instructions + self.instructions
        self.used |= other.used

    def encode(self, rip=0):
        """Machine code for the instructions so far (branches resolved, shortened where they fit).

        iced's BlockEncoder finds branch targets by instruction ``ip``: a bound label's id is its
        instruction index + 1, every other instruction keeps ip 0.
        """
        if any(lbl.bound_at == len(self.instructions) for lbl in self._labels):
            self.emit("nop")
        for ins in self.instructions:
            ins.ip = 0
        for label in self._labels:
            self.instructions[label.bound_at].ip = label.bound_at + 1
        for index, label in self._branches:
            if label.bound_at is None:
                raise ValueError(f"branch to {label!r}, which was never bound")
            self.instructions[index].near_branch64 = label.bound_at + 1
        encoder = ix.BlockEncoder(64)
        encoder.add_many(self.instructions)
        return encoder.encode(rip)

    def __len__(self):
        return len(self.instructions)
