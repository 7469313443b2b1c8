"""isa: the machine-code layer of tppasm.

It knows registers, instructions, executable memory, the host CPU and the native thread pool
(:mod:`isa.pool`); it never knows tensors.
It must not import ``tppasm`` or ``loops``.

>>> from isa.cpu import host
>>> host().arch in ("x86_64", "aarch64")
True
"""
