"""SVE code for :class:`tppasm.eltwise.Transform` (transpose, vnni2/vnni4 pack and unpack) for
elements of 1, 2, 4 or 8 bytes. Arguments: x0 = x, x1 = out.

VNNI pack / unpack with ``factor * element size <= 8`` bytes (bf16 pairs, int8 quads, ...) are
vector code: ``f`` rows are loaded under ``whilelo`` predicates and interleaved with ``zip1/zip2``
(once per doubling of the group), or de-interleaved with ``uzp1/uzp2``; missing rows past k are
zero vectors. Transpose gathers a column per output row (``index`` builds the row offsets, a
``ld1w/ld1h/ld1b`` gather with 32-bit offsets or ``ld1d`` with 64-bit ones) and stores it
contiguously. The wide VNNI forms (factor * size > 8 bytes) are scalar A64 loops.

>>> from tppasm.eltwise import Transform
>>> from isa.aarch64 import disassemble
>>> "zip1" in disassemble(generate(Transform("vnni2", 3, 4, dtype="bf16")))
True
"""
from isa.aarch64 import Function, mem, p, post, w, x, xzr, wzr, z

from .common import add_imm, ceil_div
from .raw import register_sve

R_IN, R_OUT, R_PI, R_PO, R_J, R_G, R_STEP, R_S, R_V = x[9], x[10], x[11], x[12], x[13], x[14], x[15], x[16], x[17]
LOADS = {1: "ldrb", 2: "ldrh", 4: "ldr", 8: "ldr"}
STORES = {1: "strb", 2: "strh", 4: "str", 8: "str"}


def _copy_row(a, es, n, in_step, out_step, zero=False):
    """n elements from R_PI (stride in_step bytes) to R_PO (stride out_step bytes; R_STEP holds it
    when it does not fit a post-index immediate)."""
    val = R_V if es == 8 else w[R_V.num]
    top = a.label("elems")
    a.mov_imm(R_J, n)
    a.bind(top)
    if zero:
        val = xzr if es == 8 else wzr
    else:
        a.emit(LOADS[es], val, post(R_PI, in_step))            # in_step <= 32 bytes
    if out_step < 256:
        a.emit(STORES[es], val, post(R_PO, out_step))
    else:
        a.emit(STORES[es], val, mem(R_PO))
        a.add(R_PO, R_PO, R_STEP)
    a.subs(R_J, R_J, 1)
    a.b_ne(top)


def _rows(a, count, body, advance):
    """Run ``body`` ``count`` times (a counted loop), ``advance`` after each."""
    if count <= 0:
        return
    top = a.label("rows")
    a.mov_imm(R_G, count)
    a.bind(top)
    body()
    advance()
    a.subs(R_G, R_G, 1)
    a.b_ne(top)


def generate(d) -> bytes:
    """Machine code for a Transform descriptor (see the module docstring)."""
    from tppasm.dtypes import dtype as np_dtype
    es = np_dtype(d.dtype).itemsize
    f = Function(nargs=2)
    a = f.asm
    a.mov(R_IN, x[0])
    a.mov(R_OUT, x[1])
    m, n, fac = d.m, d.n, d.factor
    if d.op != "transpose" and es * fac <= 8:
        _vnni_vector(a, d, es)
    elif d.op == "transpose" and m * d.ldi * es < 1 << 31:
        _transpose_gather(a, d, es)
    elif d.op == "transpose":
        a.mov_imm(R_STEP, d.ldo * es)

        def body():
            a.mov(R_PI, R_IN)
            a.mov(R_PO, R_OUT)
            _copy_row(a, es, n, es, d.ldo * es)
        _rows(a, m, body, lambda: (add_imm(a, R_IN, R_IN, d.ldi * es, R_S), add_imm(a, R_OUT, R_OUT, es, R_S)))
    else:
        groups = ceil_div(m, fac)
        pack = d.op.startswith("vnni")
        ld = d.ldi if pack else d.ldo                  # the row stride of the (k, n) side
        for r in range(fac):
            full = ceil_div(m - r, fac) if m > r else 0
            add_imm(a, R_PI, R_IN, (r * ld if pack else r) * es, R_S)
            add_imm(a, R_PO, R_OUT, (r if pack else r * ld) * es, R_S)
            a.mov(x[5], R_PI)                          # x5/x6: row starts of the two sides
            a.mov(x[6], R_PO)

            def body(pack=pack):
                a.mov(R_PI, x[5])
                a.mov(R_PO, x[6])
                if pack:
                    _copy_row(a, es, n, es, fac * es)
                else:
                    _copy_row(a, es, n, fac * es, es)

            def advance(pack=pack):
                add_imm(a, x[5], x[5], (fac * ld if pack else n * fac) * es, R_S)
                add_imm(a, x[6], x[6], (n * fac if pack else fac * ld) * es, R_S)
            _rows(a, full, body, advance)
            if pack and full < groups:                 # rows past k: zeros in the last group
                a.mov(R_PO, x[6])
                _copy_row(a, es, n, es, fac * es, zero=True)
    f.ret()
    return f.code()


