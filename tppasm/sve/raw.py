"""The raw-kernel object the SVE generators return (what :class:`tppasm.kernel.Kernel` keeps as ``raw``).

On an AArch64 host the code is copied into executable memory (``address`` is callable through
ctypes); elsewhere ``address`` is None and the code runs only under an emulator
(:mod:`isa.aarch64.emulate`).

>>> from isa.aarch64 import Assembler
>>> a = Assembler(); a.ret()
>>> raw = SveCode(a.code(), "ret")
>>> raw.disassemble().split()[1:]
['d65f03c0', 'ret']
"""
import platform

from ..backends import register

AARCH64_HOST = platform.machine() in ("aarch64", "arm64")


class SveCode:
    """AArch64 machine code of one kernel; executable (``address`` set) on an AArch64 host only."""

    def __init__(self, code: bytes, name: str = "sve"):
        self.name, self.code = name, bytes(code)
        self.memory = None
        if AARCH64_HOST:
            from isa.memory import ExecutableMemory
            self.memory = ExecutableMemory(self.code)
        self.address = self.memory.address if self.memory is not None else None

    def disassemble(self) -> str:
        """The code as text (capstone)."""
        from isa.aarch64 import disassemble      # the AArch64 toolchain loads on first use (~35 ms)
        return disassemble(self.code)

    def __repr__(self):
        where = f"at {self.address:#x}" if self.address is not None else "(not mapped: foreign host)"
        return f"<SveCode {self.name} {where}, {len(self.code)} bytes>"


def register_sve(generate, *kinds):
    """Register ``generate(desc) -> bytes`` as the SVE generator of ``kinds``; the registry gets its
    code as an :class:`SveCode` (what ``Kernel.raw`` keeps)."""
    @register("sve", *kinds)
    def tpp(desc, isa="sve"):
        return SveCode(generate(desc), f"{desc.kind}.sve")
    return tpp
