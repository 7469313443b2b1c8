"""What a model builds per input shape (buffers, kernels and nests: MiniLM's plans, a LlamaLayer's
steps), kept for the shapes used last: the least recently used go while their buffers take more
than a byte budget (the one just used stays, whatever its size), so a model that sees many shapes
does not hold the buffers of every one. A model given no pool of its own runs on the process's
pool (:func:`isa.pool.get_pool`): once :func:`isa.pool.set_num_threads` replaced it (or it was
closed), everything built for the old one is dropped and built again for the new one on first
use. Per call this costs an identity check; nothing is rebuilt while the pool stays.

>>> from types import SimpleNamespace
>>> built = PerShape(lambda key, pool: SimpleNamespace(key=key, nbytes=100))
>>> [built.get(n, budget=250).key for n in (1, 2, 3, 2)]
[1, 2, 3, 2]
>>> list(built)          # least recently used first; 1 went: all three would take 300 bytes
[3, 2]
"""
from collections.abc import Mapping

from isa.pool import get_pool, is_current


class PerShape(Mapping):
    """{key: what ``build(key, pool)`` returned} (each with an ``nbytes``), built on first use by
    :meth:`get`, on ``pool`` (None: the process's pool, followed as it is replaced). Callers take
    turns (the models' :class:`~bench.models.serial.Serial`)."""

    def __init__(self, build, pool=None):
        self._build, self._own_pool = build, pool
        self._items = {}                 # least recently used first
        self._process_pool = None        # the process's pool the items were built on (pool None)
        self._last = None                # the key of the most recently used item

    def get(self, key, budget):
        """The item of ``key``, built if new (the least recently used others then go while all
        take more than ``budget`` bytes), now the most recently used."""
        pool = self._own_pool
        if pool is None:
            pool = self._process_pool
            if pool is None or not is_current(pool):
                pool = self._follow_process_pool()
        if key == self._last:            # (a model calls with one shape again and again)
            return self._items[key]
        item = self._items.pop(key, None)
        if item is None:                 # only a new item can take the buffers past the budget
            item = self._build(key, pool)
            while self._items and item.nbytes + sum(i.nbytes for i in self._items.values()) > budget:
                del self._items[next(iter(self._items))]
        self._items[key], self._last = item, key
        return item

    def _follow_process_pool(self):
        """The process's pool now, everything built on the one set_num_threads replaced dropped."""
        self._items.clear()
        self._last = None
        self._process_pool = get_pool()
        return self._process_pool

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self):
        return len(self._items)
