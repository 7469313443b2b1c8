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
