import atexit
import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings

from tests.pins import differences

settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The suite never reads or fills the user's kernel cache: a fresh one per run (subprocesses inherit it).
os.environ["TPPASM_CACHE_DIR"] = tempfile.mkdtemp(prefix="tppasm-test-cache-")
atexit.register(shutil.rmtree, os.environ["TPPASM_CACHE_DIR"], True)

_OUTSIDE = differences()


def _pin_line():
    if not _OUTSIDE:
        return "pinned set: every installed package matches constraints.txt"
    return ("WARNING: running OUTSIDE the pinned set (constraints.txt); failures may come from these: "
            + "; ".join(_OUTSIDE) + ". Reinstall with ./dev.sh test, or refresh the pins with ./dev.sh pin")


def pytest_report_header(config):
    return _pin_line()


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(_pin_line(), yellow=bool(_OUTSIDE), bold=bool(_OUTSIDE))
