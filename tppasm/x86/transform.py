"""x86 generators for layout transforms (transpose, VNNI2/VNNI4 pack and unpack).

4-byte transposes move 8x8 blocks through ymm registers (unpack, shuffle, lane permute), 2-byte
ones 8x8 blocks through xmm registers (three unpack stages); everything else (edges, 1-byte
elements, VNNI unpacking) is an element-for-element copy through general
registers in three nested loops, ``out[a*oa + b*ob + c*oc] = x[a*ia + b*ib + c*ic]``, so any
element size and shape works and nothing outside the operands is touched; rows the VNNI layout
pads are written as zeros.

>>> import numpy as np, tppasm
>>> x = np.arange(6, dtype=np.float32).reshape(2, 3); out = np.empty((3, 2), np.float32)
>>> tppasm.transform("transpose", 2, 3)(x, out); out.tolist()
[[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
"""
from isa.x86 import Function, gpr, r8, r9, r10, r11, r12, r13, r14, r15, rax, rcx, rdx, vec

from ..dtypes import dtype as to_dtype
from ..backends import register

SIZE_BITS = {1: 8, 2: 16, 4: 32, 8: 64}


def _copy3(a, es, src, dst, counts, istr, ostr, zero=False):
    """Three nested loops over ``counts`` (A, B, C) with element strides ``istr``/``ostr``; the
    outer pointers ``src``/``dst`` end advanced by A blocks."""
    data = gpr(rax.num, SIZE_BITS[es])
    A, B, C = counts
    if not (A and B and C):
        return
    a.mov(r8, A)
    la = a.label()
    a.bind(la)
    a.mov(r12, src)
    a.mov(r13, dst)
    a.mov(r9, B)
    lb = a.label()
    a.bind(lb)
    a.mov(r14, r12)
    a.mov(r15, r13)
    a.mov(r10, C)
    lc = a.label()
    a.bind(lc)
    if zero:
        a.xor(gpr(rax.num, 32), gpr(rax.num, 32))
    else:
        a.mov(data, [r14])
    a.mov([r15], data)
    a.add(r14, istr[2] * es)
    a.add(r15, ostr[2] * es)
    a.dec(r10)
    a.jnz(lc)
    a.add(r12, istr[1] * es)
    a.add(r13, ostr[1] * es)
    a.dec(r9)
    a.jnz(lb)
    a.add(src, istr[0] * es)
    a.add(dst, ostr[0] * es)
    a.dec(r8)
    a.jnz(la)


@register("x86", "transform")
def generate_transform(desc, isa):
    fn = Function(f"transform_{desc.op}", ["ptr", "ptr"])
    a = fn.asm
    x, out = fn.args
    es = to_dtype(desc.dtype).itemsize
    m, n, f = desc.m, desc.n, desc.factor
    if desc.op == "transpose" and es in (2, 4) and m >= 8 and n >= 8:
        (_transpose8 if es == 4 else _transpose8w)(a, x, out, m, n, desc.ldi, desc.ldo)
    elif desc.op == "transpose":
        _copy3(a, es, x, out, (1, m, n), (0, desc.ldi, 1), (0, 1, desc.ldo))
    elif desc.op.startswith("vnni"):
        full, rem = divmod(m, f)
        # x (k, n) row r = g*f + b -> out[g, col, b]
        if (f, es) in ((2, 2), (4, 1)) and full and n >= 32 // es:
            _vnni_pack(a, x, out, full, n, desc.ldi, f, es)
            a.add(x, full * f * desc.ldi * es)
            a.add(out, full * n * f * es)
        else:
            _copy3(a, es, x, out, (full, f, n), (f * desc.ldi, desc.ldi, 1), (n * f, 1, f))
        if rem:
            a.mov(r11, out)
            _copy3(a, es, x, out, (1, rem, n), (0, desc.ldi, 1), (0, 1, f))
            a.lea(out, [r11 + rem * es])
            _copy3(a, es, x, out, (1, f - rem, n), (0, 0, 0), (0, 1, f), zero=True)
    else:
        full, rem = divmod(m, f)
        _copy3(a, es, x, out, (full, f, n), (n * f, 1, f), (f * desc.ldo, desc.ldo, 1))
        if rem:
            _copy3(a, es, x, out, (1, rem, n), (0, 1, f), (0, desc.ldo, 1))
    return fn.finalize()


def _blocks(a, x, out, outer, inner, body, inner_step, outer_step):
    """``outer`` x ``inner`` calls of ``body()``, which reads at r14 and writes at r15: r12/r13 start
    at x/out and step by ``outer_step`` (x bytes, out bytes), r14/r15 start at r12/r13 each time
    and step by ``inner_step``. Both counts must be positive."""
    a.mov(r8, outer)
    a.mov(r12, x)
    a.mov(r13, out)
    top = a.label()
    a.bind(top)
    a.mov(r14, r12)
    a.mov(r15, r13)
    a.mov(r9, inner)
    loop = a.label()
    a.bind(loop)
    body()
    a.add(r14, inner_step[0])
    a.add(r15, inner_step[1])
    a.dec(r9)
    a.jnz(loop)
    a.add(r12, outer_step[0])
    a.add(r13, outer_step[1])
    a.dec(r8)
    a.jnz(top)


