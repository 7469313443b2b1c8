"""Building a kernel interrupted or raced: a signal handler that builds a kernel while its own
thread is generating one gets its kernel (generated in memory) instead of waiting forever for the
generation lock its thread holds; a descriptor built while another thread imports torch reads
its dtype fields as usual.

Each signal scenario runs in a fresh interpreter with a timeout, so that a deadlock fails the
test. The signal is raised from inside the generation (``tppasm.kernel._generate`` wrapped), so
its handler runs there, deterministically."""
import sys
import types

import numpy as np
import pytest

import tppasm.kernel as tk
from tppasm.eltwise import Unary

from tests.scripts import run

SCRIPT = r"""
import signal, numpy as np, tppasm as tpp, tppasm.kernel as tk
tpp.unary("exp", 2, 2)                       # host detection and tables, outside the test
state = {"generating": False, "raised": False, "made": []}
def on_signal(*_):
    assert state["generating"]               # the main thread is inside its generation
    state["made"].append(tpp.unary(*HANDLER_BUILDS))
signal.signal(signal.SIGUSR1, on_signal)
real = tk._generate
def generate(desc, isa):
    if (desc.op, desc.m, desc.n) == MAIN_BUILDS and not state["raised"]:
        state["generating"] = state["raised"] = True
        signal.raise_signal(signal.SIGUSR1)  # the handler runs here, while this thread holds tk._LOCK
        state["generating"] = False
    return real(desc, isa)
tk._generate = generate
k = tpp.unary(*MAIN_BUILDS)
(h,) = state["made"]
for kernel in (k, h):
    op, m, n = kernel.desc.op, kernel.desc.m, kernel.desc.n
    x = np.linspace(-2, 2, m * n, dtype=np.float32).reshape(m, n)
    np.testing.assert_allclose(kernel(x), kernel.reference(x), rtol=1e-5, atol=1e-6)
print("same" if h is k else "different", h is tpp.unary(*HANDLER_BUILDS), k is tpp.unary(*MAIN_BUILDS))
"""


@pytest.mark.parametrize("cache", ["0", "1"])
def test_handler_builds_another_kernel_inside_generation(cache, tmp_path):
    out = run(SCRIPT.replace("MAIN_BUILDS", "('gelu', 7, 9)").replace("HANDLER_BUILDS", "('exp', 3, 5)"),
              {"TPPASM_CACHE": cache, "TPPASM_CACHE_DIR": str(tmp_path)}, timeout=60)
    assert out.split() == ["different", "True", "True"]


def test_handler_builds_the_kernel_being_generated():
    """Both get the same kernel object: the one the handler made first is kept."""
    out = run(SCRIPT.replace("MAIN_BUILDS", "('gelu', 5, 6)").replace("HANDLER_BUILDS", "('gelu', 5, 6)"),
              {"TPPASM_CACHE": "0"}, timeout=60)
    assert out.split() == ["same", "True", "True"]


def test_dtype_field_while_torch_is_half_imported(monkeypatch):
    """Another thread is importing torch: sys.modules holds it, without its attributes yet."""
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    assert tk._dtype_like(np.float32) and tk._dtype_like("f32") and not tk._dtype_like([1])
    assert Unary("relu", 2, 3, dtype=np.float32).dtype == Unary("relu", 2, 3).dtype
