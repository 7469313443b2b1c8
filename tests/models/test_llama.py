"""The LLaMA-style decoder layer (bench.models.llama) at a small shape against a float64 NumPy
reference with the same (bf16-rounded or int8-dequantized) weights: a prompt (prefill, causal
attention, cache filled), then tokens decoded one by one against the cache, crossing a key block."""
import numpy as np
import pytest

from bench.models.llama import KEY_BLOCK, LlamaLayer
from bench.models.llama_weights import Config, random_weights, reference_layer

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
@pytest.mark.parametrize("prompt", [5, 62])
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
    assert KEY_BLOCK < 62 + 4


def test_refused():
    w = random_weights(CFG)
    with pytest.raises(ValueError, match="dtype"):
        LlamaLayer(CFG, w, "f16")
    layer = LlamaLayer(CFG, w, "bf16")
    with pytest.raises(ValueError, match="rows"):
        layer.prefill(np.zeros((3, CFG.hidden + 1), np.float32))
    with pytest.raises(ValueError, match="one row"):
        layer.decode(np.zeros((2, CFG.hidden), np.float32), 3)
    with pytest.raises(ValueError, match="position"):
        layer.decode(np.zeros((1, CFG.hidden), np.float32), CFG.max_len)
