"""The batch and k loops of the AMX BRGEMM (:mod:`tppasm.x86.amx`): software-pipelined tile loads.

A macro block of gm x gn accumulator tiles walks the batch; each batch block is cut into k *steps*
(the main ones of ``plan.step`` groups, then an optional narrower tail step on its own tiles).
Every step issues its ``tdp*`` column by column of C (``B_j`` feeds ``C_0j``, ``C_1j``, then the
next column), and right after the last ``tdp*`` that reads an operand tile the generator emits the
load of that tile's next contents: the next step's, or the next batch block's first step. So a load
sits in the instruction stream as early as the tile allows, and a ``tdp*`` finds its operands
loaded two or three ``tdp*`` earlier instead of waiting on a fresh ``tileloadd`` (with the 2 x 2
blocking the A tiles are written one ``tdp*``, the B tiles two before their first reader).

While the steps of batch block b run, ``prefetcht0`` brings the lines of block b + 1 into L1
(for long k, the lines two steps ahead); not in batch chunks (:mod:`tppasm.x86.amx_chunk`), whose
blocks stay in L1. There the last block of a macro block also loads the first step of the next
macro block (``handoff``) instead of nothing. Consecutive macro blocks walk the batch in opposite
directions, so the panel two neighbours share (A rows along a row of macro blocks) starts with
the blocks the previous one loaded last, still in L1. The cycle model of
``python -m bench amx-static`` (:mod:`bench.amx_model`) is what chose these.

An operand whose lines would crowd an L1 set is not prefetched (:func:`crowded`: rows 2 or 4 KiB
apart, as in a LLaMA prefill projection over row-major activations 2048 wide, put a tile's rows
in one or two of the 12-way sets, where lines prefetched ahead evict each other before their
load). MODELLED with a 12-way L1 (``bench.amx_model.simulate(..., l1_ways=12)``), a 64x64x2048
bf16 BRGEMM of lda 2048 ran at 48.9% of the AMX peak with A prefetched (before this rule) and runs
at 72.2% with only B (73.3% at lda 2080, where nothing crowds: ``python -m bench amx-static
--crowding``); ``python -m bench amx-variants`` times that case.

k tails: with k not a multiple of the VNNI factor (bf16 2, int8 4) the last group is partial;
the step holding it loads its A tiles, and for bf16 its B tiles, from a stack scratch, copied
with the missing elements zeroed (A is read only up to column k, so nothing past an operand is
touched; B's padding entries may hold anything: 0 * NaN would not vanish in fp32, so they are
cleared too; int8 products with a zero A byte are exact zeros).
"""
from collections import Counter
from dataclasses import dataclass

from isa.x86 import K, TMM, ZMM, qword, rsp

from .batch import add_imm, mem_imm

COLSB, ROWS = 64, 16
UNROLL_K = 4                           # k steps unrolled before a runtime k loop is used
PREFETCH_LINES = 512                   # at most this many next-block lines per batch block (32 KiB)
L1_SETS, L1_WAYS = 64, 12              # the L1D of every AMX core so far (Golden Cove on): 48 KiB