def _transpose8(a, x, out, m, n, ldi, ldo):
    """out (n, m) = x (m, n)^T for 4-byte elements: 8x8 register blocks, scalar edges."""
    mb, nb = m // 8, n // 8
    y = [vec(256, i) for i in range(16)]

    def block():
        for r in range(8):
            a.vmovups(y[r], [r14 + r * ldi * 4])
        for p in range(4):                              # pairs of rows: interleave dwords
            a.vunpcklps(y[8 + 2 * p], y[2 * p], y[2 * p + 1])
            a.vunpckhps(y[9 + 2 * p], y[2 * p], y[2 * p + 1])
        for q, (lo, hi) in enumerate(((8, 10), (9, 11), (12, 14), (13, 15))):   # quads: interleave qwords
            a.vshufps(y[2 * q], y[lo], y[hi], 0x44)
            a.vshufps(y[2 * q + 1], y[lo], y[hi], 0xEE)
        for c in range(4):                              # 128-bit halves: rows 0-3 with rows 4-7
            a.vperm2f128(y[8 + c], y[c], y[4 + c], 0x20)
            a.vperm2f128(y[12 + c], y[c], y[4 + c], 0x31)
        for c in range(8):
            a.vmovups([r15 + c * ldo * 4], y[8 + c])
    _blocks(a, x, out, mb, nb, block, (32, 8 * ldo * 4), (8 * ldi * 4, 32))
    _transpose_edges(a, x, out, m, n, ldi, ldo, 4)


# the 8x8 word transpose: each stage interleaves the low and the high halves of register pairs
# (the previous stage's outputs, numbered as they were written): words of row pairs, then dwords,
# then qwords, after which register c holds column c
_WORD_STAGES = (("wd", ((0, 1), (2, 3), (4, 5), (6, 7))), ("dq", ((0, 2), (1, 3), (4, 6), (5, 7))),
                ("qdq", ((0, 4), (1, 5), (2, 6), (3, 7))))


def _transpose8w(a, x, out, m, n, ldi, ldo):
    """out (n, m) = x (m, n)^T for 2-byte elements: 8x8 blocks in xmm registers (interleave words,
    then dwords, then qwords of row pairs), scalar edges."""
    mb, nb = m // 8, n // 8
    y = [vec(128, i) for i in range(16)]

    def block():
        for r in range(8):
            a.vmovdqu(y[r], [r14 + r * ldi * 2])
        for stage, (unpack, pairs) in enumerate(_WORD_STAGES):
            src, dst = (0, 8) if stage % 2 == 0 else (8, 0)
            for i, (p, q) in enumerate(pairs):
                getattr(a, f"vpunpckl{unpack}")(y[dst + 2 * i], y[src + p], y[src + q])
                getattr(a, f"vpunpckh{unpack}")(y[dst + 2 * i + 1], y[src + p], y[src + q])
        for c in range(8):
            a.vmovdqu([r15 + c * ldo * 2], y[8 + c])
    _blocks(a, x, out, mb, nb, block, (16, 8 * ldo * 2), (8 * ldi * 2, 16))
    _transpose_edges(a, x, out, m, n, ldi, ldo, 2)


def _transpose_edges(a, x, out, m, n, ldi, ldo, es):
    """The elements the 8x8 blocks leave: the last n % 8 columns of every row, then the last
    m % 8 rows of the block columns."""
    mb, nb = m // 8, n // 8
    if n % 8:                                       # right edge: all rows, the last n % 8 columns
        a.lea(rcx, [x + nb * 8 * es])
        a.lea(rdx, [out + nb * 8 * ldo * es])
        _copy3(a, es, rcx, rdx, (1, m, n % 8), (0, ldi, 1), (0, 1, ldo))
    if m % 8:                                       # bottom edge: the last m % 8 rows
        a.lea(rcx, [x + mb * 8 * ldi * es])
        a.lea(rdx, [out + mb * 8 * es])
        _copy3(a, es, rcx, rdx, (1, m % 8, nb * 8), (0, ldi, 1), (0, 1, ldo))


def _vnni_pack(a, x, out, groups, n, ldi, f, es):
    """The ``groups`` full groups of f rows: 32-byte column chunks interleaved in ymm registers
    (bf16 pairs: unpack words; int8 quads: unpack bytes then words), scalar right edge."""
    cols = 32 // es
    chunks = n // cols
    y = [vec(256, i) for i in range(12)]

    def chunk():
        for r in range(f):
            a.vmovdqu(y[r], [r14 + r * ldi * es])
        if f == 2:
            a.vpunpcklwd(y[4], y[0], y[1])
            a.vpunpckhwd(y[5], y[0], y[1])
            pairs = [(4, 5)]
        else:
            a.vpunpcklbw(y[4], y[0], y[1])
            a.vpunpckhbw(y[5], y[0], y[1])
            a.vpunpcklbw(y[6], y[2], y[3])
            a.vpunpckhbw(y[7], y[2], y[3])
            a.vpunpcklwd(y[8], y[4], y[6])
            a.vpunpckhwd(y[9], y[4], y[6])
            a.vpunpcklwd(y[10], y[5], y[7])
            a.vpunpckhwd(y[11], y[5], y[7])
            pairs = [(8, 9), (10, 11)]
        # each register holds columns (lane 0, lane 1) = (c, c + cols/2): reorder the 128-bit halves
        outs = [(lo, hi, 0x20) for lo, hi in pairs] + [(lo, hi, 0x31) for lo, hi in pairs]
        for i, (lo, hi, imm) in enumerate(outs):
            a.vperm2i128(y[i], y[lo], y[hi], imm)
            a.vmovdqu([r15 + 32 * i], y[i])
    _blocks(a, x, out, groups, chunks, chunk, (32, 32 * f), (f * ldi * es, n * f * es))
    if n % cols:
        a.lea(rcx, [x + chunks * cols * es])
        a.lea(rdx, [out + chunks * cols * f * es])
        _copy3(a, es, rcx, rdx, (groups, f, n % cols), (f * ldi, ldi, 1), (n * f, 1, f))
