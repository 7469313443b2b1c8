"""x86 generators for layout transforms (transpose, VNNI2/VNNI4 pack and unpack).

4-byte transposes move 8x8 blocks through ymm registers (unpack, shuffle, lane permute), 2-byte
ones 8x8 blocks through xmm registers (three unpack stages); VNNI packs of bf16 pairs and int8
quads interleave 32-byte column chunks of f rows in ymm registers. Edges stay vector code: the
blocks of a transpose's last n % 8 columns and m % 8 rows, and a pack's last n % (32 / itemsize)
columns, take masked loads and stores (:class:`_Tails`); on AVX2 a pack at least one chunk wide
instead moves its last chunk back to end at the edge (it overlaps the one before and rewrites
some outputs with the same values). The rows a VNNI group lacks are zero registers. No byte
outside the operands is read or written. Everything else (1- and 8-byte transposes, the other
VNNI dtype pairs, VNNI unpacking) is an element-for-element copy through general registers in
three nested loops, ``out[a*oa + b*ob + c*oc] = x[a*ia + b*ib + c*ic]``, so any element size
and shape works; rows the VNNI layout pads are written as zeros.

>>> import numpy as np, tppasm
>>> x = np.arange(6, dtype=np.float32).reshape(2, 3); out = np.empty((3, 2), np.float32)
>>> tppasm.transform("transpose", 2, 3)(x, out); out.tolist()
[[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
"""
from isa.x86 import (K, Function, dword, eax, gpr, ptr, r8, r9, r10, r11, r12, r13, r14, r15, rax, rcx,
                     rdx, rsp, vec)

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
    if desc.op == "transpose" and es in (2, 4):
        _transpose(fn, _Tails(fn, isa), x, out, m, n, desc.ldi, desc.ldo, es)
    elif desc.op == "transpose":
        _copy3(a, es, x, out, (1, m, n), (0, desc.ldi, 1), (0, 1, desc.ldo))
    elif desc.op.startswith("vnni") and (f, es) in ((2, 2), (4, 1)):
        _vnni_pack(fn, _Tails(fn, isa), x, out, m, n, desc.ldi, f, es)
    elif desc.op.startswith("vnni"):
        full, rem = divmod(m, f)
        # x (k, n) row r = g*f + b -> out[g, col, b]
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
    and step by ``inner_step``. Both counts must be positive; a count of 1 is no loop and no step
    (a step past the end could need more than 32 bits where the block itself does not)."""
    a.mov(r12, x)
    a.mov(r13, out)
    _loop(a, r8, outer, lambda: _inner_blocks(a, inner, body, inner_step), (r12, r13), outer_step)


def _inner_blocks(a, inner, body, inner_step):
    a.mov(r14, r12)
    a.mov(r15, r13)
    _loop(a, r9, inner, body, (r14, r15), inner_step)


def _loop(a, counter, count, body, pointers, steps):
    """``count`` runs of ``body()``, the ``pointers`` stepped by ``steps`` bytes after each."""
    if count == 1:
        body()
        return
    a.mov(counter, count)
    top = a.label()
    a.bind(top)
    body()
    for pointer, step in zip(pointers, steps):
        a.add(pointer, step)
    a.dec(counter)
    a.jnz(top)


def _offset(a, dst, base, nbytes):
    """A register holding ``base + nbytes``: ``base`` itself when ``nbytes`` is 0, else ``dst``."""
    if not nbytes:
        return base
    if -2 ** 31 <= nbytes < 2 ** 31:
        a.lea(dst, [base + nbytes])
    else:
        a.mov(rax, nbytes)
        a.lea(dst, [base + rax])
    return dst


def _strided(a, base, stride, count, walker):
    """(register, displacement) of ``base + i * stride`` for i < ``count``, generated in order:
    displacements from ``base`` while the last fits in 32 bits, else ``walker`` stepped by ``stride``
    between uses (so a stride under 2 GiB always works, as it did for the element-wise copy)."""
    if (count - 1) * stride < 2 ** 31:
        for i in range(count):
            yield base, i * stride
        return
    a.mov(walker, base)
    for i in range(count):
        if i:
            a.add(walker, stride)
        yield walker, 0


def _segments(size, block, overlap):
    """(count, start, length) runs of blocks covering ``size`` elements: the whole blocks, then the
    rest as a short (masked) block, or with ``overlap`` as one more whole block that ends at
    ``size`` and overlaps the last (it rewrites some outputs with the same values, and needs none
    of AVX2's piecewise partial loads and stores). A size under one block is a single short block."""
    whole, rest = divmod(size, block)
    runs = [(whole, 0, block)] if whole else []
    if rest and overlap and whole:
        return runs + [(1, size - block, block)]
    return runs + ([(1, size - rest, rest)] if rest else [])


# AVX2 loads of 1, 2 or 4 whole dwords: plain moves into an xmm register, no mask to build and load
_PLAIN = {1: "vmovd", 2: "vmovq", 4: "vmovdqu"}


class _Tails:
    """Loads and stores of the first ``count`` elements (``es`` bytes each) of a vector that touch
    no byte past them. AVX-512: opmasks k1-k7 at byte, word or dword granularity. AVX2 loads:
    ``vmaskmovps`` dword masks kept on the stack (:meth:`arm` loads one into a free register; 1, 2
    or 4 dwords are a plain ``vmovd``/``vmovq``/``vmovdqu`` xmm load instead), a rest under a dword
    inserted element by element (``vpinsrb``/``vpinsrw``) when it lies in the low 128 bits, else
    as the dword ending at the last byte shifted into place. AVX2 stores: plain 16-, 8-, 4-, 2-
    and 1-byte pieces (a masked ``vmaskmovps`` store is microcoded and slow on
    AMD). :meth:`prepare` each mask outside the loops."""

    def __init__(self, fn, isa):
        self.fn, self.a, self.avx512 = fn, fn.asm, isa in ("avx512", "amx")
        self.masks = {}

    def _key(self, count, es):
        return (count, es) if self.avx512 else count * es // 4

    def prepare(self, count, es, loads=True):
        """Set up the mask of ``count`` elements once, here (the code runs on every call)."""
        key = self._key(count, es)
        if key in self.masks or not count or not (self.avx512 or loads and key and key not in _PLAIN):
            return
        if self.avx512:
            self.masks[key] = K[1 + len(self.masks)]
            self.a.mov(eax, (1 << count) - 1)
            self.a.kmovd(self.masks[key], eax)
            return
        slot = 32 * len(self.masks)
        self.fn.stack(slot + 32)
        # built in a register and stored whole: eight dword stores read back by one 32-byte load
        # cannot be forwarded and stalled every call (a 1x1 transpose took 11.5 ns instead of 2.2)
        zeros, ones = vec(256, 14), vec(256, 15)
        self.a.vpxor(zeros, zeros, zeros)
        self.a.vpcmpeqd(ones, ones, ones)
        self.a.vpblendd(ones, zeros, ones, (1 << key) - 1)
        self.a.vmovdqu([rsp + slot], ones)
        self.masks[key] = slot

    def arm(self, count, es, reg):
        """The load mask of ``count`` elements for the loads below: AVX2 puts it into ``reg``."""
        key = self._key(count, es)
        if self.avx512:
            return self.masks[key]
        if key and key not in _PLAIN:
            self.a.vmovdqu(reg, [rsp + self.masks[key]])
        return reg

    def load(self, dst, base, disp, count, es, mask, tmp=None):
        """dst's first ``count`` elements = those at ``[base + disp]``; the other lanes are undefined.
        AVX2 with a rest of over 16 bytes in: ``tmp`` is clobbered."""
        a, nbytes = self.a, count * es
        if self.avx512:
            getattr(a, f"vmovdqu{8 * es}")(dst.mask(mask, zero=True), [base + disp])
            return
        dwords, rest = divmod(nbytes, 4)
        if dwords in _PLAIN:
            getattr(a, _PLAIN[dwords])(vec(128, dst.num), [base + disp])
        elif dwords:
            a.vmaskmovps(dst, mask, [base + disp])
        if rest and nbytes <= 16:
            low = vec(128, dst.num)
            insert = a.vpinsrb if es == 1 else a.vpinsrw
            for e in range(dwords * 4 // es, count):
                insert(low, low, [base + disp + e * es], e)
        elif rest:
            a.vpbroadcastd(tmp, dword[base + disp + nbytes - 4])
            a.vpsrld(tmp, tmp, 8 * (4 - rest))
            a.vpblendd(dst, dst, tmp, 1 << dwords)

    def store(self, base, disp, src, count, es, tmp):
        """The first ``count`` elements of ``src`` to ``[base + disp]`` (AVX2: ``tmp`` is clobbered)."""
        a, nbytes = self.a, count * es
        if self.avx512:
            getattr(a, f"vmovdqu{8 * es}")(ptr([base + disp]).mask(self.masks[(count, es)]), src)
            return
        part, spare, done = vec(128, src.num), vec(128, tmp.num), 0
        if nbytes >= 16:
            a.vmovdqu([base + disp], part)
            done = 16
            if nbytes > 16:
                a.vextracti128(spare, src, 1)
                part = spare
        for size in (8, 4, 2, 1):
            if (nbytes - done) & size:
                if size >= 4:
                    (a.vmovq if size == 8 else a.vmovd)([base + disp + done], part)
                else:
                    (a.vpextrw if size == 2 else a.vpextrb)([base + disp + done], part, 0)
                done += size
                if done < nbytes:
                    a.vpsrldq(spare, part, size)
                    part = spare


def _transpose(fn, t, x, out, m, n, ldi, ldo, es):
    """out (n, m) = x (m, n)^T for 2- and 4-byte elements, in 8x8 register blocks; the blocks of
    the last n % 8 columns take masked loads, those of the last m % 8 rows masked stores."""
    a = fn.asm
    for rcount, r0, rows in _segments(m, 8, overlap=False):
        for ccount, c0, cols in _segments(n, 8, overlap=False):
            if cols < 8:
                t.prepare(cols, es)
            if 1 < rows < 8:                    # one row is stored element by element
                t.prepare(rows, es, loads=False)
            src = _offset(a, rcx, x, (r0 * ldi + c0) * es)
            dst = _offset(a, rdx, out, (c0 * ldo + r0) * es)
            _blocks(a, src, dst, rcount, ccount, lambda rows=rows, cols=cols: _transpose_block(
                a, t, es, ldi, ldo, rows, cols), (8 * es, 8 * ldo * es), (8 * ldi * es, 8 * es))


def _transpose_block(a, t, es, ldi, ldo, rows, cols):
    """The block of ``rows`` x ``cols`` at r14 (rows ``ldi`` apart) transposed to r15 (``ldo``)."""
    y = [vec(256 if es == 4 else 128, i) for i in range(16)]
    move = a.vmovups if es == 4 else a.vmovdqu
    mask = t.arm(cols, es, y[15]) if cols < 8 else None
    for r, (base, disp) in enumerate(_strided(a, r14, ldi * es, rows, r10)):
        if mask is None:
            move(y[r], [base + disp])
        else:
            t.load(y[r], base, disp, cols, es, mask)
    places = _strided(a, r15, ldo * es, cols, r11)
    if rows == 1:
        _row_to_column(a, es, places)
        return
    _emit_live(a, y, (_transpose8 if es == 4 else _transpose8w)(), {8 + c for c in range(cols)})
    for c, (base, disp) in enumerate(places):
        if rows == 8:
            move([base + disp], y[8 + c])
        else:
            t.store(base, disp, y[8 + c], rows, es, tmp=y[0])


def _row_to_column(a, es, places):
    """Element c of the row in register 0 to each of ``places`` in turn: a block one row high
    needs none of the 8x8 shuffles."""
    per_lane, part = 16 // es, vec(128, 0)
    for c, (base, disp) in enumerate(places):
        if c == per_lane:
            a.vextracti128(vec(128, 1), vec(256, 0), 1)
            part = vec(128, 1)
        if es == 2:
            a.vpextrw([base + disp], part, c % per_lane)
        elif c % per_lane:
            a.vpextrd([base + disp], part, c % per_lane)
        else:
            a.vmovd([base + disp], part)


def _emit_live(a, y, ops, live):
    """The (mnemonic, dst, src, src, imm...) register ``ops`` that the registers ``live`` at the end
    depend on (a block of fewer than 8 columns needs only part of the network)."""
    kept = []
    for op in reversed(ops):
        if op[1] in live:
            kept.append(op)
            live = (live - {op[1]}) | {op[2], op[3]}
    for name, dst, p, q, *imm in reversed(kept):
        getattr(a, name)(y[dst], y[p], y[q], *imm)


def _transpose8():
    """The ops taking ymm 0-7 (rows of 4-byte elements) to ymm 8-15 (columns)."""
    ops = []
    for p in range(4):                              # pairs of rows: interleave dwords
        ops += [("vunpcklps", 8 + 2 * p, 2 * p, 2 * p + 1), ("vunpckhps", 9 + 2 * p, 2 * p, 2 * p + 1)]
    for q, (lo, hi) in enumerate(((8, 10), (9, 11), (12, 14), (13, 15))):   # quads: interleave qwords
        ops += [("vshufps", 2 * q, lo, hi, 0x44), ("vshufps", 2 * q + 1, lo, hi, 0xEE)]
    for c in range(4):                              # 128-bit halves: rows 0-3 with rows 4-7
        ops += [("vperm2f128", 8 + c, c, 4 + c, 0x20), ("vperm2f128", 12 + c, c, 4 + c, 0x31)]
    return ops


# the 8x8 word transpose: each stage interleaves the low and the high halves of register pairs
# (the previous stage's outputs, numbered as they were written): words of row pairs, then dwords,
# then qwords, after which register c holds column c
_WORD_STAGES = (("wd", ((0, 1), (2, 3), (4, 5), (6, 7))), ("dq", ((0, 2), (1, 3), (4, 6), (5, 7))),
                ("qdq", ((0, 4), (1, 5), (2, 6), (3, 7))))


def _transpose8w():
    """The ops taking xmm 0-7 (rows of 2-byte elements) to xmm 8-15 (columns)."""
    ops = []
    for stage, (unpack, pairs) in enumerate(_WORD_STAGES):
        src, dst = (0, 8) if stage % 2 == 0 else (8, 0)
        for i, (p, q) in enumerate(pairs):
            ops += [(f"vpunpckl{unpack}", dst + 2 * i, src + p, src + q),
                    (f"vpunpckh{unpack}", dst + 2 * i + 1, src + p, src + q)]
    return ops


def _vnni_pack(fn, t, x, out, m, n, ldi, f, es):
    """x (m, n) -> out (ceil(m/f), n, f) for bf16 pairs and int8 quads: 32-byte column chunks of f
    rows interleaved in ymm registers; the last n % (32 / es) columns are a masked chunk (on AVX2
    with n past one chunk: a whole chunk overlapping the one before); the last group's missing
    rows are zero registers."""
    a = fn.asm
    cols = 32 // es
    full, rem = divmod(m, f)
    groups = ([(full, 0, f)] if full else []) + ([(1, full, rem)] if rem else [])
    for gcount, g0, rows in groups:
        for ccount, c0, ncols in _segments(n, cols, overlap=not t.avx512):
            if ncols < cols:
                t.prepare(ncols, es)
                t.prepare(ncols % 8, 4, loads=False)
            src = _offset(a, rcx, x, (g0 * f * ldi + c0) * es)
            dst = _offset(a, rdx, out, (g0 * n * f + c0 * f) * es)
            _blocks(a, src, dst, gcount, ccount, lambda rows=rows, ncols=ncols: _vnni_chunk(
                a, t, ldi, f, es, rows, ncols), (32, 32 * f), (f * ldi * es, n * f * es))


def _vnni_chunk(a, t, ldi, f, es, rows, ncols):
    """``ncols`` columns of ``rows`` rows at r14 (``ldi`` apart; rows up to f are zeros) packed
    to r15: bf16 pairs unpack words, int8 quads unpack bytes then words."""
    cols = 32 // es
    y = [vec(256, i) for i in range(15)]
    mask = t.arm(ncols, es, y[12]) if ncols < cols else None
    for r, (base, disp) in enumerate(_strided(a, r14, ldi * es, rows, r10)):
        if mask is None:
            a.vmovdqu(y[r], [base + disp])
        else:
            t.load(y[r], base, disp, ncols, es, mask, tmp=y[14])
    for r in range(rows, f):
        a.vpxor(y[r], y[r], y[r])
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
    # each register holds columns (lane 0, lane 1) = (c, c + cols/2): reorder the 128-bit halves;
    # output register i then holds the f-element groups of columns 8i to 8i + 7 (8 dwords)
    outs = [(lo, hi, 0x20) for lo, hi in pairs] + [(lo, hi, 0x31) for lo, hi in pairs]
    for i, (lo, hi, imm) in enumerate(outs[:-(-ncols // 8)]):
        a.vperm2i128(y[i], y[lo], y[hi], imm)
        if ncols >= 8 * i + 8:
            a.vmovdqu([r15 + 32 * i], y[i])
        else:
            t.store(r15, 32 * i, y[i], ncols - 8 * i, 4, tmp=y[13])
