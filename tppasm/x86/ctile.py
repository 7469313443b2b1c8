"""The C side of the x86 BRGEMM kernels (a mixin of :class:`tppasm.x86.brgemm.Gen`): a register
tile's starting value (zero or C) and its epilogue (bias, activation, bf16 rounding, store), and
the activation emitters the epilogues share with the AMX kernels.

>>> activation_tmps("gelu") > activation_tmps("relu") == 1
True
"""
from isa.x86 import K, gpr, qword, rsp, word


def _math():
    from . import math
    return math


# activation -> emitter in tppasm.x86.math (``emit_<name>(a, v, dst, src, tmp, consts)``);
# gelu is the tanh form, as in the NumPy reference
ACT_EMITTERS = {"gelu": "gelu_tanh", "gelu_erf": "gelu_erf", "gelu_erf_fast": "gelu_erf_fast", "sigmoid": "sigmoid",
                "tanh": "tanh"}
# a bf16 C is rounded to 2^-9 right after: these take a cheaper form accurate to 2^-16 (math.ACCURACY_BF16)
BF16_EMITTERS = {"gelu_erf": "gelu_erf_bf16"}
CHAINS = {True: 4, False: 2}    # vectors whose activations are interleaved (AVX-512, AVX2: registers)


def activation_emitter(act, bf16_out=False):
    """The emitter's name in tppasm.x86.math for ``act`` on a C of fp32 or (``bf16_out``) bf16."""
    return BF16_EMITTERS.get(act, ACT_EMITTERS[act]) if bf16_out else ACT_EMITTERS[act]


def emit_activation(act, a, v, dst, src, tmp, consts, bf16_out=False):
    """dst = act(src) with the emitter for a C of fp32 or (``bf16_out``) bf16."""
    getattr(_math(), "emit_" + activation_emitter(act, bf16_out))(a, v, dst, src, tmp, consts)


def desc_act_heavy(desc):
    return desc.act in ACT_EMITTERS


def activation_tmps(act):
    """Scratch registers of the activation, its destination included."""
    return 1 + _math().NTMP[ACT_EMITTERS[act]] if act in ACT_EMITTERS else 1


def if_else(a, jump, taken, fallthrough):
    """Emit the two arms of ``jump(label)`` (a conditional jump of assembler ``a``): ``taken()``
    runs where it jumps, ``fallthrough()`` where it does not; both continue after."""
    other, done = a.label(), a.label()
    jump(other)
    fallthrough()
    a.jmp(done)
    a.bind(other)
    taken()
    a.bind(done)


