"""AArch64 code generation of the per-thread nest: ``void nest(void *ctx, int64 tid, int64 nthreads)``.

Same context block (:class:`loops.nest_plan.Layout`), same traced program and same semantics as the
x86-64 generator; the walk over the spec is shared (:class:`loops.nest_plan.NestWalk`). AAPCS64:
x19 holds ``ctx``, x20 the thread id, x21 the thread count; every loop value lives in a stack
slot, so kernels (called with ``blr`` through the ctx's table) may clobber x0-x18 and all vector
registers. The dynamic schedule takes tickets with ``ldaddal`` (ARMv8.1 LSE atomics).

On an AArch64 host :mod:`loops.decorator` maps this nest executable (:func:`build`) and runs it
on the native pool (:mod:`isa.pool`, machine code from :mod:`isa.aarch64.pool_code`): collapsed
parallel and grid specs run on every thread, and barriers call the pool's barrier. On x86 hosts
:func:`build_aarch64` returns the code bytes for the emulator tests
(``tests/aarch64/test_nest_aarch64.py``, ``tests/aarch64/test_pool_aarch64.py``).

>>> from loops.spec import Loop, parse
>>> from loops.program import Node
>>> from loops.nest_plan import Layout
>>> code = build_aarch64(parse("A", 1), (Loop(0, 4),), Node(), Node(), Node(),
...                      Layout(nargs=1, nkernels=0, nloops=1), [4], [])
>>> len(code) % 4, len(code) > 100
(0, True)
"""
from isa.aarch64 import Function, mem, sp, x, xzr

from ..nest_plan import AXIS_SLOT, Layout, NestWalk

CTX, TID, NT = x[19], x[20], x[21]
T0, T1, T2, T3, T4 = x[9], x[10], x[11], x[12], x[13]
CALLEE = x[16]
BRANCH_IF_FALSE = {"==": "b_ne", "!=": "b_eq", "<": "b_ge", "<=": "b_gt", ">": "b_le", ">=": "b_lt"}


