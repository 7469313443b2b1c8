"""x86 code generators for the TPPs (AVX2 and AVX-512; AMX for BRGEMM where present).

Each module registers its generators with :func:`tppasm.backends.register` (family ``"x86"``);
:func:`tppasm.backends.generate` finds them.
"""
