"""x86 generators for layout transforms (transpose, VNNI2/VNNI4 pack and unpack).

4-byte transposes move 8x8 blocks through ymm registers (unpack, shuffle, lane permute), 2-byte
ones 8x8 blocks through xmm registers (three unpack stages), 1- and 8-byte ones the blocks of
:mod:`tppasm.x86.transpose_bytes` (16x16 bytes, 8x4 or 8x8 qwords) in the same loops. VNNI packs
and unpacks of every dtype pair shuffle 32-byte column chunks of f rows in ymm registers
(:mod:`tppasm.x86.vnni`). Edges stay vector code: the blocks of a transpose's last columns and
rows, and a VNNI chunk's last n % (32 / itemsize) columns, take masked loads and stores
(:class:`_Tails`); on AVX2 a VNNI layout at least one chunk wide (and a 1- or 8-byte transpose at
least one block wide) instead moves its last chunk back to end at the edge (it overlaps the one
before and rewrites some outputs with the same values). The rows a packed VNNI group lacks are
zero registers; an unpack writes only the rows it holds. No byte outside the operands is read or
written. Output rows one L1 set apart (ldo * itemsize a multiple of 4 KiB, or within a few bytes of
one: :func:`tppasm.x86.blocking.rows_per_set`) would put all 8 rows a 4-byte block stores in one
set: whole blocks there take columns 4-7 from 256 / itemsize rows back (:func:`_lag`).

>>> import numpy as np, tppasm
>>> x = np.arange(6, dtype=np.float32).reshape(2, 3); out = np.empty((3, 2), np.float32)
>>> tppasm.transform("transpose", 2, 3)(x, out); out.tolist()
[[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
"""
from isa.x86 import (K, Function, dword, eax, ptr, r8, r9, r10, r11, r12, r13, r14, r15, rax, rcx,
                     rdx, rsp, vec)

from ..dtypes import dtype as to_dtype
from ..backends import register
from . import transpose_bytes
from . import vnni
from .blocking import ALIASED_ROWS, rows_per_set


@register("x86", "transform")
def generate_transform(desc, isa):
    fn = Function(f"transform_{desc.op}", ["ptr", "ptr"])
    a = fn.asm
    x, out = fn.args
    es = to_dtype(desc.dtype).itemsize
    m, n, f = desc.m, desc.n, desc.factor
    if desc.op == "transpose":
        _transpose(fn, _Tails(fn, isa), x, out, m, n, desc.ldi, desc.ldo, es)
    else:
        # every VNNI pack and unpack: tppasm.x86.vnni's shuffle network in these loops and tails
        t, unpack = _Tails(fn, isa), desc.op.startswith("un")
        net, ld = vnni.Network(a, f, es, unpack), desc.ldo if unpack else desc.ldi
        net.setup()
        for gcount, g0, rows in net.groups(m):
            for ccount, c0, ncols in _segments(n, net.cols, overlap=not t.avx512):
                net.prepare(t, ncols)
                src, dst = net.offsets(g0, c0, n, ld)
                _blocks(a, _offset(a, rcx, x, src), _offset(a, rdx, out, dst), gcount, ccount,
                        lambda rows=rows, ncols=ncols: net.chunk(
                            t, rows, ncols, _strided(a, net.rows_at, ld * es, rows, net.walker)), *net.steps(n, ld))
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
    """``count`` runs of ``body()``, the ``pointers`` stepped by ``steps`` bytes after each (a step
    past 32 bits through rax, which no body keeps live across its runs)."""
    if count == 1:
        body()
        return
    a.mov(counter, count)
    top = a.label()
    a.bind(top)
    body()
    for pointer, step in zip(pointers, steps):
        if -2 ** 31 <= step < 2 ** 31:
            a.add(pointer, step)
        else:
            a.mov(rax, step)
            a.add(pointer, rax)
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


ROW_REACH = 64        # bytes past a row's displacement that its loads and stores reach (a zmm; tail pieces)


def _strided(a, base, stride, count, walker):
    """(register, displacement) of ``base + i * stride`` for i < ``count``, generated in order:
    displacements from ``base`` while the last, plus the up to ``ROW_REACH`` bytes a row's accesses
    add to it, fits in 32 bits, else ``walker`` stepped by ``stride`` between uses (so a stride under
    2 GiB always works, as it did for the element-wise copy)."""
    if (count - 1) * stride + ROW_REACH < 2 ** 31:
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
    """out (n, m) = x (m, n)^T in register blocks: 8x8 for 2- and 4-byte elements, those of
    :class:`tppasm.x86.transpose_bytes.Blocks` for 1- and 8-byte ones; the blocks of the last
    columns take masked loads, those of the last rows masked stores (AVX2 1- and 8-byte blocks:
    whole blocks moved back where the dimension holds one, ``Blocks.overlap``)."""
    a = fn.asm
    wide = transpose_bytes.Blocks(a, es, t.avx512, _emit_live) if es in (1, 8) else None
    R, C, overlap = (wide.rows, wide.cols, wide.overlap) if wide else (8, 8, False)
    lagging = _lag(m, n, ldi, ldo, es) if not wide or wide.lags else 0

    def block(rows, cols, lag):
        if not wide:
            return _transpose_block(a, t, es, ldi, ldo, rows, cols, lag)
        loads, stores = _strided(a, r14, ldi * es, rows, r10), _strided(a, r15, ldo * es, cols, r11)
        return wide.block(t, rows, cols, loads, stores, (lag * ldi * es, lag * es))
    for rcount, r0, rows, segments in _runs(m, n, R, C, overlap, lagging):
        for ccount, c0, cols, lag in segments:
            if cols < C:
                t.prepare(cols, es)
            if 1 < rows < R:                    # one row is stored element by element
                t.prepare(rows, es, loads=False)
            src = _offset(a, rcx, x, (r0 * ldi + c0) * es)
            dst = _offset(a, rdx, out, (c0 * ldo + r0) * es)
            _blocks(a, src, dst, rcount, ccount, lambda rows=rows, cols=cols, lag=lag: block(rows, cols, lag),
                    (C * es, C * ldo * es), (R * ldi * es, R * es))


