"""Tuning results across processes (loops.remembered): a later process takes an earlier search's
winner, checked first, or resumes the search from it; nothing is applied to other code, shapes,
knob spaces or thread counts, and a damaged record costs a search, never a wrong result."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tppasm as tpp
from loops import Loop, kernel, remembered
from loops.trial import Built
from loops.tune import REMEMBERED, search
from tppasm import cache

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tppasm as tpp
    from loops import Loop, kernel
    from loops.tune import search

    def make(bm):
        zero = tpp.zero(bm, 8)
        X = np.ones((64 // bm, bm, 8), np.float32)

        @kernel("A", Loop(0, 64 // bm))
        def clear(i, X):
            zero(X[i])
        return clear, (X,), lambda: X.reshape(64, 8)

    found = search(make, {"bm": [4, 8, 16]}, seconds=20, top=6, reps=1, progress=False, resume="resume" in sys.argv)
    r = found.record
    print(json.dumps({k: r.get(k) for k in ("spec", "knobs", "runs", "recalled", "resumed", "timed")}))
    """)


def _zeroing():
    """make(bm, wrong) clearing 64 x 8 floats; wrong=True leaves the last block alone (a wrong result)."""
    def make(bm, wrong=False):
        zero = tpp.zero(bm, 8)
        X = np.ones((64 // bm, bm, 8), np.float32)
        blocks = 64 // bm - (1 if wrong else 0)

        @kernel("A", Loop(0, blocks))
        def clear(i, X):
            zero(X[i])
        return clear, (X,), lambda: X.reshape(64, 8)
    return make


def test_a_later_process_takes_the_remembered_winner_or_resumes_from_it(tmp_path):
    script = tmp_path / "search.py"
    script.write_text(SCRIPT)

    def run(*args, **env):
        done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "TPPASM_CACHE_DIR": str(tmp_path / "cache"), **env})
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])
    first = run()
    assert not first["recalled"] and first["runs"] == 1 and first["timed"] >= 2
    again = run()
    assert again["recalled"] and (again["spec"], again["knobs"]) == (first["spec"], first["knobs"])
    resumed = run("resume")
    assert resumed["resumed"] and not resumed["recalled"] and resumed["runs"] == 2
    assert run("resume")["runs"] == 3
    off = run(TPPASM_CACHE="0")
    assert not off["recalled"] and off["runs"] == 1


def test_a_remembered_record_is_checked_before_use(tmp_path):
    make = _zeroing()
    knobs = {"bm": [8, 16], "wrong": [False, True]}
    key = ("test_remembered", "checked")
    with cache.using(tmp_path):
        try:
            found = search(make, knobs, seconds=10, top=6, reps=1, progress=False, key=key)
            assert found.record["knobs"]["wrong"] is False           # a wrong configuration never wins
            REMEMBERED.pop(key)
            disk = remembered.disk_key(key, [dict(zip(knobs, v)) for v in ((8, False), (8, True), (16, False),
                                                                           (16, True))],
                                       None, True, make, make(8)[0], found.record["threads"])
            assert remembered.load(disk, [found.record["knobs"]]) is not None
            for damage in ({"knobs": {"bm": 8, "wrong": True}},      # its result differs from the reference's
                           {"spec": "Z"},                            # not a spec of these loops
                           {"knobs": {"bm": 32, "wrong": False}}):   # not in the space searched
                cache.remember("tune", disk, {**found.record, **damage})
                REMEMBERED.pop(key, None)
                again = search(make, knobs, seconds=10, top=6, reps=1, progress=False, key=key)
                assert not again.record.get("recalled") and again.record["knobs"]["wrong"] is False
                X = again.arrays[0]
                X[...] = np.nan
                again()
                assert (again.output() == 0).all()
        finally:
            REMEMBERED.pop(key, None)


def test_the_key_holds_what_the_result_depends_on():
    make = _zeroing()
    lk = make(8)[0]
    args = dict(key=("k",), configs=[{"bm": 8}], specs=None, blocks=True, make=make, lk=lk, threads=1)
    key = remembered.disk_key(**args)
    again = _zeroing()
    assert key == remembered.disk_key(**{**args, "make": again, "lk": again(8)[0]})      # the same code
    body = kernel("A", Loop(0, 8))(lambda i, X: None)
    for name, value in [("key", ("k", 2)), ("configs", [{"bm": 16}]), ("specs", ["a"]), ("blocks", False),
                        ("make", lambda bm: 0), ("lk", body), ("threads", 2),
                        ("lk", make(8, wrong=True)[0]),                 # other loops, the same code
                        ("lk", lk.with_spec("A{R:2}")),                 # another spec declared
                        ("lk", kernel("A", Loop(0, 8), scratch=("X",))(lk.body))]:     # X declared scratch
        assert remembered.disk_key(**{**args, name: value}) != key, name


