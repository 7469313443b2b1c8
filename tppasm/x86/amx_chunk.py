"""Batch chunks of the AMX BRGEMM (:mod:`tppasm.x86.amx`): tile loads from L1 over long batches.

Without chunks each macro block (2 x 2 tiles: 32 x 32 of C) walks the whole batch, streaming the A
row panel and the B column panel of every batch block, and the panels of a block are read by every
macro block of its row / column. When the batch's A and B outgrow L1 they come from L2 again for
each macro block (64 x 64 x 64 bf16 x 16: 256 KiB of A + B, 512 KiB of tile loads per call, more
than the L2 -> L1 fill moves in the time of the ``tdp*``). In *chunks* of ``g`` batch blocks whose
A + B fit in ``CHUNK_BYTES`` (2/3 of L1), every macro block runs over one chunk before the next
chunk starts, so the blocks come from L2 about once per call and the other tile loads hit L1.

C keeps the partial sums between chunks: in C itself when it is fp32 / int32 and there is no
epilogue (the first chunk honours beta: ``tilezero`` or a load of C; later chunks load C), else
in an fp32 / int32 scratch on the stack (the first chunk starts as the unchunked kernel does, the
last one runs the epilogue into C). The macro blocks of a chunk are emitted one after another (a
snake over C: consecutive ones share an A or a B panel), and each hands the next the A / B tiles
of its first step (loaded right after their last reader, as between batch blocks) and, with C in
C, its accumulators: each stored and at once reloaded with the next block's C, in the order the
``tdp*`` finish. No prefetches: the next chunk's would evict the current one's blocks from L1.

``count`` is a runtime argument: the chunk loop takes ``g`` blocks at a time and the rest in a
last, shorter chunk, so a call with ``count <= g`` runs one chunk. ``python -m bench amx-static``
(its cycle model) chose all this while it let tile loads pass tile stores: with ``g`` = 2 at
64 x 64 x 64 bf16 x 16 its renamed reading went from 79% to 97% of the AMX peak. With the
tile-store fence fitted on the first AMX host (:mod:`bench.amx_model`) it gives 75% and 72%
(in-order 61% and 53%): each macro block's C makes a round trip per chunk.

Measured on an Emerald Rapids core (``python -m bench amx-micro`` and ``amx-variants``), tiles are
renamed, yet chunks lose: 64 x 64 x 64 bf16 x 16 ran at 42-43% of the AMX peak in chunks of 1, 2
or 4 against 49.5% without, because a round trip of C (four ``tilestored``, four ``tileloadd``)
costs ~100 cycles there (the fence above). So the host decides:
:mod:`tppasm.x86.amx_probe` times both kernels of one shape once where AMX runs natively and
keeps chunks only where they win (off on that core); ``TPPASM_AMX_CHUNKS=1`` / ``0`` forces them
on / off (read when a kernel is generated, and part of the disk cache's key).
"""
from dataclasses import dataclass

from isa.x86 import TMM, qword, rsp

from .batch import mem_imm

L1_BYTES = 48 << 10          # the L1 data cache the chunks are sized for (Sapphire / Emerald Rapids)
CHUNK_BYTES = L1_BYTES * 2 // 3   # A + B of one chunk (C shares L1 with it)
ACC_BYTES = 16 << 10         # the largest fp32 / int32 stack scratch for C's partial sums (64 x 64)
MAX_VISITS = 16              # macro blocks per chunk (each one's code is emitted: i-cache)
CHUNK_SLOTS = ("left", "n", "first", "last", "accrow", "pipe")


@dataclass(frozen=True)
class Visit:
    """One macro block of a chunk: its tile rows / columns, first C row and column, tile config."""

    rsizes: tuple
    csizes: tuple
    row: int
    col: int
    cfg: bytes

    def same_tiles(self, other):
        return other is not None and (self.rsizes, self.csizes, self.cfg) == \
            (other.rsizes, other.csizes, other.cfg)


def uses_scratch(desc):
    """Whether C's partial sums go through the stack scratch (a bf16 C or an epilogue)."""
    return desc.bias or desc.act is not None or desc.c_dtype == "bf16"


