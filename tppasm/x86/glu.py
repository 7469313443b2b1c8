"""x86 generator (AVX2, AVX-512) for SwiGLU (:mod:`tppasm.glu`) on the element-wise row engine:
per vector ``sigmoid(g)`` (the shared exp emitter), then two multiplies.

>>> import numpy as np, tppasm
>>> g = np.full((2, 3), -1.0, np.float32); out = np.empty_like(g)
>>> tppasm.swiglu(2, 3)(g, np.ones_like(g), out); round(float(out[1, 2]), 5)
-0.26894
"""
from isa.x86 import Function

from ..backends import register
from . import math as xm
from .eltwise import walk_rows
from .stream import Stream
from .vector import VectorISA


def _silu_mul(a, v, d, s, t, c):                     # s = (gate, up)
    xm.emit_sigmoid(a, v, d, s[0], t, c)
    a.vmulps(d, d, s[0])
    a.vmulps(d, d, s[1])
    return d


@register("x86", "swiglu")
def generate_swiglu(desc, isa):
    v = VectorISA(isa)
    fn = Function("swiglu", ["ptr"] * 3)
    rg, ru, ro = fn.args
    ins = [Stream(rg, "full", desc.dtype, desc.ldg), Stream(ru, "full", desc.dtype, desc.ldu)]
    walk_rows(fn, v, desc.m, desc.n, ins, [Stream(ro, "full", desc.out_dtype, desc.ldo)], _silu_mul,
          xm.NTMP["sigmoid"])
    return fn.finalize()
