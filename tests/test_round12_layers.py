"""Round 12 fixes of the layers and the bench command line: an interrupted LlamaLayer decode leaves
a consistent cache, tppasm.torch.linear and tppasm.fc agree on the bias and say what to pass,
tppasm.torch.Linear takes tppasm's dtype names, swiglu's kernel and reference agree on infinities,
and ``python -m bench`` survives a missing torch and ``python -OO``."""
import json
import os
import pathlib
import re
import subprocess
import sys
import types

import numpy as np
import pytest

import bench.__main__ as bench_main
import tppasm
import tppasm.fc as fc
from tppasm.dtypes import dtype as tppasm_dtype

ROOT = pathlib.Path(__file__).resolve().parent.parent


# 1. LlamaLayer: a go-back decode interrupted while its step runs

@pytest.mark.parametrize("where", ["run", "forget"])
def test_an_interrupted_go_back_decode_leaves_a_consistent_cache(monkeypatch, where):
    from bench.models import llama, llama_step
    from bench.models.llama_weights import Config, random_weights
    cfg = Config.small()
    w = random_weights(cfg)
    rng = np.random.default_rng(0)
    prompt, back, nxt = (rng.standard_normal((t, cfg.hidden), np.float32) for t in (12, 1, 1))
    layer, fresh = llama.LlamaLayer(cfg, w, "bf16"), llama.LlamaLayer(cfg, w, "bf16")
    layer.prefill(prompt)
    fresh.prefill(prompt[:5])

    def interrupted(*args):
        raise KeyboardInterrupt
    with monkeypatch.context() as m:
        if where == "run":
            m.setattr(llama_step.Step, "run", interrupted)
        else:                                   # Ctrl-C while the later positions are being zeroed
            m.setattr(llama.LlamaLayer, "_forget", interrupted)
        with pytest.raises(KeyboardInterrupt):
            layer.decode(back, 5)
    assert layer.length == 5                    # it no longer claims the positions it was forgetting
    with pytest.raises(ValueError, match="decode the tokens in order"):
        layer.decode(nxt, 12)
    np.testing.assert_array_equal(layer.decode(nxt, 5), fresh.decode(nxt, 5))
    np.testing.assert_array_equal(layer.decode(nxt, 6), fresh.decode(nxt, 6))


# 2. tppasm.torch.linear and tppasm.fc: the bias, and the dtype messages

@pytest.fixture(scope="module")
def tt():
    """tppasm.torch (importing torch takes seconds: once for the module's tests)."""
    pytest.importorskip("torch")
    import tppasm.torch
    return tppasm.torch


def test_linear_takes_a_0d_bias_as_torch_does_and_its_gradient_is_the_sum(tt):
    import torch
    x, w = torch.randn(4, 8), torch.randn(6, 8)
    bias = torch.tensor(0.5, requires_grad=True)
    y = tt.linear(x, w, bias)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w, bias.detach()))
    y.sum().backward()
    assert bias.grad.shape == () and float(bias.grad) == 24.0
    torch.testing.assert_close(tt.linear(x, w, torch.as_tensor(0.5)), tt.linear(x, w, torch.as_tensor([0.5])))


def test_the_advice_for_a_python_scalar_bias_works(tt):
    import torch
    x, w = torch.randn(4, 8), torch.randn(6, 8)
    with pytest.raises(TypeError, match=r"pass torch.as_tensor\(bias\)"):
        tt.linear(x, w, 0.5)
    assert tt.linear(x, w, torch.as_tensor(0.5)).shape == (4, 6)


def test_a_bias_of_other_shapes_is_refused_with_a_fix_that_works(tt):
    import torch
    x, w, bias = torch.randn(4, 8), torch.randn(6, 8), torch.randn(1, 6)
    with pytest.raises(ValueError, match=r"bias has shape \(1, 6\); expected \(6,\).*pass bias.reshape\(6\)"):
        tt.linear(x, w, bias)
    torch.testing.assert_close(tt.linear(x, w, bias.reshape(6)), torch.nn.functional.linear(x, w, bias))
    with pytest.raises(ValueError, match=r"pass bias.expand\(6\)"):
        torch.ops.tppasm.linear(x, w, torch.tensor(0.5), None)


def test_linear_and_fc_take_the_same_biases(tt):
    """A bf16 layer takes its bias in float32 or bfloat16, in tppasm.torch.linear as in fc.forward."""
    import torch
    bf16 = tppasm_dtype("bf16")
    x, w = torch.randn(4, 8).bfloat16(), torch.randn(6, 8).bfloat16()
    b32 = torch.randn(6)
    want = tt.linear(x, w, b32.bfloat16())
    bias = b32.bfloat16().float().requires_grad_()
    got = tt.linear(x, w, bias)
    torch.testing.assert_close(got, want)
    got.float().sum().backward()
    assert bias.grad.dtype == torch.float32
    xn, wn = tt.ops._view(x), tt.ops._view(w)
    y32, _ = fc.forward(xn, wn, b32.bfloat16().float().numpy())
    y16, _ = fc.forward(xn, wn, np.asarray(b32.numpy(), bf16))
    np.testing.assert_array_equal(y16.astype(np.float32), y32.astype(np.float32))
    with pytest.raises(TypeError, match=r"bias is torch.bfloat16 and x torch.float32; .*pass bias.float\(\)"):
        tt.linear(x.float(), w.float(), b32.bfloat16())


