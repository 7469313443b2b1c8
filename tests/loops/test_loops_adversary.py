"""An adversarial pass over the loop DSL: specs drawn from the grammar (and past it), bounds at the edges
of what the declarations take, bodies that misbehave, several Python threads, fork, and the tuner's
options.

Every accepted spec is run natively on 1, 2 and 3 threads (``loops.set_num_threads``) with a body that
counts each visit of ``H[tid, i_a - start_a, ...]`` with a ``lock add`` kernel; the counts summed over
the threads must equal those of ``.python(...)`` and of :func:`loops.spec.serial_order`, each iteration
exactly once. Every refused one must raise :class:`SpecError` (a ValueError) saying what to write.
Scenarios that could hang (fork) run in a subprocess with a timeout.
"""
import inspect
import re
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import loops
import tppasm as tpp
import tppasm.kernel as tk
from isa.cpu import host
from isa.x86 import Function, dword, rdi
from loops import Loop, SpecError, TraceError, kernel, thread
from loops.spec import LETTERS, serial_order
from tests import scripts
from tppasm.kernel import Descriptor, Kernel
from tppasm.operand import OperandSpec

pytestmark = pytest.mark.skipif(host().arch != "x86_64", reason="the counting kernel is x86 code")

THREADS = (1, 2, 3)


# -- a kernel that counts visits: lock add dword [hits], 1 -------------------------------------

class Count(Descriptor):
    kind = "count"
    op = "count"

    def operands(self):
        return [OperandSpec("hits", "i32", (1, 1), (1, 1), writable=True)]

    def reference(self, hits):
        hits[0, 0] += 1


def _count_kernel():
    fn = Function("count", ["ptr"])
    fn.asm.add(dword[rdi], 1)
    fn.asm.instructions[-1].has_lock_prefix = True
    k = Kernel.__new__(Kernel)
    k.desc, k.isa, k.raw = Count(), "avx2", fn.finalize()
    k.operands, k.scalars = tuple(k.desc.operands()), ()
    k._native, k._n, k._defaults, k.checked_call = False, 1, (), True
    return k


COUNT = _count_kernel()


def counting_body(starts):
    """body(x_a, x_b, ..., H): COUNT(H[tid, x_a - start_a, ...]), one parameter per loop."""
    n = len(starts)

    def body(*args):
        idx, (h,) = args[:n], args[n:]
        count(h[(thread().tid,) + tuple(i - s for i, s in zip(idx, starts))])
    count = COUNT
    P = inspect.Parameter
    body.__signature__ = inspect.Signature([P(f"x{c}", P.POSITIONAL_OR_KEYWORD) for c in LETTERS[:n]]
                                           + [P("H", P.POSITIONAL_OR_KEYWORD)])
    return body


@pytest.fixture
def restore_threads():
    """Tests that call loops.set_num_threads leave the process's count as they found it."""
    before = loops.get_num_threads()
    yield
    loops.set_num_threads(before)


def expected_counts(lk, starts, shape):
    """Visits per (index - start) of a serial run of ``lk``'s spec, from loops.spec.serial_order."""
    want = np.zeros(shape, np.int32)
    for idx in serial_order(lk.spec, lk.loops):
        want[tuple(i - s for i, s in zip(idx, starts))] += 1
    return want


def check_every_thread_count(lk, starts, shape):
    """Run ``lk`` on 1, 2 and 3 threads; each iteration of the spec exactly once, as .python() runs it.
    A grid larger than the pool must be refused with the thread count to set, and only then."""
    want = expected_counts(lk, starts, shape)
    assert want.max(initial=0) <= 1, lk.spec.text
    hp = np.zeros((1,) + shape + (1, 1), np.int32)
    lk.python(hp)
    assert (hp[0, ..., 0, 0] == want).all(), lk.spec.text
    for nt in THREADS:
        loops.set_num_threads(nt)
        h = np.zeros((nt,) + shape + (1, 1), np.int32)
        need = lk.spec.nthreads_needed
        if need > nt:
            with pytest.raises(SpecError, match=re.escape(f"set_num_threads({need})")):
                lk(h)
            continue
        lk(h)
        assert (h.sum(0)[..., 0, 0] == want).all(), (lk.spec.text, lk.loops, nt)
        h[...] = 0
        lk(h)                                          # the fast path of a second call: the same visits
        assert (h.sum(0)[..., 0, 0] == want).all(), (lk.spec.text, lk.loops, nt, "second call")


