"""SVE element-wise TPP generators (vector-length agnostic) and their NumPy references.

A kernel processes an (m, n) row-major block: each row is walked by ``cntw``-sized steps, two
vectors per iteration, the tail masked by ``whilelo``. Signatures (AAPCS64):

* unary ops (``copy``, ``relu``, ``exp``, ``cvt_bf16``): ``x0 = in, x1 = out``
* binary ops (``add``, ``sub``, ``mul``, ``max``): ``x0 = in0, x1 = in1, x2 = out``; ``in1`` may be
  broadcast: ``bcast="row"`` (one row of n values for all rows), ``"col"`` (one value per row),
  ``"scalar"`` (a single value).

Inputs and outputs are fp32, except ``cvt_bf16`` whose output is bf16 (round to nearest even with
``bfcvt``, stored with a truncating ``st1h``). ``exp`` reduces ``x = n*ln2 + r`` (|r| <= ln2/2),
evaluates a degree-6 polynomial with ``fmad`` and scales by 2^n with ``fscale``.

>>> code = eltwise("relu", m=3, n=10)
>>> len(code) % 4
0
"""
from __future__ import annotations

import math
import struct

import numpy as np

from isa.aarch64 import Function, mem, p, x, z

from .common import add_imm

__all__ = ["eltwise", "eltwise_ref", "UNARY", "BINARY", "BCAST"]

UNARY = ("copy", "relu", "exp", "cvt_bf16")
BINARY = ("add", "sub", "mul", "max")
BCAST = ("none", "row", "col", "scalar")

R_IN, R_IN1, R_OUT, R_N, R_J, R_ROWS, R_T = x[9], x[10], x[11], x[12], x[13], x[14], x[15]
P_ALL = p[7]
IDX = (R_J, R_T)                             # element index of each unrolled vector
UNROLL = len(IDX)
Z_X, Z_Y, Z_T, Z_P = 0, 2, 4, 6              # data, second operand, temporaries (2 each)
EXP_CONSTS = {                               # register: value (z16 onwards, caller-saved)
    "log2e": 1 / math.log(2), "ln2_hi": 0.693359375, "ln2_lo": math.log(2) - 0.693359375,
    "hi": 89.0, "lo": -104.0,
    "c6": 1 / 720, "c5": 1 / 120, "c4": 1 / 24, "c3": 1 / 6, "c2": 0.5, "c1": 1.0,
}


def eltwise_ref(op: str, x0: np.ndarray, x1: np.ndarray | None = None) -> np.ndarray:
    """NumPy reference on 2-D arrays (x1 already broadcast to x0's shape).

    >>> eltwise_ref("relu", np.array([[-1.0, 2.0]], np.float32)).tolist()
    [[0.0, 2.0]]
    """
    if op == "copy":
        return x0.copy()
    if op == "relu":
        return np.maximum(x0, np.float32(0))
    if op == "exp":
        with np.errstate(over="ignore"):
            return np.exp(x0.astype(np.float64)).astype(np.float32)
    if op == "cvt_bf16":
        import ml_dtypes
        return x0.astype(ml_dtypes.bfloat16)
    return {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum}[op](x0, x1)


def _const(a, zreg, value: float) -> None:
    a.mov_imm(x[16].w, struct.unpack("<I", struct.pack("<f", value))[0])
    a.dup(zreg.s, x[16].w)


