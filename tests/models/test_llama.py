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
from tests.support import threads_disagreeing

CFG = Config.small()
# relative to the output's largest value: bf16 activations (and, for i8, per-token u8 activations)
TOLERANCE = {"bf16": 1.5e-2, "i8": 4e-2}


def effective_weights(layer, w, cfg=CFG):
    """The weights the kernels really use (bf16-rounded or int8 * scale), for the reference."""
    D, F = cfg.hidden, cfg.ffn
    bn = layer.gu.bn
    qkv, w13 = layer.qkv.dequantized, layer.gu.dequantized.reshape(D, F // bn, 2, bn)
    return {**w, "wq": qkv[:, :D], "wk": qkv[:, D:D + cfg.kv_dim], "wv": qkv[:, D + cfg.kv_dim:],
            "wo": layer.o.dequantized, "w1": w13[:, :, 0].reshape(D, F), "w3": w13[:, :, 1].reshape(D, F),
            "w2": layer.down.dequantized}


@pytest.mark.parametrize("dtype", ["bf16", "i8"])
@pytest.mark.parametrize("prompt", [5, 62, 100, 101])
def test_prefill_then_decode(dtype, prompt):
    w = random_weights(CFG)
    check_prefill_then_decode(LlamaLayer(CFG, w, dtype), w, prompt)


@pytest.mark.parametrize("dtype", ["bf16", "i8"])
@pytest.mark.parametrize("bn", [32, 64])
def test_panels_of_either_width(dtype, bn, monkeypatch):
    """Weight panels of 32 columns (AVX2 hosts) and 64 (the others), whichever this host takes."""
    import bench.models.llama as llama
    monkeypatch.setattr(llama, "panel_columns", lambda: bn)
    w = random_weights(CFG)
    layer = LlamaLayer(CFG, w, dtype)
    assert {lin.bn for lin in (layer.qkv, layer.o, layer.gu, layer.down)} == {bn}
    check_prefill_then_decode(layer, w, 62)


@pytest.mark.parametrize("bits", [7, 8])
def test_activation_codes_of_either_width(bits, monkeypatch):
    """int8 activations of 7 bits (hosts without a VNNI dot: vpmaddubsw) and of 8 (the others):
    kernels, quantizers and column offsets agree, whichever this host takes."""
    import bench.models.llama as llama
    monkeypatch.setattr(llama, "activation_bits", lambda: bits)
    w = random_weights(CFG)
    layer = LlamaLayer(CFG, w, "i8")
    assert {lin.a_bits for lin in (layer.qkv, layer.o, layer.gu, layer.down)} == {bits}
    assert (layer.o.offset == -(1 << (bits - 1)) * (layer.o.dequantized / layer.o.scale).round().sum(0)).all()
    check_prefill_then_decode(layer, w, 62)


def check_prefill_then_decode(layer, w, prompt):
    """``layer`` (of weights ``w``) on a prompt of ``prompt`` rows, then on four tokens, against the
    float64 reference layer."""
    dtype, ref_w = layer.dtype, effective_weights(layer, w)
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
    outputs are the same bit for bit as at pace 0 (the same kernels; on AMX hosts the AVX-512 ones)."""
    import bench.models.llama_step as step
    built, original = [], tpp.brgemm

    def brgemm(m, n, k, dtype, **kw):
        built.append((m, kw.get("pace", 0)))
        return original(m, n, k, dtype, **kw)
    monkeypatch.setattr(step.tpp, "brgemm", brgemm)
    w = random_weights(CFG)
    rng = np.random.default_rng(3)
    x, x1 = rng.standard_normal((64, CFG.hidden)).astype(np.float32), rng.standard_normal((1, CFG.hidden))
    plain, paced = LlamaLayer(CFG, w, dtype, pace=0), LlamaLayer(CFG, w, dtype, pace=8)
    assert np.array_equal(plain.prefill(x), paced.prefill(x))
    assert all(pace == 0 for _, pace in built)
    for pos in (64, 65):
        assert np.array_equal(plain.decode(x1, pos), paced.decode(x1, pos))
    assert {pace for m, pace in built if m == 1} == {0, 8}


@pytest.mark.parametrize("dtype", ["bf16", "i8"])
def test_decoding_kernels_on_an_amx_host(dtype, monkeypatch):
    """Where the host has AMX (here pretended: its AVX-512 kernels run on this host too), an int
    pace takes the AVX-512 kernels for the decoding projections and nothing else, "tiles" (or None)
    the host's own; decoding matches the same layer at pace 0 on the host's vector kernels bit for
    bit. Where it has no AMX, "tiles" is refused."""
    import bench.models.llama_step as step
    import bench.models.stream_pace as stream_pace
    from isa.cpu import host
    w = random_weights(CFG)
    if host().isa != "amx":
        with pytest.raises(ValueError, match="pace='tiles' takes AMX tile kernels"):
            LlamaLayer(CFG, w, dtype, pace="tiles")
    if "avx512" not in host().levels:
        pytest.skip("the AVX-512 kernels need an AVX-512 host")
    # the host's own kernels at pace 0, where they are AVX-512 ones (not AMX, nor AVX2 under TPPASM_ISA)
    reference = LlamaLayer(CFG, w, dtype, pace=0) if host().isa == "avx512" else None
    built, original = [], tpp.brgemm

    def brgemm(m, n, k, dtype, **kw):
        built.append((m, kw.get("isa")))
        return original(m, n, k, dtype, **kw)
    monkeypatch.setattr(step.tpp, "brgemm", brgemm)
    monkeypatch.setattr(stream_pace, "host", lambda: type("Host", (), {"isa": "amx"}))
    assert LlamaLayer(CFG, w, dtype, pace="tiles").stream == LlamaLayer(CFG, w, dtype).stream == {}
    layer = LlamaLayer(CFG, w, dtype, pace=8)
    assert layer.stream == {"pace": 8, "isa": "avx512"}
    rng = np.random.default_rng(5)
    x, x1 = rng.standard_normal((64, CFG.hidden)).astype(np.float32), rng.standard_normal((1, CFG.hidden))
    layer.prefill(x)
    assert {isa for m, isa in built} == {None}
    got = layer.decode(x1, 64)
    assert {isa for m, isa in built if m == 1} == {"avx512"}
    if reference is not None:
        reference.prefill(x)
        assert np.array_equal(got, reference.decode(x1, 64))


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


@pytest.mark.parametrize("fields, error, message", [
    ({"hidden": 0}, ValueError, "hidden=0; expected an int >= 1"),
    ({"kv_heads": -2}, ValueError, "kv_heads=-2"),
    ({"max_len": 0}, ValueError, "max_len=0"),
    ({"hidden": 128.0}, TypeError, "hidden=128.0; expected an int"),
    ({"heads": True}, TypeError, "heads=True"),
    ({"eps": 0.0}, ValueError, "eps=0.0; expected a finite number > 0"),
    ({"rope_base": float("nan")}, ValueError, "rope_base=nan"),
    ({"eps": "1e-5"}, TypeError, "eps='1e-5'; expected a number"),
    ({"kv_heads": 3}, ValueError, "heads=4 must be a multiple of kv_heads=3"),
    ({"hidden": 256}, ValueError, "hidden=256 must be heads [*] head_dim = 128"),
    ({"hidden": 124, "head_dim": 31}, ValueError, "head_dim=31 must be even"),
])
def test_config_refuses(fields, error, message):
    small = {"hidden": 128, "heads": 4, "kv_heads": 2, "head_dim": 32, "ffn": 256, "max_len": 128}
    with pytest.raises(error, match=message):
        Config(**{**small, **fields})


def test_config_takes_numpy_ints():
    cfg = Config(hidden=np.int64(128), heads=4, kv_heads=2, head_dim=32, ffn=np.int32(256), max_len=128)
    assert cfg == CFG and type(cfg.hidden) is int


@pytest.mark.parametrize("fields, message", [
    ({"hidden": 96, "heads": 3, "kv_heads": 1}, "hidden=96"),                 # not a multiple of 64
    ({"head_dim": 128, "heads": 1, "kv_heads": 1}, "head_dim=128"),           # does not divide 64
    ({"ffn": 576}, "ffn=576"),                                                # above 512: a multiple of 512
    ({"max_len": 101}, "max_len=101 must be even"),
])
def test_layer_refuses_shapes_its_kernels_cannot_run(fields, message):
    cfg = Config(**{**vars(CFG), **fields})
    with pytest.raises(ValueError, match=message):
        LlamaLayer(cfg, random_weights(cfg), "bf16")


def test_layer_refuses_bad_arguments():
    w = random_weights(CFG)
    with pytest.raises(TypeError, match="LlamaLayer: cfg=.*expected a bench.models.llama_weights.Config"):
        LlamaLayer(vars(CFG), w)
    with pytest.raises(TypeError, match="random_weights: cfg=.*expected a bench.models.llama_weights.Config"):
        random_weights(vars(CFG))
    with pytest.raises(TypeError, match="pool='x'; expected an isa.pool.Pool"):
        LlamaLayer(CFG, w, pool="x")
    with pytest.raises(ValueError, match="dtype=None"):
        LlamaLayer(CFG, w, None)


@pytest.mark.parametrize("change, error, message", [
    (lambda w: {k: v for k, v in w.items() if k != "w2"}, ValueError, "weights lack 'w2'"),
    (lambda w: {**w, "wk": w["wq"]}, ValueError, r"weights\['wk'\] has shape \(128, 128\); expected \(128, 64\)"),
    (lambda w: {**w, "rms1": np.ones(CFG.hidden, np.int64)}, TypeError, r"weights\['rms1'\] is int64"),
    (lambda w: {**w, "w1": np.full_like(w["w1"], np.inf)}, ValueError, "holds NaN or inf"),
    (lambda w: list(w.values()), TypeError, "expected a dict of arrays"),
])
@pytest.mark.parametrize("dtype", ["bf16", "i8"])
def test_layer_refuses_bad_weights(change, error, message, dtype):
    with pytest.raises(error, match=message):
        LlamaLayer(CFG, change(random_weights(CFG)), dtype)


def test_layer_takes_any_float_weights():
    """float64 (or float16) weights are used as float32, as the docstring says."""
    w = random_weights(CFG)
    x = np.random.default_rng(1).standard_normal((3, CFG.hidden)).astype(np.float32)
    want = LlamaLayer(CFG, w).prefill(x)
    assert np.array_equal(LlamaLayer(CFG, {k: v.astype(np.float64) for k, v in w.items()}).prefill(x), want)


def test_layer_takes_bfloat16_weights_and_inputs():
    """ml_dtypes bfloat16 arrays and torch bfloat16 tensors, weights and x, widened exactly to
    float32 (they were refused as not floating point, or failed in np.asarray)."""
    torch = pytest.importorskip("torch")
    bf = tpp.dtypes.dtype("bf16")
    w = {k: v.astype(bf) for k, v in random_weights(CFG).items()}
    x = np.random.default_rng(1).standard_normal((3, CFG.hidden)).astype(bf)
    want = LlamaLayer(CFG, {k: v.astype(np.float32) for k, v in w.items()}).prefill(x.astype(np.float32))
    assert np.array_equal(LlamaLayer(CFG, w).prefill(x), want)
    tw = {k: torch.from_numpy(v.astype(np.float32)).bfloat16() for k, v in w.items()}
    assert np.array_equal(LlamaLayer(CFG, tw).prefill(torch.from_numpy(x.astype(np.float32)).bfloat16()), want)


def test_inputs_refused_or_taken():
    layer = LlamaLayer(CFG, random_weights(CFG))
    x = np.random.default_rng(2).standard_normal((5, CFG.hidden)).astype(np.float32)
    for bad in (x + 1j, x > 0, x.astype(str)):
        with pytest.raises(TypeError, match=f"prefill: x of dtype {bad.dtype}; expected real numbers"):
            layer.prefill(bad)
    with pytest.raises(ValueError, match=r"one token: write x\[None\]"):
        layer.decode(x[0], 5)
    want = layer.prefill(x)
    assert np.array_equal(layer.prefill(np.asfortranarray(x)), want)        # any layout
    for pos, error in ((2.5, TypeError), (True, TypeError), ("5", TypeError), (-1, ValueError)):
        with pytest.raises(error, match="pos" if error is TypeError else "position -1"):
            layer.decode(x[:1], pos)


def test_decode_goes_in_order():
    """The cache holds the prompt, then one more position per token: decoding past it would attend
    to zero keys never written, so it is refused; going back forgets what follows."""
    layer = LlamaLayer(CFG, random_weights(CFG))
    x = np.random.default_rng(4).standard_normal((6, CFG.hidden)).astype(np.float32)
    with pytest.raises(ValueError, match="position 1 skips positions 0..0"):
        layer.decode(x[:1], 1)
    layer.prefill(x[:4])
    with pytest.raises(ValueError, match="position 5 skips positions 4..4.*pos=4"):
        layer.decode(x[4:5], 5)
    first = layer.decode(x[4:5], np.int64(4))
    assert layer.length == 5
    layer.decode(x[5:6], 5)
    assert np.array_equal(layer.decode(x[4:5], 4), first) and layer.length == 5     # back: 5 forgotten
    with pytest.raises(ValueError, match="position 6 skips"):
        layer.decode(x[5:6], 6)
    layer.reset()
    assert layer.length == 0


@pytest.mark.parametrize("dtype", ["bf16", "i8"])
@pytest.mark.parametrize("back", [1, 2])
def test_going_back_forgets_non_finite_positions(dtype, back):
    """Masked keys get weight 0, but 0 times a NaN value is NaN: going back zeroes the positions it
    forgets (odd and even ones: V pairs positions), so a NaN token decoded there leaves nothing."""
    layer = LlamaLayer(CFG, random_weights(CFG), dtype)
    x = np.random.default_rng(5).standard_normal((6, CFG.hidden)).astype(np.float32)
    layer.prefill(x[:3])
    first = layer.decode(x[3:4], 3)
    for pos in range(4, 4 + back):
        layer.decode(np.full((1, CFG.hidden), np.nan, np.float32), pos)
    again = layer.decode(x[3:4], 3)
    assert np.isfinite(again).all() and np.array_equal(again, first)


def test_threads_sharing_a_layer_take_turns():
    """Its steps hold its buffers and its cache: two threads prefilling one layer wait for each
    other, and each gets what it gets alone."""
    cfg = Config.small()
    layer = LlamaLayer(cfg, random_weights(cfg), "bf16")
    rng = np.random.default_rng(3)
    prompts = [(rng.standard_normal((16, cfg.hidden)).astype(np.float32),) for _ in range(2)]
    assert not threads_disagreeing(layer.prefill, prompts, rounds=20)


def test_key_mask_refuses():
    layer = LlamaLayer(CFG, random_weights(CFG))
    for pos, keys, error, message in ((-1, 4, ValueError, "position -1"), (CFG.max_len, 4, ValueError, "position"),
                                      (2, 0, ValueError, "keys=0"), (2, CFG.max_len + 1, ValueError, "keys="),
                                      (2, 4.0, TypeError, "keys=4.0"), (2.0, 4, TypeError, "pos=2.0")):
        with pytest.raises(error, match=message):
            layer.key_mask(pos, keys)
    assert layer.key_mask(np.int64(CFG.max_len - 1), CFG.max_len).tolist() == [0.0] * CFG.max_len


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
