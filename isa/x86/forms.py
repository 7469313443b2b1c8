"""The x86-64 instruction-form table, derived once from iced-x86's own opcode tables.

Each mnemonic maps to its forms: (iced ``Code``, operand kinds, encoding, flags). The assembler
picks the first form whose operand kinds accept the given operands, preferring the shortest
encoding (legacy, then VEX, then EVEX; small immediates before large ones), as GNU as and NASM do.

>>> [f.text for f in forms("vfmadd231ps")][:2]
['VFMADD231PS xmm1, xmm2, xmm3/m128', 'VFMADD231PS ymm1, ymm2, ymm3/m256']
"""
import functools

import iced_x86 as ix

from .registers import Mem, Register

_K = ix.OpCodeOperandKind
_E = ix.EncodingKind

# operand kind -> (accepts register kinds, accepts memory, immediate bits or None, fixed register)
_REG_KINDS = {
    "R64": "r64", "R32": "r32", "R16": "r16", "R8": "r8",
    "XMM": "xmm", "YMM": "ymm", "ZMM": "zmm", "K": "k", "TMM": "tmm",
}
_FIXED = {_K.RAX: "rax", _K.EAX: "eax", _K.AX: "ax", _K.AL: "al", _K.CL: "cl", _K.DX: "dx"}
_IMM_BITS = {_K.IMM8: (8, True), _K.IMM8SEX16: (8, False), _K.IMM8SEX32: (8, False),
             _K.IMM8SEX64: (8, False), _K.IMM16: (16, True), _K.IMM32: (32, True),
             _K.IMM32SEX64: (32, False), _K.IMM64: (64, True), _K.IMM8_CONST_1: (0, False)}
_BRANCH = (_K.BR64_1, _K.BR64_4)
_ENCODING_RANK = {_E.LEGACY: 0, _E.VEX: 1, _E.EVEX: 2}


def _kind_names():
    return {getattr(_K, n): n for n in dir(_K) if n.isupper()}


_KIND_NAME = _kind_names()


class Operand:
    """One operand slot of a form: which registers/memory/immediates it accepts."""

    __slots__ = ("reg", "mem", "imm", "fixed", "label", "sib", "name")

    def __init__(self, kind):
        name = _KIND_NAME[kind]
        self.name = name
        prefix = name.split("_")[0]
        self.reg = _REG_KINDS.get(prefix) if not name.startswith("MEM") else None
        self.mem = name.endswith("_OR_MEM") or name in ("MEM", "SIBMEM")
        if name in ("MEM", "SIBMEM"):
            self.reg = None
        self.sib = name == "SIBMEM"
        self.fixed = _FIXED.get(kind)
        self.imm = _IMM_BITS.get(kind)
        self.label = kind in _BRANCH
        if self.fixed:
            self.reg = None

    @property
    def supported(self):
        return bool(self.reg or self.mem or self.imm or self.fixed or self.label)


class Form:
    """One encodable form of a mnemonic."""

    __slots__ = ("code", "ops", "evex", "vex", "can_mask", "can_zero", "can_bcst", "text", "rank",
                 "needs_mask", "mem_bytes", "bcst_bytes")

    def __init__(self, code, info):
        self.code = code
        self.ops = tuple(Operand(info.op_kind(i)) for i in range(info.op_count))
        self.evex = info.encoding == _E.EVEX
        self.vex = info.encoding == _E.VEX
        self.can_mask = info.can_use_op_mask_register
        self.needs_mask = info.require_op_mask_register
        self.can_zero = info.can_use_zeroing_masking
        self.can_bcst = info.can_broadcast
        self.text = info.instruction_string
        imm = max((o.imm[0] for o in self.ops if o.imm), default=0)
        self.mem_bytes = ix.MemorySizeExt.size(info.memory_size)
        self.bcst_bytes = ix.MemorySizeExt.size(info.broadcast_memory_size)
        short_branch = any(o.name == "BR64_1" for o in self.ops)   # BlockEncoder shortens rel32 itself
        self.rank = (_ENCODING_RANK[info.encoding], imm, short_branch)

    def accepts(self, operands, masked, zero):
        if len(operands) != len(self.ops):
            return False
        if masked and not self.can_mask or zero and not self.can_zero or self.needs_mask and not masked:
            return False
        for slot, op in zip(self.ops, operands):
            if isinstance(op, Register):
                if slot.fixed:
                    if op.name != slot.fixed:
                        return False
                elif slot.reg != op.kind or (op.num >= 16 and op.is_vector and not self.evex):
                    return False
            elif isinstance(op, Mem):
                if not slot.mem or (op.bcst and not self.can_bcst):
                    return False
                if op.size and op.size != (self.bcst_bytes if op.bcst else self.mem_bytes):
                    return False
            elif isinstance(op, int):
                if not slot.imm or not _imm_fits(op, *slot.imm):
                    return False
            elif not (slot.label and hasattr(op, "bound_at")):
                return False
        return True


