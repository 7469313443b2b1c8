"""x86 transposes of 1-byte (i8, u8) and 8-byte (i64) elements in register blocks.

Bytes move in 16 x 16 blocks: ymm register r holds row r in its low 128 bits and row r + 8 in its
high ones, three unpack stages (bytes, words, dwords of row pairs) leave columns 2j and 2j + 1 of
all 16 rows in register j's qwords, and one ``vpermq`` makes them its two 128-bit halves, two
16-byte output rows. Qwords move in 8 x 4 blocks on AVX2 (two 4 x 4 transposes: unpack qwords of row
pairs, then ``vperm2i128`` of 128-bit halves; a column's 8 rows are two ymm stores, one 64-byte
line) and 8 x 8 blocks in zmm on AVX-512 (unpack, then two ``vshufi64x2`` stages). A block one row
high stores its elements without the network. Edges stay vector code: on AVX-512 the blocks of
the last n % block columns and m % block rows take :class:`tppasm.x86.transform._Tails`'s masked
loads and stores; on AVX2, whose masked stores are microcoded (and of dwords at the finest), a
dimension of at least one block ends in one more whole block moved back to end at the edge (it
rewrites some outputs with the same values), and only a dimension under one block takes _Tails's
partial loads and its stores in 16-, 8-, 4-, 2- and 1-byte pieces (``vpextrb`` for a byte). No
byte outside the operands is read or written. Where the 8 output rows of an AVX-512 qword block
share an L1 set, whole blocks take columns 4-7 from rows further back (transform's ``_lag``).

The loops over the blocks, the masks and the addressing are ``tppasm.x86.transform``'s
(``_transpose``), which imports this module; :class:`Blocks` emits one block.

>>> import numpy as np, tppasm
>>> x = np.arange(6, dtype=np.int8).reshape(2, 3); out = np.empty((3, 2), np.int8)
>>> tppasm.transform("transpose", 2, 3, dtype="i8")(x, out); out.tolist()
[[0, 3], [1, 4], [2, 5]]
"""
from isa.x86 import vec


class Blocks:
    """The register blocks of a transpose of ``es``-byte elements (1 or 8) on AVX2 or AVX-512: a
    block is ``rows`` x ``cols`` elements; :meth:`block` emits one. ``emit_live(a, regs, ops, live)``
    emits the ops of a network that the registers ``live`` depend on (a narrow block needs part).

    >>> from isa.x86 import Function
    >>> from tppasm.x86.transform import _emit_live
    >>> b = Blocks(Function("f", []).asm, 8, False, _emit_live); b.rows, b.cols
    (8, 4)
    """

    def __init__(self, a, es, avx512, emit_live):
        self.a, self.es, self.emit_live = a, es, emit_live
        # AVX2 (no masked byte or qword stores but microcoded ones): a dimension holding a whole block
        # ends in one more whole block moved back to end at the edge; it rewrites some outputs
        self.overlap = not avx512
        self.rows, self.cols, self._body = (16, 16, _bytes) if es == 1 else (8, 8, _qwords_512) if avx512 \
            else (8, 4, _qwords_256)
        self.lags = self._body is _qwords_512      # see block()

    def block(self, t, rows, cols, loads, stores, lag=(0, 0)):
        """The block of ``rows`` x ``cols`` whose rows ``loads`` addresses ((register, displacement)
        of each in turn, as transform's ``_strided`` gives them) to the columns at ``stores``; ``t``
        is the function's :class:`~tppasm.x86.transform._Tails`, prepared for these counts. With
        :attr:`lags`, a whole block's columns 4-7 may come from ``lag[0]`` bytes before each row
        and go ``lag[1]`` bytes before each column (transform's ``_lag``)."""
        mask = t.arm(cols, self.es, vec(128 if self.es == 1 else 256, 15)) if cols < self.cols else None
        self._body(self.a, t, self.emit_live, loads, stores, rows, cols, mask, *([lag] if lag[0] else []))


