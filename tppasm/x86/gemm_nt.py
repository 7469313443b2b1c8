"""x86 generator (AVX2, AVX-512) for :class:`tppasm.gemm_nt.GemmNT`: ``C = A @ B.T``.

Blocks of RB rows of B (outer loop) by blocks of RA rows of A (inner loop, so a block of B is
read from memory once and from the caches for the other A blocks). Per block, RA x RB fp32
accumulators walk k one vector at a time: the RA vectors of A are loaded, then each B row's
vector feeds RA FMAs (bf16: ``vdpbf16ps`` on pairs where the target has AVX512-BF16, else both
widened exactly to fp32). Every line of B is used as soon as it arrives, so B streams at the
speed of memory whatever its row stride. Each pass over a B block (one per block of A's rows)
prefetches into L2 its share of the next block's rows at the k it reads, so that the next block
arrives while this one is multiplied: without, the first pass waited on memory and the others
left it idle; prefetching all of the next block's rows in every pass took too many load slots
(AVX2: slower than none at 16 rows). Zen 4, 1 thread, against a 4096 x 4096 weight, ms without /
with: fp32 1 row 3.05-3.16 / 2.2-2.3, 8 rows 5.2-5.5 / 2.9-4.0, 16 rows 7.5-8.3 / 5.0-5.5 (96% of
the FMA peak at best); bf16 1 row 1.35-1.40 / 0.92-0.97, 8 rows 2.6-2.7 / 1.54-1.61; 16 x 11008 x
4096 10.2-11.0 / 6.8-7.0; AVX2 code, fp32 16 rows 9.1-9.5 / 7.3. A k tail loads masked lanes (zeros
beyond the row). Each accumulator is then summed across lanes and stored as one element of C
(bf16: rounded to nearest even in a general register, NaN quieted).

>>> import numpy as np, tppasm
>>> a = np.ones((2, 20), np.float32); b = np.arange(60, dtype=np.float32).reshape(3, 20)
>>> tppasm.gemm_nt(2, 3, 20)(a, b).tolist()
[[190.0, 590.0, 990.0], [190.0, 590.0, 990.0]]
"""
from isa.x86 import Function, ax, dword, eax, gpr, ptr, r8, r9, r10, r11, r12, r13, rax, rcx, vec, word

from ..backends import register
from . import brgemm
from .stream import ES, Stream, Tail, load, make_tail
from .vector import VectorISA


