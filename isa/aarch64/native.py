"""Run SVE kernels natively on an AArch64 Linux host with SVE, or under qemu-aarch64 elsewhere.

:func:`run_calls` takes the :class:`~isa.aarch64.emulate.Call` lists of
:func:`~isa.aarch64.emulate.run_qemu_calls` and runs them natively when this host can run SVE at
exactly the requested vector length (``prctl(PR_SVE_SET_VL)``), else under qemu. The data image is
the one qemu gets (one buffer, guard bytes around every array, address tables pointing into it), so
a kernel that writes outside its outputs raises :class:`~isa.aarch64.emulate.EmulationError` either way.

>>> import numpy as np
>>> from isa.aarch64 import Assembler, mem, x0, x1
>>> a = Assembler(); a.cntb(x1); a.str(x1, mem(x0)); a.ret()
>>> out = np.zeros(1, np.int64)
>>> if sve_runner_skip_reason(512) is None:      # qemu, or an SVE host that runs 512-bit vectors
...     run_calls([Call(a.code(), [], [out])], vl_bits=512)
...     assert out[0] == 64                      # bytes per vector
"""
from __future__ import annotations

import ctypes
import functools
import os
import platform
from contextlib import contextmanager

import numpy as np

from ..cpu import host
from ..memory import PAGE, ExecutableMemory
from .emulate import Call, EmulationError, _arguments, _check_vl, _layout, _scatter, qemu_skip_reason, run_qemu_calls

__all__ = ["Call", "native_skip_reason", "run_native_calls", "run_calls", "sve_runner_skip_reason"]

_PR_SVE_SET_VL, _PR_SVE_GET_VL = 50, 51
_PR_SVE_VL_INHERIT = 1 << 17
_VL_LEN_MASK = 0xFFFF                     # prctl's result: VL in bytes, plus flags above


def _prctl(option: int, arg: int = 0) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    # prctl is variadic and the kernel reads unsigned longs: pass full 64-bit words
    result = libc.prctl(option, *(ctypes.c_ulong(v) for v in (arg, 0, 0, 0)))
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl({option}, {arg:#x}) failed: {os.strerror(errno)}")
    return result


@contextmanager
def _sve_vector_length(vl_bits: int):
    """This thread's SVE vector length is ``vl_bits`` inside the block and as before after it;
    :class:`EmulationError` when Linux clamps the request to another length."""
    previous = _prctl(_PR_SVE_GET_VL)
    try:
        got = (_prctl(_PR_SVE_SET_VL, vl_bits // 8) & _VL_LEN_MASK) * 8
        if got != vl_bits:
            raise EmulationError(f"this SVE host cannot run {vl_bits}-bit vectors: prctl(PR_SVE_SET_VL, "
                                 f"{vl_bits // 8}) gave {got} bits")
        yield
    finally:
        _prctl(_PR_SVE_SET_VL, previous & (_VL_LEN_MASK | _PR_SVE_VL_INHERIT))


@functools.lru_cache(maxsize=None)
def native_skip_reason(vl_bits: int) -> str | None:
    """Why this host cannot run SVE kernels natively at exactly ``vl_bits``, or None when it can.

    >>> import platform
    >>> platform.machine() == "aarch64" or "not an AArch64 Linux machine" in native_skip_reason(256)
    True
    """
    _check_vl(vl_bits)
    system, arch = platform.system(), platform.machine()
    if system != "Linux" or arch not in ("aarch64", "arm64"):
        return f"the host is {system} {arch}, not an AArch64 Linux machine with SVE"
    if "sve" not in host().levels:
        return "this AArch64 host has no SVE"
    try:
        with _sve_vector_length(vl_bits):
            pass
    except (EmulationError, OSError) as e:
        return str(e)
    return None


def run_native_calls(calls: list[Call], vl_bits: int = 256) -> None:
    """Run the kernel calls on this SVE host, in order, at vector length ``vl_bits``; fills every
    call's outputs. Raises :class:`EmulationError` when the host cannot run at ``vl_bits`` or a
    kernel wrote outside its outputs (a write beyond the guard bytes may crash the process).

    >>> import numpy as np
    >>> from isa.aarch64 import Assembler, mem, x0, x1
    >>> a = Assembler(); a.cntw(x1); a.str(x1, mem(x0)); a.ret()
    >>> out = np.zeros(1, np.int64)
    >>> if native_skip_reason(128) is None:
    ...     run_native_calls([Call(a.code(), [], [out])], vl_bits=128)
    ...     assert out[0] == 4                      # fp32 lanes per vector
    """
    if (reason := native_skip_reason(vl_bits)) is not None:
        raise EmulationError(reason)
    # address tables hold absolute addresses: size the image first, then lay it out at its address
    size = len(_layout(calls, 0)[0].finish())
    backing = np.zeros(size + PAGE, np.uint8)
    buf = backing[-backing.ctypes.data % PAGE:][:size]       # page aligned, like qemu's DATA_BASE
    lay, ptrs, writable, outs = _layout(calls, buf.ctypes.data)
    data = lay.finish()
    buf[:] = np.frombuffer(data, np.uint8)
    code = {k: ExecutableMemory(k) for k in {c.code for c in calls}}   # each distinct kernel once
    args = [_arguments(buf.ctypes.data, pp, c.scalar_args) for c, pp in zip(calls, ptrs)]
    funcs = [ctypes.CFUNCTYPE(None, *[ctypes.c_uint64] * len(a))(code[c.code].address)
             for c, a in zip(calls, args)]
    with _sve_vector_length(vl_bits):        # only the kernel calls run at the requested length
        for func, a in zip(funcs, args):
            func(*a)
    _scatter(buf.tobytes(), data, writable, outs)


def run_calls(calls: list[Call], vl_bits: int = 256) -> None:
    """Run the kernel calls natively when this host runs SVE at exactly ``vl_bits``, else under
    qemu-aarch64; fills every call's outputs (see :func:`~isa.aarch64.emulate.run_qemu_calls`).

    >>> import numpy as np
    >>> from isa.aarch64 import Assembler, mem, x0, x1
    >>> a = Assembler(); a.ldr(x1, mem(x0)); a.str(x1, mem(x0, 8)); a.ret()
    >>> out = np.array([7, 0], np.int64)
    >>> if sve_runner_skip_reason(256) is None:
    ...     run_calls([Call(a.code(), [], [out])])
    ...     assert out.tolist() == [7, 7]
    """
    if native_skip_reason(vl_bits) is None:
        run_native_calls(calls, vl_bits)
    elif qemu_skip_reason() is None:
        run_qemu_calls(calls, vl_bits)
    else:
        raise EmulationError(sve_runner_skip_reason(vl_bits))


def sve_runner_skip_reason(vl_bits: int) -> str | None:
    """Why :func:`run_calls` cannot run at ``vl_bits`` here (neither natively nor under qemu), or None.

    >>> reason = sve_runner_skip_reason(128)
    >>> reason is None or reason.startswith("qemu-aarch64 not found")
    True
    """
    native, qemu = native_skip_reason(vl_bits), qemu_skip_reason()
    if native is None or qemu is None:
        return None
    return f"{qemu} and {native}"
