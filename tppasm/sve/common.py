"""Small code-generation helpers shared by the SVE TPP generators."""
from __future__ import annotations

from isa.aarch64 import LSL, Assembler, GPR


def add_imm(a: Assembler, dst: GPR, src: GPR, value: int, scratch: GPR) -> None:
    """``dst = src + value`` for any 64-bit value (one add/sub when it fits 12 bits, optionally
    shifted by 12; otherwise through ``scratch``).

    >>> from isa.aarch64 import x0, x1, x9
    >>> a = Assembler(); add_imm(a, x0, x1, 8192, x9); add_imm(a, x0, x0, -4, x9)
    >>> [line.split()[1:3] for line in a.disassemble().splitlines()]
    [['91400820', 'add'], ['d1001000', 'sub']]
    """
    if value == 0:
        if dst != src:
            a.mov(dst, src)
        return
    op = a.add if value > 0 else a.sub
    mag = abs(value)
    if mag < 4096:
        op(dst, src, mag)
    elif mag % 4096 == 0 and mag >> 12 < 4096:
        op(dst, src, mag >> 12, LSL(12))
    else:
        a.mov_imm(scratch, value)
        a.add(dst, src, scratch)


def ceil_div(a: int, b: int) -> int:
    """Integer ceiling of a / b. ``ceil_div(7, 4)`` is 2."""
    return -(-a // b)
