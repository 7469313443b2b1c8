"""SVE TPP generators (vector-length agnostic machine code for AArch64).

Each module registers its generator with :func:`tppasm.backends.register` (family ``"sve"``); it
takes a descriptor of :mod:`tppasm.brgemm` or :mod:`tppasm.eltwise` and returns an
:class:`~tppasm.sve.raw.SveCode` (``Kernel.raw``) taking the descriptor's operands in
``operands()`` order, then its int scalars (AAPCS64 x0, x1, ...): Unary / Binary / Ternary
(:mod:`.eltwise`), Reduce (:mod:`.reduce`), Transform (:mod:`.transform`), Brgemm (:mod:`.brgemm`:
B in the descriptor's x86 VNNI layout via the dot kernels; :class:`~tppasm.sve.brgemm.MmlaBrgemm`
selects the MMLA kernels and their layout), Softmax / LayerNorm / RMSNorm (:mod:`.norm`), Rotary
(:mod:`.rotary`), SwiGLU (:mod:`.glu`), Quantize / Dequant (:mod:`.quant`; rows walked by
:mod:`.rowwise`), GemmNT (:mod:`.gemm_nt`) and BlockSpmm (:mod:`.spmm`): every kind the x86
backend has but the AMX tile setup. The microkernels and loop driver under the BRGEMM keep their
own signature (:mod:`.microkernel`).

>>> from tppasm.eltwise import Unary
>>> from tppasm.kernel import Kernel
>>> k = Kernel(Unary("relu", 2, 5), "sve")
>>> "fmax" in k.disassemble()
True
"""
