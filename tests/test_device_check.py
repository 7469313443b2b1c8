"""bench/device_check.sh, the prepared check for a lent device machine: its steps, their order and
their outputs in both phases, with a stand-in for Python (the real run takes minutes and wants many
cores)."""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "device_check.sh"


def run_check(tmp_path, amx, phase):
    stub = tmp_path / "python"
    stub.write_text('#!/bin/sh\nif [ "$1" = "-c" ]; then exit "$FAKE_CHECK"; fi\necho "ran: $*"\n')
    stub.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PY": str(stub), "OUT": str(out), "FAKE_CHECK": "0" if amx else "1"}
    proc = subprocess.run(["bash", str(SCRIPT), phase], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    steps = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("== ") and "(limit" in line]
    assert {p.name for p in out.iterdir()} == {f"{s}.txt" for s in steps}
    assert len(steps) <= 8          # the tool brings back at most 8 files a call
    return steps, {s: (out / f"{s}.txt").read_text() for s in steps}, out


@pytest.mark.parametrize("amx", [True, False])
def test_phase_one(tmp_path, amx):
    steps, text, _ = run_check(tmp_path, amx, "1")
    if amx:
        assert steps == ["host", "tpp-amx", "gemm", "mlp", "bert", "conv", "amx-micro", "llm"]
        assert "--sizes 1024,2048 --dtypes bf16 --threads 1,2" in text["gemm"]
        assert "-m bench mlp --dtypes bf16 --threads 1,2" in text["mlp"]
        assert "-m bench bert --shapes 8x128,1x32 --threads 1,2 --dtypes bf16" in text["bert"]
        micro = text["amx-micro"]
        assert "-m bench amx-micro --figures /tmp/amx-figures.json" in micro
        assert "-m bench amx-static --quick --choices --figures /tmp/amx-figures.json" in micro
        assert "-m bench amx-variants" in micro
        assert "--dtypes bf16" in text["conv"]
        tpp = text["tpp-amx"]
        assert [line.split("=")[1] for line in tpp.splitlines() if line.startswith("## ")] == ["auto", "0"]
        assert tpp.count("-m bench.tpp_gemm --shapes bf16:64:16,i8:64:16") == 2
    else:
        assert steps == ["host", "gemm", "mlp", "llm", "bert"]
        assert "--dtypes f32,bf16 --threads 1" in text["gemm"]
        assert "-m bench llm --threads 1" in text["llm"]
        assert "--dtypes f32,bf16" in text["bert"]


@pytest.mark.parametrize("amx", [True, False])
def test_phase_two(tmp_path, amx):
    steps, text, _ = run_check(tmp_path, amx, "2")
    assert "-m bench gemm --sizes 1024 --dtypes f32,bf16 --threads" in text["gemm-all"]
    if amx:
        assert steps == ["conv-weak", "bert-f32", "llm-profile", "gemm-all", "conv-f32"]
        assert "--batch 8 --threads 2 --dtypes bf16 --layers res5a_branch1," in text["conv-weak"]
        assert "--quick" not in text["conv-weak"]
        assert "--quick --batch 8 --threads 2 --dtypes f32" in text["conv-f32"]
        assert "bench bert --profile --shapes 8x128 --threads 1 --dtypes f32" in text["bert-f32"]
        assert text["llm-profile"].count("-m bench llm") == 2 and "--profile" in text["llm-profile"]
    else:
        assert steps == ["conv-all", "gemm-all", "mlp-all"]
        assert "--dtypes f32" in text["conv-all"]


def test_steps_past_the_deadline_are_skipped(tmp_path):
    stub = tmp_path / "python"
    stub.write_text('#!/bin/sh\nif [ "$1" = "-c" ]; then exit 1; fi\nsleep 2\necho "ran: $*"\n')
    stub.chmod(0o755)
    env = {**os.environ, "PY": str(stub), "OUT": str(tmp_path / "out"), "DEADLINE": "19"}
    proc = subprocess.run(["bash", str(SCRIPT), "1"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    skipped = [line.split()[1].rstrip(":") for line in proc.stdout.splitlines() if "skipped" in line]
    assert skipped and "bert" in skipped and "host" not in skipped


def test_minilm_weights_travel_as_float16(tmp_path):
    """bench.device_carry: the package packed without its 87 MiB model file fits a call (64 MiB with
    the repository), and expanded there gives the weights back, float16-rounded."""
    import numpy as np
    from safetensors.numpy import load_file

    from bench import device_carry
    from bench.models.minilm import model_dir
    dest = tmp_path / "carry"
    device_carry.pack(str(dest))
    files = [p for p in dest.rglob("*") if p.is_file()]
    assert device_carry.MODEL not in {p.name for p in files}
    assert sum(p.stat().st_size for p in files) < 50 << 20
    target = device_carry.expand(str(dest))
    got, want = load_file(target), load_file(str(pathlib.Path(model_dir()) / device_carry.MODEL))
    assert got.keys() == want.keys()
    for name, w in want.items():
        assert got[name].dtype == w.dtype and got[name].shape == w.shape
        np.testing.assert_array_equal(got[name], w.astype(np.float16).astype(w.dtype) if w.dtype == np.float32 else w)
