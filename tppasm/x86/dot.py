"""How a BRGEMM microkernel accumulates one k group, per dtype and target: the inner-product
strategies (fp32 FMA, bf16 ``vdpbf16ps`` or shift + FMA, int8 VNNI or exact widening) that the
generator in :mod:`tppasm.x86.brgemm` composes.

>>> type(choose_dot("i8", "avx2", set(), "ss")).__name__
'I8Madd'
"""
from isa.x86 import dword

class Dot:
    """How one tile accumulates one k group: ``nb`` registers per B vector, ``na`` per A row,
    ``consts`` dword patterns kept in registers, ``tmps`` scratch registers; ``ops`` (per
    accumulator per group) and ``chain`` (dependent ops on one accumulator) feed the blocking model;
    ``a_ops`` / ``b_ops`` count the extra vector ops per A row / B vector."""

    nb = na = 1
    consts = ()
    tmps = 0
    ops = chain = 1
    a_ops = b_ops = 0

    def load_b(self, g, regs, mem, mask, keep=None):
        g.v.load(g.a, regs[0], mem, mask)
        g.keep(regs[0], keep)

    def load_a(self, g, regs, src):
        g.broadcast(regs[0], src)


class F32Fma(Dot):
    def load_a(self, g, regs, src):
        g.a.vbroadcastss(regs[0], dword[src])

    def acc(self, g, c, b, a, t, k):
        g.a.vfmadd231ps(c, b[0], a[0])


class Bf16Dp(Dot):
    def acc(self, g, c, b, a, t, k):
        g.a.vdpbf16ps(c, a[0], b[0])


class I8Vnni(Dot):
    def acc(self, g, c, b, a, t, k):
        g.a.vpdpbusd(c, a[0], b[0])


class Bf16Shift(Dot):
    """bf16 pairs -> two fp32 vectors: the even element by ``<< 16``, the odd one by masking the
    low half off; then two FMAs (bf16 products are exact in fp32)."""

    nb = na = 2
    ops = chain = 2
    a_ops = b_ops = 2

    def _split(self, g, regs):
        even, odd = regs
        g.a.vpslld(even, odd, 16)
        g.and_(odd, odd, g.pool.splat(0xFFFF0000))     # from memory: one register more for C

    def load_b(self, g, regs, mem, mask, keep=None):
        g.v.load(g.a, regs[1], mem, mask)
        g.keep(regs[1], keep)
        self._split(g, regs)

    def load_a(self, g, regs, src):
        g.broadcast(regs[1], src)
        self._split(g, regs)

    def acc(self, g, c, b, a, t, k):
        g.a.vfmadd231ps(c, b[0], a[0])
        g.a.vfmadd231ps(c, b[1], a[1])


class I8Madd(Dot):
    """int8 quads without VNNI, exactly: split each dword into its even and odd bytes as int16
    pairs (sign- or zero-extended as ``signs`` says for A and B), ``vpmaddwd`` each pair of pairs
    into int32 (no saturation: |2 * 255 * 255| and |2 * 128 * 128| < 2**31), and add both into the
    accumulator."""

    nb = na = 2
    consts = (0x00FF00FF,)
    tmps = 1
    ops, chain = 4, 2
    a_ops, b_ops = 2, 3

    def __init__(self, signs="us"):
        self.a_signed, self.b_signed = (c == "s" for c in signs)

    def _split(self, g, regs, signed):
        even, odd = regs
        if signed:
            g.a.vpsllw(even, odd, 8)
            g.a.vpsraw(even, even, 8)
            g.a.vpsraw(odd, odd, 8)
        else:
            g.and_(even, odd, g.const_regs[0])
            g.a.vpsrlw(odd, odd, 8)

    def load_b(self, g, regs, mem, mask, keep=None):
        g.v.load(g.a, regs[1], mem, mask)
        g.keep(regs[1], keep)
        self._split(g, regs, self.b_signed)

    def load_a(self, g, regs, src):
        g.broadcast(regs[1], src)
        self._split(g, regs, self.a_signed)

    def acc(self, g, c, b, a, t, k):
        for i in range(2):
            g.a.vpmaddwd(t[0], b[i], a[i])
            g.a.vpaddd(c, c, t[0])


def choose_dot(dtype, isa, features, signs="us"):
    """The inner-product strategy for ``dtype`` (int8: with ``signs``) on ``isa`` with ``features``."""
    wide = isa != "avx2"
    if dtype == "f32":
        return F32Fma()
    if dtype == "bf16":
        return Bf16Dp() if wide and "avx512_bf16" in features else Bf16Shift()
    if signs == "us" and ((wide and "avx512_vnni" in features) or (not wide and "avx_vnni" in features)):
        return I8Vnni()
    return I8Madd(signs)
