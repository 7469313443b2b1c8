"""The shuffle networks of the x86 VNNI layouts, for f = 2 or 4 rows and elements of 1, 2, 4 or 8
bytes: pack x (k, n) -> (ceil(k/f), n, f) and unpack it back (:class:`Network`; the loops around
it, the tails' masks and the column segments are :mod:`tppasm.x86.transform`'s).

A chunk is f rows of one ymm register each (32 / itemsize columns) and the f ymm registers of their
packed groups, at both levels (AVX-512 differs only in its masked tails). The pack interleaves the
rows with ``vpunpck[lh]`` of element width (f = 4: then of twice that width) and puts the 128-bit
halves in column order with ``vperm2i128``. The unpack first gathers each row's elements of a
packed register: an in-lane ``vpshufb`` (where a lane holds more than one group) and a cross-lane
``vpermq``/``vpermd``, after which each row's part is one 128-bit half (f = 2) or one qword (f = 4);
``vperm2i128`` (f = 4: after ``vpunpck[lh]qdq``) then assembles the rows. Neither needs AVX512_VBMI
or any other optional feature. The unpack writes only the rows the last group really holds.

>>> import numpy as np, tppasm
>>> x = np.arange(10, dtype=np.int8).reshape(5, 2)              # k = 5 rows: the last group holds 1
>>> packed = np.empty((2, 2, 4), np.int8); tppasm.transform("vnni4", 5, 2, dtype="i8")(x, packed)
>>> packed[1].tolist()                                            # rows past k are zeros
[[8, 0, 0, 0], [9, 0, 0, 0]]
>>> back = np.empty((5, 2), np.int8); tppasm.transform("unvnni4", 5, 2, dtype="i8")(packed, back)
>>> back.tolist() == x.tolist()
True
"""
from isa.x86 import eax, r10, r11, r14, r15, vec

# vpunpck[lh]* of each element width in bytes
_UNPACK = {1: "bw", 2: "wd", 4: "dq", 8: "qdq"}
# vpermd indices that gather each row's part of a packed register once vpshufb (if any) has put
# the parts of each 128-bit lane in row order: f = 2 (4-byte elements, no vpshufb) and f = 4
_GATHER_DWORDS = {2: (0, 2, 4, 6, 1, 3, 5, 7), 4: (0, 4, 1, 5, 2, 6, 3, 7)}
_SHUFFLE, _INDEX, _ARM, _TMP = 12, 13, 14, 15      # unpack registers besides ymm0-11


