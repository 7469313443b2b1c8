import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from isa.aarch64.emulate import qemu_skip_reason, unicorn_skip_reason  # noqa: E402

needs_qemu = pytest.mark.skipif(qemu_skip_reason() is not None, reason=str(qemu_skip_reason()))
needs_unicorn = pytest.mark.skipif(unicorn_skip_reason() is not None, reason=str(unicorn_skip_reason()))
