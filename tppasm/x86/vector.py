"""The vector ISA a generator targets: register width, count, lanes, and masked tails.

Generators are written once against :class:`VectorISA`; AVX2 uses ymm registers with
``vmaskmovps`` masks held in a ymm register, AVX-512 uses zmm registers with opmask registers.
Masked-off lanes are neither read nor written, so tails never touch memory past an operand.

>>> v = VectorISA("avx2")
>>> v.bits, v.lanes(4), v.nregs
(256, 8, 16)
"""
from isa.x86 import K, eax, rax, vec


class Mask:
    """A lane mask for ``count`` leading lanes: an opmask (AVX-512) or a ymm register (AVX2)."""

    def __init__(self, reg, count, es):
        self.reg, self.count, self.es = reg, count, es


class VectorISA:
    def __init__(self, isa):
        if isa not in ("avx2", "avx512", "amx"):
            raise ValueError(f"not an x86 vector ISA: {isa!r}")
        self.name = isa
        self.avx512 = isa in ("avx512", "amx")
        self.bits = 512 if self.avx512 else 256
        self.bytes = self.bits // 8
        self.nregs = 32 if self.avx512 else 16

    def reg(self, i):
        """Vector register ``i`` at this ISA's width."""
        return vec(self.bits, i)

    def half(self, i):
        """Vector register ``i`` at half width (ymm for AVX-512, xmm for AVX2)."""
        return vec(self.bits // 2, i)

    def lanes(self, es):
        """Elements of ``es`` bytes per full vector."""
        return self.bytes // es

    def make_mask(self, fn, count, es=4, k=1, reg=None):
        """Set up a mask for the first ``count`` lanes of ``es``-byte elements.

        AVX-512: opmask ``k{k}``. AVX2 (dword granularity, ``es`` = 4): the ymm register ``reg``, built
        in registers (a byte of ones per lane in rax, sign-extended to dwords): eight dword stores
        read back by one 32-byte load cannot be store-forwarded, a stall on every call. Both clobber rax.

        >>> from isa.x86 import Function, disassemble, ymm0
        >>> fn = Function("mask", []); m = VectorISA("avx2").make_mask(fn, 3, reg=ymm0)
        >>> print(disassemble(fn.asm.encode()))
        0000  48c7c0ffffffff        mov rax,0FFFFFFFFFFFFFFFFh
        0007  48c1e828              shr rax,28h
        000b  c4e1f96ec0            vmovq xmm0,rax
        0010  c4e27d21c0            vpmovsxbd ymm0,xmm0
        """
        a = fn.asm
        if self.avx512:
            kreg = K[k]
            a.mov(eax, (1 << count) - 1)
            if count * es * 8 <= 16 * 32 and self.lanes(es) <= 16:
                a.kmovw(kreg, eax)
            else:
                a.kmovd(kreg, eax)
            return Mask(kreg, count, es)
        if es != 4:
            raise ValueError("AVX2 masks are per dword")
        a.mov(rax, -1)                       # (no 64-bit immediate: the disk cache takes it for an address)
        if count < 8:
            a.shr(rax, 8 * (8 - count))
        a.vmovq(vec(128, reg.num), rax)
        a.vpmovsxbd(reg, vec(128, reg.num))
        return Mask(reg, count, es)

    def load(self, a, dst, mem, mask=None):
        """dst = mem (full vector, or the masked lanes with the rest zeroed)."""
        if mask is None:
            a.vmovups(dst, mem)
        elif self.avx512:
            a.vmovups(dst.mask(mask.reg, zero=True), mem)
        else:
            a.vmaskmovps(dst, mask.reg, mem)

    def store(self, a, mem, src, mask=None):
        """mem = src (full vector, or only the masked lanes)."""
        if mask is None:
            a.vmovups(mem, src)
        elif self.avx512:
            a.vmovups(_masked_mem(mem, mask.reg), src)
        else:
            a.vmaskmovps(mem, mask.reg, src)

    def broadcast_f32(self, a, dst, value):
        """dst = value in every fp32 lane (via eax; position independent, no data section)."""
        import struct
        bits = struct.unpack("<i", struct.pack("<f", value))[0]
        a.mov(eax, bits)
        a.vmovd(vec(128, dst.num), eax)
        a.vbroadcastss(dst, vec(128, dst.num))


def _masked_mem(mem, k):
    from isa.x86 import ptr
    return ptr(mem).mask(k)
