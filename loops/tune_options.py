"""The argument checks of :mod:`loops.tune`: a tuning option, search space or hint of the wrong
type or out of range raises TypeError / ValueError (:class:`loops.SpecError` for a spec) naming
the fix, before anything is timed.

>>> check_options("search", seconds=0)
Traceback (most recent call last):
...
ValueError: search: seconds=0; expected a positive number of seconds (the wall-clock budget), or None for no limit
"""
import time

import numpy as np

from .spec import LETTERS, MAX_BLOCKING, SpecError, parse

_LEAST = {"budget": 1, "top": 1, "reps": 1, "refine": 0}


def check_options(who, seconds=None, rtol=0.0, probe=0, machine=None, flags=(), **counts):
    """TypeError/ValueError for a tuning option of the wrong type or out of range (before any run).

    >>> check_options("tune", reps=0)
    Traceback (most recent call last):
    ...
    ValueError: tune: reps=0; expected an int >= 1, e.g. reps=5
    """
    for name, value in counts.items():
        if value is None and name == "top":
            continue
        least = _LEAST[name]
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{who}: {name}={value!r}; expected an int >= {least}, e.g. {name}={max(least, 5)}"
                            + (" (or None: no limit)" if name == "top" else ""))
        if value < least:
            raise ValueError(f"{who}: {name}={value!r}; expected an int >= {least}, e.g. {name}={max(least, 5)}")
    _check_real(who, "seconds", seconds, "a positive number of seconds (the wall-clock budget), or None for no limit",
                lambda v: v > 0, none_ok=True)
    _check_real(who, "rtol", rtol, "a relative tolerance >= 0, e.g. rtol=1e-4", lambda v: v >= 0)
    _check_real(who, "probe", probe, "seconds >= 0 between probes of the machine's speed (0: never)", lambda v: v >= 0)
    for name, value in dict(flags).items():
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{who}: {name}={value!r}; expected True or False")
    if machine is not None:
        from .cost import Machine
        if not isinstance(machine, Machine):
            raise TypeError(f"{who}: machine={machine!r}; expected a loops.cost.Machine (e.g. "
                            "Machine.host(threads)) or None for the host's")


def _check_real(who, name, value, expected, ok, none_ok=False):
    if value is None and none_ok:
        return
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{who}: {name}={value!r}; expected {expected}")
    try:
        finite = bool(np.isfinite(float(value)))
    except OverflowError:                       # an int past a float's range (2**1100): not a budget
        finite = False
    if not finite or not ok(value):
        raise ValueError(f"{who}: {name}={value!r}; expected {expected}")


def check_search_space(who, lk, specs, blocks, until=None):
    """SpecError for a spec of ``specs`` that ``lk`` cannot take, TypeError/ValueError for a ``specs``
    or ``blocks`` of the wrong form: found before anything is timed. With ``until`` (a
    ``time.perf_counter()`` value), the specs are parsed and bound only until then (the first one
    always; the budget of a search bounds a list of 50,000 too): a later one that ``lk`` cannot
    take is skipped when its turn comes, with its error as the note."""
    if specs is not None:
        if isinstance(specs, (str, bytes)) or not isinstance(specs, (list, tuple)):
            raise TypeError(f"{who}: specs={specs!r}; expected a list of spec strings, e.g. specs=['aBC', 'aCB'] "
                            "(or None: searched)")
        if not specs:
            raise ValueError(f"{who}: specs=[] gives nothing to time; list one spec at least, or pass None to search")
        for text in specs:
            if not isinstance(text, str):
                raise TypeError(f"{who}: specs holds {type(text).__name__} {text!r}; each spec is a string, e.g. 'aBC'")
        refused, checked = [], 0
        for text in specs:
            if checked and until is not None and time.perf_counter() > until:
                return _check_blocks(who, lk, blocks)
            checked += 1
            parse(text, len(lk.loops))          # a malformed spec: SpecError naming the position
            try:
                lk.with_spec(text)              # refused by these loops (a parallel=False loop in upper case, ...)
            except SpecError as e:
                refused.append(e)
        if len(refused) == len(specs):          # such a candidate is skipped (and counted), unless all are
            raise refused[0]
    _check_blocks(who, lk, blocks)


def _check_blocks(who, lk, blocks):
    if isinstance(blocks, (bool, np.bool_)):
        return
    if not isinstance(blocks, dict):
        raise TypeError(f"{who}: blocks={blocks!r}; expected True (block every loop once), False, or a dict "
                        "loop letter -> times blocked, e.g. blocks={'a': 2}")
    letters = LETTERS[:len(lk.loops)]
    for letter, times in blocks.items():
        if not isinstance(letter, str) or letter not in letters:
            raise ValueError(f"{who}: blocks has the key {letter!r}; keys are the letters of the declared loops "
                             f"({', '.join(letters)}), e.g. blocks={{'a': 1}}")
        if (isinstance(times, (bool, np.bool_)) or not isinstance(times, (int, np.integer))
                or not 0 <= times <= MAX_BLOCKING):
            raise ValueError(f"{who}: blocks[{letter!r}]={times!r}; expected how many times to block loop "
                             f"'{letter}', an int >= 0 and <= {MAX_BLOCKING} (a spec blocks a loop at most "
                             f"{MAX_BLOCKING} times), e.g. blocks={{{letter!r}: 1}}")


def check_hints(who, hints):
    """``hints`` as a list of dicts with a ``"knobs"`` dict and a ``"spec"`` string; TypeError naming
    the form for anything else.

    >>> check_hints("search", [{"knobs": {"bm": 64}, "spec": "aBC", "seconds": 0.1}])
    [{'knobs': {'bm': 64}, 'spec': 'aBC', 'seconds': 0.1}]
    >>> check_hints("search", {"spec": "aBC"})
    Traceback (most recent call last):
    ...
    TypeError: search: hints={'spec': 'aBC'}; expected a list of records, each a dict with 'knobs' (a dict) and 'spec' (a str), e.g. hints=[{'knobs': {'bm': 64}, 'spec': 'aBC'}] (another search's record)
    """
    form = ("expected a list of records, each a dict with 'knobs' (a dict) and 'spec' (a str), "
            "e.g. hints=[{'knobs': {'bm': 64}, 'spec': 'aBC'}] (another search's record)")
    if not isinstance(hints, (list, tuple)):
        raise TypeError(f"{who}: hints={hints!r}; {form}")
    for h in hints:
        if not (isinstance(h, dict) and isinstance(h.get("knobs"), dict) and isinstance(h.get("spec"), str)):
            raise TypeError(f"{who}: hints holds {h!r}; {form}")
    return list(hints)
