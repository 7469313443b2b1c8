"""x86-64 code generation of the per-thread loop nest: ``void nest(void *ctx, int64 tid, int64 nthreads)``.

The nest walks the spec's levels outer to inner with every loop value in a stack slot, computes
operand addresses as base pointer + affine byte offset, evaluates the traced ``if`` tests, and
calls each kernel through the address table in ``ctx`` (``call [ctx + table + 8*i]``). rbx holds
``ctx``, r12 the thread id, r13 the thread count; kernels may clobber everything else.

The walk over the spec and the context block are shared with the AArch64 generator (:mod:`loops.nest_plan`).

The context block (int64 slots, see :class:`Layout`): barrier function and state, the
dynamic-schedule counter (own cache line), the arrays' data pointers, the kernel table, and the
loop bounds that the spec does not bake (:class:`loops.nest_plan.Layout`).

>>> from loops.nest_plan import Layout
>>> from loops.spec import Loop, parse
>>> from loops.program import Node
>>> lay = Layout(nargs=1, nkernels=0, nloops=1)
>>> code = build(parse("A", 1), (Loop(0, 4),), Node(), Node(), Node(), lay, [4], [])
>>> code.address > 0
True
"""
from isa.x86 import Function, qword, r8, r8l, r9, r11, r12, r13, rax, rbx, rcx, rdi, rdx, rsi, rsp

from ..nest_plan import AXIS_SLOT, Layout, NestWalk

ARG_REGS = (rdi, rsi, rdx, rcx, r8, r9)
JUMP_IF_FALSE = {"==": "jne", "!=": "je", "<": "jge", "<=": "jg", ">": "jle", ">=": "jl"}


