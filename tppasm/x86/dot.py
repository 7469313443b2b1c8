"""How a BRGEMM microkernel accumulates one k group, per dtype and target: the inner-product
strategies (fp32 FMA, bf16 ``vdpbf16ps`` or shift + FMA, int8 VNNI or exact widening) that the
generator in :mod:`tppasm.x86.brgemm` composes.

>>> type(choose_dot("i8", "avx2", set(), "ss")).__name__
'I8Madd'
"""
from isa.x86 import dword
from isa.x86.registers import Register

class Dot:
    """How one tile accumulates one k group: ``nb`` registers per B vector, ``na`` per A row,
    ``consts`` dword patterns kept in registers, ``tmps`` scratch registers; ``ops`` (per
    accumulator per group) and ``chain`` (dependent ops on one accumulator) feed the blocking model;
    ``a_ops`` / ``b_ops`` count the extra vector ops per A row / B vector."""

    nb = na = 1
    halves = False      # True: a k group is two fp32 steps (see Bf16Halves)
    consts = ()
    tmps = 0
    ops = chain = 1
    a_ops = b_ops = 0

    @property
    def mults(self):
        """Of ``ops``, those on the multiply (FMA) ports; the rest go to any vector ALU."""
        return self.ops

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


class Bf16Halves(Dot):
    """bf16 pairs as two fp32 k steps, even element first, split without shifts: a dword of a pair
    holds the odd element in its high half, and the dword two bytes earlier holds the even one
    there, so each element is a load (or broadcast) and an ``and`` with 0xFFFF0000 (exact: bf16
    products are exact in fp32). The ``and`` runs on any vector port, where a shift would take
    FMA slots (measured here: ~1.3x the shift-and-mask split). The first pair of a block, whose
    earlier bytes lie outside the operand, is split with a shift instead (``first``)."""

    halves = True
    consts = (0xFFFF0000,)
    ops = chain = 2
    a_ops = b_ops = 2

    def load_b_half(self, g, reg, addr, mask, half, first):
        """reg = element ``half`` (0 even, 1 odd) of the pairs at ``addr`` (an address expression), as fp32."""
        if half == 0 and first:
            g.v.load(g.a, reg, [addr], mask)
            g.a.vpslld(reg, reg, 16)
        elif mask is None:
            g.and_(reg, g.const_regs[0], [addr - 2 + 2 * half])
        else:
            g.v.load(g.a, reg, [addr - 2 + 2 * half], mask)
            g.and_(reg, reg, g.const_regs[0])

    def load_a_half(self, g, reg, src, half, first):
        """reg = element ``half`` of A's pair at ``src`` (an address, or a GPR holding the pair), in every lane."""
        if half == 0 and (first or isinstance(src, Register)):
            g.broadcast(reg, src)
            g.a.vpslld(reg, reg, 16)
        else:
            g.broadcast(reg, src - 2 + 2 * half)
            g.and_(reg, reg, g.const_regs[0])

    def acc(self, g, c, b, a, t, k):
        g.a.vfmadd231ps(c, b[0], a[0])


class I8Madd(Dot):
    """int8 quads without VNNI, exactly: split each dword into its even and odd bytes as int16
    pairs (sign- or zero-extended as ``signs`` says for A and B), ``vpmaddwd`` each pair of pairs
    into int32 (no saturation: |2 * 255 * 255| and |2 * 128 * 128| < 2**31), and add both into the
    accumulator."""

    nb = na = 2
    consts = (0x00FF00FF,)
    tmps = 1
    ops, mults, chain = 4, 2, 2
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


class I8Maddubs(Dot):
    """int8 quads of a u7 A (every value <= 127: ``a_bits=7``) x s8 B without VNNI: ``vpmaddubsw``
    sums each pair of u8 x s8 products into int16 (exact: |2 * 127 * 128| < 2**15), ``vpmaddwd``
    with ones sums the two pairs of a quad into int32, ``vpaddd`` into the accumulator. Two
    multiplies and an add per accumulator and group, no operand split: I8Madd's multiplies with
    half its other ops."""

    consts = (0x00010001,)
    tmps = 1
    ops, mults = 3, 2
    chain = 1

    def acc(self, g, c, b, a, t, k):
        g.a.vpmaddubsw(t[0], a[0], b[0])
        g.a.vpmaddwd(t[0], t[0], k[0])
        g.a.vpaddd(c, c, t[0])


def choose_dot(dtype, isa, features, signs="us", a_bits=8):
    """The inner-product strategy for ``dtype`` (int8: with ``signs`` and, for "us", A's ``a_bits``)
    on ``isa`` with ``features``."""
    wide = isa != "avx2"
    if dtype == "f32":
        return F32Fma()
    if dtype == "bf16":
        return Bf16Dp() if wide and "avx512_bf16" in features else Bf16Halves()
    if signs == "us" and ((wide and "avx512_vnni" in features) or (not wide and "avx_vnni" in features)):
        return I8Vnni()
    if signs == "us" and a_bits == 7:
        return I8Maddubs()
    return I8Madd(signs)