def visits(plan):
    """The macro blocks a chunk runs, row by row of macro blocks, every other row right to left
    (a snake: consecutive ones share an A or a B panel).

    >>> from tppasm.brgemm import Brgemm
    >>> from tppasm.x86.amx import plan
    >>> [(v.row, v.col) for v in visits(plan(Brgemm(m=64, n=48, k=32, dtype="bf16")))]
    [(0, 0), (0, 32), (32, 32), (32, 0)]
    """
    rows = [(r, r.start + i * plan.gm * 16) for r in plan.rows for i in range(r.count)]
    cols = [(c, c.start + j * plan.gn * 16) for c in plan.cols for j in range(c.count)]
    out = []
    for x, (rspan, row) in enumerate(rows):
        for cspan, col in (cols if x % 2 == 0 else cols[::-1]):
            out.append(Visit(rspan.sizes, cspan.sizes, row, col, plan.config(rspan, cspan)))
    return out


def block_bytes(desc):
    """Bytes of A and B one batch block holds (what a tile load of every row and group reads).

    >>> from tppasm.brgemm import Brgemm
    >>> block_bytes(Brgemm(m=64, n=64, k=64, dtype="bf16"))
    16384
    """
    es = 2 if desc.dtype == "bf16" else 1
    return desc.m * desc.k * es + desc.groups * desc.n * 4