SUFFIX = {1: "b", 2: "h", 4: "s", 8: "d"}
SHIFT = {1: 0, 2: 1, 4: 2, 8: 3}
ROWS = (x[19], x[20], x[21], x[22])               # the f row pointers of the (k, n) side
R_E, R_NF, R_GRP = x[3], x[4], x[5]


def _ld(a, es, dst, pred, base, idx):
    t = SUFFIX[es]
    name = {1: "ld1b", 2: "ld1h", 4: "ld1w"}[es]
    a.emit(name, getattr(dst, t), pred.z, mem(base, idx, lsl=SHIFT[es]))


def _st(a, es, src, pred, base, idx):
    t = SUFFIX[es]
    name = {1: "st1b", 2: "st1h", 4: "st1w"}[es]
    a.emit(name, getattr(src, t), pred, mem(base, idx, lsl=SHIFT[es]))


def _inc(a, es, reg, times=1):
    a.emit({1: "incb", 2: "inch", 4: "incw"}[es], reg, "all", times)


def _pairwise(first, second, t, *steps):
    """For each (d1, d2, lo, hi) in ``steps``: d1 = first(lo, hi), d2 = second(lo, hi) on ``t``
    lanes (zip1/zip2 interleave, uzp1/uzp2 de-interleave)."""
    for d1, d2, lo, hi in steps:
        first(getattr(d1, t), getattr(lo, t), getattr(hi, t))
        second(getattr(d2, t), getattr(lo, t), getattr(hi, t))


