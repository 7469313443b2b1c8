"""A minimal static AArch64 ELF64 executable writer, and the test-program stub around kernels.

The file has two PT_LOAD segments: code (read+execute) at :data:`CODE_BASE` and data (read+write)
at :data:`DATA_BASE`. :func:`test_program` builds an entry stub that, for each call, loads the
arguments into x0-x7, calls the kernel with ``blr``, then writes a region of the data segment to
stdout (``write``, syscall 64) and exits with status 0 (``exit``, syscall 93). No C toolchain.

>>> from isa.aarch64.assembler import Assembler
>>> a = Assembler(); a.ret()
>>> elf = test_program([(a.code(), [DATA_BASE])], b"\\0" * 16, (0, 16))
>>> elf[:4], len(elf) > 0x1000
(b'\\x7fELF', True)
"""
from __future__ import annotations

import struct

from .assembler import Assembler
from .registers import x

CODE_BASE = 0x400000
DATA_BASE = 0x10000000
PAGE = 0x1000
_EHDR, _PHDR = 64, 56
SYS_WRITE, SYS_EXIT = 64, 93
PF_X, PF_W, PF_R = 1, 2, 4


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def write_elf(code: bytes, data: bytes, entry_offset: int = 0) -> bytes:
    """An ELF64 little-endian AArch64 executable: ``code`` at CODE_BASE + 0x100 (entry at
    ``entry_offset`` into it), ``data`` at DATA_BASE."""
    code_off = 0x100
    data_off = _align(code_off + len(code), PAGE)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)           # 64-bit, little endian, SysV
    ehdr = ident + struct.pack("<HHIQQQIHHHHHH", 2, 183, 1, CODE_BASE + code_off + entry_offset,
                               _EHDR, 0, 0, _EHDR, _PHDR, 2, 0, 0, 0)   # ET_EXEC, EM_AARCH64
    ph_code = struct.pack("<IIQQQQQQ", 1, PF_R | PF_X, 0, CODE_BASE, CODE_BASE,
                          code_off + len(code), code_off + len(code), PAGE)
    ph_data = struct.pack("<IIQQQQQQ", 1, PF_R | PF_W, data_off, DATA_BASE, DATA_BASE,
                          len(data), max(len(data), 1), PAGE)
    head = (ehdr + ph_code + ph_data).ljust(code_off, b"\0")
    return (head + code).ljust(data_off, b"\0") + data


def test_program(calls, data: bytes, out_range: tuple[int, int]) -> bytes:
    """An executable that runs ``calls`` in order, then writes ``data[out_range[0]:out_range[1]]``
    (as left in memory) to stdout. Each call is ``(kernel_code, args)`` with up to 8 integer
    arguments (addresses in the data segment are ``DATA_BASE + offset``). Identical kernel codes
    are stored once."""
    stub = Assembler()
    kernels: dict[bytes, object] = {}
    for code, args in calls:
        if len(args) > 8:
            raise ValueError("test programs pass at most 8 arguments (x0-x7)")
        for reg, value in zip(x, args):
            stub.mov_imm(reg, int(value))
        if code not in kernels:
            kernels[code] = stub.label(f"kernel{len(kernels)}")
        stub.adr(x[16], kernels[code])
        stub.blr(x[16])
    start, end = out_range
    stub.movz(x[0], 1)
    stub.mov_imm(x[1], DATA_BASE + start)
    stub.mov_imm(x[2], end - start)
    stub.movz(x[8], SYS_WRITE)
    stub.svc(0)
    stub.movz(x[0], 0)
    stub.movz(x[8], SYS_EXIT)
    stub.svc(0)
    blob = bytearray()
    base = _align(stub.pc, 64)
    for code, label in kernels.items():
        label.offset = base + len(blob)
        blob += code.ljust(_align(len(code), 64), b"\0")
    text = stub.code().ljust(base, b"\0") + bytes(blob)
    return write_elf(text, data)
