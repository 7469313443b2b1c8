"""One LLaMA-style decoder layer on tppasm kernels in loop nests: RMSNorm, rotary embeddings,
grouped-query attention with a KV cache, SwiGLU MLP; weights bf16, or int8 with per-column scales.

``layer.prefill(x)`` runs a prompt (T rows of x, positions 0..T-1; the first token's latency) and
fills the cache; ``layer.decode(x, pos)`` runs one token at ``pos`` against the cache (next-token
latency): the tokens go in order, ``pos`` at most the number of positions the cache holds (the
prompt's, one more per token; a smaller ``pos`` goes back, forgetting the positions from it on).
Both return the layer's output rows (fp32; the residual stream stays fp32).

Every projection is a nest over (column block, row block) with the column blocks outermost
(``"BA"``): each thread takes a contiguous range of weight panels and streams each panel once,
which is the whole game at batch 1 (a GEMV reads 2 bytes, or 1 in int8, per 2 flops); a panel
is as wide as the host's kernels read whole rows of it (:func:`~bench.models.llama_weights.panel_columns`:
64 columns, 32 on AVX2). int8: the activations are quantized per row at run time (u8, zero point
128; 7-bit codes, zero point 64, where the int8 BRGEMM has no VNNI dot:
:func:`~bench.models.llama_weights.activation_bits`), the u8 x s8 BRGEMM accumulates int32 and the
dequant TPP applies the column offsets and scales (and adds the residual) on the tile in cache.
Measured (``python -m bench llm`` prints it): one Zen 4 core consumes int8 weights from L1 at
125-190 GB/s with ``vpdpbusd`` but only ~30 GB/s when dequantizing them in registers (sign-extend,
convert, fp32 FMA), which is no faster than its DRAM read bandwidth, and prefill would run at the
fp32 FMA rate, a quarter of ``vpdpbusd``'s; so weights stay int8 all the way into the dot product.
Attention works on bf16: K is stored transposed in the VNNI2 layout the scores BRGEMM
reads (a 32-bit transpose of K's rows), V in VNNI2, so no cache entry is ever repacked; a query
head reads its group's K/V; scores and softmax sums stay fp32. Prefill attention goes by causal
blocks of 64 query rows, each against the keys up to its end, so the masked upper triangle is
never computed. Decode pads the key range to a multiple of ``KEY_BLOCK`` (masked) so kernels are
rebuilt once per block of positions, not per token. Each prompt length and key range gets its
buffers and nests once (a step, :mod:`bench.models.llama_step`); the steps used last are kept while
their buffers take at most ``STEP_BYTES`` (:mod:`bench.models.per_shape`; with no pool of its own,
the layer follows :func:`isa.pool.set_num_threads`).

>>> from bench.models.llama_weights import Config, random_weights
>>> layer = LlamaLayer(Config.small(), random_weights(Config.small()), "bf16")
>>> import numpy as np
>>> layer.prefill(np.ones((4, 128), np.float32)).shape
(4, 128)
"""
import numpy as np

import tppasm as tpp
from isa.pool import get_pool
from tppasm.layout import as_array

from .checks import aligned_copy, check_pool, choice, float_weights, is_bf16
from .llama_step import Step
from .llama_weights import WIDEST_PANEL, Linear, activation_bits, check_config, panel_columns, weight_shapes
from .per_shape import PerShape
from .serial import Serial
from .stream_pace import stream_kernel

KC = 512             # K chunk of the down projection's batch-reduce
KEY_BLOCK = 64       # decode pads the key range to a multiple of this
STEP_BYTES = 512 << 20  # the buffers of the steps (prompt lengths, key ranges) a layer keeps (the last used at least)


