"""Disassembly of x86-64 machine code to Intel-syntax text, by iced-x86's formatter.

>>> [line.split()[:3] for line in disassemble(bytes.fromhex("488d4701c3")).splitlines()]
[['0000', '488d4701', 'lea'], ['0004', 'c3', 'ret']]
"""
import iced_x86 as ix


def disassemble(code: bytes, address: int = 0) -> str:
    """One line per instruction: offset, bytes, Intel syntax."""
    decoder = ix.Decoder(64, code, ip=address)
    fmt = ix.Formatter(ix.FormatterSyntax.INTEL)
    lines = []
    for ins in decoder:
        start = ins.ip - address
        raw = code[start:start + ins.len].hex()
        lines.append(f"{ins.ip:04x}  {raw:<20}  {fmt.format(ins)}")
    return "\n".join(lines)
