"""The display defects found by fz11c: explain() and the notebook view of a huge nest are computed
without listing its iterations, a body's message-less exception is a tuning note, reprs never
raise (malformed TPPASM_NUM_THREADS, a body whose __name__ is not a str), terminal text built
from user text has its control characters escaped, a spec's huge numbers are SpecErrors, and the
interpreter's errors survive pickling."""
import copy
import pickle
import time

import numpy as np
import pytest

import isa.pool as pool_module
import tppasm as tpp
from isa.pool import Pool
from isa.x86.interp.base import MemoryFault, UnsupportedInstruction
from loops import Loop, SpecError, kernel
from loops.explain import _static_share
from loops.spec import parse
from loops.trial import first_line
from loops.tune import search
from loops.tune_progress import Progress

zero = tpp.zero(2, 2)


@pytest.mark.parametrize("spec, thread0", [
    ("AB", "333333333334 of 1000000000000 iterations (i, j) = (0, 0), (0, 1), (0, 2), (0, 3), ..."),
    ("AB@schedule(static,3)", "333333333334 of 1000000000000 iterations (i, j) = (0, 0), (0, 1), (0, 2), (0, 9), ..."),
    ("AB@schedule(dynamic,5)", "chunks of 5 of the 1000000000000 iterations as it takes them"),
    ("Ab", "333334 of 1000000 iterations (i) = (0,), (1,), (2,), (3,), ...")])
def test_explain_of_a_huge_nest_takes_no_time(spec, thread0):
    k = kernel(spec, Loop(0, 10**6), Loop(0, 10**6), pool=Pool(3))(lambda i, j: None)
    try:
        start = time.perf_counter()
        text, page = k.explain(), k._repr_html_()
        assert time.perf_counter() - start < 2          # was: minutes and gigabytes (MemoryError at 2**40)
    finally:
        k.pool.close()
    assert "no pseudo-code" not in page
    assert "# thread 0: " + thread0 in text
    assert text.count("# thread ") == 3


