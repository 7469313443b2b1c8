"""Loop declarations and the loop-spec language: grammar, parser, validation, serial order.

Grammar (one character position per token; the message of every :class:`SpecError` names the
position and says what would be legal there)::

    spec     := item+ ['@schedule(' ('static'|'dynamic') [',' chunk] ')']
    item     := letter [bake] [grid] ['|']
    letter   := 'a'..'z' serial | 'A'..'Z' parallel          -- letter k = k-th declared Loop
    bake     := '[' [start] ',' [end] ',' [step] ',' '(' [size {',' size}] ')' ']'
    grid     := '{' ('R'|'C'|'L') ':' n '}'                  -- only after an upper-case letter

A letter written k times is its loop blocked k-1 times; occurrence 0 steps by ``blocks[0]``,
occurrence j by ``blocks[j]`` inside the block of occurrence j-1, the last one by ``step``. Trip
counts that do not divide run the remainder iterations.

>>> s = parse("bcaBCb", 3)
>>> [(lv.letter, lv.occurrence, lv.parallel) for lv in s.levels][:3]
[('b', 0, False), ('c', 0, False), ('a', 0, False)]
>>> s.mode, s.run
('collapse', (3, 4))
"""
import re

import numpy as np
from dataclasses import dataclass, field

from tppasm.display import shown

AXES = {"R": "row", "C": "col", "L": "layer"}
LETTERS = "abcdefghijklmnopqrstuvwxyz"
MAX_BLOCKING = 5
LOOP_LIMIT = 1 << 61      # bounds, steps, spans, blocks: int64 sums of two never overflow
# Schedule chunks: the nests multiply a chunk number (up to the thread count) by the chunk in int64,
# and x86 takes it as a 32-bit immediate. A larger chunk would give each thread one chunk anyway.
CHUNK_LIMIT = (1 << 31) - 1


class SpecError(ValueError):
    """A loop spec or loop declaration that cannot be compiled; the message says why and where.

    >>> import loops
    >>> try:
    ...     loops.kernel("aZ", loops.Loop(0, 2))(lambda i: None)
    ... except loops.SpecError as e:                  # a ValueError too
    ...     print(str(e).splitlines()[0])
    loop spec 'aZ', position 1 ('Z'): letter 'Z' names loop 25 but only 1 loops are declared; use the letter a
    """