def check_refusal(text, error):
    """A refused spec says where and what to write: a ';' before the advice, the caret under the
    position it names, and a '|' there when the message is about a barrier."""
    msg = str(error)
    assert ";" in msg.splitlines()[0], msg
    m = re.search(r"position (\d+) ", msg)
    if m and "characters" not in msg:
        pos = int(m.group(1))
        caret = msg.splitlines()[-1]
        assert caret.index("^") - 2 == pos, msg
        if "barrier" in msg:
            assert text[pos] == "|", msg


# -- 1. the grammar: drawn specs, accepted ones run, refused ones explained ---------------------

STARTS = [0, 1, -3, 2 ** 31 - 2, -(2 ** 31) - 1, 2 ** 32 - 1, 2 ** 40 + 7]
SCHEDULES = ["@schedule(static)", "@schedule(dynamic)", "@schedule(static,2)", "@schedule(dynamic,1)",
             "@schedule(dynamic,5)", "@schedule(static, 3)"]


@st.composite
def declarations(draw):
    """1-4 loops: starts near 0 and across 2**31 / 2**32, steps that need not divide, empty loops,
    block sizes that need not divide and may exceed the loop."""
    n = draw(st.integers(1, 4))
    out = []
    for _ in range(n):
        step = draw(st.sampled_from([1, 1, 2, 3]))
        start = draw(st.sampled_from(STARTS))
        trip = draw(st.integers(0, 6 if n < 3 else 3))
        end = start + trip * step - draw(st.integers(0, step - 1))
        blocks = draw(st.lists(st.integers(1, 9).map(lambda b, s=step: b * s), max_size=2))
        out.append(Loop(start, end, step, blocks))
    return out


@st.composite
def spec_texts(draw, decls):
    """Letters repeated up to 3 times in any order and case, bakes, grid placements and barriers
    anywhere, a schedule sometimes: many are refused, and each refusal must say why."""
    letters = [c for k in range(len(decls)) for c in LETTERS[k] * draw(st.integers(1, 3))]
    letters = draw(st.permutations(letters))
    text, baked = "", set()
    for c in letters:
        upper = draw(st.integers(0, 99)) < 35
        text += c.upper() if upper else c
        if c not in baked and draw(st.integers(0, 99)) < 12:
            baked.add(c)
            lp = decls[LETTERS.index(c)]
            end = draw(st.sampled_from(["", str(lp.end), str(lp.end - 1), str(lp.end + lp.step)]))
            step = draw(st.sampled_from(["", "1", "2", "3"]))
            sizes = ",".join(str(b) for b in draw(st.lists(st.integers(1, 7), max_size=2)))
            text += f"[{draw(st.sampled_from(['', str(lp.start)]))},{end},{step},({sizes})]"
        if upper and draw(st.integers(0, 99)) < 30:
            text += "{%s:%d}" % (draw(st.sampled_from("RCL")), draw(st.integers(1, 3)))
        if draw(st.integers(0, 99)) < 12:
            text += "|"
    if draw(st.integers(0, 99)) < 20:
        text += draw(st.sampled_from(SCHEDULES))
    return text


@settings(max_examples=400, suppress_health_check=[HealthCheck.function_scoped_fixture])   # restored once
@given(data=st.data())
def test_drawn_specs_run_each_iteration_once_on_any_thread_count_or_are_refused(data, restore_threads):
    decls = data.draw(declarations())
    text = data.draw(spec_texts(decls))
    starts = [lp.start for lp in decls]
    try:
        lk = kernel(text, *decls)(counting_body(starts))
    except SpecError as e:
        check_refusal(text, e)
        return
    eff = lk.resolved                          # bakes may move an end (never a start, drawn so)
    shape = tuple(max(1, lp.end - lp.start + 1) for lp in eff)
    check_every_thread_count(lk, starts, shape)


