"""SVE code for the row-wise normalizations of :mod:`tppasm.norm`: softmax (scale, row or full
mask), layer norm and RMSNorm. Arguments as the descriptor's ``operands()``: x0 = x, then the mask
or gamma (and beta), then out.

Each row is read in passes, two vectors (``cntw`` lanes each) per step under ``whilelo``
predicates, so the code is correct at every vector length. Sums and maxima accumulate with
merging predicates (tail lanes keep 0 or -inf) and finish with ``faddv`` / ``fmaxv``. Softmax takes
the row maximum of ``scale*x + mask``, then sums ``exp(. - max)`` (writing the exponentials when
the output is fp32), then scales by 1/sum (a bf16 output recomputes the exponentials rather than
rounding twice); layer norm takes the mean (as x0 + sum(x - x0) / n: exact for a row of equal
values), then the variance around it (two passes: no cancellation), then writes
``(x - mean) * rstd * gamma + beta``; RMSNorm the mean square, then ``x * rstd * gamma``. rstd is
``fsqrt`` and ``fdiv``, not an estimate. The output may be the input: every pass that writes a
vector of the row has read it first, and earlier passes only read. bf16 is widened with ``ld1h`` +
``lsl #16`` and narrowed with ``bfcvt`` (round to nearest even).

>>> from tppasm.norm import LayerNorm, Softmax
>>> from isa.aarch64 import disassemble
>>> text = disassemble(generate(LayerNorm(3, 10, dtype="bf16")))
>>> all(op in text for op in ("faddv", "fsqrt", "fdiv", "bfcvt"))
True
>>> "fmaxv" in disassemble(generate(Softmax(2, 33, mask="row", scale=0.125)))
True
"""
from __future__ import annotations

from dataclasses import dataclass

from isa.aarch64 import Function, mem, p, v, x, z

from .math import Consts, emit_exp
from .raw import register_sve
from .rowwise import P_ALL, P_LANE, R_N, U, load, row_loop, store, walk_columns

__all__ = ["generate"]

P_TMP = p[5]
R_POOL = x[8]
STREAM_REGS = (x[14], x[15], x[16], x[17], x[7])      # clear of :mod:`.rowwise`'s x9-x13
NEG_INF = float("-inf")


@dataclass
class Stream:
    """One operand: its pointer register, dtype and the bytes to its next row (0: shared by rows)."""
    reg: object
    dtype: str
    row_bytes: int


class _Rows:
    """Code-emitting helpers shared by the three kernels: vector registers handed out in order,
    constants, loads and stores of one step's vectors, the column walk and the row loop."""

    def __init__(self, desc):
        self.d = desc
        self.f = Function(nargs=len(desc.operands()))
        self.a = self.f.asm
        self._free = list(range(32))

    def take(self, count):
        """``count`` fresh vector registers (``.s`` views)."""
        regs, self._free = self._free[:count], self._free[count:]
        return [z[i].s for i in regs]

    def streams(self, *specs):
        """Stream per (dtype, ld) in argument order (ld None: one row shared by every row); the
        arguments are copied from x0, x1, ... into the stream registers."""
        out = []
        for i, (dtype, ld) in enumerate(specs):
            es = 4 if dtype == "f32" else 2
            out.append(Stream(STREAM_REGS[i], dtype, ld * es if ld else 0))
            self.a.mov(STREAM_REGS[i], x[i])
        return out

    def start(self):
        """The all-true predicate, the constants (every register not taken yet) and n."""
        scratch, resident = self._free[:2], self._free[2:]
        self.c = Consts(self.a, R_POOL, [z[i] for i in resident], [z[i] for i in scratch], P_ALL, P_TMP)
        self.a.ptrue(P_ALL.s)
        self.c.setup()
        self.a.mov_imm(R_N, self.d.n)

    def finish(self) -> bytes:
        """Return, the constant pool, and the function's code."""
        self.f.ret()
        self.c.pool()
        return self.f.code()

    # -- memory and loops (:mod:`.rowwise`)
    def load(self, s, dst, u):
        """dst = vector u of this step of stream ``s`` in fp32 (inactive lanes 0)."""
        return load(self.a, s.dtype, dst, u, s.reg)

    def store(self, s, val, u):
        """Vector u of this step of stream ``s`` = val (rounded to bf16 in place for a bf16 stream)."""
        store(self.a, s.dtype, val, u, s.reg)

    def walk(self, step):
        """Call ``step(u)`` for both vectors of each step along the row (predicates P_LANE[u])."""
        walk_columns(self.a, step)

    def row_loop(self, row, streams):
        """Emit ``row()`` once per row, each stream's pointer moving to its next row after it."""
        row_loop(self.a, self.d.m, row, [(s.reg, s.row_bytes) for s in streams if s.row_bytes])

    # -- reductions
    def fill(self, regs, value):
        """Every lane of ``regs`` = ``value`` (an accumulator's identity)."""
        for r in regs:
            if value == 0:
                self.a.dup(r, 0)
            else:
                self.c.load(r, value)

    def across(self, acc, op, dst):
        """dst = op ("add" or "max") over every lane of acc[0] and acc[1], in every lane."""
        a = self.a
        lanewise, whole = (a.fadd, a.faddv) if op == "add" else (a.fmax, a.fmaxv)
        lanewise(acc[0], P_ALL.m, acc[0], acc[1])
        whole(v[acc[0].num].s, P_ALL, acc[0])
        a.dup(dst, z[acc[0].num].s[0])

    def rstd(self, acc, dst):
        """dst = 1 / sqrt(sum of acc's lanes / n + eps) in every lane (a true square root and divide)."""
        a, c = self.a, self.c
        self.across(acc, "add", dst)
        a.fmul(dst, dst, c.f(1.0 / self.d.n))
        a.fadd(dst, dst, c.f(self.d.eps))
        a.fsqrt(dst, P_ALL.m, dst)
        a.fdivr(dst, P_ALL.m, dst, c.f(1.0))


