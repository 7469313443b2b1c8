"""SVE TPP generators (vector-length agnostic machine code for AArch64).

:func:`generate` is the tppasm backend entry: a descriptor of :mod:`tppasm.brgemm` or
:mod:`tppasm.eltwise` in, an :class:`SveCode` (``Kernel.raw``) out, taking the descriptor's
operands in ``operands()`` order, then its int scalars (AAPCS64 x0, x1, ...): Unary / Binary /
Ternary (:mod:`.elementwise`), Reduce (:mod:`.reduce`), Transform (:mod:`.transform`), Brgemm
(:mod:`.gemm`: B in the descriptor's x86 VNNI layout via the dot kernels; ``MmlaBrgemm`` selects
the MMLA kernels and their layout). The lower-level BRGEMM generator keeps its own signature
(:mod:`tppasm.sve.brgemm`).

>>> from tppasm.eltwise import Unary
>>> from tppasm.kernel import Kernel
>>> k = Kernel(Unary("relu", 2, 5), "sve")
>>> "fmax" in k.disassemble()
True
>>> from tppasm.sve import brgemm
>>> len(brgemm(m=4, n=4, k=4)) > 0
True
"""
from .brgemm import (DTYPES, Plan, brgemm, brgemm_ref, inner_loop, kernel_for, pack_b, pack_b_dot, pack_b_mmla,
                     plan)
from .raw import SveCode

__all__ = ["generate", "SveCode", "DTYPES", "Plan", "brgemm", "brgemm_ref", "inner_loop", "kernel_for", "pack_b",
           "pack_b_dot", "pack_b_mmla", "plan"]


def __getattr__(name):
    if name == "MmlaBrgemm":                    # the BRGEMM descriptor with the SVE MMLA B layout
        from .gemm import MmlaBrgemm
        return MmlaBrgemm
    raise AttributeError(name)


def _gen(kind):
    if kind in ("unary", "binary", "ternary"):
        from .elementwise import generate
    elif kind == "reduce":
        from .reduce import generate
    elif kind == "transform":
        from .transform import generate
    elif kind == "brgemm":
        from .gemm import generate
    else:
        raise NotImplementedError(f"no SVE generator for {kind!r}")
    return generate


def generate(desc, isa="sve") -> SveCode:
    """The raw SVE kernel of a tppasm descriptor (``isa`` is accepted for the backend signature)."""
    desc.validate()
    return SveCode(_gen(desc.kind)(desc), f"{desc.kind}.sve")
