"""Which masked EVEX forms suppress faults of masked-off memory elements, and which bytes an element is.

The SDM's exception classes E4NF and E6NF ("no fault suppression"; checked on Zen 4 with a guard page,
tests/x86/test_interp_adversary.py) access the whole memory operand whatever the mask: shuffles,
permutes, unpacks, packs, inserts and extracts, pmaddwd/pmaddubsw, cvtne2ps2bf16, and shifts whose
count is the memory operand. Every other masked form reads (or writes) only its enabled elements.

Broadcasts from memory (``vbroadcastss``, ``vpbroadcastd``, ``vbroadcastf32x4`` ...) read element
``j mod (operand elements)`` for lane j: a scalar broadcast reads its element when any lane is enabled.

>>> from iced_x86 import Code, Instruction, MemoryOperand, Register as R
>>> shuf = Instruction.create_reg_reg_mem_u32(Code.EVEX_VSHUFPS_ZMM_K1Z_ZMM_ZMMM512B32_IMM8, R.ZMM0, R.ZMM1,
...                                           MemoryOperand(R.RSI), 0)
>>> add = Instruction.create_reg_reg_mem(Code.EVEX_VADDPS_ZMM_K1Z_ZMM_ZMMM512B32_ER, R.ZMM0, R.ZMM1,
...                                      MemoryOperand(R.RSI))
>>> suppresses(shuf), suppresses(add), wraps(add)
(False, True, False)
"""

from __future__ import annotations

from iced_x86 import Mnemonic as Mn
from iced_x86 import OpKind

from .base import MNEMONIC_NAME

_PREFIXES = ("vpunpck", "vunpck", "vpack", "vperm", "vshuf", "valign", "vinsert", "vextract")
_NAMES = {"vpshufb", "vpshufd", "vmovshdup", "vmovsldup", "vpmaddwd", "vpmaddubsw", "vcvtne2ps2bf16"}
_SHIFTS = {f"vp{k}{w}" for k in ("sll", "srl", "sra") for w in "wdq"}
_NO_SUPPRESSION = {mn for mn, name in MNEMONIC_NAME.items() if name.startswith(_PREFIXES) or name in _NAMES}
_BROADCASTS = {mn for mn, name in MNEMONIC_NAME.items() if name.startswith(("vbroadcast", "vpbroadcast"))}
_SHIFT_MNS = {mn for mn, name in MNEMONIC_NAME.items() if name in _SHIFTS}
assert Mn.VPERMT2PS in _NO_SUPPRESSION and Mn.VPBROADCASTD in _BROADCASTS


def suppresses(ins) -> bool:
    """Whether masked-off memory elements of ins are not accessed (their faults suppressed)."""
    if ins.mnemonic in _NO_SUPPRESSION:
        return False
    if ins.mnemonic in _SHIFT_MNS:      # vpsllw zmm{k}, zmm, m128: the count is every lane's
        return ins.op_kind(ins.op_count - 1) != OpKind.MEMORY
    return True


def wraps(ins) -> bool:
    """Whether lane j of ins reads memory element j mod (elements in the operand): the broadcasts."""
    return ins.mnemonic in _BROADCASTS
