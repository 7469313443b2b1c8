"""Run AArch64 kernels under emulation: qemu-aarch64 (user mode, any extension qemu models: SVE,
BF16, I8MM) through a static ELF, or unicorn in-process (SVE fp32 only: unicorn 2.1 is QEMU 5.0,
which has no BF16/I8MM).

Arguments are passed as AAPCS64 integer registers: pointers to ``inputs``, then to ``outputs``,
then ``scalar_args``; an :class:`AddressTable` input becomes a pointer to a table of addresses. Outputs are copied in (so a kernel may read them, e.g. beta=1) and read
back. Every array is surrounded by guard bytes; a kernel that writes outside its outputs, or into
an input, raises :class:`EmulationError`. :mod:`isa.aarch64.native` runs the same :class:`Call` lists
natively on an SVE host (``run_calls`` picks native or qemu).

>>> import numpy as np
>>> from isa.aarch64 import Assembler, mem, x0, x1
>>> a = Assembler(); a.ldr(x1, mem(x0)); a.str(x1, mem(x0, 8)); a.ret()
>>> out = np.array([7, 0], np.int64)
>>> run_qemu(a.code(), [], [out])   # doctest: +SKIP
>>> out.tolist()                    # doctest: +SKIP
[7, 7]
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

import numpy as np

from .elf import DATA_BASE, test_program

__all__ = ["EmulationError", "Call", "AddressTable", "qemu_path", "qemu_skip_reason", "unicorn_skip_reason",
           "run_qemu", "run_qemu_calls", "run_unicorn"]

GUARD = 64
_GUARD_BYTE = 0xA5
VLS = (128, 256, 512, 1024, 2048)


class EmulationError(RuntimeError):
    """The emulated program failed, or a kernel touched memory outside its outputs."""


@dataclass
class AddressTable:
    """An input that is a table of int64 addresses: ``array``'s address plus each byte offset
    (for kernels taking arrays of pointers, e.g. BRGEMM with an address batch)."""
    array: np.ndarray
    offsets: list


@dataclass
class Call:
    """One kernel call of a batched qemu run: pointers to inputs, then outputs, then scalars.
    ``order`` permutes the pointers (indices into inputs + outputs) when the signature interleaves
    them, e.g. ``(0, 1, 3, 2)`` passes inputs[0], inputs[1], outputs[0], inputs[2]."""
    code: bytes
    inputs: list
    outputs: list
    scalar_args: tuple = ()
    order: tuple | None = None


def qemu_path() -> str | None:
    """The qemu-aarch64 executable, or None (``TPPASM_QEMU`` overrides the search)."""
    return os.environ.get("TPPASM_QEMU") or shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")


def qemu_skip_reason() -> str | None:
    """Why qemu runs cannot happen here, or None when they can."""
    path = qemu_path()
    if path is None:
        return "qemu-aarch64 not found (Debian/Ubuntu: apt-get install qemu-user)"
    if shutil.which(path) is None:
        return (f"qemu-aarch64 not found: TPPASM_QEMU={path!r} is not an executable; set it to qemu-aarch64's "
                "path, or unset it to search PATH")
    return None


def unicorn_skip_reason() -> str | None:
    """Why unicorn runs cannot happen here, or None when they can."""
    try:
        import unicorn  # noqa: F401
        from unicorn import arm64_const  # noqa: F401
    except ImportError:
        return "unicorn is not installed (pip install 'unicorn>=2.1')"
    if not hasattr(arm64_const, "UC_CPU_ARM64_MAX"):
        return "this unicorn has no ARM64 'max' CPU model (needs unicorn>=2.0.1) and so no SVE"
    return None


def _check_vl(vl_bits: int) -> None:
    if vl_bits not in VLS:
        raise ValueError(f"vl_bits must be one of {VLS}")


class _Layout:
    """Places arrays in one data image with guard bytes around each."""

    def __init__(self):
        self.image = bytearray()
        self.spans: list[tuple[int, int]] = []   # (offset, nbytes) per placed array

    def place(self, arr: np.ndarray) -> int:
        if not arr.flags.c_contiguous:
            raise ValueError("arrays passed to emulated kernels must be C-contiguous")
        off = (len(self.image) + GUARD + 63) // 64 * 64
        self.image += bytes([_GUARD_BYTE]) * (off - len(self.image))
        self.image += arr.tobytes()
        self.spans.append((off, arr.nbytes))
        return off

    def finish(self) -> bytes:
        self.image += bytes([_GUARD_BYTE]) * GUARD
        return bytes(self.image)


def _layout(calls: list[Call], base: int):
    lay = _Layout()
    args, writable, outs = [], [], []
    for c in calls:
        ptrs = []
        for a in c.inputs:
            if isinstance(a, AddressTable):
                target = lay.place(a.array)
                a = np.array([base + target + int(o) for o in a.offsets], np.uint64)
            ptrs.append(lay.place(a))
        for a in c.outputs:
            off = lay.place(a)
            ptrs.append(off)
            writable.append((off, a.nbytes))
            outs.append((off, a))
        args.append([ptrs[i] for i in c.order] if c.order is not None else ptrs)
    return lay, args, writable, outs


def _arguments(base: int, ptrs: list, scalar_args) -> list[int]:
    """x0.. of one call: the data addresses (``base`` + offset), then the scalars as 64-bit patterns."""
    args = [base + p for p in ptrs] + [int(s) & (2**64 - 1) for s in scalar_args]
    if len(args) > 8:
        raise ValueError("at most 8 integer arguments (x0-x7)")
    return args


def _scatter(result: bytes, original: bytes, writable, outs) -> None:
    """Copy outputs back; fail when any byte outside the outputs changed."""
    if len(result) != len(original):
        raise EmulationError(f"program wrote {len(result)} bytes, expected {len(original)}")
    mask = np.ones(len(original), bool)
    for off, n in writable:
        mask[off:off + n] = False
    before, after = np.frombuffer(original, np.uint8), np.frombuffer(result, np.uint8)
    bad = np.nonzero((before != after) & mask)[0]
    if bad.size:
        raise EmulationError(f"kernel wrote outside its outputs: {bad.size} bytes, first at data offset "
                             f"{int(bad[0])}")
    for off, arr in outs:
        arr[...] = np.frombuffer(result[off:off + arr.nbytes], arr.dtype).reshape(arr.shape)


def run_qemu_calls(calls: list[Call], vl_bits: int = 256, timeout: float = 60) -> None:
    """Run several kernel calls in one qemu-aarch64 process (``-cpu max,sve<vl_bits>=on``); fills
    every call's outputs. Raises :class:`EmulationError` on a crash or a stray write."""
    _check_vl(vl_bits)
    if (reason := qemu_skip_reason()) is not None:
        raise EmulationError(reason)
    lay, ptrs, writable, outs = _layout(calls, DATA_BASE)
    data = lay.finish()
    prog_calls = [(c.code, _arguments(DATA_BASE, pp, c.scalar_args)) for c, pp in zip(calls, ptrs)]
    elf = test_program(prog_calls, data, (0, len(data)))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.elf")
        with open(path, "wb") as f:
            f.write(elf)
        os.chmod(path, 0o755)
        # sve<N>=on enables N and all smaller lengths; the linux-user default length (64 bytes) is
        # clamped to the largest enabled one, so the program runs at exactly N bits.
        cpu = f"max,sve{vl_bits}=on" + ("" if vl_bits <= 512 else f",sve-default-vector-length={vl_bits // 8}")
        proc = subprocess.run([qemu_path(), "-cpu", cpu, path], capture_output=True, timeout=timeout)
    if proc.returncode != 0:
        raise EmulationError(f"qemu-aarch64 exited with {proc.returncode}: {proc.stderr.decode(errors='replace')[-2000:]}")
    _scatter(proc.stdout, data, writable, outs)