PAPER = ["aBC", "bcaBCb", "bC{R:16}aB{C:4}cb", "bc|aBCb@schedule(dynamic,1)", "aBCb", "aCb", "aBCbc", "aBCbcbc",
         "aB{R:8}C{C:8}", "bCAc", "cABa", "Afgbcde", "Afgbdced", "Afgbedcdc", "C{R:8}A{C:7}edcfgb",
         "A{C:4}C{R:14}ecfgbd", "CDabefg", "afgbEDc", "afgbCDE", "bC{R:5}B{C:4}cbA{L:3}",
         # the same shapes on grids that fit 1-3 threads
         "bC{R:3}aB{C:1}cb", "aB{R:1}C{C:3}", "C{R:1}A{C:3}edcfgb", "A{C:2}C{R:1}ecfgbd", "bC{R:1}B{C:1}cbA{L:3}",
         "bc|aBC|b@schedule(dynamic,4)", "a[0,4,1,()]BC", "a[1,5,2,()]|Bc", "aB{R:2}|", "a|b|cBC"]


def _paper_loops(text):
    letters = re.sub(r"\[[^]]*\]|\{[^}]*\}|@.*", "", text).replace("|", "")
    n = max(LETTERS.index(c.lower()) for c in letters) + 1
    trip = 5 if n <= 3 else 3
    return [Loop(0, trip, 1, blocks=[4, 2][:letters.lower().count(LETTERS[k]) - 1]) for k in range(n)]


@pytest.mark.parametrize("text", PAPER)
def test_the_papers_specs(text, restore_threads):
    decls = _paper_loops(text)
    lk = kernel(text, *decls)(counting_body([0] * len(decls)))
    shape = tuple(max(1, lp.end - lp.start + 1) for lp in lk.resolved)
    check_every_thread_count(lk, [0] * len(decls), shape)


@pytest.mark.parametrize("text, nloops", [
    ("aB{R:1}C{C:1}|", 3),                 # the barrier follows a grid placement
    ("Ab[0,5,,()]|", 2),                      # ... a bake
    ("bA{R:1}B{C:3}c[,5,,()]|", 3),
    ("aB[0,4,1,()]|C", 3),                 # inside a collapsed run, after a bake
    ("aB{R:1}C[0,4,1,(2)]{C:2}|c", 3),
])
def test_a_refused_barrier_is_pointed_at(text, nloops):
    """The caret of a refused barrier sits under the '|', not under the letter's '[' or '{'."""
    decls = [Loop(0, 5, blocks=[2])] * nloops
    with pytest.raises(SpecError, match="barrier") as e:
        kernel(text, *decls)(counting_body([0] * nloops))
    assert f"position {text.index('|')} ('|')" in str(e.value)
    check_refusal(text, e.value)


@pytest.mark.parametrize("text, what", [
    ("A{r:2}", "{R:n}, {C:n} or {L:n}"),   # the paper's lower-case axes: named, not guessed
    ("A{R: 2}", "{R:n}, {C:n} or {L:n}"),
    ("A{R:0}", "at least 1 team"),
    ("A{R:2}[0,4,1,()]", "'[' must directly follow a letter"),
    ("a B", "unexpected character ' '"),
    ("a\u00e9", "unexpected character"),
    ("\uff41", "unexpected character"),
    ("a@schedule(static)@schedule(static)", "cannot read"),
    ("A@schedule( static)", "cannot read"),
    ("A@schedule(dynamic,2147483648)", "chunk must be in 1..2**31-1"),
    ("|a", "'|' must follow a letter"),
    ("a[+1,4,1,()]", "'+1' is not an integer"),
    ("aaaaaaa", "written 7 times"),
])
def test_malformed_specs_are_spec_errors_naming_the_fix(text, what):
    assert issubclass(SpecError, ValueError)
    with pytest.raises(SpecError) as e:
        kernel(text, Loop(0, 4, blocks=[2] * 6))(counting_body([0]))
    assert what in str(e.value)
    check_refusal(text, e.value)


