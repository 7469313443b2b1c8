"""General-purpose x86-64 semantics: moves, integer arithmetic with ZF/SF/CF/OF, control flow.

Flags live in ``m.fl = [CF, ZF, SF, OF]``; PF/AF are not modelled, so instructions reading PF
(jp, setp, cmovp ...) are refused. Values are unsigned ints of the operand size.
"""

from __future__ import annotations

from iced_x86 import ConditionCode as CC
from iced_x86 import Mnemonic as Mn
from iced_x86 import OpKind, RegisterExt

from .base import (M64, MNEMONIC_NAME, addr_fn, gpr_reader, gpr_writer, operand_rw, operand_size,
                          refuse, sem, with_ref)

_COND = {
    CC.O: lambda f: f[3], CC.NO: lambda f: not f[3],
    CC.B: lambda f: f[0], CC.AE: lambda f: not f[0],
    CC.E: lambda f: f[1], CC.NE: lambda f: not f[1],
    CC.BE: lambda f: f[0] or f[1], CC.A: lambda f: not (f[0] or f[1]),
    CC.S: lambda f: f[2], CC.NS: lambda f: not f[2],
    CC.L: lambda f: f[2] != f[3], CC.GE: lambda f: f[2] == f[3],
    CC.LE: lambda f: f[1] or f[2] != f[3], CC.G: lambda f: not f[1] and f[2] == f[3],
}


def _cond(ins):
    c = _COND.get(ins.condition_code)
    if c is None:
        refuse(ins, "parity flag not modelled")
    return c


def _sized(ins):
    size = operand_size(ins, 0)
    bits = 8 * size
    return size, bits, (1 << bits) - 1, bits - 1


# ---- data movement ----------------------------------------------------------------------------

@sem("dst = src (32-bit register writes zero-extend)")
def _mov(m, ins):
    size = operand_size(ins, 0)
    _, wr = operand_rw(m, ins, 0)
    rd, _ = operand_rw(m, ins, 1, size)
    nxt = ins.next_ip

    def step():
        wr(rd())
        return nxt
    return step


def _extend(signed: bool):
    def build(m, ins):
        n = operand_size(ins, 1)
        rd, _ = operand_rw(m, ins, 1)
        _, wr = operand_rw(m, ins, 0)
        sign, top = 1 << (8 * n - 1), 1 << (8 * n)
        nxt = ins.next_ip
        if signed:
            def step():
                v = rd()
                wr(v - top if v & sign else v)
                return nxt
        else:
            def step():
                wr(rd())
                return nxt
        return step
    return build


@sem("dst = effective address (truncated to dst size)")
def _lea(m, ins):
    a = addr_fn(m, ins)
    wr = gpr_writer(m, ins.op0_register)
    nxt = ins.next_ip

    def step():
        wr(a())
        return nxt
    return step


@sem("dst = cond ? src : dst (a 32-bit dst is zero-extended either way; a memory src is read either way)")
def _cmov(m, ins):
    c, f = _cond(ins), m.fl
    rd0 = gpr_reader(m, ins.op0_register)
    _, wr = operand_rw(m, ins, 0)
    rd1, _ = operand_rw(m, ins, 1)
    nxt = ins.next_ip

    def step():
        v = rd1()                       # loaded (and faulting) whatever the condition, as on hardware
        wr(v if c(f) else rd0())
        return nxt
    return step


@sem("dst8 = cond ? 1 : 0")
def _setcc(m, ins):
    c, f = _cond(ins), m.fl
    _, wr = operand_rw(m, ins, 0)
    nxt = ins.next_ip

    def step():
        wr(1 if c(f) else 0)
        return nxt
    return step


@sem("push src (rsp -= 8; [rsp] = src)")
def _push(m, ins):
    if ins.op_kind(0) == OpKind.REGISTER and RegisterExt.size(ins.op0_register) != 8:
        refuse(ins, "16-bit push")
    rd, _ = operand_rw(m, ins, 0, 8)
    nxt, push = ins.next_ip, m.push

    def step():
        push(rd())
        return nxt
    return step


@sem("dst = [rsp]; rsp += 8")
def _pop(m, ins):
    if operand_size(ins, 0) != 8:
        refuse(ins, "16-bit pop")
    _, wr = operand_rw(m, ins, 0)
    nxt, pop = ins.next_ip, m.pop

    def step():
        wr(pop())
        return nxt
    return step


