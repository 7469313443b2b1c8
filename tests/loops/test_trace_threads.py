"""Loop-body mode belongs to a thread: another thread tracing a body, or running one in
``.python()``, leaves this thread's calls as they are outside bodies; and an interrupt (Ctrl-C)
at any point of a trace or a ``.python()`` run leaves no thread in body mode and no body counted."""
import itertools
import sys
import threading

import numpy as np
import pytest

import tppasm as tpp
import tppasm.kernel as tk
from loops import Loop, kernel
from loops.affine import thread_state
from loops.trace import PyArray, run_python, trace

zero, relu = tpp.zero(2, 4), tpp.relu(2, 4)


@pytest.fixture(autouse=True)
def no_body_left():
    """A regression here must not leave the later tests of the session in body mode."""
    yield
    thread_state.mode = thread_state.tracer = None
    thread_state.depth = tk.TRACING = tk._DIVERT.value = 0


def held_in_body(mode):
    """A thread inside a loop body (traced, or run by ``.python()``) until the returned event is set;
    ``errors`` gets what it raised, and the body checks that its own calls are still body calls."""
    inside, release, errors = threading.Event(), threading.Event(), []

    def body(i, X):
        with pytest.raises(TypeError, match="inside a loop body pass the output"):
            relu(X[i])
        inside.set()
        release.wait(10)
        zero(X[i])

    def hold():
        try:
            X = np.ones((3, 2, 4), np.float32)
            if mode == "trace":
                trace(body, ["i"], [X])
            else:
                kernel("A", Loop(0, 3))(body).python(X)
        except BaseException as e:          # (the test checks the thread got through)
            errors.append(e)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert inside.wait(10), errors
    return thread, release, errors


def calls_outside_bodies():
    """Every call form that only works outside a loop body, each with its result checked."""
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    assert np.array_equal(relu(x), np.maximum(x, 0))                        # allocating forms
    assert np.array_equal(relu(x, None), np.maximum(x, 0))
    assert np.array_equal(relu.reference(x), np.maximum(x, 0))
    A, B = np.ones((2, 4, 3), np.float32), np.ones((2, 3, 5), np.float32)
    assert np.array_equal(tpp.brgemm(4, 5, 3)(A, B), np.full((4, 5), 6, np.float32))
    spmm = tpp.block_spmm(bm=2, bk=2, n=3, kb=2)
    rowptr, values = np.array([0, 1], np.int32), np.ones((1, 2, 2), np.float32)
    Bs = np.arange(12, dtype=np.float32).reshape(4, 3)
    assert spmm(rowptr, np.array([1], np.int32), values, Bs, count=1).tolist() == [[15, 17, 19]] * 2
    C = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="colidx"):                          # checked, not NaN
        spmm(rowptr, np.array([5], np.int32), values, Bs, C, count=1)
    gemm = tpp.brgemm(2, 2, 2, batch="address")                              # checked in Python
    C = np.zeros((2, 2), np.float32)
    gemm([np.ones((2, 2), np.float32)] * 3, [np.ones((2, 2), np.float32)] * 3, Exported(C))
    assert (C == 6).all()


class Exported:
    """A DLPack producer (a torch tensor, a JAX array...) over a NumPy array."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


@pytest.mark.parametrize("mode", ["trace", "python"])
def test_other_threads_body_leaves_calls_alone(mode):
    thread, release, errors = held_in_body(mode)
    try:
        assert tk.TRACING == 1
        calls_outside_bodies()
    finally:
        release.set()
        thread.join(10)
    assert not errors and not thread.is_alive()
    assert tk.TRACING == 0


def interrupted(n, run):
    """``run()`` with a KeyboardInterrupt raised at its ``n``-th call or return: where the
    interpreter delivers a pending Ctrl-C. False once ``run`` finished with none raised."""
    events, fired = itertools.count(), []

    def profile(frame, event, arg):
        if next(events) == n:
            fired.append(event)
            raise KeyboardInterrupt      # (the interpreter then removes this profile function)
    try:
        sys.setprofile(profile)
        try:
            run()
        finally:
            sys.setprofile(None)
    except KeyboardInterrupt:
        pass
    return bool(fired)


def out_of_body_mode():
    """The state of a thread outside every body, in a process where no body runs."""
    return (getattr(thread_state, "mode", None), getattr(thread_state, "tracer", None),
            getattr(thread_state, "depth", 0), tk.TRACING, tk._DIVERT.value)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")   # (interrupts in a __del__)
@pytest.mark.parametrize("mode", ["trace", "python"])
def test_interrupt_anywhere_restores_the_mode(mode):
    X = np.ones((3, 2, 4), np.float32)

    def body(i, X):
        zero(X[i])
    run = (lambda: trace(body, ["i"], [X])) if mode == "trace" else (lambda: run_python(body, [0, X.view(PyArray)]))
    for n in range(100_000):
        if not interrupted(n, run):
            break
        assert out_of_body_mode() == (None, None, 0, 0, 0), f"interrupted at call or return {n}"
    assert 10 < n < 100_000                  # every point of the run was interrupted once
    x, out = -np.ones((2, 4), np.float32), np.full((2, 4), 7, np.float32)
    tpp.relu(2, 4)(x, out)
    assert (out == 0).all()