def test_the_largest_chunk_and_26_loops_blocked_five_times(restore_threads):
    assert kernel("A@schedule(dynamic,2147483647)", Loop(0, 4))(counting_body([0])).spec.schedule[1] == 2 ** 31 - 1
    decls = [Loop(0, 1, blocks=[1] * 5) for _ in range(26)]
    decls[0], decls[25] = Loop(0, 64, blocks=[32, 16, 8, 4, 2]), Loop(0, 7, blocks=[6, 5, 4, 3, 2])
    lk = kernel("".join(c * 5 for c in LETTERS) + LETTERS.upper(), *decls)(counting_body([0] * 26))
    check_every_thread_count(lk, [0] * 26, (65,) + (1,) * 24 + (8,))


# -- 2. bounds ----------------------------------------------------------------------------------

class Index:
    def __index__(self):
        return 3


@pytest.mark.parametrize("args, kwargs, what", [
    ((0.0, 4), {}, "start=0.0 must be an int"),
    ((0, 4.0), {}, "end=4.0 must be an int"),
    ((False, 4), {}, "start=False must be an int"),
    ((0, np.bool_(True)), {}, "must be an int"),
    ((0, Index()), {}, "must be an int"),
    ((0, "4"), {}, "must be an int"),
    ((0, None), {}, "must be an int"),
    ((5, 0, -1), {}, "step=-1 must be >= 1"),
    ((0, 4, 0), {}, "step=0 must be >= 1"),
    ((0, 2 ** 63), {}, "out of range"),
    ((np.uint64(2 ** 63), 0), {}, "out of range"),
    ((-(2 ** 61) + 1, 2 ** 61 - 1), {}, "spans"),
    ((0, 8, 2), {"blocks": [3]}, "multiple of step=2"),
    ((0, 8), {"blocks": 4}, "blocks=[4]"),
    ((0, 8), {"blocks": [0]}, "block size 0"),
    ((0, 8), {"blocks": [True]}, "block size True"),
    ((0, 8), {"blocks": {8, 4}}, "blocks=[8, 4]"),
    ((0, 8), {"parallel": 1}, "True or False"),
])
def test_loop_declarations_refused(args, kwargs, what):
    with pytest.raises(SpecError, match=re.escape(what)):
        Loop(*args, **kwargs)


def test_numpy_ints_are_plain_ints():
    lp = Loop(np.int64(2), np.int32(9), np.uint8(3), blocks=np.array([6], np.int16))
    assert (lp.start, lp.end, lp.step, lp.blocks, lp.trip) == (2, 9, 3, (6,), 3)
    assert all(type(v) is int for v in (lp.start, lp.end, lp.step) + lp.blocks)


@pytest.mark.parametrize("text", ["AB", "aB", "Ba", "ab", "A{R:1}B{C:2}", "AB@schedule(dynamic,1)", "aBab"])
@pytest.mark.parametrize("empty", [Loop(3, 3, blocks=[2]), Loop(7, 2, blocks=[2]), Loop(0, 0, 5, blocks=[5])])
def test_empty_and_reversed_loops_visit_nothing(text, empty, restore_threads):
    lk = kernel(text, Loop(0, 4, blocks=[2]), empty)(counting_body([0, empty.start]))
    check_every_thread_count(lk, [0, empty.start], (5, 8))
    assert expected_counts(lk, [0, empty.start], (5, 8)).sum() == 0


@pytest.mark.parametrize("start", [2 ** 31 - 3, 2 ** 32 - 3, -(2 ** 31) - 3, 3 * 2 ** 31 - 1, 2 ** 47])
@pytest.mark.parametrize("text", ["A", "aa", "A@schedule(dynamic,2)", "A{R:2}a"])
def test_indices_and_comparisons_past_32_bits(start, text, restore_threads):
    """Offsets and 'if' constants that do not fit a 32-bit immediate."""
    S = start

    def body(i, H):
        count(H[thread().tid, 0, i - S])
        if i == S + 3:
            count(H[thread().tid, 1, i - S])
        if i < S + 2:
            count(H[thread().tid, 2, i - S])
        if 3 * i >= 3 * S + 4:
            count(H[thread().tid, 3, 3 * i - 3 * S - 2 * (i - S)])
        if -i > -S - 1:
            count(H[thread().tid, 4, i - S])
    count = COUNT
    lk = kernel(text, Loop(S, S + 6, blocks=[4]))(body)
    want = [[1] * 6, [0, 0, 0, 1, 0, 0], [1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]]
    hp = np.zeros((1, 5, 6, 1, 1), np.int32)
    lk.python(hp)
    assert hp[0, ..., 0, 0].tolist() == want
    for nt in (2, 3):
        loops.set_num_threads(nt)
        h = np.zeros((nt, 5, 6, 1, 1), np.int32)
        lk(h)
        assert h.sum(0)[..., 0, 0].tolist() == want, (hex(S), text, nt)