@dataclass(frozen=True)
class Loop:
    """A logical loop: ``range(start, end, step)``, blockable with ``blocks`` (outermost first).

    ``parallel=False`` marks a loop that must not be split across threads (a reduction); the
    spec rejects it in upper case and the tuner never upper-cases it.

    >>> Loop(0, 10, 2, blocks=[4]).trip
    5
    """

    start: int
    end: int
    step: int = 1
    blocks: tuple = ()
    parallel: bool = True

    def __post_init__(self):
        blocks = self.blocks
        if isinstance(blocks, (int, np.integer, str)) or not hasattr(blocks, "__iter__"):
            example = int(blocks) if isinstance(blocks, np.integer) else blocks
            raise SpecError(f"Loop blocks={blocks!r} must be a list of block sizes, e.g. blocks=[{example!r}]")
        if isinstance(blocks, np.ndarray) and (blocks.ndim != 1 or blocks.dtype.kind not in "iu"):
            raise SpecError(f"Loop blocks={blocks!r}: a NumPy array of block sizes must be 1-D of integers "
                            f"(got {blocks.ndim}-D {blocks.dtype}); e.g. blocks=[8, 4]")
        if not isinstance(blocks, (list, tuple, range, np.ndarray)):
            ordered = isinstance(blocks, (set, frozenset)) and blocks and all(
                isinstance(b, (int, np.integer)) for b in blocks)
            example = sorted(map(int, blocks), reverse=True) if ordered else [8, 4]
            raise SpecError(f"Loop blocks={blocks!r} is a {type(blocks).__name__}: block sizes go outermost first, "
                            f"so give them in order as a list or tuple, e.g. blocks={example}")
        blocks = tuple(int(b) if isinstance(b, np.integer) else b for b in blocks)
        object.__setattr__(self, "blocks", blocks)
        for name in ("start", "end", "step"):
            value = getattr(self, name)
            if isinstance(value, np.integer):
                object.__setattr__(self, name, int(value))
            elif not isinstance(value, int) or isinstance(value, bool):
                raise SpecError(f"Loop {name}={shown(value)} must be an int")
        if self.step < 1:
            raise SpecError(f"Loop step={shown(self.step)} must be >= 1")
        for name in ("start", "end", "step"):      # the native nest computes in int64, with headroom
            if abs(getattr(self, name)) >= LOOP_LIMIT:
                raise SpecError(f"Loop {name}={shown(getattr(self, name))} is out of range: loop bounds and steps "
                                f"must lie within +-2**61 (native loops count in 64-bit integers)")
        if abs(self.end - self.start) >= LOOP_LIMIT:
            raise SpecError(f"Loop({self.start}, {self.end}) spans {self.end - self.start} values; less than "
                            f"2**61 (native loops count in 64-bit integers)")
        for b in self.blocks:
            if not isinstance(b, int) or isinstance(b, bool) or b < 1 or b % self.step or b >= LOOP_LIMIT:
                raise SpecError(f"Loop block size {shown(b)} must be an int, a positive multiple of step={self.step}, "
                                "below 2**61")
        if not isinstance(self.parallel, bool):
            raise SpecError(f"Loop parallel={self.parallel!r} must be True or False")

    @property
    def trip(self):
        return max(0, -(-(self.end - self.start) // self.step))


@dataclass(frozen=True)
class Level:
    """One letter of the spec: a loop of the nest."""

    loop: int            # logical loop index (a = 0)
    occurrence: int      # 0 = outermost occurrence of that loop
    last: bool           # innermost occurrence: steps by the loop's step, its value is the index
    parallel: bool
    pos: int             # character position in the spec text
    axis: str = ""       # grid axis R/C/L, or "" when not on a grid
    teams: int = 1
    barrier: bool = False

    @property
    def letter(self):
        return LETTERS[self.loop]

    @property
    def name(self):
        return f"{self.letter}{self.occurrence}"


@dataclass(frozen=True)
class Spec:
    """A parsed, validated spec: levels outer to inner, parallel mode, baked bounds, schedule."""

    text: str
    levels: tuple
    nloops: int
    mode: str                     # "serial", "collapse" or "grid"
    run: tuple = ()               # (first, last) level index of the collapsed run
    schedule: tuple = ("static", 0)
    grid: tuple = (1, 1, 1)       # teams on the (row, col, layer) axes
    bake: tuple = ()              # per loop: (start, end, step, blocks) with None = not baked
    occurrences: tuple = field(default=())

    def resolve(self, loops):
        """The loops with baked fields applied, checked against the blocking the spec asks for.

        >>> parse("a[,8,,()]", 1).resolve([Loop(0, 4)])
        (Loop(start=0, end=8, step=1, blocks=(), parallel=True),)
        """
        out = []
        for i, lp in enumerate(loops):
            baked = self.bake[i]
            fields = [lp.start, lp.end, lp.step, lp.blocks]
            fields = [old if new is None else new for old, new in zip(fields, baked)]
            try:
                lp = Loop(*fields, lp.parallel)
            except SpecError as e:
                if all(v is None for v in baked):
                    raise
                at = next(v.pos for v in self.levels if v.loop == i and self.text[v.pos + 1:v.pos + 2] == "[")
                start, end, step, blocks = fields
                _fail(self.text, at, f"with the bounds baked here, loop '{LETTERS[i]}' would be Loop({start}, "
                      f"{end}, {step}, blocks={list(blocks)}), which is refused: {e}",
                      "bake bounds that fit the declared Loop, or bake its block sizes too (the fourth "
                      "field, e.g. '[,,2,(4)]')")
            need = self.occurrences[i] - 1
            if need > len(lp.blocks):
                lv = [v for v in self.levels if v.loop == i][len(lp.blocks) + 1]
                _fail(self.text, lv.pos, f"loop '{lv.letter}' is written {need + 1} times (blocked {need} "
                      f"times) but has {len(lp.blocks)} block sizes (blocks={list(lp.blocks)})",
                      f"declare Loop(..., blocks=[{', '.join(['B'] * need)}]) or write "
                      f"'{lv.letter}' at most {len(lp.blocks) + 1} times")
            if self.mode != "serial":
                for lv in self.levels:
                    if lv.loop == i and lv.parallel and not lp.parallel:
                        _fail(self.text, lv.pos, f"loop '{lv.letter}' is declared parallel=False",
                              f"write it lower case '{lv.letter}'")
            out.append(lp)
        if self.mode == "collapse":
            first, last = self.run
            total = 1
            for lv in self.levels[first:last + 1]:
                total *= _level_trip(out[lv.loop], lv)
            if total >= LOOP_LIMIT:
                _fail(self.text, self.levels[first].pos, f"the collapsed parallel run has {total} iterations (the "
                      "product of its loops' trip counts); native nests count them in 64-bit integers, below "
                      "2**61", "collapse fewer loops (write one of them lower case) or declare smaller loops")
        return tuple(out)

    @property
    def nthreads_needed(self):
        r, c, l = self.grid
        return r * c * l if self.mode == "grid" else 1


def _level_trip(lp, lv):
    """The most iterations level ``lv`` (an occurrence of loop ``lp``) runs per instance."""
    span = lp.end - lp.start if lv.occurrence == 0 else lp.blocks[lv.occurrence - 1]
    stride = lp.step if lv.last else lp.blocks[lv.occurrence]
    return max(0, -(-span // stride))


def _fail(text, pos, what, legal):
    """SpecError at ``pos``: the spec (beyond :data:`SHOWN` characters either side, the window
    around ``pos``, marked '...') with a caret under the position."""
    ch = text[pos] if pos < len(text) else "end of spec"
    at = repr(ch) if pos < len(text) else ch
    lo, hi = (max(0, pos - SHOWN), min(len(text), pos + SHOWN)) if len(text) > 2 * SHOWN else (0, len(text))
    name = repr(text) if (lo, hi) == (0, len(text)) else f"of {len(text)} characters"
    before, after = ("..." if lo else ""), ("..." if hi < len(text) else "")
    caret = len(before) + len(_escaped(text[lo:pos]))
    raise SpecError(f"loop spec {name}, position {pos} ({at}): {what}; {legal}\n"
                    f"  {before}{_escaped(text[lo:hi])}{after}\n  {' ' * caret}^")


SHOWN = 40      # characters of a spec shown either side of an error's position


def _escaped(text):
    """``text`` in printable ASCII, one column a character: every other character as its Python
    escape, so that the caret under it stays aligned (no ESC sequence, line break, combining or
    wide character reaches the terminal).

    >>> _escaped("a\\x1b[2J\\na\\u0301x")
    'a\\\\x1b[2J\\\\na\\\\u0301x'
    """
    return "".join(c if " " <= c <= "~" else ascii(c)[1:-1] for c in text)


def _integer(text, pos, digits, what, legal="write a number below 2**61"):
    """``int(digits)``, or a SpecError at ``pos`` when it has more digits than any accepted value
    (int() refuses over 4300 digits with an error that names neither the spec nor the position)."""
    if len(digits.strip().lstrip("-").lstrip("0")) > 19:
        _fail(text, pos, f"{what} has {len(digits.strip().lstrip('-'))} digits", legal)
    return int(digits)


_SCHEDULE = re.compile(r"@schedule\((static|dynamic)(?:,\s*([0-9]+))?\)\Z")   # ASCII digits (\d takes any script's)
_INT = re.compile(r"-?[0-9]+")


def parse(text, nloops):
    """Parse and validate ``text`` for ``nloops`` declared loops; raise :class:`SpecError`.

    >>> parse("aB{R:2}C{C:1}", 3).grid
    (2, 1, 1)
    >>> try:
    ...     parse("aBx", 3)
    ... except SpecError as e:
    ...     print(e)
    loop spec 'aBx', position 2 ('x'): letter 'x' names loop 23 but only 3 loops are declared; use letters a-c
      aBx
        ^
    """
    if not isinstance(text, str) or not text:
        raise SpecError(f"loop spec must be a non-empty string like 'aBC', got {text!r}")
    if not 1 <= nloops <= len(LETTERS):
        raise SpecError(f"{nloops} loops declared; between 1 and {len(LETTERS)} are supported")
    legal_letters = f"use letters a-{LETTERS[nloops - 1]}" if nloops > 1 else "use the letter a"
    body, schedule, at = text, ("static", 0), text.find("@")
    if at >= 0:
        m = _SCHEDULE.match(text[at:])
        if not m:
            _fail(text, at, f"cannot read {text[at:]!r}",
                  "write '@schedule(static)', '@schedule(static,N)', '@schedule(dynamic)' or '@schedule(dynamic,N)'")
        chunk = _integer(text, at + m.start(2), m.group(2), "the schedule chunk",
                                "write a chunk below 2**31") if m.group(2) else 0
        if m.group(2) is not None and not 1 <= chunk <= CHUNK_LIMIT:
            _fail(text, at + m.start(2), f"the schedule chunk must be in 1..2**31-1 ({CHUNK_LIMIT}), not {chunk}",
                  "write a positive chunk size below 2**31 (a chunk as large as the loop's iteration count "
                  "gives one thread all of it)")
        schedule, body = (m.group(1), chunk), text[:at]
    raw = []                       # [letter, pos, bake, axis, teams, barrier]
    bake = [[None, None, None, None] for _ in range(nloops)]
    baked_at = {}
    i = 0
    while i < len(body):
        ch = body[i]
        if ch.isalpha() and ch.isascii():
            k = LETTERS.index(ch.lower())
            if k >= nloops:
                _fail(text, i, f"letter '{ch}' names loop {k} but only {nloops} loops are declared", legal_letters)
            raw.append([ch, i, None, "", 1, False])
            i += 1
        elif ch == "|":
            if not raw:
                _fail(text, i, "'|' must follow a letter (it is a barrier after that loop)",
                      "start the spec with a loop letter")
            if raw[-1][5]:
                _fail(text, i, "two barriers after the same loop", "write a single '|'")
            raw[-1][5] = True
            i += 1
        elif ch == "[":
            if not raw or raw[-1][5] or raw[-1][3] or raw[-1][2] is not None:
                _fail(text, i, "'[' must directly follow a letter",
                      "write bounds right after the letter, e.g. 'a[0,64,2,(32,8)]'")
            j = body.find("]", i)
            if j < 0:
                _fail(text, i, "'[' is never closed", "write 'a[start,end,step,(blocks)]'")
            k = LETTERS.index(raw[-1][0].lower())
            if k in baked_at:
                _fail(text, i, f"bounds of loop '{raw[-1][0].lower()}' are already baked at position "
                      f"{baked_at[k]}", "bake each loop's bounds once")
            baked_at[k] = i
            bake[k] = _parse_bake(text, i, body[i + 1:j])
            raw[-1][2] = bake[k]
            i = j + 1
        elif ch == "{":
            m = re.compile(r"\{([RCL]):([0-9]+)\}").match(body, i)
            if not raw or raw[-1][5] or raw[-1][3]:
                _fail(text, i, "'{' must directly follow a letter", "write e.g. 'B{R:2}'")
            if not m:
                _fail(text, i, f"cannot read the grid placement {body[i:body.find('}', i) + 1 or None]!r}",
                      "write {R:n}, {C:n} or {L:n} with n >= 1 (row, column or layer axis)")
            if raw[-1][0].islower():
                _fail(text, raw[-1][1], f"'{raw[-1][0]}' is serial but is placed on a thread grid",
                      f"write it upper case '{raw[-1][0].upper()}'")
            teams = _integer(text, m.start(2), m.group(2), "the number of teams")
            if teams < 1:
                _fail(text, m.start(2), "a grid axis needs at least 1 team", "write n >= 1")
            raw[-1][3], raw[-1][4] = m.group(1), teams
            i = m.end()
        else:
            legal = "a loop letter, '|', '[', '{' or '@schedule(...)'" if raw else "a loop letter"
            _fail(text, i, f"unexpected character {ch!r}", f"legal here: {legal}")
    if not raw:
        _fail(text, 0, "no loop letter", "write one letter per declared loop, e.g. 'aBC'")
    counts = [0] * nloops
    for r in raw:
        counts[LETTERS.index(r[0].lower())] += 1
    for k, n in enumerate(counts):
        if n == 0:
            _fail(text, len(body), f"loop '{LETTERS[k]}' does not appear",
                  f"write every declared loop at least once (letters a-{LETTERS[nloops - 1]})")
        if n > MAX_BLOCKING + 1:
            pos = [r[1] for r in raw if r[0].lower() == LETTERS[k]][MAX_BLOCKING + 1]
            _fail(text, pos, f"loop '{LETTERS[k]}' is written {n} times", f"block it at most {MAX_BLOCKING} times")
    seen = [0] * nloops
    levels = []
    for letter, pos, _, axis, teams, barrier in raw:
        k = LETTERS.index(letter.lower())
        levels.append(Level(k, seen[k], seen[k] == counts[k] - 1, letter.isupper(), pos, axis, teams, barrier))
        seen[k] += 1
    for k, b in enumerate(bake):
        if b[3] is not None and len(b[3]) < counts[k] - 1:
            _fail(text, baked_at[k], f"loop '{LETTERS[k]}' is written {counts[k]} times but {len(b[3])} "
                  "block sizes are baked", f"bake {counts[k] - 1} block sizes or write '()' to keep the declared ones")
    spec = Spec(text, tuple(levels), nloops, "serial", schedule=schedule,
                bake=tuple(tuple(b) for b in bake), occurrences=tuple(counts))
    return _check_parallel(spec, at)


def _parse_bake(text, pos, inner):
    m = re.compile(r"^([^,]*),([^,]*),([^,]*),\(([^)]*)\)\Z").match(inner)
    if not m:
        _fail(text, pos, f"cannot read baked bounds [{inner}]",
              "write [start,end,step,(b0,b1,...)]; fields may be empty, e.g. [,,4,()]")
    vals = []
    for g in range(1, 4):
        s = m.group(g).strip()
        if s and not _INT.fullmatch(s):
            _fail(text, pos + 1 + m.start(g), f"{s!r} is not an integer", "write an integer or leave the field empty")
        what = f"the baked {('start', 'end', 'step')[g - 1]}"
        vals.append(_integer(text, pos + 1 + m.start(g), s, what, "write a number within +-2**61") if s else None)
    if vals[2] is not None and vals[2] < 1:
        _fail(text, pos + 1 + m.start(3), f"step {vals[2]} must be >= 1", "write a positive step")
    blocks = None
    if m.group(4).strip():
        blocks = []
        at_size = pos + 1 + m.start(4)
        for s in m.group(4).split(","):
            at = at_size + len(s) - len(s.lstrip())
            size = _integer(text, at, s, "a block size") if re.fullmatch(r"\s*[0-9]+\s*", s) else 0   # ASCII digits
            if size < 1:                                                                     # (isdigit() takes '²')
                _fail(text, at, f"block size {s.strip()!r} must be a positive integer",
                      "write positive block sizes, e.g. (32,8)")
            blocks.append(size)
            at_size += len(s) + 1
        blocks = tuple(blocks)
    return [vals[0], vals[1], vals[2], blocks]


def _check_parallel(spec, at):
    text, levels = spec.text, spec.levels
    par = [i for i, lv in enumerate(levels) if lv.parallel]
    on_grid = [i for i in par if levels[i].axis]
    if not par:
        if at >= 0:
            _fail(text, at, "a schedule needs a parallel loop", "upper-case a letter or drop '@schedule(...)'")
        return _check_barriers(spec)
    if on_grid:
        for i in par:
            if not levels[i].axis:
                _fail(text, levels[i].pos, f"'{text[levels[i].pos]}' is parallel but not on the thread grid that "
                      f"'{text[levels[on_grid[0]].pos]}' at position {levels[on_grid[0]].pos} starts",
                      "place every parallel loop on the grid ({R:n}, {C:n} or {L:n}) or write it lower case")
        if at >= 0:
            _fail(text, at, "a schedule applies to a collapsed parallel loop, not to a thread grid",
                  "drop '@schedule(...)' or the grid placements")
        grid, where = {"R": 1, "C": 1, "L": 1}, {}
        for i in par:
            lv = levels[i]
            if lv.axis in where:
                _fail(text, lv.pos, f"grid axis {lv.axis} is already used at position {where[lv.axis]}",
                      f"use another axis among {', '.join(a for a in AXES if a not in where) or 'none left'}")
            where[lv.axis] = lv.pos
            grid[lv.axis] = lv.teams
        spec = _replace(spec, mode="grid", grid=(grid["R"], grid["C"], grid["L"]))
    else:
        first, last = par[0], par[0]
        while last + 1 < len(levels) and levels[last + 1].parallel:
            last += 1
        for i in par:
            if i > last:
                _fail(text, levels[i].pos, f"'{text[levels[i].pos]}' is parallel but not adjacent to the parallel "
                      f"run at positions {levels[first].pos}-{levels[last].pos}: only one run of consecutive "
                      "upper-case letters is collapsed into the parallel loop",
                      "write it lower case, move it next to the run, or place the parallel loops on a thread "
                      "grid with {R:n}/{C:n}/{L:n}")
        seen = {}
        for i in range(first, last + 1):
            lv = levels[i]
            if lv.loop in seen:
                _fail(text, lv.pos, f"loop '{lv.letter}' appears twice in the collapsed run (also at position "
                      f"{seen[lv.loop]}); the inner block's range depends on the outer one",
                      "separate them with a serial letter or write one of them lower case")
            seen[lv.loop] = lv.pos
        spec = _replace(spec, mode="collapse", run=(first, last))
    return _check_barriers(spec)


def _check_barriers(spec):
    levels = spec.levels
    for i, lv in enumerate(levels):
        if not lv.barrier:
            continue
        outer = levels[:i]
        at = spec.text.index("|", lv.pos)      # after the letter's bounds and grid placement, if any
        if spec.mode == "collapse" and spec.run[0] <= i <= spec.run[1]:
            if i != spec.run[1]:
                _fail(spec.text, at, "a barrier inside a collapsed parallel run would be reached a different "
                      "number of times by each thread", "put '|' after the last letter of the run")
            outer = levels[:spec.run[0]]
        bad = [v for v in outer if v.parallel]
        if bad:
            _fail(spec.text, at, f"this barrier is inside the parallel loop '{spec.text[bad[0].pos]}' at "
                  f"position {bad[0].pos}, so threads would reach it a different number of times",
                  "put '|' only after loops that every thread runs alike (outside all parallel loops)")
    return spec


def _replace(spec, **kw):
    from dataclasses import replace
    return replace(spec, **kw)


def level_ranges(level, loop, x, hi):
    """(lo, hi, stride) of ``level`` given the values ``x``/``hi`` of the levels so far (by level name).

    >>> lp = Loop(0, 10, blocks=[4]); s = parse("aa", 1)
    >>> level_ranges(s.levels[1], lp, {"a0": 8}, {"a0": 10})
    (8, 10, 1)
    """
    if level.occurrence == 0:
        lo, top = loop.start, loop.end
    else:
        prev = f"{level.letter}{level.occurrence - 1}"
        lo, top = x[prev], min(x[prev] + loop.blocks[level.occurrence - 1], hi[prev])
    stride = loop.step if level.last else loop.blocks[level.occurrence]
    return lo, top, stride


def serial_order(spec, loops):
    """The logical index tuples in the order a serial run of ``spec`` visits them.

    >>> serial_order(parse("ba", 2), (Loop(0, 2), Loop(0, 3, blocks=[2])))
    [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    """
    loops = spec.resolve(loops)
    out, x, hi = [], {}, {}

    def walk(i):
        if i == len(spec.levels):
            out.append(tuple(x[f"{LETTERS[k]}{spec.occurrences[k] - 1}"] for k in range(spec.nloops)))
            return
        lv = spec.levels[i]
        lo, top, stride = level_ranges(lv, loops[lv.loop], x, hi)
        hi[lv.name] = top
        for v in range(lo, top, stride):
            x[lv.name] = v
            walk(i + 1)
    walk(0)
    return out
