import atexit
import collections
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings

from isa.cpu import X86_LEVELS, host
from tests.pins import differences
from tests.support import kernel_level, native_levels

settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The suite never reads or fills the user's kernel cache: a fresh one per run (subprocesses inherit it).
os.environ["TPPASM_CACHE_DIR"] = tempfile.mkdtemp(prefix="tppasm-test-cache-")
atexit.register(shutil.rmtree, os.environ["TPPASM_CACHE_DIR"], True)

_OUTSIDE = differences()

# Every native call tppasm.fc hands the pool is checked as a kernel call would be (off outside tests).
import tppasm.fc_parallel  # noqa: E402
tppasm.fc_parallel.CHECK_RAW_CALLS = True


def _pin_line():
    if not _OUTSIDE:
        return "pinned set: every installed package matches constraints.txt"
    return ("WARNING: running OUTSIDE the pinned set (constraints.txt); failures may come from these: "
            + "; ".join(_OUTSIDE) + ". Reinstall with ./dev.sh test, or refresh the pins with ./dev.sh pin")


@pytest.fixture(params=native_levels())
def isa_level(request):
    """Run the test once per ISA level the host runs natively, kernels built inside targeting it."""
    with kernel_level(request.param):
        yield request.param


@pytest.fixture(autouse=True)
def _pool_tests_on_the_pools_threads(request):
    """The pool's own tests (tests/**/test_*pool*.py but test_pool_openmp.py) test its workers:
    their regions never run on torch's OpenMP threads, whatever an earlier test in the process
    shared (importing tppasm.torch does: isa.pool.share_openmp_threads)."""
    name = request.node.path.name
    if "pool" not in name or name == "test_pool_openmp.py":
        yield
        return
    from isa.pool_calls import on_the_pools_threads
    with on_the_pools_threads():
        yield


@pytest.fixture
def torch_threads():
    """Restore torch's thread count after a bench that sets it (for tests that import torch)."""
    import torch
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


# -- which ISA levels ran, and how -----------------------------------------------------------------
_LEVEL_RUNS = collections.Counter()        # (level, "native" | "interpreter" | "emulator", outcome)


_ISA_TESTS = ("tests/tpp/", "tests/loops/", "tests/x86/", "tests/test_demo.py")


def _levels_of(nodeid):
    """(level, how) of a test: from its parameters (``avx512``, ``avx512-interp``) or its file."""
    tokens = set(nodeid.replace("[", "-").replace("]", "-").split("-"))
    if nodeid.startswith("tests/aarch64/"):
        return [("sve", "native" if "sve" in host().levels else "emulator")]
    if nodeid.startswith("tests/tpp/test_amx.py") or nodeid.startswith("tests/loops/test_amx_nest.py"):
        return [("amx", "native" if "amx" in host().levels else "interpreter")]
    if not nodeid.startswith(_ISA_TESTS):
        return []
    how = "interpreter" if "interp" in tokens else "native"
    # (code of a level the host lacks runs only in the interpreter, whatever the test's id says)
    return [(level, how if level in host().levels else "interpreter") for level in X86_LEVELS if level in tokens]


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.skipped):
        for level, how in _levels_of(report.nodeid):
            _LEVEL_RUNS[level, how, "passed" if report.passed else "skipped" if report.skipped else "failed"] += 1


def _levels_line():
    parts = []
    for level, how in sorted({(lv, h) for lv, h, _ in _LEVEL_RUNS}, key=lambda p: (p[1] != "native", p[0])):
        done = _LEVEL_RUNS[level, how, "passed"] + _LEVEL_RUNS[level, how, "failed"]
        skipped = _LEVEL_RUNS[level, how, "skipped"]
        parts.append(f"{level} {how} ({done} tests{f', {skipped} skipped' if skipped else ''})")
    native = ", ".join(host().levels) or "none"
    return f"ISA levels: this host runs {native} natively; tested: " + ("; ".join(parts) or "none of the ISA tests")


def pytest_report_header(config):
    return [_pin_line(), f"ISA levels run natively here: {', '.join(native_levels()) or 'none'} "
                         "(TPP, loop and demo tests run at each; python -m tppasm info)"]


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(_levels_line())
    terminalreporter.write_line(_pin_line(), yellow=bool(_OUTSIDE), bold=bool(_OUTSIDE))