class LlamaLayer:
    """The layer for the Config ``cfg`` with floating-point ``weights`` (float32 copies are used),
    the arrays of llama_weights.weight_shapes(cfg) by name (see llama_weights.random_weights), in
    ``dtype`` "bf16" or "i8" (int8 weights, per-column scales; bf16 attention). The kernels need
    head_dim dividing 64, hidden and kv_heads * head_dim multiples of 64, ffn one of 64 up to 512 and
    of 512 above, and an even max_len.
    ``pool``: an isa.pool.Pool (None: the process's, as set_num_threads sets it, call by call).
    ``pace``: the kernels of the BRGEMMs that stream weights (decoding): an int, the vector
    kernels' ``pace`` (0 for none; on AMX hosts their AVX-512 kernels), ``"tiles"`` the AMX tile
    kernels, None (default) the host's own (tiles where it has AMX) at pace 0;
    ``stream_pace.best(dtype, pool)[0]`` measures the host's best. ``length``: the positions the
    cache holds (0..length-1)."""

    def __init__(self, cfg, weights, dtype="bf16", pool=None, pace=None):
        check_config(cfg, "LlamaLayer")
        choice(dtype, ("bf16", "i8"), "LlamaLayer: dtype")
        check_pool(pool, "LlamaLayer")
        self.stream = stream_kernel(pace)              # the decoding kernels' keywords (built later)
        wide = WIDEST_PANEL                            # the same shapes on every host
        if wide % cfg.head_dim or any(n % wide for n in (cfg.hidden, cfg.kv_dim, cfg.ffn)) \
                or cfg.ffn % min(cfg.ffn, KC):
            raise ValueError(f"LlamaLayer: the kernels need head_dim dividing {wide}, hidden and kv_heads * head_dim "
                             f"multiples of {wide}, ffn one of {wide} up to {KC} and of {KC} above; got "
                             f"head_dim={cfg.head_dim}, hidden={cfg.hidden}, kv_heads * head_dim={cfg.kv_dim}, "
                             f"ffn={cfg.ffn} (Config.small() is a shape that fits)")
        if cfg.max_len % 2:
            raise ValueError(f"LlamaLayer: max_len={cfg.max_len} must be even (the V cache holds pairs of positions); "
                             f"write max_len={cfg.max_len + 1}")
        w = float_weights(weights, weight_shapes(cfg), "LlamaLayer")
        self.cfg, self.dtype, self._own_pool = cfg, dtype, pool
        D, F, bn = cfg.hidden, cfg.ffn, panel_columns()
        bits = activation_bits() if dtype == "i8" else 8
        w13 = np.stack([w["w1"].reshape(D, F // bn, bn), w["w3"].reshape(D, F // bn, bn)], 2).reshape(D, 2 * F)
        self.qkv = Linear(np.concatenate([w["wq"], w["wk"], w["wv"]], 1), bn, dtype, a_bits=bits)
        self.o = Linear(w["wo"], bn, dtype, a_bits=bits)
        self.gu = Linear(w13, bn, dtype, a_bits=bits)
        self.down = Linear(w["w2"], bn, dtype, kc=min(F, KC), a_bits=bits)
        self.rms1, self.rms2 = aligned_copy(w["rms1"]), aligned_copy(w["rms2"])     # (not the caller's arrays)
        half = cfg.head_dim // 2
        self.cos, self.sin = (tpp.aligned(t) for t in tpp.rope_tables(np.arange(cfg.max_len), cfg.head_dim,
                                                                     cfg.rope_base))
        bf = tpp.dtypes.dtype("bf16")
        self.KT = tpp.aligned(np.zeros((cfg.kv_heads, 1, half, cfg.max_len, 2), bf))     # K^T, VNNI2
        self.V = tpp.aligned(np.zeros((cfg.kv_heads, 1, cfg.max_len // 2, cfg.head_dim, 2), bf))
        # max_len zeros, then max_len -inf: key_mask's windows (a view per position, no per-token work; they
        # start anywhere, so not aligned), read-only memory of its own: no view handed out can be made writable
        self._ramp = np.repeat(np.float32([0, -np.inf]), cfg.max_len)
        self._ramp.flags.writeable = False
        self._steps = PerShape(lambda key, pool: Step(self, *key, pool), pool)
        self.length = 0                                  # positions the cache holds: 0..length-1
        self._written = 0                                # positions from here on are zero (see _forget)
        self._serial = Serial()

    def _refuse_copy(self, *memo):
        raise TypeError("a LlamaLayer cannot be copied or pickled: its KV cache, buffers and native nests belong to "
                        "this layer in this process; build another: LlamaLayer(cfg, weights, dtype) (with the same "
                        "weights arrays), and prefill it")

    __copy__ = __deepcopy__ = __reduce__ = _refuse_copy

    @property
    def pool(self):
        """The pool the layer runs on now: its own, else the process's (:func:`isa.pool.get_pool`)."""
        return self._own_pool if self._own_pool is not None else get_pool()

    def reset(self):
        """Forget the cache (zeros: positions past the current one contribute nothing, never NaN)."""
        with self._serial:
            self._clear()

    def _clear(self):
        self.length, self._written = 0, self.cfg.max_len         # (interrupted: the next decode zeroes the rest)
        self.KT[...] = 0
        self.V[...] = 0
        self._written = 0

    def prefill(self, x):
        """Output rows for the prompt ``x`` (T, hidden) real numbers, 1 <= T <= max_len, at positions
        0..T-1; the cache then holds them (and only them). The layer computes in float32: a finite
        value of x beyond its range is refused (ValueError); NaN or inf in x give NaN rows, as in
        torch. Calls from several threads take turns (:mod:`bench.models.serial`); the cache is the
        layer's, one sequence at a time."""
        x = self._rows(x, "prefill")
        with self._serial:
            self._clear()
            self._written = x.shape[0]
            out = self._step(x.shape[0], None).run(x, 0)
            self.length = x.shape[0]
        return out

    def decode(self, x, pos):
        """Output row for one token ``x`` (1, hidden) at the int position ``pos``, from 0 to the
        positions the cache holds (:attr:`length`) and below max_len; the cache then holds 0..pos."""
        x = self._rows(x, "decode")
        if x.shape[0] != 1:
            raise ValueError(f"decode: one row (1, {self.cfg.hidden}) at a time, got {x.shape[0]} rows "
                             "(prefill(x) takes a prompt)")
        pos = self._position(pos, "decode")
        with self._serial:
            return self._decode(x, pos)

    def _decode(self, x, pos):
        if pos > self.length:
            held = f"0..{self.length - 1}" if self.length else "none"
            raise ValueError(f"decode: position {pos} skips positions {self.length}..{pos - 1}, which the cache "
                             f"does not hold (it holds {held}); decode the tokens in order, the next at "
                             f"pos={self.length}, after prefill(prompt)")
        # until the step has run the cache holds 0..pos-1 only; a decode interrupted (Ctrl-C) leaves it so
        self.length = min(self.length, pos)
        if pos + 1 < self._written:                 # going back: the later positions are forgotten
            self._forget(pos + 1, self._written)
        self._written = pos + 1
        keys = min(-(-(pos + 1) // KEY_BLOCK) * KEY_BLOCK, self.cfg.max_len)
        out = self._step(1, keys).run(x, pos)
        self.length = pos + 1
        return out

    def _forget(self, lo, hi):
        """Zero the cache's positions lo..hi-1, as :meth:`reset` does all: masked keys get weight 0,
        and 0 times a NaN or inf value left there would still be NaN."""
        self.KT[:, :, :, lo:hi] = 0
        p = np.arange(lo, hi)
        self.V[:, :, p // 2, :, p % 2] = 0           # V's VNNI2 pairs hold positions 2i, 2i + 1

    def key_mask(self, pos, keys):
        """The decode softmax's additive mask of ``keys`` keys (1..max_len) at ``pos`` (0..max_len-1):
        0 up to ``pos``, -inf after (a read-only view of a fixed ramp, so a token costs no NumPy call).

        >>> from bench.models.llama_weights import Config, random_weights
        >>> LlamaLayer(Config.small(), random_weights(Config.small()), "bf16").key_mask(2, 4).tolist()
        [0.0, 0.0, 0.0, -inf]
        """
        pos = self._position(pos, "key_mask")
        if isinstance(keys, bool) or not isinstance(keys, (int, np.integer)):
            raise TypeError(f"key_mask: keys={keys!r}; expected an int (write int(keys))")
        if not 1 <= keys <= self.cfg.max_len:
            raise ValueError(f"key_mask: keys={keys}; expected 1 <= keys <= max_len = {self.cfg.max_len}")
        return self._key_mask(pos, keys)

    def _key_mask(self, pos, keys):
        start = self.cfg.max_len - 1 - pos
        return self._ramp[start:start + keys]

    def _position(self, pos, who):
        if isinstance(pos, bool) or not isinstance(pos, (int, np.integer)):
            raise TypeError(f"{who}: pos={pos!r}; expected an int position (write int(pos))")
        if not 0 <= pos < self.cfg.max_len:
            raise ValueError(f"{who}: position {pos} is outside the cache's [0, {self.cfg.max_len}) (a Config with "
                             "a larger max_len holds more)")
        return int(pos)

    def _rows(self, x, who):
        x = as_array(x, who)
        if x.dtype.kind not in "fiu" and not is_bf16(x):
            raise TypeError(f"{who}: x of dtype {x.dtype}; expected real numbers (write x.astype(np.float32))")
        x = _fitted_float32(x, who) if x.dtype.kind == "f" and x.dtype.itemsize > 4 else np.asarray(x, np.float32)
        if x.ndim != 2 or x.shape[1] != self.cfg.hidden or not 1 <= x.shape[0] <= self.cfg.max_len:
            one = " (one token: write x[None])" if x.ndim == 1 else ""
            raise ValueError(f"{who}: expected (tokens, {self.cfg.hidden}) rows with 1 <= tokens <= "
                             f"{self.cfg.max_len}, got {x.shape}{one}")
        return np.ascontiguousarray(x)

    def _step(self, T, keys):
        """The step of T rows (keys None: a prompt; else one token against ``keys`` keys), built on
        first use; the least recently used go while the steps' buffers take more than STEP_BYTES."""
        return self._steps.get((T, keys), STEP_BYTES)


def _fitted_float32(x, who):
    """The float64 (or wider) array ``x`` as float32, or the ValueError for a finite value beyond
    float32's range (it would become inf, and the output NaN). Only wider floats can overflow, and
    they are converted (an O(n) copy) anyway; float32 input does not come here."""
    try:
        with np.errstate(over="raise"):
            return np.asarray(x, np.float32)
    except FloatingPointError:
        big = float(np.abs(x[np.isfinite(x)]).max())
        raise ValueError(f"{who}: x holds {big:.3g}, beyond float32's range (+-3.4e38), in which the layer "
                         "computes; scale x down (e.g. x / np.abs(x).max())") from None
