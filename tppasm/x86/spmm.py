"""x86 generators of the block-sparse x dense TPP (:class:`tppasm.spmm.BlockSpmm`): AVX2, AVX-512, AMX.

The kernel first reads its block row's ``[start, end)`` from ``rowptr`` and checks it against
``count``, then every block column in ``colidx[start:end]`` against ``kb`` (unsigned compares,
so negative entries fail too); on any failure it writes NaN to all of C and returns, having read
nothing else. Then C is swept in register tiles of R rows x V vectors (the blocking model of the
BRGEMM, :func:`tppasm.x86.blocking.plan`, on the block's shape): for each tile the accumulators
start at zero (or C), and for every stored block of the row the tile's rows of the block
multiply the block's panel of B (``colidx[p] * bk`` rows down) one k group at a time, with the
inner products of the BRGEMM (:mod:`tppasm.x86.dot`: fp32 FMA, bf16 ``vdpbf16ps`` or the
shift-free fp32 split). Column tails are masked, never padded.

AMX (bf16, n a multiple of 16, blocks of at most 32 x 32; other shapes run the AVX-512 code):
after the same checks, C is swept in macro blocks of gm x gn 16 x 16 fp32 tiles (gm = 1 or 2
tile rows cover the block's bm rows; gn = 3 or 2 tile columns), and for every stored block its
A tiles (the block's rows, 2*bk bytes each) and gn B tiles (bk/2 VNNI rows of 16 columns) are
loaded and multiplied into the accumulators with ``tdpbf16ps``. The kernel loads its tile
configuration unless it is the one loaded (as a ``tile_setup=True`` BRGEMM does) and leaves it loaded.

>>> from tppasm.spmm import BlockSpmm
>>> fn = generate(BlockSpmm(bm=4, bk=4, n=32, kb=2), "avx2")
>>> "vfmadd231ps" in fn.disassemble()
True
"""
from types import SimpleNamespace

from isa.x86 import (TMM, Function, dword, eax, gpr, r8, r9, r10, r11, r12, r14, r15, rax, rbp, rbx, rcx, rdi,
                     rdx, rsi, vec)

from ..backends import register
from .batch import add_imm
from .blocking import plan, row_runs
from . import brgemm as _brgemm
from .brgemm import Gen
from .dot import choose_dot
from .math import Consts
from .tile_code import configure
from .vector import VectorISA

NAN = 0x7FC00000
UNROLL = 8                      # k groups per iteration of the k loop