def eltwise(op: str, m: int, n: int, ld_in: int | None = None, ld_out: int | None = None,
            bcast: str = "none", ld_in1: int | None = None) -> bytes:
    """Machine code of an element-wise kernel over an (m, n) block (see the module docstring).

    ``ld_in``/``ld_out``/``ld_in1`` are row strides in elements (default n).

    >>> from isa.aarch64 import disassemble
    >>> "fadd" in disassemble(eltwise("add", 2, 8, bcast="row"))
    True
    """
    if op not in UNARY + BINARY:
        raise ValueError(f"op must be one of {UNARY + BINARY}")
    if bcast not in BCAST or (bcast != "none" and op not in BINARY):
        raise ValueError(f"bcast is one of {BCAST}, for binary ops only")
    if min(m, n) < 1:
        raise ValueError("need m, n >= 1")
    binary = op in BINARY
    ld_in, ld_out = ld_in or n, ld_out or n
    in1_step = {"none": ld_in1 or n, "row": 0, "col": 1, "scalar": 0}[bcast]
    out_size = 2 if op == "cvt_bf16" else 4
    f = Function(nargs=3 if binary else 2)
    a = f.asm
    a.mov(R_IN, x[0])
    a.mov(R_OUT, x[2] if binary else x[1])
    if binary:
        a.mov(R_IN1, x[1])
    a.mov_imm(R_N, n)
    a.mov_imm(R_ROWS, m)
    a.ptrue(P_ALL.s)
    consts = {}
    if op == "exp":
        for i, (name, value) in enumerate(EXP_CONSTS.items()):
            consts[name] = z[16 + i]
            _const(a, consts[name], value)
    if bcast == "scalar":
        a.ld1rw(z[Z_Y].s, P_ALL.z, mem(R_IN1))
    rows, cols = a.label("rows"), a.label("cols")
    a.bind(rows)
    if bcast == "col":
        a.ld1rw(z[Z_Y].s, P_ALL.z, mem(R_IN1))
    a.mov(R_J, 0)
    a.bind(cols)
    a.mov(R_T, R_J)
    for u in range(UNROLL):
        a.whilelo(p[u].s, R_T, R_N)
        if u < UNROLL - 1:
            a.incw(R_T)
    for u, idx in enumerate(IDX):               # R_T = j + VL after the predicates
        _vector(a, op, bcast, consts, u, idx)
    a.incw(R_J, "all", UNROLL)
    a.cmp(R_J, R_N)
    a.b_lo(cols)
    add_imm(a, R_IN, R_IN, ld_in * 4, R_T)
    add_imm(a, R_OUT, R_OUT, ld_out * out_size, R_T)
    if binary and in1_step:
        add_imm(a, R_IN1, R_IN1, in1_step * 4, R_T)
    a.subs(R_ROWS, R_ROWS, 1)
    a.b_ne(rows)
    f.ret()
    return f.code()


def _vector(a, op: str, bcast: str, c: dict, u: int, idx) -> None:
    """Load, compute and store vector ``u`` of the unrolled iteration (element index ``idx``)."""
    zx, pu = z[Z_X + u].s, p[u]
    a.ld1w(zx, pu.z, mem(R_IN, idx, lsl=2))
    if op in BINARY:
        zy = z[Z_Y + u].s if bcast in ("none", "row") else z[Z_Y].s
        if bcast in ("none", "row"):
            a.ld1w(zy, pu.z, mem(R_IN1, idx, lsl=2))
        if op == "max":
            a.fmax(zx, P_ALL.m, zx, zy)
        else:
            a.emit({"add": "fadd", "sub": "fsub", "mul": "fmul"}[op], zx, zx, zy)
    elif op == "relu":
        a.fmax(zx, P_ALL.m, zx, 0.0)
    elif op == "exp":
        zx = _exp(a, zx, z[Z_T + u].s, z[Z_P + u].s, c)
    if op == "cvt_bf16":
        a.bfcvt(z[zx.num].h, P_ALL.m, zx)
        a.st1h(zx, pu, mem(R_OUT, idx, lsl=1))
    else:
        a.st1w(zx, pu, mem(R_OUT, idx, lsl=2))


def _exp(a, zx, zn, zp, c: dict):
    """exp(zx) -> zp: x = n*ln2 + r, e^r by Horner (fmad), times 2^n (fscale). Clobbers zx, zn."""
    g = P_ALL.m
    a.fmin(zx, g, zx, c["hi"].s)                # keeps NaN; +inf -> 2^128 overflows to inf
    a.fmax(zx, g, zx, c["lo"].s)                # -inf -> 2^-150 underflows to 0
    a.fmul(zn, zx, c["log2e"].s)
    a.frintn(zn, g, zn)
    a.fmls(zx, g, zn, c["ln2_hi"].s)            # r = x - n*ln2 in two steps (Cody-Waite)
    a.fmls(zx, g, zn, c["ln2_lo"].s)
    a.fcvtzs(zn, g, zn)
    a.movprfx(z[zp.num], c["c6"])
    for name in ("c5", "c4", "c3", "c2", "c1", "c1"):
        a.fmad(zp, g, zx, c[name].s)            # p = c + p * r
    a.fscale(zp, g, zp, zn)
    return zp
