"""Whether the x86 BRGEMM prefetches the next batch chunk into L2 (``prefetcht1``, see
:mod:`tppasm.x86.prefetch`): on AMD, off on every other vendor.

The far prefetch was measured on a Zen 4 core, where it is worth 3-6% of the FMA peak in a
2048^3 fp32 GEMM whose B blocks otherwise arrive from L3 on demand; on a Zen 3 core, spread over
the k loops, it takes fp32 BRGEMMs of 48^3 to 80^3 x 16 from 85-90% of the FMA peak to 94-95%.
The Intel figures below are of its earlier form, every k group of every row tile prefetching its
B line one chunk on (the first row tile fetching the whole chunk at the pace it reads B: a burst),
not of the spread one, which no Intel host has run yet. On an Intel Xeon with AMX
(2-core KVM guest, 1 thread; ``python -m bench tpp`` and the DSL GEMM of ``python -m bench
gemm``) the same prefetches cost 15-28%: fp32 BRGEMMs 64x64x64x16 140 -> 168 GFLOP/s without
them, 64x32x64x8 132 -> 169, 80x80x80x16 140 -> 169 (of a 188 GFLOP/s FMA peak); the GEMM
1024^3 in 64x32 blocks 107-111 -> 137-139, 2048^3 109-111 -> 134-135. An Intel core's software
prefetch into L2 still takes one of the L1's miss buffers until the line arrives, which the
kernel's own loads of A and B need.

``TPPASM_FAR_PREFETCH=1`` or ``=0`` overrides the vendor's default (``auto`` or unset: the
default). The setting is part of every x86 BRGEMM kernel's cache key (:func:`tppasm.backends.code_options`).
"""
import os

from isa.cpu import host

from ..backends import CODE_OPTIONS, register_option
from .switch import switch

ENV = "TPPASM_FAR_PREFETCH"
VENDORS = ("AuthenticAMD",)            # where it was measured to pay


def setting():
    """``TPPASM_FAR_PREFETCH``: "1" (on), "0" (off) or "auto" (unset: by the CPU's vendor).

    >>> os.environ.get(ENV) is not None or setting() == "auto"
    True
    """
    return switch(ENV, "prefetch the next batch chunk into L2", "do not",
                  f"on for {', '.join(VENDORS)} CPUs, off on others")


def enabled():
    """Whether kernels generated now prefetch the next batch chunk into L2.

    >>> enabled() == (setting() == "1" or (setting() == "auto" and host().vendor in VENDORS))
    True
    """
    value = setting()
    if value != "auto":
        return value == "1"
    return host().vendor in VENDORS


def option_text():
    """The setting in effect as a cache key's text: "1" or "0".

    >>> option_text() in ("1", "0")
    True
    """
    return "1" if enabled() else "0"


for _isa in (isa for isa, names in CODE_OPTIONS.items() if ENV in names):
    register_option(_isa, ENV, option_text)
