"""One LLaMA-style decoder layer on tppasm kernels in loop nests: RMSNorm, rotary embeddings,
grouped-query attention with a KV cache, SwiGLU MLP; weights bf16, or int8 with per-column scales.

``layer.prefill(x)`` runs a prompt (T rows of x, positions 0..T-1; the first token's latency) and
fills the cache; ``layer.decode(x, pos)`` runs one token at ``pos`` against the cache (next-token
latency). Both return the layer's output rows (fp32; the residual stream stays fp32).

Every projection is a nest over (column block, row block) with the column blocks outermost
(``"BA"``): each thread takes a contiguous range of weight panels and streams each panel once,
which is the whole game at batch 1 (a GEMV reads 2 bytes, or 1 in int8, per 2 flops). int8: the
activations are quantized per row at run time (u8, zero point 128), the u8 x s8 BRGEMM accumulates
int32 and the dequant TPP applies the column offsets and scales (and adds the residual) on the tile
in cache. Measured (``python -m bench llm`` prints it): one Zen 4 core consumes int8 weights from L1
at 125-190 GB/s with ``vpdpbusd`` but only ~30 GB/s when dequantizing them in registers (sign-extend,
convert, fp32 FMA), which is no faster than its DRAM read bandwidth, and prefill would run at the
fp32 FMA rate, a quarter of ``vpdpbusd``'s; so weights stay int8 all the way into the dot product.
Attention works on bf16: K is stored transposed in the VNNI2 layout the scores BRGEMM
reads (a 32-bit transpose of K's rows), V in VNNI2, so no cache entry is ever repacked; a query
head reads its group's K/V; scores and softmax sums stay fp32. Prefill attention goes by causal
blocks of 64 query rows, each against the keys up to its end, so the masked upper triangle is
never computed. Decode pads the key range to a multiple of ``KEY_BLOCK`` (masked) so kernels are
rebuilt once per block of positions, not per token.

>>> from bench.models.llama_weights import Config, random_weights
>>> layer = LlamaLayer(Config.small(), random_weights(Config.small()), "bf16")
>>> import numpy as np
>>> layer.prefill(np.ones((4, 128), np.float32)).shape
(4, 128)
"""
import numpy as np

import tppasm as tpp
from loops.pool import get_pool
from tppasm.brgemm import Brgemm

from .llama_step import BN, Step
from .llama_weights import Linear

KC = 512             # K chunk of the down projection's batch-reduce
KEY_BLOCK = 64       # decode pads the key range to a multiple of this


class LlamaLayer:
    """The layer for ``cfg`` with fp32 ``weights`` (see llama_weights.random_weights) in ``dtype``
    "bf16" or "i8" (int8 weights, per-column scales; bf16 attention). ``pace``: the ``pace`` of the
    BRGEMMs that stream weights (decoding), 0 for none; ``stream_pace.best(dtype, pool)[0]``
    measures the host's best."""

    def __init__(self, cfg, weights, dtype="bf16", pool=None, pace=0):
        if dtype not in ("bf16", "i8"):
            raise ValueError(f"LlamaLayer: dtype={dtype!r}; expected 'bf16' or 'i8'")
        Brgemm(1, 1, 1, pace=pace).validate()          # the decoding kernels are built later
        self.pace = pace
        if BN % cfg.head_dim or cfg.heads % cfg.kv_heads or any(n % BN for n in (cfg.hidden, cfg.kv_dim, cfg.ffn)):
            raise ValueError(f"LlamaLayer: head_dim must divide {BN} and hidden, kv_dim, ffn be multiples of it")
        self.cfg, self.dtype, self.pool = cfg, dtype, pool or get_pool()
        w = weights
        D, F = cfg.hidden, cfg.ffn
        w13 = np.stack([w["w1"].reshape(D, F // BN, BN), w["w3"].reshape(D, F // BN, BN)], 2).reshape(D, 2 * F)
        self.qkv = Linear(np.concatenate([w["wq"], w["wk"], w["wv"]], 1), BN, dtype)
        self.o = Linear(w["wo"], BN, dtype)
        self.gu = Linear(w13, BN, dtype)
        self.down = Linear(w["w2"], BN, dtype, kc=min(F, KC))
        self.rms1, self.rms2 = tpp.aligned(w["rms1"]), tpp.aligned(w["rms2"])
        half = cfg.head_dim // 2
        self.cos, self.sin = (tpp.aligned(t) for t in tpp.rope_tables(np.arange(cfg.max_len), cfg.head_dim,
                                                                     cfg.rope_base))
        bf = tpp.dtypes.dtype("bf16")
        self.KT = tpp.aligned(np.zeros((cfg.kv_heads, 1, half, cfg.max_len, 2), bf))     # K^T, VNNI2
        self.V = tpp.aligned(np.zeros((cfg.kv_heads, 1, cfg.max_len // 2, cfg.head_dim, 2), bf))
        # max_len zeros, then max_len -inf: key_mask's windows (a view per position, no per-token work)
        self._ramp = tpp.aligned(np.repeat(np.float32([0, -np.inf]), cfg.max_len))
        self._steps = {}

    def reset(self):
        """Forget the cache (zeros: positions past the current one contribute nothing, never NaN)."""
        self.KT[...] = 0
        self.V[...] = 0

    def prefill(self, x):
        """Output rows for the prompt ``x`` (T, hidden) at positions 0..T-1; fills the cache."""
        x = self._rows(x)
        self.reset()
        return self._step(x.shape[0], None).run(x, 0)

    def decode(self, x, pos):
        """Output row for one token ``x`` (1, hidden) at position ``pos`` (0 < pos < max_len)."""
        x = self._rows(x)
        if x.shape[0] != 1 or not 0 <= pos < self.cfg.max_len:
            raise ValueError(f"decode: one row at a position in [0, {self.cfg.max_len}), got {x.shape[0]} rows "
                             f"at {pos}")
        keys = min(-(-(pos + 1) // KEY_BLOCK) * KEY_BLOCK, self.cfg.max_len)
        return self._step(1, keys).run(x, pos)

    def key_mask(self, pos, keys):
        """The decode softmax's additive mask of ``keys`` keys at ``pos``: 0 up to ``pos``, -inf after
        (a view of a fixed ramp, so a token costs no NumPy call).

        >>> from bench.models.llama_weights import Config, random_weights
        >>> LlamaLayer(Config.small(), random_weights(Config.small()), "bf16").key_mask(2, 4).tolist()
        [0.0, 0.0, 0.0, -inf]
        """
        start = self.cfg.max_len - 1 - pos
        return self._ramp[start:start + keys]

    def _rows(self, x):
        x = np.asarray(x, np.float32)
        if x.ndim != 2 or x.shape[1] != self.cfg.hidden or not 1 <= x.shape[0] <= self.cfg.max_len:
            raise ValueError(f"expected (tokens, {self.cfg.hidden}) rows with 1 <= tokens <= {self.cfg.max_len}, "
                             f"got {x.shape}")
        return x

    def _step(self, T, keys):
        key = (T, keys)
        step = self._steps.get(key)
        if step is None:
            step = self._steps[key] = Step(self, T, keys)
        return step
