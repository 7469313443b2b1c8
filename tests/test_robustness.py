"""Inputs that once crashed the process, hung, or were silently misread: each now raises an error
that says what to do. Calls that could crash run in a subprocess, so a regression fails one test
instead of killing the run."""
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import tppasm as tpp
from loops import Loop, kernel
from loops.spec import SpecError
from loops.trace import TraceError
from tppasm.brgemm import Brgemm
from tppasm.operand import OperandError


def run_isolated(code, timeout=120):
    """Run ``code`` in a fresh interpreter; return its stdout (fails on a crash or a hang)."""
    prelude = "import numpy as np, tppasm as tpp\nfrom loops import Loop, kernel\n"
    done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.parametrize("count", ["0", "-1", "np.int64(0)", "2**30"])
def test_bad_count_in_a_body_is_refused(count):
    out = run_isolated(f"""
        g = tpp.brgemm(4, 4, 4); A = np.ones((2, 4, 4), np.float32); C = np.zeros((2, 4, 4), np.float32)
        @kernel("a", Loop(0, 2))
        def body(i, A, B, C):
            g(A, B, C[i], count={count})
        try:
            body(A, A, C)
        except TypeError as e:
            print("refused:", e)
        """)
    assert "refused:" in out and "count=" in out


@pytest.mark.parametrize("call", ["relu(X[i])", "relu(X[i], Y[i], Y[i])"])
def test_wrong_number_of_arrays_in_a_body_is_refused(call):
    out = run_isolated(f"""
        relu = tpp.relu(2, 4); X = np.ones((8, 2, 4), np.float32); Y = np.zeros_like(X)
        @kernel("a", Loop(0, 8))
        def body(i, X, Y):
            {call}
        for run in (lambda: body(X, Y), lambda: body.python(X, Y)):
            try:
                run()
            except TypeError as e:
                print("refused:", e)
        print("x intact:", bool((X == 1).all()))
        """)
    assert out.count("refused:") == 2 and "takes 2 arrays" in out and "x intact: True" in out


def test_unchecked_batched_kernels_cannot_be_called_raw():
    out = run_isolated("""
        from tppasm.brgemm import Brgemm
        g = tpp.brgemm(4, 4, 4, batch="offset"); A = np.ones((4, 4), np.float32); C = np.zeros((4, 4), np.float32)
        for call in (lambda: g.kernel(A, A, C, np.array([[10**9, 0]], np.int64)),
                     lambda: tpp.get_kernel(Brgemm(4, 4, 4, batch="address"))(
                         np.array([16], np.int64), np.array([16], np.int64), C)):
            try:
                call()
            except TypeError as e:
                print("refused:", e)
        @kernel("a", Loop(0, 2))
        def body(i, A, B, C, O):
            g.kernel(A, B, C[i], O, count=1)
        try:
            body(A, A, np.zeros((2, 4, 4), np.float32), np.zeros((1, 2), np.int64))
        except TypeError as e:
            print("refused in body:", e)
        @kernel("a", Loop(0, 2))
        def wrapped(i, A, B, C, O):
            g(A, B, C[i], O, count=1)
        try:
            wrapped(A, A, np.zeros((2, 4, 4), np.float32), np.zeros((1, 2), np.int64))
        except TypeError as e:
            print("refused in body:", e)
        """)
    assert out.count("refused:") == 2 and out.count("refused in body:") == 2 and "batch='stride'" in out


def test_offsets_changed_by_another_thread_never_reach_the_kernel():
    run_isolated("""
        import threading
        g = tpp.brgemm(16, 16, 16, batch="offset")
        A = np.ones((16, 16), np.float32); C = np.zeros((16, 16), np.float32)
        o = np.zeros((256, 2), np.int64)
        stop = False
        def flip():
            while not stop:
                o[255, 0] = 10**11
                o[255, 0] = 0
        t = threading.Thread(target=flip); t.start()
        try:
            for _ in range(3000):
                try:
                    g(A, A, C, o, count=256)
                except ValueError:
                    pass                     # the check saw the bad offset: fine
        finally:
            stop = True; t.join()
        """)


@pytest.mark.parametrize("args", [(2**63 - 5, 2**63 - 1, 3), (-2**62, 2**62 + 3, 2**62), (0, 2**61), (0, 4, 2**61)])
def test_loop_bounds_beyond_int64_arithmetic_are_refused(args):
    with pytest.raises(SpecError, match="2\\*\\*61"):
        Loop(*args)


