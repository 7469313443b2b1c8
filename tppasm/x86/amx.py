"""AMX BRGEMM: bf16 (``tdpbf16ps``, B in VNNI2) and int8 (``tdpbusd``, u8 A x s8 B in VNNI4).

Tiles (palette 1: 8 tiles of at most 16 rows x 64 bytes). C is cut into 16 x 16 blocks; a *macro
block* of gm x gn blocks (2 x 2 when the shape allows) keeps one fp32/int32 accumulator tile per
block, gm A tiles (16 rows x 64 bytes: 32 bf16 or 64 int8 of k) and gn B tiles (16 rows of VNNI
groups, 64 bytes = 16 columns): 4 + 2 + 2 = 8 tiles. Per batch block and k step each A and B
tile is loaded once and feeds gm x gn dot products (4 ``tdp*`` per 4 ``tileloadd``); the loads
are software-pipelined, prefetched and the batch walked back and forth as
:mod:`tppasm.x86.amx_pipe` describes. C tiles stay in their accumulators over the whole batch
and are stored once; or, when the batch outgrows L1, over each chunk of it that fits
(:mod:`tppasm.x86.amx_chunk`: every macro block runs a chunk before the next one starts). The
operand whose panels no later macro block reads again is loaded with ``tileloaddt1``, so that it
does not evict from L1 the panels of the other one that they do
(:func:`tppasm.x86.amx_pipe.streamed_operand`).

Tails are smaller tiles: the last macro row / column configures its tiles with the remaining
rows / columns (``rows``, ``colsb``), and k is cut into equal steps of <= 16 groups when it can
be; otherwise the remaining groups use a second pair of A / B tiles of the tail width, with a
2 x 1 (or 1 x 2) macro block so that it still fits in 8 tiles. Each distinct tile shape set is a
*region* with its own 64-byte config; a shape with no tails in m and n (or m, n <= 32) has one.
Any k: a last VNNI group that k fills only partly is padded with zeros in a stack copy (the
only padding; see :mod:`tppasm.x86.amx_pipe`).

C: beta=0 starts from ``tilezero``; beta=1 loads fp32 / int32 C straight into the accumulators
(``tileloadd`` with stride ldc), bf16 C through a stack scratch (widened with AVX-512). Results
go straight to C with ``tilestored`` when there is nothing to do (fp32 / int32, no bias, no act);
otherwise through the scratch to an AVX-512 epilogue: bias row, activation (relu here; gelu,
gelu_erf, sigmoid and tanh from :mod:`tppasm.x86.math`), bf16 rounding (``vcvtneps2bf16``), masked stores.

Tile state: a kernel built with ``tile_setup=True`` reads the loaded config (``sttilecfg``,
~20 cycles) and loads its own (``ldtilecfg``, ~200 cycles) only when it differs; it leaves its
config loaded (no ``tilerelease``: Intel's advice is to release only before AMX idles a while,
and Linux releases the tiles itself before the core idles), so back-to-back calls of one kernel,
or of kernels sharing a config, configure once. A kernel never relies on tile *data* left by
anyone. :func:`~tppasm.x86.amx_config.tilerelease_function` (``tppasm.tilerelease()``) releases
on request. ``tile_setup=False`` kernels are for loop nests that call
:func:`~tppasm.x86.amx_config.tileconfig_function` once per thread before (``init``) and
:func:`~tppasm.x86.amx_config.tilerelease_function` after (``fini``): they assume the
config of their first region is loaded; a shape with several regions switches configs inside and
restores the first before returning.

Permission: Linux grants AMX tile state per process (``arch_prctl(ARCH_REQ_XCOMP_PERM)``, asked
once by :func:`isa.cpu.host`), so threads of a pool created before the request use tiles too;
without it the first tile instruction raises SIGILL, which is why dispatch to ``"amx"`` happens
only when ``host()`` got the permission.

Generation needs no AMX hardware (the code runs in :mod:`isa.x86.interp` here):

>>> from tppasm.brgemm import Brgemm
>>> fn = generate(Brgemm(m=32, n=32, k=32, dtype="bf16"))
>>> text = fn.disassemble()
>>> text.count("tdpbf16ps"), text.count("tileloadd")      # the first block's loads, then the next's
(4, 8)
"""
from dataclasses import dataclass

