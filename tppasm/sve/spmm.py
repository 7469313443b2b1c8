"""SVE code for the block-sparse x dense TPP (:class:`tppasm.spmm.BlockSpmm`), vector-length agnostic.

Arguments (AAPCS64), as on x86: x0 = rowptr, x1 = colidx, x2 = values, x3 = B, x4 = C, x5 = count.

The kernel first reads its block row's ``[start, end)`` from ``rowptr`` (zero-extended, so a
negative entry is huge) and requires ``start <= end <= count`` and every ``colidx[p] < kb`` for p
in ``[start, end)`` (unsigned compares); on any failure it writes NaN to all of C and returns,
having read nothing else. Otherwise C is swept in column blocks of ``nv`` vectors (``whilelo``
predicates mask the tail, so no lane past n is read or written) and, inside each, in register tiles
of up to ``mr`` rows (the blocking of :func:`tppasm.sve.microkernel.plan`). A tile's accumulators
start at zero (beta=0) or C (beta=1); for every stored block of the row, each k group loads B's
row (group) as vectors at ``colidx[p] * bk`` rows down and multiplies it by the block's A values
broadcast with ``ld1rw``: fp32 ``fmla``, or for bf16 the A pair against B's VNNI2 pair with
``bfmlalb`` + ``bfmlalt`` (fused fp32 multiply-adds of the even and odd k, so the result matches
an fp32 sum of the widened products). C is fp32 in both cases.

>>> from tppasm.spmm import BlockSpmm
>>> from isa.aarch64 import disassemble
>>> text = disassemble(generate(BlockSpmm(bm=4, bk=4, n=20, kb=3, dtype="bf16")))
>>> "bfmlalb" in text and "bfmlalt" in text and "whilelo" in text
True
"""
from isa.aarch64 import LSL, Function, mem, p, post, vl, x, z

from .common import add_imm
from .microkernel import plan
from .raw import register_sve

NAN = 0x7FC00000
UNROLL = 4                      # k groups per iteration of the k loop (ld1rw offsets stay < 256)
ACC, B_REG, A_REG = 0, 24, 28   # first z register of the accumulators, the B vectors, the A broadcasts
P_ALL = p[7]

R_ROWPTR, R_CI0, R_VALS, R_B, R_C, R_COUNT = (x[i] for i in range(6))
R_NBLK, R_N, R_J, R_T, R_T2, R_CROW, R_AROW, R_CNT, R_CI, R_ABLK, R_BPTR, R_K = (x[i] for i in range(6, 18))
R_ROWS, R_LDC, R_LDB, R_PANEL = x[0], x[5], x[28], x[29]    # x0, x5: free once the indices are checked
ROW_PTRS = x[19:28]                          # one A row pointer per tile row (mr <= 9)


