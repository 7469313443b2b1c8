"""The progress of a tuning search (:func:`loops.tune.search`): a tqdm bar in a terminal or a
notebook, else a line every few seconds on stderr, and a last line naming the candidate picked once
the final rounds re-timed the fastest (and whether the budget ended the search). While it runs, the
bar shows the fastest first timing: the final rounds often pick another.

>>> bar = Progress(3, enabled=False); bar.close(budget_ended=True)
"""
import sys
import time

from tppasm.display import printable


class Progress:
    """A tqdm bar (notebook-aware) when tqdm is installed, else a line every few seconds."""

    def __init__(self, total, enabled):
        self.total, self.enabled, self.n, self.best = total, enabled, 0, None
        self.bar, self.last = None, time.perf_counter()
        if enabled and _interactive():
            try:
                from tqdm.auto import tqdm
                self.bar = tqdm(total=total, desc="tuning", unit="cand", leave=False)
            except ImportError:
                pass

    def step(self, c):
        self.n += 1
        if c.seconds is not None and (self.best is None or c.seconds < self.best.seconds):
            self.best = c
        if not self.enabled:
            return
        text = f"fastest first timing {self._name(self.best)} {self.best.seconds * 1e3:.3f} ms" if self.best else ""
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.update()
        elif time.perf_counter() - self.last > 10 or self.n == self.total:
            self.last = time.perf_counter()
            print(f"tuning [{self.n}/{self.total}] {text}", file=sys.stderr, flush=True)

    @staticmethod
    def _name(c):
        """``aBC bm=8``: a candidate's spec and knobs, control characters escaped (a knob's text goes
        to the terminal: an ESC sequence in it would move the cursor or clear the screen).

        >>> from types import SimpleNamespace as C
        >>> Progress._name(C(spec="aB", config={"act": "relu\\x1b[2J\\r"}))
        'aB act=relu\\\\x1b[2J\\\\r'
        """
        return printable(c.spec + "".join(f" {k}={v}" for k, v in c.config.items()))

    def close(self, budget_ended=False, winner=None):
        """End the bar. ``winner``: the candidate the search picked after re-timing the fastest (give
        it once the final rounds are over: the fastest first timing is often not the one picked),
        named on a last line; ``budget_ended``: the ``seconds`` budget stopped the search before the
        last candidate, which that line says (a search can otherwise end silently before its total).

        >>> from types import SimpleNamespace as C
        >>> import contextlib, io
        >>> bar, err = Progress(4, enabled=True), io.StringIO()
        >>> with contextlib.redirect_stderr(err):
        ...     bar.close(budget_ended=True, winner=C(spec="aBC", config={"bm": 8}, seconds=0.0125))
        >>> err.getvalue().split("; ")[0]
        'tuning: the seconds budget ended the search after 0 of 4 candidates'
        >>> err.getvalue().split("; ")[1]
        'picked aBC bm=8 (12.500 ms after the final rounds)\\n'
        """
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if not self.enabled or not budget_ended and winner is None:
            return
        head = f"the seconds budget ended the search after {self.n} of {self.total} candidates" if budget_ended \
            else f"{self.n} of {self.total} candidates timed"
        picked = f"; picked {self._name(winner)} ({winner.seconds * 1e3:.3f} ms after the final rounds)" \
            if winner is not None else ""
        print(f"tuning: {head}{picked}", file=sys.stderr, flush=True)


def _interactive():
    """True in a terminal or a notebook (a bar redraws there; in a log it would repeat every line)."""
    if "ipykernel" in sys.modules:
        return True
    return sys.stderr.isatty()
