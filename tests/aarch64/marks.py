"""Skip marks for the AArch64 tests: each says why an emulator is unavailable."""
import pytest

from isa.aarch64.emulate import qemu_skip_reason, unicorn_skip_reason

needs_qemu = pytest.mark.skipif(qemu_skip_reason() is not None, reason=str(qemu_skip_reason()))
needs_unicorn = pytest.mark.skipif(unicorn_skip_reason() is not None, reason=str(unicorn_skip_reason()))
