"""The x86-64 interpreter: runs AVX-512 and AMX kernels this host cannot, refusing what it does not model.

One module per instruction family, each a table from mnemonic to semantics with a one-line reference
(``base``: errors, operand access, the registry; ``gpr``: integer and control flow; ``vec``: SSE/AVX/AVX2
and FMA; ``lanes``: lane-wise vector plumbing; ``fp``: IEEE fp32/bf16 arithmetic; ``avx512``: EVEX
forms, masks, BF16/VNNI; ``amx``: tiles), and ``machine``: the memory, the run loop, :class:`Machine`.

>>> Machine().call(bytes.fromhex("488d0437c3"), args=[40, 2])     # lea rax, [rdi + rsi]; ret
42
"""
from .machine import (SEMANTICS, AbiViolation, InterpError, InvalidOpcode, Machine, MemoryFault,  # noqa: F401
                      StepLimit, UnsupportedInstruction, reference)

__all__ = ["Machine", "MemoryFault", "UnsupportedInstruction", "InvalidOpcode", "InterpError",
           "StepLimit", "AbiViolation", "SEMANTICS", "reference"]
