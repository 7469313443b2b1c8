"""Is a blob of machine code position independent? (The disk cache stores only code that is.)

Code is position independent when no instruction depends on where the blob sits: every branch and
PC-relative reference lands inside the blob, and no absolute address is built into it. The audit
decodes every instruction and refuses, on x86-64, a 64-bit immediate (``mov r64, imm64``: the only
way to embed an absolute address), an absolute memory offset (``moffs``), a far or indirect
branch, or a direct branch or RIP-relative operand that leaves the blob; on AArch64, ``adrp``, an
indirect branch (``br``/``blr``; ``ret`` is fine) and any PC-relative branch, ``adr`` or literal
load that leaves the blob. Undecodable bytes are refused too.

Entry-stub templates (:mod:`.stubs`) pass ``imm64_ok``: the placeholder values they patch, the only
64-bit immediates (and register-indirect calls through them) that they may hold.

>>> from isa.x86 import Function, rax
>>> fn = Function("f", [], returns="i64"); fn.asm.mov(rax, 7); code = fn.finalize().code
>>> audit(code, "x86") is None
True
>>> fn = Function("g", [], returns="i64"); fn.asm.mov(rax, 0x7f0012345678); code = fn.finalize().code
>>> audit(code, "x86")
'mov rax,7F0012345678h at +0 embeds an absolute address (a 64-bit immediate)'
"""
import numpy as np


def audit(code, family, imm64_ok=()):
    """None if ``code`` (bytes) of ``family`` ("x86" or "sve") is position independent, else why not."""
    if family == "x86":
        return _audit_x86(code, frozenset(imm64_ok))
    if family == "sve":
        return _audit_aarch64(code)
    return f"no position audit for the {family!r} family"


def _audit_x86(code, imm64_ok):
    import iced_x86 as ix
    fc, kinds = ix.FlowControl, ix.OpKind
    direct = (fc.UNCONDITIONAL_BRANCH, fc.CONDITIONAL_BRANCH, fc.CALL)
    indirect = (fc.INDIRECT_BRANCH, fc.INDIRECT_CALL)
    near = (kinds.NEAR_BRANCH16, kinds.NEAR_BRANCH32, kinds.NEAR_BRANCH64)
    none, size = ix.Register.NONE, len(code)

    def why(ins, what):
        return f"{ix.Formatter(ix.FormatterSyntax.MASM).format(ins)} at +{ins.ip:x} {what}"
    for ins in ix.Decoder(64, code, ip=0):
        if ins.code == ix.Code.INVALID:
            return f"undecodable bytes at +{ins.ip:x}"
        flow = ins.flow_control
        if flow in direct:
            if ins.is_call_far or ins.is_jmp_far:
                return why(ins, "is a far branch")
            if ins.op0_kind in near and not 0 <= ins.near_branch_target < size:
                return why(ins, "branches outside the blob")
        elif flow in indirect and not imm64_ok:
            return why(ins, "is an indirect branch (to an address the blob does not know)")
        for i in range(ins.op_count):
            kind = ins.op_kind(i)
            if kind == kinds.IMMEDIATE64 and ins.immediate(i) not in imm64_ok:
                return why(ins, "embeds an absolute address (a 64-bit immediate)")
            if kind == kinds.MEMORY:
                if ins.is_ip_rel_memory_operand:
                    if not 0 <= ins.ip_rel_memory_address < size:
                        return why(ins, "reads outside the blob (RIP-relative)")
                elif ins.memory_base == none and ins.memory_index == none:
                    return why(ins, "uses an absolute memory address")
    return None


# AArch64 forms that matter: (mask, value, name, (shift, bits) of the word offset, or None)
_REFUSED = ((0x9F000000, 0x90000000, "adrp"), (0xFFFFFC1F, 0xD61F0000, "br"), (0xFFFFFC1F, 0xD63F0000, "blr"))
_RET = (0xFFFFFC1F, 0xD65F0000)
_B, _BL = (0xFC000000, 0x14000000), (0xFC000000, 0x94000000)
_BRANCHES = ((0xFF000010, 0x54000000, "b.cond", 5, 19), (0x7E000000, 0x34000000, "cbz/cbnz", 5, 19),
             (0x7E000000, 0x36000000, "tbz/tbnz", 5, 14))
_DATA_REFS = ((0x3B000000, 0x18000000, "ldr (literal)"), (0x9F000000, 0x10000000, "adr"))


def _signed(value, bits):
    return value - (1 << bits) if value >> (bits - 1) else value


def _audit_aarch64(code):
    """Follows control flow from the entry (constant pools between the code are data, not
    instructions), checking every reachable instruction."""
    if len(code) % 4:
        return f"{len(code)} bytes is not a whole number of AArch64 instructions"
    words = np.frombuffer(code, "<u4").tolist()
    n = len(words)
    seen = bytearray(n)
    work = [0]
    while work:
        i = work.pop()
        while not seen[i]:
            seen[i] = 1
            w = words[i]
            for mask, value, name in _REFUSED:
                if w & mask == value:
                    return f"{name} at +{4 * i:x} needs an address the blob does not know"
            if w & _RET[0] == _RET[1]:
                break
            targets, fallthrough = [], True
            if w & _B[0] in (_B[1], _BL[1]):
                targets.append(("b/bl", i + _signed(w & 0x3FFFFFF, 26)))
                fallthrough = w & _B[0] == _BL[1]
            for mask, value, name, shift, bits in _BRANCHES:
                if w & mask == value:
                    targets.append((name, i + _signed((w >> shift) & ((1 << bits) - 1), bits)))
            for name, target in targets:
                if not 0 <= target < n:
                    return f"{name} at +{4 * i:x} branches outside the blob"
                work.append(target)
            if targets and not fallthrough:
                break
            for mask, value, name in _DATA_REFS:
                if w & mask == value:
                    if name == "adr":
                        offset = _signed(((w >> 5) & 0x7FFFF) << 2 | (w >> 29) & 3, 21)
                    else:
                        offset = 4 * _signed((w >> 5) & 0x7FFFF, 19)
                    if not 0 <= 4 * i + offset < len(code):
                        return f"{name} at +{4 * i:x} reads outside the blob"
            i += 1
            if i == n:
                return "the code runs past its end"
    return None