from isa.x86 import K, TMM, YMM, ZMM, Function, eax, gpr, ptr, qword, rsp
from isa.x86.function import CALLEE_SAVED, INT_ARGS

from ..backends import register, register_option
from . import amx_probe
from .amx_chunk import CHUNK_SLOTS, Chunks, acc_ld, acc_offset, chunk_blocks, uses_scratch, visits
from .amx_pipe import Pipeline, streamed_operand
from .batch import add_imm, mem_imm
from .ctile import emit_activation
from .tile_code import configure, write_config

ROWS, COLSB = 16, 64                   # palette 1 tile limits
ES = {"f32": 4, "bf16": 2, "i32": 4}     # C element bytes
A_ES = {"bf16": 2, "i8": 1}          # A and B element bytes
DOT = {"bf16": "tdpbf16ps", "i8": "tdpbusd"}
INT8_DOT = {"us": "tdpbusd", "ss": "tdpbssd", "su": "tdpbsud", "uu": "tdpbuud"}   # (A, B) signedness


# -- planning ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Span:
    """Consecutive macro rows (or columns) with the same tile shapes: ``count`` of them from
    ``start`` (rows / columns of C), each made of blocks of ``sizes`` rows (columns)."""

    start: int
    count: int
    sizes: tuple


@dataclass(frozen=True)
class Plan:
    """Tile blocking of one kernel; tile numbers: accumulators, A, B, then A / B of the k tail."""

    gm: int            # row blocks per macro block
    gn: int            # column blocks per macro block
    step: int          # k groups (4 bytes of A per row) per full k step
    steps: int
    tail: int          # k groups of the last, narrower step (0: none)
    rows: tuple        # Spans over m
    cols: tuple        # Spans over n

    def c_tile(self, i, j):
        return i * self.gn + j

    def a_tile(self, i, tail=False):
        return self.gm * self.gn + i + (self.gm + self.gn if tail else 0)

    def b_tile(self, j, tail=False):
        return self.gm * self.gn + self.gm + j + (self.gm + self.gn if tail else 0)

    @property
    def ntiles(self):
        return self.gm * self.gn + (self.gm + self.gn) * (2 if self.tail else 1)

    def shapes(self, rspan, cspan):
        """{tile: (rows, colsb)} of the region (rspan, cspan); unused slots keep full shapes."""
        r = list(rspan.sizes) + [ROWS] * (self.gm - len(rspan.sizes))
        c = list(cspan.sizes) + [ROWS] * (self.gn - len(cspan.sizes))
        out = {}
        for i in range(self.gm):
            for j in range(self.gn):
                out[self.c_tile(i, j)] = (r[i], 4 * c[j])
        for tail, width in ((False, self.step), (True, self.tail)):
            if tail and not width:
                continue
            for i in range(self.gm):
                out[self.a_tile(i, tail)] = (r[i], 4 * width)
            for j in range(self.gn):
                out[self.b_tile(j, tail)] = (width, 4 * c[j])
        return out

    def config(self, rspan, cspan):
        """The 64-byte palette-1 tile config of a region."""
        return tile_config(self.shapes(rspan, cspan))

    def regions(self):
        """[(row span, column span, config)] in the order the kernel visits them."""
        return [(r, c, self.config(r, c)) for r in self.rows for c in self.cols]


def tile_config(shapes):
    """The 64-byte ``ldtilecfg`` operand for palette 1 from ``{tile: (rows, colsb)}``.

    >>> cfg = tile_config({0: (16, 64), 3: (5, 12)})
    >>> cfg[0], cfg[16], cfg[22], cfg[48], cfg[51]
    (1, 64, 12, 16, 5)
    """
    cfg = bytearray(64)
    cfg[0] = 1
    for t, (rows, colsb) in shapes.items():
        if not (0 <= t < 8 and 1 <= rows <= ROWS and 4 <= colsb <= COLSB and colsb % 4 == 0):
            raise ValueError(f"tile {t}: {rows} rows x {colsb} bytes is not a palette-1 tile")
        cfg[16 + 2 * t:18 + 2 * t] = colsb.to_bytes(2, "little")
        cfg[48 + t] = rows
    return bytes(cfg)