@pytest.mark.parametrize("call, message", [
    (lambda bf: fc.forward(np.ones((3, 4), bf), np.ones((5, 4), np.float32)),
     re.escape("fc.forward: x is bfloat16 and w float32; expected all float32 or all bfloat16 (a bias: float32 or "
               "x's dtype): pass w.astype(x.dtype)")),
    (lambda bf: fc.backward(np.ones((3, 5), bf), np.ones((3, 4), np.float32), np.ones((5, 4), np.float32)),
     re.escape("fc.backward: dy is bfloat16, x float32, w float32; expected all float32 or all bfloat16 (a bias: "
               "float32 or x's dtype): pass dy.astype(x.dtype)")),
    (lambda bf: fc.forward(np.ones((3, 4)), np.ones((5, 4))),
     r"x is float64 and w float64; .*: pass x\.astype\(np\.float32\), w\.astype\(np\.float32\)"),
    (lambda bf: fc.forward(np.ones((3, 4), bf), np.ones((5, 4), bf), np.ones(5)),
     r"bias must be float32 of shape \(5,\) or bfloat16 as x, got float64"),
    (lambda bf: fc.forward(np.ones((3, 4), bf), fc.pack(np.ones((5, 4), np.float32))),
     re.escape("pass tppasm.fc.pack(w.astype(x.dtype)) (from the weight before packing)")),
], ids=["forward", "backward", "both float64", "bias", "packed"])
def test_fc_dtype_messages_name_each_argument_in_order_and_the_fix(call, message):
    with pytest.raises(ValueError, match=message):
        call(tppasm_dtype("bf16"))


# 3. tppasm.torch.Linear(dtype=...) in tppasm's names

def test_linear_layer_takes_tppasm_dtype_names(tt):
    import torch
    assert tt.Linear(3, 2, dtype="bf16").weight.dtype is torch.bfloat16
    assert tt.Linear(3, 2, dtype="f32").bias.dtype is torch.float32
    assert tt.Linear(3, 2, dtype=torch.float64).weight.dtype is torch.float64      # torch's own, as before
    with pytest.raises(TypeError, match=r"tppasm.torch.Linear: dtype='i8'; expected torch.float32 or torch.bfloat16 "
                                        r"\(or tppasm's 'f32' or 'bf16'\)"):
        tt.Linear(3, 2, dtype="i8")


# 4. swiglu: kernel and reference agree where fp32's exp overflows

def test_swiglu_kernel_and_reference_agree_where_the_sigmoid_underflows(isa_level):
    """fp32's exp(-g) overflows below g = -88.7228: silu(g) is -0.0, times +-inf NaN, in both."""
    gate = np.float32([[-50, -88.5, -88.72283, -88.72284, -100, -104, -200, -700, -1e9, 3, -np.inf]])
    k = tppasm.swiglu(1, gate.shape[1])
    for up in (np.inf, -np.inf, 1e38, 1.0):
        u = np.full_like(gate, up)
        out, ref = k(gate, u), np.empty_like(gate)
        k.reference(gate, u, ref)
        np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=0)
        np.testing.assert_array_equal(np.signbit(out), np.signbit(ref))


# 5. python -m bench: a suite module that needs a missing package, or raises

def fake_modules(monkeypatch, mains):
    """bench.__main__.run's suite modules replaced: module NAME runs ``mains[NAME](argv)``."""
    monkeypatch.setattr(bench_main, "importlib", types.SimpleNamespace(
        import_module=lambda name: types.SimpleNamespace(main=mains[name])))


def writes(records):
    def main(argv):
        with open(argv[argv.index("--json") + 1], "w") as f:
            json.dump(records, f)
        return 0
    return main


def raises(error):
    def main(argv):
        raise error
    return main


@pytest.mark.parametrize("error, said", [
    (ModuleNotFoundError("No module named 'torch'", name="torch"), r"needs torch: pip install -e .\[bench\]"),
    (SystemExit("torch is not installed (pip install -e .[bench])"), "exit status 1"),
    (RuntimeError("a bug"), "raised RuntimeError: a bug"),
])
def test_a_suite_that_raises_does_not_lose_the_records_of_the_others(tmp_path, monkeypatch, capsys, error, said):
    fake_modules(monkeypatch, {"bench.a": writes([{"table": "t", "v": 1}]), "bench.b": raises(error),
                               "bench.c": writes([{"table": "t", "v": 3}])})
    out = tmp_path / "run.json"
    with pytest.raises(SystemExit, match=f"failed: bench.b .*{said}") as e:
        bench_main.run(["bench.a", "bench.b", "bench.c"], [], str(out))
    assert "bench.a" not in str(e.value.code) and "bench.c" not in str(e.value.code)
    assert [r["v"] for r in json.loads(out.read_text())] == [1, 3]


def test_argparse_exits_of_a_suite_still_end_the_run(monkeypatch):
    fake_modules(monkeypatch, {"bench.a": raises(SystemExit(2)), "bench.b": writes([])})
    with pytest.raises(SystemExit) as e:
        bench_main.run(["bench.a", "bench.b"], [])
    assert e.value.code == 2


def test_ddp_without_torch_says_what_to_install(monkeypatch, capsys):
    import builtins
    from bench import ddp_mlp
    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_torch)
    assert ddp_mlp.main(["--steps", "1"]) == 1
    assert "pip install -e .[bench]" in capsys.readouterr().out


# 6. python -OO (docstrings stripped): the bench command line's help

@pytest.mark.parametrize("suite", [*bench_main.SUITES, "all", None])
def test_bench_help_works_without_docstrings(suite):
    argv = [sys.executable, "-OO", "-m", "bench", *([suite] if suite else []), "--help"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and not proc.stdout.startswith("None")
    assert "python -m bench" in proc.stdout