@pytest.mark.parametrize("kwargs, words", [(dict(blocks=4), "list of block sizes"), (dict(parallel="no"), "True or False")])
def test_loop_declaration_types(kwargs, words):
    with pytest.raises(SpecError, match=words):
        Loop(0, 8, **kwargs)


def test_a_while_on_a_loop_index_is_refused_not_hung():
    relu = tpp.relu(2, 4)
    X = np.ones((8, 2, 4), np.float32)

    def body(i, X, Y):
        while i < 3:
            relu(X[i], Y[i])
    t = time.perf_counter()
    with pytest.raises(TraceError, match="while"):
        kernel("a", Loop(0, 8))(body)(X, np.zeros_like(X))
    assert time.perf_counter() - t < 60


def test_huge_widths_fail_fast_with_the_reason():
    t = time.perf_counter()
    with pytest.raises(ValueError, match="2 GiB"):
        tpp.brgemm(4, 2**31, 4)
    assert time.perf_counter() - t < 30
    tpp.brgemm(1, 10**6, 2)          # wide but encodable: built (the blocking model is O(1) in n)


def test_numpy_integers_in_descriptors_are_python_ints():
    g = tpp.brgemm(np.int64(4), np.int32(4), np.uint8(4), lda=np.int64(4))
    assert g is tpp.brgemm(4, 4, 4) and type(g.desc.m) is int
    A = np.ones((1, 4, 4), np.float32)
    C = np.empty((4, 4), np.float32)
    g(A, A, C)
    assert (C == 4).all()


@pytest.mark.parametrize("make, words", [
    (lambda: tpp.relu(2, 4, bitmask="no"), "bitmask='no'; expected True or False"),
    (lambda: tpp.brgemm(4, 4, 4, bias=1), "bias=1; expected True or False"),
    (lambda: tpp.brgemm(4, 4, 4, beta=True), "beta=True; expected an int"),
    (lambda: tpp.brgemm(4, 4, 4, dtype=["f32"]), "dtype=\\['f32'\\]; expected a string"),
    (lambda: tpp.brgemm(4, 4, 4, act=[]), "act=\\[\\]; expected a hashable value"),
    (lambda: tpp.unary("relu", 2.0, 4), "m=2.0; expected an int"),
])
def test_descriptor_fields_of_the_wrong_type(make, words):
    with pytest.raises(ValueError, match=words):
        make()


def test_messages_name_the_real_fix():
    g = tpp.brgemm(4, 4, 4)
    A = np.ones((1, 4, 4), np.float32)
    with pytest.raises(OperandError) as e:
        g(A, A, np.zeros((4, 4), np.int32))
    assert "pass a float32 output" in str(e.value) and "dtype='i32'" not in str(e.value)     # not a copy
    with pytest.raises(OperandError) as e:
        g(A.astype(np.float64), A, np.zeros((4, 4), np.float32))
    assert "astype(np.float32)" in str(e.value) and "dtype='" not in str(e.value)
    with pytest.raises(OperandError, match="vnni_pack"):
        tpp.brgemm(4, 4, 4, dtype="bf16")(A.astype(tpp.dtypes.dtype("bf16")), A.astype(tpp.dtypes.dtype("bf16")),
                                          np.zeros((4, 4), np.float32))
    with pytest.raises(OperandError, match="stride_a=32"):
        g(np.ones((4, 4, 4), np.float32)[::2], A, np.zeros((4, 4), np.float32), count=2)
    with pytest.raises(OperandError, match="sequence of at least"):
        tpp.brgemm(4, 4, 4, batch="address")(3, [A[0]], np.zeros((4, 4), np.float32))
    with pytest.raises(OperandError, match="fewer than one block"):
        tpp.brgemm(4, 4, 4, batch="offset")(np.ones(3, np.float32), A[0], np.zeros((4, 4), np.float32),
                                            np.zeros((1, 2), np.int64))
    with pytest.raises(ValueError, match="power of two"):
        tpp.aligned(A, align=0)
    with pytest.raises(ValueError, match="outer"):
        tpp.unblock(np.ones((1, 1, 2, 2)), outer="x")
