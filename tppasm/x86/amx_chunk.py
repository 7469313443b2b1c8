"""Batch chunks of the AMX BRGEMM (:mod:`tppasm.x86.amx`): tile loads from L1 over long batches.

Each macro block (2 x 2 tiles: 32 x 32 of C) walks the batch, so it streams the A row panel and
the B column panel of every batch block; the panels of one block are read by every macro block
of its row / column. When the A and B blocks of the batch are larger than L1 they come from L2
again for each macro block (64 x 64 x 64 bf16 x 16: 256 KiB of A + B read twice, 512 KiB of tile
loads per call, more than the L2 -> L1 fill moves in the time of the ``tdp*``). In *chunks* of
``g`` batch blocks whose A + B fit in about half of L1, every macro block runs over one chunk
before the next chunk starts: A and B are fetched from L2 once per call, the rest of the tile
loads hit L1. C keeps the partial sums between chunks: in C itself when it is fp32 / int32 and
there is no epilogue (the first chunk honours beta: ``tilezero`` or a load of C; later chunks
load C), else in an fp32 / int32 scratch on the stack (the first chunk starts as the unchunked
kernel does, the last one runs the epilogue into C).

``count`` is a runtime argument: the chunk loop takes ``g`` blocks at a time and the rest in a
last, shorter chunk, so a call with ``count <= g`` runs one chunk (today's order, no C
round trip). The cycle model of ``python -m bench amx-static`` chose ``g`` and the thresholds.
"""
from isa.x86 import qword, rsp

from .batch import mem_imm

L1_BYTES = 48 << 10          # the L1 data cache the chunks are sized for (Sapphire / Emerald Rapids)
CHUNK_BYTES = L1_BYTES // 2  # A + B of one chunk: half of L1 (C tiles and the next chunk's prefetches share it)
ACC_BYTES = 16 << 10         # the largest fp32 / int32 stack scratch for C's partial sums (64 x 64)
CHUNK_SLOTS = ("left", "n", "first", "last", "accrow")


def block_bytes(desc):
    """Bytes of A and B one batch block holds (what a tile load of every row and group reads).

    >>> from tppasm.brgemm import Brgemm
    >>> block_bytes(Brgemm(m=64, n=64, k=64, dtype="bf16"))
    16384
    """
    es = 2 if desc.dtype == "bf16" else 1
    return desc.m * desc.k * es + desc.groups * desc.n * 4


def acc_ld(desc):
    """Row stride in bytes of the stack scratch that keeps C's partial sums (n in whole tiles)."""
    return -(-desc.n // 16) * 64


def chunk_blocks(desc, plan):
    """Batch blocks per chunk for ``desc`` (a bf16 / i8 :class:`tppasm.brgemm.Brgemm`) tiled by
    ``plan``; 0 keeps one walk of the whole batch per macro block. Chunks pay only where several
    macro blocks share panels, the batch can outgrow L1 and one tile config covers C (a chunk
    visits every region, so several configs would be reloaded per chunk); a bf16 C or an
    epilogue needs the scratch, so C must fit in ``ACC_BYTES``.

    >>> from tppasm.brgemm import Brgemm
    >>> from tppasm.x86.amx import plan
    >>> d = Brgemm(m=64, n=64, k=64, dtype="bf16")
    >>> chunk_blocks(d, plan(d)), chunk_blocks(Brgemm(m=32, n=16, k=64, dtype="bf16"), plan(d))
    (1, 0)
    """
    macro = sum(r.count for r in plan.rows) * sum(c.count for c in plan.cols)
    configs = {cfg for _, _, cfg in plan.regions()}
    scratch = desc.bias or desc.act is not None or desc.c_dtype == "bf16"
    if macro < 2 or len(configs) > 1 or (scratch and desc.m * acc_ld(desc) > ACC_BYTES):
        return 0
    return max(1, CHUNK_BYTES // block_bytes(desc))


class Chunks:
    """Emits the chunk loop for the generator ``g`` (a :class:`tppasm.x86.amx._Gen` with
    ``g.chunk`` > 0): stack slots ``left`` (blocks from this chunk on), ``n`` (blocks in this
    chunk: what the batch walk reads as its count), ``first`` / ``last`` (flags for C)."""

    def __init__(self, g):
        self.g, self.a = g, g.a

    def emit(self, body, between=None):
        """``body()`` once per chunk, the batch operands (their stack copies) advanced between
        chunks, and ``between()`` (when given) emitted before each chunk but the first."""
        g, a, d, n = self.g, self.a, self.g.d, self.g.chunk
        tmp = g.r["tmp"]
        a.mov(tmp, g.arg("count"))
        a.mov(g.var("left"), tmp)
        g.set_var("first", 1)
        loop, go, done = a.label(), a.label(), a.label()
        a.bind(loop)
        g.set_var("last", 1)
        a.cmp(tmp, n)                        # tmp = left
        a.jbe(go)
        a.mov(tmp, n)
        g.set_var("last", 0)
        a.bind(go)
        a.mov(g.var("n"), tmp)
        body()
        g.set_var("first", 0)
        a.mov(tmp, g.var("left"))
        a.sub(tmp, n)
        a.jbe(done)
        a.mov(g.var("left"), tmp)
        if d.batch == "stride":
            advance = (("a", n * d.stride_a * g.es_a), ("b", n * d.stride_b * g.es_a))
        elif d.batch == "offset":
            advance = (("offsets", n * 16),)
        else:
            advance = (("a_ptrs", n * 8), ("b_ptrs", n * 8))
        for name, nbytes in advance:
            mem_imm(a, "add", qword[rsp + g.arg_slot[name]], nbytes, g.r["t2"])
        if between is not None:
            between()
        a.jmp(loop)
        a.bind(done)

    def branch(self, flag, when_set, otherwise):
        """``when_set()`` if the stack flag ``flag`` is 1 at run time, else ``otherwise()``."""
        a = self.a
        other, done = a.label(), a.label()
        a.cmp(self.g.var(flag), 0)
        a.je(other)
        when_set()
        a.jmp(done)
        a.bind(other)
        otherwise()
        a.bind(done)
