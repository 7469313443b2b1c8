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
import numbers

import iced_x86 as ix

from .forms import ALIASES, forms
from .registers import Masked, Mem, Register


class OperandError(TypeError):
    """No form of the mnemonic accepts the operands given; the message lists the forms it has.

    >>> from isa.x86.registers import rax, xmm0
    >>> try:
    ...     Assembler().add(rax, xmm0)
    ... except OperandError as e:
    ...     print(str(e).splitlines()[0])
    add rax, xmm0: no form accepts these operands; accepted forms:
    """


class Label:
    """A position in the code; bind it with :meth:`Assembler.bind`, branch to it with ``jcc``.

    >>> from isa.x86.registers import rax
    >>> a = Assembler()
    >>> top = a.label("top")
    >>> a.bind(top); a.dec(rax); a.jnz(top)
    >>> a.encode().hex()                 # dec rax; jnz top (5 bytes back)
    '48ffc875fb'
    """

    __slots__ = ("name", "bound_at")

    def __init__(self, name=""):
        self.name, self.bound_at = name, None

    def __repr__(self):
        return f"Label({self.name or id(self):})"


def _operand_signature(op):
    if isinstance(op, Register):
        return op.signature
    if isinstance(op, Mem):
        return ("mem", op.bcst, op.size)
    if isinstance(op, int):
        return ("imm", op.bit_length() if op >= 0 else -((-op - 1).bit_length()) - 1)
    if isinstance(op, Label):
        return ("label",)
    return ("?", type(op).__name__)


_CREATE = {}
_FORM_CACHE = {}     # (mnemonic, mask flags, operand signatures) -> (form, iced constructor)
_REGS_CACHE = {}     # (mnemonic, registers) -> (opcode, iced constructor, iced registers): the hot path


def _create_kinds(form, ops):
    """The operand pattern naming iced's constructor, e.g. ('reg', 'mem', 'u32')."""
    kinds = []
    for slot, op in zip(form.ops, ops):
        if isinstance(op, Register):
            kinds.append("reg")
        elif isinstance(op, Mem):
            kinds.append("mem")
        elif isinstance(op, Label):
            return ("branch",)
        else:
            wide = slot.imm[0] == 64
            kinds.append(("i64" if wide else "i32") if op < 0 else ("u64" if wide else "u32"))
    return tuple(kinds)


def _creator(kinds):
    """iced's Instruction.create_* for an operand pattern such as ('reg', 'mem', 'u32')."""
    fn = _CREATE.get(kinds)
    if fn is None:
        fn = _CREATE[kinds] = getattr(ix.Instruction, "create_" + "_".join(kinds)) if kinds else ix.Instruction.create
    return fn


class Assembler:
    """Collects instructions; :meth:`encode` returns position-independent machine code.

    >>> from isa.x86.registers import eax
    >>> a = Assembler()
    >>> a.xor(eax, eax); a.ret()
    >>> a.encode().hex()
    '33c0c3'
    """

    def __init__(self):
        self.instructions = []
        self._branches = []      # (instruction index, label)
        self._labels = []        # bound labels
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
    def emit(self, mnemonic, *operands, lock=False):
        """Encode ``mnemonic`` with ``operands``; the methods named after mnemonics call this.

        ``lock=True`` adds the LOCK prefix (``a.xadd([rdi], eax, lock=True)``); only forms that
        accept it (a memory destination of an atomic read-modify-write) do.
        """
        try:
            hit = _REGS_CACHE.get((mnemonic, operands))    # registers hash by identity: no signatures
        except TypeError:                                  # a list operand ([rax + 8]): never cached
            hit = None
        if hit is not None and not lock:
            code, create, iced = hit
            self.instructions.append(create(code, *iced))
            self.used.update(operands)
            return
        mask = None
        ops = []
        for op in operands:
            t = type(op)
            if t is list:
                (op,) = op
                op = Mem(op)
            elif t is Masked:
                if mask is not None:
                    raise OperandError(f"{mnemonic}: only the destination takes an opmask")
                mask = op
                op = op.operand
                if isinstance(op, list):
                    op = Mem(op[0])
            elif t is bool:
                raise OperandError(f"{mnemonic}: {op!r} is not an operand")
            elif t is not int and isinstance(op, numbers.Integral):
                op = int(op)                        # a NumPy integer as an immediate
            ops.append(op)
        key = (mnemonic, mask is not None, mask is not None and mask.zero) + tuple(map(_operand_signature, ops))
        cached = _FORM_CACHE.get(key)
        if cached is None:
            form = self._select(mnemonic, ops, mask)
            cached = _FORM_CACHE[key] = (form, _creator(_create_kinds(form, ops)))
        form, create = cached
        if lock and not (ix.OpCodeInfo(form.code).can_use_lock_prefix and isinstance(ops[0], Mem)):
            raise OperandError(f"{form.text}: this form does not take a LOCK prefix")
        self._append(form, create, ops, mask)
        if lock:
            self.instructions[-1].has_lock_prefix = True
        elif mask is None and ops and all(type(op) is Register for op in ops):
            _REGS_CACHE[(mnemonic, tuple(ops))] = (form.code, create, tuple(op.iced for op in ops))

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

    def _append(self, form, create, ops, mask):
        args = [form.code]
        used = self.used
        for op in ops:
            if isinstance(op, Register):
                args.append(op.iced)
                used.add(op)
            elif isinstance(op, Mem):
                args.append(op.iced())
                e = op.expr
                if e.base is not None:
                    used.add(e.base)
                if e.index is not None:
                    used.add(e.index)
            elif isinstance(op, Label):
                args.append(0)
                self._branches.append((len(self.instructions), op))
            else:
                args.append(op)
        ins = create(*args)
        if mask is not None:
            ins.op_mask = mask.k.iced
            ins.zeroing_masking = mask.zero
        self.instructions.append(ins)

    def __getattr__(self, name):
        mnemonic = name[:-1] if name in ("and_", "or_", "not_") else name     # Python keywords
        if mnemonic.startswith("_") or not forms(mnemonic):
            raise AttributeError(f"no x86 mnemonic {mnemonic!r}")

        def instruction(*operands, lock=False):
            self.emit(mnemonic, *operands, lock=lock)
        instruction.__name__ = mnemonic
        self.__dict__[name] = instruction          # later lookups skip __getattr__
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
        bound = {id(label) for label in self._labels}
        for index, label in self._branches:
            if label.bound_at is None:
                raise ValueError(f"branch to {label!r}, which was never bound")
            if id(label) not in bound:
                raise ValueError(f"branch to {label!r}, which was bound in another assembler (its position there "
                                 "means nothing here): make a label of this one (asm.label()) and bind it here")
            self.instructions[index].near_branch64 = label.bound_at + 1
        encoder = ix.BlockEncoder(64)
        encoder.add_many(self.instructions)
        return encoder.encode(rip)

    def __len__(self):
        return len(self.instructions)
