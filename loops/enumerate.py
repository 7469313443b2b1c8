"""The paper's loop-spec enumerator (PARLOOPER's ``loop_permute_generator``), reimplemented.

Input: per loop a letter, how many times it is blocked, and its type (``M``/``N`` parallelizable,
``K``/``-`` not), e.g. ``"a_0_K,b_1_M,c_1_N"``. Each letter is written (blockings + 1) times; for
every non-empty subset of the parallelizable loops the first occurrence of each chosen loop is
upper-cased; all distinct permutations are formed; adjacent equal letters are merged; upper-case
letters two or more positions after the first one are lower-cased (they could not be collapsed)
and equal neighbours merged again; duplicates are dropped, first occurrence kept.

>>> specs = enumerate_specs("a_0_K,b_0_M,c_0_N")
>>> len(specs), sorted(specs)[:4]
(16, ['BCa', 'Bac', 'Bca', 'CBa'])
"""
import itertools

from .spec import LETTERS


def parse_description(text):
    """``"a_0_K,b_1_M"`` -> [("a", 0, False), ("b", 1, True)].

    >>> parse_description("a_0_K,b_2_M")
    [('a', 0, False), ('b', 2, True)]
    """
    out = []
    for item in text.split(","):
        parts = item.strip().split("_")
        if len(parts) != 3 or len(parts[0]) != 1 or not parts[1].isdigit():
            raise ValueError(f"loop description {item!r}: write letter_blockings_type, e.g. 'b_1_M'")
        out.append((parts[0].lower(), int(parts[1]), parts[2][:1].upper() in ("M", "N")))
    return out


def _distinct_permutations(chars):
    chars = sorted(chars)
    n = len(chars)
    used = [False] * n
    cur = []

    def rec():
        if len(cur) == n:
            yield "".join(cur)
            return
        prev = None
        for i in range(n):
            if used[i] or chars[i] == prev:
                continue
            prev = chars[i]
            used[i] = True
            cur.append(chars[i])
            yield from rec()
            cur.pop()
            used[i] = False
    return rec()


def _squeeze(s):
    return "".join(c for i, c in enumerate(s) if i == 0 or c != s[i - 1])


def _collapsible(s):
    first = next((i for i, c in enumerate(s) if c.isupper()), None)
    if first is None:
        return s
    return s[:first + 2] + s[first + 2:].lower()


def enumerate_specs(description):
    """All candidate specs for ``description`` (see the module docstring), in generation order.

    >>> len(enumerate_specs("a_0_K,b_1_M,c_1_N"))
    168
    """
    return list(iter_specs(description))


def iter_specs(description):
    """:func:`enumerate_specs` one spec at a time (a search can stop before the last)."""
    loops = parse_description(description) if isinstance(description, str) else list(description)
    base = "".join(letter * (blockings + 1) for letter, blockings, _ in loops)
    first = {letter: base.index(letter) for letter, _, _ in loops}
    par = [letter for letter, _, p in loops if p]
    seen = set()
    subsets = range(1, 1 << len(par)) if par else [0]
    for mask in subsets:
        chars = list(base)
        for j, letter in enumerate(par):
            if mask >> j & 1:
                chars[first[letter]] = letter.upper()
        for perm in _distinct_permutations(chars):
            s = _squeeze(_collapsible(_squeeze(perm)))
            if s not in seen:
                seen.add(s)
                yield s


def enumerate_union(loops, max_blockings):
    """The union over blockings 0..max of each loop: ``loops`` is [(letter, parallelizable)].

    >>> len(enumerate_union([("a", False), ("b", True), ("c", True)], {"a": 0, "b": 2, "c": 2}))
    1040
    """
    return list(iter_union(loops, max_blockings))


def iter_union(loops, max_blockings):
    """:func:`enumerate_union` one spec at a time."""
    ranges = [range(max_blockings.get(letter, 0) + 1) for letter, _ in loops]
    seen = set()
    for combo in itertools.product(*ranges):
        desc = [(letter, k, p) for (letter, p), k in zip(loops, combo)]
        for s in iter_specs(desc):
            if s not in seen:
                seen.add(s)
                yield s


def block_sizes(trip, step=1, most=4):
    """Block sizes worth trying for a loop of ``trip`` iterations of ``step``: powers of two
    iterations from 2 up to half the trip, the ``most`` largest (smaller blocks only add loop
    overhead), as multiples of ``step``.

    >>> block_sizes(16), block_sizes(100, step=4), block_sizes(3)
    ([2, 4, 8], [16, 32, 64, 128], [])
    """
    sizes = []
    p = 2
    while p <= trip // 2:
        sizes.append(p * step)
        p *= 2
    return sizes[-most:] if most else sizes


def block_tuples(sizes, times):
    """Nested block sizes for a loop blocked ``times`` times: decreasing, each dividing the one before.

    >>> block_tuples([2, 4, 8], 2)
    [(4, 2), (8, 2), (8, 4)]
    """
    if times == 0:
        return [()]
    out = [(s,) for s in sizes]
    for _ in range(times - 1):
        out = [t + (s,) for t in out for s in sizes if s < t[-1] and t[-1] % s == 0]
    return sorted(out)


def bake_blocks(spec, blocks):
    """``spec`` with the block sizes of ``blocks`` (letter -> tuple) baked after each loop's first letter.

    >>> bake_blocks("bcaBCb", {"b": (8, 4), "c": (2,)})
    'b[,,,(8,4)]c[,,,(2)]aBCb'
    """
    out, seen = [], set()
    for ch in spec:
        out.append(ch)
        letter = ch.lower()
        if ch.isalpha() and letter not in seen:
            seen.add(letter)
            if blocks.get(letter):
                out.append("[,,,(" + ",".join(map(str, blocks[letter])) + ")]")
    return "".join(out)


def spec_space(loops, blockings, most=4):
    """Specs over ``loops`` (:class:`loops.Loop`, letter a first) with every loop blocked up to
    ``blockings[letter]`` times and each blocking's sizes from :func:`block_sizes` baked in.

    >>> from loops import Loop
    >>> space = spec_space([Loop(0, 4, parallel=False), Loop(0, 16)], {"b": 1})
    >>> len(space), space[:2], "aB[,,,(8)]b" in space
    (20, ['Ba', 'aB'], True)
    """
    return list(iter_spec_space(loops, blockings, most))


def iter_spec_space(loops, blockings, most=4):
    """:func:`spec_space` one spec at a time: a search with a deadline stops taking them."""
    desc = [(LETTERS[i], lp.parallel and lp.trip > 1) for i, lp in enumerate(loops)]
    sizes = {LETTERS[i]: block_sizes(lp.trip, lp.step, most) for i, lp in enumerate(loops)}
    limits = {k: min(v, most_blockings(sizes[k])) for k, v in blockings.items()}
    for spec in iter_union(desc, limits):
        choices = [(k, block_tuples(sizes[k], spec.lower().count(k) - 1)) for k in sizes if spec.lower().count(k) > 1]
        for combo in itertools.product(*[c for _, c in choices]):
            yield bake_blocks(spec, {k: t for (k, _), t in zip(choices, combo)})


def most_blockings(sizes, most=5):
    """How many times a loop with block ``sizes`` can be blocked: the longest chain of nested sizes
    (:func:`block_tuples`), at most ``most``. A larger count would only add letters to permute.

    >>> most_blockings([2, 4, 8]), most_blockings([2]), most_blockings([])
    (3, 1, 0)
    """
    times = 0
    while times < most and block_tuples(sizes, times + 1):
        times += 1
    return times
