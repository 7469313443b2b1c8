"""SVE code for the :class:`tppasm.brgemm.Brgemm` descriptor, with the x86 operand convention.

Arguments (AAPCS64) are the descriptor's ``operands()`` then ``count``: stride ``(a, b, c[, bias],
count)``, offset ``(a, b, c, offsets[, bias], count)`` with int64 (off_a, off_b) element pairs,
address ``(a_ptrs, b_ptrs, c[, bias], count)``. ``count`` is a runtime value.

B layout: the descriptor's x86 VNNI layout is exactly what the SVE *dot* kernels read (bf16
pairs for ``bfdot``, int8 quads for ``usdot``: :func:`tppasm.sve.microkernel.pack_b_dot` ==
:func:`tppasm.layout.vnni_pack`), so every Brgemm descriptor runs unchanged: f32 uses the indexed
``fmla`` kernel (broadcast ``fmla`` for k < 4), bf16 ``bfdot`` (a k tail uses ``bfmlalb``, so the
padding of the last VNNI pair is never read into C), i8 (A uint8, B int8) ``usdot`` with
wrapping int32 sums. The MMLA kernels need their own B layout; they are available through
:class:`MmlaBrgemm` (``layout="sve_mmla"``; f32 C, no epilogue).

Epilogue: C is loaded (beta=1, bf16 C widened) into the accumulators, and on the way out gets
``+ bias`` (fp32 row), ``act`` (relu; gelu/sigmoid/tanh with :mod:`tppasm.sve.math`, constants from
a literal pool) and bf16 rounding (``bfcvt``). The register block shrinks when the activation
needs scratch registers.

>>> from tppasm.brgemm import Brgemm
>>> from isa.aarch64 import disassemble
>>> "usdot" in disassemble(generate(Brgemm(m=4, n=8, k=8, dtype="i8")))
True
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from isa.aarch64 import LSL, Function, mem, p, post, vl, x, z

from ..brgemm import INT8_DTYPE, Brgemm
from ..operand import OperandSpec
from .common import add_imm, ceil_div
from .math import EMITTERS, NTMP, Consts
from .microkernel import (DTYPES, MMLA_GROUP, P_ALL, R_ABASE, R_AITER, R_AOFF, R_BATCH, R_BITER, R_BPTR, R_CROW, R_J, R_K,
                          R_LDA, R_LDC, R_T, ROW_PTRS, _Gen, pack_b_mmla, plan)
from .raw import register_sve

R_CNT, R_BIAS, R_POOL = x[29], x[30], x[4]
P_MATH = p[5]
SVE_DTYPE = {"f32": "f32", "bf16": "bf16", "i8": "u8i8"}
INT8_SVE = {"us": "u8i8", "ss": "i8", "uu": "u8"}      # sdot / udot / usdot by (A, B) signedness


class _DescGen(_Gen):
    """The BRGEMM generator with the descriptor's ABI and epilogue."""

    def setup_desc(self, d, nops):
        self.nops, self.c_bytes = nops, 2 if d.c_dtype == "bf16" else 4
        self.bias, self.act = d.bias, d.act
        self.bias_arg = nops - 1 if d.bias else None
        self.transcendental = d.act not in (None, "relu")

    def build(self) -> bytes:
        self.f = Function(nargs=self.nops + 1)
        a = self.a
        a.mov(R_CNT, x[self.nops])                 # before x5.. are reused
        if self.bias:
            a.mov(R_BIAS, x[self.bias_arg])
        self.c = None
        if self.transcendental:
            self.c = Consts(a, R_POOL, [], [], P_ALL, P_MATH)
            self.c.setup()
        self.rows()
        self.f.ret()
        if self.c is not None:
            self.c.pool()
        return self.f.code()

    # ---- batch: runtime count, (off_a, off_b) element pairs
    def batch_loop(self, rows: int, t: int) -> None:
        a, kind = self.a, self.batch
        col_shift = 3 if self.mmla else 2
        shift = {4: 2, 2: 1, 1: 0}[self.dt.esize]
        if kind == "stride":
            a.add(R_ABASE, x[0], R_AOFF)
            a.mov(R_BITER, x[1])
        else:
            a.mov(R_AITER, x[3] if kind == "offset" else x[0])
            if kind == "address":
                a.mov(R_BITER, x[1])
        a.mov(R_BATCH, R_CNT)
        top = a.label("batch")
        a.bind(top)
        if kind == "stride":
            a.add(R_BPTR, R_BITER, R_J, LSL(col_shift))
        elif kind == "offset":
            a.ldp(R_T, R_K, post(R_AITER, 16))
            a.add(R_ABASE, x[0], R_T, LSL(shift))
            a.add(R_ABASE, R_ABASE, R_AOFF)
            a.add(R_T, x[1], R_K, LSL(shift))
            a.add(R_BPTR, R_T, R_J, LSL(col_shift))
        else:
            a.ldr(R_T, post(R_AITER, 8))
            a.add(R_ABASE, R_T, R_AOFF)
            a.ldr(R_T, post(R_BITER, 8))
            a.add(R_BPTR, R_T, R_J, LSL(col_shift))
        a.mov(ROW_PTRS[0], R_ABASE)
        for r in range(1, rows):
            a.add(ROW_PTRS[r], ROW_PTRS[r - 1], R_LDA)
        self.k_loop(rows, t)
        if kind == "stride":
            add_imm(a, R_ABASE, R_ABASE, self.stride_a * self.dt.esize, R_T)
            add_imm(a, R_BITER, R_BITER, self.stride_b * self.dt.esize, R_T)
        a.subs(R_BATCH, R_BATCH, 1)
        a.b_ne(top)

    # ---- bf16 k tail: bfmlalb multiplies only the first of each pair (the padding is never used)
    def group(self, rows: int, t: int, offset: int, partial: bool = False) -> None:
        if not (partial and self.dt.name == "bf16" and not self.mmla):
            return super().group(rows, t, offset, partial)
        a = self.a
        bvec = self.load_b(t)
        for r in range(rows):
            za = z[self.a_base + r % 4]
            add_imm(a, R_T, ROW_PTRS[r], offset, R_T)
            a.ld1rh(za.h, P_ALL.z, mem(R_T))
            for v in range(len(bvec)):
                a.bfmlalb(self.acc(r, v), za.h, bvec[v].h)

    # ---- C in and out, with the epilogue
    def _free(self, rows, t):
        used = {self.acc(r, v).num for r in range(rows) for v in range(t)}
        return [z[i] for i in range(32) if i not in used]

    def c_access(self, rows: int, t: int, load: bool) -> None:
        if self.mmla:
            return super().c_access(rows, t, load)
        a = self.a
        if load and not self.beta:
            for r in range(rows):
                for v in range(t):
                    a.dup(self.acc(r, v), 0)
            return
        free = self._free(rows, t)
        zbias = [free.pop(0).s for _ in range(t)] if (self.bias and not load) else []
        if zbias:
            a.add(R_T, R_BIAS, R_J, LSL(2))
            for v in range(t):
                a.ld1w(zbias[v], p[v].z, vl(R_T, v))
        ctx = None
        if not load and self.act is not None:
            zdst = free.pop(0).s
            ntmp = NTMP.get(self.act, 0) if self.transcendental else 0
            tmps = [free.pop(0).s for _ in range(ntmp)]
            if self.transcendental:
                self.c.scratch = [free.pop(0).s, free.pop(0).s]
            ctx = (zdst, tmps)
        a.add(R_T, R_CROW, R_J, LSL(2 if self.c_bytes == 4 else 1))
        for r in range(rows):
            for v in range(t):
                acc = self.acc(r, v)
                if load:
                    if self.c_bytes == 4:
                        a.ld1w(acc, p[v].z, vl(R_T, v))
                    else:
                        a.ld1h(acc, p[v].z, vl(R_T, v))
                        a.lsl(acc, acc, 16)
                    continue
                res = self.finish(acc, zbias[v] if zbias else None, ctx)
                if self.c_bytes == 4:
                    a.st1w(res, p[v], vl(R_T, v))
                else:
                    a.bfcvt(z[res.num].h, P_ALL.m, res)
                    a.st1h(res, p[v], vl(R_T, v))
            if r < rows - 1:
                a.add(R_T, R_T, R_LDC)

    def finish(self, acc, zbias, ctx):
        a = self.a
        if zbias is not None:
            a.fadd(acc, acc, zbias)
        if self.act is None:
            return acc
        zdst, tmps = ctx
        if self.act == "relu":
            if self.dt.name == "f32" or self.dt.c_np == "float32":
                a.fmax(acc, P_ALL.m, acc, 0.0)
            else:                                   # int32 C
                a.dup(zdst, 0)
                a.cmpgt(P_MATH.s, P_ALL.z, acc, zdst)
                a.sel(acc, P_MATH, acc, zdst)
            return acc
        EMITTERS[self.act][1](a, zdst, acc, tmps, self.c)
        return zdst