def run_qemu(func_code: bytes, inputs: list, outputs: list, scalar_args=(), vl_bits: int = 256,
             timeout: float = 60, order: tuple | None = None) -> None:
    """Run one kernel under qemu-aarch64 at SVE vector length ``vl_bits``; fills ``outputs``.

    Arguments: x0.. = pointers to ``inputs``, then ``outputs`` (or as permuted by ``order``, see
    :class:`Call`), then the integer ``scalar_args``."""
    run_qemu_calls([Call(func_code, list(inputs), list(outputs), tuple(scalar_args), order)], vl_bits, timeout)


_UC_CODE, _UC_DATA, _UC_STACK, _UC_STACK_SIZE = 0x100000, 0x10000000, 0x7F000000, 0x100000


def run_unicorn(func_code: bytes, inputs: list, outputs: list, scalar_args=(), vl_bits: int = 256,
                max_instructions: int = 50_000_000, order: tuple | None = None) -> None:
    """Run one kernel in-process with unicorn's ARM64 'max' CPU at SVE length ``vl_bits``.

    SVE is enabled by CPTR_EL3.EZ and CPACR_EL1.ZEN/FPEN (the CPU starts at EL1); the vector length is
    set in ZCR_EL1/EL2/EL3.LEN. Only base SVE works: unicorn 2.1 (QEMU 5.0) decodes no BF16, I8MM
    or F32MM instructions."""
    _check_vl(vl_bits)
    if (reason := unicorn_skip_reason()) is not None:
        raise EmulationError(reason)
    import unicorn
    from unicorn import arm64_const as A

    call = Call(func_code, list(inputs), list(outputs), tuple(scalar_args), order)
    lay, (ptrs,), writable, outs = _layout([call], _UC_DATA)
    data = lay.finish()
    uc = unicorn.Uc(unicorn.UC_ARCH_ARM64, unicorn.UC_MODE_ARM)
    uc.ctl_set_cpu_model(A.UC_CPU_ARM64_MAX)
    code = bytes(func_code) + bytes.fromhex("1f2003d5")          # nop: the return address
    uc.mem_map(_UC_CODE, (len(code) + 0xFFFF) & ~0xFFFF, unicorn.UC_PROT_READ | unicorn.UC_PROT_EXEC)
    uc.mem_write(_UC_CODE, code)
    uc.mem_map(_UC_DATA, (len(data) + 0xFFFF) & ~0xFFFF)
    uc.mem_write(_UC_DATA, data)
    uc.mem_map(_UC_STACK, _UC_STACK_SIZE)
    uc.reg_write(A.UC_ARM64_REG_CPACR_EL1, (3 << 16) | (3 << 20))   # ZEN, FPEN: no EL0/EL1 traps
    uc.cpr_write(3, 6, 1, 1, 2, 1 << 8)                          # CPTR_EL3.EZ: SVE not trapped to EL3
    for op1 in (0, 4, 6):                                        # ZCR_EL1, ZCR_EL2, ZCR_EL3
        uc.cpr_write(3, op1, 1, 2, 0, vl_bits // 128 - 1)
    args = _arguments(_UC_DATA, ptrs, scalar_args)
    for i, value in enumerate(args):
        uc.reg_write(A.UC_ARM64_REG_X0 + i, value)
    ret = _UC_CODE + len(func_code)
    uc.reg_write(A.UC_ARM64_REG_LR, ret)
    uc.reg_write(A.UC_ARM64_REG_SP, _UC_STACK + _UC_STACK_SIZE - 64)
    try:
        uc.emu_start(_UC_CODE, ret, count=max_instructions)
    except unicorn.UcError as e:
        off = uc.reg_read(A.UC_ARM64_REG_PC) - _UC_CODE
        what = ""
        if 0 <= off < len(func_code):
            try:
                from .assembler import disassemble
                what = " (" + disassemble(func_code[off:off + 4]).split("  ", 1)[1].strip() + ")"
            except ImportError:
                pass
        raise EmulationError(f"unicorn: {e} at code offset {off:#x}{what}; unicorn 2.1 models SVE but "
                             "not BF16/I8MM/F32MM (use run_qemu for those)") from None
    if uc.reg_read(A.UC_ARM64_REG_PC) != ret:
        raise EmulationError(f"kernel did not return within {max_instructions} instructions")
    _scatter(bytes(uc.mem_read(_UC_DATA, len(data))), data, writable, outs)