def test_offsets_past_64_bits_are_refused_with_the_fix():
    S = 2 ** 60
    lk = kernel("a", Loop(S, S + 4))(counting_body([S]))
    with pytest.raises(ValueError, match=r"64-bit integers.*shift the loop to start near 0"):
        lk(np.zeros((1, 4, 1, 1), np.int32))


def test_a_loop_reused_by_two_kernels_and_specs(restore_threads):
    a, b = Loop(1, 8, 2, blocks=[4]), Loop(0, 5, blocks=[3, 2])
    first = kernel("aBb", a, b)(counting_body([1, 0]))
    second = kernel("bAab", a, b)(counting_body([1, 0]))
    for lk in (first, second, first.with_spec("bbAa"), second.with_spec("a[1,8,2,(2)]abBb")):
        check_every_thread_count(lk, [1, 0], (8, 6))
    assert (a, b) == (Loop(1, 8, 2, blocks=[4]), Loop(0, 5, blocks=[3, 2]))


# -- 3. bodies ----------------------------------------------------------------------------------

relu = tpp.relu(1, 8)


def _relu_rows(spec="A"):
    return kernel(spec, Loop(0, 6))(lambda i, X, Y: relu(X[i], Y[i]))


def _xy():
    x = np.random.default_rng(1).standard_normal((6, 1, 8)).astype(np.float32)
    return x, np.full_like(x, np.nan)


def test_a_raising_body_raises_on_every_call_and_leaves_the_pool_usable(restore_threads):
    def body(i, X, Y):
        if i == 3:
            raise ZeroDivisionError("boom at 3")
        relu(X[i], Y[i])
    x, y = _xy()
    for nt in THREADS:
        loops.set_num_threads(nt)
        lk = kernel("A", Loop(0, 6))(body)
        for _ in range(2):                                  # not bound after a failed trace
            with pytest.raises(ZeroDivisionError, match="boom at 3"):
                lk(x, y)
        with pytest.raises(ZeroDivisionError, match="boom at 3"):
            lk.python(x, y.copy())
        assert np.isnan(y).all()                            # nothing ran
        ok = _relu_rows()
        ok(x, y)
        assert (y == np.maximum(x, 0)).all()
        y[...] = np.nan


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit, GeneratorExit])
def test_a_body_interrupted_while_traced_leaves_kernels_callable(error):
    def body(i, X, Y):
        relu(X[i], Y[i])
        raise error()
    x, y = _xy()
    with pytest.raises(error):
        kernel("A", Loop(0, 6))(body)(x, y)
    assert tk.TRACING == 0
    relu(x[0], y[0])                                        # a direct call runs the kernel, not the tracer
    assert (y[0] == np.maximum(x[0], 0)).all()
    _relu_rows()(x, y)
    assert (y == np.maximum(x, 0)).all()


@pytest.mark.parametrize("arrays, error, what", [
    (lambda x, y: (x,), TypeError, "takes 2 arrays (X, Y), got 1"),
    (lambda x, y: (x, y, y), TypeError, "takes 2 arrays (X, Y), got 3"),
    (lambda x, y: (x.astype(np.float64), y), ValueError, "dtype float64"),
    (lambda x, y: (x[:3], y[:3]), ValueError, "out of bounds"),
    (lambda x, y: (x[:, :, ::2], y[:, :, ::2]), ValueError, "shape (1, 4), expected (1, 8)"),
    (lambda x, y: (x.tolist(), y), TypeError, "got list"),
    (lambda x, y: (None, y), TypeError, "got NoneType"),
])
def test_arrays_of_the_wrong_count_dtype_or_shape(arrays, error, what):
    x, y = _xy()
    lk = _relu_rows()
    lk(x, y)                                                # bound once: the fast path sees them first
    y[...] = np.nan
    with pytest.raises(error, match=re.escape(what)):
        lk(*arrays(x, y))
    lk(x, y)
    assert (y == np.maximum(x, 0)).all()