# A block of 4-byte elements (or 8-byte ones in zmm) stores 8 output rows; ldo * itemsize a multiple of 4 KiB
# (or within a few bytes of one: rows_per_set) puts all 8 in one L1 set (8 ways), and f32 1024 x 8 took 1.8 us
# against 0.85 for 1024 x 7 or ldo 1040 (Zen 4).
# There the whole blocks take columns 4-7 (the upper half of each row's register) from rows LAG_BYTES /
# itemsize back: they store 4 output rows here and 4 at 256 bytes (4 lines, other sets) before (f32 1024 x 8:
# 0.87 us, 128 bytes back 1.0; f32 1024 x 1024: 511 against 816 us). Their loads then touch twice the rows:
# where those share a set too, a qword block, whose stores are whole lines, loses more than it gains
# (i64 1024 x 1024: 495 against 430 us; i64 1024 x 8: 1.47 against 2.15).
LAG_BYTES = 256


def _lag(m, n, ldi, ldo, es):
    """How many rows back the whole 8 x 8 blocks take their columns 4-7 from (0: none)."""
    lag = LAG_BYTES // es
    aliased = rows_per_set(ldo * es, 8) > ALIASED_ROWS and (es == 4 or rows_per_set(ldi * es, 16) <= ALIASED_ROWS)
    return lag if es in (4, 8) and aliased and n >= 8 and m >= lag + 8 and (lag + 8) * ldi * es < 2 ** 31 else 0


def _runs(m, n, rows, cols, overlap, lag):
    """(count, first row, rows, column segments) runs of blocks covering ``m`` x ``n``, each segment
    (count, first column, columns, lag): :func:`_segments` both ways, or with a ``lag``, whole blocks
    taking columns 4-7 from ``lag`` rows back, after blocks of the first ``lag`` rows' columns 0-3
    and before blocks of the last lagging rows' columns 4-7 (4-column blocks: 4 rows in one set).

    >>> for run in _runs(100, 12, 8, 8, False, 64): print(run)
    (8, 0, 8, [(1, 0, 4, 0), (1, 8, 4, 0)])
    (4, 64, 8, [(1, 0, 8, 64), (1, 8, 4, 0)])
    (8, 32, 8, [(1, 4, 4, 0)])
    (1, 96, 4, [(1, 0, 8, 0), (1, 8, 4, 0)])
    """
    plain = [(count, c0, size, 0) for count, c0, size in _segments(n, cols, overlap)]
    if not lag:
        return [(count, r0, size, plain) for count, r0, size in _segments(m, rows, overlap)]
    lagging, whole, tail = (m - lag) // rows, n // cols, plain[1:] if n % cols else []
    return ([(lag // rows, 0, rows, [(whole, 0, 4, 0)] + tail), (lagging, lag, rows, [(whole, 0, cols, lag)] + tail),
             (lag // rows, rows * lagging, rows, [(whole, 4, 4, 0)])]
            + [(count, r0 + rows * lagging + lag, size, plain)
               for count, r0, size in _segments(m - rows * lagging - lag, rows, overlap)])


def _transpose_block(a, t, es, ldi, ldo, rows, cols, lag=0):
    """The block of ``rows`` x ``cols`` at r14 (rows ``ldi`` apart) transposed to r15 (``ldo``); with a
    ``lag`` (8 whole 4-byte rows and columns), columns 4-7 are those of the rows ``lag`` rows back."""
    y = [vec(256 if es == 4 else 128, i) for i in range(16)]
    move = a.vmovups if es == 4 else a.vmovdqu
    mask = t.arm(cols, es, y[15]) if cols < 8 else None
    for r, (base, disp) in enumerate(_strided(a, r14, ldi * es, rows, r10)):
        if mask is None:
            move(y[r], [base + disp])
        else:
            t.load(y[r], base, disp, cols, es, mask)
        if lag:
            a.vblendps(y[r], y[r], [base + disp - lag * ldi * es], 0xF0)
    places = _strided(a, r15, ldo * es, cols, r11)
    if rows == 1:
        transpose_bytes.row_to_column(a, es, places, vec(256, 0))
        return
    network = _transpose8() if es == 4 else transpose_bytes.unpack_network(transpose_bytes.WORD_STAGES)
    _emit_live(a, y, network, {8 + c for c in range(cols)})
    for c, (base, disp) in enumerate(places):
        if rows == 8:
            move([base + disp - (lag * es if c >= 4 else 0)], y[8 + c])
        else:
            t.store(base, disp, y[8 + c], rows, es, tmp=y[0])


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
