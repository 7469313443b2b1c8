"""Unusual environments (round 12): a relative cache directory whose working directory is gone, an
empty HOME, odd characters, blanks and a strict umask in the cache directory, tppasm.testing
without hypothesis, and a TPPASM_QEMU that names no executable."""
import contextlib
import doctest
import os
import stat
import subprocess
import sys

import pytest

import tppasm.cache as tc
import tppasm.testing as tt
from isa.aarch64.emulate import qemu_skip_reason
from isa.cpu import host, verification
from tppasm.__main__ import main as tppasm_main
from tppasm.cache.trust import check_directory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def fresh_cache(monkeypatch):
    """The cache's process state read again from the environment the test sets, and afterwards."""
    for name in ("TPPASM_CACHE_DIR", "XDG_CACHE_HOME", "TPPASM_CACHE"):
        monkeypatch.delenv(name, raising=False)
    tc.reset()
    yield monkeypatch
    tc.reset()


def _no_cwd():
    raise FileNotFoundError(2, "No such file or directory")


# 1. a relative TPPASM_CACHE_DIR and a working directory that is gone

def test_relative_cache_dir_without_a_working_directory_is_refused_with_a_warning(fresh_cache):
    fresh_cache.setenv("TPPASM_CACHE_DIR", "rel_cache")
    fresh_cache.setattr(os, "getcwd", _no_cwd)
    with pytest.warns(RuntimeWarning, match="TPPASM_CACHE_DIR") as said:
        assert tc.store() is None
    assert "rel_cache is relative" in str(said[0].message)
    assert "TPPASM_CACHE_DIR" in tc.info()["why"] and tc.directory() == "rel_cache"


def test_cache_info_without_a_working_directory_says_why(fresh_cache, capsys):
    fresh_cache.setenv("TPPASM_CACHE_DIR", "rel_cache")
    fresh_cache.setattr(os, "getcwd", _no_cwd)
    assert tppasm_main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert "state     rel_cache is relative" in out and "TPPASM_CACHE_DIR" in out


def test_kernels_run_in_memory_in_a_deleted_working_directory(tmp_path):
    gone = tmp_path / "gone"
    code = ("import os, warnings, numpy as np\n"
            f"os.chdir({str(gone)!r}); os.rmdir({str(gone)!r})\n"
            "import tppasm as tpp\n"
            "with warnings.catch_warnings(record=True) as said:\n"
            "    warnings.simplefilter('always')\n"
            "    print(tpp.relu(8, 8)(np.ones((8, 8), np.float32)).sum())\n"
            "print([str(w.message) for w in said])\n")
    gone.mkdir()
    env = {**os.environ, "TPPASM_CACHE_DIR": "rel_cache", "PYTHONPATH": ROOT}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("64.0\n") and "TPPASM_CACHE_DIR" in run.stdout


# 2. tppasm.testing without hypothesis

@contextlib.contextmanager
def without_hypothesis():
    """``import hypothesis`` fails inside the block (as where the test extra is not installed); only
    there: pytest's hypothesis plugin imports it between the test's phases."""
    saved = {name: sys.modules.pop(name, None) for name in ("hypothesis", "tppasm.testing.strategies")}
    sys.modules["hypothesis"] = None
    try:
        yield
    finally:
        for name, module in saved.items():
            sys.modules.pop(name, None)
            if module is not None:
                sys.modules[name] = module


def test_testing_lookups_of_other_names_work_without_hypothesis():
    with without_hypothesis():
        assert not hasattr(tt, "nope") and getattr(tt, "x", None) is None and not hasattr(tt, "__wrapped__")
        assert doctest.DocTestFinder().find(tt)


def test_testing_strategies_without_hypothesis_say_what_to_install():
    with without_hypothesis(), pytest.raises(ModuleNotFoundError, match=r"pip install hypothesis \(or the test extra"):
        tt.operands
    with without_hypothesis(), pytest.raises(ModuleNotFoundError, match=r"pip install hypothesis \(or the test extra"):
        from tppasm.testing.strategies import operands  # noqa: F401


