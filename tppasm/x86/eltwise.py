"""x86 generators for the element-wise TPPs."""
from isa.x86 import Function, rax, rdi, rsi

from . import register
from .vector import VectorISA


@register("unary")
def generate_unary(desc, isa):
    v = VectorISA(isa)
    fn = Function(f"unary_{desc.op}", ["ptr", "ptr"])
    a = fn.asm
    x, out = fn.args
    lanes = v.lanes(4)
    full, tail = divmod(desc.n, lanes)
    mask = v.make_mask(fn, tail, reg=v.reg(15)) if tail else None
    zero = v.reg(14)
    a.vxorps(zero, zero, zero)
    rows = a.label()
    a.mov(rax, desc.m)
    a.bind(rows)
    for j in range(full + bool(tail)):
        m = mask if j == full else None
        r = v.reg(j % 8)
        v.load(a, r, [x + j * v.bytes], m)
        if desc.op == "relu":
            a.vmaxps(r, r, zero)
        v.store(a, [out + j * v.bytes], r, m)
    a.add(x, desc.ldi * 4)
    a.add(out, desc.ldo * 4)
    a.dec(rax)
    a.jnz(rows)
    return fn.finalize()