def _put(a, t, es, base, disp, reg, count, whole, tmp):
    """The first ``count`` elements of ``reg`` (``whole`` fill it) to ``[base + disp]``."""
    if count == whole:
        (a.vmovdqu64 if reg.kind == "zmm" else a.vmovdqu)([base + disp], reg)
    else:
        t.store(base, disp, reg, count, es, tmp)


# Each stage of an unpack network interleaves the low and the high halves of register pairs (the
# previous stage's outputs, numbered as written): elements of row pairs, then twice as wide pieces,
# then four times as wide; with bytes register j then holds columns 2j and 2j + 1 (rows 0-7 in the
# low 128 bits, 8-15 in the high), with words (8 x 8 in xmm) register c holds column c
_STAGE_PAIRS = (((0, 1), (2, 3), (4, 5), (6, 7)), ((0, 2), (1, 3), (4, 6), (5, 7)), ((0, 4), (1, 5), (2, 6), (3, 7)))
BYTE_STAGES, WORD_STAGES = ("bw", "wd", "dq"), ("wd", "dq", "qdq")


def unpack_network(widths):
    """The ops taking registers 0-7 (rows) to 8-15 through three ``vpunpck[lh]`` stages of ``widths``.

    >>> unpack_network(WORD_STAGES)[:2]
    [('vpunpcklwd', 8, 0, 1), ('vpunpckhwd', 9, 0, 1)]
    """
    ops = []
    for stage, (unpack, pairs) in enumerate(zip(widths, _STAGE_PAIRS)):
        src, dst = (0, 8) if stage % 2 == 0 else (8, 0)
        for i, (p, q) in enumerate(pairs):
            ops += [(f"vpunpckl{unpack}", dst + 2 * i, src + p, src + q),
                    (f"vpunpckh{unpack}", dst + 2 * i + 1, src + p, src + q)]
    return ops


