"""SVE code for :class:`tppasm.glu.SwiGLU`: ``out = silu(gate) * up`` with ``silu(g) = g *
sigmoid(g)``, fp32 arithmetic, f32 or bf16 in and out. Arguments: x0 = gate, x1 = up, x2 = out.

Each row is walked two vectors at a time (:func:`.rowwise.walk_columns`, ``whilelo`` tails); per
vector the shared sigmoid emitter of :mod:`.math` (3 ulp), then ``(sigmoid(g) * g) * up`` as the
x86 code computes it. Every vector is loaded before it is stored, so out may be gate or up.

>>> import numpy as np
>>> from tppasm.glu import SwiGLU
>>> from isa.aarch64.native import Call, run_calls, sve_runner_skip_reason
>>> g, u = np.array([[0.0, 1.0, -1.0]], np.float32), np.full((1, 3), 2.0, np.float32)
>>> out = np.zeros_like(g)
>>> if sve_runner_skip_reason(128) is None:                  # qemu, or an SVE host
...     run_calls([Call(generate(SwiGLU(1, 3)), [g, u], [out])], vl_bits=128)
...     assert np.allclose(out, [[0.0, 1.4621172, -0.5378828]])
>>> "fdivr" in disassemble(generate(SwiGLU(1, 3)))            # the sigmoid's 1 / (1 + e)
True
"""
from __future__ import annotations

from isa.aarch64 import Function, disassemble, x, z

from .math import NTMP, Consts, emit_sigmoid
from .raw import register_sve
from .rowwise import P_ALL, R_N, U, esize, load, row_loop, store, walk_columns

__all__ = ["generate", "disassemble"]

R_POOL = x[14]


def generate(d) -> bytes:
    """Machine code for a SwiGLU descriptor (see the module docstring)."""
    f = Function(nargs=3)
    a = f.asm
    gate, up, out = f.args
    free = iter(range(32))
    G, V, D = ([z[next(free)].s for _ in range(U)] for _ in range(3))
    T = [[z[next(free)].s for _ in range(NTMP["sigmoid"])] for _ in range(U)]
    scratch = [z[next(free)], z[next(free)]]
    c = Consts(a, R_POOL, [z[i] for i in free], scratch, P_ALL)
    a.ptrue(P_ALL.s)
    c.setup()
    a.mov_imm(R_N, d.n)

    def vector(u):
        g = load(a, d.dtype, G[u], u, gate)
        emit_sigmoid(a, D[u], g, T[u], c)
        a.fmul(D[u], D[u], g)
        a.fmul(D[u], D[u], load(a, d.dtype, V[u], u, up))
        store(a, d.out_dtype, D[u], u, out)

    row_loop(a, d.m, lambda: walk_columns(a, vector),
             [(gate, d.ldg * esize(d.dtype)), (up, d.ldu * esize(d.dtype)), (out, d.ldo * esize(d.out_dtype))])
    f.ret()
    c.pool()
    return f.code()


register_sve(generate, "swiglu")
