"""x86 BRGEMM generators: register-blocked microkernels for AVX2 and AVX-512 (fp32, bf16, int8).

A kernel walks C in tiles of R rows x V vectors (one accumulator register each). For every tile
it loops over the batch, and inside over k in *groups* (1 k for fp32, 2 for bf16, 4 for int8):
per group it loads V vectors of B's row group, then for each of the R rows broadcasts A's group
(4 bytes in every dtype) and accumulates. In every dtype one 4-byte lane of a B row group is one
column of C, so the addressing is the same for all and only the inner product differs: that is a
small strategy object (:class:`tppasm.x86.dot.Dot`) per (dtype, instructions available).

Column tails use masks (AVX-512 opmasks, AVX2 ``vmaskmovps``); rows are split into tiles of
near-equal height. The blocking (R, V) is chosen per shape by a small throughput model
(:mod:`tppasm.x86.blocking`); the C side (starting value, epilogue, stores) is in
:mod:`tppasm.x86.ctile`.

Feature dispatch: AVX-512 uses ``vdpbf16ps`` / ``vpdpbusd`` when the target has AVX512-BF16 /
AVX512-VNNI, else the AVX2-style conversions at 512 bits. The target is the host when the host runs
``isa``, else (code for the interpreter or another machine) a full AVX-512 (F/BW/VL/BF16/VNNI) part.

>>> from tppasm.brgemm import Brgemm
>>> fn = generate_brgemm(Brgemm(m=4, n=8, k=4), "avx2")
>>> "vfmadd231ps" in fn.disassemble()
True
"""
from isa.cpu import host
from isa.x86 import Function, byte, dword, gpr, qword, rsp, vec, word
from isa.x86.registers import Register
from isa.x86.function import CALLEE_SAVED, INT_ARGS

from ..backends import register
from .batch import add_imm, next_batch
from .blocking import plan, row_runs
from .ctile import CTile, _math, desc_act_heavy, if_else
from .dot import choose_dot
from .prefetch import Prefetches
from .vector import Mask, VectorISA

ES = {"f32": 4, "bf16": 2, "u8": 1, "i8": 1, "i32": 4}
EPILOGUE_REGS = 4                # vector registers an epilogue keeps beside the accumulators (see Gen)
FULL_AVX512 = frozenset({"avx512_bf16", "avx512_vnni"})
UNROLL_ALL, UNROLL, UNROLL_INSTRUCTIONS = 16, 8, 120
L2_BYTES, L2_COUNT = 512 << 10, 16
CHUNK_BYTES = 192 << 10         # A and B bytes of one chunk of the batch: well inside L2
SHALLOW_K, SHALLOW_B_BYTES = 48, 384 << 10     # see rows_outer
STREAM_A_RATIO = 4              # an A block this many times the B block or more streams (see streams_a)


# -- inner products ------------------------------------------------------------------------------

def target_features(isa):
    """Features the generated code may use: the host's when it runs ``isa``, else full AVX-512."""
    h = host()
    if isa in h.levels:
        return frozenset(f for f, on in h.features.items() if on)
    return FULL_AVX512 if isa != "avx2" else frozenset()


# -- code generation -----------------------------------------------------------------------------