def _sign_widen(src_bits: int, dst_reg_bits: int, high: bool):
    """cdqe / cwde / cqo / cdq: widen rax's low half (or spread its sign into rdx)."""
    def build(m, ins):
        g, nxt = m.g, ins.next_ip
        sign, top = 1 << (src_bits - 1), 1 << src_bits
        mask = (1 << dst_reg_bits) - 1
        if high:
            def step():
                g[2] = (mask if g[0] & sign else 0) | (g[2] & ~mask & M64 if dst_reg_bits == 16 else 0)
                return nxt
        else:
            def step():
                v = g[0] & (top - 1)
                v = (v - top if v & sign else v) & mask
                g[0] = v if dst_reg_bits != 16 else (g[0] & ~0xFFFF & M64) | v
                return nxt
        return step
    return build


@sem("no operation (endbr, fences)")
def _nop(m, ins):
    nxt = ins.next_ip
    return lambda: nxt


@sem("no operation: real prefetches never fault (the address goes to stats.tile_ops for cycle models)")
def _prefetch(m, ins):
    a, nxt, name, ops = addr_fn(m, ins), ins.next_ip, MNEMONIC_NAME[ins.mnemonic], m.stats.tile_ops

    def step():
        ops.append((name, (), (), a(), 0, 64, 1))
        return nxt
    return step


# ---- arithmetic -------------------------------------------------------------------------------

def _alu(op: str):
    """add/sub/cmp/and/or/xor/test with ZF SF CF OF; cmp and test do not write back."""
    def build(m, ins):
        size, bits, mask, sb = _sized(ins)
        rd0, wr0 = operand_rw(m, ins, 0)
        rd1, _ = operand_rw(m, ins, 1, size)
        f, nxt = m.fl, ins.next_ip
        if op in ("add", "sub", "cmp"):
            sub = op != "add"
            write = op != "cmp"

            def step():
                a, b = rd0(), rd1()
                if sub:
                    r = (a - b) & mask
                    f[0] = a < b
                    f[3] = ((a ^ b) & (a ^ r)) >> sb
                else:
                    s = a + b
                    r = s & mask
                    f[0] = s > mask
                    f[3] = ((a ^ r) & (b ^ r)) >> sb
                f[1] = r == 0
                f[2] = r >> sb
                if write:
                    wr0(r)
                return nxt
            return step
        fn = {"and": int.__and__, "test": int.__and__, "or": int.__or__, "xor": int.__xor__}[op]
        write = op != "test"

        def step():
            r = fn(rd0(), rd1())
            f[0] = f[3] = 0
            f[1] = r == 0
            f[2] = r >> sb
            if write:
                wr0(r)
            return nxt
        return step
    return build


def _incdec(delta: int):
    def build(m, ins):
        size, bits, mask, sb = _sized(ins)
        rd, wr = operand_rw(m, ins, 0)
        f, nxt = m.fl, ins.next_ip
        edge = 1 << sb if delta > 0 else (1 << sb) - 1  # value after which OF is set

        def step():
            a = rd()
            r = (a + delta) & mask
            f[3] = (a == edge - 1) if delta > 0 else (a == edge + 1)
            f[1] = r == 0
            f[2] = r >> sb
            wr(r)
            return nxt
        return step
    return build


@sem("dst = -dst; CF = dst != 0")
def _neg(m, ins):
    size, bits, mask, sb = _sized(ins)
    rd, wr = operand_rw(m, ins, 0)
    f, nxt = m.fl, ins.next_ip

    def step():
        a = rd()
        r = (-a) & mask
        f[0], f[3], f[1], f[2] = a != 0, a == 1 << sb, r == 0, r >> sb
        wr(r)
        return nxt
    return step


@sem("dst = ~dst (no flags)")
def _not(m, ins):
    size, bits, mask, sb = _sized(ins)
    rd, wr = operand_rw(m, ins, 0)
    nxt = ins.next_ip

    def step():
        wr(~rd() & mask)
        return nxt
    return step


