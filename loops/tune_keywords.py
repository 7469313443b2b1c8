"""The keywords of ``lk.tune`` (:func:`loops.tune.tune`) and :func:`loops.tune.search`, which differ.

Both cap the candidates timed, under two names, and their defaults differ (``lk.tune`` is the quick
call on one kernel, ``search`` the long one over knobs, remembered on disk):

==========================================  ====================  ====================
option                                      ``lk.tune``           ``search``
==========================================  ====================  ====================
candidates timed at most (skipped: free)    ``budget=16``         ``top=None`` (all)
wall-clock limit                            ``seconds=None``      ``seconds=60.0``
block sizes searched                        ``blocks=False``      ``blocks=True``
runs per timing                             ``reps=5``            ``reps=3``
remembered on disk                          ``remember=False``    ``remember=True``
==========================================  ====================  ====================

``clock``, ``probe``, ``refine``, ``resume``, ``hints``, ``machine`` and ``key`` are ``search``'s
alone: ``search(lambda: (lk, arrays), {}, ...)`` tunes ``lk`` as ``lk.tune`` does (its calls on
such arrays then run the winner). A keyword of one given to the other raises a TypeError naming
the right one.

>>> check_keywords("search", {"budget": 8})
Traceback (most recent call last):
...
TypeError: search: budget=8 is lk.tune's name; search calls it top= (...): write top=8
"""
from tppasm.display import shown

RENAMED = {"tune": {"top": "budget"}, "search": {"budget": "top"}}
OTHER = {"tune": "loops.tune.search", "search": "lk.tune"}
SEARCH_ONLY = ("knobs", "machine", "key", "refine", "clock", "probe", "resume", "hints")


def check_keywords(who, unknown, known=()):
    """TypeError for the first keyword of ``unknown`` (name -> value) that ``who`` ("tune" or
    "search") does not take, naming what to write instead; ``known``: the keywords it takes."""
    for name, value in unknown.items():
        right = RENAMED[who].get(name)
        if right is not None:
            raise TypeError(f"{who}: {name}={shown(value)} is {OTHER[who]}'s name; {who} calls it {right}= (how many "
                            f"candidates are timed at most, skipped ones not counted): write {right}={shown(value)}")
        if who == "tune" and name == "knobs":
            raise TypeError("tune: knobs= is an option of loops.tune.search, not of lk.tune; write "
                            "loops.tune.search(make, knobs, top=...) with make(**knob_values) returning (lk, arrays)")
        if who == "tune" and name in SEARCH_ONLY:
            raise TypeError(f"tune: {name}= is an option of loops.tune.search, not of lk.tune; write "
                            f"loops.tune.search(lambda: (lk, arrays), {{}}, {name}=..., top=...): it tunes lk as "
                            "lk.tune does")
        raise TypeError(f"{who}() got an unexpected keyword argument {name!r}; it takes "
                        f"{', '.join(f'{k}=' for k in known)}")
