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
    loops = parse_description(description) if isinstance(description, str) else list(description)
    base = "".join(letter * (blockings + 1) for letter, blockings, _ in loops)
    first = {letter: base.index(letter) for letter, _, _ in loops}
    par = [letter for letter, _, p in loops if p]
    seen, out = set(), []
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
                out.append(s)
    return out


def enumerate_union(loops, max_blockings):
    """The union over blockings 0..max of each loop: ``loops`` is [(letter, parallelizable)].

    >>> len(enumerate_union([("a", False), ("b", True), ("c", True)], {"a": 0, "b": 2, "c": 2}))
    1040
    """
    import itertools
    ranges = [range(max_blockings.get(letter, 0) + 1) for letter, _ in loops]
    seen, out = set(), []
    for combo in itertools.product(*ranges):
        desc = [(letter, k, p) for (letter, p), k in zip(loops, combo)]
        for s in enumerate_specs(desc):
            if s not in seen:
                seen.add(s)
                out.append(s)
    return out