class Gen(CTile, Prefetches):
    """State of one kernel's generation: assembler, vector ISA, registers, the plan."""

    def __init__(self, desc, isa, features):
        self.d, self.v = desc, VectorISA(isa)
        self.features = features
        self.dot = choose_dot(desc.dtype, isa, features, desc.signs, desc.a_bits)
        self.es_a, self.es_c = ES[{"f32": "f32", "bf16": "bf16", "i8": "u8"}[desc.dtype]], ES[desc.c_dtype]
        self.es_b = ES[desc.dtype]
        self.fn = Function(f"brgemm_{desc.dtype}_{desc.m}x{desc.n}x{desc.k}",
                           ["ptr"] * len(desc.operands()) + ["i64"])
        self.a = self.fn.asm
        self.bf16_out = desc.c_dtype == "bf16"
        # registers the epilogue needs beside the accumulators: the bias row, relu's zero and two
        # bf16 scratch (CTile.finish); a transcendental activation stages the tile on the stack and
        # reuses them all (CTile.finish_tile), so it takes no more (8 more cut AVX2 tiles to 4 rows)
        epi = EPILOGUE_REGS if self.bf16_out or desc.bias or desc.act else 0
        self.plan = plan(desc, self.v, self.dot, epi, row_a=desc.lda * self.es_a)
        self.lanes = self.v.lanes(4)

    def and_(self, dst, x, y):
        (self.a.vpandd if self.v.avx512 else self.a.vpand)(dst, x, y)

    # -- registers ------------------------------------------------------------------------------
    def gprs(self):
        args = list(self.fn.args)
        names = [op.name for op in self.d.operands()] + ["count"]
        self.arg = dict(zip(names, args))
        free = [r for r in INT_ARGS + CALLEE_SAVED + [gpr(0), gpr(10), gpr(11)] if r not in args]
        free = sorted(set(free), key=lambda r: (r.num in (3, 5, 12, 13, 14, 15), r.num))
        # 15 usable; the offset kernel with a bias has 6 arguments and needs no "q"
        want = ["tmp", "crow", "arow", "rows", "batch", "a_k", "b_k", "k", "p", "q"]
        self.r = dict(zip(want, free))

    def vregs(self, rows, vecs):
        """Accumulators, then B, A, constant, scratch registers; the AVX2 mask register and the
        pace chain's (``pace_reg``) are the last ones."""
        v, dot = self.v, self.dot
        n = v.nregs - (1 if self.plan.tail and not v.avx512 else 0)
        self.pace_reg = None
        if self.d.pace:
            n -= 1
            self.pace_reg = v.reg(n)
        acc = [[v.reg(r * vecs + j) for j in range(vecs)] for r in range(rows)]
        rest = [v.reg(i) for i in range(rows * vecs, n)]
        b = [rest[j * dot.nb:(j + 1) * dot.nb] for j in range(vecs)]
        rest = rest[vecs * dot.nb:]
        a_regs, rest = rest[:dot.na], rest[dot.na:]
        self.const_regs, rest = rest[:len(dot.consts)], rest[len(dot.consts):]
        tmps = rest[:dot.tmps]
        free = [v.reg(i) for i in range(rows * vecs, n)]
        return acc, b, a_regs, tmps, free

    # -- the kernel -----------------------------------------------------------------------------
    def build(self):
        p = self.plan
        self.gprs()
        self.chunk = self.chunk_size()
        self.far_a, self.far_b = self.far_distances()
        self.near_b = self.near_distance()
        self.spread = self.spread_bytes()
        names = ("colB", "colC", "colN", "left", "first", "last") + (("farB",) if self.spread else ()) + ("stage",)
        self.slots = {name: 8 * i for i, name in enumerate(names)}
        self.slots["end"] = self.slots["stage"] + (self.v.nregs * self.v.bytes if desc_act_heavy(self.d) else 0)
        self.consts = _math().Consts(self.v)         # every vector constant, in the stack frame
        self.consts.BASE = (self.slots["end"] + 63) // 64 * 64
        self.mask = self.tail_mask(p.tail) if p.tail else None
        self.next_rows = self.streams_a() and self.d.prefetch
        self.stream_c = self.streams_c()
        if self.chunk:
            self.over_chunks(self.all_tiles)
        else:
            self.all_tiles()
        if self.stream_c:
            self.a.sfence()                 # the non-temporal stores are visible before we return
        self.fn.stack(self.slots["end"])
        if self.consts.table:
            self.consts.finish(self.fn)
        return self.fn.finalize()

    def lane_mask(self, lanes):
        """AVX2: memory holding all-ones in the first ``lanes`` dwords, zero in the others."""
        return self.consts.lanes([0xFFFFFFFF if i < lanes else 0 for i in range(8)])

    def tail_mask(self, lanes):
        """The Mask of a tile's first ``lanes`` fp32 lanes: opmask k1 on AVX-512; on AVX2 the last
        vector register, loaded here."""
        if self.v.avx512:
            return self.v.make_mask(self.fn, lanes, es=4, k=1)
        reg = self.v.reg(self.v.nregs - 1)
        self.a.vmovdqu(reg, self.lane_mask(lanes))
        return Mask(reg, lanes, 4)

    def all_tiles(self):
        if self.rows_outer():
            self.row_blocks()
        else:
            for block in self.column_blocks():
                self.column_block(*block)

    def chunk_size(self):
        """Batch blocks per chunk, 0 for none. Every tile sweeps its batch blocks, so when they
        overflow L2 each tile would fetch them from L3 again; in chunks that fit, all tiles take
        one chunk (C keeping the partial sums) before the next. Not with bf16 C (partial sums
        need fp32), nor where A streams (:meth:`streams_a`)."""
        return 0 if self.bf16_out or self.streams_a() else max(1, CHUNK_BYTES // self.block_bytes())

    def streams_a(self):
        """Whether A streams past a small B: one column block of tiles (each A row is read by one
        tile), several row tiles, an A block of ``STREAM_A_RATIO`` times the B block or more, and
        the B blocks of ``L2_COUNT`` batch blocks inside L2 (a flat 1x1 convolution: 448 pixels x
        64 channels against 64 x 64 weights). Such a kernel takes no chunks (they keep blocks in
        L2 for the next tile, and only B is read again) and each k loop prefetches the A lines of
        the next row tile into L2. Measured on Zen 4, 2 threads, fp32 ResNet-50 res2b_branch2a at
        batch 8 (448 x 64 x 64, 4 blocks), GFLOP/s: chunks of one block with their next-chunk
        prefetch (before) 150-164, no chunks 138-145, chunks and the next-tile prefetch 162-178,
        the next-tile prefetch alone 180-192; res3a_branch2a 154-161 -> 178-180."""
        d = self.d
        row_blocks, col_blocks = self.tile_blocks()
        b_block = d.k * d.n * self.es_b
        return (col_blocks == 1 and row_blocks > 1 and d.m * d.k * self.es_a >= STREAM_A_RATIO * b_block
                and b_block * L2_COUNT <= L2_BYTES)

    def tile_blocks(self):
        """(row blocks, column blocks) of tiles over C."""
        d, p = self.d, self.plan
        return -(-d.m // p.rows), -(-p.nvec // p.vecs)

    def block_bytes(self):
        """A and B bytes of one batch block."""
        d = self.d
        return d.m * d.k * self.es_a + d.k * d.n * self.es_b

    def over_chunks(self, body):
        """``body()`` once per chunk of ``chunk`` batch blocks (the last one shorter), with the
        count register holding the chunk's blocks, the batch operands advanced, and the stack
        flags ``first`` / ``last`` telling whether C starts from ``beta`` and gets the epilogue."""
        a, sl, arg, tmp = self.a, self.slots, self.arg, self.r["tmp"]
        count = arg["count"]
        a.mov([rsp + sl["left"]], count)
        a.mov(qword[rsp + sl["first"]], 1)
        loop, go, done = a.label(), a.label(), a.label()
        a.bind(loop)
        a.mov(qword[rsp + sl["last"]], 1)
        a.mov(count, [rsp + sl["left"]])
        a.cmp(count, self.chunk)
        a.jbe(go)
        a.mov(count, self.chunk)
        a.mov(qword[rsp + sl["last"]], 0)
        a.bind(go)
        self.start_spread(tmp)
        body()
        a.mov(qword[rsp + sl["first"]], 0)
        a.mov(tmp, [rsp + sl["left"]])
        a.sub(tmp, self.chunk)
        a.jbe(done)
        a.mov([rsp + sl["left"]], tmp)
        d, n = self.d, self.chunk
        if d.batch == "stride":
            self.add_imm(arg["a"], n * d.stride_a * self.es_a)
            self.add_imm(arg["b"], n * d.stride_b * self.es_b)
        elif d.batch == "offset":
            self.add_imm(arg["offsets"], n * 16)
        else:
            self.add_imm(arg["a_ptrs"], n * 8)
            self.add_imm(arg["b_ptrs"], n * 8)
        a.jmp(loop)
        a.bind(done)

    def column_blocks(self):
        """(first vector, vectors, repeats, last vector masked) for each run of column blocks:
        identical unmasked blocks of V vectors run as one loop, the remainder as one more block."""
        p = self.plan
        last = p.nvec - (1 if p.tail else 0)          # vectors before the masked one
        times = last // p.vecs if p.tail else p.nvec // p.vecs
        out = [(0, p.vecs, times, False)] if times else []
        rest = p.nvec - times * p.vecs
        if rest:
            out.append((times * p.vecs, rest, 1, bool(p.tail)))
        return out

    def row_blocks(self):
        """Row blocks outermost (A's rows stay in L1 while the column blocks sweep B), then the
        row tail."""
        self.a.mov(self.r["crow"], self.arg["c"])
        self.over_rows(self.column_sweep)

    def over_rows(self, block):
        """``block(rows)`` for each row block, A and C row pointers from row 0 (C's from its current
        value): one loop per run of :func:`row_runs`."""
        d, a, r = self.d, self.a, self.r
        runs = row_runs(d.m, self.plan.rows)
        a.xor(gpr(r["arow"].num, 32), gpr(r["arow"].num, 32))
        for i, (rows, times) in enumerate(runs):
            last = i == len(runs) - 1
            loop = a.label()
            if times > 1:
                a.mov(r["rows"], times)
            a.bind(loop)
            block(rows)
            if times > 1 or not last:
                self.add_imm(r["arow"], rows * d.lda * self.es_a)
                self.add_imm(r["crow"], rows * d.ldc * self.es_c)
            if times > 1:
                a.dec(r["rows"])
                a.jnz(loop)

    def over_columns(self, first, vecs, times, masked, body):
        """``body()`` for ``times`` column blocks of ``vecs`` vectors from vector ``first``; the
        column offsets of B and C live in stack slots (colB, colC), the count in colN."""
        a, sl = self.a, self.slots
        a.mov(qword[rsp + sl["colB"]], first * self.v.bytes)
        a.mov(qword[rsp + sl["colC"]], first * self.lanes * self.es_c)
        columns = a.label()
        if times > 1:
            a.mov(qword[rsp + sl["colN"]], times)
        a.bind(columns)
        self.masked_last = masked
        body()
        if times > 1:
            a.add(qword[rsp + sl["colB"]], vecs * self.v.bytes)
            a.add(qword[rsp + sl["colC"]], vecs * self.lanes * self.es_c)
            a.dec(qword[rsp + sl["colN"]])
            a.jnz(columns)

    def rows_outer(self):
        """Loop order. Rows outer keeps a row block's A panel in L1 while B streams through once
        per row block; columns outer keeps a column panel of B in L2 while A streams once per
        column block. Rows outer unless A and B of a chunk (else of ~16 batch blocks) overflow a
        512 KiB L2 and columns outer moves fewer bytes.

        Also rows outer for a shallow k (at most ``SHALLOW_K``) whose B block stays in L2
        (``SHALLOW_B_BYTES``): each C tile then takes few FMAs per store, so C's writes set the
        speed, and columns outer writes C in strips a row stride apart. Measured on Zen 4, 1
        thread, ms rows / columns outer: bf16 4096 x 4096 x 8 3.1 / 9.8 (fc's dw for 8 rows), x 32
        7.1 / 11.7, x 48 10.9 / 14.4, x 64 14.9 / 13.1; fp32 x 16 9.9 / 14.1, x 32 (a 512 KiB B)
        18.0 / 17.0; bf16 1024 x 1024 x 64 in 16 blocks 15.3 / 13.4."""
        d = self.d
        footprint = (d.m * d.k * self.es_a + d.k * d.n * self.es_b) * min(self.chunk or L2_COUNT, L2_COUNT)
        row_blocks, col_blocks = self.tile_blocks()
        shallow = d.k <= SHALLOW_K and d.k * d.n * self.es_b <= SHALLOW_B_BYTES
        return (shallow or footprint <= L2_BYTES
                or d.n * self.es_b * row_blocks <= d.m * self.es_a * col_blocks)

    def column_block(self, first, vecs, times, masked):
        """Columns outer: a loop over ``times`` column blocks, each sweeping all row blocks."""
        a, r, sl = self.a, self.r, self.slots

        def column():
            a.mov(r["crow"], self.arg["c"])
            a.add(r["crow"], [rsp + sl["colC"]])
            self.over_rows(lambda rows: self.tile(rows, vecs))
        self.over_columns(first, vecs, times, masked, column)

    def column_sweep(self, rows):
        """All column blocks of one row block."""
        a, r, sl = self.a, self.r, self.slots
        for first, vecs, times, masked in self.column_blocks():
            def column():
                a.add(r["crow"], [rsp + sl["colC"]])
                self.tile(rows, vecs)
                a.sub(r["crow"], [rsp + sl["colC"]])
            self.over_columns(first, vecs, times, masked, column)

    def add_imm(self, reg, value):
        add_imm(self.a, reg, value, self.r["tmp"])

    def tile(self, rows, vecs):
        d, a, dot = self.d, self.a, self.dot
        acc, b, a_regs, tmps, free = self.vregs(rows, vecs)
        masked = [self.mask if self.masked_last and j == vecs - 1 else None for j in range(vecs)]
        if d.beta:
            self.init_c(rows, vecs, acc, masked, free, load=True)
        elif self.chunk:                            # later chunks continue from C
            a.cmp(qword[rsp + self.slots["first"]], 0)
            if_else(a, a.je, lambda: self.init_c(rows, vecs, acc, masked, free, load=True),
                    lambda: self.init_c(rows, vecs, acc, masked, free, load=False))
        else:
            self.init_c(rows, vecs, acc, masked, free, load=False)
        for reg, value in zip(self.const_regs, dot.consts):
            self.consts.load(a, reg, self.consts.i(value))
        self.batch_loop(rows, vecs, acc, b, a_regs, tmps, masked)
        self.epilogue(rows, vecs, acc, masked, free)

    # -- batch and k loops ----------------------------------------------------------------------
    def batch_loop(self, rows, vecs, acc, b, a_regs, tmps, masked):
        d, a, r = self.d, self.a, self.r
        col = [rsp + self.slots["colB"]]
        arg = self.arg
        if d.batch == "stride":
            a.mov(r["p"], arg["a"])
            a.mov(r["q"], arg["b"])
        elif d.batch == "offset":
            a.mov(r["p"], arg["offsets"])
        else:
            a.mov(r["p"], arg["a_ptrs"])
            a.mov(r["q"], arg["b_ptrs"])
        a.mov(r["batch"], arg["count"])
        loop = a.label()
        a.bind(loop)
        if d.batch == "stride":
            a.lea(r["a_k"], [r["p"] + r["arow"]])
        elif d.batch == "offset":
            a.mov(r["tmp"], [r["p"]])
            a.lea(r["a_k"], [arg["a"] + r["tmp"] * self.es_a])
            a.add(r["a_k"], r["arow"])
        else:
            a.mov(r["a_k"], [r["p"]])
            a.add(r["a_k"], r["arow"])
        if d.batch == "stride":
            a.mov(r["b_k"], r["q"])
        elif d.batch == "offset":
            a.mov(r["tmp"], [r["p"] + 8])
            a.lea(r["b_k"], [arg["b"] + r["tmp"] * self.es_b])
        else:
            a.mov(r["b_k"], [r["q"]])
        a.add(r["b_k"], col)
        self.k_loop(rows, vecs, acc, b, a_regs, tmps, masked)
        next_batch(a, d, r["p"], r.get("q"), self.es_a, self.es_b, r["tmp"])   # no q for offsets
        a.dec(r["batch"])
        a.jnz(loop)

    def k_loop(self, rows, vecs, acc, b, a_regs, tmps, masked):
        d = self.d
        groups, part = divmod(d.k, d.vnni)               # full groups; k values in the last one
        row_a, row_b = d.lda * self.es_a, d.ldb * 4
        step = 4                                          # A bytes per group: 4 in every dtype
        args = (rows, vecs, acc, b, a_regs, tmps, masked, row_a)
        if part:                                        # after the full groups, wherever they end
            tail = lambda u, first=False: self.group(u * step, u * row_b, *args, part=part, first=first)  # noqa: E731
        else:
            tail = lambda u, first=False: None  # noqa: E731
        if self.unrolled_whole(groups, rows, vecs):
            for u in range(groups):
                self.group(u * step, u * row_b, *args, first=u == 0)
            tail(groups, first=groups == 0)
            return
        if self.dot.halves:                             # the block's first group, split differently
            self.group(0, 0, *args, first=True)
            self.advance(1, step, row_b)
            groups -= 1
        unroll, iters = self.unroll(rows, vecs), self.k_iterations(rows, vecs)
        rem = groups - iters * unroll
        if iters:
            self.k_steps(unroll, iters, step, row_b, args)
        if rem > 1:                                     # a loop of one group: JIT time and code size
            self.k_steps(1, rem, step, row_b, args)
            rem = 0
        for u in range(rem):
            self.group(u * step, u * row_b, *args)
        tail(rem)

    def k_steps(self, unroll, iters, step, row_b, args):
        """A loop of ``iters`` (>= 1) iterations of ``unroll`` k groups, advancing the k pointers."""
        a, r = self.a, self.r
        loop = a.label()
        a.mov(r["k"], iters)
        a.bind(loop)
        if unroll > 1:
            self.iteration_prefetches(args[0], args[-1])
        for u in range(unroll):
            self.group(u * step, u * row_b, *args)
        self.advance(unroll, step, row_b)
        a.dec(r["k"])
        a.jnz(loop)

    def advance(self, groups, step, row_b):
        self.a.add(self.r["a_k"], groups * step)
        self.add_imm(self.r["b_k"], groups * row_b)

    def load_partial(self, expr, nbytes):
        """The first ``nbytes`` (1..3) of the group at ``expr``, zero-extended, in a 32-bit GPR."""
        a, out = self.a, gpr(self.r["k"].num, 32)      # the k counter is free after the k loop
        if nbytes == 1:
            a.movzx(out, byte[expr])
        else:
            a.movzx(out, word[expr])
        if nbytes == 3:
            a.movzx(gpr(self.r["tmp"].num, 32), byte[expr + 2])
            a.shl(gpr(self.r["tmp"].num, 32), 16)
            a.or_(out, gpr(self.r["tmp"].num, 32))
        return out

    def broadcast(self, reg, src):
        """reg = the dword at memory ``src``, or in 32-bit GPR ``src``, in every lane."""
        if isinstance(src, Register):
            if self.v.avx512:
                self.a.vpbroadcastd(reg, src)
            else:
                self.a.vmovd(vec(128, reg.num), src)
                self.a.vpbroadcastd(reg, vec(128, reg.num))
        else:       # the bits of vpbroadcastd, which Zen 3 splits into a load and a shuffle:
            self.a.vbroadcastss(reg, dword[src])   # int8 BRGEMM 0.63 -> 0.77 of the int8 peak

    def keep(self, reg, bits):
        """Clear all but ``bits`` of every dword of ``reg`` (None: keep everything)."""
        if bits is not None:
            self.and_(reg, reg, self.consts.i(bits))

    def unroll(self, rows, vecs):
        """k groups per loop iteration: up to UNROLL, fewer for long group bodies (JIT time)."""
        return max(2, min(UNROLL, UNROLL_INSTRUCTIONS // self.group_size(rows, vecs)))

    def k_iterations(self, rows, vecs):
        """Iterations of the k loop of several groups (:meth:`k_steps`) per batch block of a rows
        x vecs tile (0: k unrolled whole)."""
        groups = self.d.k // self.d.vnni
        if self.unrolled_whole(groups, rows, vecs):
            return 0
        return (groups - (1 if self.dot.halves else 0)) // self.unroll(rows, vecs)

    def unrolled_whole(self, groups, rows, vecs):
        """Whether a k of ``groups`` groups is unrolled whole (no loop) in a rows x vecs tile."""
        return groups <= UNROLL_ALL and groups * self.group_size(rows, vecs) <= 2 * UNROLL_INSTRUCTIONS

    def group_size(self, rows, vecs):
        """Instructions per k group of a rows x vecs tile."""
        dot = self.dot
        return vecs * (1 + dot.b_ops) + rows * (1 + dot.a_ops) + rows * vecs * dot.ops + self.d.pace

    def group(self, a_off, b_off, rows, vecs, acc, b, a_regs, tmps, masked, row_a, part=0, first=False):
        """One k group; ``part`` > 0: only its first ``part`` k values exist (A is read up to
        there, B's padding lanes are cleared for bf16, where 0 * inf would not vanish);
        ``first``: the first group of a batch block (nothing of the operand lies before it)."""
        g, dot, r = self, self.dot, self.r
        if not part:
            self.group_prefetches(r["b_k"] + b_off, vecs * self.v.bytes)
        self.pace()
        if dot.halves:
            self.group_halves(a_off, b_off, rows, vecs, acc, b, a_regs, masked, row_a, part, first)
            return
        keep = (1 << 8 * part * ES[self.d.dtype]) - 1 if part and self.d.dtype == "bf16" else None
        for j in range(vecs):
            dot.load_b(g, b[j], [r["b_k"] + b_off + j * self.v.bytes], masked[j], keep)
        for i in range(rows):
            src = r["a_k"] + i * row_a + a_off
            if part:
                src = self.load_partial(src, part * self.es_a)
            dot.load_a(g, a_regs, src)
            for j in range(vecs):
                dot.acc(g, acc[i][j], b[j], a_regs, tmps, self.const_regs)

    def pace(self):
        """``pace`` dependent single-cycle additions on a register nothing reads: the k loop, and so
        the loads of B, cannot run ahead faster than one group per ``pace`` cycles (see the
        ``pace`` hint in :mod:`tppasm.brgemm`)."""
        reg = self.pace_reg
        for _ in range(self.d.pace):
            self.a.vpaddd(reg, reg, reg)

    def group_halves(self, a_off, b_off, rows, vecs, acc, b, a_regs, masked, row_a, part, first):
        """A bf16 group as its even k step, then (unless ``part``) its odd one: fp32 FMAs each."""
        dot, r = self.dot, self.r
        for half in range(1 if part else 2):
            for j in range(vecs):
                dot.load_b_half(self, b[j][0], r["b_k"] + b_off + j * self.v.bytes, masked[j], half, first)
            for i in range(rows):
                src = r["a_k"] + i * row_a + a_off
                if part and first:
                    src = self.load_partial(src, part * self.es_a)
                dot.load_a_half(self, a_regs[0], src, half, first)
                for j in range(vecs):
                    self.a.vfmadd231ps(acc[i][j], b[j][0], a_regs[0])


def tile_kernel(dtype, isa):
    """Whether ``isa``'s BRGEMM of ``dtype`` is an AMX tile kernel (bf16 and int8 on AMX; fp32 there
    is an AVX-512 kernel).

    >>> tile_kernel("bf16", "amx"), tile_kernel("f32", "amx"), tile_kernel("i8", "avx512")
    (True, False, False)
    """
    return isa == "amx" and dtype in ("bf16", "i8")


@register("x86", "brgemm")
def generate(desc, isa):
    layout = getattr(desc, "layout", "vnni")       # MmlaBrgemm (tppasm.sve.brgemm) reads B in its own layout
    if layout != "vnni":
        raise ValueError(f"brgemm: layout={layout!r} is SVE only; on {isa} use Brgemm with B in the VNNI "
                         "layout (tppasm.vnni_pack(b))")
    # tile kernels for bf16 and int8 (any k: a partial last group is padded inside); fp32 on AVX-512
    if tile_kernel(desc.dtype, isa):
        from .amx import generate as generate_amx
        return generate_amx(desc)
    return generate_brgemm(desc, isa)


def generate_brgemm(desc, isa, features=None):
    """The raw BRGEMM kernel for ``desc`` on ``isa``; ``features`` overrides the target's."""
    if isa == "amx":
        isa = "avx512"
    return Gen(desc, isa, target_features(isa) if features is None else frozenset(features)).build()