def crowded(offsets):
    """Whether the lines at byte ``offsets`` (from one base) put more than ``L1_WAYS`` of them in
    one L1 set, as the rows of a tile 2 or 4 KiB apart do (a row-major bf16 matrix 1024 or 2048
    wide): prefetched ahead, they evict each other before their tile load reads them.

    >>> crowded([r * 4096 for r in range(32)]), crowded([r * 4160 for r in range(32)]), crowded([])
    (True, False, False)
    """
    per_set = Counter(line % L1_SETS for line in {off // COLSB for off in offsets})
    return max(per_set.values(), default=0) > L1_WAYS


def streamed_operand(p):
    """The operand ("a" or "b") whose tiles a kernel of plan ``p`` loads with ``tileloaddt1``
    (the hint that the lines will not be read again soon), or None (one macro block).

    Macro blocks run row by row of C; the panels of the other operand (B's columns when there are
    at least as many macro rows as columns, else A's rows) are read again by the next macro
    blocks, and a plain load of the streamed operand evicts them from L1 on their way. Measured
    on an Intel Xeon with AMX (2-core KVM guest, the kernel called from a native loop, GFLOP/s
    without / with the hint): 128x32x64x8 (B's 32 KiB panel read by 4 macro rows) 1,385 / 1,443,
    and with no prefetches 1,409 / 1,781; 32x128x64x8 1,265 / 1,300 (1,410 / 1,835); 64x32x64x8
    1,328 / 1,363 (1,423 / 1,921); 64x64x64x16, whose panels outgrow L1, 1,204 / 1,208.

    >>> from tppasm.brgemm import Brgemm
    >>> from tppasm.x86.amx import plan
    >>> [streamed_operand(plan(Brgemm(m=m, n=n, k=64, dtype="bf16"))) for m, n in ((128, 32), (32, 128), (32, 32))]
    ['a', 'b', None]
    """
    rows, cols = sum(s.count for s in p.rows), sum(s.count for s in p.cols)
    if rows * cols == 1:
        return None
    return "a" if rows >= cols else "b"


@dataclass(frozen=True)
class Step:
    """One k step of a batch block: byte offsets of its A columns and B rows, its tile set, its
    width in groups, and whether its tiles come from the cleaned scratch."""

    a_off: int
    b_off: int
    tail: bool
    width: int
    scratch: bool


class Pipeline:
    """Emits the batch loop of one macro block of ``gm`` x ``gn`` tiles for the generator ``g``
    (a :class:`tppasm.x86.amx._Gen`; its registers, stack slots and helpers are used). In batch
    chunks, ``handoff`` = (A, B) bytes from this macro block's panels to the next one's: its last
    batch block loads the next one's first step from there; ``preloaded``: the previous one did
    that for this one."""

    def __init__(self, g, rsizes, csizes, handoff=None, preloaded=False):
        self.g, self.a, self.r, self.d, self.p = g, g.a, g.r, g.d, g.p
        self.handoff, self.preloaded = handoff, preloaded
        self.rsizes, self.csizes = rsizes, csizes
        self.gm, self.gn = len(rsizes), len(csizes)
        d, p = self.d, self.p
        self.lda_b, self.ldb_b = d.lda * g.es_a, d.ldb * 4
        self.a_step, self.b_step = 4 * p.step, p.step * self.ldb_b
        partial = d.k % d.vnni != 0
        main = [Step(s * self.a_step, s * self.b_step, False, p.step, False) for s in range(p.steps)]
        if p.tail:
            tail = Step(p.steps * self.a_step, p.steps * self.b_step, True, p.tail, partial)
            self.steps = main + [tail]
        else:
            if partial:
                main[-1] = Step(main[-1].a_off, main[-1].b_off, False, p.step, True)
            self.steps = main
        self.unrolled = p.steps <= UNROLL_K
        self.order = [(i, j) for j in range(self.gn) for i in range(self.gm)]   # column by column

    # -- tiles and addresses --------------------------------------------------------------------
    def a_tile(self, i, step):
        return TMM[self.p.a_tile(i, step.tail)]

    def b_tile(self, j, step):
        return TMM[self.p.b_tile(j, step.tail)]

    def load(self, tile_kind, idx, step, base, adv):
        """``tileloadd`` of A tile ``idx`` (``tile_kind`` "a") or B tile ``idx`` of ``step`` from
        the batch block at ``base`` (registers (A, B)), ``adv`` (A, B) bytes already stepped."""
        a, r, g = self.a, self.r, self.g
        stream = a.tileloaddt1 if g.stream == tile_kind else a.tileloadd
        if tile_kind == "a":
            if step.scratch:
                a.tileloadd(self.a_tile(idx, step), [rsp + r["s64"] + (g.pad_a + idx * 1024)])
            else:
                stream(self.a_tile(idx, step), [base[0] + r["sa"] + (step.a_off - adv[0] + idx * ROWS * self.lda_b)])
        else:
            if step.scratch and self.d.dtype == "bf16":
                a.tileloadd(self.b_tile(idx, step), [rsp + r["s64"] + (g.pad_b + idx * 1024)])
            else:
                stream(self.b_tile(idx, step), [base[1] + r["sb"] + (step.b_off - adv[1] + idx * COLSB)])

    def load_all(self, step, base, adv):
        if step.scratch:
            self.copy(step, base, adv)
        for i in range(self.gm):
            self.load("a", i, step, base, adv)
        for j in range(self.gn):
            self.load("b", j, step, base, adv)

    # -- the partial group: cleaned copies ------------------------------------------------------
    def copy(self, step, base, adv):
        """Scratch = the step's A rows up to column k (zeros after), and for bf16 its B rows with
        the padding entries of the last group zeroed."""
        a, r, g, d = self.a, self.r, self.g, self.d
        t, z = r["t2"], ZMM[0]
        for i, rows in enumerate(self.rsizes):
            a.mov(t, base[0])
            add_imm(a, t, step.a_off - adv[0] + i * ROWS * self.lda_b, r["tmp"])
            for row in range(rows):
                a.vmovdqu8(z.mask(K[2], zero=True), [t])
                a.vmovdqu64([rsp + g.pad_a + i * 1024 + row * COLSB], z)
                if row < rows - 1:
                    a.add(t, r["sa"])
        if d.dtype != "bf16":
            return
        for j, cols in enumerate(self.csizes):
            full = (1 << 2 * cols) - 1
            a.mov(_r32(r["tmp"]), full)                    # 32-bit moves: no 64-bit immediates
            a.kmovd(K[3], _r32(r["tmp"]))
            a.mov(_r32(r["tmp"]), full & 0x55555555)      # the even bf16 of each pair: the last group
            a.kmovd(K[4], _r32(r["tmp"]))
            a.mov(t, base[1])
            add_imm(a, t, step.b_off - adv[1] + j * COLSB, r["tmp"])
            for row in range(step.width):
                last = row == step.width - 1
                a.vmovdqu16(z.mask(K[4] if last else K[3], zero=True), [t])
                a.vmovdqu64([rsp + g.pad_b + j * 1024 + row * COLSB], z)
                if not last:
                    a.add(t, r["sb"])

    # -- one step -------------------------------------------------------------------------------
    def step(self, x, adv, nxt, nbase, nadv, prefetch=()):
        """The ``tdp*`` of step ``x`` (``adv`` bytes stepped) with the loads of ``nxt`` (the next
        step on the same tiles, from ``nbase`` with ``nadv`` stepped; None: none) hoisted right
        after the last reader of each tile, and ``prefetch`` addresses spread over the ``tdp*``."""
        a, p = self.a, self.p
        dot = self.g.dot
        last_a = {i: q for q, (i, j) in enumerate(self.order)}          # the last reader wins
        last_b = {j: q for q, (i, j) in enumerate(self.order)}
        prefetch = list(prefetch)
        per = -(-len(prefetch) // len(self.order)) if prefetch else 0
        next_block = nbase[0] == self.r["an"]
        copied = set()

        def emit_loads(loads, adv):
            for kind, idx in loads:
                if nxt.scratch and adv not in copied:
                    self.copy(nxt, nbase, adv)
                    copied.add(adv)
                self.load(kind, idx, nxt, nbase, adv)

        for q, (i, j) in enumerate(self.order):
            dot(TMM[p.c_tile(i, j)], self.a_tile(i, x), self.b_tile(j, x))
            loads = [("b", jj) for jj, qq in last_b.items() if qq == q] + \
                    [("a", ii) for ii, qq in last_a.items() if qq == q]
            if nxt is not None and loads:
                skip, other = a.label(), a.label()
                if next_block:                      # after the last block: none, or the next macro block's
                    a.cmp(self.r["bctr"], 1)
                    if self.handoff:
                        a.jne(other)
                        emit_loads(loads, (nadv[0] - self.handoff[0], nadv[1] - self.handoff[1]))
                        a.jmp(skip)
                    else:
                        a.je(skip)
                a.bind(other)
                emit_loads(loads, nadv)
                a.bind(skip)
            for addr in prefetch[q * per:(q + 1) * per]:
                a.prefetcht0(addr)

    def lines(self, step, base, adv, groups=None):
        """Prefetch addresses covering the A and B lines of ``step`` (or of ``groups`` groups from
        it: a whole batch block) at ``base``; none when a displacement would not fit in 32 bits, nor
        in batch chunks (their blocks stay in L1; prefetching the next chunk's evicts them), nor in
        a kernel generated without prefetches."""
        if self.g.chunk or not self.g.prefetch:
            return []
        groups = groups or step.width
        a_bytes = groups * 4
        a_lines = [step.a_off - adv[0] + (i * ROWS + row) * self.lda_b + c
                   for i, rows in enumerate(self.rsizes) for row in range(rows) for c in range(0, a_bytes, 64)]
        b_lines = [step.b_off - adv[1] + g * self.ldb_b + j * COLSB for g in range(groups) for j in range(self.gn)]
        keep = self.g.prefetch == "all"
        out = [(base[x], off) for x, offs in enumerate((a_lines, b_lines)) if keep or not crowded(offs) for off in offs]
        if any(abs(off) >= 2 ** 31 - 64 for _, off in out):
            return []
        return [[reg + off] for reg, off in out[:PREFETCH_LINES]]

    # -- the batch loop ---------------------------------------------------------------------------
    def emit(self):
        a, r = self.a, self.r
        cur, nxt = (r["ak"], r["bk"]), (r["an"], r["bn"])
        zero = (0, 0)
        self.start_batch()
        first = {False: self.steps[0]}
        if self.steps[-1].tail:
            first[True] = self.steps[-1]
        for step in first.values():
            if not self.preloaded:
                self.load_all(step, cur, zero)
        a.mov(r["bctr"], self.g.batch_count())
        loop = a.label()
        a.bind(loop)
        self.next_block()
        if self.unrolled:
            total = sum(s.width for s in self.steps)
            lines = self.lines(self.steps[0], nxt, zero, groups=total)
            per = -(-len(lines) // len(self.steps)) if lines else 0
            for x, step in enumerate(self.steps):
                follow, base = self.follower(x)
                self.step(step, zero, follow, base, zero, lines[x * per:(x + 1) * per])
        else:
            self.k_loop(cur, nxt)
        a.mov(r["ak"], r["an"])
        a.mov(r["bk"], r["bn"])
        self.advance_cursor()
        a.dec(r["bctr"])
        a.jnz(loop)

    def follower(self, x):
        """(the next step on step ``x``'s tiles, its base registers): the next main step of the
        block, else the next block's first main step; a tail step is followed by the next block's."""
        r, steps = self.r, self.steps
        cur, nxt = (r["ak"], r["bk"]), (r["an"], r["bn"])
        step = steps[x]
        if step.tail:
            return step, nxt
        main = [s for s in steps if not s.tail]
        if x + 1 < len(main):
            return main[x + 1], cur
        return main[0], nxt

    def k_loop(self, cur, nxt):
        """Main steps 0 .. S-3 in a runtime loop (the k pointers advance), S-2 and S-1 peeled
        (the last may be the scratch step, and hands over to the next block), then the tail."""
        a, r, p = self.a, self.r, self.p
        main = [s for s in self.steps if not s.tail]
        zero = (0, 0)
        body, follow = Step(0, 0, False, p.step, False), Step(self.a_step, self.b_step, False, p.step, False)
        ahead = Step(2 * self.a_step, 2 * self.b_step, False, p.step, False)
        a.mov(r["kctr"], p.steps - 2)
        kl = a.label()
        a.bind(kl)
        self.step(body, zero, follow, cur, zero, self.lines(ahead, cur, zero))
        a.add(r["ak"], self.a_step)
        add_imm(a, r["bk"], self.b_step, r["tmp"])
        a.dec(r["kctr"])
        a.jnz(kl)
        adv = ((p.steps - 2) * self.a_step, (p.steps - 2) * self.b_step)
        self.step(main[-2], adv, main[-1], cur, adv, self.lines(main[0], nxt, zero))
        self.step(main[-1], adv, main[0], nxt, zero, self.lines(main[1], nxt, zero))
        if self.steps[-1].tail:
            self.step(self.steps[-1], adv, self.steps[-1], nxt, zero)

    # -- batch pointers ---------------------------------------------------------------------------
    def units(self):
        """Bytes (or entry bytes) the batch cursors move per block: (A or entries, B or None)."""
        d, g = self.d, self.g
        if d.batch == "stride":
            return d.stride_a * g.es_a, d.stride_b * g.es_a
        return (16, None) if d.batch == "offset" else (8, 8)

    def start_batch(self):
        """Flip the walking direction, then point the cursors (A/B blocks for strides, the batch
        arrays otherwise) at the first block of that direction and ak / bk at its A / B."""
        a, r, g, d = self.a, self.r, self.g, self.d
        sl = g.slots
        u0, u1 = self.units()
        c0 = r["ak"] if d.batch == "stride" else r["p"]
        c1 = r["bk"] if d.batch == "stride" else (r["q"] if d.batch == "address" else None)
        names = {"stride": ("a", "b"), "offset": ("offsets", None), "address": ("a_ptrs", "b_ptrs")}[d.batch]
        a.mov(c0, g.arg(names[0]))
        if c1 is not None:
            a.mov(c1, g.arg(names[1]))
        fwd, done = a.label(), a.label()
        a.xor(qword[rsp + sl["dir"]], 1)
        a.jz(fwd)
        t = r["t2"]
        for cur, unit, slot in ((c0, u0, "da"), (c1, u1, "db")):
            if cur is None:
                continue
            a.mov(t, g.batch_count())
            a.dec(t)
            _mul_imm(a, t, unit, r["tmp"])
            a.add(cur, t)
            mem_imm(a, "mov", qword[rsp + sl[slot]], -unit, r["tmp"])
        a.jmp(done)
        a.bind(fwd)
        for cur, unit, slot in ((c0, u0, "da"), (c1, u1, "db")):
            if cur is not None:
                mem_imm(a, "mov", qword[rsp + sl[slot]], unit, r["tmp"])
        a.bind(done)
        if d.batch == "stride":
            a.add(r["ak"], [rsp + sl["arow"]])
            a.add(r["bk"], [rsp + sl["bcol"]])
        else:
            self.entry_pointers(r["p"], r.get("q"), r["ak"], r["bk"])

    def entry_pointers(self, p, q, ak, bk):
        """ak / bk = the A / B block of the batch entry at ``p`` (and ``q``), plus the macro
        block's row / column offsets."""
        a, g, d, sl = self.a, self.g, self.d, self.g.slots
        if d.batch == "offset":
            a.mov(bk, [p + 8])
            a.mov(ak, [p])
            if g.es_a == 2:
                a.add(ak, ak)
                a.add(bk, bk)
            a.add(ak, g.arg("a"))
            a.add(bk, g.arg("b"))
        else:
            a.mov(ak, [p])
            a.mov(bk, [q])
        a.add(ak, [rsp + sl["arow"]])
        a.add(bk, [rsp + sl["bcol"]])

    def next_block(self):
        """an / bn = the next batch block's A / B; the current one's in the last iteration, where
        the hoisted loads are skipped and the prefetches repeat the current block (so no batch
        array is read past its end)."""
        a, r, d, sl = self.a, self.r, self.d, self.g.slots
        if d.batch == "stride":
            a.mov(r["an"], r["ak"])
            a.add(r["an"], [rsp + sl["da"]])
            a.mov(r["bn"], r["bk"])
            a.add(r["bn"], [rsp + sl["db"]])
            a.cmp(r["bctr"], 1)
            a.cmove(r["an"], r["ak"])
            a.cmove(r["bn"], r["bk"])
            return
        q = r.get("q") if d.batch == "address" else None
        a.mov(r["an"], r["p"])
        a.add(r["an"], [rsp + sl["da"]])
        if q is not None:
            a.mov(r["bn"], q)
            a.add(r["bn"], [rsp + sl["db"]])
        a.cmp(r["bctr"], 1)
        a.cmove(r["an"], r["p"])
        if q is not None:
            a.cmove(r["bn"], q)
            a.mov(r["t2"], r["bn"])
        self.entry_pointers(r["an"], r["t2"] if q is not None else None, r["an"], r["bn"])

    def advance_cursor(self):
        a, r, d, sl = self.a, self.r, self.d, self.g.slots
        if d.batch == "stride":
            return
        a.add(r["p"], [rsp + sl["da"]])
        if d.batch == "address":
            a.add(r["q"], [rsp + sl["db"]])


def _r32(reg):
    from isa.x86 import gpr
    return gpr(reg.num, 32)


def _mul_imm(a, reg, value, tmp):
    """reg *= value (an immediate, or through ``tmp`` when beyond int32)."""
    if -2 ** 31 <= value < 2 ** 31:
        a.imul(reg, reg, value)
    else:
        a.mov(tmp, value)
        a.imul(reg, tmp)