def blocking(m, isa):
    """(RA, RB): rows of A and of B per block, as many accumulators as the registers hold beside
    RA A vectors, two B vectors and a mask.

    >>> blocking(1, "avx512"), blocking(16, "avx512"), blocking(16, "avx2")
    ((1, 8), (4, 6), (2, 5))
    """
    nregs = 32 if isa != "avx2" else 16
    ra = min(m, 4 if isa != "avx2" else 2)
    return ra, min(8, (nregs - 3 - ra) // ra)


class _Gen:
    def __init__(self, desc, isa, features):
        self.d, self.v = desc, VectorISA(isa)
        self.fn = Function("gemm_nt", ["ptr"] * 3)
        self.a = self.fn.asm
        self.pa, self.pb, self.pc = self.fn.args      # A; B, then C, advanced block by block
        self.dp = desc.dtype == "bf16" and self.v.avx512 and "avx512_bf16" in features
        self.es, self.esc = ES[desc.dtype], ES[desc.c_dtype]
        # elements of k per vector step: bf16 pairs fill a vector for vdpbf16ps, else fp32 lanes
        self.step = self.v.bytes // 2 if self.dp else self.v.lanes(4)
        self.full, rem = divmod(desc.k, self.step)
        regs = list(range(self.v.nregs))
        if self.dp:
            self.tail = rem and Tail(rem, self.v.make_mask(self.fn, rem, es=2, k=1).reg)
        else:
            self.tail = make_tail(self.fn, self.v, rem, regs)
        self.regs = regs
        ra, rb = blocking(desc.m, isa)
        self.prefetch_rows = -(-rb // -(-desc.m // ra))      # of the next B block in each pass, at r13

    def stream(self, reg, ld):
        return Stream(reg, "full", self.d.dtype, ld)

    def load(self, dst, base, row, ld, koff, tail):
        """dst = the k vector at byte offset ``koff`` (a register or an int) of row ``row``."""
        disp = row * ld * self.es + (koff if isinstance(koff, int) else 0)
        expr = base + disp if isinstance(koff, int) else base + koff + disp
        if self.dp:
            self.a.vmovdqu16(dst.mask(tail.k, zero=True) if tail else dst, ptr(expr))
            return dst

        def at(i, es, size=None):
            return word[expr + i * es] if size == 2 else ptr(expr + i * es)
        return load(self.a, self.v, dst, self.stream(base, ld), at, tail)

    def k_step(self, acc, a_regs, b_regs, koff, tail):
        d, a = self.d, self.a
        rows_a = [self.load(a_regs[i], r8, i, d.lda, koff, tail) for i in range(len(acc))]
        for j in range(len(acc[0])):
            if tail is None and j < self.prefetch_rows:     # (past B's end too: prefetches never fault)
                a.prefetcht1([r13 + koff + j * d.ldb * self.es])
            b = self.load(b_regs[j % 2], self.pb, j, d.ldb, koff, tail)
            for i, x in enumerate(rows_a):
                if self.dp:
                    a.vdpbf16ps(acc[i][j], x, b)
                else:
                    a.vfmadd231ps(acc[i][j], x, b)

    def block(self, ra, rb):
        """C rows at r9 (ra of them), rb columns, from A rows at r8 and the B rows at pb."""
        v, a = self.v, self.a
        regs = iter(self.regs)        # A and B first: low numbers, which VEX forms can name
        a_regs = [v.reg(next(regs)) for _ in range(ra)]
        b_regs = [v.reg(next(regs)) for _ in range(2)]
        acc = [[v.reg(next(regs)) for _ in range(rb)] for _ in range(ra)]
        for row in acc:
            for r in row:
                a.vxorps(r, r, r)
        if self.full:
            a.xor(r10, r10)
            top = a.label()
            a.bind(top)
            self.k_step(acc, a_regs, b_regs, r10, None)
            a.add(r10, self.step * self.es)
            a.cmp(r10, self.full * self.step * self.es)
            a.jb(top)
        if self.tail:
            self.k_step(acc, a_regs, b_regs, self.full * self.step * self.es, self.tail)
        for i, row in enumerate(acc):
            for j, r in enumerate(row):
                self.store(self.horizontal_sum(r, *b_regs), i * self.d.ldc * self.esc + j * self.esc)

    def horizontal_sum(self, r, t, u):
        """The sum of r's fp32 lanes in lane 0 of t's xmm (t, u: scratch below 16)."""
        a, v = self.a, self.v
        x, tx = vec(128, t.num), vec(128, u.num)
        if v.avx512:
            a.vextractf64x4(v.half(t.num), r, 1)
            a.vaddps(v.half(t.num), v.half(t.num), v.half(r.num))
            a.vextractf128(tx, vec(256, t.num), 1)
            a.vaddps(x, x, tx)
        else:
            a.vextractf128(tx, r, 1)
            a.vaddps(x, vec(128, r.num), tx)
        a.vshufps(tx, x, x, 0x4E)                 # swap the 64-bit halves
        a.vaddps(x, x, tx)
        a.vmovshdup(tx, x)
        a.vaddss(x, x, tx)
        return x

    def store(self, x, disp):
        a = self.a
        if self.d.c_dtype == "f32":
            a.vmovss(dword[r9 + disp], x)
            return
        a.vmovd(eax, x)                           # round to nearest even; a NaN stays a (quiet) NaN
        t = gpr(r12.num, 32)
        a.mov(t, eax)
        a.and_(t, 0x7FFFFFFF)
        a.cmp(t, 0x7F800000)
        nan, done = a.label(), a.label()
        a.ja(nan)
        a.mov(t, eax)
        a.shr(t, 16)
        a.and_(t, 1)
        a.lea(eax, [rax + r12 + 0x7FFF])
        a.jmp(done)
        a.bind(nan)
        a.or_(eax, 0x00400000)
        a.bind(done)
        a.shr(eax, 16)
        a.mov(word[r9 + disp], ax)

    def rows_of_a(self, rb):
        """Every block of A's rows against the B block at pb, C columns at pc."""
        d, a = self.d, self.a
        ra = blocking(d.m, self.v.name)[0]
        a.lea(r13, [self.pb + rb * d.ldb * self.es])
        a.mov(r8, self.pa)
        a.mov(r9, self.pc)
        whole, rest = divmod(d.m, ra)
        if whole:
            a.mov(rcx, whole)
            top = a.label()
            a.bind(top)
            self.block(ra, rb)
            a.add(r8, ra * d.lda * self.es)
            a.add(r9, ra * d.ldc * self.esc)
            a.add(r13, self.prefetch_rows * d.ldb * self.es)
            a.dec(rcx)
            a.jnz(top)
        if rest:
            self.block(rest, rb)

    def build(self):
        d, a = self.d, self.a
        rb = blocking(d.m, self.v.name)[1]
        whole, rest = divmod(d.n, rb)
        if whole:
            a.mov(r11, whole)
            top = a.label()
            a.bind(top)
            self.rows_of_a(rb)
            a.add(self.pb, rb * d.ldb * self.es)
            a.add(self.pc, rb * self.esc)
            a.dec(r11)
            a.jnz(top)
        if rest:
            self.rows_of_a(rest)
        return self.fn.finalize()


@register("x86", "gemm_nt")
def generate_gemm_nt(desc, isa, features=None):
    """The raw kernel for ``desc`` on ``isa``; ``features`` overrides the target's (see
    the golden hashes fix them there: :func:`tppasm.x86.brgemm.target_features`)."""
    return _Gen(desc, isa, brgemm.target_features(isa) if features is None else frozenset(features)).build()
