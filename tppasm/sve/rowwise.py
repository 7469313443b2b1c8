"""Building blocks of the row-wise SVE kernels (:mod:`.rotary`, :mod:`.glu`, :mod:`.quant`): fp32
loads and stores of f32/bf16 rows, a walk over the columns of one row two vectors at a time, and a
loop over rows that steps each operand's pointer by its row stride.

The column walk keeps the element index of the first vector in ``R_J`` and of the second in
``R_T`` (``R_J`` + ``cntw``); ``whilelo`` against ``R_N`` gives each vector its lane predicate, so
tails need no extra code and the same code runs at every vector length. Operands of any element
size share these indices (the load or store scales them). bf16 is widened with ``ld1h`` + ``lsl
#16`` and narrowed with ``bfcvt`` (round to nearest even).

>>> from isa.aarch64 import Function, disassemble, x
>>> f = Function(nargs=2); a = f.asm; a.ptrue(P_ALL.s); a.mov_imm(R_N, 10)
>>> walk_columns(a, lambda u: store(a, "bf16", load(a, "f32", z[u].s, u, x[0]), u, x[1]))
>>> f.ret(); [m for m in ("whilelo", "ld1w", "bfcvt", "st1h") if m in disassemble(f.code())]
['whilelo', 'ld1w', 'bfcvt', 'st1h']
"""
from __future__ import annotations

from isa.aarch64 import mem, p, x, z

from .common import add_imm

U = 2                                              # vectors per column step
P_LANE, P_ONE, P_ALL = (p[0], p[1]), p[6], p[7]    # per-vector lanes, lane 0 only, all .s lanes
R_J, R_T, R_N, R_ROWS, R_S = x[9], x[10], x[11], x[12], x[13]
IDX = (R_J, R_T)                                   # element index of vector u


def load(a, dtype: str, dst, u: int, base):
    """dst (``.s``) = fp32 values of vector u's lanes at ``base`` (f32 or bf16; inactive lanes 0)."""
    if dtype == "f32":
        a.ld1w(dst, P_LANE[u].z, mem(base, IDX[u], lsl=2))
    else:
        a.ld1h(dst, P_LANE[u].z, mem(base, IDX[u], lsl=1))
        a.lsl(dst, dst, 16)
    return dst


def store(a, dtype: str, src, u: int, base) -> None:
    """Store vector u's active lanes of fp32 ``src`` (``.s``) at ``base`` as f32 or bf16 (``src``
    is clobbered for bf16)."""
    if dtype == "f32":
        a.st1w(src, P_LANE[u], mem(base, IDX[u], lsl=2))
    else:
        a.bfcvt(z[src.num].h, P_ALL.m, src)
        a.st1h(src, P_LANE[u], mem(base, IDX[u], lsl=1))


def walk_columns(a, vector) -> None:
    """Emit the loop over the ``R_N`` columns of a row: ``vector(u)`` for u = 0, 1 per step, with
    ``P_LANE[u]`` and ``IDX[u]`` set (the second vector's predicate may be empty)."""
    cols = a.label("cols")
    a.mov(R_J, 0)
    a.bind(cols)
    a.mov(R_T, R_J)
    a.incw(R_T)
    for u in range(U):
        a.whilelo(P_LANE[u].s, IDX[u], R_N)
    for u in range(U):
        vector(u)
    a.incw(R_J, "all", U)
    a.cmp(R_J, R_N)
    a.b_lo(cols)


def row_loop(a, m: int, row, steps) -> None:
    """Emit ``row()`` m times; after each row every ``(register, bytes)`` of ``steps`` advances."""
    rows = a.label("rows")
    a.mov_imm(R_ROWS, m)
    a.bind(rows)
    row()
    for reg, nbytes in steps:
        add_imm(a, reg, reg, nbytes, R_S)
    a.subs(R_ROWS, R_ROWS, 1)
    a.b_ne(rows)


def esize(dtype: str) -> int:
    """Bytes per element of a row operand (f32 4, bf16 2)."""
    return 4 if dtype == "f32" else 2
