"""bench/device_check.sh, the prepared check for a lent device machine: its steps, their order and
their outputs, with a stand-in for Python (the real run takes minutes and wants many cores)."""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "device_check.sh"


@pytest.mark.parametrize("amx", [True, False])
def test_steps_and_outputs(tmp_path, amx):
    stub = tmp_path / "python"
    stub.write_text('#!/bin/sh\nif [ "$1" = "-c" ]; then exit "$FAKE_CHECK"; fi\necho "ran: $*"\n')
    stub.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PY": str(stub), "OUT": str(out), "FAKE_CHECK": "0" if amx else "1"}
    proc = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    steps = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("== ") and "(limit" in line]
    amx_steps = ["amx-micro", "tpp-amx"]
    assert steps == ["host"] + (amx_steps if amx else []) + ["gemm", "llm"]
    assert {p.name for p in out.iterdir()} == {f"{s}.txt" for s in steps}
    gemm = (out / "gemm.txt").read_text()
    assert "-m bench gemm" in gemm and f"--dtypes {'bf16' if amx else 'f32'}" in gemm
    assert "--threads 1" in (out / "llm.txt").read_text()
    if amx:
        micro = (out / "amx-micro.txt").read_text()
        assert f"-m bench amx-micro --figures {out}/amx-figures.json" in micro
        assert f"-m bench amx-static --quick --choices --figures {out}/amx-figures.json" in micro
        tpp = (out / "tpp-amx.txt").read_text()
        assert [line.split("=")[1] for line in tpp.splitlines() if line.startswith("## ")] == ["0", "1", "auto"]
        assert tpp.count("-m bench.tpp_gemm --shapes bf16:64:16") == 3
