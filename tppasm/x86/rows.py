"""Building blocks of row-wise x86 kernels (softmax, layer norm, RMSNorm, rotary, quantization): a
loop over rows, a walk over the columns of a row in blocks of U vectors, addressing, horizontal
reductions that leave the result in every lane, masking of the tail vector's lanes, and the
hand-out of vector registers (the ones left over hold constants).

A column walk emits a loop over whole blocks of U vectors (index register ``IDX`` in elements, so
one register addresses operands of any element size), then the remaining vectors and the masked
tail with constant displacements; ``vector(u, col, idx, tail)`` emits the work of one vector.

>>> from tppasm.x86.vector import VectorISA
>>> from isa.x86 import Function
>>> fn = Function("nop", []); cols = []
>>> walk(fn.asm, VectorISA("avx2"), 20, 2, lambda u, col, idx, tail: cols.append((col, tail)), tail="t")
>>> cols
[(0, None), (8, None), (16, 't')]
"""
from isa.x86 import ptr, r10, r11, word

from . import math as xm
from .stream import make_tail

IDX, ROWS = r11, r10


def at(stream, col, idx):
    """The ``mem_at(i, es, size=None)`` address function of ``stream``'s element ``col + i``."""
    def mem_at(i, es, size=None):
        disp = (col + i) * stream.es
        expr = stream.reg + disp if idx is None else stream.reg + idx * stream.es + disp
        return word[expr] if size == 2 else ptr(expr)
    return mem_at


def walk(a, v, n, unroll, vector, tail=None, idx=IDX):
    """Emit ``vector(u, col, idx, t)`` over the n columns of a row: a loop over blocks of ``unroll``
    full vectors when there are at least 2 blocks, then the rest, then the tail (``t`` = ``tail``
    for the last, partial vector; None for full ones). ``col`` is relative to ``idx`` (None: 0)."""
    lanes = v.lanes(4)
    nfull = n // lanes
    done, base = 0, None
    if nfull >= 2 * unroll:
        blocks = nfull // unroll
        a.xor(idx, idx)
        loop = a.label()
        a.bind(loop)
        for u in range(unroll):
            vector(u, u * lanes, idx, None)
        a.add(idx, unroll * lanes)
        a.cmp(idx, blocks * unroll * lanes)
        a.jb(loop)
        done, base = blocks * unroll, idx
    for j in range(done, nfull):
        vector((j - done) % unroll, (j - done) * lanes, base, None)
    if n % lanes:
        vector((nfull - done) % unroll, (nfull - done) * lanes, base, tail)


# "max_bits": the maximum of non-negative floats compared as int32 bit patterns, where a NaN's bits
# exceed inf's and inf's exceed every finite value's: unlike vmaxps (which returns its second
# operand when either is NaN, so a running maximum forgets a NaN), a NaN anywhere wins.
LANE_OPS = {"add": "vaddps", "max": "vmaxps", "max_bits": "vpmaxsd"}


def hreduce(a, v, acc, tmp, op):
    """acc = op over its lanes (op "add", "max" or "max_bits": see LANE_OPS), in every lane."""
    f = getattr(a, LANE_OPS[op])
    if v.avx512:
        a.vshuff64x2(tmp, acc, acc, 0x4E)
        f(acc, acc, tmp)
        a.vshuff64x2(tmp, acc, acc, 0xB1)
    else:
        a.vperm2f128(tmp, acc, acc, 0x01)
    f(acc, acc, tmp)
    a.vshufps(tmp, acc, acc, 0x4E)
    f(acc, acc, tmp)
    a.vshufps(tmp, acc, acc, 0xB1)
    f(acc, acc, tmp)


def combine(a, accs, op):
    """accs[0] = op of all ``accs`` (lane by lane; op as for :func:`hreduce`)."""
    f = getattr(a, LANE_OPS[op])
    for r in accs[1:]:
        f(accs[0], accs[0], r)


def zero_tail(a, v, reg, tail):
    """Zero the lanes of ``reg`` past the tail's count (no-op for full vectors)."""
    if tail is None:
        return
    if v.avx512:
        a.vmovaps(reg.mask(tail.k, zero=True), reg)
    else:
        a.vandps(reg, reg, tail.ymask)


def fill_tail(a, v, reg, tail, value_reg, k=xm.K7):
    """Lanes of ``reg`` past the tail's count become ``value_reg``'s (``k``: an opmask clobbered)."""
    if tail is None:
        return
    if v.avx512:
        a.knotw(k, tail.k)
        a.vmovaps(reg.mask(k), value_reg)
    else:
        a.vblendvps(reg, value_reg, reg, tail.ymask)


def next_row(a, streams):
    """Advance the pointer of every (m, n) stream to its next row."""
    for s in streams:
        a.add(s.reg, s.ld * s.es)


class Regs:
    """Vector registers handed out in order; the rest become constant registers."""

    def __init__(self, fn, v, n):
        self.v, self.free = v, list(range(v.nregs))
        self.tail = make_tail(fn, v, n % v.lanes(4), self.free)

    def take(self, k):
        out, self.free = [self.v.reg(r) for r in self.free[:k]], self.free[k:]
        return out

    def consts(self):
        return xm.Consts(self.v, [self.v.reg(r) for r in self.free])


def row_loop(a, m, emit_row, streams, scalars=()):
    """Emit ``for each of m rows: emit_row(); advance streams`` (and the fp32 per-row ``scalars``
    pointers by one element)."""
    a.mov(ROWS, m)
    top = a.label()
    a.bind(top)
    emit_row()
    next_row(a, streams)
    for reg in scalars:
        a.add(reg, 4)
    a.dec(ROWS)
    a.jnz(top)
