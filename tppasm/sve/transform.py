"""SVE-host code for :class:`tppasm.eltwise.Transform` (transpose, vnni2/vnni4 pack and unpack)
for elements of 1, 2, 4 or 8 bytes. Arguments: x0 = x, x1 = out.

These are scalar A64 loops (one load and one store per element, post-indexed); layout transforms
run once per weight update, not per GEMM call, so they are kept simple and dtype-agnostic.

>>> from tppasm.eltwise import Transform
>>> from isa.aarch64 import disassemble
>>> "ldrh" in disassemble(generate(Transform("vnni2", 3, 4, dtype="bf16")))
True
"""
from isa.aarch64 import Function, mem, post, w, x, xzr, wzr

from .common import add_imm, ceil_div

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
    if d.op == "transpose":
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