@pytest.mark.parametrize("body, error, what", [
    (lambda i: None, SpecError, "first 2 parameters receive the loop indices"),
    (lambda *a: None, TypeError, "no '*', '*args'"),
    (lambda i, j, *, X: None, TypeError, "keyword-only"),
    (print, TypeError, "not a Python function"),
    (3, TypeError, "must be a function"),
])
def test_bodies_taking_the_wrong_parameters(body, error, what):
    with pytest.raises(error, match=re.escape(what)):
        kernel("ab", Loop(0, 2), Loop(0, 2))(body)


def test_a_nest_called_inside_another_nests_body_is_refused():
    inner = _relu_rows()

    @kernel("A", Loop(0, 2))
    def outer(i, X, Y):
        inner(X, Y)

    @kernel("a", Loop(0, 2))
    def recursive(i, X, Y):
        recursive(X, Y)
    x, y = _xy()
    for lk in (outer, recursive):
        with pytest.raises(TraceError, match="cannot run inside another nest's body"):
            lk(x, y)
        with pytest.raises(TraceError, match="cannot run inside another nest's body"):
            lk.python(x, y)
    inner(x, y)
    assert (y == np.maximum(x, 0)).all()


def test_calls_from_python_threads_while_the_thread_count_changes(restore_threads):
    specs = ["aB", "AB@schedule(dynamic,1)", "a|B", "B{R:1}a", "ba", "aB{C:1}"]
    nests = [kernel(s, Loop(0, 5), Loop(0, 7))(counting_body([0, 0])) for s in specs]
    wrong, errors, calls, stop = [], [], [0], threading.Event()

    def caller(seed):
        rnd = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                lk = nests[rnd.integers(len(nests))]
                h = np.zeros((4, 5, 7, 1, 1), np.int32)
                lk(h)
                if not (h.sum(0) == 1).all():
                    wrong.append(lk.spec.text)
                calls[0] += 1
        except Exception as e:                             # pragma: no cover - reported below
            errors.append(repr(e))

    def toggler():
        n = 0
        while not stop.is_set():
            loops.set_num_threads(1 + n % 3)
            n += 1
            time.sleep(0.002)
    workers = [threading.Thread(target=caller, args=(s,)) for s in range(3)] + [threading.Thread(target=toggler)]
    for w in workers:
        w.start()
    time.sleep(2.0)
    stop.set()
    for w in workers:
        w.join(20)
    assert not any(w.is_alive() for w in workers), "a call hung"
    assert not errors and not wrong and calls[0] > 100, (errors[:3], wrong[:3], calls)


def test_fork_while_other_threads_call_nests_and_change_the_thread_count():
    out = scripts.run(r"""
import os, signal, threading, time
import numpy as np, loops
from loops import Loop, kernel
from tests.loops.test_loops_adversary import counting_body
nests = [kernel(s, Loop(0, 5), Loop(0, 7))(counting_body([0, 0])) for s in ["aB", "AB@schedule(dynamic,1)", "a|B",
                                                                            "B{R:2}a"]]
stop = False
def caller():
    while not stop:
        for lk in nests:
            try:
                lk(np.zeros((4, 5, 7, 1, 1), np.int32))
            except loops.SpecError:
                pass                          # the grid at 1 thread
def toggler():
    n = 0
    while not stop:
        loops.set_num_threads(1 + n % 3); n += 1
        time.sleep(0.002)
for target in (caller, toggler):
    threading.Thread(target=target, daemon=True).start()
codes = []
for _ in range(8):
    time.sleep(0.02)
    pid = os.fork()
    if pid == 0:
        ok = True
        for nt in (3, 1, 2):
            loops.set_num_threads(nt)
            for lk in nests + [kernel("AB", Loop(0, 5), Loop(0, 7))(counting_body([0, 0]))]:
                h = np.zeros((4, 5, 7, 1, 1), np.int32)
                if lk.spec.nthreads_needed > nt:
                    continue
                lk(h)
                ok = ok and bool((h.sum(0) == 1).all())
        os._exit(0 if ok else 1)
    deadline, done = time.time() + 20, 0
    while not done and time.time() < deadline:
        time.sleep(0.005)
        done, status = os.waitpid(pid, os.WNOHANG)
    if not done:
        os.kill(pid, signal.SIGKILL)
    codes.append(os.waitstatus_to_exitcode(status) if done else "hung")
stop = True
print(codes)
""", timeout=90)
    assert out.strip() == str([0] * 8)