def _bytes(a, t, emit_live, loads, stores, rows, cols, mask):
    y, xm = [vec(256, i) for i in range(16)], [vec(128, i) for i in range(16)]
    for r in range(rows):
        base, disp = next(loads)
        if r < 8 and mask is None:
            a.vmovdqu(xm[r], [base + disp])
        elif mask is None:
            a.vinserti128(y[r - 8], y[r - 8], [base + disp], 1)
        else:
            t.load(xm[r] if r < 8 else xm[8], base, disp, cols, 1, mask)
            if r >= 8:
                a.vinserti128(y[r - 8], y[r - 8], xm[8], 1)
    if rows == 1:
        row_to_column(a, 1, stores, y[0])
        return
    pairs = -(-cols // 2)
    emit_live(a, y, unpack_network(BYTE_STAGES), {8 + j for j in range(pairs)})
    for j in range(pairs):
        a.vpermq(y[8 + j], y[8 + j], 0xD8)         # qwords 0 2 1 3: column 2j low, 2j + 1 high
        for half in range(min(2, cols - 2 * j)):
            base, disp = next(stores)
            if rows == 16 and half:
                a.vextracti128([base + disp], y[8 + j], 1)
            elif half:
                a.vextracti128(xm[0], y[8 + j], 1)
                t.store(base, disp, xm[0], rows, 1, tmp=xm[1])
            else:
                _put(a, t, 1, base, disp, xm[8 + j], rows, 16, tmp=xm[1])


def _qword_network_256():
    """The ops taking ymm 0-7 (rows) to ymm 0-7: register 2c + h = rows 4h to 4h + 3 of column c."""
    ops = []
    for p in range(4):                              # row pairs: interleave qwords
        ops += [("vpunpcklqdq", 8 + 2 * p, 2 * p, 2 * p + 1), ("vpunpckhqdq", 9 + 2 * p, 2 * p, 2 * p + 1)]
    for h in range(2):                              # 128-bit halves: rows 4h, 4h + 1 with 4h + 2, 4h + 3
        for c in range(4):
            ops.append(("vperm2i128", 2 * c + h, 8 + 4 * h + c % 2, 10 + 4 * h + c % 2, 0x20 if c < 2 else 0x31))
    return ops


def _qwords_256(a, t, emit_live, loads, stores, rows, cols, mask):
    y = [vec(256, i) for i in range(16)]
    _load_rows(a, t, loads, y, rows, cols, mask)
    if rows == 1:
        row_to_column(a, 8, stores, y[0])
        return
    halves = 1 if rows <= 4 else 2
    emit_live(a, y, _qword_network_256(), {2 * c + h for c in range(cols) for h in range(halves)})
    for c, (base, disp) in enumerate(stores):
        _put(a, t, 8, base, disp, y[2 * c], min(rows, 4), 4, tmp=y[8])
        if rows > 4:
            _put(a, t, 8, base, disp + 32, y[2 * c + 1], rows - 4, 4, tmp=y[8])


def _qword_network_512():
    """The ops taking zmm 0-7 (rows) to zmm 8-15 (columns)."""
    ops = []
    for p in range(4):                              # row pairs: lanes of columns 0 2 4 6 / 1 3 5 7
        ops += [("vpunpcklqdq", 8 + 2 * p, 2 * p, 2 * p + 1), ("vpunpckhqdq", 9 + 2 * p, 2 * p, 2 * p + 1)]
    for h in range(2):                              # rows 0-3 / 4-7: lanes (c, c + 4) of row pairs
        for odd in range(2):
            lo, hi = 8 + 4 * h + odd, 10 + 4 * h + odd
            ops += [("vshufi64x2", 4 * h + 2 * odd, lo, hi, 0x88), ("vshufi64x2", 4 * h + 2 * odd + 1, lo, hi, 0xDD)]
    for i, c in enumerate((0, 2, 1, 3)):            # register i holds columns c and c + 4 of rows 0-3
        ops += [("vshufi64x2", 8 + c, i, 4 + i, 0x88), ("vshufi64x2", 12 + c, i, 4 + i, 0xDD)]
    return ops


def _qwords_512(a, t, emit_live, loads, stores, rows, cols, mask, lag=(0, 0)):
    z = [vec(512, i) for i in range(16)]
    _load_rows(a, t, loads, z, rows, cols, mask, lag[0])
    if rows == 1:
        row_to_column(a, 8, stores, z[0])
        return
    emit_live(a, z, _qword_network_512(), {8 + c for c in range(cols)})
    for c, (base, disp) in enumerate(stores):
        _put(a, t, 8, base, disp - (lag[1] if c >= 4 else 0), z[8 + c], rows, 8, tmp=None)


def _load_rows(a, t, loads, regs, rows, cols, mask, back=0):
    """Rows of qwords into ``regs``; with ``back``, the upper 256 bits from ``back`` bytes before."""
    move = a.vmovdqu64 if regs[0].kind == "zmm" else a.vmovdqu
    for r in range(rows):
        base, disp = next(loads)
        if mask is None:
            move(regs[r], [base + disp])
        else:
            t.load(regs[r], base, disp, cols, 8, mask)
        if back:
            a.vinserti64x4(regs[r], regs[r], [base + disp - back + 32], 1)


def row_to_column(a, es, places, row):
    """Element c of ``row`` (a ymm or zmm register holding a block one row high) to each of
    ``places`` in turn, ``es``-byte elements: such a block needs none of the shuffle networks.

    >>> from isa.x86 import Function, r15
    >>> fn = Function("doc", []); row_to_column(fn.asm, 8, [(r15, 0), (r15, 8), (r15, 16)], vec(256, 0))
    >>> names = [line.split(None, 2)[2].split()[0] for line in fn.finalize().disassemble().splitlines()]
    >>> [name for name in names if name.startswith(("vmov", "vpextr", "vextract"))]
    ['vmovq', 'vpextrq', 'vextracti128', 'vmovq']
    """
    per_lane, part = 16 // es, vec(128, row.num)
    extract = {1: a.vpextrb, 2: a.vpextrw, 4: a.vpextrd, 8: a.vpextrq}[es]
    for c, (base, disp) in enumerate(places):
        lane, i = divmod(c, per_lane)
        if lane and not i:
            part = vec(128, 1)
            (a.vextracti32x4 if row.kind == "zmm" else a.vextracti128)(part, row, lane)
        if i or es < 4:
            extract([base + disp], part, i)
        else:
            (a.vmovd if es == 4 else a.vmovq)([base + disp], part)
