"""SVE batch-reduce GEMM generators (vector-length agnostic) and their NumPy references.

``C[m, n] = beta * C + sum_{i < count} A_i[m, k] @ B_i[k, n]``, all row-major with leading
dimensions ``lda``, ``ldb``, ``ldc`` in elements. One generated code path is correct at every SVE
vector length (128 to 2048 bits): columns advance by ``cntw`` multiples, the last column block is
masked by ``whilelo`` predicates, and a runtime dispatch picks a narrower register block for it.

Three microkernel families share one loop driver:

* **indexed** (``f32``, the default when k >= 4): ``ld1rqw`` loads 4 consecutive k values of each
  A row once, and indexed ``fmla`` (``z.s[i]``) uses them against 4 rows of B; C is blocked as
  ``rows x nv`` vectors. B is plain row-major. Leftover k (k % 4) uses broadcast steps.
* **dot** (``f32`` with ``fmla``; ``bf16`` with ``bfdot``; ``i8``/``u8``/``u8i8`` with
  ``sdot``/``udot``/``usdot``): C is blocked as ``rows x nv`` vectors, A values are broadcast with
  ``ld1rw`` (one fp32, or a group of 2 bf16 / 4 int8 along k), B is read as vectors.
  B layout: :func:`pack_b_dot`, shape ``(ceil(k/g), n, g)`` with g = 1, 2, 4 (f32 needs no packing).
* **mmla** (``bf16`` with ``bfmmla``; ``i8``/``u8``/``u8i8`` with ``smmla``/``ummla``/``usmmla``):
  each 128-bit segment holds a 2x2 block of C; two rows of A are joined by ``ld1rd`` + ``trn1``.
  B layout: :func:`pack_b_mmla`, shape ``(ceil(k/g), 2*ceil(n/2), g)`` with g = 4 (bf16), 8 (int8).

A stays row-major in every case; C is fp32 (int32 for the int8 types).

Batch kinds and signatures (AAPCS64):

* ``"stride"``:  ``x0 = A, x1 = B, x2 = C``; ``A_i = A + i*stride_a``, ``B_i = B + i*stride_b``
  (elements of A / of the packed B).
* ``"offset"``:  ``x0 = A, x1 = B, x2 = C, x3 = int64 byte offsets of A_i, x4 = of B_i``.
* ``"address"``: ``x0 = int64 addresses of A_i, x1 = of B_i, x2 = C``.

>>> code = brgemm(m=4, n=16, k=8, dtype="f32")
>>> len(code) % 4, len(code) > 100
(0, True)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from isa.aarch64 import LSL, Assembler, Function, mem, p, post, vl, x, z

from .common import add_imm, ceil_div

__all__ = ["brgemm", "brgemm_ref", "inner_loop", "kernel_for", "pack_b", "pack_b_dot", "pack_b_mmla", "DTYPES", "Plan", "plan"]


@dataclass(frozen=True)
class _DType:
    name: str
    group: int               # k values per dot/mmla group
    esize: int               # bytes per A/B element
    dot: str | None          # dot-family instruction
    mmla: str | None         # mmla-family instruction
    a_np: object
    b_np: object
    c_np: object


def _np(name):
    if name == "bf16":
        import ml_dtypes
        return ml_dtypes.bfloat16
    return np.dtype(name)


DTYPES = {
    "f32": _DType("f32", 1, 4, "fmla", None, "float32", "float32", "float32"),
    "bf16": _DType("bf16", 2, 2, "bfdot", "bfmmla", "bf16", "bf16", "float32"),
    "i8": _DType("i8", 4, 1, "sdot", "smmla", "int8", "int8", "int32"),
    "u8": _DType("u8", 4, 1, "udot", "ummla", "uint8", "uint8", "int32"),
    "u8i8": _DType("u8i8", 4, 1, "usdot", "usmmla", "uint8", "int8", "int32"),
}
MMLA_GROUP = {"bf16": 4, "i8": 8, "u8": 8, "u8i8": 8}


# ------------------------------------------------------------------------------------ layouts

def pack_b_dot(b: np.ndarray, group: int) -> np.ndarray:
    """B (k, n) -> (ceil(k/group), n, group): each column's ``group`` consecutive k values adjacent
    (the layout ``bfdot``/``sdot`` read as one 32-bit lane), k zero-padded.

    >>> pack_b_dot(np.arange(6).reshape(3, 2), 2)[:, :, :].tolist()
    [[[0, 2], [1, 3]], [[4, 0], [5, 0]]]
    """
    k, n = b.shape
    kp = ceil_div(k, group) * group
    padded = np.zeros((kp, n), b.dtype)
    padded[:k] = b
    return np.ascontiguousarray(padded.reshape(kp // group, group, n).transpose(0, 2, 1))


def pack_b_mmla(b: np.ndarray, group: int) -> np.ndarray:
    """B (k, n) -> (ceil(k/group), 2*ceil(n/2), group): for each pair of columns, ``group`` k values
    of the first column then of the second (a 2 x group block of B^T, one 128-bit segment of a
    ``bfmmla``/``smmla`` operand); k and n zero-padded."""
    k, n = b.shape
    padded = np.zeros((k, ceil_div(n, 2) * 2), b.dtype)
    padded[:, :n] = b
    return pack_b_dot(padded, group)


def pack_b(b: np.ndarray, dtype: str, kernel: str = "dot") -> np.ndarray:
    """The B operand in the layout ``brgemm(dtype=dtype, kernel=kernel)`` reads (f32: B itself).
    ``kernel="auto"`` means mmla for bf16 and the int8 types."""
    if dtype == "f32":
        return np.ascontiguousarray(b)
    if kernel in ("mmla", "auto"):
        return pack_b_mmla(b, MMLA_GROUP[dtype])
    return pack_b_dot(b, DTYPES[dtype].group)


# ------------------------------------------------------------------------------------ reference

def brgemm_ref(a, b, c, *, m, n, k, lda, ldb, ldc, count=1, stride_a=0, stride_b=0, beta=1,
               a_offsets=None, b_offsets=None):
    """NumPy reference on flat buffers with natural (unpacked, row-major) B; updates ``c`` in place.
    Offsets (elements) override the strides when given. Accumulates in float64 / int64.

    >>> a = np.ones(6, np.float32); b = np.ones(6, np.float32); c = np.zeros(4, np.float32)
    >>> brgemm_ref(a, b, c, m=2, n=2, k=3, lda=3, ldb=2, ldc=2); c.tolist()
    [3.0, 3.0, 3.0, 3.0]
    """
    acc_t = np.int64 if np.issubdtype(c.dtype, np.integer) else np.float64
    acc = np.zeros((m, n), acc_t)
    for i in range(count):
        oa = a_offsets[i] if a_offsets is not None else i * stride_a
        ob = b_offsets[i] if b_offsets is not None else i * stride_b
        ai = np.lib.stride_tricks.as_strided(a[oa:], (m, k), (lda * a.itemsize, a.itemsize))
        bi = np.lib.stride_tricks.as_strided(b[ob:], (k, n), (ldb * b.itemsize, b.itemsize))
        acc += ai.astype(acc_t) @ bi.astype(acc_t)
    cv = np.lib.stride_tricks.as_strided(c, (m, n), (ldc * c.itemsize, c.itemsize))
    if beta:
        acc += cv.astype(acc_t)
    cv[...] = acc.astype(c.dtype)


# ------------------------------------------------------------------------------------ plan

@dataclass(frozen=True)
class Plan:
    """Register blocking of a BRGEMM kernel: ``mr`` rows x ``nv`` C vectors per block."""
    kernel: str              # "dot", "mmla" or "indexed"
    mr: int
    nv: int
    group: int               # k values consumed per instruction group


def plan(m: int, n: int, dtype: str = "f32", kernel: str = "dot", vl_hint: int = 256) -> Plan:
    """Choose the blocking; ``vl_hint`` only tunes it (the code is correct at any VL).

    >>> plan(64, 64, "f32")
    Plan(kernel='dot', mr=6, nv=4, group=1)
    >>> plan(64, 64, "f32", "indexed")
    Plan(kernel='indexed', mr=5, nv=4, group=4)
    """
    lanes = vl_hint // 32
    if kernel == "indexed":
        nv = min(4, max(1, ceil_div(n, lanes)))
        return Plan("indexed", min(m, {4: 5, 3: 7, 2: 8, 1: 8}[nv]), nv, 4)
    if kernel == "mmla":
        nv = min(2, max(1, ceil_div(n, lanes)))
        return Plan("mmla", min(m, 8), nv, MMLA_GROUP[dtype])
    nv = min(4, max(1, ceil_div(n, lanes)))
    return Plan("dot", min(m, {4: 6, 3: 8, 2: 9, 1: 9}[nv]), nv, DTYPES[dtype].group)


# ------------------------------------------------------------------------------------ generator

# General registers (see the module docstring for arguments x0-x4).
R_AOFF, R_CROW, R_J, R_N, R_T, R_BATCH, R_ABASE, R_BPTR, R_K = (x[i] for i in (5, 6, 7, 8, 9, 10, 11, 12, 13))
R_LDA, R_LDB, R_AITER, R_BITER, R_LDC = x[14], x[15], x[16], x[17], x[28]
ROW_PTRS = x[19:28]                       # one A row pointer per block row (mr <= 9)
P_ALL, P_TAIL = p[7], p[6]                # all lanes; first (k % group) lanes of A


@dataclass
class _Gen:
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    count: int
    stride_a: int
    stride_b: int
    beta: int
    batch: str
    dt: _DType
    plan: Plan
    f: Function = field(init=False)

    @property
    def a(self) -> Assembler:
        return self.f.asm

    @property
    def mmla(self) -> bool:
        return self.plan.kernel == "mmla"

    @property
    def indexed(self) -> bool:
        return self.plan.kernel == "indexed"

    # Vector registers. dot/mmla: accumulators from z0, B z24-z27, A z28-z31. indexed: A quads
    # z0-z7 (the lane operand of an indexed fmla must be z0-z7), accumulators from z8, B last.
    @property
    def acc_base(self) -> int:
        return 8 if self.indexed else 0

    @property
    def b_base(self) -> int:
        return 32 - self.plan.nv if self.indexed else 24

    @property
    def a_base(self) -> int:
        return 0 if self.indexed else 28

    c_bytes = 4                                # bytes of a C element

    # ---- top level
    def build(self) -> bytes:
        self.f = Function(nargs={"stride": 3, "offset": 5, "address": 3}[self.batch])
        self.rows()
        self.f.ret()
        return self.f.code()

    def rows(self) -> None:
        """Loop invariants, then all rows: blocks of mr rows, then the rest."""
        a, esz = self.a, self.dt.esize
        a.mov_imm(R_N, self.n)
        a.mov_imm(R_LDA, self.lda * esz)
        a.mov_imm(R_LDB, self.ldb * esz)
        a.mov_imm(R_LDC, self.ldc * self.c_bytes)
        a.ptrue(P_ALL.s)
        if self.k % self.plan.group:
            a.ptrue(P_TAIL.b if esz == 1 else P_TAIL.h, f"vl{self.k % self.plan.group}")
        a.mov(R_AOFF, 0)
        a.mov(R_J, 0)
        a.mov(R_CROW, x[2])
        full, rest = divmod(self.m, self.plan.mr)
        if full:
            top = a.label("rows")
            a.bind(top)
            self.row_block(self.plan.mr)
            add_imm(a, R_AOFF, R_AOFF, self.plan.mr * self.lda * esz, R_T)
            add_imm(a, R_CROW, R_CROW, self.plan.mr * self.ldc * self.c_bytes, R_T)
            if full > 1:
                a.mov_imm(R_T, full * self.plan.mr * self.lda * esz)
                a.cmp(R_AOFF, R_T)
                a.b_lo(top)
        if rest:
            self.row_block(rest)

    def row_block(self, rows: int) -> None:
        """All column blocks of ``rows`` rows: full blocks of nv vectors, then a narrower tail."""
        a, nv = self.a, self.plan.nv
        top, done = a.label("cols"), a.label("cols_done")
        blocks = {t: a.label(f"nv{t}") for t in range(1, nv + 1)}
        a.bind(top)
        a.sub(R_T, R_N, R_J)                       # columns left
        for t in range(nv, 1, -1):
            a.cntw(R_BATCH, "all", t - 1)
            a.cmp(R_T, R_BATCH)
            a.b_hi(blocks[t])
        for t in range(1, nv + 1):
            a.bind(blocks[t])
            self.col_block(rows, t)
            a.cmp(R_J, R_N)
            a.b_lo(top)
            if t < nv:
                a.b(done)
        a.bind(done)
        a.mov(R_J, 0)

    def col_block(self, rows: int, t: int) -> None:
        """One block of ``rows`` x ``t`` C vectors starting at column R_J; advances R_J."""
        a = self.a
        a.mov(R_T, R_J)
        for v in range(t):                          # C lanes (also B lanes for the dot kernels)
            a.whilelo(p[v].s, R_T, R_N)
            if v < t - 1:
                a.incw(R_T)
        if self.mmla:                               # B lanes: 2 words per column, 2t vectors
            a.lsl(R_T, R_J, 1)
            a.mov_imm(R_K, 4 * ceil_div(self.n, 2))        # 2 words per column, n padded to even
            for v in range(2 * t):
                a.whilelo(p[2 + v].s, R_T, R_K)
                a.incw(R_T)
        self.c_access(rows, t, load=True)
        self.batch_loop(rows, t)
        self.c_access(rows, t, load=False)
        a.incw(R_J, "all", t)

    # ---- accumulators
    def acc(self, r: int, v: int):
        """Accumulator of block row r (row pair for mmla) and vector v (B vector for mmla)."""
        return z[self.acc_base + r * (2 * self.plan.nv if self.mmla else self.plan.nv) + v].s

    def c_access(self, rows: int, t: int, load: bool) -> None:
        """Initialise accumulators from C (beta=1) or zero, or store them back to C."""
        a = self.a
        if load and not self.beta:
            for r in range(ceil_div(rows, 2) if self.mmla else rows):
                for v in range(2 * t if self.mmla else t):
                    a.dup(self.acc(r, v), 0)
            return
        a.add(R_T, R_CROW, R_J, LSL2)
        if not self.mmla:
            for r in range(rows):
                for v in range(t):
                    (a.ld1w(self.acc(r, v), p[v].z, vl(R_T, v)) if load else a.st1w(self.acc(r, v), p[v], vl(R_T, v)))
                if r < rows - 1:
                    a.add(R_T, R_T, R_LDC)
            return
        lo, hi = z[self.b_base].s, z[self.b_base + 1].s   # B registers are free outside the k loop
        for q in range(ceil_div(rows, 2)):
            pair = 2 * q + 1 < rows
            for c in range(t):
                acc0, acc1 = self.acc(q, 2 * c), self.acc(q, 2 * c + 1)
                if load:
                    a.ld1w(lo, p[c].z, vl(R_T, c))
                    if pair:
                        a.add(R_T, R_T, R_LDC)
                        a.ld1w(hi, p[c].z, vl(R_T, c))
                        a.sub(R_T, R_T, R_LDC)
                    else:
                        a.dup(hi, 0)
                    a.zip1(_d(acc0), _d(lo), _d(hi))
                    a.zip2(_d(acc1), _d(lo), _d(hi))
                else:
                    a.uzp1(_d(lo), _d(acc0), _d(acc1))
                    a.st1w(lo, p[c], vl(R_T, c))
                    if pair:
                        a.uzp2(_d(hi), _d(acc0), _d(acc1))
                        a.add(R_T, R_T, R_LDC)
                        a.st1w(hi, p[c], vl(R_T, c))
                        a.sub(R_T, R_T, R_LDC)
            if q < ceil_div(rows, 2) - 1:
                a.add(R_T, R_T, R_LDC)
                a.add(R_T, R_T, R_LDC)

    # ---- batch and k loops
    def batch_loop(self, rows: int, t: int) -> None:
        a, kind = self.a, self.batch
        col_shift = 3 if self.mmla else 2        # bytes of packed B per column: 8 (mmla) or 4
        if kind == "stride":
            a.add(R_ABASE, x[0], R_AOFF)
            a.mov(R_BITER, x[1])
        else:
            a.mov(R_AITER, x[3] if kind == "offset" else x[0])
            a.mov(R_BITER, x[4] if kind == "offset" else x[1])
        if self.count > 1:
            a.mov_imm(R_BATCH, self.count)
        top = a.label("batch")
        a.bind(top)
        if kind == "stride":
            a.add(R_BPTR, R_BITER, R_J, LSL(col_shift))
        else:
            a.ldr(R_T, post(R_AITER, 8))
            a.add(R_ABASE, R_T, R_AOFF)
            a.ldr(R_T, post(R_BITER, 8))
            if kind == "offset":
                a.add(R_ABASE, R_ABASE, x[0])
                a.add(R_T, R_T, x[1])
            a.add(R_BPTR, R_T, R_J, LSL(col_shift))
        a.mov(ROW_PTRS[0], R_ABASE)
        for r in range(1, rows):
            a.add(ROW_PTRS[r], ROW_PTRS[r - 1], R_LDA)
        self.k_loop(rows, t)
        if self.count > 1:
            if kind == "stride":
                add_imm(a, R_ABASE, R_ABASE, self.stride_a * self.dt.esize, R_T)
                add_imm(a, R_BITER, R_BITER, self.stride_b * self.dt.esize, R_T)
            a.subs(R_BATCH, R_BATCH, 1)
            a.b_ne(top)

    def k_loop(self, rows: int, t: int) -> None:
        a, g = self.a, self.plan.group
        step = g * self.dt.esize                  # bytes of one row of A per group
        groups, tail = divmod(self.k, g)
        unroll = min(groups, 4) or 1
        iters, rest = divmod(groups, unroll)
        if iters:
            top = a.label("k")
            a.mov_imm(R_K, iters)
            a.bind(top)
            for kk in range(unroll):
                self.group(rows, t, kk * step)
            for r in range(rows):
                a.add(ROW_PTRS[r], ROW_PTRS[r], unroll * step)
            a.subs(R_K, R_K, 1)
            a.b_ne(top)
        for kk in range(rest):
            self.group(rows, t, kk * step)
        if tail and self.indexed:
            for i in range(tail):
                self.single(rows, t, rest * step + 4 * i)
        elif tail:
            self.group(rows, t, rest * step, partial=True)

    def load_a(self, dst, r: int, offset: int, partial: bool) -> None:
        """Broadcast one group of A row ``r`` at byte ``offset``: 32 bits (dot) or 64 bits (mmla).
        A partial group loads only its valid lanes (ld1rq under P_TAIL), never reading past k."""
        a = self.a
        if not partial:
            if self.mmla:
                a.ld1rd(dst.d, P_ALL.z, mem(ROW_PTRS[r], offset))
            else:
                a.ld1rw(dst.s, P_ALL.z, mem(ROW_PTRS[r], offset))
            return
        add_imm(a, R_T, ROW_PTRS[r], offset, R_T)
        if self.dt.esize == 1:
            a.ld1rqb(dst.b, P_TAIL.z, mem(R_T))
        else:
            a.ld1rqh(dst.h, P_TAIL.z, mem(R_T))
        if not self.mmla:
            a.dup(dst.s, dst.s[0])

    def load_b(self, t: int) -> list:
        """The B vectors of one k row (k group) at R_BPTR, which then moves to the next."""
        a = self.a
        nb = 2 * t if self.mmla else t
        bvec = [z[self.b_base + v] for v in range(nb)]
        for v in range(nb):
            a.ld1w(bvec[v].s, (p[2 + v] if self.mmla else p[v]).z, vl(R_BPTR, v))
        a.add(R_BPTR, R_BPTR, R_LDB)
        return bvec

    def single(self, rows: int, t: int, offset: int) -> None:
        """One k step of the fp32 kernel with broadcast A (k tails of the indexed kernel)."""
        bvec = self.load_b(t)
        for r in range(rows):
            za = z[self.a_base + r]
            self.a.ld1rw(za.s, P_ALL.z, mem(ROW_PTRS[r], offset))
            for v in range(t):
                self.a.fmla(self.acc(r, v), P_ALL.m, bvec[v].s, za.s)

    def group(self, rows: int, t: int, offset: int, partial: bool = False) -> None:
        """One k group: load B vectors, broadcast A, multiply-accumulate."""
        a, dt = self.a, self.dt
        if self.indexed:                          # 4 k values: A quads once, then 4 B rows
            for r in range(rows):
                a.ld1rqw(z[self.a_base + r].s, P_ALL.z, mem(ROW_PTRS[r], offset))
            for i in range(4):
                bvec = self.load_b(t)
                for r in range(rows):
                    for v in range(t):
                        a.fmla(self.acc(r, v), bvec[v].s, z[self.a_base + r].s[i])
            return
        bvec = self.load_b(t)
        nb = len(bvec)
        el = "b" if dt.esize == 1 else "h"
        if self.mmla:
            for q in range(ceil_div(rows, 2)):
                za0, za1 = z[self.a_base + 2 * (q % 2)], z[self.a_base + 2 * (q % 2) + 1]
                self.load_a(za0, 2 * q, offset, partial)
                if 2 * q + 1 < rows:
                    self.load_a(za1, 2 * q + 1, offset, partial)
                    a.trn1(za0.d, za0.d, za1.d)
                elif partial:
                    a.trn1(za0.d, za0.d, za0.d)
                for v in range(nb):
                    a.emit(dt.mmla, self.acc(q, v), getattr(za0, el), getattr(bvec[v], el))
            return
        for r in range(rows):
            za = z[self.a_base + r % 4]
            self.load_a(za, r, offset, partial)
            for v in range(nb):
                if dt.dot == "fmla":
                    a.fmla(self.acc(r, v), P_ALL.m, bvec[v].s, za.s)
                else:
                    a.emit(dt.dot, self.acc(r, v), getattr(za, el), getattr(bvec[v], el))


def _d(zr):
    return z[zr.num].d


LSL2 = LSL(2)


def inner_loop(m: int, n: int, dtype: str = "f32", kernel: str = "dot", vl_hint: int = 256) -> tuple[Plan, list[str], int]:
    """The blocking, the mnemonics of one iteration of the main (unrolled) k loop for a full
    register block, and the number of k groups that iteration covers (for static analysis).

    >>> pl, mns, groups = inner_loop(64, 64)
    >>> pl.mr * pl.nv == mns.count("fmla") // groups
    True
    """
    pl = plan(m, n, dtype, kernel, vl_hint)
    gen = _Gen(m, n, 4 * pl.group, 4 * pl.group, n, n, 1, 0, 0, 1, "stride", DTYPES[dtype], pl)
    gen.f = Function(nargs=3)
    gen.k_loop(pl.mr, pl.nv)
    mns = gen.a.mnemonics
    return pl, mns[1:], 4                          # drop the loop counter set-up


def kernel_for(dtype: str, k: int, kernel: str = "auto") -> str:
    """Resolve ``kernel="auto"``: f32 uses indexed fmla (broadcast fmla when k < 4); bf16 and the
    int8 types use the matrix-multiply instructions.

    >>> kernel_for("f32", 64), kernel_for("f32", 2), kernel_for("bf16", 64)
    ('indexed', 'dot', 'mmla')
    """
    if kernel != "auto":
        return kernel
    if dtype == "f32":
        return "indexed" if k >= 4 else "dot"
    return "mmla"


def brgemm(m: int, n: int, k: int, lda: int | None = None, ldb: int | None = None,
           ldc: int | None = None, count: int = 1, stride_a: int = 0, stride_b: int = 0,
           beta: int = 1, dtype: str = "f32", kernel: str = "auto", batch: str = "stride",
           vl_hint: int = 256, blocking: Plan | None = None) -> bytes:
    """Machine code of an SVE BRGEMM kernel (see the module docstring for layouts and signatures).

    ``kernel`` is "dot", "mmla", "indexed" (f32 only) or "auto" (:func:`kernel_for`); B must be in
    the layout of :func:`pack_b` for that kernel. ``lda``/``ldc`` default to k/n; ``ldb`` is the row
    stride of B in elements for f32, and of the packed B per k group otherwise (default: the packed
    row length).

    >>> from isa.aarch64 import disassemble
    >>> "fmla" in disassemble(brgemm(m=2, n=8, k=2, beta=0))
    True
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}")
    kernel = kernel_for(dtype, k, kernel)
    if (kernel not in ("dot", "mmla", "indexed") or (kernel == "mmla" and dtype not in MMLA_GROUP)
            or (kernel == "indexed" and dtype != "f32")):
        raise ValueError("kernel is 'auto', 'dot', 'mmla' (bf16/i8/u8/u8i8) or 'indexed' (f32)")
    if batch not in ("stride", "offset", "address"):
        raise ValueError("batch is 'stride', 'offset' or 'address'")
    if beta not in (0, 1) or min(m, n, k, count) < 1:
        raise ValueError("need m, n, k, count >= 1 and beta in {0, 1}")
    dt = DTYPES[dtype]
    pl = blocking or plan(m, n, dtype, kernel, vl_hint)
    packed_row = n if dtype == "f32" else (ceil_div(n, 2) * 2 if kernel == "mmla" else n) * pl.group
    ldb = packed_row if ldb is None else ldb
    if (lda or k) < k or (ldc or n) < n or ldb < packed_row or min(stride_a, stride_b) < 0:
        raise ValueError(f"need lda >= k ({k}), ldc >= n ({n}), ldb >= {packed_row} "
                         "(the B row length in this layout) and non-negative strides")
    gen = _Gen(m, n, k, lda or k, ldb, ldc or n, count, stride_a, stride_b, beta, batch, dt, pl)
    return gen.build()
