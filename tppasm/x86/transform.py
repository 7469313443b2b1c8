"""x86 generators for layout transforms (transpose, VNNI2/VNNI4 pack and unpack).

Element-for-element copies through general registers in three nested loops,
``out[a*oa + b*ob + c*oc] = x[a*ia + b*ib + c*ic]``, so any element size and shape works and
nothing outside the operands is touched; rows the VNNI layout pads are written as zeros.

>>> import numpy as np, tppasm
>>> x = np.arange(6, dtype=np.float32).reshape(2, 3); out = np.empty((3, 2), np.float32)
>>> tppasm.transform("transpose", 2, 3)(x, out); out
array([[0., 3.],
       [1., 4.],
       [2., 5.]], dtype=float32)
"""
from isa.x86 import Function, gpr, r8, r9, r10, r11, r12, r13, r14, r15, rax

from ..dtypes import dtype as to_dtype
from . import register

SIZE_BITS = {1: 8, 2: 16, 4: 32, 8: 64}


def _copy3(a, es, src, dst, counts, istr, ostr, zero=False):
    """Three nested loops over ``counts`` (A, B, C) with element strides ``istr``/``ostr``; the
    outer pointers ``src``/``dst`` end advanced by A blocks."""
    data = gpr(rax.num, SIZE_BITS[es])
    A, B, C = counts
    if not (A and B and C):
        return
    loops = []
    a.mov(r8, A)
    la = a.label()
    a.bind(la)
    a.mov(r12, src)
    a.mov(r13, dst)
    a.mov(r9, B)
    lb = a.label()
    a.bind(lb)
    a.mov(r14, r12)
    a.mov(r15, r13)
    a.mov(r10, C)
    lc = a.label()
    a.bind(lc)
    if zero:
        a.xor(gpr(rax.num, 32), gpr(rax.num, 32))
    else:
        a.mov(data, [r14])
    a.mov([r15], data)
    a.add(r14, istr[2] * es)
    a.add(r15, ostr[2] * es)
    a.dec(r10)
    a.jnz(lc)
    a.add(r12, istr[1] * es)
    a.add(r13, ostr[1] * es)
    a.dec(r9)
    a.jnz(lb)
    a.add(src, istr[0] * es)
    a.add(dst, ostr[0] * es)
    a.dec(r8)
    a.jnz(la)
    del loops


@register("transform")
def generate_transform(desc, isa):
    fn = Function(f"transform_{desc.op}", ["ptr", "ptr"])
    a = fn.asm
    x, out = fn.args
    es = to_dtype(desc.dtype).itemsize
    m, n, f = desc.m, desc.n, desc.factor
    if desc.op == "transpose":
        _copy3(a, es, x, out, (1, m, n), (0, desc.ldi, 1), (0, 1, desc.ldo))
    elif desc.op.startswith("vnni"):
        full, rem = divmod(m, f)
        # x (k, n) row r = g*f + b -> out[g, col, b]
        _copy3(a, es, x, out, (full, f, n), (f * desc.ldi, desc.ldi, 1), (n * f, 1, f))
        if rem:
            a.mov(r11, out)
            _copy3(a, es, x, out, (1, rem, n), (0, desc.ldi, 1), (0, 1, f))
            a.lea(out, [r11 + rem * es])
            _copy3(a, es, x, out, (1, f - rem, n), (0, 0, 0), (0, 1, f), zero=True)
    else:
        full, rem = divmod(m, f)
        _copy3(a, es, x, out, (full, f, n), (n * f, 1, f), (f * desc.ldo, desc.ldo, 1))
        if rem:
            _copy3(a, es, x, out, (1, rem, n), (0, 1, f), (0, desc.ldo, 1))
    return fn.finalize()