class CTile:
    """Methods of :class:`tppasm.x86.brgemm.Gen` that read and write C."""

    def init_c(self, rows, vecs, acc, masked, free, load):
        """Accumulators = the C tile (``load``) or zero."""
        a = self.a
        for i in range(rows):
            for j in range(vecs):
                if load:
                    self.load_c(acc[i][j], self.c_mem(i, j), masked[j], free)
                elif self.v.avx512 and acc[i][j].num >= 16:
                    a.vpxord(acc[i][j], acc[i][j], acc[i][j])
                else:
                    a.vxorps(acc[i][j], acc[i][j], acc[i][j])

    def c_mem(self, i, j):
        return self.r["crow"] + i * self.d.ldc * self.es_c + j * self.lanes * self.es_c

    def load_c(self, reg, expr, mask, free):
        a, v = self.a, self.v
        if not self.bf16_out:
            v.load(a, reg, [expr], mask)
            return
        half = v.half(reg.num)
        if v.avx512:
            if mask is None:
                a.vmovdqu16(half, [expr])
            else:
                a.vmovdqu16(half.mask(mask.reg, zero=True), [expr])
        elif mask is None:
            a.vmovdqu(half, [expr])
        else:
            self.bf16_tail(mask.count, expr, half, v.half(free[0].num), load=True)
        a.vpmovzxwd(reg, half)
        a.vpslld(reg, reg, 16)

    def epilogue(self, rows, vecs, acc, masked, free):
        """Store the tile: with the epilogue (and ``stream_c``) after the last chunk, as plain
        partial sums before."""
        d, a = self.d, self.a
        if not (self.chunk and (d.bias or d.act or self.stream_c)):
            self.finish_tile(rows, vecs, acc, masked, free)
            return

        def partial_sums():
            for j in range(vecs):
                for i in range(rows):
                    self.v.store(a, [self.c_mem(i, j)], acc[i][j], masked[j])
        a.cmp(qword[rsp + self.slots["last"]], 0)
        if_else(a, a.jne, lambda: self.finish_tile(rows, vecs, acc, masked, free), partial_sums)

    def finish_tile(self, rows, vecs, acc, masked, free):
        """bias, activation, conversion and store. Free registers: [bias, zero | activation
        scratch..., and bf16 scratch after them]. With a transcendental activation the tile goes
        to the stack first and a loop over its rows finishes it (one copy of the long sequence per
        vector instead of per accumulator: JIT time and code size), the row's vectors interleaved
        (:func:`tppasm.x86.math.interleave`: each activation is one long dependency chain)."""
        d, a, v, r = self.d, self.a, self.v, self.r
        zero = free[1]           # free[0] holds the bias row
        if d.act == "relu":
            a.vpxord(zero, zero, zero) if v.avx512 else a.vpxor(zero, zero, zero)
        if d.bias:
            a.mov(r["tmp"], self.arg["bias"])
            a.add(r["tmp"], [rsp + self.slots["colB"]])
        if d.act in ACT_EMITTERS:
            stage = self.slots["stage"]
            for i in range(rows):
                for j in range(vecs):
                    a.vmovups([rsp + stage + (i * vecs + j) * v.bytes], acc[i][j])
            c_row, s_row, count = r["a_k"], r["b_k"], r["k"]
            a.mov(c_row, r["crow"])
            a.lea(s_row, [rsp + stage])
            a.mov(count, rows)
            regs, consts = self.hold_lane_tables([reg for row in acc for reg in row] + free)
            loop = a.label()
            a.bind(loop)
            per = 1 + activation_tmps(d.act)            # x, then the activation's dst and scratch
            chains = min(CHAINS[v.avx512], len(regs) // per)
            plain = [j for j in range(vecs) if masked[j] is None]
            for group in [plain[i:i + chains] for i in range(0, len(plain), chains)] + \
                    [[j] for j in range(vecs) if masked[j] is not None]:   # AVX2 bf16 tails use a GPR
                jobs = [lambda a, c, j=j, own=regs[i * per:(i + 1) * per]:
                        self.act_vector(a, c, own, j, masked[j], s_row, c_row) for i, j in enumerate(group)]
                _math().interleave(a, consts, jobs)
            self.add_imm(c_row, d.ldc * self.es_c)
            a.add(s_row, vecs * v.bytes)
            a.dec(count)
            a.jnz(loop)
            return
        if not self.stream_c:
            self.store_tile(rows, vecs, acc, masked, free, nt=False)
            return
        a.test(r["crow"], self.store_bytes() - 1)  # non-temporal stores need aligned addresses
        if_else(a, a.jnz, lambda: self.store_tile(rows, vecs, acc, masked, free, nt=False),
                lambda: self.store_tile(rows, vecs, acc, masked, free, nt=True))

    def hold_lane_tables(self, regs):
        """(registers left, constants): the activation's lane tables (gelu_erf_fast's) loaded into
        the last of ``regs`` for the loop over the staged rows, when at least two chains of the
        activation still fit beside them (each vector would read them from the stack otherwise)."""
        tables = _math().lane_tables(activation_emitter(self.d.act, self.bf16_out), self.v)
        keep = len(regs) - len(tables)
        if not tables or keep // (1 + activation_tmps(self.d.act)) < 2:
            return regs, self.consts
        for values, reg in zip(tables, regs[keep:]):
            self.a.vmovups(reg, self.consts.lanes(values))
        return regs[:keep], self.consts.with_lanes(dict(zip(tables, regs[keep:])))

    def store_tile(self, rows, vecs, acc, masked, free, nt):
        for j in range(vecs):
            for i in range(rows):
                self.finish(acc[i][j], j, masked[j], self.c_mem(i, j), free, nt)

    def store_bytes(self):
        """Bytes of one full vector of C as stored (the alignment a non-temporal store needs)."""
        return self.v.bytes // 2 if self.bf16_out else self.v.bytes

    def streams_c(self):
        """Whether this kernel follows ``stream_c`` (in batch chunks: the last chunk's stores): no
        transcendental activation (its staged rows store through :meth:`act_vector`), rows ``ldc``
        apart that keep a tile's alignment; each tile still checks its own address at run time."""
        d = self.d
        return d.stream_c and d.act not in ACT_EMITTERS and d.ldc * self.es_c % self.store_bytes() == 0

    def act_vector(self, a, consts, regs, j, mask, s_row, c_row):
        """Vector j of a staged row: + bias, transcendental activation, store. ``regs``: x, the
        activation's result and its scratch (all this vector's own; ``a`` may be a recorder)."""
        d, v = self.d, self.v
        x, dst, scratch = regs[0], regs[1], regs[2:]
        a.vmovups(x, [s_row + j * v.bytes])
        if d.bias:
            mem = [self.r["tmp"] + j * v.bytes]
            if mask is None:
                a.vaddps(x, x, mem)
            else:
                v.load(a, dst, mem, mask)
                a.vaddps(x, x, dst)
        emit_activation(d.act, a, v, dst, x, scratch, consts, self.bf16_out)
        expr = c_row + j * self.lanes * self.es_c
        if self.bf16_out:
            self.store_bf16(expr, dst, mask, scratch[:2], a=a, k=consts.k)
        else:
            v.store(a, [expr], dst, mask)

    def finish(self, c, j, mask, expr, free, nt=False):
        """One vector of C: + bias (column vector j), relu, store at ``expr`` (``nt``: a full vector
        non-temporally, ``expr`` aligned); ``c`` dies. ``free``: [bias, zero (relu), bf16
        scratch..., ...], none of them ``c`` (transcendental activations take :meth:`act_vector`)."""
        d, a, v = self.d, self.a, self.v
        scratch = [reg for reg in free[2:] if reg != c]
        if d.bias:
            mem = [self.r["tmp"] + j * v.bytes]
            if mask is None:
                a.vaddps(c, c, mem)
            else:
                v.load(a, free[0], mem, mask)
                a.vaddps(c, c, free[0])
        if d.act == "relu":                 # zero first: vmaxps returns a NaN c (its second source)
            (a.vpmaxsd if d.dtype == "i8" else a.vmaxps)(c, free[1], c)
        if self.bf16_out:
            self.store_bf16(expr, c, mask, scratch[:2], nt=nt)
        elif nt and mask is None:
            a.vmovntps([expr], c)
        else:
            v.store(a, [expr], c, mask)

    def store_bf16(self, expr, c, mask, t, a=None, k=K[2], nt=False):
        """Round fp32 ``c`` to bf16 (nearest even; NaN stays a quiet NaN) and store (``nt``: a full
        vector non-temporally); ``c`` dies. ``k``: the opmask clobbered on AVX-512 without BF16."""
        a, v, splat = a or self.a, self.v, self.consts.i
        t0, t3 = t
        if v.avx512 and "avx512_bf16" in self.features:
            out = v.half(c.num)
            a.vcvtneps2bf16(out, c)
        else:
            a.vpsrld(t0, c, 16)                             # t0 = c + 0x7FFF + lsb(c >> 16), >> 16
            (a.vpandd if v.avx512 else a.vpand)(t0, t0, splat(1))
            a.vpaddd(t0, t0, c)
            a.vpaddd(t0, t0, splat(0x7FFF))
            a.vpsrld(t0, t0, 16)
            if v.avx512:                                    # NaN lanes: (c >> 16) | quiet bit
                a.vcmpps(k, c, c, 3)
                a.vpsrld(t0.mask(k), c, 16)
                a.vpord(t0.mask(k), t0, splat(0x40))
                a.vpmovdw(v.half(t0.num), t0)
            else:
                a.vcmpps(t3, c, c, 3)
                a.vpsrld(c, c, 16)
                a.vpor(c, c, splat(0x40))
                a.vblendvps(t0, t0, c, t3)
                a.vpackusdw(t0, t0, t0)                     # words within each 128-bit lane
                a.vpermq(t0, t0, 0x08)
            out = v.half(t0.num)
        if nt and mask is None:
            a.vmovntdq([expr], out)
        elif v.avx512:
            a.vmovdqu16([expr] if mask is None else _masked(expr, mask.reg), out)
        elif mask is None:
            a.vmovdqu([expr], out)
        else:
            self.bf16_tail(mask.count, expr, out, v.half(t3.num), load=False, a=a)

    def bf16_tail(self, count, expr, x, t, load, a=None):
        """AVX2: the first ``count`` (< 8) words of xmm ``x`` from/to memory: word pairs under a
        dword mask, the odd last word through a GPR. ``t`` is scratch."""
        a, pairs = a or self.a, count // 2
        scratch = self.r["p"].num                # the batch pointer is dead outside the batch loop
        if load:
            a.vpxor(x, x, x)
        if pairs:
            a.vmovdqu(t, self.lane_mask(pairs))
            if load:
                a.vmaskmovps(x, t, [expr])
            else:
                a.vmaskmovps([expr], t, x)
        if count % 2:
            last = expr + 2 * (count - 1)
            if load:
                a.movzx(gpr(scratch, 32), word[last])
                a.vmovd(t, gpr(scratch, 32))
                a.vpslldq(t, t, 2 * (count - 1))
                a.vpor(x, x, t)
            else:
                a.vpsrldq(t, x, 2 * (count - 1))
                a.vmovd(gpr(scratch, 32), t)
                a.mov(word[last], gpr(scratch, 16))


def _masked(expr, k):
    from isa.x86 import ptr
    return ptr(expr).mask(k)