def _need_regs(d):
    if d.act in (None, "relu"):
        return (4 if d.bias else 0) + (1 if d.act else 0)
    return (4 if d.bias else 0) + 1 + NTMP[d.act] + 2


def generate(desc, kernel=None) -> bytes:
    """Machine code for a Brgemm descriptor (see the module docstring); ``kernel`` overrides the
    choice of microkernel ("indexed", "dot" or "mmla")."""
    d = desc
    sdt = SVE_DTYPE[d.dtype]
    if d.dtype == "i8":
        if d.signs not in INT8_SVE:
            raise ValueError(f"brgemm on sve: signs={d.signs!r} is not supported; use one of "
                             f"{', '.join(map(repr, INT8_SVE))} (swap the roles of A and B for 'su')")
        sdt = INT8_SVE[d.signs]
    if kernel is None and getattr(d, "layout", "vnni") == "sve_mmla":
        kernel = "mmla"
    if kernel is None:
        kernel = ("indexed" if d.k >= 4 else "dot") if d.dtype == "f32" else "dot"
    pl = plan(d.m, d.n, sdt, kernel)
    if kernel != "mmla":                           # at store time every non-accumulator is free
        while pl.mr > 1 and 32 - pl.mr * pl.nv < _need_regs(d):
            pl = replace(pl, mr=pl.mr - 1)
    f = DTYPES[sdt].group
    if kernel == "mmla":
        ldb = d.ldb * MMLA_GROUP[sdt] if f > 1 else d.ldb
    else:
        ldb = d.ldb * f
    gen = _DescGen(d.m, d.n, d.k, d.lda, ldb, d.ldc, 1, d.stride_a, d.stride_b, d.beta, d.batch, DTYPES[sdt], pl)
    nops = len(d.operands())
    gen.setup_desc(d, nops)
    return gen.build()


