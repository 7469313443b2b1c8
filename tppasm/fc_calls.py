"""The kernel calls of one :mod:`tppasm.fc` product, recorded once as offsets into its operands
and replayed for other operands of the same layouts as one table of native calls
(:meth:`isa.pool.Pool.run_table`), with no call built in Python: a product of many BRGEMM calls
(a panel and a run of rows each) spent 7-11% of its time on 2 threads building them (Zen 3,
fp32, 256 x 1024 -> 1024 3.54 ms against 3.16 replayed, 1024^3 13.0 against 12.1).

>>> import functools, numpy as np, tppasm
>>> k = tppasm.unary("relu", 1, 4); x, y = -np.arange(8.0, dtype=np.float32), np.ones(8, np.float32)
>>> calls = [[functools.partial(k, x[None, 4:], y[None, :4])]]
>>> replay = Replay.record(calls, (x, y))
>>> x2, y2 = np.arange(8.0, dtype=np.float32), np.zeros(8, np.float32)
>>> replay.run((x2, y2)), y2.tolist()                  # x2[4:] into y2[:4], as recorded on x and y
(True, [4.0, 5.0, 6.0, 7.0, 0.0, 0.0, 0.0, 0.0])
"""
import numpy as np

from isa.pool import get_pool
from isa.pool_state import RAW_ARGS

from .fc_parallel import parallel_kernels
from .operand import data_address

_RECORD = 1 + RAW_ARGS          # words of a call: the function, then its arguments


def _layout(a):
    """What a replay needs to hold of an operand: its type, shape, strides, dtype and whether it is writable."""
    return type(a), a.shape, a.strides, a.dtype, a.flags.writeable


def _extent(a):
    """The bytes from ``a``'s data pointer to its last element's end (0 for an empty array;
    strides as NumPy arrays of fc's products have them: none negative)."""
    if not a.size:
        return 0
    return a.itemsize + sum((n - 1) * s for n, s in zip(a.shape, a.strides))


class Replay:
    """Lists of kernel calls (``functools.partial(kernel, *arrays, count=...)``, one list per
    thread) as a table of native calls whose operand pointers are offsets into ``operands``."""

    __slots__ = ("words", "slots", "owners", "heads", "firsts", "lists")

    @classmethod
    def record(cls, shares, operands, check=False):
        """The :class:`Replay` of ``shares`` (kernel calls on views of ``operands``, NumPy
        arrays), or None where a call's array does not lie in exactly one operand, a kernel does
        not run on this host (an interpreted one), or the shares are more than the pool's
        threads (they then run as they are). ``check``: check each call as a kernel call would
        (:meth:`tppasm.kernel.Kernel.raw_call`)."""
        if not 0 < len(shares) <= get_pool().nthreads or not all(call.func.runnable for s in shares for call in s):
            return None
        starts = [data_address(a) for a in operands]
        spans = [(s, s + _extent(a)) for s, a in zip(starts, operands)]
        words, slots, owners, heads = [len(shares)] + [0] * (2 * len(shares)), [], [], []
        for t, share in enumerate(shares):
            heads.append(len(words))
            words[2 + 2 * t] = len(share)
            for call in share:
                address, args = call.func.raw_call(*call.args, check=check, **call.keywords)
                words.append(address)
                for i, arg in enumerate(args):
                    if i < len(call.args):              # a pointer: the arrays come first, then the scalars
                        owner = [j for j, (lo, hi) in enumerate(spans) if lo <= arg < hi]
                        if len(owner) != 1:
                            return None
                        slots.append(len(words))
                        owners.append(owner[0])
                        arg -= starts[owner[0]]
                    words.append(arg)
                words += [0] * (_RECORD - 1 - len(args))
        replay = cls()
        replay.words = np.array(words, np.uint64)
        replay.slots, replay.owners = np.array(slots, np.intp), np.array(owners, np.intp)
        replay.heads = np.array(heads, np.uint64) * 8           # each list's first record, bytes into the table
        replay.firsts = np.arange(len(shares)) * 2 + 1          # where the table holds their addresses
        replay.lists = len(shares)
        return replay

    def run(self, operands):
        """Make the calls on ``operands`` (arrays of the recorded layouts, in the recorded order:
        the caller checks them, as :class:`Replays` does); False, calling nothing, where the pool
        now has fewer threads than the replay has lists."""
        pool = get_pool()
        if self.lists > pool.nthreads:
            return False
        table = self.words.copy()
        table[self.slots] += np.array([data_address(a) for a in operands], np.uint64)[self.owners]
        at = data_address(table)
        table[self.firsts] = self.heads + np.uint64(at)
        pool.run_table(at, self.lists)
        return True


class Replays:
    """The :class:`Replay` of one product's calls for each layout of its operands seen (at most
    :data:`KEPT`): :meth:`run` records a layout's calls the first time, checked, and replays them after.

    >>> import functools, numpy as np, tppasm
    >>> k = tppasm.unary("relu", 1, 4); x, y = np.arange(-2.0, 2.0, dtype=np.float32), np.ones(4, np.float32)
    >>> replays = Replays()
    >>> for _ in range(2):
    ...     replays.run((x, y), lambda: [[functools.partial(k, x[None], y[None])]])
    >>> len(replays.by_layouts), y.tolist()
    (1, [0.0, 0.0, 0.0, 1.0])
    """

    def __init__(self):
        self.by_layouts = {}

    def run(self, operands, build):
        """Make the calls ``build()`` returns (lists of kernel calls on views of ``operands``, one
        list per thread): replayed where this layout was recorded, else recorded and replayed, or,
        where they cannot be (see :meth:`Replay.record`), made as they are (:func:`parallel_kernels`)."""
        layouts = tuple(map(_layout, operands))
        replay = self.by_layouts.get(layouts)
        if replay is not None and replay.run(operands):
            return
        shares = build()
        replay = Replay.record(shares, operands, check=True)
        if replay is not None and replay.run(operands):
            if len(self.by_layouts) >= KEPT:
                self.by_layouts.clear()
            self.by_layouts[layouts] = replay
        else:
            parallel_kernels(shares)


KEPT = 8
