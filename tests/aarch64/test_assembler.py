"""Assembler behaviour: operand errors, labels, immediates, the AAPCS64 function builder."""
import numpy as np
import pytest

from isa.aarch64 import (Assembler, disassemble, Function, OperandError, d8, mem, p0, post, pre, sp, vl, w1,
                         x0, x1, x2, x3, x16, x19, x20, x21, x22, x30, z0, z1, z2, z8)
from tests.aarch64.marks import needs_qemu


def test_wrong_operand_lists_forms():
    a = Assembler()
    with pytest.raises(OperandError) as e:
        a.fmla(z0.s, p0.m, z1.h, z2.s)
    msg = str(e.value)
    assert "fmla z0.s, p0/m, z1.h, z2.s" in msg
    assert "fmla Zd.S, Pg/M(p0-p7), Zn.S, Zm.S" in msg and "fmla Zd.S, Zn.S, Zm.S[0-3](z0-z7)" in msg


@pytest.mark.parametrize("bad", [
    lambda a: a.add(x0, x1, 4096),               # immediate out of range
    lambda a: a.ldr(x0, mem(x1, 4)),             # unscaled offset for the scaled form
    lambda a: a.ld1w(z0.s, p0.m, vl(x0)),        # loads need a zeroing predicate
    lambda a: a.fmla(z0.s, z1.s, z8.s[1]),       # indexed register must be z0-z7
    lambda a: a.add(x0, w1, x2),                 # mixed widths
    lambda a: a.nosuch(x0),
    lambda a: a.ldr(x0, mem(x1, 8.9)),            # a float offset (was cut to 8)
    lambda a: a.ldr(x0, pre(x1, 8.5)),
    lambda a: a.mov_imm(w1, 2 ** 40 + 5),         # does not fit 32 bits (was cut to 5)
    lambda a: a.word(2 ** 40 + 0xd503201f),       # (was masked to a nop)
])
def test_rejections(bad):
    with pytest.raises((OperandError, AttributeError, TypeError)):
        bad(Assembler())


@pytest.mark.parametrize("frame", [-100, 5000, 1 << 24, 1.5])
def test_frames_sub_sp_cannot_reserve_are_refused(frame):
    with pytest.raises(ValueError, match="0 to 4095 or a multiple of 4096 below 16 MiB"):
        Function(frame=frame)


def test_branch_fixups_forward_and_backward():
    a = Assembler()
    top, end = a.label("top"), a.label("end")
    a.bind(top)
    a.cbz(x0, end)
    a.sub(x0, x0, 1)
    a.b(top)
    a.bind(end)
    a.ret()
    text = a.disassemble()
    assert "cbz x0, #0xc" in text and "b #0" in text


def test_unbound_label():
    a = Assembler()
    a.b(a.label("nowhere"))
    with pytest.raises(ValueError, match="never bound"):
        a.code()


def test_a_label_bound_in_another_assembler_is_refused():
    a, b = Assembler(), Assembler()
    there = a.label("there")
    a.nop()
    a.bind(there)
    b.b(there)
    with pytest.raises(ValueError, match="label 'there' was bound in another assembler"):
        b.code()


def test_function_code_again_after_more_code_places_the_epilogue_at_the_end():
    """The epilogue label was bound once, at the first code(): a ret() emitted later branched back
    into the body (an endless loop)."""
    f = Function(nargs=1)
    f.asm.add(x0, x0, 1)
    f.code()
    f.asm.add(x0, x0, 2)
    f.ret()
    text = f.code()
    assert "b #0xc" in disassemble(text) and disassemble(text).splitlines()[3].endswith("ret")


def test_stp_ldp_prologue_forms():
    a = Assembler()
    a.stp(x19, x20, pre(sp, -16))
    a.ldp(x19, x20, post(sp, 16))
    assert a.disassemble().splitlines()[0].endswith("stp x19, x20, [sp, #-0x10]!")


CONSTANTS = [0, 1, 0xFFFF, 0x10000, 0x123456789ABCDEF0, -1, -2, -0x10000, 0xFFFF0000FFFF0000,
             1 << 63, 0x8000, 0x0000FFFF00000000]


@needs_qemu
def test_mov_imm_and_function_saves_registers():
    from isa.aarch64.emulate import run_qemu
    # inner: an AAPCS64 function that clobbers x19, x20 and v8 and uses a stack frame
    f = Function(nargs=1, frame=32)
    f.asm.mov_imm(x19, 0xDEAD)
    f.asm.mov_imm(x20, 0xBEEF)
    f.asm.dup(z8.d, x19)
    f.asm.str(x19, mem(sp, 16))
    f.ret()
    inner = f.code()
    assert "stp x19, x20, [sp, #-0x10]!" in disassemble(inner)
    a = Assembler()
    call = a.label("inner")
    # the harness itself may clobber x19-x22: the ELF entry stub keeps nothing in them
    a.mov(x22, x0)                      # x0 = out pointer
    a.mov(x16, x30)
    a.mov_imm(x19, 0x1919)
    a.dup(z8.d, x19)
    a.mov(x21, sp)
    a.bl(call)
    a.mov(x3, sp)
    a.str(x19, mem(x22, 0))
    a.str(d8, mem(x22, 8))
    a.sub(x3, x3, x21)
    a.str(x3, mem(x22, 16))
    for i, c in enumerate(CONSTANTS):
        a.mov_imm(x1, c)
        a.str(x1, mem(x22, 24 + 8 * i))
    a.mov(x30, x16)
    a.ret()
    a.bind(call)
    a.raw(inner)
    out = np.zeros(3 + len(CONSTANTS), np.uint64)
    run_qemu(a.code(), [], [out])
    assert out[0] == 0x1919 and out[1] == 0x1919 and out[2] == 0
    assert [int(v) for v in out[3:]] == [c & (2**64 - 1) for c in CONSTANTS]