class SpmmGen:
    """State of one kernel's generation (see the module docstring)."""

    def __init__(self, desc):
        self.d = desc
        self.es = 4 if desc.dtype == "f32" else 2
        self.groups = desc.bk // desc.vnni          # k groups per block (one B row / VNNI row each)
        blocking = plan(desc.bm, desc.n, "f32", "dot")
        self.mr, self.nv = blocking.mr, blocking.nv
        self.f = Function(nargs=6)
        self.a = self.f.asm

    def build(self) -> bytes:
        """The whole kernel: index checks, the column blocks, the NaN path."""
        a = self.a
        poison = a.label("poison")
        a.mov_imm(R_N, self.d.n)
        self.check_indices(poison)
        a.mov_imm(R_LDC, self.d.ldc * 4)
        a.mov_imm(R_LDB, self.d.ldb * 4)            # bytes between k groups of B (f32 rows, VNNI2 row pairs)
        a.mov_imm(R_PANEL, self.d.bk * self.d.ldb * self.es)      # bytes of B per block column
        a.ptrue(P_ALL.s)
        self.column_blocks()
        self.f.ret()
        a.bind(poison)
        self.poison()
        self.f.ret()
        return self.f.code()

    def check_indices(self, poison):
        """start, end = rowptr[0], rowptr[1]; require start <= end <= count and colidx[p] < kb for p in
        [start, end); then point colidx (x1) and values (x2) at block ``start``, nblk = end - start."""
        a, start, end = self.a, R_T, R_T2
        a.ldr(start.w, mem(R_ROWPTR))
        a.ldr(end.w, mem(R_ROWPTR, 4))
        a.cmp(end, R_COUNT)
        a.b_hi(poison)
        a.cmp(start, end)
        a.b_hi(poison)
        a.sub(R_NBLK, end, start)
        a.add(R_CI0, R_CI0, start, LSL(2))
        a.mov_imm(R_T2, self.d.bm * self.d.bk * self.es)
        a.madd(R_VALS, start, R_T2, R_VALS)
        done, loop = a.label("checked"), a.label("check")
        a.cbz(R_NBLK, done)
        a.mov(R_CI, R_CI0)
        a.mov(R_CNT, R_NBLK)
        a.mov_imm(R_T2, self.d.kb)
        a.bind(loop)
        a.ldr(R_T.w, post(R_CI, 4))
        a.cmp(R_T, R_T2)
        a.b_hs(poison)
        a.subs(R_CNT, R_CNT, 1)
        a.b_ne(loop)
        a.bind(done)

    def column_blocks(self):
        """C in blocks of nv vectors from column 0; lanes at or past n are predicated off."""
        a = self.a
        top = a.label("cols")
        a.mov(R_J, 0)
        a.bind(top)
        a.mov(R_T, R_J)
        for v in range(self.nv):
            a.whilelo(p[v].s, R_T, R_N)
            if v < self.nv - 1:
                a.incw(R_T)
        self.row_tiles()
        a.incw(R_J, "all", self.nv)
        a.cmp(R_J, R_N)
        a.b_lo(top)

    def row_tiles(self):
        """The block's bm rows as tiles of mr rows (a runtime loop), then one of the rest."""
        a, d = self.a, self.d
        full, rest = divmod(d.bm, self.mr)
        a.add(R_CROW, R_C, R_J, LSL(2))
        a.mov(R_AROW, R_VALS)
        if full:
            top = a.label("rows")
            a.mov_imm(R_ROWS, full)
            a.bind(top)
            self.tile(self.mr)
            add_imm(a, R_CROW, R_CROW, self.mr * d.ldc * 4, R_T)
            add_imm(a, R_AROW, R_AROW, self.mr * d.bk * self.es, R_T)
            a.subs(R_ROWS, R_ROWS, 1)
            a.b_ne(top)
        if rest:
            self.tile(rest)

    def acc(self, r, v):
        """Accumulator of tile row r, vector v."""
        return z[ACC + r * self.nv + v].s

    def tile(self, rows):
        """C rows x nv vectors at R_CROW: start (0 or C), add every stored block, store."""
        a = self.a
        if self.d.beta:
            self.c_rows(rows, load=True)
        else:
            for r in range(rows):
                for v in range(self.nv):
                    a.dup(self.acc(r, v), 0)
        self.over_blocks(rows)
        self.c_rows(rows, load=False)

    def c_rows(self, rows, load):
        """Load the accumulators from C or store them to it, under the column predicates."""
        a = self.a
        a.mov(R_T, R_CROW)
        for r in range(rows):
            for v in range(self.nv):
                if load:
                    a.ld1w(self.acc(r, v), p[v].z, vl(R_T, v))
                else:
                    a.st1w(self.acc(r, v), p[v], vl(R_T, v))
            if r < rows - 1:
                a.add(R_T, R_T, R_LDC)

    def over_blocks(self, rows):
        """The k loop of each stored block: A row pointers at the tile's rows of the block, R_BPTR at
        the block's panel of B (``colidx[p] * bk`` rows down, checked to lie in B) and column J."""
        a, d = self.a, self.d
        done, top = a.label("blocks_done"), a.label("blocks")
        a.cbz(R_NBLK, done)
        a.mov(R_CI, R_CI0)
        a.mov(R_CNT, R_NBLK)
        a.mov(R_ABLK, R_AROW)
        a.bind(top)
        a.ldr(R_T.w, post(R_CI, 4))
        a.madd(R_BPTR, R_T, R_PANEL, R_B)
        a.add(R_BPTR, R_BPTR, R_J, LSL(2))
        a.mov(ROW_PTRS[0], R_ABLK)
        for r in range(1, rows):
            add_imm(a, ROW_PTRS[r], ROW_PTRS[r - 1], d.bk * self.es, R_T)
        self.k_loop(rows)
        add_imm(a, R_ABLK, R_ABLK, d.bm * d.bk * self.es, R_T)
        a.subs(R_CNT, R_CNT, 1)
        a.b_ne(top)
        a.bind(done)

    def k_loop(self, rows):
        """All k groups of one block: a loop of UNROLL groups, then the rest unrolled."""
        a = self.a
        iters, rest = divmod(self.groups, UNROLL)
        if iters:
            top = a.label("k")
            a.mov_imm(R_K, iters)
            a.bind(top)
            for g in range(UNROLL):
                self.group(rows, g * 4)
            for r in range(rows):
                a.add(ROW_PTRS[r], ROW_PTRS[r], UNROLL * 4)
            a.subs(R_K, R_K, 1)
            a.b_ne(top)
        for g in range(rest):
            self.group(rows, g * 4)

    def group(self, rows, offset):
        """One k group: B's row (group) as nv vectors (R_BPTR then moves on), then per tile row the
        A value (f32) or pair (bf16) at byte ``offset`` broadcast and multiplied in."""
        a = self.a
        bvec = [z[B_REG + v].s for v in range(self.nv)]
        for v in range(self.nv):
            a.ld1w(bvec[v], p[v].z, vl(R_BPTR, v))
        a.add(R_BPTR, R_BPTR, R_LDB)
        for r in range(rows):
            za = z[A_REG + r % 4]
            a.ld1rw(za.s, P_ALL.z, mem(ROW_PTRS[r], offset))
            for v in range(self.nv):
                if self.d.dtype == "f32":
                    a.fmla(self.acc(r, v), P_ALL.m, bvec[v], za.s)
                else:
                    b = z[bvec[v].num].h
                    a.bfmlalb(self.acc(r, v), za.h, b)
                    a.bfmlalt(self.acc(r, v), za.h, b)

    def poison(self):
        """C = NaN everywhere (the indices were out of range)."""
        a, d = self.a, self.d
        nan = z[0].s
        a.mov_imm(R_T.w, NAN)
        a.dup(nan, R_T.w)
        rows, cols = a.label("nan_rows"), a.label("nan_cols")
        a.mov_imm(R_ROWS, d.bm)
        a.bind(rows)
        a.mov(R_J, 0)
        a.bind(cols)
        a.whilelo(p[0].s, R_J, R_N)
        a.st1w(nan, p[0], mem(R_C, R_J, lsl=2))
        a.incw(R_J)
        a.cmp(R_J, R_N)
        a.b_lo(cols)
        add_imm(a, R_C, R_C, d.ldc * 4, R_T)
        a.subs(R_ROWS, R_ROWS, 1)
        a.b_ne(rows)


def generate(desc) -> bytes:
    """Machine code for a BlockSpmm descriptor (see the module docstring)."""
    return SpmmGen(desc).build()


__all__ = ["generate", "SpmmGen"]


register_sve(generate, "block_spmm")
