"""The buffers and nests of one LLaMA layer step: a prompt of T rows (prefill) or one token at a
position whose key range is padded to ``keys`` (decode). See :mod:`bench.models.llama`.

>>> from bench.models.llama import LlamaLayer
>>> from bench.models.llama_weights import Config, random_weights
>>> import numpy as np
>>> layer = LlamaLayer(Config.small(), random_weights(Config.small()), "i8")
>>> _ = layer.prefill(np.ones((2, 128), np.float32)); layer.decode(np.ones((1, 128), np.float32), 2).shape
(1, 128)
"""
import numpy as np

import tppasm as tpp
from loops import Loop, kernel, thread

from .rows import row_block

QUERY_BLOCK = 64     # prefill attention: query rows per causal block
STREAM_ROWS = 4      # projections of at most this many rows stream their weights (paced)


def _strided_k(a, kc):
    """(T, K) -> the (K/kc, T, kc) view that batch-reduces over K chunks."""
    T, K = a.shape
    return np.lib.stride_tricks.as_strided(a, (K // kc, T, kc), (kc * a.itemsize, a.strides[0], a.itemsize))


def linear_nest(T, lin, dtype, out_dtype, pool, beta=0, stream=None):
    """A nest computing ``Out (+)= A @ W`` over (column panel, row block), panels outermost.

    bf16 arrays: (A3, W, Out) with A3 the (K/kc, T, kc) view of A. int8: (Aq3, W, Sc, Off, Ci, Out)
    with ``Sc`` = [row scales of A (T), column scales (N)] fp32, ``Off`` the column offsets (N)
    int32 and Ci the (threads, bm, bn) int32 scratch (bn: the weight's panel columns, ``lin.bn``).
    ``stream``: the BRGEMM's pace and ISA keywords (:func:`bench.models.stream_pace.stream_kernel`)."""
    stream = stream or {}
    bm, bn = row_block(T, pool.nthreads), lin.bn
    nb, count = lin.n // bn, lin.k // lin.kc
    lda = lin.k
    if dtype == "bf16":
        gemm = tpp.brgemm(bm, bn, lin.kc, "bf16", lda=lda, ldc=lin.n, stride_a=lin.kc, beta=beta,
                          c_dtype=out_dtype if not beta else "f32", **stream)

        @kernel("BA", Loop(0, T // bm), Loop(0, nb), pool=pool)
        def nest(im, jn, A, W, Out):
            r, c = im * bm, jn * bn
            gemm(A[:, r:r + bm], W[jn * count:jn * count + count], Out[r:r + bm, c:c + bn], count=count)
        return nest
    gemm = tpp.brgemm(bm, bn, lin.kc, "i8", lda=lda, stride_a=lin.kc, a_bits=lin.a_bits, **stream)
    deq = tpp.dequant(bm, bn, ldo=lin.n, out_dtype=out_dtype, beta=beta)

    @kernel("BA", Loop(0, T // bm), Loop(0, nb), pool=pool)
    def nest_i8(im, jn, A, W, Sc, Off, Ci, Out):
        t, r, c = thread().tid, im * bm, jn * bn
        gemm(A[:, r:r + bm], W[jn * count:jn * count + count], Ci[t], count=count)
        deq(Ci[t], Off[c:c + bn], Sc[r:r + bm], Sc[T + c:T + c + bn], Out[r:r + bm, c:c + bn])
    return nest_i8


class Step:
    """The buffers and nests of ``layer``'s step of T rows (``keys`` None: a prompt; else one token
    against ``keys`` keys) on ``pool``; ``nbytes``: its buffers' size."""

    def __init__(self, layer, T, keys, pool):
        cfg, dt = layer.cfg, layer.dtype
        self.layer, self.T, self.keys, self.i8, self.pool = layer, T, keys, dt == "i8", pool
        nt = pool.nthreads
        D, F, d, KV = cfg.hidden, cfg.ffn, cfg.head_dim, cfg.kv_heads
        half = d // 2
        bm, bn = row_block(T, nt), layer.gu.bn
        self.H = tpp.empty((T, D))
        self.xn, self.hn = tpp.empty((T, D), "bf16"), tpp.empty((T, D), "bf16")
        self.QKV, self.Ctx = tpp.empty((T, cfg.qkv_dim), "bf16"), tpp.empty((T, D), "bf16")
        self.A = tpp.empty((T, F), "bf16")
        self.GU = tpp.empty((nt, 2, bm, bn))
        self.none_u8, self.none_f32 = tpp.empty((1, 1), "u8"), tpp.empty(1)        # unused arguments in bf16
        lins = {"qkv": layer.qkv, "o": layer.o, "gu": layer.gu, "down": layer.down}
        if self.i8:
            self.q = {n: tpp.empty((T, lin.k), "u8") for n, lin in lins.items()}
            self.sc = {n: tpp.aligned(np.concatenate([np.ones(T, np.float32), lin.scale])) for n, lin in lins.items()}
            self.Ci = tpp.empty((nt, 2, bm, bn), "i32")
            # gate/up: the int32 tiles, then the column offsets as rows of bn (one array argument fewer)
            self.CiOff = tpp.empty((nt * 2 * bm + layer.gu.n // bn, bn), "i32")
            self.CiOff[nt * 2 * bm:] = layer.gu.offset.reshape(-1, bn)
        srcs = {"qkv": self.xn, "o": self.Ctx, "gu": self.hn, "down": self.A}
        self.a3 = {n: _strided_k(self.q[n] if self.i8 else srcs[n], lin.kc) for n, lin in lins.items()}
        # -- norms (and the residual copy, and int8 quantization of the normed rows) ----------------
        norm = tpp.rmsnorm(bm, D, out_dtype="bf16", eps=cfg.eps)
        keep = tpp.copy(bm, D)
        quant = {n: tpp.quantize(bm, lin.k, dtype="bf16", bits=lin.a_bits) for n, lin in lins.items()}

        @kernel("A", Loop(0, T // bm), pool=pool)
        def norm1(im, X, Gm, XN, H, XQ, Sc):
            r = im * bm
            keep(X[r:r + bm], H[r:r + bm])
            norm(X[r:r + bm], Gm, XN[r:r + bm])
            if self.i8:
                quant["qkv"](XN[r:r + bm], XQ[r:r + bm], Sc[r:r + bm])

        @kernel("A", Loop(0, T // bm), pool=pool)
        def norm2(im, H, Gm, HN, HQ, Sc):
            r = im * bm
            norm(H[r:r + bm], Gm, HN[r:r + bm])
            if self.i8:
                quant["gu"](HN[r:r + bm], HQ[r:r + bm], Sc[r:r + bm])

        def quantizer(name):
            @kernel("A", Loop(0, T // bm), pool=pool)
            def nest(im, X, Q, Sc):
                r = im * bm
                quant[name](X[r:r + bm], Q[r:r + bm], Sc[r:r + bm])
            return nest
        self.norm1, self.norm2 = norm1, norm2
        self.quant_o, self.quant_down = (quantizer("o"), quantizer("down")) if self.i8 else (None, None)
        # -- projections (the stream kernels where they stream their weights: a row or a few) ---------
        stream = layer.stream if bm <= STREAM_ROWS else {}
        self.proj_qkv = linear_nest(T, layer.qkv, dt, "bf16", pool, stream=stream)
        self.proj_o = linear_nest(T, layer.o, dt, "f32", pool, beta=1, stream=stream)
        self.proj_down = linear_nest(T, layer.down, dt, "f32", pool, beta=1, stream=stream)
        self.gate_up = self._gate_up(T, bm, layer.gu, dt, pool, stream)
        # -- rope, cache, attention ----------------------------------------------------------------
        ld = cfg.qkv_dim
        rot_q = tpp.rotary(bm, D, d, ldx=ld, ldo=ld, dtype="bf16")
        rot_k = tpp.rotary(bm, cfg.kv_dim, d, ldx=ld, ldo=ld, dtype="bf16")

        @kernel("A", Loop(0, T // bm), pool=pool)
        def rope(im, QKV, Cos, Sin):
            r = im * bm
            rot_q(QKV[r:r + bm, 0:D], Cos[r:r + bm], Sin[r:r + bm], QKV[r:r + bm, 0:D])
            rot_k(QKV[r:r + bm, D:D + cfg.kv_dim], Cos[r:r + bm], Sin[r:r + bm], QKV[r:r + bm, D:D + cfg.kv_dim])
        self.rope = rope
        k32, v0 = D // 2, D + cfg.kv_dim
        self.KT32 = layer.KT.view(np.int32).reshape(KV, half, cfg.max_len)
        transpose = tpp.transform("transpose", T, half, ldx=ld // 2, ldo=cfg.max_len, dtype="i32")
        if keys is None:
            pack = tpp.transform("vnni2", T, d, ldx=ld, dtype="bf16")

            @kernel("A", Loop(0, KV), pool=pool)
            def cache(g, QKV, QKV32, KT32, V):
                transpose(QKV32[:, k32 + g * half:k32 + g * half + half], KT32[g, :, 0:T])
                pack(QKV[:, v0 + g * d:v0 + g * d + d], V[g, 0, 0:-(-T // 2)])
            self.cache = cache
            self.attention = self._prefill_attention(cfg, T, pool, nt)
        else:
            self.attention = self._decode_attention(cfg, keys, pool)
            put_v = tpp.copy(d, 1, ldx=1, ldo=2, dtype="bf16")
            put_mask = tpp.copy(1, keys)

            @kernel("A", Loop(0, KV), pool=pool)
            def cache(g, QKV32, KT32, QKVt, V, M, S):
                transpose(QKV32[:, k32 + g * half:k32 + g * half + half], KT32[g])
                put_v(QKVt[v0 + g * d:v0 + g * d + d], V[g])
                if g == 0:                                  # the position's key mask (a window of a ramp)
                    put_mask(M, S[KV, 0:1])
            self.cache = cache
        self.bm = bm
        own = [self.H, self.xn, self.hn, self.QKV, self.Ctx, self.A, self.GU, self.S, self.P]
        if self.i8:
            own += [*self.q.values(), *self.sc.values(), self.Ci, self.CiOff]
        self.nbytes = sum(a.nbytes for a in own)

    def _gate_up(self, T, bm, lin, dt, pool, stream):
        """Gate and up panels j of the interleaved weight, then SwiGLU into A's columns of panel j."""
        bn = lin.bn
        swiglu = tpp.swiglu(bm, bn, ldo=lin.n // 2, dtype="f32", out_dtype="bf16")
        nb = lin.n // (2 * bn)
        if dt == "bf16":
            gemm = tpp.brgemm(bm, bn, lin.k, "bf16", lda=lin.k, **stream)

            @kernel("BA", Loop(0, T // bm), Loop(0, nb), pool=pool)
            def gate_up(im, j, X, W, GU, A):
                t, r = thread().tid, im * bm
                gemm(X[:, r:r + bm], W[2 * j:2 * j + 1], GU[t, 0])
                gemm(X[:, r:r + bm], W[2 * j + 1:2 * j + 2], GU[t, 1])
                swiglu(GU[t, 0], GU[t, 1], A[r:r + bm, j * bn:j * bn + bn])
            return gate_up
        gemm = tpp.brgemm(bm, bn, lin.k, "i8", lda=lin.k, a_bits=lin.a_bits, **stream)
        deq = tpp.dequant(bm, bn)
        off = pool.nthreads * 2 * bm

        @kernel("BA", Loop(0, T // bm), Loop(0, nb), pool=pool)
        def gate_up_i8(im, j, X, W, Sc, CiOff, GU, A):
            t, r = thread().tid, im * bm
            for half in range(2):
                p, ci = 2 * j + half, (2 * t + half) * bm
                gemm(X[:, r:r + bm], W[p:p + 1], CiOff[ci:ci + bm])
                deq(CiOff[ci:ci + bm], CiOff[off + p], Sc[r:r + bm], Sc[T + p * bn:T + p * bn + bn], GU[t, half])
            swiglu(GU[t, 0], GU[t, 1], A[r:r + bm, j * bn:j * bn + bn])
        return gate_up_i8

    def _prefill_attention(self, cfg, T, pool, nt):
        """Causal attention over the prompt, per (KV head, query head of its group), in blocks of
        QUERY_BLOCK query rows: block i attends to keys 0..end of block i only (scores, softmax
        under the causal mask, context), so the upper triangle is never computed (10/16 of the
        square at T = 256). A thread's scores and probabilities are one block's rows (memory
        linear in T: at T = 8192 on 16 threads 50 MiB, where whole squares took 6 GB); the mask of
        block r is the window from column T - r of one (QUERY_BLOCK, T + QUERY_BLOCK) triangle."""
        d, D, qb = cfg.head_dim, cfg.hidden, QUERY_BLOCK
        W = T + qb
        self.S, self.P = tpp.empty((nt + 1, qb, W)), tpp.empty((nt, 1, qb, T), "bf16")
        self.S[nt] = np.triu(np.full((qb, W), -np.inf, np.float32), T + 1)    # -inf past column row + T
        blocks = []
        for r in range(0, T, qb):
            rows, keys = min(qb, T - r), min(T, r + qb)
            blocks.append((r, rows, keys,
                           tpp.brgemm(rows, keys, d, "bf16", lda=cfg.qkv_dim, ldb=cfg.max_len, ldc=W),
                           tpp.softmax(rows, keys, ldx=W, ldo=T, scale=d ** -0.5, mask="full", ldm=W,
                                       out_dtype="bf16"),
                           tpp.brgemm(rows, d, keys, "bf16", lda=T, ldc=D, c_dtype="bf16")))

        @kernel("AB", Loop(0, cfg.kv_heads), Loop(0, cfg.group), pool=pool)
        def attention(g, j, QKV, KT, V, S, P, Ctx):
            t, c = thread().tid, (g * cfg.group + j) * d
            for r, rows, keys, scores, softmax, context in blocks:
                scores(QKV[:, r:r + rows, c:c + d], KT[g, :, :, 0:keys], S[t, 0:rows, 0:keys])
                softmax(S[t, 0:rows, 0:keys], S[nt, 0:rows, T - r:T - r + keys], P[t, 0, 0:rows, 0:keys])
                context(P[t, :, 0:rows, 0:keys], V[g, :, 0:-(-keys // 2)], Ctx[r:r + rows, c:c + d])
        return attention

    def _decode_attention(self, cfg, keys, pool):
        d, G, KV = cfg.head_dim, cfg.group, cfg.kv_heads
        self.S, self.P = tpp.empty((KV + 1, G, keys)), tpp.empty((KV, 1, G, keys), "bf16")
        scores = tpp.brgemm(G, keys, d, "bf16", ldb=cfg.max_len)
        softmax = tpp.softmax(G, keys, scale=d ** -0.5, mask="row", out_dtype="bf16")
        context = tpp.brgemm(G, d, keys, "bf16", c_dtype="bf16")

        @kernel("A", Loop(0, KV), pool=pool)
        def attention(g, Q, KT, V, S, P, Ctx):
            scores(Q[g:g + 1], KT[g, :, :, 0:keys], S[g])
            softmax(S[g], S[KV, 0], P[g, 0])         # the key mask rides in the scores array
            context(P[g], V[g, :, 0:keys // 2], Ctx[g])
        return attention

    # -- running -------------------------------------------------------------------------------------
    def run(self, x, pos):
        for _, call in self.steps(x, pos):
            call()
        return self.H.copy()

    def steps(self, x, pos):
        """[(name, call)]: the step's nests (and NumPy glue) in order; :meth:`run` calls them all
        (a profile times them one by one)."""
        L, T = self.layer, self.T
        cfg = L.cfg
        i8 = self.i8
        q, sc = (self.q, self.sc) if i8 else ({}, {})
        qkv32 = self.QKV.view(np.int32)
        d = cfg.head_dim
        out = [("norm1", lambda: self.norm1(x, L.rms1, self.xn, self.H, q.get("qkv", self.none_u8),
                                            sc.get("qkv", self.none_f32))),
               ("qkv", lambda: self._linear(self.proj_qkv, "qkv", L.qkv, self.QKV)),
               ("rope", lambda: self.rope(self.QKV, L.cos[pos:pos + T], L.sin[pos:pos + T]))]
        if self.keys is None:
            out += [("cache", lambda: self.cache(self.QKV, qkv32, self.KT32, L.V)),
                    ("attention", lambda: self.attention(self.QKV[None], L.KT, L.V, self.S, self.P, self.Ctx))]
        else:
            Q = self.QKV[0, :cfg.hidden].reshape(cfg.kv_heads, cfg.group, d)
            mask = L._key_mask(pos, self.keys)[None]
            out += [("cache", lambda: self.cache(qkv32, self.KT32[:, :, pos:pos + 1], self.QKV.reshape(-1, 1),
                                                 L.V[:, 0, pos // 2, :, pos % 2:pos % 2 + 1], mask, self.S)),
                    ("attention", lambda: self.attention(Q, L.KT, L.V, self.S, self.P,
                                                         self.Ctx.reshape(cfg.kv_heads, cfg.group, d)))]
        if i8:
            out.append(("quant_o", lambda: self.quant_o(self.Ctx, q["o"], sc["o"])))
        out += [("o", lambda: self._linear(self.proj_o, "o", L.o, self.H)),
                ("norm2", lambda: self.norm2(self.H, L.rms2, self.hn, q.get("gu", self.none_u8),
                                             sc.get("gu", self.none_f32)))]
        if i8:
            out += [("gate_up", lambda: self.gate_up(self.a3["gu"], L.gu.blocks, sc["gu"], self.CiOff, self.GU,
                                                     self.A)),
                    ("quant_down", lambda: self.quant_down(self.A, q["down"], sc["down"]))]
        else:
            out.append(("gate_up", lambda: self.gate_up(self.a3["gu"], L.gu.blocks, self.GU, self.A)))
        out.append(("down", lambda: self._linear(self.proj_down, "down", L.down, self.H)))
        return out

    def _linear(self, nest, name, lin, out):
        if self.i8:
            nest(self.a3[name], lin.blocks, self.sc[name], lin.offset, self.Ci[:, 0], out)
        else:
            nest(self.a3[name], lin.blocks, out)
