"""Disassembly of x86-64 machine code to Intel-syntax text, by iced-x86's formatter, and what the
code mostly does: its instruction mix and the instruction that carries its work.

>>> [line.split()[:3] for line in disassemble(bytes.fromhex("488d4701c3")).splitlines()]
[['0000', '488d4701', 'lea'], ['0004', 'c3', 'ret']]
>>> mix = instruction_mix(bytes.fromhex("62f1742858c2" * 3 + "c3"))    # 3 x vaddps ymm0,ymm1,ymm2
>>> mix, main_instruction(bytes.fromhex("62f1742858c2" * 3 + "c3"))
({'vaddps': 3, 'ret': 1}, 'vaddps ymm')
"""
from collections import Counter

import iced_x86 as ix

from ..listing import Listing

# families whose destination accumulates (dot products and FMAs): the register tile of a GEMM
ACCUMULATING = ("tdp", "vdpbf16", "vpdpbusd", "vpdpbssd", "vpdpwssd", "vfmadd231", "vfnmadd231")
# data movement, set-up and bookkeeping: never "the work" of a kernel
NOT_WORK = ("vmov", "vbroadcast", "vpbroadcast", "vzero", "kmov", "kxnor", "kxor", "vinsert", "vextract",
            "tileload", "tilestore", "tilezero", "ldtilecfg", "sttilecfg", "tilerelease", "vmaskmov",
            "vpmaskmov", "prefetch", "vgather", "vscatter", "vpblend", "vblend")


def _formatter():
    return ix.Formatter(ix.FormatterSyntax.INTEL)


def disassemble(code: bytes, address: int = 0) -> Listing:
    """One line per instruction: offset, bytes, Intel syntax (a ``str``; HTML in notebooks).

    >>> from isa.x86 import disassemble
    >>> print(disassemble(bytes([0x48, 0x8D, 0x04, 0x3F, 0xC3])))
    0000  488d043f              lea rax,[rdi+rdi]
    0004  c3                    ret
    """
    decoder = ix.Decoder(64, code, ip=address)
    fmt = _formatter()
    lines = []
    for ins in decoder:
        start = ins.ip - address
        raw = code[start:start + ins.len].hex()
        lines.append(f"{ins.ip:04x}  {raw:<20}  {fmt.format(ins)}")
    return Listing("\n".join(lines))


def instruction_mix(code: bytes) -> dict:
    """How many times each mnemonic occurs in ``code`` (statically), most frequent first."""
    fmt = _formatter()
    return dict(Counter(fmt.format_mnemonic(ins) for ins in ix.Decoder(64, code)).most_common())


def _is_zeroing(ins):
    """``vxorps x, x, x`` and friends: a register cleared, not work."""
    regs = {ins.op_register(i) for i in range(ins.op_count) if ins.op_kind(i) == ix.OpKind.REGISTER}
    return ins.op_count == 3 and len(regs) == 1


def main_instruction(code: bytes, gemm=False) -> str:
    """The vector or tile instruction that carries the work of ``code`` and its register width:
    the most frequent vector instruction (``"vmaxps ymm"``), or ``"scalar code"``. With ``gemm``
    (a matrix multiplication), the most frequent accumulating one (FMA, dot product, tile) and
    the number of accumulator registers it keeps: its register tile (``"vfmadd231ps zmm, 24
    accumulators"``, ``"tdpbf16ps tmm, 4 accumulators"``).
    """
    fmt = _formatter()
    counts, moves, dests, widths = Counter(), Counter(), {}, {}
    for ins in ix.Decoder(64, code):
        mn = fmt.format_mnemonic(ins)
        if not mn.startswith(("v", "t")) or _is_zeroing(ins) or not ins.op_count:
            continue
        regs = [fmt.format_register(ins.op_register(i)) for i in range(ins.op_count)
                if ins.op_kind(i) == ix.OpKind.REGISTER]
        vector = [r for r in regs if r.startswith(("xmm", "ymm", "zmm", "tmm"))]
        if not vector:
            continue
        widths.setdefault(mn, vector[0][:3])
        if mn.startswith(NOT_WORK) or ins.op_kind(0) != ix.OpKind.REGISTER:
            moves[mn] += 1
            continue
        counts[mn] += 1
        dests.setdefault(mn, set()).add(regs[0])
    if not counts:
        if moves:
            mn = max(moves, key=moves.__getitem__)
            return f"{mn} {widths[mn]} (data movement)"
        return "scalar code"
    accumulating = [mn for mn in counts if mn.startswith(ACCUMULATING)] if gemm else []
    if accumulating:
        mn = max(accumulating, key=counts.__getitem__)
        n = len(dests[mn])
        return f"{mn} {widths[mn]}, {n} accumulator{'s' if n != 1 else ''}"
    mn = max(counts, key=counts.__getitem__)
    return f"{mn} {widths[mn]}"
