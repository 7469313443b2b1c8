"""SVE code for :class:`tppasm.gemm_nt.GemmNT`: ``C = A @ B.T``, every row of A dotted with every
row of B along k. Arguments: x0 = a, x1 = b, x2 = c.

C is computed in blocks of ``ra`` rows of A by ``rb`` rows of B (:func:`blocking`: ra <= 4, rb <= 8,
``ra * rb`` accumulators within the 32 z registers); the outer loop walks the blocks of B, the inner
one the blocks of A, so with a few rows of A each row of B is streamed once. A block walks k a
vector at a time, ``whilelo`` giving the lanes (the k tail is predicated, nothing past a row is
read, the same code runs at every vector length): per step the ``ra`` vectors of A, then per row of
B one vector and ``ra`` multiply-accumulates (``fmla``; bf16 ``bfdot`` on pairs along k, its loads
predicated per halfword so an odd k's last pair is half zeros). Each accumulator is summed across
its lanes (``faddv``), rounded once to a bf16 C (``bfcvt``, to nearest even) and stored as a scalar.
Rows of A or B left over from whole blocks get blocks of their own size.

>>> import numpy as np
>>> from tppasm.gemm_nt import GemmNT
>>> from isa.aarch64.native import Call, run_calls, sve_runner_skip_reason
>>> a = np.array([[1, 2, 3]], np.float32); b = np.array([[1, 0, 0], [1, 1, 1]], np.float32)
>>> c = np.zeros((1, 2), np.float32)
>>> if sve_runner_skip_reason(128) is None:                  # qemu, or an SVE host
...     run_calls([Call(generate(GemmNT(1, 2, 3)), [a, b], [c])], vl_bits=128)
...     assert c.tolist() == [[1.0, 6.0]]
>>> blocking(GemmNT(6, 100, 64)), "faddv" in disassemble(generate(GemmNT(6, 100, 64)))
((3, 8), True)
"""
from __future__ import annotations

from isa.aarch64 import Function, disassemble, mem, p, v, x, z

from .common import add_imm, ceil_div
from .raw import register_sve

__all__ = ["generate", "blocking", "disassemble"]

MAX_RA, MAX_RB = 4, 8
P_K, P_ALL = p[0], p[7]
R_KN, R_K, R_LDA, R_LDB, R_LDC, R_AROW, R_CBLK, R_I, R_J, R_T, R_S = (x[i] for i in range(3, 14))
PA = x[14:18]                              # row pointers of the block's rows of A
PB = x[19:27]                              # and of B


def blocking(d) -> tuple[int, int]:
    """(ra, rb): rows of A and of B per block; ra evens out the blocks of A (5 rows: 3 + 2, not
    4 + 1), rb is as large as the accumulators, the ra A vectors and a B vector or more allow."""
    ra = ceil_div(d.m, ceil_div(d.m, MAX_RA))
    return ra, min(MAX_RB, (32 - ra - 2) // ra)


def generate(d) -> bytes:
    """Machine code for a GemmNT descriptor (see the module docstring)."""
    f = Function(nargs=3)
    a = f.asm
    bf16 = d.dtype == "bf16"
    es, c_es = (2 if bf16 else 4), (2 if d.c_dtype == "bf16" else 4)
    ra_full, rb_full = blocking(d)

    def block(ra, rb):
        """C[i:i+ra, j:j+rb] for the rows of A at R_AROW, of B at x1, of C at R_CBLK."""
        acc = [[z[r * rb + c].s for c in range(rb)] for r in range(ra)]
        av = [z[ra * rb + r] for r in range(ra)]
        bv = [z[i] for i in range(ra * rb + ra, min(32, ra * rb + ra + rb))]
        a.mov(PA[0], R_AROW)
        for r in range(1, ra):
            a.add(PA[r], PA[r - 1], R_LDA)
        a.mov(PB[0], x[1])
        for c in range(1, rb):
            a.add(PB[c], PB[c - 1], R_LDB)
        for row in acc:
            for reg in row:
                a.dup(reg, 0)
        lanes = P_K.h if bf16 else P_K.s
        a.mov(R_K, 0)
        a.whilelo(lanes, R_K, R_KN)
        top = a.label("k")
        a.bind(top)

        def load(dst, base):
            if bf16:
                a.ld1h(dst.h, P_K.z, mem(base, R_K, lsl=1))
            else:
                a.ld1w(dst.s, P_K.z, mem(base, R_K, lsl=2))
        for r in range(ra):
            load(av[r], PA[r])
        for c in range(rb):
            zb = bv[c % len(bv)]
            load(zb, PB[c])
            for r in range(ra):
                if bf16:
                    a.bfdot(acc[r][c], av[r].h, zb.h)
                else:
                    a.fmla(acc[r][c], P_ALL.m, av[r].s, zb.s)
        (a.inch if bf16 else a.incw)(R_K)
        a.whilelo(lanes, R_K, R_KN)
        a.b_first(top)
        a.mov(R_T, R_CBLK)
        for r in range(ra):
            for c in range(rb):
                n = acc[r][c].num
                a.faddv(v[n].s, P_ALL, acc[r][c])
                if c_es == 2:
                    a.bfcvt(z[n].h, P_ALL.m, acc[r][c])         # lane 0's bf16 in its low half
                    a.str(v[n].h, mem(R_T, c * 2))
                else:
                    a.str(v[n].s, mem(R_T, c * 4))
            if r < ra - 1:
                a.add(R_T, R_T, R_LDC)

    def counted(count, reg, body):
        """``body()`` count times (a loop on ``reg`` when count > 1)."""
        if count == 1:
            return body()
        top = a.label()
        a.mov_imm(reg, count)
        a.bind(top)
        body()
        a.subs(reg, reg, 1)
        a.b_ne(top)

    def a_blocks(rb):
        """Every block of rows of A against the rb rows of B at x1."""
        a.mov(R_AROW, x[0])
        a.mov(R_CBLK, x[2])

        def step():
            block(ra_full, rb)
            add_imm(a, R_AROW, R_AROW, ra_full * d.lda * es, R_S)
            add_imm(a, R_CBLK, R_CBLK, ra_full * d.ldc * c_es, R_S)
        full, rest = divmod(d.m, ra_full)
        counted(full, R_I, step)
        if rest:
            block(rest, rb)

    a.ptrue(P_ALL.s)
    a.mov_imm(R_KN, d.k)
    a.mov_imm(R_LDA, d.lda * es)
    a.mov_imm(R_LDB, d.ldb * es)
    a.mov_imm(R_LDC, d.ldc * c_es)

    def b_step():
        a_blocks(rb_full)
        add_imm(a, x[1], x[1], rb_full * d.ldb * es, R_S)
        add_imm(a, x[2], x[2], rb_full * c_es, R_S)
    full, rest = divmod(d.n, rb_full)
    if full:
        counted(full, R_J, b_step)
    if rest:
        a_blocks(rest)
    f.ret()
    return f.code()


register_sve(generate, "gemm_nt")
