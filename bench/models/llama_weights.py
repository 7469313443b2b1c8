"""Weights of one LLaMA-style decoder layer: the config, random weights with a fixed seed, their
blocked layouts for the kernels (bf16 VNNI2, or int8 VNNI4 with per-column scales), and a float64
NumPy reference of the layer (the test oracle).

Matrices are stored as ``y = x @ W`` (in, out). Column blocks of ``bn`` are contiguous (k, bn)
panels, so a block of output columns streams its weights sequentially: what the GEMV of
next-token decoding needs, one thread per set of blocks.

>>> cfg = Config.small()
>>> w = random_weights(cfg)
>>> sorted(w)[:3], w["wq"].shape
(['rms1', 'rms2', 'w1'], (128, 128))
"""
from dataclasses import dataclass

import numpy as np

import tppasm as tpp
from tppasm.quant import zero_point

from .checks import positive_float, positive_int


@dataclass(frozen=True)
class Config:
    """The layer's shape: ``hidden`` = ``heads`` * ``head_dim`` (head_dim even: rotary pairs),
    ``kv_heads`` dividing ``heads``, all positive ints, as are ``ffn`` and ``max_len`` (the cache's
    positions); ``eps`` (RMSNorm) and ``rope_base`` finite numbers > 0.

    >>> Config(hidden=128, heads=4, kv_heads=3, head_dim=32)
    Traceback (most recent call last):
    ...
    ValueError: Config: heads=4 must be a multiple of kv_heads=3 (each KV head serves heads / kv_heads query heads)
    """
    hidden: int = 2048
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 64
    ffn: int = 8192
    eps: float = 1e-5
    rope_base: float = 10000.0
    max_len: int = 1024

    def __post_init__(self):
        for name in ("hidden", "heads", "kv_heads", "head_dim", "ffn", "max_len"):
            object.__setattr__(self, name, positive_int(getattr(self, name), f"Config: {name}"))
        for name in ("eps", "rope_base"):
            object.__setattr__(self, name, positive_float(getattr(self, name), f"Config: {name}"))
        if self.heads % self.kv_heads:
            raise ValueError(f"Config: heads={self.heads} must be a multiple of kv_heads={self.kv_heads} (each KV "
                             "head serves heads / kv_heads query heads)")
        if self.hidden != self.heads * self.head_dim:
            raise ValueError(f"Config: hidden={self.hidden} must be heads * head_dim = {self.heads * self.head_dim} "
                             "(the query and output projections are hidden x hidden)")
        if self.head_dim % 2:
            raise ValueError(f"Config: head_dim={self.head_dim} must be even (rotary embeddings turn pairs)")

    @classmethod
    def small(cls):
        """A shape for tests: every dimension a multiple of the kernels' blocks, 2 query heads per KV head."""
        return cls(hidden=128, heads=4, kv_heads=2, head_dim=32, ffn=256, max_len=128)

    @property
    def kv_dim(self):
        return self.kv_heads * self.head_dim

    @property
    def qkv_dim(self):
        return self.hidden + 2 * self.kv_dim

    @property
    def group(self):
        return self.heads // self.kv_heads


def check_config(cfg, who):
    """Refuse a ``cfg`` that is not a :class:`Config`."""
    if not isinstance(cfg, Config):
        raise TypeError(f"{who}: cfg={cfg!r:.60}; expected a bench.models.llama_weights.Config (e.g. Config.small())")


def weight_shapes(cfg):
    """{name: shape} of the layer's weights for the Config ``cfg``: projections (in, out), RMSNorm
    gains (hidden,)."""
    check_config(cfg, "weight_shapes")
    D, F, KV = cfg.hidden, cfg.ffn, cfg.kv_dim
    return {"wq": (D, D), "wk": (D, KV), "wv": (D, KV), "wo": (D, D), "w1": (D, F), "w3": (D, F), "w2": (F, D),
            "rms1": (D,), "rms2": (D,)}


def random_weights(cfg, seed=0):
    """fp32 weights, N(0, 1/fan_in) (activations keep their scale through the layer); gains 1 + N(0, 0.01)."""
    check_config(cfg, "random_weights")
    rng = np.random.default_rng(seed)

    def draw(shape):
        if len(shape) == 1:
            return (1 + 0.1 * rng.standard_normal(shape[0])).astype(np.float32)
        return (rng.standard_normal(shape, np.float32) / np.sqrt(shape[0])).astype(np.float32)
    return {name: draw(shape) for name, shape in weight_shapes(cfg).items()}


def quantize_columns(w):
    """(int8 weights, fp32 per-column scales): w ~ q * scale, |q| <= 127."""
    scale = np.maximum(np.abs(w).max(axis=0), 1e-30) / 127
    return np.rint(w / scale).astype(np.int8), scale.astype(np.float32)


WIDEST_PANEL = 64          # the widest panel_columns(): a layer whose widths are multiples of it fits every host