def acc_ld(desc):
    """Row stride in bytes of the stack scratch that keeps C's partial sums (n in whole tiles)."""
    return -(-desc.n // 16) * 64


def acc_offset(desc, i, j):
    """Byte offset of accumulator tile (i, j) of a macro block in the partial-sum scratch."""
    return i * 16 * acc_ld(desc) + j * 64


def chunk_blocks(desc, plan):
    """Batch blocks per chunk for ``desc`` (a bf16 / i8 :class:`tppasm.brgemm.Brgemm`) tiled by
    ``plan`` (the model's choice, whether or not chunks are on: ``tppasm.x86.amx.chunks_on``); 0
    keeps one walk of the whole batch per macro block. Chunks pay only where several macro blocks
    share panels, the batch can outgrow L1 and one tile config covers C (a chunk
    visits every region, so several configs would be reloaded per chunk); a bf16 C or an
    epilogue needs the scratch, so C must fit in ``ACC_BYTES``.

    >>> from tppasm.brgemm import Brgemm
    >>> from tppasm.x86.amx import plan
    >>> [chunk_blocks(d, plan(d)) for d in (Brgemm(m=64, n=64, k=64, dtype="bf16"),      # 16 KiB a block
    ...                                     Brgemm(m=32, n=32, k=64, dtype="bf16"),      # one macro block
    ...                                     Brgemm(m=64, n=64, k=512, dtype="bf16"))]    # 128 KiB a block
    [2, 0, 0]
    """
    macro = sum(r.count for r in plan.rows) * sum(c.count for c in plan.cols)
    configs = {cfg for _, _, cfg in plan.regions()}
    scratch = uses_scratch(desc)
    if not 2 <= macro <= MAX_VISITS or len(configs) > 1 or (scratch and desc.m * acc_ld(desc) > ACC_BYTES):
        return 0
    return CHUNK_BYTES // block_bytes(desc)


class Chunks:
    """Emits the chunk loop for the generator ``g`` (a :class:`tppasm.x86.amx._Gen` with
    ``g.chunk`` > 0): stack slots ``left`` (blocks from this chunk on), ``n`` (blocks in this
    chunk: what the batch walk reads as its count), ``first`` / ``last`` (flags for C), ``pipe``
    (partial sums handed on through the scratch, :meth:`set_pipe`)."""

    def __init__(self, g):
        self.g, self.a = g, g.a

    def emit(self, body, between=None):
        """``body()`` once per chunk, the batch operands (their stack copies) advanced between
        chunks, and ``between()`` (when given) emitted before each chunk but the first."""
        g, a, d, n = self.g, self.a, self.g.d, self.g.chunk
        tmp = g.r["tmp"]
        a.mov(tmp, g.arg("count"))
        a.mov(g.var("left"), tmp)
        g.set_var("first", 1)
        loop, go, done = a.label(), a.label(), a.label()
        a.bind(loop)
        g.set_var("last", 1)
        g.set_var("pipe", 0)
        a.cmp(tmp, n)                        # tmp = left
        a.jbe(go)
        a.mov(tmp, n)
        g.set_var("last", 0)
        self.set_pipe()
        a.bind(go)
        a.mov(g.var("n"), tmp)
        body()
        g.set_var("first", 0)
        a.mov(tmp, g.var("left"))
        a.sub(tmp, n)
        a.jbe(done)
        a.mov(g.var("left"), tmp)
        if d.batch == "stride":
            advance = (("a", n * d.stride_a * g.es_a), ("b", n * d.stride_b * g.es_a))
        elif d.batch == "offset":
            advance = (("offsets", n * 16),)
        else:
            advance = (("a_ptrs", n * 8), ("b_ptrs", n * 8))
        for name, nbytes in advance:
            mem_imm(a, "add", qword[rsp + g.arg_slot[name]], nbytes, g.r["t2"])
        if between is not None:
            between()
        a.jmp(loop)
        a.bind(done)

    def set_pipe(self):
        """In a chunk before the last: ``pipe`` = 1 where the macro blocks hand their partial sums
        on through the scratch (every such chunk, but the first with a bf16 C and beta=1, which
        widens C into the accumulators with AVX-512)."""
        g, a = self.g, self.a
        if not uses_scratch(g.d):
            return
        skip = a.label()
        if g.d.beta and g.d.c_dtype == "bf16":
            a.cmp(g.var("first"), 0)
            a.jne(skip)
        g.set_var("pipe", 1)
        a.bind(skip)

    def acc_pointer(self, cp, stride):
        """cp / stride = the macro block's first element / row stride in the partial-sum scratch."""
        g, a = self.g, self.a
        a.lea(cp, [rsp + g.acc])
        a.add(cp, g.var("accrow"))
        a.add(cp, g.var("bcol"))
        g.mov_imm(stride, acc_ld(g.d))

    def branch(self, flag, when_set, otherwise):
        """``when_set()`` if the stack flag ``flag`` is 1 at run time, else ``otherwise()``."""
        a = self.a
        other, done = a.label(), a.label()
        a.cmp(self.g.var(flag), 0)
        a.je(other)
        when_set()
        a.jmp(done)
        a.bind(other)
        otherwise()
        a.bind(done)

    def body(self):
        """Every macro block over one chunk; each hands the next one (with the same tiles) the
        A / B tiles of its first step, and with C in C its accumulators (stored and loaded tile
        by tile: no wait for all four stores)."""
        g = self.g
        d, loaded, ready = g.d, g.configs[0], (None, False)
        vs = visits(g.p)
        for x, v in enumerate(vs):
            if v.cfg != loaded:
                self.a.ldtilecfg([rsp + g.cfg_base + 64 * g.configs.index(v.cfg)])
                loaded = v.cfg
            g.set_var("arow", v.row * d.lda * g.es_a)
            g.set_var("crow", v.row * d.ldc * g.es_c)
            g.set_var("bcol", v.col * 4)
            if g.epilogue:
                g.set_var("accrow", v.row * acc_ld(d))
            nxt = vs[x + 1] if x + 1 < len(vs) and v.same_tiles(vs[x + 1]) else None
            ready = g.block(v.rsizes, v.csizes, v, nxt, ready)

    def handoff_c(self, tiles, delta):
        """Store each accumulator (to C, or with an epilogue to the scratch) and load the next
        macro block's partial sums into it (``delta``: (C, scratch) bytes on), or zero it or load
        its C in the first chunk; tile by tile, in the order the ``tdp*`` finish."""
        g, a = self.g, self.a
        d, p, r = g.d, g.p, g.r
        cp, stride = r["ak"], r["bk"]
        acc = g.epilogue
        if acc:
            self.acc_pointer(cp, stride)
            g.c_pointer(r["an"])
            g.mov_imm(r["bn"], d.ldc * g.es_c)
        else:
            g.c_pointer(cp)
            g.mov_imm(stride, d.ldc * g.es_c)
        order = sorted(tiles, key=lambda t: (t[1], t[0]))           # column by column, as the tdp*

        def run(first):
            for i, j in order:
                tile = TMM[p.c_tile(i, j)]
                off = acc_offset(d, i, j) if acc else g.c_offset(i, j)
                a.tilestored([cp + stride + off], tile)
                if not first:
                    a.tileloadd(tile, [cp + stride + off + delta[1 if acc else 0]])
                elif d.beta:
                    a.tileloadd(tile, [r["an"] + r["bn"] + g.c_offset(i, j) + delta[0]])
                else:
                    a.tilezero(tile)
        if d.beta and (not acc or d.c_dtype == "bf16"):    # C loads alike / no pipe in the first chunk
            run(False)
        else:
            self.branch("first", lambda: run(True), lambda: run(False))
