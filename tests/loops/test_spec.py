"""The spec grammar: what parses to what, and a message naming the position for every bad spec."""
import numpy as np
import pytest

import tppasm as tpp
from loops import Loop, SpecError, kernel
from loops.spec import parse, serial_order


def test_levels_blocking_and_modes():
    s = parse("bcaBCb", 3)
    assert [(lv.letter, lv.occurrence, lv.last, lv.parallel) for lv in s.levels] == [
        ("b", 0, False, False), ("c", 0, False, False), ("a", 0, True, False),
        ("b", 1, False, True), ("c", 1, True, True), ("b", 2, True, False)]
    assert s.mode == "collapse" and s.run == (3, 4)
    assert parse("abc", 3).mode == "serial"
    g = parse("bC{R:2}aB{C:3}c", 3)
    assert g.mode == "grid" and g.grid == (2, 3, 1) and g.nthreads_needed == 6
    assert parse("A{L:2}B{R:1}", 2).grid == (1, 1, 2)


def test_barriers_schedules_and_bakes():
    s = parse("bc|aBC|b@schedule(dynamic,4)", 3)
    assert [lv.barrier for lv in s.levels] == [False, True, False, False, True, False]
    assert s.schedule == ("dynamic", 4)
    assert parse("aBC@schedule(static)", 3).schedule == ("static", 0)
    b = parse("a[0,64,2,(32,8)]aaBc", 3)
    assert b.bake[0] == (0, 64, 2, (32, 8)) and b.bake[1] == (None,) * 4
    assert parse("a[,,4,()]Bc", 3).bake[0] == (None, None, 4, None)


def test_bake_overrides_declaration():
    s = parse("a[1,7,2,(4)]a", 1)
    (lp,) = s.resolve([Loop(0, 100)])
    assert (lp.start, lp.end, lp.step, lp.blocks) == (1, 7, 2, (4,))
    assert serial_order(s, [Loop(0, 100)]) == [(1,), (3,), (5,)]


def test_serial_order_with_remainders():
    order = serial_order(parse("aa", 1), [Loop(0, 7, blocks=[3])])
    assert order == [(i,) for i in range(7)]
    order = serial_order(parse("aaa", 1), [Loop(1, 12, 2, blocks=[6, 4])])
    assert order == [(i,) for i in range(1, 12, 2)]


BAD = [
    ("", None, "non-empty"),
    ("aBx", 2, "only 3 loops are declared"),
    ("ab", 2, "loop 'c' does not appear"),
    ("aB1C", 2, "unexpected character '1'"),
    ("|aBC", 0, "'|' must follow a letter"),
    ("aB||C", 3, "two barriers"),
    ("aBc|", 3, "inside the parallel loop 'B'"),
    ("aB|C", 2, "inside a collapsed parallel run"),
    ("BaC", 2, "not adjacent to the parallel run"),
    ("aBCb", 1, None),                                    # legal: b blocked once
    ("aBbBc", 3, "not adjacent"),
    ("aBcB", 3, "not adjacent"),
    ("aBBc", 2, "appears twice in the collapsed run"),
    ("AB{R:2}c", 0, "not on the thread grid"),
    ("aB{R:2}C{R:2}", 7, "grid axis R is already used"),
    ("ab{R:2}c", 1, "serial but is placed on a thread grid"),
    ("aB{X:2}c", 2, "{R:n}, {C:n} or {L:n}"),
    ("aBC@schedule(guided)", 3, "@schedule(dynamic"),
    ("aBC@schedule(dynamic,0)", 21, "chunk must be in 1..2**31-1"),
    ("abc@schedule(static)", 3, "needs a parallel loop"),
    ("aB{R:2}c@schedule(static)", 8, "not to a thread grid"),
    ("a[0,4,x,()]bc", 6, "'x' is not an integer"),
    ("a[0,4,1]bc", 1, "[start,end,step,(b0,b1,...)]"),
    ("a[0,4,1,()]a[0,4,1,()]bc", 12, "already baked"),
    ("a[0,4,1,(2)]aabc", 1, "2 block sizes"),
    ("a[0,4,0,()]bc", 6, "step 0 must be >= 1"),
    ("abbbbbbbc", 7, "written 7 times"),
    ("a{R:2}Bc", 0, "serial but is placed"),
    ("aB[1,2,1,()", 2, "never closed"),
    # digits of other scripts, which int() reads, and a trailing newline
    ("aB{R:\u0662}c", 2, "cannot read the grid placement"),
    ("aBc@schedule(static,\u0663)", 3, "@schedule(dynamic"),
    ("aBc@schedule(dynamic,\uff13)", 3, "@schedule(dynamic"),
    ("a[\u0660,4,1,()]Bc", 2, "'\u0660' is not an integer"),
    ("aBc@schedule(static)\n", 3, "@schedule(dynamic"),
]


@pytest.mark.parametrize("text,pos,what", BAD)
def test_bad_specs_name_position_and_alternative(text, pos, what):
    if what is None:
        parse(text, 3)
        return
    with pytest.raises(SpecError) as e:
        parse(text, 3)
    msg = str(e.value)
    assert what in msg
    if pos is not None:
        assert f"position {pos} " in msg
        caret = msg.splitlines()[-1]
        assert caret.index("^") - 2 == pos
    assert ";" in msg.splitlines()[0] or "non-empty" in msg          # says what would be legal


def test_declaration_errors():
    with pytest.raises(SpecError, match="blocked 2 times.*blocks=\\[4\\]"):
        kernel("aaa", Loop(0, 8, blocks=[4]))(lambda i: None)
    with pytest.raises(SpecError, match="parallel=False"):
        kernel("A", Loop(0, 8, parallel=False))(lambda i: None)
    with pytest.raises(SpecError, match="multiple of step"):
        Loop(0, 8, 2, blocks=[3])
    with pytest.raises(SpecError, match="step=0"):
        Loop(0, 8, 0)
    with pytest.raises(SpecError, match=r"position 1 .*baked here, loop 'a' would be Loop\(0, 8, 2, blocks=\[3\]\)"
                                        r".*multiple of step=2.*bake its block sizes too"):
        kernel("ba[,,2,()]a", Loop(0, 8, blocks=[3]), Loop(0, 2))(lambda i, j: None)
    with pytest.raises(SpecError, match="first 2 parameters receive the loop indices"):
        kernel("ab", Loop(0, 2), Loop(0, 2))(lambda i: None)


@pytest.mark.parametrize("text, loops", [
    ("aba", [Loop(0, 8, blocks=[4]), Loop(0, 2)]),
    ("aaab", [Loop(0, 10, blocks=[6, 4]), Loop(0, 2)]),
    ("abab", [Loop(1, 12, 2, blocks=[6]), Loop(0, 5, blocks=[3])]),
], ids=["block-named-like-an-index", "uneven-blocks", "both-blocked"])
def test_explains_pseudo_code_runs_the_serial_order(text, loops):
    """explain()'s serial pseudo-code, run as Python, visits the nest's iterations in its order:
    a block's index named like the body's second index (i0) made the inner loop read the wrong one,
    and uneven blocks named an undefined bound."""
    zero = tpp.zero(1, 1)

    def body(i, i0, X):
        zero(X[i, i0])
    k = kernel(text, *loops)(body)
    X = np.ones((12, 5, 1, 1), np.float32)
    seen = []
    scope = {"zero": seen.append, "X": type("Index", (), {"__getitem__": lambda self, key: key})()}
    exec(k.explain(X), scope)
    scope["thread_body"](0)
    assert seen == serial_order(parse(text, 2), loops)
