"""The software prefetches of the x86 BRGEMM kernels (mixed into :class:`tppasm.x86.brgemm.Gen`):
near (each B line a few k groups ahead, into L1) and far (the next batch chunk, into L2, where
:mod:`tppasm.x86.far_prefetch` turns it on: AMD). The far prefetch of B spreads over every k-loop
iteration of the call (:func:`spread_step`); of A, each row's next-chunk line, once an iteration.

>>> spread_step(48 << 10, 2 * 344)    # MiniLM's AVX2 32 x 16 x 384 GEMM: chunks of 2, 344 iterations a block
72
"""
from isa.x86 import qword, rsp

from . import far_prefetch
from .blocking import ALIASED_ROWS, row_runs, rows_per_set

PREFETCH_B = 8                  # k groups ahead (prefetches never fault)
FAR_BLOCK_BYTES = 16 << 10      # A and B bytes of a batch block from which the next chunk is prefetched
STREAM_ROWS = 4                 # kernels of at most this many rows get no software prefetch (see near_distance)


def spread_step(region, iterations):
    """Bytes of a ``region`` (the next chunk's B) to prefetch per k-loop iteration so that
    ``iterations`` of them cover it: whole, never more than ``iterations`` bytes past its end.

    >>> spread_step(128 << 10, 11242)      # LLaMA's AVX2 bf16 64 x 32 x 2048: a line every 5 or 6 iterations
    12
    """
    return -(-region // iterations)


class Prefetches:
    """Where a kernel prefetches: the distances (set in ``Gen.build``: ``near_b``, ``far_a``, ``far_b``,
    ``spread``) and the instructions at the start of a chunk, of a k-loop iteration and of a k group."""

    def far_distances(self):
        """Bytes from a batch block of A and of B to the same place one chunk on (0, 0: none).
        While a chunk runs, its tiles prefetch the next chunk into L2 at these distances, and the
        last chunk the B blocks after the call's, where a nest's next call usually reads (the next
        column block of blocked weights, or the next k step); found worth 3-6% of the FMA peak in a
        2048^3 fp32 GEMM of 64x64 and 128x64 blocks, whose B otherwise arrives from L3 on demand.
        Not A's after the call: a nest over column blocks calls again on the same A, and with one
        block a call ``stride_a`` need not be a block's size at all (on Zen 3, 1 thread: MiniLM's
        fp32 forward at 1 x 32 tokens, whose 32 x 16 x 384 GEMMs fetched 54 KiB of lines nothing
        read a call, took 0.95x the time without them, 0.96x on 2 threads; LLaMA's bf16 prefill,
        whose 64 x 32 x 2048 gate/up GEMM, ``stride_a`` one 4 KiB row, prefetched the row below each
        of its tile's rows every 2 k groups, 0.75x: gate/up 335 -> 222 ms; GEMMs and convolutions
        unchanged). Smaller blocks mostly stay in L1, where the prefetches would only take issue
        slots; pointer batches have no known distance. Only where
        :func:`tppasm.x86.far_prefetch.enabled` (AMD: on Intel they cost 15-28%)."""
        d = self.d
        far = self.chunk * d.stride_a * self.es_a, self.chunk * d.stride_b * self.es_b
        if (not self.chunk or d.batch != "stride" or self.block_bytes() < FAR_BLOCK_BYTES or max(far) >= 1 << 31
                or d.m <= STREAM_ROWS or not d.prefetch or not far_prefetch.enabled()):   # (32-bit displacements)
            return 0, 0
        return far

    def near_distance(self):
        """Bytes ahead of each B line to prefetch into L1 (0: none). A kernel of at most
        ``STREAM_ROWS`` rows reads each B line once for as many FMAs (a GEMV, batch-1 decoding):
        it streams B from memory, where the hardware prefetcher alone keeps up and software
        prefetches only cost issue slots and miss buffers. Measured on Zen 4, 1 thread, B panels
        of 2048 x 64 swept cold from DRAM: m = 1, 2, 4 read B at 0.73-0.87 of a plain read sweep
        with the near and far prefetches and at 0.94-1.09 without; m = 8, whose two row tiles (6 + 2)
        read B twice, loses without them (0.58-0.75 against 0.79-0.92).

        None either when the B rows up to the prefetched one crowd one L1 set (``ldb`` a multiple
        of 4 KiB, see :data:`~tppasm.x86.blocking.ALIASED_ROWS`): each prefetch would evict a line
        still in use. Zen 4, 1 thread, fp32 64 x 64 x 64 x 8 blocks with A, B and C 4096 floats
        apart at one offset in a page: 57 us with them, 46 without (1040 floats: 37 either way)."""
        d = self.d
        if d.m <= STREAM_ROWS or not d.prefetch or rows_per_set(d.ldb * 4, PREFETCH_B + 1) > ALIASED_ROWS:
            return 0
        return PREFETCH_B * d.ldb * 4

    def spread_bytes(self):
        """Bytes of the next chunk's B that every iteration of a k loop prefetches (0: none; each k
        group then prefetches its own B lines one chunk on). A pointer walks the next chunk's B at
        this pace over all tiles of the chunk, so the lines arrive at about the rate the kernel
        reads its own. Per k group in every tile, the first row tile fetched all of them: a burst
        at the pace it reads B (a line every ~6 cycles on Zen 3, ~30 GB/s), past what one core
        draws from DRAM, and the tiles after it fetched nothing new. Measured on Zen 3, 1 thread
        (2 threads), the time against per-group prefetches: MiniLM fp32 at 1 x 32 tokens, its weights
        streaming from DRAM (42 MiB > the 32 MiB L3) 0.87-0.92x (0.84-0.90x), at 8 x 128 the same;
        ResNet-50 convolutions at batch 8, 1 thread, 0.82-0.99x (res4a_branch2b) to 0.93-1.0x; GEMMs
        1024^3 to 4096 x 1024 x 1024 and LLaMA's bf16 prefill the same (LLaMA lost 1.5% while the
        pointer walked a whole line an iteration, 5.5 chunks past the next one)."""
        if not self.far_b:
            return 0
        iterations = sum(self.k_iterations(rows, vecs) * times * columns for _, vecs, columns, _ in self.column_blocks()
                         for rows, times in row_runs(self.d.m, self.plan.rows))      # a batch block's, all tiles
        return spread_step(self.far_b, self.chunk * iterations) if iterations else 0

    def start_spread(self, tmp):
        """At a chunk's start: the spread pointer at the next chunk's B (a stride batch: the chunk's
        own starts at the B argument)."""
        if self.spread:
            self.a.lea(tmp, [self.arg["b"] + self.far_b])
            self.a.mov([rsp + self.slots["farB"]], tmp)

    def iteration_prefetches(self, rows, row_a):
        """At the top of a k-loop iteration: each A row's line one chunk on (unless this is the
        call's last chunk), ``spread`` bytes of the next chunk's B, and where A streams, the next
        row tile's A lines."""
        a, r = self.a, self.r
        if self.far_a:
            past = a.label()
            a.cmp(qword[rsp + self.slots["last"]], 0)   # the call's last chunk: no next one (far_distances)
            a.jne(past)
            for i in range(rows):
                a.prefetcht1([r["a_k"] + i * row_a + self.far_a])
            a.bind(past)
        if self.spread:
            a.mov(r["tmp"], [rsp + self.slots["farB"]])
            for offset in range(0, self.spread, 64):
                a.prefetcht1([r["tmp"] + offset])
            a.add(qword[rsp + self.slots["farB"]], self.spread)
        if self.next_rows:                              # the next row tile's A lines, into L2
            for i in range(rows):
                a.prefetcht1([r["a_k"] + (rows + i) * row_a])

    def group_prefetches(self, b_k, nbytes):
        """At a k group reading ``nbytes`` of B from ``b_k``: its lines ``near_b`` ahead, and one
        chunk on where the far prefetch of B does not spread over the k loops' iterations."""
        for line in range(0, nbytes, 64):
            if self.near_b:
                self.a.prefetcht0([b_k + self.near_b + line])
            if self.far_b and not self.spread:
                self.a.prefetcht1([b_k + self.far_b + line])
