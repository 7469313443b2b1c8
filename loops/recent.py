"""A dict that keeps only its most recently stored or read entries: a loop kernel's compiled
nests (one per array signature) and its spec variants, which would otherwise grow with every new
shape, stride pattern or spec a long-running process meets (~24 KiB and 12 KiB of code a nest).
An entry dropped here lives on while something else holds it, and is compiled again if needed.

>>> r = Recent(2)
>>> r["a"], r["b"] = 1, 2
>>> r.get("a")                 # read: now the most recent
1
>>> r["c"] = 3; list(r)        # "b" was the least recent
['a', 'c']
"""
from collections import OrderedDict

NESTS = 64          # compiled nests a loop kernel keeps (array signatures)
VARIANTS = 128      # specs with_spec keeps (the tuner revisits few after its search)


class Recent(OrderedDict):
    """At most ``limit`` entries; storing or reading one makes it the most recent. Safe to use
    from several threads without a lock: a race can only drop an entry early."""

    def __init__(self, limit=NESTS):            # (a default: copy and pickle rebuild it as Recent())
        super().__init__()
        self.limit = limit

    def get(self, key, default=None):
        value = super().get(key, default)
        if value is not default:
            self._touch(key)
        return value

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self._touch(key)
        while len(self) > self.limit:
            try:
                self.popitem(last=False)
            except KeyError:            # emptied by another thread meanwhile
                break

    def _touch(self, key):
        try:
            self.move_to_end(key)
        except KeyError:                # dropped by another thread meanwhile
            pass
