"""tppasm as a user installs it: imported from a zip (a wheel on sys.path, a zipapp), outside the
checkout, where the kernel cache's key cannot list source files with os.scandir."""
import os
import pathlib
import subprocess
import sys
import sysconfig
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

PROGRAM = """
import numpy as np, tppasm, loops.remembered
assert ".zip" in tppasm.__file__, tppasm.__file__
x = np.arange(16, dtype=np.float32).reshape(4, 4) - 8
y = np.full_like(x, np.nan)
tppasm.relu(4, 4)(x, y)
assert (y == np.maximum(x, 0)).all(), y
print(tppasm.backends.source_version("avx2"), loops.remembered.disk_key.__name__)
"""


def _zip_of_packages(path):
    with zipfile.ZipFile(path, "w") as z:
        for package in ("isa", "tppasm", "loops"):
            for f in sorted((ROOT / package).rglob("*.py")):
                z.write(f, f.relative_to(ROOT).as_posix())


def test_kernels_run_when_tppasm_is_imported_from_a_zip(tmp_path):
    archive = tmp_path / "tppasm.zip"
    _zip_of_packages(archive)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "TPPASM_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(archive), sysconfig.get_paths()["purelib"],
                                          sysconfig.get_paths()["platlib"]])}
    for cache in ("1", "0"):
        run = subprocess.run([sys.executable, "-S", "-c", PROGRAM], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120, env=dict(env, TPPASM_CACHE=cache))
        assert run.returncode == 0, run.stderr[-2000:]
        assert len(run.stdout.split()[0]) == 16


def test_aarch64_disassembly_without_capstone_names_the_pip_command(monkeypatch):
    from isa.aarch64 import Assembler, disassemble
    monkeypatch.setitem(sys.modules, "capstone", None)        # as if it were not installed
    a = Assembler()
    a.ret()
    for call in (lambda: disassemble(bytes.fromhex("c0035fd6")), a.disassemble):
        with pytest.raises(ModuleNotFoundError, match=r"pip install capstone") as e:
            call()
        assert e.value.name == "capstone"


# -- the kernel cache's key where the sources are not there (fz18a 1, 2) -----------------------------

_EMPTY = "e3b0c44298fc1c14"          # SHA-256 of nothing: what a key of no file used to be


@pytest.fixture
def moved_backends(tmp_path, monkeypatch):
    """tppasm.backends as if imported from ``tmp_path/tppasm`` (its version cache emptied, this
    process's disk stores set aside): the folder to fill in."""
    from tppasm import backends
    from tppasm.cache import disk
    monkeypatch.setattr(backends, "__file__", str(tmp_path / "tppasm" / "backends.pyc"))
    for name, value in (("_VERSIONS", {}), ("_UNVERSIONED", {}), ("_WARNED", [])):
        monkeypatch.setattr(backends, name, value, raising=False)
    monkeypatch.setattr(disk, "_STORES", type(disk._STORES)())
    return backends


def test_an_install_without_sources_keys_kernels_by_its_pyc_files(moved_backends, tmp_path):
    for rel in ("tppasm/x86/eltwise.pyc", "tppasm/layout.pyc", "isa/x86/asm.pyc"):     # compileall -b, no .py
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"code")
    before = moved_backends.source_version("avx2")
    assert before != _EMPTY and not moved_backends._UNVERSIONED
    moved_backends._VERSIONS.clear()
    os.utime(tmp_path / "tppasm/x86/eltwise.pyc", ns=(1, 1))          # another build of the code
    assert moved_backends.source_version("avx2") != before


def test_code_whose_files_cannot_be_found_turns_the_cache_off_with_one_warning(moved_backends, tmp_path):
    from tppasm.cache import disk
    store = disk.DiskStore(tmp_path / "cache", cap_bytes=1 << 20)
    with pytest.warns(RuntimeWarning, match=r"not using the kernel cache: .*tppasm/x86 cannot be listed") as said:
        first = moved_backends.source_version("avx2")      # a frozen app: the package folders do not exist
        moved_backends.tree_version(("loops/**/*.py",))
    assert len(said) == 1 and store.failure is not None        # the store writes nothing more
    store.put("kernel/k", b"\xc3", {})
    assert store.get("kernel/k") is None
    moved_backends._VERSIONS.clear()
    assert moved_backends.source_version("avx2") not in (first, _EMPTY)     # no other process's key matches


def test_a_frozen_app_keys_kernels_by_its_executable(moved_backends, tmp_path, monkeypatch):
    executable = tmp_path / "app"
    executable.write_bytes(b"\x7fELF")
    monkeypatch.setattr(sys, "frozen", True, raising=False)          # PyInstaller: the modules are inside it
    monkeypatch.setattr(sys, "executable", str(executable))
    before = moved_backends.source_version("avx2")
    moved_backends._VERSIONS.clear()
    assert moved_backends.source_version("avx2") == before and not moved_backends._UNVERSIONED
    os.utime(executable, ns=(1, 1))                                  # the app rebuilt
    moved_backends._VERSIONS.clear()
    assert moved_backends.source_version("avx2") != before