class SpmmGen:
    """State of one kernel's generation."""

    def __init__(self, desc, isa, features):
        self.d, self.v = desc, VectorISA("avx512" if isa == "amx" else isa)
        self.dot = choose_dot(desc.dtype, self.v.name, features)
        self.es = 4 if desc.dtype == "f32" else 2
        self.fn = Function(f"block_spmm_{desc.dtype}_{desc.bm}x{desc.bk}x{desc.n}", ["ptr"] * 5 + ["i64"])
        self.a = self.fn.asm
        self.lanes = self.v.lanes(4)
        self.groups = desc.bk // desc.vnni
        shape = SimpleNamespace(m=desc.bm, n=desc.n, groups=self.groups, ldb=desc.ldb, pace=0)
        self.plan = plan(shape, self.v, self.dot, 0)
        self.row_b = desc.ldb * 4                     # bytes between k groups of B (a VNNI row group)
        self.block_bytes = desc.bm * desc.bk * self.es
        # registers: arguments first (rowptr, colidx, values, b, c, count), then the loop state
        self.nblk, self.ci0, self.vals, self.b, self.c, self.count = rdi, rsi, rdx, rcx, r8, r9
        self.cols, self.ablk, self.ci, self.cnt, self.bkp, self.rows, self.kcnt = rax, r11, rbx, rbp, r12, r14, r15
        self.tmp = gpr(13)

    # the helpers the inner products (tppasm.x86.dot) call, as the BRGEMM generator has them
    broadcast, and_, keep, lane_mask, tail_mask = Gen.broadcast, Gen.and_, Gen.keep, Gen.lane_mask, Gen.tail_mask

    # -- the kernel -----------------------------------------------------------------------------
    def build(self):
        a, p = self.a, self.plan
        self.consts = Consts(self.v)
        self.mask = self.tail_mask(p.tail) if p.tail else None
        poison = a.label()
        self.check_indices(poison)
        self.column_blocks()
        self.fn.ret()
        a.bind(poison)
        self.poison()
        if self.consts.table:
            self.consts.finish(self.fn)
        return self.fn.finalize()

    def check_indices(self, poison):
        """start, end = rowptr[0], rowptr[1] (zero-extended: a negative entry is huge); require
        start <= end <= count and colidx[p] < kb for p in [start, end); then point the colidx and
        values registers at block ``start`` and keep end - start in ``nblk``."""
        a, end, start = self.a, self.rows, self.tmp
        a.mov(gpr(start.num, 32), dword[self.nblk])
        a.mov(gpr(end.num, 32), dword[self.nblk + 4])
        a.cmp(end, self.count)
        a.ja(poison)
        a.cmp(start, end)
        a.ja(poison)
        a.mov(self.nblk, end)
        a.sub(self.nblk, start)
        a.lea(self.ci0, [self.ci0 + start * 4])
        a.imul(start, start, self.block_bytes)
        a.add(self.vals, start)
        done, loop = a.label(), a.label()
        a.mov(self.cnt, self.nblk)
        a.test(self.cnt, self.cnt)
        a.jz(done)
        a.mov(self.ci, self.ci0)
        a.bind(loop)
        a.mov(gpr(self.tmp.num, 32), dword[self.ci])
        a.cmp(self.tmp, self.d.kb)
        a.jae(poison)
        a.add(self.ci, 4)
        a.dec(self.cnt)
        a.jnz(loop)
        a.bind(done)

    def column_blocks(self):
        """Full blocks of V vectors in a loop, then the remaining vectors (last one masked)."""
        p, a = self.plan, self.a
        full = p.nvec - (1 if p.tail else 0)
        times, rest = divmod(full, p.vecs)
        if p.tail:
            rest += 1
        if times:
            loop = a.label()
            if times > 1:
                a.mov(self.cols, times)
            a.bind(loop)
            self.row_tiles(p.vecs, False)
            if times > 1 or rest:
                add_imm(a, self.b, p.vecs * self.v.bytes, self.tmp)
                add_imm(a, self.c, p.vecs * self.v.bytes, self.tmp)
            if times > 1:
                a.dec(self.cols)
                a.jnz(loop)
        if rest:
            self.row_tiles(rest, bool(p.tail))

    def row_tiles(self, vecs, masked):
        """Tiles down the block's rows (:func:`row_runs`); values and C pointers walk down and back."""
        a, d = self.a, self.d
        for rows, times in row_runs(d.bm, self.plan.rows):
            loop = a.label()
            if times > 1:
                a.mov(self.rows, times)
            a.bind(loop)
            self.tile(rows, vecs, masked)
            add_imm(a, self.vals, rows * d.bk * self.es, self.tmp)
            add_imm(a, self.c, rows * d.ldc * 4, self.tmp)
            if times > 1:
                a.dec(self.rows)
                a.jnz(loop)
        add_imm(a, self.vals, -d.bm * d.bk * self.es, self.tmp)
        add_imm(a, self.c, -d.bm * d.ldc * 4, self.tmp)

    def vregs(self, rows, vecs):
        v, dot = self.v, self.dot
        n = v.nregs - (1 if self.mask is not None and not v.avx512 else 0)
        acc = [[v.reg(r * vecs + j) for j in range(vecs)] for r in range(rows)]
        rest = [v.reg(i) for i in range(rows * vecs, n)]
        b = [rest[j * dot.nb:(j + 1) * dot.nb] for j in range(vecs)]
        rest = rest[vecs * dot.nb:]
        a_regs, rest = rest[:dot.na], rest[dot.na:]
        self.const_regs, rest = rest[:len(dot.consts)], rest[len(dot.consts):]
        return acc, b, a_regs, rest[:dot.tmps]

    def tile(self, rows, vecs, masked):
        a, d, v = self.a, self.d, self.v
        acc, b, a_regs, tmps = self.vregs(rows, vecs)
        masks = [self.mask if masked and j == vecs - 1 else None for j in range(vecs)]
        for i in range(rows):
            for j in range(vecs):
                if d.beta:
                    v.load(a, acc[i][j], [self.c + i * d.ldc * 4 + j * v.bytes], masks[j])
                elif v.avx512:
                    a.vpxord(acc[i][j], acc[i][j], acc[i][j])
                else:
                    a.vxorps(acc[i][j], acc[i][j], acc[i][j])
        for reg, value in zip(self.const_regs, self.dot.consts):
            self.consts.load(a, reg, self.consts.i(value))
        self.over_blocks(lambda: self.k_loop(rows, vecs, acc, b, a_regs, tmps, masks))
        for i in range(rows):
            for j in range(vecs):
                v.store(a, [self.c + i * d.ldc * 4 + j * v.bytes], acc[i][j], masks[j])

    def over_blocks(self, body):
        """``body()`` for each stored block of the row, ``ablk`` at the block's values (``body``
        moves it to the next block) and ``bkp`` at the block's panel of B (``colidx[p] * bk`` rows
        down, already checked to lie in B)."""
        a, d = self.a, self.d
        done, blocks = a.label(), a.label()
        a.mov(self.cnt, self.nblk)
        a.test(self.cnt, self.cnt)
        a.jz(done)
        a.mov(self.ci, self.ci0)
        a.mov(self.ablk, self.vals)
        a.bind(blocks)
        a.mov(gpr(self.bkp.num, 32), dword[self.ci])
        a.imul(self.bkp, self.bkp, d.bk * d.ldb * self.es)
        a.add(self.bkp, self.b)
        body()
        a.add(self.ci, 4)
        a.dec(self.cnt)
        a.jnz(blocks)
        a.bind(done)

    def k_loop(self, rows, vecs, acc, b, a_regs, tmps, masks):
        """All k groups of one block: unrolled when few, else a loop of UNROLL groups (the first
        group peeled where the bf16 split needs it); ``ablk`` ends at the next block."""
        a, groups, args = self.a, self.groups, (rows, vecs, acc, b, a_regs, tmps, masks)
        first = 0
        if self.dot.halves:
            self.group(0, *args, first=True)
            first = 1
        left = groups - first
        if left <= UNROLL:
            for g in range(first, groups):
                self.group(g, *args)
            add_imm(a, self.ablk, self.block_bytes, self.tmp)
            return
        iters, rem = divmod(left, UNROLL)
        if first:
            self.advance(1)
        loop = a.label()
        a.mov(self.kcnt, iters)
        a.bind(loop)
        for g in range(UNROLL):
            self.group(g, *args)
        self.advance(UNROLL)
        a.dec(self.kcnt)
        a.jnz(loop)
        for g in range(rem):
            self.group(g, *args)
        add_imm(a, self.ablk, self.block_bytes - (groups - rem) * 4, self.tmp)

    def advance(self, groups):
        self.a.add(self.ablk, groups * 4)
        add_imm(self.a, self.bkp, groups * self.row_b, self.tmp)

    def group(self, g, rows, vecs, acc, b, a_regs, tmps, masks, first=False):
        """k group ``g`` (relative to the pointers): B's row group into registers, then per row
        the A pair (or single) broadcast and the accumulations."""
        dot, v, row_a = self.dot, self.v, self.d.bk * self.es
        if dot.halves:
            for half in range(2):
                for j in range(vecs):
                    dot.load_b_half(self, b[j][0], self.bkp + g * self.row_b + j * v.bytes, masks[j], half, first)
                for i in range(rows):
                    dot.load_a_half(self, a_regs[0], self.ablk + i * row_a + g * 4, half, first)
                    for j in range(vecs):
                        self.a.vfmadd231ps(acc[i][j], b[j][0], a_regs[0])
            return
        for j in range(vecs):
            dot.load_b(self, b[j], [self.bkp + g * self.row_b + j * v.bytes], masks[j])
        for i in range(rows):
            dot.load_a(self, a_regs, self.ablk + i * row_a + g * 4)
            for j in range(vecs):
                dot.acc(self, acc[i][j], b[j], a_regs, tmps, self.const_regs)

    def poison(self):
        """C = NaN everywhere (the indices were out of range)."""
        a, d, v, p = self.a, self.d, self.v, self.plan
        nan = v.reg(0)
        a.mov(eax, NAN)
        a.vmovd(vec(128, 0), eax)
        a.vbroadcastss(nan, vec(128, 0))
        full = p.nvec - (1 if p.tail else 0)
        loop = a.label()
        a.mov(self.rows, d.bm)
        a.bind(loop)
        a.mov(self.tmp, self.c)
        if full:
            cols = a.label()
            a.mov(self.cnt, full)
            a.bind(cols)
            v.store(a, [self.tmp], nan)
            a.add(self.tmp, v.bytes)
            a.dec(self.cnt)
            a.jnz(cols)
        if p.tail:
            v.store(a, [self.tmp], nan, self.mask)
        add_imm(a, self.c, d.ldc * 4, self.tmp)
        a.dec(self.rows)
        a.jnz(loop)


