"""The order a tuning search (:func:`loops.tune.search`) times its candidates in, and its budget.

``top`` (``lk.tune``'s ``budget``) caps the candidates *timed*: one skipped (refused by a
:class:`loops.SpecError`, racing, or giving a different result) does not use the budget, so a
space whose best-predicted specs race (a K loop that steps one block at a time, made parallel)
still times ``top`` others. Without a ``seconds`` limit, at most :data:`SKIPS_PER_SLOT` x ``top``
candidates are skipped before the search stops (a space of refused specs would otherwise be walked
to its end).

>>> from loops.trial import Candidate
>>> cands = [Candidate({}, s) for s in ("ab", "Ab", "aB", "AB")]
>>> order = Order(cands, model=False, top=2, threads=2)
>>> timed = []
>>> for c in order:
...     c.seconds = None if c.spec == "Ab" else 1.0      # 'Ab' skipped: it does not count
...     timed += [c.spec] if c.seconds else []
>>> timed
['ab', 'aB']
"""
import hashlib

import numpy as np

SKIPS_PER_SLOT = 16       # without a seconds limit: skipped candidates allowed per timed one of the budget


def explored(c):
    """A short digest of a candidate (configuration and spec): what a resumed search does not time again."""
    return hashlib.sha256(repr((sorted(c.config.items()), c.spec)).encode()).hexdigest()[:10]


def predicted(c):
    return c.predicted if c.predicted is not None else float("inf")


def config_key(c):
    return tuple(sorted(c.config.items()))


class Order:
    """The order candidates are timed in: the reference first; then, with the model, the best
    predicted ``BREADTH`` of every configuration (so each is measured), then the rest by predicted
    time scaled by its configuration's measured/predicted ratio so far (the model's error is mostly
    per configuration: how fast its kernels run inside the nest). Candidates that are the same nest
    (on one thread, specs that differ only in case) are timed once, those in ``skip`` (digests of
    candidates an earlier run timed) not at all, the reference always. ``top`` caps the candidates
    timed (the caller measures each one yielded before asking for the next: one left with
    ``seconds`` None was skipped and does not count); ``bounded``: a deadline bounds the search,
    else :data:`SKIPS_PER_SLOT` x ``top`` skipped ones end it too."""

    BREADTH, RESORT = 2, 32

    def __init__(self, cands, model, top, threads, skip=(), bounded=False):
        self.threads, self.first, self.skip = threads, cands[0], skip
        rest = cands[1:]
        self.broad, self.deep = rest, []
        if model:
            rest.sort(key=predicted)
            per, self.broad = {}, []
            for c in rest:
                k = config_key(c)
                (self.broad if per.get(k, 0) < self.BREADTH else self.deep).append(c)
                per[k] = per.get(k, 0) + 1
        self.total = min(len(cands) if top is None else max(1, top), len(cands))
        self.patience = None if bounded or top is None else SKIPS_PER_SLOT * self.total
        self.ratio, self.since = {}, 0
        self.timed = self.skipped = 0

    def _key(self, c):
        return (config_key(c), c.spec.lower() if self.threads == 1 else c.spec)

    def _more(self):
        """Whether the budget allows another candidate."""
        return self.timed < self.total and (self.patience is None or self.skipped < self.patience)

    def _count(self, c):
        """Count ``c`` once the caller measured it: timed (uses the budget) or skipped."""
        if c.seconds is not None:
            self.timed += 1
        else:
            self.skipped += 1

    def __iter__(self):
        seen = {}
        self.timed = self.skipped = 0

        def fresh(c):
            k = self._key(c)
            twin = seen.get(k)                      # the same nest, timed already unless refused ('A' on 1 thread)
            if twin is not None and not twin.note:
                return False
            if c is not self.first and self.skip and explored(c) in self.skip:
                return False
            seen[k] = c
            return True
        for c in [self.first] + self.broad:
            if not self._more():
                return
            if fresh(c):
                yield c
                self._count(c)
        pos, self.since = 0, self.RESORT
        while pos < len(self.deep) and self._more():
            if self.since >= self.RESORT:
                self.deep[pos:] = sorted(self.deep[pos:], key=self._calibrated())
                self.since = 0
            c = self.deep[pos]
            pos += 1
            if fresh(c):
                yield c
                self._count(c)

    def learn(self, c):
        if c.seconds is not None and c.predicted:
            self.ratio.setdefault(config_key(c), []).append(c.seconds / c.predicted)
        self.since += 1

    def _calibrated(self):
        """Sort key: predicted seconds x the configuration's median measured/predicted ratio."""
        everything = [x for v in self.ratio.values() for x in v]
        default = float(np.median(everything)) if everything else 1.0
        factor = {k: float(np.median(v)) for k, v in self.ratio.items()}
        return lambda c: predicted(c) * factor.get(config_key(c), default)