def _vnni_vector(a, d, es):
    """Pack (zip) or unpack (uzp) f rows at a time; one column block of cnt lanes per iteration."""
    m, n, fac = d.m, d.n, d.factor
    t, t2 = SUFFIX[es], SUFFIX[2 * es]
    pack = d.op.startswith("vnni")
    ld = d.ldi if pack else d.ldo
    groups, full = ceil_div(m, fac), m // fac
    v = [z[i] for i in range(4)]                  # the rows (k, n) side
    q = [z[4 + i] for i in range(4)]              # the packed side
    e = [z[8 + i] for i in range(4)]              # intermediate (f = 4)
    a.mov_imm(R_STEP, n)                          # R_STEP: n, R_NF: n * f
    a.mov_imm(R_NF, n * fac)
    a.mov(R_GRP, R_IN if pack else R_OUT)         # row pointer of the group's first row
    a.mov(R_PO, R_OUT if pack else R_IN)          # packed row of the group

    def body(valid):
        for r in range(fac):
            add_imm(a, ROWS[r], R_GRP, r * ld * es, R_S)
        top = a.label("cols")
        a.mov(R_J, 0)
        a.bind(top)
        a.whilelo(getattr(p[0], t), R_J, R_STEP)
        a.lsl(R_E, R_J, fac.bit_length() - 1)
        if pack:
            for r in range(fac):
                if r < valid:
                    _ld(a, es, v[r], p[0], ROWS[r], R_J)
                else:
                    a.dup(getattr(v[r], t), 0)
            if fac == 2:
                _pairwise(a.zip1, a.zip2, t, (q[0], q[1], v[0], v[1]))
            else:
                _pairwise(a.zip1, a.zip2, t, (e[0], e[1], v[0], v[1]), (e[2], e[3], v[2], v[3]))
                _pairwise(a.zip1, a.zip2, t2, (q[0], q[1], e[0], e[2]), (q[2], q[3], e[1], e[3]))
            for i in range(fac):
                a.whilelo(getattr(p[1], t), R_E, R_NF)
                _st(a, es, q[i], p[1], R_PO, R_E)
                _inc(a, es, R_E)
        else:
            for i in range(fac):
                a.whilelo(getattr(p[1], t), R_E, R_NF)
                _ld(a, es, q[i], p[1], R_PO, R_E)
                _inc(a, es, R_E)
            if fac == 2:
                _pairwise(a.uzp1, a.uzp2, t, (v[0], v[1], q[0], q[1]))
            else:                                   # e0/e2: rows 0, 2; e1/e3: rows 1, 3
                _pairwise(a.uzp1, a.uzp2, t, (e[0], e[1], q[0], q[1]), (e[2], e[3], q[2], q[3]))
                _pairwise(a.uzp1, a.uzp2, t, (v[0], v[2], e[0], e[2]), (v[1], v[3], e[1], e[3]))
            for r in range(valid):
                _st(a, es, v[r], p[0], ROWS[r], R_J)
        _inc(a, es, R_J)
        a.cmp(R_J, R_STEP)
        a.b_lo(top)

    def advance():
        add_imm(a, R_GRP, R_GRP, fac * ld * es, R_S)
        add_imm(a, R_PO, R_PO, n * fac * es, R_S)
    _rows(a, full, lambda: body(fac), advance)
    if groups > full:
        body(m - full * fac)


def _transpose_gather(a, d, es):
    """out[j, i0:i0+L] = x[i0:i0+L, j]: one gather per L rows, rows offset by ``index``."""
    m, n = d.m, d.n
    t = "d" if es == 8 else "s"
    pred = getattr(p[0], t)
    zoff, zv = getattr(z[0], t), getattr(z[1], t)
    gather = {1: "ld1b", 2: "ld1h", 4: "ld1w", 8: "ld1d"}[es]
    store = {1: "st1b", 2: "st1h", 4: "st1w", 8: "st1d"}[es]
    reg = (lambda r: r) if es == 8 else (lambda r: w[r.num])
    a.mov_imm(R_S, d.ldi * es)
    a.emit("index", zoff, xzr if es == 8 else wzr, reg(R_S))      # row offsets in bytes
    a.emit("cntd" if es == 8 else "cntw", R_V)
    a.mul(R_V, R_V, R_S)                          # bytes per block of L rows
    a.mov_imm(R_E, m)
    rows_top = a.label("out_rows")
    a.mov_imm(R_G, n)
    a.bind(rows_top)
    a.mov(R_PI, R_IN)                             # x + j*es, then + i0*ldi*es
    a.mov(R_J, 0)
    top = a.label("block")
    a.bind(top)
    a.whilelo(pred, R_J, R_E)
    a.emit(gather, zv, p[0].z, _zmem(R_PI, zoff))
    a.emit(store, zv, p[0], mem(R_OUT, R_J, lsl=SHIFT[es]) if es > 1 else mem(R_OUT, R_J))
    a.add(R_PI, R_PI, R_V)
    a.emit("incd" if es == 8 else "incw", R_J)
    a.cmp(R_J, R_E)
    a.b_lo(top)
    add_imm(a, R_IN, R_IN, es, R_S)
    add_imm(a, R_OUT, R_OUT, d.ldo * es, R_S)
    a.subs(R_G, R_G, 1)
    a.b_ne(rows_top)


def _zmem(base, zoff):
    from isa.aarch64 import Mem
    return Mem(base, index=zoff)


register_sve(generate, "transform")
