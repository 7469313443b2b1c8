"""SVE code for the element-wise descriptors of :mod:`tppasm.eltwise`: Unary (incl. ``*_bwd`` and
relu bitmasks), Binary (broadcasts, ``post``) and Ternary (muladd).

Same arguments as the descriptor's ``operands()`` (AAPCS64: x0, x1, ... = data pointers in that
order). Each row is walked two vectors at a time (``cntw`` lanes each, ``whilelo`` tails), so the
code is correct at every vector length. bf16 operands are widened with ``ld1h`` + ``lsl #16`` and
narrowed with ``bfcvt`` (round to nearest even). The relu bitmask is built from the compare
predicates: ``uzp1`` packs the two ``.s`` predicates into one bit per element, ``str p`` writes
those bits to the stack and a ``whilelo``-masked ``st1b`` copies the ceil(n/8)-byte row out (and
``ldr p`` + ``punpklo/hi`` undo it for relu_bwd), so no byte outside the mask row is touched.

>>> from tppasm.eltwise import Binary
>>> "fadd" in disassemble(generate(Binary("add", 3, 5, bcast_b="row")))
True
"""
from __future__ import annotations

from dataclasses import dataclass

from isa.aarch64 import Function, disassemble, mem, p, sp, vl, x, z

from .common import add_imm
from .math import EMITTERS, NTMP, Consts, mov
from .raw import register_sve

__all__ = ["generate", "disassemble"]

U = 2                                             # vectors per iteration
P_LANE, P_CMP, P_PACK, P_TMP, P_BYTES, P_ALL = (p[0], p[1]), (p[2], p[3]), p[4], p[5], p[6], p[7]
R_N, R_J, R_T, R_ROWS, R_POOL, R_B, R_NB, R_S = x[13], x[14], x[15], x[16], x[17], x[8], x[7], x[6]
STREAM_REGS = (x[9], x[10], x[11], x[12])
BINARY_EMIT = {"add": "fadd", "sub": "fsub", "mul": "fmul", "div": "fdiv", "max": "fmax", "min": "fmin"}
PREDICATED = ("div", "max", "min")                # only a predicated, destructive form exists


@dataclass
class Stream:
    """One operand walked row by row: its pointer register, dtype and broadcast."""
    reg: object
    dtype: str
    bcast: str | None
    row_bytes: int
    zb: object = None                             # register holding a col/scalar broadcast

    @property
    def shift(self):
        return 2 if self.dtype == "f32" else 1


def _stream(reg, dtype, bcast, ld):
    es = 4 if dtype == "f32" else 2
    step = {None: ld * es, "row": 0, "col": es, "scalar": 0}[bcast]
    return Stream(reg, dtype, bcast, step)


