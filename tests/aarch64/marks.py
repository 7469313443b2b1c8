"""Skip marks for the AArch64 tests: each says why an emulator (or the SVE host) is unavailable."""
import pytest

from isa.aarch64.emulate import qemu_skip_reason, unicorn_skip_reason
from isa.aarch64.native import sve_runner_skip_reason

needs_qemu = pytest.mark.skipif(qemu_skip_reason() is not None, reason=str(qemu_skip_reason()))
needs_unicorn = pytest.mark.skipif(unicorn_skip_reason() is not None, reason=str(unicorn_skip_reason()))


def needs_sve_runner(vl_bits, skip_reason=sve_runner_skip_reason):
    """Skip unless ``run_calls`` can run at ``vl_bits``: natively on this SVE host, or under qemu
    (``skip_reason=native_skip_reason``: natively only)."""
    reason = skip_reason(vl_bits)
    return pytest.mark.skipif(reason is not None, reason=str(reason))


def vl_params(vls, skip_reason=sve_runner_skip_reason):
    """One pytest param per vector length, each skipped (with the reason) where it cannot run."""
    return [pytest.param(bits, marks=needs_sve_runner(bits, skip_reason), id=f"vl{bits}") for bits in vls]
