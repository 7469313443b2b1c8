"""SVE TPP generators (vector-length agnostic machine code for AArch64) with NumPy references.

Each generator takes plain parameters and returns the bytes of an AAPCS64 function; the
signatures are documented in :mod:`tppasm.sve.brgemm` and :mod:`tppasm.sve.eltwise`.

>>> from tppasm.sve import brgemm, eltwise
>>> len(brgemm(m=4, n=4, k=4)) > 0 and len(eltwise("relu", m=2, n=5)) > 0
True
"""
from .brgemm import (DTYPES, Plan, brgemm, brgemm_ref, inner_loop, kernel_for, pack_b, pack_b_dot, pack_b_mmla,
                     plan)
from .eltwise import BCAST, BINARY, UNARY, eltwise, eltwise_ref

__all__ = ["DTYPES", "Plan", "brgemm", "brgemm_ref", "inner_loop", "kernel_for", "pack_b", "pack_b_dot", "pack_b_mmla",
           "plan", "eltwise", "eltwise_ref", "UNARY", "BINARY", "BCAST"]