class _Elt:
    def __init__(self, desc):
        self.d = desc
        self.kind = desc.kind
        self.mask_in = self.mask_out = False
        d = desc
        regs = iter(STREAM_REGS)
        if d.kind == "unary":
            self.op = d.op
            if d.op == "zero":
                self.ins, self.out = [], _stream(next(regs), d.out_dtype, None, d.ldo)
            elif d.op.endswith("_bwd"):
                dy = _stream(next(regs), d.dtype, None, d.ldi)
                if d.bitmask:
                    self.mask_in = True
                    self.mask = Stream(next(regs), "u8", None, d.mask_bytes)
                    self.ins = [dy]
                else:
                    self.ins = [dy, _stream(next(regs), d.dtype, None, d.ldi)]
                self.out = _stream(next(regs), d.out_dtype, None, d.ldo)
            else:
                self.ins = [_stream(next(regs), d.dtype, None, d.ldi)]
                self.out = _stream(next(regs), d.out_dtype, None, d.ldo)
                if d.bitmask:
                    self.mask_out = True
                    self.mask = Stream(next(regs), "u8", None, d.mask_bytes)
            self.post = None
        else:
            self.op = d.op
            lds = (d.lda, d.ldb, d.ldo if d.kind == "binary" else d.ldc)
            self.ins = [_stream(next(regs), d.dtype, d.bcast_a, lds[0]),
                        _stream(next(regs), d.dtype, d.bcast_b, lds[1])]
            self.out = _stream(next(regs), d.out_dtype, None, lds[2])
            self.post = getattr(d, "post", None)
        self.nargs = len(desc.operands())

    # ---- registers
    def _ntmp(self):
        if self.kind != "unary":
            return NTMP[self.post] if self.post else 0
        return NTMP.get(self.op, 0)

    def _alloc(self):
        free = list(range(32))
        take = lambda: z[free.pop(0)]                       # noqa: E731
        self.X = [take() for _ in range(U)]
        self.Y = [take() for _ in range(U)]
        self.D = [take() for _ in range(U)]
        nt = self._ntmp()
        self.T = [[take().s for _ in range(nt)] for _ in range(U)]
        for s in self.ins:
            if s.bcast in ("col", "scalar"):
                s.zb = take().s
        scratch = [take(), take()]
        self.c = Consts(self.f.asm, R_POOL, [z[i] for i in free], scratch, P_ALL, P_TMP)

    # ---- memory
    def load(self, s, dst, u):
        a, idx = self.a, (R_J, R_T)[u]
        if s.bcast in ("col", "scalar"):
            return s.zb
        if s.dtype == "f32":
            a.ld1w(dst.s, P_LANE[u].z, mem(s.reg, idx, lsl=2))
        else:
            a.ld1h(dst.s, P_LANE[u].z, mem(s.reg, idx, lsl=1))
            a.lsl(dst.s, dst.s, 16)
        return dst.s

    def load_bcast(self, s):
        a = self.a
        if s.dtype == "f32":
            a.ld1rw(s.zb, P_ALL.z, mem(s.reg))
        else:
            a.ld1rh(s.zb, P_ALL.z, mem(s.reg))
            a.lsl(s.zb, s.zb, 16)

    def store(self, res, u):
        a, idx, s = self.a, (R_J, R_T)[u], self.out
        if s.dtype == "f32":
            a.st1w(res, P_LANE[u], mem(s.reg, idx, lsl=2))
        else:
            a.bfcvt(z[res.num].h, P_ALL.m, res)
            a.st1h(res, P_LANE[u], mem(s.reg, idx, lsl=1))

    # ---- code
    def build(self) -> bytes:
        d = self.d
        self.f = Function(nargs=self.nargs, frame=256 if (self.mask_in or self.mask_out) else 0)
        a = self.a = self.f.asm
        self._alloc()
        all_streams = self.ins + [self.out] + ([self.mask] if (self.mask_in or self.mask_out) else [])
        # pointers arrive in operand order: inputs, (mask in), out, (mask out) -- as in operands()
        order = list(self.ins)
        if self.mask_in:
            order.append(self.mask)
        order.append(self.out)
        if self.mask_out:
            order.append(self.mask)
        for i, s in enumerate(order):
            a.mov(s.reg, x[i])
        a.ptrue(P_ALL.s)
        if self.mask_in or self.mask_out:
            a.ptrue(P_BYTES.b)
            a.mov_imm(R_NB, d.mask_bytes)
        self.c.setup()
        a.mov_imm(R_N, d.n)
        a.mov_imm(R_ROWS, d.m)
        for s in self.ins:
            if s.bcast == "scalar":
                self.load_bcast(s)
        rows, cols = a.label("rows"), a.label("cols")
        a.bind(rows)
        for s in self.ins:
            if s.bcast == "col":
                self.load_bcast(s)
        a.mov(R_J, 0)
        a.bind(cols)
        a.mov(R_T, R_J)
        for u in range(U):
            a.whilelo(P_LANE[u].s, R_T, R_N)
            if u < U - 1:
                a.incw(R_T)
        if self.mask_in:
            self.mask_to_predicates()
        for u in range(U):
            self.store(self.compute(u), u)
        if self.mask_out:
            self.predicates_to_mask()
        a.incw(R_J, "all", U)
        a.cmp(R_J, R_N)
        a.b_lo(cols)
        for s in all_streams:
            if s.row_bytes:
                add_imm(a, s.reg, s.reg, s.row_bytes, R_S)
        a.subs(R_ROWS, R_ROWS, 1)
        a.b_ne(rows)
        self.f.ret()
        self.c.pool()
        return self.f.code()

    def compute(self, u):
        """Load vector u's inputs, compute, return the result register (``.s``)."""
        a, c, op = self.a, self.c, self.op
        X, Y, D, T = self.X[u].s, self.Y[u].s, self.D[u].s, self.T[u]
        if self.kind == "unary":
            if op == "zero":
                a.dup(D, 0)
                return D
            xs = self.load(self.ins[0], X, u)
            if op in ("copy", "identity"):
                return xs
            if op == "relu_bwd":
                if self.mask_in:
                    a.sel(D, self.PV[u], xs, c.f(0.0))
                else:
                    ys = self.load(self.ins[1], Y, u)
                    a.fcmle(P_CMP[u].s, P_ALL.z, ys, 0.0)
                    a.sel(D, P_CMP[u], c.f(0.0), xs)        # 0 where x <= 0 (an inf or NaN dy too), else dy
                return D
            if op.endswith("_bwd"):
                ys = self.load(self.ins[1], Y, u)
                EMITTERS[op][1](a, D, ys, T, c)
                a.fmul(D, D, xs)
                return D
            EMITTERS[op][1](a, D, xs, T, c)
            if self.mask_out:
                a.fcmle(P_CMP[u].s, P_LANE[u].z, xs, 0.0)               # the row's lanes but those
                a.eor(P_CMP[u].b, P_LANE[u].z, P_CMP[u].b, P_LANE[u].b)  # <= 0: > 0 or NaN
            return D
        xs = self.load(self.ins[0], X, u)
        ys = self.load(self.ins[1], Y, u)
        if self.kind == "ternary":
            cs = self.load(self.out, D, u)
            a.fmla(cs, P_ALL.m, xs, ys)
            return cs
        name = BINARY_EMIT[op]
        if op in PREDICATED:
            mov(a, D, xs)
            a.emit(name, D, P_ALL.m, D, ys)
        else:
            a.emit(name, D, xs, ys)
        if self.post:
            EMITTERS[self.post][1](a, X, D, T, c)     # X is free once the op has read it
            return X
        return D

    def _mask_addr(self):
        self.a.lsr(R_B, R_J, 3)                     # R_J is a multiple of 2 VL/32 lanes >= 8

    def predicates_to_mask(self):
        """Bits of P_CMP[0], P_CMP[1] (not x <= 0 per lane) -> the mask bytes of this iteration."""
        a, zt = self.a, self.D[0]
        a.uzp1(P_PACK.h, P_CMP[0].h, P_CMP[1].h)    # one h element per lane of both vectors
        a.uzp1(P_PACK.b, P_PACK.b, P_PACK.b)        # one bit per lane
        a.str(P_PACK.plain, vl(sp))
        a.ld1b(zt.b, P_BYTES.z, vl(sp))
        self._mask_addr()
        a.whilelo(P_TMP.b, R_B, R_NB)
        a.st1b(zt.b, P_TMP, mem(self.mask.reg, R_B))

    def mask_to_predicates(self):
        """The mask bits of this iteration -> predicates PV[0], PV[1] (one .s lane per bit)."""
        a, zt = self.a, self.D[0]
        self._mask_addr()
        a.whilelo(P_TMP.b, R_B, R_NB)
        a.ld1b(zt.b, P_TMP.z, mem(self.mask.reg, R_B))
        a.str(zt, vl(sp))
        a.ldr(P_PACK.plain, vl(sp))
        a.punpklo(P_CMP[0].h, P_PACK.b)              # bit i -> h element i
        a.punpklo(P_CMP[1].h, P_CMP[0].b)            # -> s element i, first vector
        a.punpkhi(P_PACK.h, P_CMP[0].b)              # second vector
        self.PV = (P_CMP[1], P_PACK)


def generate(desc) -> bytes:
    """Machine code for a Unary, Binary or Ternary descriptor (see the module docstring)."""
    return _Elt(desc).build()


register_sve(generate, "unary", "binary", "ternary")
