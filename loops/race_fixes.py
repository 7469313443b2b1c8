"""Simple edits of a loop spec that a :class:`loops.races.RaceError` may name as fixes.

An edit works on the spec's tokens (one per level: the letter, its baked bounds, its grid
placement and its barrier) and its schedule: a barrier ``|`` after a level, ``schedule(static)``
for a dynamic one, one parallel level (or every level of a loop the racing pair differs in) made
serial, a racing loop moved outermost, or every loop made serial. :func:`candidates` lists the
edits one at a time, then two at a time; the texts need not parse (the caller parses each and
checks it with the race analysis before naming it). :func:`reorders` tells which edits change
the serial order (the order a serial reading of the spec runs the iterations in), where a
body whose result depends on that order (floating-point sums) may round differently.

>>> from loops.spec import parse
>>> list(candidates(parse("aB@schedule(dynamic)", 2), [0]))[:3]
['aB|@schedule(dynamic)', 'aB', 'a|B@schedule(dynamic)']
>>> reorders("aCb@schedule(static)", "cab"), reorders("aCb@schedule(static)", "acb")
(True, False)
"""
import itertools
import re

PAIRS = 48                  # two-edit candidates tried at most (each is traced and analyzed)


def candidates(spec, differ, edits=1):
    """Texts of the parsed ``spec`` with ``edits`` (1 or 2) simple edits, in the order of
    :func:`_singles`; pairs stop after :data:`PAIRS`. ``differ`` are the loops (0 for ``a``) the
    racing iterations differ in.

    >>> from loops.spec import parse
    >>> list(candidates(parse("aBc", 3), [2]))
    ['aB|c', 'a|Bc', 'caB', 'abc']
    """
    tokens, tail = _split(spec)
    singles = _singles(spec, tokens, tail, differ)
    if edits == 1:
        chosen = [(edit,) for edit in singles]
    else:                                                   # the last single makes all serial: no pairs
        chosen = itertools.islice(itertools.combinations(singles[:-1], 2), PAIRS)
    seen = {spec.text}
    for chain in chosen:
        state = (list(tokens), tail)
        for edit in chain:
            state = edit(*state)
        text = _join(*state)
        if text not in seen:
            seen.add(text)
            yield text


def reorders(text, fix):
    """True when ``fix`` runs its serial reading's iterations in another order than ``text``'s (the
    loop letters in another sequence): a body that sums in floating point may round differently.

    >>> reorders("aBC|@schedule(dynamic,1)", "abc"), reorders("aBc", "bac")
    (False, True)
    """
    return _letters(text).lower() != _letters(fix).lower()


def parallel(text):
    """True when ``text`` has an upper-case loop letter (grid axes and bounds aside).

    >>> parallel("aB{R:2}c"), parallel("ab|c")
    (True, False)
    """
    return any(c.isupper() for c in _letters(text))


def _letters(text):
    return re.sub(r"\{[^}]*\}|\[[^\]]*\]|@.*|\|", "", text)


def _split(spec):
    text = spec.text
    at = text.find("@")
    body, tail = (text[:at], text[at:]) if at >= 0 else (text, "")
    starts = [lv.pos for lv in spec.levels] + [len(body)]
    return [(i, body[a:b]) for i, (a, b) in enumerate(zip(starts, starts[1:]))], tail


def _join(tokens, tail):
    body = "".join(t for _, t in tokens)
    return body + (tail if parallel(body) else "")          # a schedule needs a parallel loop


def _singles(spec, tokens, tail, differ):
    """The single edits, as functions (tokens, tail) -> (tokens, tail) on (level, token) pairs (an
    edit finds its levels wherever an earlier one moved them), most likely to keep the spec's
    parallelism and order first; the last one makes every loop serial."""
    levels = spec.levels
    par = [i for i, lv in enumerate(levels) if lv.parallel]
    edits = []
    if par:
        last = spec.run[1] if spec.mode == "collapse" else par[0]
        edits.append(_barrier(last))                          # the barrier after the parallel loops
    if tail.startswith("@schedule(dynamic"):
        edits.append(lambda t, s: (t, ""))
        chunk = tail[len("@schedule(dynamic"):].rstrip(")")
        if chunk:
            edits.append(lambda t, s, c=chunk: (t, "@schedule(static" + c + ")"))
    outer = par[0] if par else len(levels)
    edits += [_barrier(i) for i in range(outer + (spec.mode == "grid")) if not par or i != last]
    for k in differ:
        mine = [i for i, lv in enumerate(levels) if lv.loop == k]
        edits += [_serial(set(mine)), _moved(set(mine))]
    edits += [_serial({i}, moved_barrier=i - 1 if spec.mode == "collapse" and i == last > spec.run[0] else None)
              for i in par]
    edits.append(_serial(set(range(len(levels)))))
    return edits


def _barrier(level):
    def edit(tokens, tail):
        return [(i, t + "|" if i == level and not t.endswith("|") else t) for i, t in tokens], tail
    return edit


def _serial(levels, moved_barrier=None):
    """The levels made serial; ``moved_barrier``: the level before the last of a collapsed run, which
    takes over the barrier of the run's last level when that one leaves the run ('BA|' -> 'B|a')."""
    def edit(tokens, tail):
        out = [(i, _serial_token(t) if i in levels else t) for i, t in tokens]
        if moved_barrier is None or not any(t.endswith("|") for i, t in out if i in levels):
            return out, tail
        out = [(i, t.rstrip("|") if i in levels else t) for i, t in out]
        return _barrier(moved_barrier)(out, tail)
    return edit


def _moved(levels):
    """The levels' tokens made serial and moved outermost (their barriers dropped)."""
    def edit(tokens, tail):
        moved = [(i, _serial_token(t).replace("|", "")) for i, t in tokens if i in levels]
        return moved + [(i, t) for i, t in tokens if i not in levels], tail
    return edit


def _serial_token(token):
    """A spec token (letter, bounds, grid, barrier) as a serial loop: lower case, off the grid."""
    brace = token.find("{")
    if brace >= 0:
        token = token[:brace] + token[token.index("}", brace) + 1:]
    return token[0].lower() + token[1:]


__all__ = ["candidates", "reorders", "parallel", "PAIRS"]
