"""Multi-head self-attention over a batch of padded sequences, one native nest over (sequence, head).

Q, K and V are column blocks of one row-major ``QKV`` (tokens, 3 * heads * d) array. Per (b, h):
K's block is transposed into per-thread scratch, scores ``Q K^T`` (BRGEMM, k = d), softmax with the
1/sqrt(d) scale (none where Q comes scaled) and the sequence's additive mask (in place), V's block
copied into per-thread scratch, context ``P V`` (BRGEMM, k = length) into the head's columns of
``Ctx``. The copy is for the L1: V's rows lie 3 * heads * d apart in ``QKV`` (4.5 KiB for MiniLM),
so the 16 KiB block fills few of its sets and is read again from L2 for every row block of P; packed, the context
BRGEMM ran at 88-91 GFLOP/s instead of 58 on a Zen 3 core (128 x 32 x 128), the copy 0.7 us of
its 12, and MiniLM's attention at 8 x 128 in 0.90x the time on 1 and 2 threads.

In bf16 the BRGEMMs read bf16 in VNNI2: the VNNI2 layout of K^T, (d/2, L, 2), is K's (L, d/2)
pairs transposed, so it is a transpose of K seen as 32-bit elements (the transform TPP on an int32
view of the same memory); V is packed with the vnni2 transform; the softmax writes bf16
probabilities; the context is written as bf16, the next GEMM's input. Scores and the softmax's sums
stay fp32.

>>> import numpy as np, tppasm as tpp
>>> from isa.pool import get_pool
>>> att = Attention(1, 16, 2, 8, "f32", get_pool())
>>> qkv = tpp.empty((16, 48)); qkv[...] = 1.0; ctx = tpp.empty((16, 16)); mask = np.zeros((1, 16), np.float32)
>>> att(qkv, mask, ctx); float(ctx.min()), float(ctx.max())
(1.0, 1.0)
"""
from types import SimpleNamespace

import numpy as np

import tppasm as tpp
from loops import Loop, kernel, thread


STEPS = ("k_transpose", "scores", "softmax", "v_pack", "context")


class Attention:
    """Self-attention for ``B`` sequences of ``L`` (padded) tokens, ``heads`` heads of ``d``;
    ``scale`` multiplies the scores in the softmax (1.0 for queries that come scaled already)."""

    def __init__(self, B, L, heads, d, dtype, pool, scale=None):
        hidden = heads * d
        ld = 3 * hidden
        nt = pool.nthreads
        self.dtype, self.B, self.L, self.heads, self.d, self.pool = dtype, B, L, heads, d, pool
        self.S = tpp.empty((nt, L, L))
        scale = d ** -0.5 if scale is None else scale
        k = self.k = SimpleNamespace(softmax=tpp.softmax(L, L, scale=scale, mask="row", out_dtype=dtype))
        if dtype == "f32":
            self.KT = tpp.empty((nt, 1, d, L))
            self.V = tpp.empty((nt, 1, L, d))
            k.transpose = tpp.transform("transpose", L, d, ldx=ld, ldo=L)
            k.pack = tpp.copy(L, d, ldx=ld, ldo=d)
            k.scores = tpp.brgemm(L, L, d, lda=ld, ldb=L, ldc=L)
            k.context = tpp.brgemm(L, d, L, lda=L, ldb=d, ldc=hidden)
        else:
            half = d // 2
            self.KT = tpp.empty((nt, 1, half, L, 2), "bf16")                # K^T in VNNI2
            self.V = tpp.empty((nt, 1, -(-L // 2), d, 2), "bf16")           # V in VNNI2
            self.P = tpp.empty((nt, 1, L, L), "bf16")
            self._KT32 = self.KT.view(np.int32).reshape(nt, half, L)
            k.transpose = tpp.transform("transpose", L, half, ldx=ld // 2, ldo=L, dtype="i32")
            k.pack = tpp.transform("vnni2", L, d, ldx=ld, dtype="bf16")
            k.scores = tpp.brgemm(L, L, d, "bf16", lda=ld, ldb=L)
            k.context = tpp.brgemm(L, d, L, "bf16", lda=L, ldc=hidden, c_dtype="bf16")
        self.nest = self._nest()

    def _nest(self, only=STEPS):
        """The nest over (sequence, head) running the steps in ``only`` (all but for a profile)."""
        k, L, d = self.k, self.L, self.d
        hidden = self.heads * d
        loops = (Loop(0, self.B), Loop(0, self.heads))
        if self.dtype == "f32":
            @kernel("AB", *loops, pool=self.pool)
            def nest(b, h, QKV, KT, V, S, Mask, Ctx):
                t, r, c = thread().tid, b * L, h * d
                if "k_transpose" in only:
                    k.transpose(QKV[0, r:r + L, hidden + c:hidden + c + d], KT[t, 0])
                if "scores" in only:
                    k.scores(QKV[:, r:r + L, c:c + d], KT[t], S[t])
                if "softmax" in only:
                    k.softmax(S[t], Mask[b], S[t])
                if "v_pack" in only:
                    k.pack(QKV[0, r:r + L, 2 * hidden + c:2 * hidden + c + d], V[t, 0])
                if "context" in only:
                    k.context(S[t:t + 1], V[t], Ctx[0, r:r + L, c:c + d])
            return nest
        half = d // 2

        @kernel("AB", *loops, pool=self.pool)
        def nest_bf16(b, h, QKV, QKV32, KT32, KT, V, S, P, Mask, Ctx):
            t, r, c = thread().tid, b * L, h * d
            k32 = hidden // 2 + h * half
            if "k_transpose" in only:
                k.transpose(QKV32[r:r + L, k32:k32 + half], KT32[t])
            if "scores" in only:
                k.scores(QKV[:, r:r + L, c:c + d], KT[t], S[t])
            if "softmax" in only:
                k.softmax(S[t], Mask[b], P[t, 0])
            if "v_pack" in only:
                k.pack(QKV[0, r:r + L, 2 * hidden + c:2 * hidden + c + d], V[t, 0])
            if "context" in only:
                k.context(P[t], V[t], Ctx[0, r:r + L, c:c + d])
        return nest_bf16

    def __call__(self, qkv, mask, ctx, nest=None):
        """ctx (tokens, hidden) = attention of qkv (tokens, 3 * hidden) under mask (B, L) (0 / -inf)."""
        nest = nest or self.nest
        q3, c3 = qkv[None], ctx[None]
        if self.dtype == "f32":
            nest(q3, self.KT, self.V, self.S, mask, c3)
        else:
            nest(q3, qkv.view(np.int32), self._KT32, self.KT, self.V, self.S, self.P, mask, c3)

    def steps(self):
        """[(name, call(qkv, mask, ctx))]: a nest per step, for a profile."""
        return [(s, lambda q, m, c, nest=self._nest((s,)): self(q, m, c, nest)) for s in STEPS]