@sem("dst = low(a * b) signed; CF = OF = product does not fit (SF/ZF from result)")
def _imul(m, ins):
    if ins.op_count == 1:
        refuse(ins, "one-operand imul")
    size, bits, mask, sb = _sized(ins)
    _, wr = operand_rw(m, ins, 0)
    if ins.op_count == 2:
        rda, _ = operand_rw(m, ins, 0)
        rdb, _ = operand_rw(m, ins, 1, size)
    else:
        rda, _ = operand_rw(m, ins, 1)
        rdb, _ = operand_rw(m, ins, 2, size)
    top, sign = 1 << bits, 1 << sb
    f, nxt = m.fl, ins.next_ip

    def step():
        a, b = rda(), rdb()
        p = (a - top if a & sign else a) * (b - top if b & sign else b)
        r = p & mask
        f[0] = f[3] = p != (r - top if r & sign else r)
        f[1], f[2] = r == 0, r >> sb
        wr(r)
        return nxt
    return step


def _shift(kind: str):
    """shl/shr/sar by imm8 or cl, count masked to 5 (6 for 64-bit) bits; count 0 leaves flags."""
    def build(m, ins):
        size, bits, mask, sb = _sized(ins)
        rd, wr = operand_rw(m, ins, 0)
        rc, _ = operand_rw(m, ins, 1) if ins.op_count > 1 else ((lambda: 1), None)
        cmask = 63 if bits == 64 else 31
        top = 1 << bits
        f, nxt = m.fl, ins.next_ip

        def step():
            a, c = rd(), rc() & cmask
            if c == 0:
                wr(a)
                return nxt
            if kind == "shl":
                r = (a << c) & mask
                f[0] = (a >> (bits - c)) & 1 if c <= bits else 0
                f[3] = (r >> sb) ^ f[0]
            elif kind == "shr":
                r = a >> c
                f[0] = (a >> (c - 1)) & 1
                f[3] = a >> sb
            else:
                s = a - top if a >> sb else a
                r = (s >> c) & mask
                f[0] = (s >> (c - 1)) & 1
                f[3] = 0
            f[1], f[2] = r == 0, r >> sb
            wr(r)
            return nxt
        return step
    return build


def _shiftx(kind: str):
    """BMI2 shlx/shrx/sarx: dst = src shifted by count register, flags untouched."""
    def build(m, ins):
        size, bits, mask, sb = _sized(ins)
        _, wr = operand_rw(m, ins, 0)
        rd, _ = operand_rw(m, ins, 1)
        rc, _ = operand_rw(m, ins, 2)
        cmask, top, nxt = bits - 1, 1 << bits, ins.next_ip

        def step():
            a, c = rd(), rc() & cmask
            if kind == "shl":
                r = a << c
            elif kind == "shr":
                r = a >> c
            else:
                r = (a - top if a >> sb else a) >> c
            wr(r & mask)
            return nxt
        return step
    return build


def _bitcount(kind: str):
    def build(m, ins):
        size, bits, mask, sb = _sized(ins)
        _, wr = operand_rw(m, ins, 0)
        rd, _ = operand_rw(m, ins, 1)
        f, nxt = m.fl, ins.next_ip

        def step():
            a = rd()
            if kind == "popcnt":
                r = bin(a).count("1")
                f[0] = f[2] = f[3] = 0
                f[1] = a == 0
            else:
                if kind == "tzcnt":
                    r = (a & -a).bit_length() - 1 if a else bits
                else:
                    r = bits - a.bit_length()
                f[0], f[1] = a == 0, r == 0
            wr(r)
            return nxt
        return step
    return build


# ---- control flow -----------------------------------------------------------------------------

@sem("ip = cond ? target : next")
def _jcc(m, ins):
    c, f = _cond(ins), m.fl
    t, nxt = ins.near_branch_target, ins.next_ip
    return lambda: t if c(f) else nxt


@sem("ip = target (rel, register or memory)")
def _jmp(m, ins):
    if ins.op_kind(0) in (OpKind.NEAR_BRANCH64, OpKind.NEAR_BRANCH32):
        t = ins.near_branch_target
        return lambda: t
    rd, _ = operand_rw(m, ins, 0, 8)
    return rd


