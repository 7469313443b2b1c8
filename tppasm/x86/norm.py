"""x86 generators (AVX2, AVX-512) for the row-wise normalizations of :mod:`tppasm.norm`.

Each row is read in passes while it sits in L1: softmax takes the row maximum of ``scale*x + mask``,
then sums ``exp(. - max)`` (writing the exponentials when the output is fp32), then scales by
1/sum (a bf16 output keeps the fp32 exponentials in a stack row instead of rounding twice, up to
KEPT_MAX floats, computing them again past that, and takes the cheaper exp of bf16 results,
:func:`tppasm.x86.math.emit_exp_bf16`); a row of up to 24 vectors (384 floats; 8 on AVX2) is
instead loaded once into registers and each exp computed once (twice as fast for attention rows of
128-256 with a bf16 output; sums there are trees, not a walk, so the last bits of a row of
257-384 floats changed when the limit rose from 16); layer norm takes the
mean (as x0 + sum(x - x0) / n: exact for a row of equal values), then the variance around it
(two passes: no cancellation), then writes
``(x - mean) * rstd * gamma + beta``; RMSNorm the mean square, then ``x * rstd * gamma``. Masked
tail lanes are kept out of every sum and maximum. 1/sqrt is a true square root and division, not
an estimate.

>>> import numpy as np, tppasm
>>> x = np.array([[1.0, 2.0, 3.0]], np.float32); out = np.empty_like(x)
>>> tppasm.rmsnorm(1, 3)(x, np.ones(3, np.float32), out); bool(np.allclose(out, x / np.sqrt(14 / 3)))
True
"""
import functools

from isa.x86 import Function, ptr, r9, rsp

from ..backends import register
from . import math as xm
from .stream import Stream, broadcast_element, load, store
from . import brgemm as x86_brgemm              # target_features, looked up per call (tests fix it)
from .rows import ROWS, Regs, at, combine, fill_tail, hreduce, row_loop, walk, zero_tail
from .vector import VectorISA

def _sum_pass(a, v, n, acc, tail, load_term):
    """acc[0] = lane-wise sums over the row of ``load_term(u, col, idx, t)`` (then :func:`hreduce`)."""
    for r in acc:
        a.vxorps(r, r, r) if r.num < 16 else a.vpxord(r, r, r)

    def vector(u, col, idx, t):
        a.vaddps(acc[u], acc[u], load_term(u, col, idx, t))
    walk(a, v, n, len(acc), vector, tail)
    combine(a, acc, "add")


# vectors of a row kept in registers (AVX-512, AVX2): a row takes CACHED + 5 registers; on AVX-512
# up to 27 fit, but 25-27 left too few for the constants and ran no faster than the multi-pass route
CACHED = {True: 24, False: 8}