def _imm_fits(value, bits, unsigned_ok):
    if bits == 0:
        return value == 1
    lo = -(1 << (bits - 1))
    hi = (1 << bits) - 1 if unsigned_ok else (1 << (bits - 1)) - 1
    return lo <= value <= hi


_OTHER_VENDORS = ("CENTAUR", "CYRIX", "PADLOCK", "KNC")


@functools.lru_cache(maxsize=None)
def _exotic_features():
    return {getattr(ix.CpuidFeature, n) for n in dir(ix.CpuidFeature) if n.startswith(_OTHER_VENDORS)}


@functools.lru_cache(maxsize=None)
def _codes():
    """mnemonic -> the (code, info) of its 64-bit-mode forms. Cheap (~10 ms): the Form objects,
    three quarters of the table's cost, are built per mnemonic when the assembler first needs them."""
    mnemonic_name = {getattr(ix.Mnemonic, n): n.lower() for n in dir(ix.Mnemonic) if n.isupper()}
    codes = {}
    for name in dir(ix.Code):
        if not name.isupper() or name.startswith(("MVEX", "XOP", "D3NOW", "INVALID", "DECLARE", "ZERO")):
            continue
        if name.startswith(("CALL_", "JMP_")) and ("_M16" in name or name.endswith("RM16")):
            continue                # far and 16-bit indirect forms: never what 64-bit code means
        if name in ("PUSH_IMM16", "PUSHW_IMM8"):
            continue                # data16 pushes move rsp by 2: push 128 means the 8-byte push imm32
        code = getattr(ix.Code, name)
        info = ix.OpCodeInfo(code)
        if (not info.mode64 or info.encoding not in _ENCODING_RANK or not info.is_instruction
                or info.decoder_option != 0 or info.fwait or info.is_reserved_nop
                or info.address_size in (16, 32) or not info.intel_decoder64):
            continue                # not in 64-bit mode, only decodable with special options, or AMD's
            # reading only (ud0 without ModRM, data16 branches: an Intel core takes those bytes otherwise)
        if _exotic_features().intersection(ix.Instruction.create(code).cpuid_features()):
            continue                # VIA/Cyrix/Knights Corner extensions
        codes.setdefault(mnemonic_name[info.mnemonic], []).append((code, info))
    return codes


@functools.lru_cache(maxsize=None)
def _forms(mnemonic):
    built = (Form(code, info) for code, info in _codes().get(mnemonic, ()))
    return tuple(sorted((f for f in built if all(o.supported for o in f.ops)), key=lambda f: f.rank))


def _table():
    """Every mnemonic -> its forms (builds them all: for tests and listings)."""
    table = {m: list(_forms(m)) for m in _codes()}
    return {m: fs for m, fs in table.items() if fs}


# condition-code synonyms (iced names each opcode once)
_CC_ALIASES = {"z": "e", "nz": "ne", "c": "b", "nc": "ae", "nae": "b", "nb": "ae", "na": "be",
               "nbe": "a", "nge": "l", "nl": "ge", "ng": "le", "nle": "g", "pe": "p", "po": "np"}
ALIASES = {p + cc: p + real for cc, real in _CC_ALIASES.items() for p in ("j", "cmov", "set")}


def forms(mnemonic):
    """All forms of ``mnemonic`` (lower case), shortest encoding first; () if unknown."""
    mnemonic = ALIASES.get(mnemonic, mnemonic)
    return _forms(mnemonic) if mnemonic in _codes() else ()


def mnemonics():
    """Every mnemonic the assembler can encode."""
    return sorted(_table())
