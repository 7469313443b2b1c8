"""The call path of a compiled nest: no Python re-check of what the native entry checked (fz14c item 5).

A serial nest's native entry checks the arrays, stores their pointers and runs the nest itself
(the interpreter lock released); a call it cannot vouch for takes the Python path, which calls the
nest's ctypes function without :class:`isa.x86.function.JitFunction`'s per-argument checks. The
checks that keep a call within its arrays still refuse every other array.
"""
import threading
from unittest import mock

import numpy as np
import pytest

import isa.x86.function as jit_function
import loops.decorator as decorator
import tppasm as tpp
from isa.pool import Pool
from loops import BoundsError, Loop, kernel
from tppasm.x86.entry import capi_address

NATIVE_ENTRY = decorator.NATIVE_CHECKS and not decorator.ON_AARCH64
needs_native_entry = pytest.mark.skipif(not NATIVE_ENTRY, reason="no native nest entries on this host")
relu = tpp.unary("relu", 4, 8)


def relu_nest(spec, n=3, pool=None):
    @kernel(spec, Loop(0, n), pool=pool)
    def nest(i, X, Y):
        relu(X[i], Y[i])
    return nest


def arrays(n=3):
    X = np.random.default_rng(n).standard_normal((n, 4, 8)).astype(np.float32)
    return X, np.full_like(X, np.nan)


class Counted:
    """The Python argument checks and launches of nests, counted while it is entered."""

    def __enter__(self):
        self.patches = [mock.patch.object(jit_function, "_argument", wraps=jit_function._argument),
                        mock.patch.object(jit_function.JitFunction, "__call__", autospec=True,
                                          side_effect=jit_function.JitFunction.__call__),
                        mock.patch.object(decorator._Instance, "launch", autospec=True,
                                          side_effect=decorator._Instance.launch)]
        self.argument, self.jit_call, self.launch = (p.start() for p in self.patches)
        return self

    def __exit__(self, *exc):
        for p in self.patches:
            p.stop()


@needs_native_entry
def test_a_serial_nest_runs_inside_its_native_entry():
    nest = relu_nest("a")
    X, Y = arrays()
    nest(X, Y)
    assert nest._fast.runs_in_entry
    with Counted() as counted:
        for _ in range(5):
            Y[...] = np.nan
            nest(X, Y)
            assert (Y == np.maximum(X, 0)).all()
    assert counted.launch.call_count == counted.jit_call.call_count == counted.argument.call_count == 0


@needs_native_entry
def test_the_fused_entry_releases_the_interpreter_lock_as_ctypes_did():
    nest = relu_nest("a")
    X, Y = arrays()
    nest(X, Y)
    code = nest._fast._store.code
    for name in ("PyEval_SaveThread", "PyEval_RestoreThread"):
        assert capi_address(name).to_bytes(8, "little") in code


def test_the_python_path_launches_without_the_argument_checks():
    nest = relu_nest("a")
    X, Y = arrays()
    nest(X, Y)
    inst = nest._last
    with Counted() as counted:
        Y[...] = np.nan
        inst.run((X, Y))                        # what a call the entry does not vouch for runs
    assert (Y == np.maximum(X, 0)).all()
    assert counted.launch.call_count == 1
    assert counted.jit_call.call_count == counted.argument.call_count == 0


def test_a_nest_on_a_two_thread_pool_takes_no_argument_checks():
    pool = Pool(2)
    try:
        nest = relu_nest("A", n=4, pool=pool)
        X, Y = arrays(4)
        nest(X, Y)
        with Counted() as counted:
            for _ in range(3):
                Y[...] = np.nan
                nest(X, Y)
                assert (Y == np.maximum(X, 0)).all()
        assert counted.launch.call_count == 3
        assert counted.jit_call.call_count == counted.argument.call_count == 0
    finally:
        pool.close()


def test_a_serial_nest_of_more_than_six_arrays():
    add = tpp.binary("add", 4, 8)

    @kernel("a", Loop(0, 3))
    def nest(i, a, b, c, d, e, g, h, y):
        add(a[i], b[i], y[i])
        for x in (c, d, e, g, h):
            add(x[i], y[i], y[i])
    xs = [np.full((3, 4, 8), float(n), np.float32) for n in range(7)]
    y = np.full((3, 4, 8), np.nan, np.float32)
    for extra in (0, 1):
        nest(*[x + extra for x in xs], y)
        assert (y == 21 + 7 * extra).all()


def test_in_place_and_hooks_on_the_fused_entry():
    nest = relu_nest("a")
    seen = []
    zero = tpp.zero(4, 8)

    @nest.init
    def clear_first(X, Y):
        zero(Y[0])
    X, _ = arrays()
    expected = np.maximum(X, 0)
    expected[0] = 0
    for _ in range(2):
        Z = X.copy()
        nest(Z, Z)                                   # input and output the same array
        assert (Z == expected).all()
        seen.append(nest._last.runs_in_entry)
    assert seen == [True, True] or not NATIVE_ENTRY


def test_refusals_still_happen_after_fast_calls():
    nest = relu_nest("a")
    X, Y = arrays()
    for _ in range(3):
        nest(X, Y)
    with pytest.raises(BoundsError, match="out of bounds"):
        nest(X[:2], Y[:2])                           # smaller arrays: never read past their end
    with pytest.raises(ValueError, match=r"shape \(2, 8\), expected \(4, 8\)"):
        nest(X, Y[:, :2])                            # a smaller block: the kernel's operand check
    frozen = Y.copy()
    frozen.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        nest(X, frozen)
    with pytest.raises(ValueError, match="dtype float64, expected float32"):
        nest(X.astype(np.float64), Y)
    with pytest.raises(TypeError, match="takes 2 arrays"):
        nest(X)
    Y[...] = np.nan
    nest(X, Y)                                       # the refused calls left the nest intact
    assert (Y == np.maximum(X, 0)).all()


def test_concurrent_calls_of_one_serial_nest():
    nest = relu_nest("a")
    X, Y = arrays()
    nest(X, Y)
    failures = []

    def work(seed):
        x = np.random.default_rng(seed).standard_normal((3, 4, 8)).astype(np.float32)
        y = np.empty_like(x)
        for _ in range(200):
            y[...] = np.nan
            nest(x, y)
            if not (y == np.maximum(x, 0)).all():
                failures.append(seed)
    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