class Network:
    """One VNNI pack (``unpack=False``) or unpack of ``f``-row groups of ``es``-byte elements, emitted
    into the assembler ``a``: :meth:`setup` once, then per column segment :meth:`prepare` (outside
    the loops), :meth:`offsets`/:meth:`steps` for the loops and :meth:`chunk` as their body, which
    reads at r14 and writes at r15.

    >>> from isa.x86 import Function
    >>> net = Network(Function("doc", ["ptr", "ptr"]).asm, 4, 1, unpack=True)
    >>> net.cols, net.per_reg, net.groups(9), net.steps(64, 64)
    (32, 8, [(2, 0, 4), (1, 2, 1)], ((128, 32), (256, 256)))
    """

    def __init__(self, a, f, es, unpack):
        self.a, self.f, self.es, self.unpack = a, f, es, unpack
        self.group = f * es                  # bytes of one column's group
        self.per_reg = 32 // self.group      # columns of one packed register
        self.cols = 32 // es                 # columns of one chunk: a ymm register of each row
        self.unit = min(self.group, 8)       # element size of a packed register's partial moves
        # where the rows are (r14 in x for a pack, r15 in out for an unpack), and the register that
        # walks them when their displacements pass 32 bits
        self.rows_at, self.walker = (r15, r11) if unpack else (r14, r10)

    def groups(self, m):
        """(count, first group, rows) runs: the whole groups of ``m`` rows, then the last partial one.

        >>> Network(None, 2, 2, unpack=False).groups(5)
        [(2, 0, 2), (1, 2, 1)]
        """
        full, rem = divmod(m, self.f)
        return ([(full, 0, self.f)] if full else []) + ([(1, full, rem)] if rem else [])

    def offsets(self, g0, c0, n, ld):
        """Bytes from x and from out to group ``g0``, column ``c0`` (``ld``: the rows' leading dimension).

        >>> Network(None, 2, 2, unpack=True).offsets(1, 16, 64, 80)      # packed x, out rows
        (320, 352)
        """
        rows, packed = (g0 * self.f * ld + c0) * self.es, (g0 * n + c0) * self.group
        return (packed, rows) if self.unpack else (rows, packed)

    def steps(self, n, ld):
        """((x, out) bytes per chunk, (x, out) bytes per group) for ``_blocks``.

        >>> Network(None, 2, 2, unpack=False).steps(64, 80)
        ((32, 64), (320, 256))
        """
        chunk, group = (32 * self.f, 32), (n * self.group, self.f * ld * self.es)
        if not self.unpack:
            chunk, group = chunk[::-1], group[::-1]
        return chunk, group

    def setup(self):
        """The unpack's constants: the in-lane byte shuffle in ymm12, the dword gather in ymm13.

        >>> from isa.x86 import Function
        >>> fn = Function("doc", []); Network(fn.asm, 2, 4, unpack=True).setup()
        >>> for line in fn.finalize().disassemble().splitlines()[:5]:
        ...     print(line.split(None, 2)[2])
        mov eax,6040200h
        vmovd xmm13,eax
        mov eax,7050301h
        vpinsrd xmm13,xmm13,eax,1
        vpmovzxbd ymm13,xmm13
        """
        a, f, es = self.a, self.f, self.es
        if not self.unpack:
            return
        if self.group < 16 and (f, es) != (2, 4):
            _bytes_to(a, _SHUFFLE, [(g * f + b) * es + k for b in range(f) for g in range(16 // self.group)
                                    for k in range(es)])
            a.vinserti128(vec(256, _SHUFFLE), vec(256, _SHUFFLE), vec(128, _SHUFFLE), 1)
        if self._gathers_dwords():
            _bytes_to(a, _INDEX, _GATHER_DWORDS[f])
            a.vpmovzxbd(vec(256, _INDEX), vec(128, _INDEX))

    def _gathers_dwords(self):
        return (self.f, self.es) == (2, 4) or self.f == 4 and self.es < 8

    def prepare(self, t, ncols):
        """Set up the masks of a segment of ``ncols`` columns (fewer than :attr:`cols`: a tail) in the
        :class:`~tppasm.x86.transform._Tails` ``t``.

        >>> from isa.x86 import Function
        >>> from tppasm.x86.transform import _Tails
        >>> fn = Function("doc", []); t = _Tails(fn, "avx512"); Network(fn.asm, 2, 2, unpack=True).prepare(t, 9)
        >>> t.masks                          # the rows' 9 words, the last packed register's 1 dword
        {(9, 2): k1, (1, 4): k2}
        """
        if ncols >= self.cols:
            return
        t.prepare(ncols, self.es, loads=not self.unpack)
        if ncols % self.per_reg:
            t.prepare(ncols % self.per_reg * self.group // self.unit, self.unit, loads=self.unpack)

    def chunk(self, t, rows, ncols, places):
        """The body: ``ncols`` columns of a group's first ``rows`` rows (the others are zeros in
        the packed layout), the rows at ``places`` ((register, displacement) pairs, in order).
        A whole chunk needs no tails (``t``):

        >>> from isa.x86 import Function, r15
        >>> fn = Function("doc", []); net = Network(fn.asm, 2, 2, unpack=True)
        >>> net.chunk(None, 2, net.cols, [(r15, 0), (r15, 64)])
        >>> names = [line.split()[2] for line in fn.finalize().disassemble().splitlines()]
        >>> print(" ".join(w for w in names if w.startswith("vp") or w == "vmovdqu"))
        vmovdqu vpshufb vpermq vmovdqu vpshufb vpermq vperm2i128 vmovdqu vperm2i128 vmovdqu
        """
        (self._unpack_chunk if self.unpack else self._pack_chunk)(t, rows, ncols, places)

    def _pack_chunk(self, t, rows, ncols, places):
        a, f, es = self.a, self.f, self.es
        y = [vec(256, i) for i in range(15)]
        mask = t.arm(ncols, es, y[12]) if ncols < self.cols else None
        for r, (base, disp) in enumerate(places):
            if mask is None:
                a.vmovdqu(y[r], [base + disp])
            else:
                t.load(y[r], base, disp, ncols, es, mask, tmp=y[14])
        for r in range(rows, f):
            a.vpxor(y[r], y[r], y[r])
        low, high = (getattr(a, f"vpunpck{h}{_UNPACK[es]}") for h in "lh")
        low(y[4], y[0], y[1])
        high(y[5], y[0], y[1])
        pairs = [(4, 5)]
        if f == 4:
            low(y[6], y[2], y[3])
            high(y[7], y[2], y[3])
            pairs = [(4, 6), (5, 7)]             # 8-byte elements: qword pairs are whole groups' halves
        if f == 4 and es < 8:
            low, high = (getattr(a, f"vpunpck{h}{_UNPACK[2 * es]}") for h in "lh")
            low(y[8], y[4], y[6])
            high(y[9], y[4], y[6])
            low(y[10], y[5], y[7])
            high(y[11], y[5], y[7])
            pairs = [(8, 9), (10, 11)]
        # each register holds columns (lane 0, lane 1) = (c, c + cols/2): reorder the 128-bit halves;
        # output register i then holds the groups of columns per_reg * i on
        outs = [(lo, hi, 0x20) for lo, hi in pairs] + [(lo, hi, 0x31) for lo, hi in pairs]
        for i, (lo, hi, imm) in enumerate(outs[:-(-ncols // self.per_reg)]):
            a.vperm2i128(y[i], y[lo], y[hi], imm)
            if ncols >= self.per_reg * (i + 1):
                a.vmovdqu([r15 + 32 * i], y[i])
            else:
                count = (ncols - self.per_reg * i) * self.group // self.unit
                t.store(r15, 32 * i, y[i], count, self.unit, tmp=y[13])

    def _unpack_chunk(self, t, rows, ncols, places):
        a, f, es = self.a, self.f, self.es
        y = [vec(256, i) for i in range(16)]
        for i in range(-(-ncols // self.per_reg)):      # the packed registers holding the columns
            if ncols >= self.per_reg * (i + 1):
                a.vmovdqu(y[i], [r14 + 32 * i])
            else:
                count = (ncols - self.per_reg * i) * self.group // self.unit
                t.load(y[i], r14, 32 * i, count, self.unit, t.arm(count, self.unit, y[_ARM]), tmp=y[_TMP])
            self._gather(y[i])
        if f == 2:                                      # row b: lane b of each register
            outs, first = [(0, 1, 0x20), (0, 1, 0x31)], 4
        else:                                           # row b: qword b of each register
            a.vpunpcklqdq(y[4], y[0], y[1])
            a.vpunpcklqdq(y[6], y[2], y[3])
            if rows > 1:
                a.vpunpckhqdq(y[5], y[0], y[1])
                a.vpunpckhqdq(y[7], y[2], y[3])
            outs, first = [(4, 6, 0x20), (5, 7, 0x20), (4, 6, 0x31), (5, 7, 0x31)], 8
        for b, (base, disp) in enumerate(places):
            lo, hi, imm = outs[b]
            row = y[first + b]
            a.vperm2i128(row, y[lo], y[hi], imm)
            if ncols == self.cols:
                a.vmovdqu([base + disp], row)
            else:
                t.store(base, disp, row, ncols, es, tmp=y[_TMP])

    def _gather(self, reg):
        """Each row's part of the packed register ``reg`` made contiguous: f = 2 in 128-bit half b,
        f = 4 in qword b (in place)."""
        a = self.a
        if self.group < 16 and (self.f, self.es) != (2, 4):
            a.vpshufb(reg, reg, vec(256, _SHUFFLE))
        if self._gathers_dwords():
            a.vpermd(reg, vec(256, _INDEX), reg)
        elif self.f == 2:
            a.vpermq(reg, reg, 0xD8)


def _bytes_to(a, num, values):
    """xmm ``num``'s low bytes = ``values`` (a multiple of 4 of them), a dword at a time through eax
    (a 64-bit immediate would read as an absolute address to the position check of the disk cache)."""
    low = vec(128, num)
    for i in range(0, len(values), 4):
        bits = int.from_bytes(bytes(values[i:i + 4]), "little")
        a.mov(eax, bits - (1 << 32) if bits >= 1 << 31 else bits)
        if i:
            a.vpinsrd(low, low, eax, i // 4)
        else:
            a.vmovd(low, eax)