class _Gen(NestWalk):
    def __init__(self, spec, layout, itemsizes, kernel_index):
        super().__init__(spec, layout, itemsizes, kernel_index)
        self.fn = Function(nargs=3)
        self.a = self.fn.asm

    # -- helpers ------------------------------------------------------------------------------
    def load(self, reg, src):
        """reg = an int, ``("ctx", off)``, ``("slot", name)``, a slot name or the thread id."""
        if isinstance(src, int):
            self.a.mov_imm(reg, src)
        elif isinstance(src, tuple) and src[0] == "ctx":
            self.a.ldr(reg, mem(CTX, src[1]))
        else:
            name = src[1] if isinstance(src, tuple) else src
            if name == "tid":
                self.a.mov(reg, TID)
            else:
                self.a.ldr(reg, mem(sp, self.slot_offset(name)))

    def store(self, reg, name):
        self.a.str(reg, mem(sp, self.slot_offset(name)))

    def set(self, name, value):
        self.load(T4, value)
        self.store(T4, name)

    def add_imm(self, dst, src, value):
        """dst = src + value (uses T4 when value is not a 12-bit immediate)."""
        if 0 <= value < 4096:
            self.a.add(dst, src, value)
        else:
            self.a.mov_imm(T4, value)
            self.a.add(dst, src, T4)

    def madd_const(self, dst, src_name, factor):
        """dst += factor * slot (uses T3, T4)."""
        self.load(T3, src_name)
        if factor == 1:
            self.a.add(dst, dst, T3)
        else:
            self.a.mov_imm(T4, self.imm64(factor, f"a factor of {src_name}"))
            self.a.madd(dst, T3, T4, dst)

    def affine(self, reg, expr, scale=1):
        """reg = scale * expr."""
        self.a.mov_imm(reg, self.imm64(expr.const * scale, repr(expr)))
        for v, c in expr.terms:
            self.madd_const(reg, self.var_slot(v), c * scale)

    def barrier(self):
        if self.spec.mode == "serial":
            return
        a, skip = self.a, self.a.label()
        a.ldr(CALLEE, mem(CTX, Layout.BARRIER_FN))
        a.cbz(CALLEE, skip)                   # no pool (one thread): nothing to wait for
        a.ldr(x[0], mem(CTX, Layout.BARRIER_STATE))
        a.mov(x[1], TID)
        a.blr(CALLEE)
        a.bind(skip)

    def trip(self, reg, n):
        """reg = max(0, ceil((hi - lo) / st)) of level n (uses T1-T3)."""
        a = self.a
        self.load(reg, "hi" + n)
        self.load(T1, "lo" + n)
        a.sub(reg, reg, T1)
        self.load(T2, "st" + n)
        a.add(T3, reg, T2)
        a.sub(T3, T3, 1)
        a.udiv(T3, T3, T2)
        a.cmp(reg, 0)
        a.csel(reg, T3, xzr, "gt")

    def level_range(self, i):
        a, n = self.a, self.spec.levels[i].name
        lo, hi, clamp, step = self.level_sources(i)
        self.load(T0, lo)
        self.store(T0, "lo" + n)
        if clamp is None:
            self.load(T0, hi)
        else:
            self.load(T1, hi)
            a.add(T0, T0, T1)
            self.load(T1, clamp)
            a.cmp(T0, T1)
            a.csel(T0, T0, T1, "lt")
        self.store(T0, "hi" + n)
        self.set("st" + n, step)

    def count_loop(self, q, qe, body):
        """for slot q in [q, qe): body() (q is incremented in its slot)."""
        a = self.a
        top, end = a.label(), a.label()
        a.bind(top)
        self.load(T0, q)
        self.load(T1, qe)
        a.cmp(T0, T1)
        a.b_ge(end)
        body()
        self.load(T0, q)
        a.add(T0, T0, 1)
        self.store(T0, q)
        a.b(top)
        a.bind(end)

    def index_of(self, reg, n):
        """slot x<n> = reg * st + lo (uses T3, T4)."""
        self.load(T3, "st" + n)
        self.load(T4, "lo" + n)
        self.a.madd(T3, reg, T3, T4)
        self.store(T3, "x" + n)

    # -- the nest -----------------------------------------------------------------------------
    def build(self, body, init, fini):
        a, spec = self.a, self.spec
        a.mov(CTX, x[0])
        a.mov(TID, x[1])
        a.mov(NT, x[2])
        for v in ("idle", "row", "col", "layer"):
            self.store(xzr, v)
        if spec.mode == "grid":
            self.grid_coordinates()
        if spec.schedule[0] == "dynamic":
            self.store(xzr, "held")          # ticket + 1 kept for a later instance of the run; 0: none
            self.store(xzr, "base")
        self.unless_idle(lambda: self.tree(init))
        self.levels(0, body)
        self.unless_idle(lambda: self.tree(fini))
        self.fn.frame = (self.frame_size + 15) & ~15
        self.fn.ret()
        return self.fn.code()

    def unless_idle(self, emit):
        skip = self.a.label()
        self.load(T0, "idle")
        self.a.cbnz(T0, skip)
        emit()
        self.a.bind(skip)

    def grid_coordinates(self):
        a = self.a
        rows, cols, layers = self.spec.grid
        inside, done = a.label(), a.label()
        a.mov_imm(T0, rows * cols * layers)
        a.cmp(TID, T0)
        a.b_lt(inside)
        self.set("idle", 1)
        self.set("row", rows)                 # beyond every team: the thread's team loops are empty
        self.set("col", cols)
        self.set("layer", layers)
        a.b(done)
        a.bind(inside)
        a.mov_imm(T1, rows * cols)
        a.udiv(T0, TID, T1)
        self.store(T0, "layer")
        a.msub(T0, T0, T1, TID)               # tid % (rows * cols)
        a.mov_imm(T1, cols)
        a.udiv(T2, T0, T1)
        self.store(T2, "row")
        a.msub(T0, T2, T1, T0)
        self.store(T0, "col")
        a.bind(done)

    def serial(self, i, body):
        a, n = self.a, self.spec.levels[i].name
        top, end = a.label(), a.label()
        self.level_range(i)
        self.load(T0, "lo" + n)
        self.store(T0, "x" + n)
        a.bind(top)
        self.load(T0, "x" + n)
        self.load(T1, "hi" + n)
        a.cmp(T0, T1)
        a.b_ge(end)
        self.levels(i + 1, body)
        self.load(T0, "x" + n)
        self.load(T1, "st" + n)
        a.add(T0, T0, T1)
        self.store(T0, "x" + n)
        a.b(top)
        a.bind(end)

    def team(self, i, body):
        """A grid-axis loop: see :func:`loops.nest_plan.team_share`."""
        a, lv = self.a, self.spec.levels[i]
        n = lv.name
        self.level_range(i)
        self.trip(T0, n)
        self.store(T0, "n" + n)
        self.add_imm(T1, T0, lv.teams - 1)
        a.mov_imm(T2, lv.teams)
        a.udiv(T1, T1, T2)                    # chunk
        self.load(T2, AXIS_SLOT[lv.axis])
        a.mul(T2, T2, T1)
        self.store(T2, "q" + n)
        a.add(T2, T2, T1)
        a.cmp(T2, T0)
        a.csel(T2, T2, T0, "lt")
        self.store(T2, "qe" + n)

        def iteration():
            self.index_of(T0, n)
            self.levels(i + 1, body)
        self.count_loop("q" + n, "qe" + n, iteration)

    def collapse(self, first, last, body):
        """The collapsed parallel run: iterations 0..N-1 of the product space, split by the schedule."""
        a, spec = self.a, self.spec
        names = [spec.levels[i].name for i in range(first, last + 1)]
        for i, n in zip(range(first, last + 1), names):
            self.level_range(i)
            self.trip(T0, n)
            self.store(T0, "n" + n)
        self.load(T0, "n" + names[0])
        for n in names[1:]:
            self.load(T1, "n" + n)
            a.mul(T0, T0, T1)
        self.store(T0, "N")
        kind, chunk = spec.schedule
        next_chunk, end = a.label(), a.label()
        if kind == "static" and not chunk:
            self.store(xzr, "done")
        elif kind == "static":
            self.store(TID, "c")
        else:
            chunk = chunk or 1
            self.add_imm(T0, T0, chunk - 1)
            a.mov_imm(T1, chunk)
            a.udiv(T0, T0, T1)
            self.store(T0, "nch")
        a.bind(next_chunk)
        getattr(self, f"_{kind}_chunk" if kind == "dynamic" or chunk else "_static_share")(chunk, end)

        def iteration():
            for n in reversed(names[1:]):     # mixed-radix digits, innermost first
                self.load(T1, "n" + n)
                a.udiv(T2, T0, T1)
                a.msub(T1, T2, T1, T0)
                self.index_of(T1, n)
                a.mov(T0, T2)
            self.index_of(T0, names[0])
            self.levels(last + 1, body)
        self.count_loop("q", "qe", iteration)
        a.b(next_chunk)
        a.bind(end)

    def _static_share(self, chunk, end):
        """OpenMP's static split, once: see :func:`loops.nest_plan.static_share`."""
        a = self.a
        self.load(T0, "done")
        a.cbnz(T0, end)
        self.set("done", 1)
        self.load(T0, "N")
        a.udiv(T1, T0, NT)                    # quot
        a.msub(T2, T1, NT, T0)                # rem
        for tid, slot in ((TID, "q"), (None, "qe")):
            if tid is None:
                a.add(T3, TID, 1)
                tid = T3
            a.cmp(tid, T2)
            a.csel(T4, tid, T2, "lt")         # min(t, rem)
            a.madd(T4, tid, T1, T4)           # t * quot + min(t, rem)
            self.store(T4, slot)

    def _static_chunk(self, chunk, end):
        """Round robin chunks: chunk c = tid, tid + T, ..."""
        a = self.a
        self.load(T0, "c")
        a.mov_imm(T1, chunk)
        a.mul(T0, T0, T1)
        self.load(T2, "N")
        a.cmp(T0, T2)
        a.b_ge(end)
        self.store(T0, "q")
        a.add(T0, T0, T1)
        a.cmp(T0, T2)
        a.csel(T0, T0, T2, "lt")
        self.store(T0, "qe")
        self.load(T0, "c")
        a.add(T0, T0, NT)
        self.store(T0, "c")

    def _dynamic_chunk(self, chunk, end):
        """A ticket from the ctx counter; tickets past this instance of the run are kept for the next."""
        a = self.a
        have, run = a.label(), a.label()
        self.load(T1, "held")
        a.sub(T0, T1, 1)
        a.cbnz(T1, have)
        a.mov_imm(T1, 1)
        a.add(T2, CTX, Layout.COUNTER)
        a.ldaddal(T1, T0, mem(T2))
        a.bind(have)
        self.store(xzr, "held")
        self.load(T1, "base")
        self.load(T2, "nch")
        a.add(T2, T2, T1)
        a.cmp(T0, T2)
        a.b_lt(run)
        a.add(T3, T0, 1)
        self.store(T3, "held")
        self.store(T2, "base")
        a.b(end)
        a.bind(run)
        a.sub(T0, T0, T1)
        a.mov_imm(T1, chunk)
        a.mul(T0, T0, T1)
        self.store(T0, "q")
        a.add(T0, T0, T1)
        self.load(T2, "N")
        a.cmp(T0, T2)
        a.csel(T0, T0, T2, "lt")
        self.store(T0, "qe")

    # -- the body -----------------------------------------------------------------------------
    def branch(self, test, then, other):
        a = self.a
        orelse, done = a.label(), a.label()
        self.affine(T0, test.expr)
        a.cmp(T0, 0)
        getattr(a, BRANCH_IF_FALSE[test.op])(orelse)
        then()
        a.b(done)
        a.bind(orelse)
        other()
        a.bind(done)

    def call(self, call):
        a = self.a
        self.check_arity(call, 8)
        for reg, (arg, offset) in zip(x, call.args):
            item = self.items[arg]
            a.ldr(reg, mem(CTX, self.lay.array(arg)))
            if offset.const:
                a.mov_imm(T0, self.imm64(offset.const * item, call.text))     # may be negative
                a.add(reg, reg, T0)
            for v, c in offset.terms:
                self.madd_const(reg, self.var_slot(v), c * item)
        for reg, value in zip(x[len(call.args):], call.scalars):
            a.mov_imm(reg, value)
        a.ldr(CALLEE, mem(CTX, self.lay.kernel(self.kidx[id(call.kernel)])))
        a.blr(CALLEE)


def build_aarch64(spec, loops, body, init, fini, layout, itemsizes, kernels):
    """The AArch64 nest of ``spec`` around the traced trees, as position-independent code bytes.

    Same arguments as :func:`loops.x86.nest.build` (``loops`` is accepted for symmetry: only baked
    fields of the spec become constants); ``kernels`` gives the ctx table order.
    """
    kidx = {id(k): i for i, k in enumerate(kernels)}
    return _Gen(spec, layout, itemsizes, kidx).build(body, init, fini)


def build(spec, loops, body, init, fini, layout, itemsizes, kernels):
    """:func:`build_aarch64` mapped executable (AArch64 hosts): ``nest(ctx, tid, nthreads)``, called
    through ctypes (the interpreter lock is released) or run by the pool."""
    from isa.aarch64.pool_code import NativeFunction
    code = build_aarch64(spec, loops, body, init, fini, layout, itemsizes, kernels)
    return NativeFunction("loops.nest", code, ["ptr", "i64", "i64"], None)