# -- 4. the tuner -------------------------------------------------------------------------------

def _tunable():
    big = tpp.relu(4, 8)
    x = np.random.default_rng(2).standard_normal((8, 4, 4, 8)).astype(np.float32)
    lk = kernel("aB", Loop(0, 8), Loop(0, 4))(lambda i, j, X, Y: big(X[i, j], Y[i, j]))
    return lk, x, np.zeros_like(x)


@pytest.mark.parametrize("options, error, what", [
    *[({name: v}, ValueError, f"{name}={v!r}") for name, v in [
        ("seconds", 0), ("seconds", -1), ("seconds", float("nan")), ("budget", 0), ("budget", -3), ("reps", 0),
        ("rtol", -1)]],
    *[({name: v}, TypeError, f"{name}={v!r}") for name, v in [
        ("seconds", "1"), ("seconds", True), ("budget", 1.5), ("budget", None)]],
    ({"specs": []}, ValueError, "gives nothing to time"),
    ({"specs": ()}, ValueError, "gives nothing to time"),
    ({"specs": "aB"}, TypeError, "expected a list of spec strings"),
    ({"specs": {"aB"}}, TypeError, "expected a list of spec strings"),
    ({"specs": (s for s in ["aB"])}, TypeError, "expected a list of spec strings"),
    ({"specs": [b"aB"]}, TypeError, "each spec is a string"),
    ({"specs": ["aZ"]}, SpecError, "only 2 loops are declared"),
    ({"blocks": "yes"}, TypeError, "blocks='yes'"),
    ({"blocks": {"z": 1}}, ValueError, "blocks has the key 'z'"),
    ({"progress": 1}, TypeError, "progress=1"),
    ({"foo": 1}, TypeError, "unexpected keyword argument 'foo'"),
    ({"budgte": 4}, TypeError, "unexpected keyword argument 'budgte'"),
    ({"top": 4}, TypeError, "write budget=4"),
    ({"knobs": {}}, TypeError, "loops.tune.search"),
    ({"resume": True}, TypeError, "loops.tune.search"),
])
def test_tune_refuses_bad_options_before_timing(options, error, what, monkeypatch):
    lk, x, y = _tunable()
    import loops.tune as tuning
    searched = []
    monkeypatch.setattr(tuning, "search", lambda *a, **k: searched.append(1))
    with pytest.raises(error, match=re.escape(what)):
        lk.tune(x, y, progress=options.pop("progress", False), **options)
    assert not searched
    assert not getattr(lk, "last_tuning", None)


@pytest.mark.parametrize("options", [{"seconds": 1e-9}, {"budget": 1}, {"budget": np.int64(2), "seconds": 0.2},
                                     {"budget": 10 ** 30, "seconds": 0.3}, {"specs": ["ab", "ab"]},
                                     {"blocks": {}, "model": False}])
def test_tune_with_tiny_or_huge_budgets_picks_a_spec_that_still_computes(options):
    lk, x, y = _tunable()
    best = lk.tune(x, y, progress=False, reps=1, **options)
    assert isinstance(best, str) and any(best == s for s, _, note in lk.last_tuning if note == "chosen") or \
        best == lk.spec.text
    y[...] = np.nan
    lk(x, y)
    assert (y == np.maximum(x, 0)).all()