class _Gen(NestWalk):
    def __init__(self, spec, loops, layout, itemsizes, kernel_index):
        super().__init__(spec, layout, itemsizes, kernel_index)
        self.loops = loops
        self.fn = Function(f"nest_{spec.text}", ["ptr", "i64", "i64"])
        self.a = self.fn.asm

    # -- helpers ------------------------------------------------------------------------------
    def slot(self, name):
        return qword[rsp + self.slot_offset(name)]

    def operand(self, src):
        """An immediate, a ctx field or a slot (see :meth:`NestWalk.level_sources`)."""
        if isinstance(src, int):
            return src
        return qword[rbx + src[1]] if src[0] == "ctx" else self.slot(src[1])

    def mov(self, reg, src):
        self.a.mov(reg, src)

    def add(self, reg, src):
        if isinstance(src, int) and not -2 ** 31 <= src < 2 ** 31:
            self.a.mov(r11, src)
            src = r11
        self.a.add(reg, src)

    def var(self, v):
        name = self.var_slot(v)
        return r12 if name == "tid" else self.slot(name)

    def scaled(self, src, factor):
        """r11 = factor * src (imul takes a 32-bit immediate; a larger factor goes through r11)."""
        if -2 ** 31 <= factor < 2 ** 31:
            self.a.imul(r11, src, factor)
        else:
            self.a.mov(r11, self.imm64(factor, "a factor of an index"))
            self.a.imul(r11, src)

    def affine(self, reg, expr, scale=1):
        """reg = scale * expr (uses r11)."""
        self.mov(reg, self.imm64(expr.const * scale, repr(expr)))
        for v, c in expr.terms:
            src = self.var(v)
            if c * scale == 1:
                self.a.add(reg, src)
            else:
                self.scaled(src, c * scale)
                self.a.add(reg, r11)

    def barrier(self):
        if self.spec.mode == "serial":            # one thread: nothing to wait for
            return
        self.a.mov(rdi, qword[rbx + Layout.BARRIER_STATE])
        self.a.mov(rsi, r12)
        self.a.call(qword[rbx + Layout.BARRIER_FN])

    def trip(self, lo, hi, st):
        """rax = max(0, ceil((hi - lo) / st)) for slot names lo, hi, st (uses rcx, rdx)."""
        a, done = self.a, self.a.label()
        a.mov(rax, self.slot(hi))
        a.sub(rax, self.slot(lo))
        a.mov(rcx, 0)
        a.cmp(rax, 0)
        a.cmovl(rax, rcx)
        a.jle(done)
        a.add(rax, self.slot(st))
        a.dec(rax)
        a.xor(rdx, rdx)
        a.div(self.slot(st))
        a.bind(done)

    def level_range(self, i):
        """Store lo/hi/stride of level i into slots lo{name}, hi{name}, st{name}."""
        a, n = self.a, self.spec.levels[i].name
        lo, hi, clamp, step = (self.operand(s) if s is not None else None for s in self.level_sources(i))
        self.mov(rax, lo)
        a.mov(self.slot("lo" + n), rax)
        if clamp is None:
            self.mov(rax, hi)
        else:
            self.add(rax, hi)
            a.cmp(rax, clamp)
            a.cmovg(rax, clamp)
        a.mov(self.slot("hi" + n), rax)
        self.mov(rax, step)
        a.mov(self.slot("st" + n), rax)

    # -- the nest -----------------------------------------------------------------------------
    def build(self, body, init, fini):
        a, spec = self.a, self.spec
        a.mov(rbx, rdi)
        a.mov(r12, rsi)
        a.mov(r13, rdx)
        skip_init, skip_fini = a.label(), a.label()
        idle = self.slot("idle")
        a.mov(idle, 0)
        for v in ("row", "col", "layer"):
            a.mov(self.slot(v), 0)
        if spec.mode == "grid":
            self.grid_coordinates()
        if spec.schedule[0] == "dynamic":
            a.mov(self.slot("held"), -1)
            a.mov(self.slot("base"), 0)
        a.cmp(idle, 0)
        a.jne(skip_init)
        self.tree(init)
        a.bind(skip_init)
        self.levels(0, body)
        a.cmp(self.slot("idle"), 0)
        a.jne(skip_fini)
        self.tree(fini)
        a.bind(skip_fini)
        self.fn.stack(self.frame_size)
        return self.fn.finalize()

    def grid_coordinates(self):
        a = self.a
        rows, cols, layers = self.spec.grid
        inside, done = a.label(), a.label()
        a.cmp(r12, rows * cols * layers)
        a.jl(inside)
        a.mov(self.slot("idle"), 1)
        a.mov(self.slot("row"), rows)           # beyond every team: the thread's team loops are empty
        a.mov(self.slot("col"), cols)
        a.mov(self.slot("layer"), layers)
        a.jmp(done)
        a.bind(inside)
        a.mov(rax, r12)
        a.xor(rdx, rdx)
        a.mov(rcx, rows * cols)
        a.div(rcx)
        a.mov(self.slot("layer"), rax)
        a.mov(rax, rdx)
        a.xor(rdx, rdx)
        a.mov(rcx, cols)
        a.div(rcx)
        a.mov(self.slot("row"), rax)
        a.mov(self.slot("col"), rdx)
        a.bind(done)

    def serial(self, i, body):
        a, n = self.a, self.spec.levels[i].name
        top, end = a.label(), a.label()
        self.level_range(i)
        a.mov(rax, self.slot("lo" + n))
        a.mov(self.slot("x" + n), rax)
        a.bind(top)
        a.mov(rax, self.slot("x" + n))
        a.cmp(rax, self.slot("hi" + n))
        a.jge(end)
        self.levels(i + 1, body)
        a.mov(rax, self.slot("x" + n))
        a.add(rax, self.slot("st" + n))
        a.mov(self.slot("x" + n), rax)
        a.jmp(top)
        a.bind(end)

    def team(self, i, body):
        """A loop on a grid axis: contiguous chunks of ceil(tasks / teams) iterations per team."""
        a, lv = self.a, self.spec.levels[i]
        n, teams = lv.name, lv.teams
        top, end = a.label(), a.label()
        self.level_range(i)
        self.trip("lo" + n, "hi" + n, "st" + n)
        a.mov(self.slot("n" + n), rax)
        a.add(rax, teams - 1)
        a.xor(rdx, rdx)
        a.mov(rcx, teams)
        a.div(rcx)                                           # rax = chunk
        a.mov(rcx, rax)
        a.imul(rcx, self.slot(AXIS_SLOT[lv.axis]))
        a.mov(self.slot("q" + n), rcx)
        a.add(rcx, rax)
        a.cmp(rcx, self.slot("n" + n))
        a.cmovg(rcx, self.slot("n" + n))
        a.mov(self.slot("qe" + n), rcx)
        a.bind(top)
        a.mov(rax, self.slot("q" + n))
        a.cmp(rax, self.slot("qe" + n))
        a.jge(end)
        a.imul(rax, self.slot("st" + n))
        a.add(rax, self.slot("lo" + n))
        a.mov(self.slot("x" + n), rax)
        self.levels(i + 1, body)
        a.inc(self.slot("q" + n))
        a.jmp(top)
        a.bind(end)

    def collapse(self, first, last, body):
        """The collapsed parallel run: iterations 0..N-1 of the product space, split by the schedule."""
        a, spec = self.a, self.spec
        names = [spec.levels[i].name for i in range(first, last + 1)]
        for i in range(first, last + 1):
            self.level_range(i)
            self.trip("lo" + names[i - first], "hi" + names[i - first], "st" + names[i - first])
            a.mov(self.slot("n" + names[i - first]), rax)
        a.mov(rax, self.slot("n" + names[0]))
        for n in names[1:]:
            a.imul(rax, self.slot("n" + n))
        a.mov(self.slot("N"), rax)
        q, qe, N = self.slot("q"), self.slot("qe"), self.slot("N")
        kind, chunk = spec.schedule
        next_chunk, qtop, end = a.label(), a.label(), a.label()
        if kind == "static" and not chunk:
            a.mov(self.slot("done"), 0)
        elif kind == "static":
            a.mov(self.slot("c"), r12)
        else:
            chunk = chunk or 1
            a.mov(rax, N)
            a.add(rax, chunk - 1)
            a.xor(rdx, rdx)
            a.mov(rcx, chunk)
            a.div(rcx)
            a.mov(self.slot("nch"), rax)
        a.bind(next_chunk)
        if kind == "static" and not chunk:
            # OpenMP's static split: the first N % T threads get one extra iteration
            a.cmp(self.slot("done"), 0)
            a.jne(end)
            a.mov(self.slot("done"), 1)
            a.mov(rax, N)
            a.xor(rdx, rdx)
            a.div(r13)
            a.mov(rcx, r12)
            a.imul(rcx, rax)                     # tid * quot
            a.cmp(r12, rdx)
            a.mov(r8, r12)
            a.cmovg(r8, rdx)                     # min(tid, rem)
            a.add(rcx, r8)
            a.mov(q, rcx)
            a.add(rcx, rax)
            a.cmp(r12, rdx)
            a.setl(r8l)
            a.movzx(r8, r8l)
            a.add(rcx, r8)
            a.mov(qe, rcx)
        elif kind == "static":
            a.mov(rax, self.slot("c"))
            a.imul(rax, rax, chunk)
            a.cmp(rax, N)
            a.jge(end)
            a.mov(q, rax)
            a.add(rax, chunk)
            a.cmp(rax, N)
            a.cmovg(rax, N)
            a.mov(qe, rax)
            a.add(self.slot("c"), r13)
        else:
            have, run = a.label(), a.label()
            held, base = self.slot("held"), self.slot("base")
            a.mov(rax, held)
            a.cmp(rax, -1)
            a.jne(have)
            a.mov(rax, 1)
            a.xadd(qword[rbx + Layout.COUNTER], rax, lock=True)
            a.bind(have)
            a.mov(held, -1)
            a.mov(rcx, base)
            a.mov(rdx, rcx)
            a.add(rdx, self.slot("nch"))
            a.cmp(rax, rdx)
            a.jl(run)
            a.mov(held, rax)                     # a ticket of a later instance of this run: keep it
            a.mov(base, rdx)
            a.jmp(end)
            a.bind(run)
            a.sub(rax, rcx)
            a.imul(rax, rax, chunk)
            a.mov(q, rax)
            a.add(rax, chunk)
            a.cmp(rax, N)
            a.cmovg(rax, N)
            a.mov(qe, rax)
        a.bind(qtop)
        a.mov(rax, q)
        a.cmp(rax, qe)
        a.jge(next_chunk)
        for n in reversed(names[1:]):            # mixed-radix digits, innermost first
            a.xor(rdx, rdx)
            a.div(self.slot("n" + n))
            a.imul(rdx, self.slot("st" + n))
            a.add(rdx, self.slot("lo" + n))
            a.mov(self.slot("x" + n), rdx)
        a.imul(rax, self.slot("st" + names[0]))
        a.add(rax, self.slot("lo" + names[0]))
        a.mov(self.slot("x" + names[0]), rax)
        self.levels(last + 1, body)
        a.inc(q)
        a.jmp(qtop)
        a.bind(end)

    # -- the body -----------------------------------------------------------------------------
    def branch(self, test, then, other):
        a = self.a
        orelse, done = a.label(), a.label()
        self.affine(rax, test.expr)
        a.cmp(rax, 0)
        getattr(a, JUMP_IF_FALSE[test.op])(orelse)
        then()
        a.jmp(done)
        a.bind(orelse)
        other()
        a.bind(done)

    def call(self, call):
        a = self.a
        self.check_arity(call, len(ARG_REGS))
        for reg, (arg, offset) in zip(ARG_REGS, call.args):
            item = self.items[arg]
            a.mov(reg, qword[rbx + self.lay.array(arg)])
            if offset.const:
                self.add(reg, self.imm64(offset.const * item, call.text))
            for v, c in offset.terms:
                src = self.var(v)
                if c * item == 1:
                    a.add(reg, src)
                else:
                    self.scaled(src, c * item)
                    a.add(reg, r11)
        for reg, value in zip(ARG_REGS[len(call.args):], call.scalars):
            a.mov(reg, value)
        a.call(qword[rbx + self.lay.kernel(self.kidx[id(call.kernel)])])


def build(spec, loops, body, init, fini, layout, itemsizes, kernels):
    """JIT the nest of ``spec`` around the traced trees; ``kernels`` gives the table order.

    ``loops`` are the resolved loop declarations (only baked fields are used as constants).
    """
    kidx = {id(k): i for i, k in enumerate(kernels)}
    return _Gen(spec, loops, layout, itemsizes, kidx).build(body, init, fini)