@sem("push next ip; ip = target (rel, register or memory; target must be loaded code)")
def _call(m, ins):
    nxt, push = ins.next_ip, m.push
    if ins.op_kind(0) in (OpKind.NEAR_BRANCH64, OpKind.NEAR_BRANCH32):
        t = ins.near_branch_target

        def step():
            push(nxt)
            return t
        return step
    rd, _ = operand_rw(m, ins, 0, 8)

    def step():
        t = rd()
        push(nxt)
        return t
    return step


@sem("ip = pop(); rsp += imm16")
def _ret(m, ins):
    extra = ins.immediate16 if ins.op_count else 0
    g, pop = m.g, m.pop

    def step():
        t = pop()
        g[4] = (g[4] + extra) & M64
        return t
    return step


def _table():
    t = {
        Mn.MOV: _mov, Mn.LEA: _lea, Mn.PUSH: _push, Mn.POP: _pop,
        Mn.MOVZX: with_ref(_extend(False), "dst = zero-extend(src)"),
        Mn.MOVSX: with_ref(_extend(True), "dst = sign-extend(src)"),
        Mn.MOVSXD: with_ref(_extend(True), "dst = sign-extend(src32)"),
        Mn.CDQE: with_ref(_sign_widen(32, 64, False), "rax = sign-extend(eax)"),
        Mn.CWDE: with_ref(_sign_widen(16, 32, False), "eax = sign-extend(ax)"),
        Mn.CQO: with_ref(_sign_widen(64, 64, True), "rdx = sign of rax spread"),
        Mn.CDQ: with_ref(_sign_widen(32, 32, True), "edx = sign of eax spread"),
        Mn.NOP: _nop, Mn.PREFETCHT0: _prefetch, Mn.PREFETCHT1: _prefetch, Mn.PREFETCHT2: _prefetch,
        Mn.PREFETCHNTA: _prefetch, Mn.PREFETCHW: _prefetch, Mn.ENDBR64: _nop,
        Mn.SFENCE: with_ref(_nop, "store fence: ordering only, a no-op for one interpreted thread"),
        Mn.LFENCE: with_ref(_nop, "load fence: a no-op for one interpreted thread"),
        Mn.MFENCE: with_ref(_nop, "memory fence: a no-op for one interpreted thread"),
        Mn.NEG: _neg, Mn.NOT: _not, Mn.IMUL: _imul,
        Mn.INC: with_ref(_incdec(1), "dst += 1 (CF unchanged)"),
        Mn.DEC: with_ref(_incdec(-1), "dst -= 1 (CF unchanged)"),
        Mn.SHL: with_ref(_shift("shl"), "dst <<= count&mask; CF = last bit out"),
        Mn.SAL: with_ref(_shift("shl"), "dst <<= count&mask; CF = last bit out"),
        Mn.SHR: with_ref(_shift("shr"), "dst >>= count&mask (logical); CF = last bit out"),
        Mn.SAR: with_ref(_shift("sar"), "dst >>= count&mask (arithmetic); CF = last bit out"),
        Mn.SHLX: with_ref(_shiftx("shl"), "dst = src << (cnt & (bits-1)), no flags"),
        Mn.SHRX: with_ref(_shiftx("shr"), "dst = src >> (cnt & (bits-1)), no flags"),
        Mn.SARX: with_ref(_shiftx("sar"), "dst = src >>s (cnt & (bits-1)), no flags"),
        Mn.POPCNT: with_ref(_bitcount("popcnt"), "dst = popcount(src); ZF = src == 0"),
        Mn.TZCNT: with_ref(_bitcount("tzcnt"), "dst = trailing zeros; CF = src == 0"),
        Mn.LZCNT: with_ref(_bitcount("lzcnt"), "dst = leading zeros; CF = src == 0"),
        Mn.JMP: _jmp, Mn.CALL: _call, Mn.RET: _ret,
    }
    for op in ("add", "sub", "cmp", "and", "or", "xor", "test"):
        t[getattr(Mn, op.upper())] = with_ref(_alu(op), f"{op}: flags ZF SF CF OF from the result")
    for cc in ("O", "NO", "B", "AE", "E", "NE", "BE", "A", "S", "NS", "L", "GE", "LE", "G"):
        t[getattr(Mn, "J" + cc)] = _jcc
        t[getattr(Mn, "CMOV" + cc)] = _cmov
        t[getattr(Mn, "SET" + cc)] = _setcc
    return t


GPR = _table()
