"""Every encoding-table form against capstone's disassembly, operands drawn by hypothesis."""
import re
import struct

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from isa.aarch64.encodings import ALL_FORMS
from isa.aarch64.operands import imm_text

capstone = pytest.importorskip("capstone", reason="capstone is the encoding oracle")
MD = capstone.Cs(capstone.CS_ARCH_ARM64, capstone.CS_MODE_ARM)
PC = 0x10000

# Mnemonics capstone prints under their preferred alias.
ALIAS = {"fdup": "fmov", "dup": "mov"}


def signed(text: str) -> str:
    """64-bit hex values read as two's complement: capstone prints negative offsets and some
    64-bit immediates that way, so both sides are compared in this form."""
    return re.sub(r"#0x([0-9a-f]{16})\b",
                  lambda m: imm_text(int(m[1], 16) - (1 << 64)) if int(m[1], 16) >> 63 else m[0], text)


def capstone_text(word: int) -> str:
    got = [f"{i.mnemonic} {i.op_str}".strip() for i in MD.disasm(struct.pack("<I", word), PC)]
    return signed(got[0] if got else "<invalid>")


def preferred(form, ops, text: str) -> str:
    """Our text rewritten to the alias capstone prefers for these operand values."""
    mn, _, rest = text.partition(" ")
    if mn in ("movz", "movn") and not (ops[1] == 0 and ops[2].amount):
        bits = ops[0].bits
        v = ops[1] << ops[2].amount
        v = (~v) & ((1 << bits) - 1) if mn == "movn" else v
        v = v - (1 << bits) if v >> (bits - 1) else v
        return f"mov {ops[0]}, {imm_text(v)}"
    if form.signature().startswith("mov Xd|SP") and not (ops[0].is_sp or ops[1].is_sp):
        return f"add {ops[0]}, {ops[1]}, #0"
    if form.mnemonic == "lsl" and ops[2] == 0 and str(ops[0])[0] == "x":
        return text.replace("lsl", "lsr")  # ubfm #0, #63 is printed as lsr #0
    if mn == "sel" and ops[0] == ops[3]:
        return f"mov {ops[0]}, p{ops[1].num}/m, {ops[2]}"
    if mn == "eor" and len(ops) == 4 and str(ops[0]).startswith("p") and ops[3].num == ops[1].num:
        return f"not {ops[0]}, {ops[1]}, {ops[2]}"        # eor with Pm = Pg: the predicate NOT
    if mn == "orr" and len(ops) == 3 and ops[1] == ops[2] and str(ops[0]).startswith("z"):
        return f"mov {ops[0]}, {ops[1]}"
    if mn == "dup" and hasattr(ops[1], "index") and ops[1].index == 0:
        return f"mov {ops[0]}, {ops[1].reg.size}{ops[1].reg.num}"
    if mn == "dup" and isinstance(ops[1], int) and ops[1] < 0:
        # capstone shows the raw imm8 (shifted), not the sign-extended lane value
        sh = 8 if ops[1] < -128 else 0
        return f"mov {ops[0]}, {imm_text(((ops[1] >> sh) & 0xFF) << sh)}"
    return f"{ALIAS.get(mn, mn)} {rest}".rstrip()


def unpredictable(form, ops) -> bool:
    """Operand combinations the architecture leaves unpredictable (capstone rejects them)."""
    if form.mnemonic in ("ldp",) and (ops[0] == ops[1]):
        return True
    mem = ops[-1] if ops else None
    if getattr(mem, "mode", None) and form.mnemonic in ("ldp", "stp", "ldr", "str", "ldrb", "strb", "ldrh", "strh") and str(ops[0])[0] in "xw":
        return any(o.num == mem.base.num and not mem.base.is_sp for o in ops[:-1])
    return False


@pytest.mark.parametrize("form", ALL_FORMS, ids=lambda f: f.signature())
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(data=st.data())
def test_form_matches_capstone(form, data):
    ops = []
    for k in form.kinds:
        ops.append(k.sample(lambda lo, hi: data.draw(st.integers(lo, hi)), ops))
    ops = tuple(ops)
    assume(not unpredictable(form, ops))
    assert form.match(ops)
    word = form.encode(ops)
    assert signed(preferred(form, ops, form.text(ops, PC))) == capstone_text(word), f"{word:08x}"
