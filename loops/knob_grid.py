"""The configurations a tuning search tries (:func:`loops.tune.search`'s ``knobs``), enumerated lazily.

A dict of name -> values is the product of the values, the first values first; a list of keyword
dicts is itself. :class:`Grid` walks the product with :func:`itertools.product` as the search
consumes it, so a grid of 100^4 configurations costs nothing before the budget starts counting;
its size, membership (a remembered record's knobs) and the text the disk key hashes
(:meth:`Grid.key_text`) are computed from the knob lists, not from the product.

>>> g = Grid({"bm": [64, 32], "bn": [16]})
>>> list(g), g.count, {"bm": 32, "bn": 16} in g, {"bm": 8, "bn": 16} in g
([{'bm': 64, 'bn': 16}, {'bm': 32, 'bn': 16}], 2, True, False)
>>> Grid({"a": range(100), "b": range(100), "c": range(100), "d": range(100)}).count
100000000
"""
import itertools
import math

# Up to this many configurations the disk key lists them all, as it always has (records stored by
# earlier versions are still found); a larger grid is keyed by its knob lists, the same information.
LISTED_KEY = 4096


class Grid:
    """The configurations of ``knobs`` (a dict name -> values, or a list of keyword dicts; None: one
    empty configuration), the reference (``grid[0]``, always the same dict object) first."""

    def __init__(self, knobs):
        if isinstance(knobs, (list, tuple)):
            if not knobs or not all(isinstance(k, dict) for k in knobs):
                raise TypeError("knobs: a dict of name -> values, or a non-empty list of keyword dicts for make()")
            self.listed, self.names, self.values = [dict(k) for k in knobs], None, None
            self.count = len(self.listed)
            self.first = self.listed[0]
            return
        knobs = dict(knobs or {})
        values = {}
        for name, vals in knobs.items():
            if isinstance(vals, (str, bytes)) or not hasattr(vals, "__iter__"):
                vals = ()
            vals = list(vals)
            if not vals:
                raise TypeError(f"knobs[{name!r}]={knobs[name]!r}: give a non-empty list of values to try, "
                                "e.g. [32, 64]")
            values[name] = vals
        self.listed, self.names, self.values = None, list(values), list(values.values())
        self.count = math.prod(len(v) for v in self.values)
        self.first = {n: v[0] for n, v in zip(self.names, self.values)}

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        if i != 0:
            raise IndexError("a knob grid is walked in order; only grid[0] (the reference) is indexed")
        return self.first

    def __iter__(self):
        if self.listed is not None:
            yield from self.listed
            return
        yield self.first
        for combo in itertools.islice(itertools.product(*self.values), 1, None):
            yield dict(zip(self.names, combo))

    def __contains__(self, config):
        if self.listed is not None:
            return config in self.listed
        if not isinstance(config, dict) or sorted(config, key=repr) != sorted(self.names, key=repr):
            return False
        return all(config[n] in v for n, v in zip(self.names, self.values))

    def key_text(self):
        """What the disk key of a search over this grid holds (exact: two grids with different
        configurations never share it), cheap for any size.

        >>> Grid({"bm": [64, 32]}).key_text()
        "[[('bm', 64)], [('bm', 32)]]"
        """
        if self.listed is not None or self.count <= LISTED_KEY:
            return repr([sorted(c.items()) for c in self])
        return repr(("grid", [(n, v) for n, v in zip(self.names, self.values)]))
