"""The ISA-independent walk of a loop nest, shared by the x86-64 and AArch64 generators.

:class:`NestWalk` knows the spec: which stack slot holds what, where a loop bound comes from
(a baked constant or a context field), how levels nest (serial, grid-axis team, collapsed
parallel run, barriers), and how a traced body tree branches. A backend subclasses it and emits
each piece (``serial``, ``team``, ``collapse``, ``barrier``, ``call``, ``branch``).

The partitioning arithmetic the backends emit is written here once in Python too
(:func:`static_share`, :func:`team_share`), as the reference the generated code follows.

>>> static_share(10, 4, 0), static_share(10, 4, 3)
((0, 3), (8, 10))
>>> team_share(5, 2, 1)
(3, 5)
"""
import ctypes

from .spec import LETTERS, MAX_BLOCKING
from .trace import TraceError

AXIS_SLOT = {"R": "row", "C": "col", "L": "layer"}
LOOP_FIELDS = 3 + MAX_BLOCKING        # start, end, step, blocks...


class Layout:
    """Byte offsets of the fields of the per-call context block."""

    BARRIER_FN, BARRIER_STATE, COUNTER, ARRAYS = 0, 8, 64, 128

    def __init__(self, nargs, nkernels, nloops):
        self.nargs, self.nkernels, self.nloops = nargs, nkernels, nloops
        self.kernels = self.ARRAYS + 8 * nargs
        self.loops = self.kernels + 8 * nkernels
        self.size = self.loops + 8 * LOOP_FIELDS * nloops

    def array(self, i):
        return self.ARRAYS + 8 * i

    def kernel(self, i):
        return self.kernels + 8 * i

    def loop_field(self, loop, k):
        return self.loops + 8 * (LOOP_FIELDS * loop + k)

    def template(self, loops, kernel_addresses, barrier_fn=0, barrier_state=0):
        """A ctypes int64 array with everything but the array pointers filled in."""
        ctx = (ctypes.c_int64 * (self.size // 8))()
        ctx[0], ctx[1] = barrier_fn, barrier_state
        for i, addr in enumerate(kernel_addresses):
            ctx[self.kernel(i) // 8] = addr
        for i, lp in enumerate(loops):
            base = self.loop_field(i, 0) // 8
            ctx[base:base + 3] = [lp.start, lp.end, lp.step]
            for j, b in enumerate(lp.blocks[:MAX_BLOCKING]):
                ctx[base + 3 + j] = b
        return ctx


def static_share(n, nthreads, tid):
    """OpenMP's static split of ``n`` iterations: the first ``n % T`` threads get one more.

    Returns the half-open range ``(q, qe)`` of thread ``tid``.

    >>> [static_share(5, 2, t) for t in range(2)]
    [(0, 3), (3, 5)]
    """
    quot, rem = divmod(n, nthreads)
    return tid * quot + min(tid, rem), (tid + 1) * quot + min(tid + 1, rem)


def team_share(n, teams, coord):
    """A grid axis: contiguous chunks of ``ceil(n / teams)`` iterations; chunk ``coord``.

    >>> [team_share(3, 2, c) for c in range(3)]
    [(0, 2), (2, 3), (4, 3)]
    """
    chunk = -(-n // teams)
    return chunk * coord, min(chunk * coord + chunk, n)


class NestWalk:
    """Spec-driven skeleton of a nest generator; subclasses emit machine code.

    ``slots`` maps a name (``x<level>``, ``lo<level>``, ``hi<level>``, ``st<level>``, ``n<level>``,
    ``q``, ``qe``, ``N``, ``row``/``col``/``layer``, ``idle``...) to a byte offset in the frame.
    """

    def __init__(self, spec, layout, itemsizes, kernel_index):
        self.spec, self.lay = spec, layout
        self.items, self.kidx = itemsizes, kernel_index
        self.slots = {}

    def slot_offset(self, name):
        """Frame offset of the 8-byte slot ``name`` (allocated on first use)."""
        if name not in self.slots:
            self.slots[name] = 8 * len(self.slots)
        return self.slots[name]

    @property
    def frame_size(self):
        return 8 * len(self.slots)

    def source(self, loop, field):
        """A loop field as an int when the spec bakes it, else ``("ctx", byte offset)``.

        ``field``: 0 start, 1 end, 2 step, 3 + k block size k.
        """
        baked = self.spec.bake[loop]
        k = min(field, 3)
        value = baked[k] if k < 3 else (baked[3][field - 3] if baked[3] is not None else None)
        return value if value is not None else ("ctx", self.lay.loop_field(loop, field))

    def var_slot(self, v):
        """Slot name of a traced variable (a loop letter or a grid coordinate); ``"tid"`` stays."""
        if v in ("tid", "row", "col", "layer"):
            return v
        k = LETTERS.index(v)
        return f"x{v}{self.spec.occurrences[k] - 1}"

    def level_sources(self, i):
        """Where level i's range comes from: ``(lo, hi, clamp, step)``.

        The first occurrence of a loop runs ``[lo, hi)`` from the declaration (``clamp`` None); a
        blocked occurrence runs ``[x_prev, min(x_prev + hi, clamp))`` where ``hi`` is the outer
        block size and ``clamp`` the slot of the outer level's end.
        """
        lv = self.spec.levels[i]
        step = self.source(lv.loop, 2 if lv.last else 3 + lv.occurrence)
        if lv.occurrence == 0:
            return self.source(lv.loop, 0), self.source(lv.loop, 1), None, step
        prev = f"{lv.letter}{lv.occurrence - 1}"
        return ("slot", "x" + prev), self.source(lv.loop, 3 + lv.occurrence - 1), ("slot", "hi" + prev), step

    def levels(self, i, body):
        """Emit levels i.. around ``body`` (then the body itself)."""
        spec = self.spec
        if i == len(spec.levels):
            self.tree(body)
            return
        lv = spec.levels[i]
        if spec.mode == "collapse" and i == spec.run[0]:
            self.collapse(i, spec.run[1], body)
            if spec.levels[spec.run[1]].barrier:
                self.barrier()
            return
        if lv.axis:
            self.team(i, body)
        else:
            self.serial(i, body)
        if lv.barrier:
            self.barrier()

    def tree(self, node):
        """Emit a traced body: its calls, then its branch (both sides) if any."""
        for call in node.calls:
            self.call(call)
        if node.test is not None:
            self.branch(node.test, lambda: self.tree(node.then), lambda: self.tree(node.other))

    @staticmethod
    def imm64(value, what):
        """``value`` as a constant of the generated code; ValueError unless it fits in int64 (the bind
        check, ``loops.decorator._check_int64``, refuses such nests first; AArch64's ``mov_imm``
        would keep only the low 64 bits)."""
        if not -2 ** 63 <= value < 2 ** 63:
            raise ValueError(f"{what}: the constant {value} does not fit in 64 bits; native nests compute "
                             "offsets and comparisons in 64-bit integers")
        return value

    def check_arity(self, call, nregs_max):
        if len(call.args) + len(call.scalars) > nregs_max:
            raise TraceError(f"{call.text}: kernels with more than {nregs_max} arguments cannot be called "
                             "from a loop nest yet")

    # the emitters a backend provides
    def serial(self, i, body):
        raise NotImplementedError

    def team(self, i, body):
        raise NotImplementedError

    def collapse(self, first, last, body):
        raise NotImplementedError

    def barrier(self):
        raise NotImplementedError

    def call(self, call):
        raise NotImplementedError

    def branch(self, test, then, other):
        raise NotImplementedError
