"""x86-64 machine code: registers, the PeachPy-style assembler on iced-x86, System V functions.

>>> from isa.x86 import Function, rax
>>> fn = Function("seven", [], returns="i64"); fn.asm.mov(rax, 7)
>>> fn.finalize()()
7
"""
from .assembler import Assembler, Label, OperandError
from .disasm import disassemble
from .function import Function, JitFunction
from .registers import *  # noqa: F401,F403  (rax, zmm0, k1, ptr, bcst, dword, ...)
