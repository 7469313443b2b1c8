"""x86 generators for row/column reductions (add, max, sum of squares), accumulated in fp32.

``over="cols"`` (one value per row): U vector accumulators walk the row, are combined, then
reduced across lanes. ``over="rows"`` (one value per column): per block of U column vectors the
accumulators walk down the rows; in a tall array down a block of ROW_BLOCK rows at a time, their
partial sums kept in a stack row meanwhile (each column still adds its rows in order). Tails load
masked lanes; for max they are refilled with -inf.
Max is np.max's: a NaN anywhere makes the result NaN (:func:`tppasm.x86.math.max_nan`).

>>> import numpy as np, tppasm
>>> x = np.arange(6, dtype=np.float32).reshape(2, 3); out = np.empty(2, np.float32)
>>> tppasm.reduce("add", 2, 3, over="cols")(x, out); out.tolist()
[3.0, 12.0]
"""
from isa.x86 import Function, ax, dword, eax, r8, r9, r10, r11, rax, rcx, rdx, rsp, vec, word

from . import math as xm
from ..backends import register
from .stream import Stream, load, make_tail, store, to_bf16
from .vector import VectorISA

INIT = {"add": 0.0, "sumsq": 0.0, "max": float("-inf")}


def _accumulate(a, v, op, acc, x, tmp):
    if op == "add":
        a.vaddps(acc, acc, x)
    elif op == "max":
        xm.max_nan(a, v, acc, x, acc, tmp)
    else:
        a.vfmadd231ps(acc, x, x)


def _combine(a, v, op, acc, x, tmp):
    """acc = op(acc, x); ``tmp``: a scratch vector of their width (AVX2 max)."""
    if op == "max":
        xm.max_nan(a, v, acc, x, acc, tmp)
    else:
        a.vaddps(acc, acc, x)


@register("x86", "reduce")
def generate_reduce(desc, isa):
    v = VectorISA(isa)
    fn = Function(f"reduce_{desc.op}_{desc.over}", ["ptr", "ptr"])
    a = fn.asm
    rx, ro = fn.args
    x = Stream(rx, "full", desc.dtype, desc.ldi)
    out = Stream(ro, "full", desc.out_dtype)
    lanes = v.lanes(4)
    regs = list(range(v.nregs))
    tail = make_tail(fn, v, desc.n % lanes, regs)
    unroll = 4
    acc = [v.reg(r) for r in regs[:unroll]]
    ld = [v.reg(r) for r in regs[unroll:2 * unroll]]
    tmp = [v.reg(r) for r in regs[2 * unroll:2 * unroll + 3]]
    c = xm.Consts(v, [v.reg(r) for r in regs[2 * unroll + 3:]])

    if desc.over == "cols":
        _over_cols(a, v, desc, x, out, acc, ld, tmp, c, tail, lanes)
    else:
        _over_rows(a, v, desc, x, out, acc, ld, tmp, c, tail, lanes, fn)
    c.finish(fn, scratch=tmp[0])
    return fn.finalize()


def _ptr(expr):
    from isa.x86 import ptr
    return ptr(expr)


def _at(s, col, offset=None):
    def at(i, es, size=None):
        expr = s.reg + (col + i) * s.es if offset is None else s.reg + offset + (col + i) * s.es
        return word[expr] if size == 2 else _ptr(expr)
    return at


def _init(a, v, regs, op, c):
    for r in regs:
        c.load(a, r, c.f(INIT[op]))


