"""Hand-written AArch64 (A64 + SVE) encoder: registers, the encoding table, an assembler, a static
ELF writer and emulator runners (qemu-aarch64, unicorn).

>>> from isa.aarch64 import Assembler, x0, z0, p0
>>> a = Assembler(); a.ptrue(p0.s); a.ret()
>>> [line.split()[1:3] for line in a.disassemble().splitlines()]   # (our encoding, capstone's mnemonic)
[['2598e3e0', 'ptrue'], ['d65f03c0', 'ret']]
"""
from .assembler import Assembler, Function, OperandError, disassemble
from .operands import ASR, LSL, LSR, Label, Mem, mem, post, pre, vl
from .registers import *  # noqa: F401,F403
from .registers import __all__ as _reg_all

__all__ = ["Assembler", "Function", "OperandError", "disassemble", "LSL", "LSR", "ASR", "Label", "Mem",
           "mem", "pre", "post", "vl", *_reg_all]