def test_the_code_digest_leaves_out_where_the_code_lies():
    """A notebook cell's file is named after the kernel's process: a new name every session."""
    source = "def make(bm):\n    def body(i, X):\n        X[i] = bm\n    return body\n"

    def compiled(text, filename):
        space = {}
        exec(compile(text, filename, "exec"), space)
        return space["make"]
    first = compiled(source, "/tmp/ipykernel_101/1234.py")
    later = compiled("\n\n" + source, "/tmp/ipykernel_202/1234.py")          # moved down, another file
    assert remembered.code_digest(first) == remembered.code_digest(later)
    assert remembered.code_digest(first(1)) == remembered.code_digest(later(1))
    changed = compiled(source.replace("= bm", "= bm + 1"), "/tmp/ipykernel_101/1234.py")
    assert remembered.code_digest(changed) != remembered.code_digest(first)


def test_records_that_are_not_plain_json_stay_in_the_process(tmp_path):
    with cache.using(tmp_path):
        assert remembered.store("k", {"spec": "a", "knobs": {"bm": 8}})
        assert not remembered.store("k2", {"spec": "a", "knobs": {"tile": (8, 8)}})
        assert remembered.load("k2", [{"tile": (8, 8)}]) is None
        assert remembered.load("k", [{"bm": 8}])["spec"] == "a" and remembered.load("k", [{"bm": 4}]) is None


def test_resume_needs_remember():
    with pytest.raises(ValueError, match="needs remember=True"):
        search(_zeroing(), {"bm": [8]}, progress=False, remember=False, resume=True)


def test_the_reference_run_leaves_shared_inputs_as_they_were():
    """The reference run poisons only the arrays the nest writes and never reads, never its inputs:
    the configurations of a search may share input arrays (bench.gemm's blocked A and B)."""
    shared = np.arange(32, dtype=np.float32).reshape(4, 8)
    out = np.zeros((4, 8), np.float32)
    add = tpp.binary("add", 4, 8)

    @kernel("a", Loop(0, 1))
    def twice(i, X, Y):
        add(X, X, Y)
    built = Built((twice, (shared, out)))
    want = built.reference()
    assert built.poison and built.outputs == {1}         # only Y, which the nest writes and never reads
    np.testing.assert_array_equal(shared, np.arange(32, dtype=np.float32).reshape(4, 8))
    np.testing.assert_array_equal(want[1], 2 * shared)


def test_lk_tune_remembers_on_request(tmp_path):
    zero = tpp.zero(4, 8)
    X = np.ones((8, 4, 4, 8), np.float32)

    @kernel("AB", Loop(0, 8), Loop(0, 4))
    def clear(i, j, X):
        zero(X[i, j])
    def forget_in_process():                                   # as a new process would start
        for key in set(REMEMBERED) - before:
            REMEMBERED.pop(key)
    before = set(REMEMBERED)
    with cache.using(tmp_path):
        best = clear.tune(X, budget=4, reps=1, progress=False, remember=True)
        assert len(clear.last_tuning) >= 2
        forget_in_process()
        assert clear.tune(X, budget=4, reps=1, progress=False, remember=True) == best
        assert [spec for spec, _, _ in clear.last_tuning] == [best]
        forget_in_process()
        clear.tune(X, budget=4, reps=1, progress=False)             # the default: tunes again
        assert len(clear.last_tuning) >= 2
    forget_in_process()


def test_a_resumed_search_times_new_candidates(tmp_path):
    make = _zeroing()
    key = ("test_remembered", "explore")
    with cache.using(tmp_path):
        try:
            first = search(make, {"bm": [4, 8, 16]}, seconds=10, top=4, reps=1, progress=False, key=key)
            before = {(tuple(c.config.items()), c.spec) for c in first.candidates if c.seconds is not None}
            again = search(make, {"bm": [4, 8, 16]}, seconds=10, top=4, reps=1, progress=False, key=key,
                           resume=True)
            now = {(tuple(c.config.items()), c.spec) for c in again.candidates if c.seconds is not None}
            reference = (tuple(first.candidates[0].config.items()), first.candidates[0].spec)
            winner = (tuple(first.record["knobs"].items()), first.record["spec"])
            assert now - before and now & before <= {reference, winner}
            assert set(first.record["explored"]) < set(again.record["explored"])
        finally:
            REMEMBERED.pop(key, None)


def test_the_code_digest_holds_the_kernels_a_body_closes_over():
    """Two bodies of one factory, one calling relu and one exp: the same code, other nests."""
    def make(op):
        k = tpp.unary(op, 4, 8)

        def body(i, X, Y):
            k(X[i], Y[i])
        return body
    relu, exp, relu_again = make("relu"), make("exp"), make("relu")
    assert remembered.code_digest(relu) != remembered.code_digest(exp)
    assert remembered.code_digest(relu) == remembered.code_digest(relu_again)
    assert remembered.code_digest(lambda x, n=1: x) != remembered.code_digest(lambda x, n=2: x)    # defaults