# -- softmax ------------------------------------------------------------------------------------
def generate_softmax(d) -> bytes:
    """Softmax over each row of ``scale * x (+ mask)`` (see the module docstring)."""
    k = _Rows(d)
    a = k.a
    specs = [(d.dtype, d.ldi)]
    if d.mask:
        specs.append(("f32", d.ldm if d.mask == "full" else None))
    xs, *mask, out = k.streams(*specs, (d.out_dtype, d.ldo))
    mask = mask[0] if mask else None
    acc, y, e, (mx, inv) = k.take(U), k.take(U), k.take(U), k.take(2)
    tmp = [k.take(2) for _ in range(U)]
    k.start()
    c = k.c

    def logits(u):
        """y[u] = scale * x (+ mask) of vector u (e[u] is clobbered)."""
        k.load(xs, y[u], u)
        if d.scale != 1.0:
            a.fmul(y[u], y[u], c.f(d.scale))
        if mask:
            a.fadd(y[u], y[u], k.load(mask, e[u], u))
        return y[u]

    def exp(u):
        """e[u] = exp(logits - max) of vector u."""
        a.fsub(y[u], logits(u), mx)
        emit_exp(a, e[u], y[u], tmp[u], c)
        return e[u]

    def maximum(u):
        a.fmax(acc[u], P_LANE[u].m, acc[u], logits(u))

    def exp_sum(u):
        a.fadd(acc[u], P_LANE[u].m, acc[u], exp(u))
        if out.dtype == "f32":
            k.store(out, e[u], u)

    def normalize(u):
        val = k.load(out, y[u], u) if out.dtype == "f32" else exp(u)
        a.fmul(val, val, inv)
        k.store(out, val, u)

    def row():
        k.fill(acc, NEG_INF)
        k.walk(maximum)
        k.across(acc, "max", mx)
        k.fill(acc, 0)
        k.walk(exp_sum)
        k.across(acc, "add", inv)
        a.fdivr(inv, P_ALL.m, inv, c.f(1.0))
        k.walk(normalize)

    k.row_loop(row, [xs, out] + ([mask] if d.mask == "full" else []))
    return k.finish()


# -- layer norm ---------------------------------------------------------------------------------
def generate_layernorm(d) -> bytes:
    """(x - mean) / sqrt(var + eps) * gamma + beta over each row (see the module docstring)."""
    k = _Rows(d)
    a = k.a
    xs, gamma, beta, out = k.streams((d.dtype, d.ldi), ("f32", None), ("f32", None), (d.out_dtype, d.ldo))
    acc, val, g, b, (mean, rstd) = k.take(U), k.take(U), k.take(U), k.take(U), k.take(2)
    k.start()

    def total(u):
        a.fadd(acc[u], P_LANE[u].m, acc[u], centered(u))

    def centered(u):
        """val[u] = x - mean (the tail's lanes too: keep them out of sums with the predicate)."""
        a.fsub(val[u], k.load(xs, val[u], u), mean)
        return val[u]

    def squares(u):
        dev = centered(u)
        a.fmla(acc[u], P_LANE[u].m, dev, dev)

    def write(u):
        dev = centered(u)
        a.fmul(dev, dev, rstd)
        a.fmad(dev, P_ALL.m, k.load(gamma, g[u], u), k.load(beta, b[u], u))
        k.store(out, dev, u)

    def row():
        # mean = x0 + sum(x - x0) / n: exact for a row of equal values (whose sum, and 1/n, would round)
        if d.dtype == "f32":
            a.ld1rw(mean, P_ALL.z, mem(xs.reg))
        else:
            a.ld1rh(mean, P_ALL.z, mem(xs.reg))
            a.lsl(mean, mean, 16)
        k.fill(acc, 0)
        k.walk(total)
        k.across(acc, "add", val[0])
        a.fmla(mean, P_ALL.m, val[0], k.c.f(1.0 / d.n))
        k.fill(acc, 0)
        k.walk(squares)
        k.rstd(acc, rstd)
        k.walk(write)

    k.row_loop(row, [xs, out])
    return k.finish()


# -- RMSNorm ------------------------------------------------------------------------------------
def generate_rmsnorm(d) -> bytes:
    """x / sqrt(mean(x**2) + eps) * gamma over each row (see the module docstring)."""
    k = _Rows(d)
    a = k.a
    xs, gamma, out = k.streams((d.dtype, d.ldi), ("f32", None), (d.out_dtype, d.ldo))
    acc, val, g, (rstd,) = k.take(U), k.take(U), k.take(U), k.take(1)
    k.start()

    def squares(u):
        sq = k.load(xs, val[u], u)
        a.fmla(acc[u], P_LANE[u].m, sq, sq)

    def write(u):
        y = k.load(xs, val[u], u)
        a.fmul(y, y, rstd)
        a.fmul(y, y, k.load(gamma, g[u], u))
        k.store(out, y, u)

    def row():
        k.fill(acc, 0)
        k.walk(squares)
        k.rstd(acc, rstd)
        k.walk(write)

    k.row_loop(row, [xs, out])
    return k.finish()


GENERATORS = {"softmax": generate_softmax, "layernorm": generate_layernorm, "rmsnorm": generate_rmsnorm}


def generate(desc) -> bytes:
    """Machine code for a Softmax, LayerNorm or RMSNorm descriptor."""
    return GENERATORS[desc.kind](desc)


for _kind, _generate in GENERATORS.items():
    register_sve(_generate, _kind)