@dataclass(frozen=True)
class MmlaBrgemm(Brgemm):
    """A Brgemm whose B uses the SVE MMLA layout (``layout="sve_mmla"``, bf16 / i8 only, f32 /
    int32 C, no bias or act): B block ``(ceil(k/g), 2*ceil(n/2), g)`` with g = 4 (bf16) or 8 (i8),
    see :func:`tppasm.sve.brgemm.pack_b_mmla`; ``ldb`` counts columns (>= 2*ceil(n/2)). Unlike the
    VNNI layout, the k padding of the last group is multiplied by zeros, so it must be finite
    (``pack_b_mmla`` writes zeros).

    >>> d = MmlaBrgemm(m=2, n=3, k=5, dtype="bf16")
    >>> d.block_specs()[1].shape
    (2, 4, 4)
    """

    layout: str = "sve_mmla"

    def __post_init__(self):
        self._normalize()
        if not self.ldb and isinstance(self.n, int):
            object.__setattr__(self, "ldb", 2 * ceil_div(self.n, 2))
        if not self.stride_b and isinstance(self.k, int) and self.dtype in ("bf16", "i8"):
            g = MMLA_GROUP[SVE_DTYPE[self.dtype]]
            object.__setattr__(self, "stride_b", ceil_div(self.k, g) * g * (self.ldb or 2 * ceil_div(self.n, 2)))
        super().__post_init__()

    def dense_strides(self):
        g = self.mmla_group
        return self.m * self.lda, ceil_div(self.k, g) * g * self.ldb

    @property
    def mmla_group(self):
        if self.dtype not in ("bf16", "i8"):        # (operands() asks before validate() would refuse it)
            raise ValueError(f"MmlaBrgemm: dtype={self.dtype!r}; expected 'bf16' or 'i8' (for f32, use tppasm.brgemm)")
        return MMLA_GROUP[SVE_DTYPE[self.dtype]]

    def validate(self):
        super().validate()
        if self.layout != "sve_mmla":           # (any other would read B as the dot kernels' layout)
            raise ValueError(f"MmlaBrgemm: layout={self.layout!r}; expected 'sve_mmla' (its B layout: pack B with the "
                             "descriptor's mmla_pack(b)); for a VNNI-packed B, use tppasm.brgemm")
        if self.dtype not in ("bf16", "i8") or self.bias or self.act or self.c_dtype not in ("f32", "i32"):
            raise ValueError("MmlaBrgemm: dtype 'bf16' or 'i8', f32/i32 C, no bias/act")
        if self.dtype == "i8" and self.signs not in INT8_SVE:
            raise ValueError(f"MmlaBrgemm: signs={self.signs!r} is not supported; use one of "
                             f"{', '.join(map(repr, INT8_SVE))} (swap the roles of A and B for 'su')")

    def block_specs(self):
        g = self.mmla_group
        a, _ = super().block_specs()
        b_dtype = INT8_DTYPE[self.signs[1]] if self.dtype == "i8" else self.dtype      # "uu": u8 B, as Brgemm's
        b = OperandSpec("b", b_dtype, (ceil_div(self.k, g), self.ldb, g),
                        (self.ldb * g, g, 1), ld_name="")
        return a, b

    def compute(self, a_blocks, b_blocks, c, bias=None):
        nat = [np.swapaxes(b, -1, -2).reshape(-1, self.ldb)[:self.k, :self.n] for b in b_blocks]
        exact = self.dtype == "i8"
        wide = np.int64 if exact else np.float64
        acc = c.astype(wide) if self.beta else np.zeros(c.shape, wide)
        for ai, bi in zip(a_blocks, nat):
            acc += ai.astype(wide) @ bi.astype(wide)
        if exact:
            acc = ((acc + 2 ** 31) % 2 ** 32 - 2 ** 31)
        return acc.astype(c.dtype)

    def mmla_pack(self, b):
        """B (k, n) -> this descriptor's B block."""
        return pack_b_mmla(b, self.mmla_group)


register_sve(generate, "brgemm")