def _over_cols(a, v, desc, x, out, acc, ld, tmp, c, tail, lanes):
    m, n, op, unroll = desc.m, desc.n, desc.op, len(acc)
    nfull = n // lanes
    a.mov(r10, m)
    top = a.label()
    a.bind(top)
    _init(a, v, acc, op, c)
    blocks = nfull // unroll if nfull >= 2 * unroll else 0
    base = x
    if blocks:                                      # r11 = column offset in bytes
        a.xor(r11, r11)
        loop = a.label()
        a.bind(loop)
        for j in range(unroll):
            _accumulate(a, v, op, acc[j], load(a, v, ld[j], x, _at(x, j * lanes, r11), None), tmp[1])
        a.add(r11, unroll * lanes * x.es)
        a.cmp(r11, blocks * unroll * lanes * x.es)
        a.jb(loop)
        base = r11
    done = blocks * unroll
    cols = [((j - done) * lanes, None) for j in range(done, nfull)] + ([((nfull - done) * lanes, tail)] if tail else [])
    for j, (col, t) in enumerate(cols):
        r = load(a, v, ld[j % unroll], x, _at(x, col, r11 if base is r11 else None), t)
        if op == "max":
            _max_tail(a, v, r, t, c, tmp[0])
        _accumulate(a, v, op, acc[j % unroll], r, tmp[1])
    for j in range(1, unroll):
        _combine(a, v, op, acc[0], acc[j], tmp[1])
    r = acc[0]
    if v.avx512:
        a.vextractf64x4(v.half(tmp[0].num), r, 1)
        _combine(a, v, op, v.half(r.num), v.half(tmp[0].num), v.half(tmp[1].num))
    x1, t1 = vec(128, r.num), vec(128, tmp[0].num)
    a.vextractf128(t1, v.half(r.num) if v.avx512 else r, 1)
    _combine(a, v, op, x1, t1, vec(128, tmp[1].num))
    a.vshufps(t1, x1, x1, 0x4E)                   # swap the 64-bit halves
    _combine(a, v, op, x1, t1, vec(128, tmp[1].num))
    a.vmovshdup(t1, x1)
    _combine(a, v, op, x1, t1, vec(128, tmp[1].num))
    _store_scalar(a, v, out, x1, tmp, c)
    a.add(out.reg, out.es)
    a.add(x.reg, x.ld * x.es)
    a.dec(r10)
    a.jnz(top)


def _max_tail(a, v, r, t, c, tmp):
    if t is None:
        return
    if v.avx512:
        a.knotw(xm.K7, t.k)
        a.vmovaps(r.mask(xm.K7), c.into(a, tmp, INIT["max"]))
    else:
        a.vblendvps(r, c.into(a, tmp, INIT["max"]), r, t.ymask)


def _store_scalar(a, v, out, x1, tmp, c):
    if out.dtype == "f32":
        a.vmovss(dword[out.reg], x1)
        return
    packed = _to_bf16_1(a, v, x1, tmp, c)
    a.vmovd(eax, packed)
    a.mov(word[out.reg], ax)


def _to_bf16_1(a, v, x1, tmp, c):
    full = v.reg(x1.num)
    return vec(128, to_bf16(a, v, full, tmp, c).num)


ROW_BLOCK = 16        # rows one strip walks before the next strip, in a tall array (see _row_blocks)
CHUNK = 2048          # columns per chunk of a tall array: its fp32 partial results sit in a stack row


def _over_rows(a, v, desc, x, out, acc, ld, tmp, c, tail, lanes, fn):
    """Per block of U column vectors (a loop over full blocks, then the rest): the accumulators
    walk down the rows; x and out advance by one block each time. Below 2 ROW_BLOCK rows they walk
    all of them (:func:`_strips_down`); taller arrays go by blocks of rows (:func:`_row_blocks`)."""
    if desc.m < 2 * ROW_BLOCK or ROW_BLOCK * x.ld * x.es >= 1 << 31:
        _strips_down(a, v, desc, x, out, acc, ld, tmp, c, tail, lanes)
    else:
        _row_blocks(a, v, desc, x, out, acc, ld, tmp, c, tail, lanes, fn)


def _strips_down(a, v, desc, x, out, acc, ld, tmp, c, tail, lanes):
    """Each strip of U vectors walks all m rows, then the next strip."""
    m, n, op, unroll = desc.m, desc.n, desc.op, len(acc)
    nfull = n // lanes
    blocks, rest = divmod(nfull, unroll)

    def block(vecs):
        _init(a, v, acc[:len(vecs)], op, c)
        a.mov(r11, x.reg)
        _down(a, v, desc, x, acc, ld, tmp, c, vecs, m)
        for j, (col, t) in enumerate(vecs):
            store(a, v, out, acc[j], _at(out, col), t, tmp, c)

    if blocks:
        a.mov(r8, blocks)
        loop = a.label()
        a.bind(loop)
        block([(j * lanes, None) for j in range(unroll)])
        a.add(x.reg, unroll * lanes * x.es)
        a.add(out.reg, unroll * lanes * out.es)
        a.dec(r8)
        a.jnz(loop)
    vecs = [(j * lanes, None) for j in range(rest)] + ([(rest * lanes, tail)] if tail else [])
    if vecs:
        block(vecs)


