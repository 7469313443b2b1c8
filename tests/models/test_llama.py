"""The LLaMA-style decoder layer (bench.models.llama) at a small shape against a float64 NumPy
reference with the same (bf16-rounded or int8-dequantized) weights: a prompt (prefill, causal
attention, cache filled; longer than a causal query block), then tokens decoded one by one against
the cache, crossing a key block."""
import numpy as np
import pytest

import tppasm as tpp

from bench.models.llama import KEY_BLOCK, LlamaLayer
from bench.models.llama_step import QUERY_BLOCK
from bench.models.llama_weights import Config, random_weights, reference_layer, rms_norm, rope

CFG = Config.small()
# relative to the output's largest value: bf16 activations (and, for i8, per-token u8 activations)
TOLERANCE = {"bf16": 1.5e-2, "i8": 4e-2}


def effective_weights(layer, w):
    """The weights the kernels really use (bf16-rounded or int8 * scale), for the reference."""
    D, F = CFG.hidden, CFG.ffn
    qkv, w13 = layer.qkv.dequantized, layer.gu.dequantized.reshape(D, F // 64, 2, 64)
    return {**w, "wq": qkv[:, :D], "wk": qkv[:, D:D + CFG.kv_dim], "wv": qkv[:, D + CFG.kv_dim:],
            "wo": layer.o.dequantized, "w1": w13[:, :, 0].reshape(D, F), "w3": w13[:, :, 1].reshape(D, F),
            "w2": layer.down.dequantized}


@pytest.mark.parametrize("dtype", ["bf16", "i8"])
@pytest.mark.parametrize("prompt", [5, 62, 100])
def test_prefill_then_decode(dtype, prompt):
    w = random_weights(CFG)
    layer = LlamaLayer(CFG, w, dtype)
    ref_w = effective_weights(layer, w)
    rng = np.random.default_rng(prompt)
    k_cache, v_cache = np.zeros((CFG.max_len, CFG.kv_dim)), np.zeros((CFG.max_len, CFG.kv_dim))
    x = rng.standard_normal((prompt, CFG.hidden)).astype(np.float32)
    want = reference_layer(CFG, ref_w, x, k_cache, v_cache, 0)
    got = layer.prefill(x)
    assert np.abs(got - want).max() <= TOLERANCE[dtype] * np.abs(want).max()
    for pos in range(prompt, min(prompt + 4, CFG.max_len)):           # 62..65 crosses a key block
        x = rng.standard_normal((1, CFG.hidden)).astype(np.float32)
        want = reference_layer(CFG, ref_w, x, k_cache, v_cache, pos)
        got = layer.decode(x, pos)
        assert np.abs(got - want).max() <= TOLERANCE[dtype] * np.abs(want).max(), pos
    assert KEY_BLOCK < 62 + 4 and QUERY_BLOCK < 100


def reference_context(w, x):
    """float64 attention output (before wo) of a prompt x at positions 0..T-1, causal."""
    T, d = x.shape[0], CFG.head_dim
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    xn = rms_norm(x.astype(np.float64), w["rms1"], CFG.eps)
    q, k, v = rope(xn @ w["wq"], range(T), CFG), rope(xn @ w["wk"], range(T), CFG), xn @ w["wv"]
    ctx = np.empty((T, CFG.hidden))
    for h in range(CFG.heads):
        g = h // CFG.group
        s = q[:, h * d:(h + 1) * d] @ k[:, g * d:(g + 1) * d].T / np.sqrt(d)
        s[np.triu_indices(T, 1)] = -np.inf
        p = np.exp(s - s.max(1, keepdims=True))
        ctx[:, h * d:(h + 1) * d] = (p / p.sum(1, keepdims=True)) @ v[:, g * d:(g + 1) * d]
    return ctx


@pytest.mark.parametrize("prompt", [QUERY_BLOCK - 1, QUERY_BLOCK + 37])
def test_prefill_attention_in_causal_blocks(prompt):
    """The attention output itself (the layer's output is dominated by its residual): every query
    row of every causal block sees exactly the keys up to its own position."""
    w = random_weights(CFG)
    layer = LlamaLayer(CFG, w, "bf16")
    x = np.random.default_rng(prompt).standard_normal((prompt, CFG.hidden)).astype(np.float32)
    layer.prefill(x)
    got = layer._step(prompt, None).Ctx.astype(np.float64)
    want = reference_context(effective_weights(layer, w), x)
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()


@pytest.mark.parametrize("dtype", ["bf16", "i8"])
def test_paced_decoding_changes_no_result(dtype, monkeypatch):
    """``pace`` reaches the BRGEMMs of decoding (one row) and of no prefill (64 rows), and the
    outputs are the same bit for bit."""
    import bench.models.llama_step as step
    built, original = [], tpp.brgemm

    def brgemm(m, n, k, dtype, **kw):
        built.append((m, kw.get("pace", 0)))
        return original(m, n, k, dtype, **kw)
    monkeypatch.setattr(step.tpp, "brgemm", brgemm)
    w = random_weights(CFG)
    rng = np.random.default_rng(3)
    x, x1 = rng.standard_normal((64, CFG.hidden)).astype(np.float32), rng.standard_normal((1, CFG.hidden))
    plain, paced = LlamaLayer(CFG, w, dtype), LlamaLayer(CFG, w, dtype, pace=8)
    assert np.array_equal(plain.prefill(x), paced.prefill(x))
    assert all(pace == 0 for _, pace in built)
    for pos in (64, 65):
        assert np.array_equal(plain.decode(x1, pos), paced.decode(x1, pos))
    assert {pace for m, pace in built if m == 1} == {0, 8}


def test_refused():
    w = random_weights(CFG)
    with pytest.raises(ValueError, match="dtype"):
        LlamaLayer(CFG, w, "f16")
    for pace in (-1, 65, 2.5, True):
        with pytest.raises(ValueError, match="pace"):
            LlamaLayer(CFG, w, "bf16", pace=pace)
    layer = LlamaLayer(CFG, w, "bf16")
    with pytest.raises(ValueError, match="rows"):
        layer.prefill(np.zeros((3, CFG.hidden + 1), np.float32))
    with pytest.raises(ValueError, match="one row"):
        layer.decode(np.zeros((2, CFG.hidden), np.float32), 3)
    with pytest.raises(ValueError, match="position"):
        layer.decode(np.zeros((1, CFG.hidden), np.float32), CFG.max_len)


def test_profile_times_every_step():
    """bench llm --profile: a row per nest of both phases, and the whole step (no figure checked)."""
    from bench.llm import profile_llm
    rep = profile_llm(CFG, 8, [1], ["i8"], runs=1)
    names = [(r["phase"], r["step"]) for r in rep.rows]
    for phase in ("first token", "next token"):
        steps = [s for p, s in names if p == phase]
        assert steps[-1] == "whole step" and {"norm1", "qkv", "attention", "gate_up", "down", "quant_o"} <= set(steps)
    assert ("next token", "cache") in names


def test_bench_prompt_must_fit_the_cache(capsys):
    """``python -m bench llm --small`` picks a prompt its cache holds; a prompt that leaves no
    position for the next token is refused by name, before any work."""
    from bench.llm import main
    with pytest.raises(SystemExit):
        main(["--small", "--prompt", str(CFG.max_len)])
    assert f"--prompt {CFG.max_len}" in capsys.readouterr().err
    assert main(["--small", "--profile", "--threads", "1", "--dtypes", "i8", "--runs", "1"]) == 0
    assert "(prompt 64;" in capsys.readouterr().out