@register("x86", "softmax")
def generate_softmax(desc, isa):
    v = VectorISA(isa)
    fn = Function("softmax", ["ptr"] * len(desc.operands()))
    a, args = fn.asm, list(fn.args)
    x = Stream(args[0], "full", desc.dtype, desc.ldi)
    mask = Stream(args[1], desc.mask, "f32", desc.ldm) if desc.mask else None
    out = Stream(args[-1], "full", desc.out_dtype, desc.ldo)
    cvt = v.avx512 and "avx512_bf16" in x86_brgemm.target_features(isa)     # vcvtneps2bf16 for a bf16 output
    exp = functools.partial(xm.emit_exp_bf16 if desc.out_dtype == "bf16" else xm.emit_exp, nonpositive=True)
    if -(-desc.n // v.lanes(4)) <= CACHED[v.avx512]:
        return _softmax_in_registers(fn, v, desc, x, mask, out, cvt, exp)
    R = Regs(fn, v, desc.n)
    tail, U, W = R.tail, (4 if v.avx512 else 2), (2 if v.avx512 else 1)
    acc, (mx, inv) = R.take(U), R.take(2)
    work = [R.take(5) for _ in range(W)]          # src, dst and exp's 3 temporaries per vector
    flat = [r for w in work for r in w]
    c = R.consts()
    kept = out.dtype == "bf16" and _keep_exps(fn, a, v, c, desc.n)

    def logits(dst, spare, col, idx, t):
        """dst = scale * x (+ mask) for this vector (``spare`` holds the mask)."""
        load(a, v, dst, x, at(x, col, idx), t)
        if desc.scale != 1.0:
            a.vmulps(dst, dst, c.f(desc.scale))
        if mask:
            a.vaddps(dst, dst, load(a, v, spare, mask, at(mask, col, idx), t))
        return dst

    def exp_of(u, col, idx, t):
        src, dst, *tmp = work[u % W]
        logits(src, dst, col, idx, t)
        a.vsubps(src, src, mx)
        exp(a, v, dst, src, tmp, c)
        zero_tail(a, v, dst, t)
        return dst

    def row():
        for r in acc:
            c.load(a, r, c.f(float("-inf")))

        def maximum(u, col, idx, t):
            y = logits(flat[u], flat[U + u], col, idx, t)
            fill_tail(a, v, y, t, c.into(a, flat[-1], float("-inf")))
            a.vmaxps(acc[u], acc[u], y)
        walk(a, v, desc.n, U, maximum, tail)
        combine(a, acc, "max")
        hreduce(a, v, acc[0], acc[1], "max")
        a.vmovaps(mx, acc[0])

        def exp_sum(u, col, idx, t):
            e = exp_of(u, col, idx, t)
            if out.dtype == "f32":
                store(a, v, out, e, at(out, col, idx), t, work[u % W][2:], c)
            elif kept:
                a.vmovups(_kept_at(col, idx), e)
            return e
        _sum_pass(a, v, desc.n, acc[:W], tail, exp_sum)
        hreduce(a, v, acc[0], acc[1], "add")
        c.load(a, inv, c.f(1.0))
        a.vdivps(inv, inv, acc[0])

        def scale(u, col, idx, t):
            if out.dtype == "f32":
                y = load(a, v, work[u % W][1], out, at(out, col, idx), t)
            elif kept:
                y = work[u % W][1]
                a.vmovups(y, _kept_at(col, idx))
            else:
                y = exp_of(u, col, idx, t)
            a.vmulps(y, y, inv)
            store(a, v, out, y, at(out, col, idx), t, work[u % W][2:], c, cvt=cvt)
        walk(a, v, desc.n, W, scale, tail)

    row_loop(a, desc.m, row, [x, out] + ([mask] if desc.mask == "full" else []))
    c.finish(fn, scratch=acc[0])
    return fn.finalize()


KEPT_MAX = 2048     # longest row (floats) whose exponentials a bf16 softmax keeps on the stack (8 KiB:
                    # a Python thread's stack may be as small as 32 KiB)
KEPT = r9                           # the stack row of the exponentials, 64-byte aligned


def _keep_exps(fn, a, v, c, n):
    """Reserve a stack row of ``n`` fp32 exponentials (at KEPT) for the multi-pass softmax with a
    bf16 output: its exp pass stores them there and its scale pass reads them back, bit for bit what
    computing them again gave, at a load instead of an exp per vector. False (computed twice)
    past KEPT_MAX floats."""
    if n > KEPT_MAX:
        return False
    size = 128 + 4 * (n + v.lanes(4))               # a tail vector is stored whole
    fn.stack(size)
    c.after(size)                                   # the constants' stack table goes past the row
    a.lea(KEPT, [rsp + 64 + 63])
    a.and_(KEPT, -64)
    return True


def _kept_at(col, idx):
    """The stack row's vector at element ``col`` (past ``idx`` elements, a register or None)."""
    return ptr(KEPT + col * 4 if idx is None else KEPT + idx * 4 + col * 4)


def _softmax_in_registers(fn, v, desc, x, mask, out, cvt, exp):
    """Softmax of rows that fit in registers: one load, one exp per element (the tail's dead lanes
    are -inf, so their exp is 0 and the sums need no mask). A row is one dependency chain
    (maximum, exponentials, sum, scale: ~200 cycles) that the out-of-order window hardly overlaps
    with the next row's, so rows go two at a time, interleaved, where the registers allow, and
    the reductions are trees."""
    a, lanes = fn.asm, v.lanes(4)
    R = Regs(fn, v, desc.n)
    nvec = -(-desc.n // lanes)
    pair = desc.m > 1 and 2 * (nvec + 5) <= len(R.free)
    work = [(R.take(nvec), R.take(5)) for _ in range(2 if pair else 1)]     # E; acc, total, 3 exp temps
    c = R.consts()
    cols = [(j * lanes, None) for j in range(desc.n // lanes)] + ([(desc.n // lanes * lanes, R.tail)] if R.tail else [])
    full_mask = desc.mask == "full"

    def row(a, c, regs, r):
        """Row ``r`` (0 or 1) past the stream pointers."""
        E, (acc, total, *tmp) = regs
        scratch = [acc, total] + tmp

        def mem(s, col, moves=True):
            return at_row(s, col, r if moves else 0)
        for e, (col, t) in zip(E, cols):
            load(a, v, e, x, mem(x, col), t)
            if desc.scale != 1.0:
                a.vmulps(e, e, c.f(desc.scale))
            if mask:
                a.vaddps(e, e, load(a, v, total, mask, mem(mask, col, full_mask), t))
            fill_tail(a, v, e, t, c.into(a, total, float("-inf")), c.k)
        _tree(a, "max", E, scratch)
        hreduce(a, v, acc, tmp[0], "max")
        for e in E:
            a.vsubps(e, e, acc)
            exp(a, v, e, e, tmp, c)
        _tree(a, "add", E, scratch)
        a.vmovaps(total, acc)
        hreduce(a, v, total, tmp[0], "add")
        c.load(a, acc, c.f(1.0))
        a.vdivps(acc, acc, total)
        for e, (col, t) in zip(E, cols):
            a.vmulps(e, e, acc)
            store(a, v, out, e, mem(out, col), t, tmp, c, cvt=cvt)

    streams = [x, out] + ([mask] if full_mask else [])
    if pair:
        a.mov(ROWS, desc.m // 2)
        top = a.label()
        a.bind(top)
        xm.interleave(a, c, [lambda a, c, i=i: row(a, c, work[i], i) for i in range(2)])
        for s in streams:
            a.add(s.reg, 2 * s.ld * s.es)
        a.dec(ROWS)
        a.jnz(top)
        if desc.m % 2:
            row(a, c, work[0], 0)
    else:
        row_loop(a, desc.m, lambda: row(a, c, work[0], 0), streams)
    c.finish(fn, scratch=work[0][1][0])
    return fn.finalize()


def at_row(stream, col, r):
    """:func:`at` of element ``col`` of the row ``r`` rows past the stream's pointer."""
    return at(stream, col + r * stream.ld, None)


def _tree(a, op, srcs, scratch):
    """scratch[0] = op over ``srcs`` (kept) lane by lane: pairs into the scratch registers, then a
    tree (depth ~log2 instead of a chain through every source)."""
    f = a.vaddps if op == "add" else a.vmaxps
    k = min(len(scratch), (len(srcs) + 1) // 2)
    for i in range(k):
        if 2 * i + 1 < len(srcs):
            f(scratch[i], srcs[2 * i], srcs[2 * i + 1])
        else:
            a.vmovaps(scratch[i], srcs[2 * i])
    for j, src in enumerate(srcs[2 * k:]):
        f(scratch[j % k], scratch[j % k], src)
    live = scratch[:k]
    while len(live) > 1:
        for i in range(0, len(live) - 1, 2):
            f(live[i], live[i], live[i + 1])
        live = live[::2]


def _rstd(a, v, c, desc, acc, tail, square, rstd):
    """rstd = 1 / sqrt(sum over the row of ``square``'s lanes / n + eps), in every lane."""
    _sum_pass(a, v, desc.n, acc, tail, square)
    hreduce(a, v, acc[0], acc[1], "add")
    a.vmulps(acc[0], acc[0], c.f(1.0 / desc.n))
    a.vaddps(acc[0], acc[0], c.f(desc.eps))
    a.vsqrtps(acc[0], acc[0])
    c.load(a, rstd, c.f(1.0))
    a.vdivps(rstd, rstd, acc[0])


@register("x86", "layernorm")
def generate_layernorm(desc, isa):
    v = VectorISA(isa)
    fn = Function("layernorm", ["ptr"] * 4)
    a = fn.asm
    rx, rg, rb, ro = fn.args
    x = Stream(rx, "full", desc.dtype, desc.ldi)
    gamma, beta = Stream(rg, "row", "f32"), Stream(rb, "row", "f32")
    out = Stream(ro, "full", desc.out_dtype, desc.ldo)
    R = Regs(fn, v, desc.n)
    tail, U = R.tail, (4 if v.avx512 else 2)
    acc, (mean, rstd) = R.take(U), R.take(2)
    work = [R.take(3) for _ in range(U)]
    tmp = R.take(3)
    c = R.consts()

    def centered(u, col, idx, t):
        d = load(a, v, work[u][0], x, at(x, col, idx), t)
        a.vsubps(d, d, mean)
        zero_tail(a, v, d, t)
        return d

    def row():
        # mean = x0 + sum(x - x0) / n: exact for a row of equal values (whose sum, and 1/n, would round)
        broadcast_element(a, x, mean)
        _sum_pass(a, v, desc.n, acc, tail, centered)
        hreduce(a, v, acc[0], acc[1], "add")
        a.vfmadd231ps(mean, acc[0], c.f(1.0 / desc.n))

        def square(u, col, idx, t):
            d = centered(u, col, idx, t)
            a.vmulps(d, d, d)
            return d
        _rstd(a, v, c, desc, acc, tail, square, rstd)

        def write(u, col, idx, t):
            d = centered(u, col, idx, t)
            a.vmulps(d, d, rstd)
            g = load(a, v, work[u][1], gamma, at(gamma, col, idx), t)
            b = load(a, v, work[u][2], beta, at(beta, col, idx), t)
            a.vfmadd213ps(d, g, b)
            store(a, v, out, d, at(out, col, idx), t, tmp, c)
        walk(a, v, desc.n, U, write, tail)

    row_loop(a, desc.m, row, [x, out])
    c.finish(fn, scratch=acc[0])
    return fn.finalize()


@register("x86", "rmsnorm")
def generate_rmsnorm(desc, isa):
    v = VectorISA(isa)
    fn = Function("rmsnorm", ["ptr"] * 3)
    a = fn.asm
    rx, rg, ro = fn.args
    x = Stream(rx, "full", desc.dtype, desc.ldi)
    gamma = Stream(rg, "row", "f32")
    out = Stream(ro, "full", desc.out_dtype, desc.ldo)
    R = Regs(fn, v, desc.n)
    tail, U = R.tail, (4 if v.avx512 else 2)
    acc, (rstd,) = R.take(U), R.take(1)
    work = [R.take(2) for _ in range(U)]
    tmp = R.take(3)
    c = R.consts()

    def row():
        def square(u, col, idx, t):
            d = load(a, v, work[u][0], x, at(x, col, idx), t)
            a.vmulps(d, d, d)
            return d
        _rstd(a, v, c, desc, acc, tail, square, rstd)

        def write(u, col, idx, t):
            d = load(a, v, work[u][0], x, at(x, col, idx), t)
            a.vmulps(d, d, rstd)
            a.vmulps(d, d, load(a, v, work[u][1], gamma, at(gamma, col, idx), t))
            store(a, v, out, d, at(out, col, idx), t, tmp, c)
        walk(a, v, desc.n, U, write, tail)

    row_loop(a, desc.m, row, [x, out])
    c.finish(fn, scratch=acc[0])
    return fn.finalize()
