"""SVE code for :class:`tppasm.eltwise.Reduce`: add / max / sumsq over rows or columns, fp32
accumulation (bf16 inputs widened, bf16 outputs rounded to nearest even). Arguments: x0 = x, x1 = out.

Over columns (one value per row) two accumulator vectors run along the row under ``whilelo``
predicates (merging, so tail lanes keep the identity) and ``faddv``/``fmaxv`` finish; over rows
(one value per column) each pair of column vectors accumulates down the m rows.

>>> from tppasm.eltwise import Reduce
>>> from isa.aarch64 import disassemble
>>> "faddv" in disassemble(generate(Reduce("sumsq", 3, 10)))
True
"""
from isa.aarch64 import Function, mem, p, v, x, z

from .common import add_imm
from .raw import register_sve

U = 2
P_LANE, P_ONE, P_ALL = (p[0], p[1]), p[6], p[7]
R_X, R_OUT, R_N, R_J, R_T, R_ROWS, R_P, R_S = x[9], x[10], x[11], x[12], x[13], x[14], x[15], x[16]
IDENTITY = {"add": 0, "sumsq": 0, "max": 0xFF800000}       # fp32 bits (max: -inf)


def _load(a, dtype, dst, pred, base, idx):
    if dtype == "f32":
        a.ld1w(dst, pred.z, mem(base, idx, lsl=2))
    else:
        a.ld1h(dst, pred.z, mem(base, idx, lsl=1))
        a.lsl(dst, dst, 16)


def _accumulate(a, op, acc, pred, val):
    if op == "add":
        a.fadd(acc, pred.m, acc, val)
    elif op == "max":
        a.fmax(acc, pred.m, acc, val)
    else:
        a.fmla(acc, pred.m, val, val)


def _store(a, dtype, val, pred, base, idx):
    if dtype == "f32":
        a.st1w(val, pred, mem(base, idx, lsl=2))
    else:
        a.bfcvt(z[val.num].h, P_ALL.m, val)
        a.st1h(val, pred, mem(base, idx, lsl=1))


def _init(a, acc, op):
    if IDENTITY[op]:
        a.mov_imm(R_S.w, IDENTITY[op])
        a.dup(acc, R_S.w)
    else:
        a.dup(acc, 0)


def generate(d) -> bytes:
    """Machine code for a Reduce descriptor (see the module docstring)."""
    f = Function(nargs=2)
    a = f.asm
    es_in = 4 if d.dtype == "f32" else 2
    acc = [z[i].s for i in range(U)]
    val = [z[U + i].s for i in range(U)]
    a.mov(R_X, x[0])
    a.mov(R_OUT, x[1])
    a.ptrue(P_ALL.s)
    a.ptrue(P_ONE.s, "vl1")
    a.mov_imm(R_N, d.n)
    a.mov_imm(R_ROWS, d.m)
    if d.over == "cols":
        rows, cols = a.label("rows"), a.label("cols")
        a.mov(R_P, 0)                                   # output index
        a.bind(rows)
        for u in range(U):
            _init(a, acc[u], d.op)
        a.mov(R_J, 0)
        a.bind(cols)
        a.mov(R_T, R_J)
        for u in range(U):
            a.whilelo(P_LANE[u].s, R_T, R_N)
            _load(a, d.dtype, val[u], P_LANE[u], R_X, R_T)
            _accumulate(a, d.op, acc[u], P_LANE[u], val[u])
            a.incw(R_T)
        a.mov(R_J, R_T)
        a.cmp(R_J, R_N)
        a.b_lo(cols)
        comb = a.fmax if d.op == "max" else a.fadd
        comb(acc[0], P_ALL.m, acc[0], acc[1])
        (a.fmaxv if d.op == "max" else a.faddv)(v[0].s, P_ALL, acc[0])
        _store(a, d.out_dtype, z[0].s, P_ONE, R_OUT, R_P)
        a.add(R_P, R_P, 1)
        add_imm(a, R_X, R_X, d.ldi * es_in, R_S)
        a.subs(R_ROWS, R_ROWS, 1)
        a.b_ne(rows)
    else:
        cols, rows = a.label("cols"), a.label("rows")
        a.mov(R_J, 0)
        a.bind(cols)
        a.mov(R_T, R_J)
        for u in range(U):
            a.whilelo(P_LANE[u].s, R_T, R_N)
            _init(a, acc[u], d.op)
            if u < U - 1:
                a.incw(R_T)
        a.mov(R_P, R_X)
        a.mov_imm(R_ROWS, d.m)
        a.bind(rows)
        a.mov(R_T, R_J)
        for u in range(U):
            _load(a, d.dtype, val[u], P_LANE[u], R_P, R_T)
            _accumulate(a, d.op, acc[u], P_ALL, val[u])
            if u < U - 1:
                a.incw(R_T)
        add_imm(a, R_P, R_P, d.ldi * es_in, R_S)
        a.subs(R_ROWS, R_ROWS, 1)
        a.b_ne(rows)
        a.mov(R_T, R_J)
        for u in range(U):
            _store(a, d.out_dtype, acc[u], P_LANE[u], R_OUT, R_T)
            if u < U - 1:
                a.incw(R_T)
        a.incw(R_J, "all", U)
        a.cmp(R_J, R_N)
        a.b_lo(cols)
    f.ret()
    return f.code()


__all__ = ["generate"]


register_sve(generate, "reduce")
