"""Streaming an operand through vector registers, shared by the x86 element-wise and reduction
generators: how an operand is walked (:class:`Stream`), the masks of a tail vector (:class:`Tail`),
and loads / stores that widen bf16 to fp32 and round back (nearest even, NaN kept quiet), touching
exactly the operand's bytes on a tail.

>>> Stream(None, "row", "bf16").es
2
"""
from isa.x86 import K, dword, eax, ptr, vec, word

from . import math as xm
from .vector import Mask

ES = {"f32": 4, "bf16": 2}


class Stream:
    """How the kernel walks one operand: ``kind`` full (m x n, row stride ld), row (n values
    reused by every row), col (one value per row), scalar, bits (1 bit per element)."""

    def __init__(self, reg, kind, dtype, ld=0):
        self.reg, self.kind, self.dtype, self.ld = reg, kind, dtype, ld
        self.es = ES.get(dtype, 1)
        self.bcast = None            # vector register holding a col/scalar value


def stream(reg, bcast, dtype, ld):
    """The Stream of an operand broadcast as ``bcast`` (None: a full m x n operand)."""
    return Stream(reg, bcast or "full", dtype, ld)


class Tail:
    """The masks of the tail vector (count < lanes)."""

    def __init__(self, count, kmask=None, ymask=None):
        self.count, self.k, self.ymask = count, kmask, ymask


def make_tail(fn, v, n, regs, ymask=True):
    """The Tail of an ``n``-lane remainder (None for 0): mask k1 on AVX-512; on AVX2, where
    ``ymask``, a lane-mask register taken from the end of ``regs``."""
    if not n:
        return None
    tail = Tail(n)
    if v.avx512:
        v.make_mask(fn, n, k=1)
        tail.k = K[1]
    elif ymask:
        tail.ymask = v.reg(regs.pop())
        v.make_mask(fn, n, reg=tail.ymask)
    return tail


def load(a, v, dst, s, mem_at, tail):
    """Load the lanes of ``s`` at ``mem_at`` into ``dst`` as fp32 (col/scalar: the broadcast register)."""
    if s.kind in ("col", "scalar"):
        return s.bcast
    count = tail.count if tail else v.lanes(4)
    if s.dtype == "f32":
        v.load(a, dst, mem_at(0, 4), tail and mask_of(v, tail))
        return dst
    half = v.half(dst.num)
    if tail is None:
        a.vpmovzxwd(dst, mem_at(0, 2, size=v.bytes // 2))
    elif v.avx512:
        a.vmovdqu16(half.mask(tail.k, zero=True), mem_at(0, 2))
        a.vpmovzxwd(dst, half)
    else:
        x = vec(128, dst.num)
        a.vpxor(x, x, x)
        for i in range(count):
            a.vpinsrw(x, x, mem_at(i, 2, size=2), i)
        a.vpmovzxwd(dst, x)
    a.vpslld(dst, dst, 16)
    return dst


def mask_of(v, tail):
    """The vector Mask of ``tail``'s fp32 lanes."""
    return Mask(tail.k if v.avx512 else tail.ymask, tail.count, 4)


def to_bf16(a, v, src, tmp, c):
    """Round fp32 lanes of ``src`` to bf16 (nearest even; NaN quieted), packed in ``tmp[0]``'s low
    half; ``src`` is kept."""
    t, q, u = tmp[:3]
    a.vpsrld(t, src, 16)
    xm.vand(a, v, t, t, c.i(1))
    a.vpaddd(t, t, c.i(0x7FFF))
    a.vpaddd(t, t, src)
    xm.vor(a, v, q, src, c.i(0x00400000))
    xm.select(a, v, t, src, src, 3, q, t, u, c.k)       # unordered (NaN): keep the quieted input
    a.vpsrld(t, t, 16)
    if v.avx512:
        a.vpmovdw(v.half(q.num), t)
    else:
        a.vextracti128(vec(128, q.num), t, 1)
        a.vpackusdw(vec(128, q.num), vec(128, t.num), vec(128, q.num))
    return v.half(q.num)


def store(a, v, s, src, mem_at, tail, tmp, c, nt=None, cvt=False):
    """Store ``src`` (fp32 lanes) converted to ``s.dtype``; ``nt``: a spare register, to use
    non-temporal stores (the address is 16-byte aligned); ``cvt``: round to bf16 with
    ``vcvtneps2bf16`` (AVX512-BF16: one instruction; fp32 denormals become zero)."""
    if s.dtype == "f32":
        if nt and not tail:                          # 16-byte aligned streaming stores
            base = mem_at(0, 4)
            a.vmovntps(base, vec(128, src.num))
            for i in range(1, v.bytes // 16):
                if v.avx512:
                    a.vextractf32x4(vec(128, nt.num), src, i)
                else:
                    a.vextractf128(vec(128, nt.num), src, i)
                a.vmovntps(ptr(base.expr + 16 * i), vec(128, nt.num))
        elif tail and v.avx512:
            a.vmovups(mem_at(0, 4).mask(tail.k), src)
        else:
            v.store(a, mem_at(0, 4), src, tail and mask_of(v, tail))
        return
    if cvt:
        packed = v.half(tmp[0].num)
        a.vcvtneps2bf16(packed, src)
    else:
        packed = to_bf16(a, v, src, tmp, c)
    if tail is None:
        a.vmovdqu16(mem_at(0, 2), packed) if v.avx512 else a.vmovdqu(mem_at(0, 2), packed)
    elif v.avx512:
        a.vmovdqu16(mem_at(0, 2).mask(tail.k), packed)
    else:
        for i in range(tail.count):
            a.vpextrw(mem_at(i, 2, size=2), packed, i)


def broadcast_element(a, s, reg):
    """reg = the element at [s.reg] (f32 or bf16) in every fp32 lane (clobbers eax)."""
    x = vec(128, reg.num)
    if s.dtype == "f32":
        a.vbroadcastss(reg, dword[s.reg])
        return
    a.movzx(eax, word[s.reg])
    a.shl(eax, 16)
    a.vmovd(x, eax)
    a.vpbroadcastd(reg, x)