def panel_columns(isa=None):
    """Output columns per weight panel (``bn``) for the kernels of ``isa`` (default: the host's): 64,
    four AVX-512 vectors; 32 on AVX2, where a decoding kernel's 1 x 4 register tile then reads
    whole panel rows (of 64 columns it read half of each row in one pass, the other half in the next).
    Decoding streams each weight once: on Zen 4 running AVX2, m = 1 BRGEMMs over 128 MiB of
    weights, 1 thread, read int8 at 16.3 GB/s in panels of 64 and 29.7 in panels of 32, bf16 at
    24.2 and 31.0; the 1B-class layer (interleaved in one process, 1 and 2 threads) decoded in
    0.54x the time in int8 and 0.76x in bf16, and prefilled bf16 in 0.94x (int8 within 2%). With
    AVX-512 kernels 32 decoded int8 in 0.87-0.90x the time but prefilled 0.6-1.7% slower, and bf16
    decoding gained 1-4%: 64 stays there, and on AMX hosts (their tile kernels not measured with 32).

    >>> panel_columns("avx512"), panel_columns("avx2")
    (64, 32)
    """
    from isa.cpu import host
    return 32 if (isa or host().isa) == "avx2" else WIDEST_PANEL


def activation_bits(isa=None):
    """The bits of an int8 layer's activation codes for the kernels of ``isa`` (default: the host's):
    7 where the int8 BRGEMM has no VNNI dot (AVX2 without AVX-VNNI), so that it multiplies with
    ``vpmaddubsw`` (``tppasm.brgemm(..., a_bits=7)``, codes 1..127 from ``tppasm.quantize(...,
    bits=7)``), else 8. On Zen 4 at AVX2 a 64 x 32 x 2048 BRGEMM ran at 150 GOP/s with 8-bit codes
    and 227 with 7-bit ones (1.5x); torch's fbgemm quantizes activations to 7 bits there too.

    >>> activation_bits("avx512") in (7, 8), activation_bits("amx")
    (True, 8)
    """
    from bench.peaks import kernel_unit
    return 8 if kernel_unit("i8", isa) in ("VNNI", "AMX") else 7


def column_blocks(w, bn, kc=None):
    """(K, N) -> (N/bn * K/kc, kc, bn): column block j, K chunk c at [j * K/kc + c]."""
    k, n = w.shape
    kc = kc or k
    return np.ascontiguousarray(w.reshape(k // kc, kc, n // bn, bn).transpose(2, 0, 1, 3).reshape(-1, kc, bn))


class Linear:
    """One weight laid out for the BRGEMM of ``dtype``: ``blocks`` (nb, kc, bn) (VNNI-packed), ``bn``, and
    for int8 the column ``scale``, the activations' code bits ``a_bits`` (:func:`activation_bits`)
    and ``offset`` (-zero point * column sums: removes the activations' zero point)."""

    def __init__(self, w, bn, dtype, kc=None, a_bits=8):
        self.k, self.n = w.shape
        self.bn = bn
        self.kc = kc or self.k
        self.a_bits = a_bits
        if dtype == "i8":
            q, self.scale = quantize_columns(w)
            self.offset = tpp.aligned((-zero_point(a_bits) * q.astype(np.int32).sum(axis=0)).astype(np.int32))
            self.dequantized = q.astype(np.float32) * self.scale
            blocks = tpp.vnni_pack(column_blocks(q, bn, self.kc), 4)
        else:
            self.scale = self.offset = None
            self.dequantized = w.astype(tpp.dtypes.dtype("bf16")).astype(np.float32)
            blocks = tpp.vnni_pack(column_blocks(w.astype(tpp.dtypes.dtype(dtype)), bn, self.kc), 2)
        self.blocks = tpp.aligned(blocks)


def rms_norm(x, g, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def rope(x, positions, cfg):
    """Rotate-half RoPE of (T, heads * d) rows at ``positions``."""
    d = cfg.head_dim
    inv = cfg.rope_base ** (-np.arange(0, d, 2) / d)
    ang = np.asarray(positions, np.float64)[:, None] * inv[None]
    c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
    x = x.reshape(len(positions), -1, 2, d // 2)
    x1, x2 = x[:, :, 0], x[:, :, 1]
    return np.stack([x1 * c - x2 * s, x2 * c + x1 * s], 2).reshape(len(positions), -1)


def reference_layer(cfg, w, x, k_cache, v_cache, start):
    """float64 layer on rows ``x`` (T, D) at positions start..start+T-1, with caches (max_len, kv_dim)
    holding the earlier positions (updated in place); returns the output rows."""
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    T, d = x.shape[0], cfg.head_dim
    pos = np.arange(start, start + T)
    xn = rms_norm(x, w["rms1"], cfg.eps)
    q, k, v = rope(xn @ w["wq"], pos, cfg), rope(xn @ w["wk"], pos, cfg), xn @ w["wv"]
    k_cache[start:start + T], v_cache[start:start + T] = k, v
    L = start + T
    ctx = np.empty((T, cfg.hidden))
    causal = np.where(np.arange(L)[None, :] <= pos[:, None], 0.0, -np.inf)
    for h in range(cfg.heads):
        g = h // cfg.group
        s = q[:, h * d:(h + 1) * d] @ k_cache[:L, g * d:(g + 1) * d].T / np.sqrt(d) + causal
        p = np.exp(s - s.max(1, keepdims=True))
        ctx[:, h * d:(h + 1) * d] = (p / p.sum(1, keepdims=True)) @ v_cache[:L, g * d:(g + 1) * d]
    h = x + ctx @ w["wo"]
    hn = rms_norm(h, w["rms2"], cfg.eps)
    a = hn @ w["w1"]
    return h + (a / (1 + np.exp(-a)) * (hn @ w["w3"])) @ w["w2"]