def _down(a, v, desc, x, acc, ld, tmp, c, vecs, rows):
    """acc[j] = op(acc[j], the vector at column ``vecs[j]`` of each of ``rows`` rows from r11)."""
    a.mov(r10, rows)
    top = a.label()
    a.bind(top)
    src = Stream(r11, "full", x.dtype, x.ld)
    for j, (col, t) in enumerate(vecs):
        r = load(a, v, ld[j], src, _at(src, col), t)
        if desc.op == "max":
            _max_tail(a, v, r, t, c, tmp[0])
        _accumulate(a, v, desc.op, acc[j], r, tmp[1])
    a.add(r11, x.ld * x.es)
    a.dec(r10)
    a.jnz(top)


def _row_blocks(a, v, desc, x, out, acc, ld, tmp, c, tail, lanes, fn):
    """Tall arrays: per chunk of CHUNK columns, each strip walks one block of ROW_BLOCK rows, its
    fp32 partial results kept in a stack row from one block of rows to the next. A strip down
    all the rows met a new page at every row and, past the caches, lost the lines prefetched
    beside it before the next strip came; a block of rows stays in cache (and the TLB) from one
    strip to the next. Each column still adds its rows in order: the results are the same bits."""
    m, rows = desc.m, ROW_BLOCK
    size = 128 + 4 * -(-min(desc.n, CHUNK) // lanes) * lanes     # (a tail vector is stored whole)
    fn.stack(size)
    c.after(size)                            # the constants' stack table goes past the partial results
    a.lea(rax, [rsp + 64 + 63])              # rax: the partial results, 64-byte aligned
    a.and_(rax, -64)
    blocks = m // rows                       # the last block takes the rest too: rows to 2 rows - 1
    step = rows * x.ld * x.es

    def chunk(width, t):
        a.mov(rdx, x.reg)                    # rdx: the first row of the block of rows
        _row_block(a, v, desc, x, out, acc, ld, tmp, c, width, t, rows, "first", lanes)
        a.add(rdx, step)
        if blocks > 2:
            a.mov(r9, blocks - 2)
            top = a.label()
            a.bind(top)
            _row_block(a, v, desc, x, out, acc, ld, tmp, c, width, t, rows, "middle", lanes)
            a.add(rdx, step)
            a.dec(r9)
            a.jnz(top)
        _row_block(a, v, desc, x, out, acc, ld, tmp, c, width, t, rows + m % rows, "last", lanes)

    full, rest = divmod(desc.n, CHUNK)
    if full:
        a.mov(rcx, full)
        top = a.label()
        a.bind(top)
        chunk(CHUNK, None)
        a.add(x.reg, CHUNK * x.es)
        a.add(out.reg, CHUNK * out.es)
        a.dec(rcx)
        a.jnz(top)
    if rest:
        chunk(rest, tail)


def _row_block(a, v, desc, x, out, acc, ld, tmp, c, width, tail, rows, phase, lanes):
    """The strips of ``width`` columns (the last vector ``tail``) walk ``rows`` rows from rdx; the
    accumulators start at INIT ("first") or the stack row, and go to the stack row or ("last") out."""
    op, unroll = desc.op, len(acc)
    nfull = width // lanes
    blocks, rest = divmod(nfull, unroll)

    def at(reg, es, col):
        def mem_at(i, _es, size=None):
            expr = reg + r8 * es + (col + i) * es
            return word[expr] if size == 2 else _ptr(expr)
        return mem_at

    def strip(vecs):
        for j, (col, _) in enumerate(vecs):
            if phase == "first":
                c.load(a, acc[j], c.f(INIT[op]))
            else:
                a.vmovups(acc[j], _ptr(rax + r8 * 4 + col * 4))
        a.lea(r11, [rdx + r8 * x.es])
        _down(a, v, desc, x, acc, ld, tmp, c, vecs, rows)
        for j, (col, t) in enumerate(vecs):
            if phase == "last":
                store(a, v, out, acc[j], at(out.reg, out.es, col), t, tmp, c)
            else:
                a.vmovups(_ptr(rax + r8 * 4 + col * 4), acc[j])

    if blocks:
        a.xor(r8, r8)                        # r8: the strip's first column
        loop = a.label()
        a.bind(loop)
        strip([(j * lanes, None) for j in range(unroll)])
        a.add(r8, unroll * lanes)
        a.cmp(r8, blocks * unroll * lanes)
        a.jb(loop)
    vecs = [(j * lanes, None) for j in range(rest)] + ([(rest * lanes, tail)] if tail else [])
    if vecs:
        a.mov(r8, blocks * unroll * lanes)
        strip(vecs)