def _spans(total, g):
    sizes = [ROWS] * (total // ROWS) + ([total % ROWS] if total % ROWS else [])
    full = (total // ROWS) // g
    spans = [Span(0, full, (ROWS,) * g)] if full else []
    rest = sizes[full * g:]
    if rest:
        spans.append(Span(full * g * ROWS, 1, tuple(rest)))
    return tuple(spans)


def plan(desc):
    """The tile blocking for a :class:`tppasm.brgemm.Brgemm` (bf16 or i8).

    >>> from tppasm.brgemm import Brgemm
    >>> p = plan(Brgemm(m=40, n=20, k=64, dtype="bf16"))
    >>> (p.gm, p.gn, p.step, p.steps, p.tail), [s.sizes for s in p.rows], [s.sizes for s in p.cols]
    ((2, 2, 16, 2, 0), [(16, 16), (8,)], [(16, 4)])
    """
    groups = desc.groups                    # 4 bytes of A (and one B tile row) per group, the last maybe partial
    if groups <= ROWS:
        step, steps, tail = groups, 1, 0
    else:
        n = -(-groups // ROWS)
        if groups % n == 0:
            step, steps, tail = groups // n, n, 0
        else:
            step, steps, tail = ROWS, groups // ROWS, groups % ROWS
    bm, bn = -(-desc.m // ROWS), -(-desc.n // ROWS)
    if tail:                                 # 2 extra operand tiles per pair: 2 x 1 or 1 x 2
        gm, gn = (1, 2) if bm == 1 and bn > 1 else (min(2, bm), 1)
    else:
        gm, gn = min(2, bm), min(2, bn)
    return Plan(gm, gn, step, steps, tail, _spans(desc.m, gm), _spans(desc.n, gn))


# -- code generation -----------------------------------------------------------------------------

class _Gen:
    """One kernel: System V args are the operand pointers (``desc.operands()`` order) and count."""

    VARS = ("arow", "crow", "bcol", "rowctr", "colctr", "dir", "da", "db")

    def __init__(self, desc, chunk=None, prefetch=True, stream=True):
        if desc.dtype not in DOT:
            raise ValueError(f"AMX BRGEMM takes dtype 'bf16' or 'i8', not {desc.dtype!r}")
        self.d, self.p = desc, plan(desc)
        names = [op.name for op in desc.operands()] + ["count"]
        self.fn = Function(f"brgemm_amx_{desc.dtype}_{desc.m}x{desc.n}x{desc.k}",
                           ["ptr"] * (len(names) - 1) + ["i64"])
        self.a = self.fn.asm
        self.es_a, self.es_c = A_ES[desc.dtype], ES[desc.c_dtype]
        self.dot = getattr(self.a, DOT[desc.dtype] if desc.dtype == "bf16" else INT8_DOT[desc.signs])
        # stack: spilled arguments, loop variables, tile configs, sttilecfg's output, scratch tiles
        self.epilogue = uses_scratch(desc)         # C through the scratch tile (and partial sums in the stack)
        self.chunk = (chunk_blocks(desc, self.p) if chunks_on() else 0) if chunk is None else chunk
        self.prefetch = prefetch if desc.prefetch else False
        self.stream = streamed_operand(self.p) if stream and not self.chunk else None
        variables = self.VARS + (CHUNK_SLOTS if self.chunk else ())
        self.arg_slot = {name: 8 * i for i, name in enumerate(names)}
        self.slots = {name: 64 + 8 * i for i, name in enumerate(variables)}
        self.regions = self.p.regions()
        self.configs = list(dict.fromkeys(cfg for _, _, cfg in self.regions))
        self.cfg_base = (64 + 8 * len(variables) + 63) // 64 * 64
        self.cfg_now = self.cfg_base + 64 * len(self.configs)
        self.partial = desc.k % desc.vnni
        self.pad_a = self.cfg_now + 64
        self.pad_b = self.pad_a + 1024 * self.p.gm * (1 if self.partial else 0)
        self.scratch = self.pad_b + 1024 * self.p.gn * (1 if self.partial and desc.dtype == "bf16" else 0)
        self.acc = self.scratch + ROWS * COLSB      # C's partial sums between chunks (with an epilogue)
        self.frame = (self.acc + (desc.m * acc_ld(desc) if self.chunk else 0)) if self.epilogue else self.scratch
        regs = sorted(set(INT_ARGS + CALLEE_SAVED + [gpr(0), gpr(10), gpr(11)]), key=lambda r: r.num)
        # args are spilled to the stack at entry, so all 15 registers are ours (tmp must be rax)
        names = ["tmp", "sa", "sb", "ak", "bk", "an", "bn", "bctr", "kctr", "p", "q", "t2", "s64"]
        self.r = dict(zip(names, regs))
        self.consts = None

    # -- helpers ----------------------------------------------------------------------------------
    def arg(self, name):
        return [rsp + self.arg_slot[name]]

    def mov_imm(self, reg, value):
        if value == 0:
            self.a.xor(gpr(reg.num, 32), gpr(reg.num, 32))
        else:
            self.a.mov(reg, value)

    def add_imm(self, reg, value):
        add_imm(self.a, reg, value, self.r["tmp"])

    def tmm(self, t):
        return TMM[t]

    def batch_count(self):
        """The memory operand holding the blocks one batch walk takes: the chunk's, or ``count``."""
        return self.var("n") if self.chunk else self.arg("count")

    def var(self, name):
        return qword[rsp + self.slots[name]]

    def set_var(self, name, value):
        mem_imm(self.a, "mov", self.var(name), value, self.r["tmp"])

    def add_var(self, name, value):
        mem_imm(self.a, "add", self.var(name), value, self.r["tmp"])

    # -- the kernel ---------------------------------------------------------------------------------
    def build(self):
        d, a, r = self.d, self.a, self.r
        self.fn.stack(self.frame)
        for name, reg in zip(self.arg_slot, self.fn.args):
            a.mov([rsp + self.arg_slot[name]], reg)
        switches = len(self.configs) > 1
        if switches:
            for i, cfg in enumerate(self.configs):
                write_config(a, self.cfg_base + 64 * i, cfg)
        if d.tile_setup:
            configure(a, self.configs[0], self.cfg_base, self.cfg_now, switches)
        self.mov_imm(r["sa"], d.lda * self.es_a)
        self.mov_imm(r["sb"], d.ldb * 4)
        if self.partial:
            self.mov_imm(r["s64"], COLSB)
            last = self.p.steps if self.p.tail else self.p.steps - 1       # the step holding the partial group
            valid = d.k * self.es_a - last * 4 * self.p.step                   # its A bytes per row
            a.mov(r["tmp"], -1)                 # (1 << valid) - 1 without a 64-bit immediate
            if valid < 64:
                a.shr(r["tmp"], 64 - valid)
            a.kmovq(K[2], r["tmp"])
        self.set_var("dir", 1)                 # flipped before each macro block: the first walks forward
        if self.chunk:
            last = visits(self.p)[-1].cfg
            restore = (lambda: a.ldtilecfg([rsp + self.cfg_base])) if last != self.configs[0] else None
            chunks = Chunks(self)
            chunks.emit(chunks.body, between=restore)
        else:
            last = self.regions[-1][2]
            self.all_regions()
        if not d.tile_setup and last != self.configs[0]:
            a.ldtilecfg([rsp + self.cfg_base])
        if self.consts is not None:
            self.consts.finish(self.fn, scratch=ZMM[3])
        return self.fn.finalize()

    def all_regions(self):
        """Every region, switching tile configs between them (the first one's is loaded)."""
        loaded = self.configs[0]
        for rspan, cspan, cfg in self.regions:
            if cfg != loaded:
                self.a.ldtilecfg([rsp + self.cfg_base + 64 * self.configs.index(cfg)])
                loaded = cfg
            self.region(rspan, cspan)

    def region(self, rspan, cspan):
        d, p, a = self.d, self.p, self.a
        self.set_var("arow", rspan.start * d.lda * self.es_a)
        self.set_var("crow", rspan.start * d.ldc * self.es_c)
        row_loop = a.label()
        if rspan.count > 1:
            self.set_var("rowctr", rspan.count)
            a.bind(row_loop)
        self.set_var("bcol", cspan.start * 4)
        col_loop = a.label()
        if cspan.count > 1:
            self.set_var("colctr", cspan.count)
            a.bind(col_loop)
        self.block(rspan.sizes, cspan.sizes)
        if cspan.count > 1:
            self.add_var("bcol", p.gn * COLSB)
            a.dec(self.var("colctr"))
            a.jnz(col_loop)
        if rspan.count > 1:
            self.add_var("arow", p.gm * ROWS * d.lda * self.es_a)
            self.add_var("crow", p.gm * ROWS * d.ldc * self.es_c)
            a.dec(self.var("rowctr"))
            a.jnz(row_loop)

    def c_pointer(self, reg):
        """reg = address of the macro block's first C element."""
        a, r = self.a, self.r
        a.mov(reg, self.arg("c"))
        a.add(reg, self.var("crow"))
        if self.es_c == 4:
            a.add(reg, self.var("bcol"))
        else:
            a.mov(r["tmp"], self.var("bcol"))
            a.shr(r["tmp"], 1)
            a.add(reg, r["tmp"])

    def c_offset(self, i, j):
        return i * ROWS * self.d.ldc * self.es_c + j * ROWS * self.es_c

    def block(self, rsizes, csizes, here=None, nxt=None, ready=(None, False)):
        """One macro block over the batch (or chunk); in chunks ``here`` / ``nxt`` are this and
        the next :class:`~tppasm.x86.amx_chunk.Visit` (None: no hand-off) and ``ready`` says
        whether the previous one loaded this one's C tiles (None; "direct": yes; "pipe": where the
        chunk's ``pipe`` flag is set) and first A / B tiles. Returns its ``ready`` for the next."""
        d = self.d
        tiles = [(i, j) for i in range(len(rsizes)) for j in range(len(csizes))]
        hand = c_hand = None
        if nxt is not None:
            rows, cols = nxt.row - here.row, nxt.col - here.col
            hand = (rows * d.lda * self.es_a, cols * 4)
            c_hand = (rows * d.ldc * self.es_c + cols * self.es_c, rows * acc_ld(d) + cols * 4)
            if max(map(abs, hand + c_hand)) >= 1 << 30:            # displacements stay int32
                hand = c_hand = None
        if ready[0] == "pipe":
            Chunks(self).branch("pipe", lambda: None, lambda: self.c_in(tiles, rsizes, csizes))
        elif ready[0] is None:
            self.c_in(tiles, rsizes, csizes)
        Pipeline(self, rsizes, csizes, hand, ready[1]).emit()
        if c_hand is None:
            self.c_out(tiles, rsizes, csizes)
        elif not self.epilogue:
            Chunks(self).handoff_c(tiles, c_hand)
        else:
            Chunks(self).branch("pipe", lambda: Chunks(self).handoff_c(tiles, c_hand),
                                lambda: self.c_out(tiles, rsizes, csizes))
        return (None if c_hand is None else "pipe" if self.epilogue else "direct"), hand is not None

    def c_in(self, tiles, rsizes, csizes):
        """The accumulators' start: beta * C, or in a later chunk the partial sums so far."""
        if not self.chunk:
            self.c_start(tiles, rsizes, csizes)
        elif not self.epilogue:                    # partial sums in C: beta=1 or a later chunk loads C
            if self.d.beta:
                self.c_tiles(tiles, "tileloadd")
            else:
                Chunks(self).branch("first", lambda: self.c_start(tiles, rsizes, csizes),
                                    lambda: self.c_tiles(tiles, "tileloadd"))
        else:                                       # partial sums in the stack scratch
            Chunks(self).branch("first", lambda: self.c_start(tiles, rsizes, csizes),
                                lambda: self.c_tiles(tiles, "tileloadd", acc=True))

    def c_out(self, tiles, rsizes, csizes):
        """The accumulators to C (through the epilogue in the last chunk) or the scratch."""
        if not self.epilogue:
            self.c_tiles(tiles, "tilestored")
        elif not self.chunk:
            self.c_finish(tiles, rsizes, csizes)
        else:
            Chunks(self).branch("last", lambda: self.c_finish(tiles, rsizes, csizes),
                                lambda: self.c_tiles(tiles, "tilestored", acc=True))

    def c_tiles(self, tiles, op, acc=False):
        """``tileloadd`` (op) or ``tilestored`` of the macro block's accumulators from / to C, or
        with ``acc`` the fp32 / int32 stack scratch of the partial sums."""
        d, p, a, r = self.d, self.p, self.a, self.r
        cp, stride = r["ak"], r["bk"]
        if acc:
            Chunks(self).acc_pointer(cp, stride)
            off = {t: acc_offset(d, *t) for t in tiles}
        else:
            self.c_pointer(cp)
            self.mov_imm(stride, d.ldc * self.es_c)
            off = {t: self.c_offset(*t) for t in tiles}
        for i, j in tiles:
            mem, tile = [cp + stride + off[i, j]], self.tmm(p.c_tile(i, j))
            if op == "tileloadd":
                a.tileloadd(tile, mem)
            else:
                a.tilestored(mem, tile)

    def c_start(self, tiles, rsizes, csizes):
        """The accumulators = beta * C (``tilezero``, or C loaded; a bf16 C widened first)."""
        d, p, a, r = self.d, self.p, self.a, self.r
        cp, stride = r["ak"], r["bk"]
        if not d.beta:
            for i, j in tiles:
                a.tilezero(self.tmm(p.c_tile(i, j)))
        elif d.c_dtype != "bf16":
            self.c_tiles(tiles, "tileloadd")
        else:
            self.c_pointer(cp)
            self.mov_imm(stride, COLSB)
            for i, j in tiles:
                self.widen_bf16(cp, i, j, rsizes[i], csizes[j])
                a.tileloadd(self.tmm(p.c_tile(i, j)), [rsp + self.scratch + stride])

    def c_finish(self, tiles, rsizes, csizes):
        """C = epilogue(accumulators), tile by tile through the scratch tile."""
        p, a, r = self.p, self.a, self.r
        cp, stride = r["ak"], r["bk"]
        self.c_pointer(cp)
        self.mov_imm(stride, COLSB)
        for i, j in tiles:
            a.tilestored([rsp + self.scratch + stride], self.tmm(p.c_tile(i, j)))
            self.store_rows(cp, i, j, rsizes[i], csizes[j])

    # -- C through the scratch -------------------------------------------------------------------------
    def _mask(self, cols):
        if cols < ROWS:
            self.a.mov(eax, (1 << cols) - 1)
            self.a.kmovw(K[1], eax)
            return K[1]
        return None

    def _row_loop(self, rows, body):
        """Run ``body()`` for ``rows`` rows; the body advances its own pointers."""
        a, r = self.a, self.r
        if rows > 1:
            loop = a.label()
            a.mov(r["kctr"], rows)
            a.bind(loop)
            body()
            a.dec(r["kctr"])
            a.jnz(loop)
        else:
            body()

    def widen_bf16(self, cp, i, j, rows, cols):
        """scratch rows (64 bytes apart) = fp32 of bf16 C rows of block (i, j)."""
        a, r, d = self.a, self.r, self.d
        src, dst = r["p"], r["q"]
        k = self._mask(cols)
        a.lea(src, [cp + self.c_offset(i, j)])
        a.lea(dst, [rsp + self.scratch])
        z = ZMM[0]
        y = YMM[0]

        def body():
            a.vmovdqu16(y if k is None else y.mask(k, zero=True), [src])
            a.vpmovzxwd(z, y)
            a.vpslld(z, z, 16)
            a.vmovups([dst], z)
            a.add(src, d.ldc * 2)
            a.add(dst, COLSB)
        self._row_loop(rows, body)

    def store_rows(self, cp, i, j, rows, cols):
        """C rows of block (i, j) = epilogue(scratch rows)."""
        a, r, d = self.a, self.r, self.d
        src, dst = r["p"], r["q"]
        k = self._mask(cols)
        x, bias, zero = ZMM[0], ZMM[1], ZMM[2]
        if d.bias:
            a.mov(dst, self.arg("bias"))
            a.add(dst, self.var("bcol"))
            mem = [dst + j * COLSB]
            a.vmovups(bias if k is None else bias.mask(k, zero=True), mem)
        if d.act == "relu":
            a.vpxord(zero, zero, zero)
        a.lea(src, [rsp + self.scratch])
        a.lea(dst, [cp + self.c_offset(i, j)])

        def body():
            a.vmovups(x, [src])
            if d.bias:
                a.vaddps(x, x, bias)
            if d.act == "relu":
                if d.dtype == "i8":
                    a.vpmaxsd(x, x, zero)
                else:
                    a.vmaxps(x, zero, x)             # NaN in x stays NaN (second operand wins)
            out = x if d.act in (None, "relu") else self.activation(x)
            if d.c_dtype == "bf16":
                y = YMM[0]
                a.vcvtneps2bf16(y, out)
                a.vmovdqu16([dst] if k is None else ptr(dst).mask(k), y)
            else:
                a.vmovups([dst] if k is None else ptr(dst).mask(k), out)
            a.add(src, COLSB)
            a.add(dst, d.ldc * self.es_c)
        self._row_loop(rows, body)

    def activation(self, x):
        """zmm2 = act(x) (the emitters need dst != src); constants live in zmm8..31, those
        that do not fit (gelu_erf has 30) in a table above the kernel's own stack frame."""
        from . import math as xmath
        from .vector import VectorISA
        if self.consts is None:
            self.consts = xmath.Consts(VectorISA("avx512"), regs=ZMM[8:])
            self.consts.BASE = (self.frame + 63) // 64 * 64
        emit_activation(self.d.act, self.a, self.consts.v, ZMM[2], x, list(ZMM[3:8]), self.consts,
                        self.d.c_dtype == "bf16")
        return ZMM[2]


def generate(desc, chunk=None, prefetch=True, stream=True):
    """The raw AMX BRGEMM kernel (a :class:`isa.x86.JitFunction`) for a bf16 / i8 descriptor;
    ``chunk``: batch blocks per chunk (:mod:`tppasm.x86.amx_chunk`; None: :func:`chunk_blocks`'
    choice where :func:`chunks_on`, else 0; 0: every macro block walks the whole batch);
    ``prefetch=False`` leaves out the ``prefetcht0`` of the next blocks, ``"all"`` keeps those of
    lines that crowd an L1 set too (:mod:`tppasm.x86.amx_pipe`; both for ``python -m bench
    amx-variants``, which times the kernel each way); ``stream=False`` loads every tile with
    ``tileloadd``, no ``tileloaddt1`` of the streamed operand
    (:func:`tppasm.x86.amx_pipe.streamed_operand`).

    >>> from tppasm.brgemm import Brgemm
    >>> "tdpbusd" in generate(Brgemm(m=20, n=8, k=12, dtype="i8", beta=1)).disassemble()
    True
    """
    return _Gen(desc, chunk, prefetch, stream).build()


def chunks_on():
    """Whether generated kernels use batch chunks: ``TPPASM_AMX_CHUNKS=1`` / ``0``, else the
    host's verdict (:mod:`tppasm.x86.amx_probe`: timed once where AMX runs natively; off where it
    is interpreted). Part of every AMX kernel's cache key (``tppasm.backends.code_options``).

    >>> import os; os.environ.get("TPPASM_AMX_CHUNKS") or chunks_on() in (True, False)
    True
    """
    return amx_probe.verdict(_probe_kernel)


def _probe_kernel(chunked):
    from tppasm.brgemm import Brgemm
    desc = Brgemm(**{k: v for k, v in amx_probe.PROBE.items() if k != "count"})
    return _Gen(desc, chunk_blocks(desc, plan(desc)) if chunked else 0).build()


register_option("amx", amx_probe.ENV, lambda: "1" if chunks_on() else "0")