def test_static_share_counts_as_listing_would():
    for n in range(30):
        for T in range(1, 5):
            for chunk in range(5):
                for t in range(T):
                    if chunk:
                        qs = [q for c in range(t, -(-n // chunk), T)
                              for q in range(c * chunk, min(n, c * chunk + chunk))]
                    else:
                        quot, rem = divmod(n, T)
                        qs = list(range(t * quot + min(t, rem), t * quot + min(t, rem) + quot + (t < rem)))
                    assert _static_share(t, T, n, chunk) == (len(qs), qs[:4])


def test_explain_says_one_thread():
    k = kernel("A", Loop(0, 4), pool=Pool(1))(lambda i: None)
    try:
        assert "# nest 'A': 1 thread; " in k.explain()
    finally:
        k.pool.close()


def _clear_maker(bm, message):
    X = np.ones((16 // bm, 2, 2), np.float32)

    @kernel("A", Loop(0, 16 // bm))
    def clear(i, X):
        if bm == 8:
            raise ValueError(message) if message is not None else ValueError
        zero(X[i])
    return clear, (X,), lambda: X


@pytest.mark.parametrize("message", [None, "", "\nsecond line"])
def test_search_skips_a_body_raising_without_message(message):
    found = search(lambda bm: _clear_maker(bm, message), {"bm": [4, 8]}, seconds=20, progress=False,
                   remember=False)
    assert found.record["knobs"] == {"bm": 4}
    skipped = [c.note for c in found.candidates if c.config == {"bm": 8}]
    assert skipped and all(skipped)
    assert skipped[0] == ("second line" if message else "ValueError")


def test_first_line():
    assert first_line(IndexError()) == "IndexError"
    assert first_line(ValueError("  \n x \n y")) == "x"


@pytest.mark.parametrize("value", ["abc", "0", "1.5", "100000"])
def test_repr_with_malformed_num_threads_does_not_raise(monkeypatch, value):
    k = kernel("A", Loop(0, 4))(lambda i: None)
    monkeypatch.setattr(pool_module, "_pool", None)      # the pool is made on first use, from the variable
    monkeypatch.setenv("TPPASM_NUM_THREADS", value)
    text, page = repr(k), k._repr_html_()
    assert f"? threads (TPPASM_NUM_THREADS={value!r}: expected" in text
    assert f"TPPASM_NUM_THREADS=&#x27;{value}&#x27;" in page
    with pytest.raises(ValueError, match="TPPASM_NUM_THREADS"):
        k.explain()


def test_html_of_a_body_whose_name_is_not_a_str():
    class Body:
        __name__ = 42

        def __call__(self, i, X):
            zero(X[i])
    k = kernel("A", Loop(0, 4))(Body())
    k(np.ones((4, 2, 2), np.float32))
    assert "<b>Body</b>" in k._repr_html_()
    assert repr(k).startswith("<LoopKernel Body(X) ")


def test_repr_escapes_a_body_name_with_controls():
    def body(i):
        pass
    body.__name__ = "b\x1b[2J\r"
    text = repr(kernel("a", Loop(0, 4))(body))
    assert "\x1b" not in text and "\r" not in text and "b\\x1b[2J\\r" in text


def test_progress_line_escapes_controls(capsys):
    bar = Progress(1, enabled=True)
    bar.step(type("C", (), {"spec": "A", "config": {"mode": "x\x1b]0;PWNED\x07\x1b[2J\n\x9b\x7f"},
                            "seconds": 0.001})())
    err = capsys.readouterr().err
    assert err.endswith("\n") and err.count("\n") == 1
    assert not any(c in err for c in "\x1b\x07\x9b\x7f")
    assert "mode=x\\x1b]0;PWNED\\x07\\x1b[2J\\n\\x9b\\x7f" in err


@pytest.mark.parametrize("spec, shown", [("ab\x1b]0;PWNED\x07x", "ab\\x1b]0;PWNED\\x07x"), ("ab\nx", "ab\\nx"),
                                         ("a\u0301x", "a\\u0301x"), ("\uff41x", "\\uff41x"), ("a\x7fb", "a\\x7fb")])
def test_spec_error_caret_escaped_and_aligned(spec, shown):
    with pytest.raises(SpecError) as e:
        parse(spec, 2)
    first, text, caret = str(e.value).split("\n")
    assert text == "  " + shown
    pos = int(first.split("position ")[1].split(" ")[0])
    assert caret.index("^") == 2 + len(spec[:pos].encode("ascii", "backslashreplace"))
    assert text[caret.index("^")] in (spec[pos], "\\")


@pytest.mark.parametrize("spec", ["a@schedule(dynamic,{})", "a[0,{},1,()]", "a[,,{},()]", "a[-{},,,()]",
                                  "aa[,,,({})]", "A{{R:{}}}"])
def test_spec_with_a_huge_number_is_a_spec_error(spec):
    text = spec.format("9" * 5000)
    with pytest.raises(SpecError, match=r"position \d+ .* has 5000 digits; write a"):
        parse(text, 1 + text.count("a[,,,("))


def test_spec_numbers_with_leading_zeros_still_parse():
    assert parse("a[0," + "0" * 30 + "12,1,(0004)]", 1).bake[0] == (0, 12, 1, (4,))


@pytest.mark.parametrize("error", [MemoryFault(0x1000, 8, ip=0x40, text="mov rax, [rbx]"),
                                   MemoryFault(0x20, 4, "misaligned"),
                                   UnsupportedInstruction("vfoo", "why", 0x10, "vfoo"),
                                   UnsupportedInstruction("vbar")])
def test_interpreter_errors_survive_pickling(error):
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error) and back.args == error.args
    assert vars(back) == vars(error)


def test_kernel_loaded_from_disk_says_so():
    k = copy.copy(tpp.relu(4, 8))
    k.from_disk = True
    assert ", loaded from disk in " in repr(k) and "JIT" not in repr(k).split("bytes")[1]
    assert "load time (disk cache)" in k._repr_html_()
    k.from_disk = False
    assert ", JIT " in repr(k) and "JIT time" in k._repr_html_()


def test_a_body_whose_name_is_no_string_is_named_by_its_class():
    relu = tpp.relu(4, 8)

    class Body:
        __name__ = 42

        def __call__(self, i, X, Y):
            relu(X[i], Y[i])

    lk = kernel("A", Loop(0, 2))(Body())
    assert lk.__name__ == "Body" and "Body" in repr(lk) and "Body" in lk._repr_html_()
