"""Constants for emitted vector code (:class:`Consts`): broadcast values and per-lane tables, in
registers or in the stack frame, materialized by a setup put in front of the body.

>>> from isa.x86 import Function, rdi, ymm0
>>> from tppasm.x86.vector import VectorISA
>>> import numpy as np
>>> fn = Function("lanes", ["ptr"]); c = Consts(VectorISA("avx2"))
>>> fn.asm.vmovups(ymm0, c.lanes(range(8))); fn.asm.vmovups([rdi], ymm0); c.finish(fn)
>>> y = np.zeros(8, np.int32); fn.finalize()(y.ctypes.data); y.tolist()
[0, 1, 2, 3, 4, 5, 6, 7]
"""
import struct

from isa.x86 import Assembler, K, bcst, dword, eax, ptr, r10, r11, rsp, vec

K7 = K[7]


def f32_bits(value):
    return struct.unpack("<i", struct.pack("<f", value))[0]


class Consts:
    """Broadcast constants for emitted code: registers from ``regs`` while they last, then a table
    on the stack: on AVX-512 one dword each (``[rsp + 64 + 4*i]{1to16}``, an embedded broadcast:
    a 4-byte load that never splits a cache line, where a 64-byte slot off a 16-byte aligned
    stack splits three times in four: gelu_erf's ~25 table operands ran 1.5x slower so), on AVX2
    one vector each (``[rsp + 64 + 32*i]``). Put a constant in a register with :meth:`load`
    (``vmovups`` cannot take a broadcast). Call :meth:`finish` once the body is emitted: it puts
    the setup code in front of the body and reserves the stack."""

    BASE = 64        # [rsp, rsp+64) stays free for VectorISA's AVX2 mask scratch
    k = K7           # the opmask the emitters may clobber (AVX-512)

    def __init__(self, v, regs=()):
        self.v, self.free, self.table, self.slots = v, list(regs), {}, 0

    def with_mask(self, k):
        """The same constants, for an emitter that may clobber opmask ``k`` instead."""
        return _MaskView(self, k)

    def i(self, bits):
        """Operand holding the int32 ``bits`` in every lane (a register or memory)."""
        return self._get(("i", bits & 0xFFFFFFFF))

    def f(self, value):
        """Operand holding the fp32 ``value`` in every lane."""
        return self._get(("i", f32_bits(value) & 0xFFFFFFFF))

    def lanes(self, values):
        """Operand holding int32 ``values[j]`` in lane j (``values`` repeats to fill the vector):
        a register while ``regs`` last, else a vector on the stack (AVX-512: 16 dword slots, so
        it may split a cache line: give a table read per vector a register, see :meth:`with_lanes`)."""
        key = ("lanes", tuple(values))
        if key not in self.table:
            self.table[key] = self.free.pop(0) if self.free else self._vector_slot()
        return self.table[key]

    def with_lanes(self, regs):
        """The same constants, with the tables ``regs`` ({values: register}) read from those
        registers (the caller loads them, e.g. ``a.vmovups(reg, consts.lanes(values))``)."""
        return _LanesView(self, {tuple(k): r for k, r in regs.items()})

    def load(self, a, reg, op):
        """reg = the constant operand ``op`` (from :meth:`f` / :meth:`i`)."""
        if op.__class__.__name__ == "Register":
            a.vmovaps(reg, op)
        elif op.bcst:
            a.vbroadcastss(reg, dword[op.expr])
        else:
            a.vmovups(reg, op)

    def into(self, a, reg, value):
        """A register holding fp32 ``value``: the constant's own, or ``reg`` loaded with it."""
        op = self.f(value)
        if op.__class__.__name__ == "Register":
            return op
        self.load(a, reg, op)
        return reg

    def after(self, nbytes):
        """Put the stack table past the first ``nbytes`` of the stack (rsp up), the caller's own
        scratch there (a row of partial results, say); before any constant takes a stack slot.

        >>> from tppasm.x86.vector import VectorISA
        >>> c = Consts(VectorISA("avx2")); c.after(4096); c.f(1.0).expr.disp
        4096
        """
        if self.slots:
            raise RuntimeError("Consts.after: constants already sit on the stack; call it before the first one")
        self.BASE = max(self.BASE, nbytes)

    def _slot(self):
        self.slots += 1
        if self.v.avx512:
            return bcst(rsp + self.BASE + 4 * (self.slots - 1))
        return ptr(rsp + self.BASE + (self.slots - 1) * self.v.bytes)

    def _vector_slot(self):
        if not self.v.avx512:
            return self._slot()
        self.slots += self.v.lanes(4)
        return ptr(rsp + self.BASE + 4 * (self.slots - self.v.lanes(4)))

    def _get(self, key):
        op = self.table.get(key)
        if op is None:
            op = self.table[key] = self.free.pop(0) if self.free else self._slot()
        return op

    def stack_bytes(self):
        return self.BASE + self.slots * (4 if self.v.avx512 else self.v.bytes)

    def finish(self, fn, scratch=None):
        """Prepend the code that materializes the constants to ``fn``'s body; reserve the stack.

        AVX2 table constants are written as one dword each, then widened by a short loop (3
        emitted instructions per constant would dominate the JIT time of the transcendental
        kernels). The setup runs first and clobbers rax, r10 and r11: a function with more than 6
        integer arguments (args 7-8 arrive in r10/r11) must copy those elsewhere before relying on
        them."""
        v, pre = self.v, Assembler()
        scratch = scratch or v.reg(v.nregs - 1)
        regs = [(k, op) for k, op in self.table.items() if op.__class__.__name__ == "Register"]
        lane_regs = [(k, r, self._vector_slot()) for k, r in regs if k[0] == "lanes"]
        mems = [(k, op) for k, op in self.table.items() if op.__class__.__name__ != "Register"]
        mems += [(k, mem) for k, _, mem in lane_regs]
        dwords = self.stack_bytes()
        if v.avx512:
            for key, op in mems:
                if key[0] == "lanes":
                    _write_lanes(pre, op.expr, key[1], v.lanes(4))
                else:
                    pre.mov(dword[op.expr], _signed(key[1]))
        elif mems:
            for key, op in mems:
                slot = (op.expr.disp - self.BASE) // v.bytes
                bits = key[1] if key[0] == "i" else 0
                pre.mov(dword[rsp + dwords + 4 * slot], _signed(bits))
            top = pre.label()
            pre.xor(r10, r10)
            pre.bind(top)
            pre.vbroadcastss(scratch, dword[rsp + r10 * 4 + dwords])
            pre.mov(r11, r10)
            pre.shl(r11, (v.bytes // 32).bit_length() + 4)
            pre.vmovups(ptr(rsp + r11 + self.BASE), scratch)
            pre.inc(r10)
            pre.cmp(r10, self.slots)
            pre.jb(top)
            for key, op in mems:
                if key[0] == "lanes":
                    _write_lanes(pre, op.expr, key[1], v.lanes(4))
        for key, op in regs:
            if key[0] == "i":
                _broadcast(pre, v, op, key[1])
        for key, reg, mem in lane_regs:
            pre.vmovups(reg, mem)
        if mems:
            fn.stack(dwords + (0 if v.avx512 else 4 * self.slots))
        fn.asm.prepend(pre)


def _write_lanes(pre, expr, values, count):
    """Setup code writing ``count`` dwords at ``expr``: ``values`` repeated."""
    for j in range(count):
        pre.mov(dword[expr + 4 * j], _signed(values[j % len(values)]))


def _signed(bits):
    return bits if bits < 1 << 31 else bits - (1 << 32)


class _LanesView:
    """A :class:`Consts` whose lane tables in ``regs`` come from those registers."""

    def __init__(self, consts, regs):
        self._consts, self._regs = consts, regs

    def lanes(self, values):
        reg = self._regs.get(tuple(values))
        return reg if reg is not None else self._consts.lanes(values)

    def with_mask(self, k):
        return _MaskView(self, k)

    def __getattr__(self, name):
        return getattr(self._consts, name)


class _MaskView:
    """A :class:`Consts` seen with another opmask (its table is shared)."""

    def __init__(self, consts, k):
        self._consts, self.k = consts, k

    def __getattr__(self, name):
        return getattr(self._consts, name)




def _broadcast(a, v, reg, bits):
    if bits == 0:
        a.vpxord(reg, reg, reg) if reg.num >= 16 else a.vpxor(vec(128, reg.num), vec(128, reg.num), vec(128, reg.num))
        return
    a.mov(eax, bits if bits < 1 << 31 else bits - (1 << 32))
    a.vmovd(vec(128, reg.num), eax)
    a.vpbroadcastd(reg, vec(128, reg.num))