class AmxSpmmGen(SpmmGen):
    """The AMX kernel: the index checks and the poison path of :class:`SpmmGen`, tiles for the rest."""

    ROWS, COLSB = 16, 64

    def __init__(self, desc):
        super().__init__(desc, "avx512", frozenset({"avx512_bf16"}))
        self.gm = 1 if desc.bm <= self.ROWS else 2
        self.gn = 3 if self.gm == 1 else 2
        self.tile_rows = [min(desc.bm, self.ROWS), desc.bm - self.ROWS][:self.gm]
        self.sa, self.sb, self.sc = r9, r10, r15

    @staticmethod
    def fits(desc):
        """Shapes the AMX kernel takes: bf16, whole 16-column tiles, blocks of at most 32 x 32."""
        return desc.dtype == "bf16" and desc.n % 16 == 0 and desc.bm <= 32 and desc.bk <= 32

    def c_tile(self, i, j):
        return TMM[i * self.gn + j]

    def a_tile(self, i):
        return TMM[self.gm * self.gn + i]

    def b_tile(self, j):
        return TMM[self.gm * self.gn + self.gm + j]

    def config(self):
        """The 64-byte palette-1 ``ldtilecfg`` operand."""
        cfg = bytearray(64)
        cfg[0] = 1
        shapes = {}
        for i, rows in enumerate(self.tile_rows):
            for j in range(self.gn):
                shapes[self.c_tile(i, j).num] = (rows, self.COLSB)
            shapes[self.a_tile(i).num] = (rows, 2 * self.d.bk)
        for j in range(self.gn):
            shapes[self.b_tile(j).num] = (self.d.bk // 2, self.COLSB)
        for t, (rows, colsb) in shapes.items():
            cfg[16 + 2 * t:18 + 2 * t] = colsb.to_bytes(2, "little")
            cfg[48 + t] = rows
        return bytes(cfg)

    def build(self):
        a, d = self.a, self.d
        self.fn.stack(128)                    # the configuration, and sttilecfg's output
        poison = a.label()
        self.check_indices(poison)
        configure(a, self.config(), base=0, now=64, written=False)
        a.mov(self.sa, 2 * d.bk)
        a.mov(self.sb, d.ldb * 4)
        a.mov(self.sc, d.ldc * 4)
        times, rest = divmod(d.n // self.ROWS, self.gn)
        if times:
            loop = a.label()
            a.mov(self.cols, times)
            a.bind(loop)
            self.macro_block(self.gn)
            add_imm(a, self.b, self.gn * self.COLSB, self.tmp)
            add_imm(a, self.c, self.gn * self.COLSB, self.tmp)
            a.dec(self.cols)
            a.jnz(loop)
        if rest:
            self.macro_block(rest)
        self.fn.ret()
        a.bind(poison)
        self.poison()
        return self.fn.finalize()

    def macro_block(self, gn):
        a, d = self.a, self.d
        tiles = [(i, j) for i in range(self.gm) for j in range(gn)]
        c_row = self.ROWS * d.ldc * 4
        for i, j in tiles:
            if d.beta:
                a.tileloadd(self.c_tile(i, j), [self.c + self.sc + (i * c_row + j * self.COLSB)])
            else:
                a.tilezero(self.c_tile(i, j))

        def block():
            for i in range(self.gm):
                a.tileloadd(self.a_tile(i), [self.ablk + self.sa + i * self.ROWS * 2 * d.bk])
                for j in range(gn):
                    if i == 0:
                        a.tileloadd(self.b_tile(j), [self.bkp + self.sb + j * self.COLSB])
                    a.tdpbf16ps(self.c_tile(i, j), self.a_tile(i), self.b_tile(j))
            add_imm(a, self.ablk, self.block_bytes, self.tmp)
        self.over_blocks(block)
        for i, j in tiles:
            a.tilestored([self.c + self.sc + (i * c_row + j * self.COLSB)], self.c_tile(i, j))


@register("x86", "block_spmm")
def generate(desc, isa, features=None):
    """The raw kernel for ``desc`` on ``isa``; ``features`` overrides the target's (as for the
    BRGEMM). On "amx" the shapes :meth:`AmxSpmmGen.fits` takes use tiles, the others AVX-512.

    >>> from tppasm.spmm import BlockSpmm
    >>> text = generate(BlockSpmm(bm=32, bk=32, n=64, kb=4, dtype="bf16"), "amx").disassemble()
    >>> text.count("tdpbf16ps"), text.count("ldtilecfg")
    (4, 1)
    """
    if isa == "amx" and AmxSpmmGen.fits(desc):
        return AmxSpmmGen(desc).build()
    base = "avx512" if isa == "amx" else isa
    return SpmmGen(desc, base, _brgemm.target_features(base) if features is None else frozenset(features)).build()