def test_testing_serves_every_strategy():
    from tppasm.testing import strategies
    assert tt._STRATEGIES == tuple(strategies.__all__)
    assert tt.operands is strategies.operands and tt.strategies is strategies


# 3. an empty HOME

def test_empty_home_is_refused_like_a_relative_one(fresh_cache):
    fresh_cache.setenv("HOME", "")
    assert not os.path.isabs(tc.directory())            # not /.cache/tppasm
    assert tc.store() is None and "set TPPASM_CACHE_DIR" in tc.info()["why"]


def test_empty_home_with_an_absolute_xdg_cache_home_uses_it(fresh_cache, tmp_path):
    fresh_cache.setenv("HOME", "")
    fresh_cache.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tc.directory() == str(tmp_path / "tppasm")


def test_clearing_with_the_cache_off_never_resolves_a_relative_home(fresh_cache, tmp_path):
    fresh_cache.chdir(tmp_path)
    with tc.using(tmp_path / "rel" / ".cache" / "tppasm"):
        tc.remember("round12", "k", [1])
    fresh_cache.setenv("HOME", "rel")
    fresh_cache.setenv("TPPASM_CACHE", "0")
    assert tc.clear_directory() is None                 # not the one under the working directory
    fresh_cache.delenv("TPPASM_CACHE")
    with tc.using(tmp_path / "rel" / ".cache" / "tppasm"):
        assert tc.recall("round12", "k") == [1]


# 4. the directory's name and mode

def test_cache_info_prints_the_directory_escaped(fresh_cache, tmp_path, capsys):
    fresh_cache.setenv("TPPASM_CACHE_DIR", str(tmp_path) + "/new\nline\x1b[31mred\udcffbyte")
    assert tppasm_main(["cache", "info"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("directory ") and first.endswith("/new\\nline\\x1b[31mred\\udcffbyte")
    first.encode("utf-8")                               # strict: no surrogate reaches stdout


def test_cache_clear_prints_the_directory_escaped(fresh_cache, tmp_path, capsys):
    path = str(tmp_path) + "/esc\x1b[2J"
    with tc.using(path):
        tc.remember("round12", "k", [1])
        assert tppasm_main(["cache", "clear"]) == 0
    assert "\x1b" not in capsys.readouterr().out


def test_trailing_blanks_of_the_cache_dir_are_kept(fresh_cache, tmp_path):
    fresh_cache.setenv("TPPASM_CACHE_DIR", str(tmp_path / "trail "))
    assert tc.directory() == str(tmp_path / "trail ")
    fresh_cache.setenv("TPPASM_CACHE_DIR", " \t")      # only blanks: unset
    assert tc.directory() != os.path.abspath(" \t")


def test_a_directory_made_under_umask_277_is_writable_by_its_owner(tmp_path):
    path = tmp_path / "home" / "cache"
    old = os.umask(0o277)
    try:
        assert check_directory(str(path)) is None
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.parent.stat().st_mode) & 0o700 == 0o700


# 5. TPPASM_QEMU naming no executable

@pytest.mark.parametrize("value", ["/nonexistent/qemu-aarch64", " ", "/"])
def test_a_qemu_that_is_not_there_is_said_to_be_missing(monkeypatch, value, capsys):
    monkeypatch.setenv("TPPASM_QEMU", value)
    v = verification(host())
    assert v["qemu"] is None and "TPPASM_QEMU=" in v["runners"]["qemu-aarch64"]
    assert "TPPASM_QEMU=" in qemu_skip_reason()            # so the emulator tests skip, saying why
    tppasm_main(["info"])
    assert f"({value})" not in capsys.readouterr().out


def test_a_qemu_that_is_there_is_used(monkeypatch):
    monkeypatch.setenv("TPPASM_QEMU", sys.executable)
    v = verification(host())
    assert v["qemu"] == sys.executable and v["runners"]["qemu-aarch64"] is None
