"""What a generator's error becomes when a descriptor is too large for the x86 instruction forms.

The x86 code reaches operands through 32-bit displacements and immediates; a descriptor whose
leading dimensions, rows or strides pass 2 GiB makes the x86 encoder (:mod:`isa.x86`) refuse an
operand, with a message about the instruction rather than the descriptor. :func:`offset_error`
turns that refusal, and only that one, into advice about the descriptor. Every other error (a
descriptor check, an option the ISA does not support) and every error on SVE, whose address
arithmetic is 64-bit, stays as it is.

>>> from tppasm.brgemm import Brgemm
>>> try:
...     raise ValueError("signs='su' is not supported on sve")
... except ValueError as e:
...     offset_error(Brgemm(4, 5, 4, lda=2**26), "sve", e) is None
True
"""
from __future__ import annotations

from isa.int_text import int_text

from .display import public_name

X86_ISAS = ("avx2", "avx512", "amx")
HUGE_FIELD = 1 << 25


def raised_by_x86_encoder(error: BaseException) -> bool:
    """Whether ``error`` was raised inside the x86 encoder (a module of the ``isa.x86`` package)."""
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(tb.tb_frame.f_globals.get("__name__", "")).startswith("isa.x86.")


def offset_error(desc, isa: str, error: BaseException) -> ValueError | None:
    """The ValueError to raise (from ``error``) when generating ``desc`` for ``isa`` failed with
    ``error`` because an address offset does not fit the x86 forms; None: re-raise ``error``."""
    if isa not in X86_ISAS or not isinstance(error, (TypeError, ValueError)) or not raised_by_x86_encoder(error):
        return None
    if not any(abs(v) >= HUGE_FIELD for v in vars(desc).values() if isinstance(v, int)):
        return None
    fields = [(k, v) for k, v in vars(desc).items() if type(v) is int and abs(v) >= HUGE_FIELD]
    # batch strides move pointers by register adds, which take any size: name them only when alone
    fields = [(k, v) for k, v in fields if not k.startswith("stride_")] or fields
    huge = ", ".join(f"{public_name(desc, k)}={int_text(v)}" for k, v in fields)
    verb = "needs" if len(fields) == 1 else "need"
    tiles = " (AMX tiles reach 16 rows: keep 16 rows of each leading dimension, in bytes, under 2 GiB)"
    return ValueError(f"{desc.kind}: {huge} {verb} an address offset the {isa} code cannot encode (x86 "
                      "displacements and immediates are 32-bit): keep leading dimensions, rows and "
                      f"strides under 2 GiB{tiles if isa == 'amx' else ''}, or split the operand into smaller calls")
