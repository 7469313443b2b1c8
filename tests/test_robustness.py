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
from isa.cpu import host
from loops import Loop, kernel
from loops.spec import SpecError
from loops.trace import TraceError
from tppasm import timing
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


@pytest.mark.parametrize("call, words", [("relu(X[i])", "allocating form k(inputs) runs outside loop bodies"),
                                         ("relu(X[i], Y[i], Y[i])", "takes 2 arrays")])
def test_wrong_number_of_arrays_in_a_body_is_refused(call, words):
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
    assert out.count("refused:") == 2 and words in out and "x intact: True" in out


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
    with pytest.raises(OperandError, match="list or tuple of blocks .* got a int"):
        tpp.brgemm(4, 4, 4, batch="address")(3, [A[0]], np.zeros((4, 4), np.float32))
    with pytest.raises(OperandError, match=r"got an array of shape \(\d+, 4, 4\): pass list\(a\)"):
        tpp.brgemm(4, 4, 4, batch="address")(A, [A[0]], np.zeros((4, 4), np.float32), count=1)
    with pytest.raises(OperandError, match="holds 1 blocks; count=2 needs at least 2"):
        tpp.brgemm(4, 4, 4, batch="address")([A[0]], [A[0]], np.zeros((4, 4), np.float32), count=2)
    with pytest.raises(OperandError, match="fewer than one block"):
        tpp.brgemm(4, 4, 4, batch="offset")(np.ones(3, np.float32), A[0], np.zeros((4, 4), np.float32),
                                            np.zeros((1, 2), np.int64))
    with pytest.raises(ValueError, match="power of two"):
        tpp.aligned(A, align=0)
    with pytest.raises(ValueError, match="outer"):
        tpp.unblock(np.ones((1, 1, 2, 2)), outer="x")


@pytest.mark.skipif(host().isa == "amx", reason="the host runs AMX")
def test_an_offset_batch_brgemm_for_a_missing_level_is_refused_not_run():
    out = run_isolated("""
        g = tpp.brgemm(4, 4, 4, batch="offset", isa="amx")
        try:
            g(np.ones(16, np.float32), np.ones(16, np.float32), np.zeros((4, 4), np.float32),
              np.zeros((1, 2), np.int64))
        except tpp.ISAUnavailableError as e:
            print("refused:", e)
        """)
    assert "refused: brgemm: this kernel's amx code cannot run on this host" in out


# -- parameters that do not apply are refused, not ignored -------------------------------------------

@pytest.mark.parametrize("make, words", [
    (lambda: tpp.unary("zero", 2, 4, ldx=7), "ldx=7 does not apply: op 'zero' reads no x"),
    (lambda: tpp.transform("vnni2", 4, 3, ldo=99), "ldo=99 does not apply: 'vnni2' writes a dense packed out"),
    (lambda: tpp.transform("unvnni2", 4, 3, ldx=99), "ldx=99 does not apply: 'unvnni2' reads a dense packed x"),
    (lambda: tpp.binary("add", 2, 4, lda=99, bcast_a="row"), "lda=99 does not apply: with bcast_a='row'"),
    (lambda: tpp.binary("add", 2, 4, ldb=5, bcast_b="scalar"), "ldb=5 does not apply: with bcast_b='scalar'"),
    (lambda: tpp.ternary("muladd", 2, 4, ldb=99, bcast_b="col"), "ldb=99 does not apply: with bcast_b='col'"),
    (lambda: tpp.block(np.ones((3, 3)), 2, 2, pad="no"), "pad='no'; expected True"),
])
def test_parameters_that_do_not_apply_are_refused(make, words):
    with pytest.raises(ValueError, match=words):
        make()


def test_parameters_equal_to_what_is_used_anyway_are_accepted():
    assert tpp.unary("zero", 2, 4, ldx=4) is tpp.zero(2, 4)
    assert tpp.binary("add", 2, 4, lda=4, bcast_a="row") is tpp.binary("add", 2, 4, bcast_a="row")
    assert tpp.transform("vnni2", 4, 3, ldo=0) is tpp.transform("vnni2", 4, 3)
    assert tpp.block(np.ones((3, 3)), 2, 2, pad=np.bool_(True)).shape == (2, 2, 2, 2)


# -- helpers that once crashed, returned nonsense or explained nothing --------------------------------

@pytest.mark.parametrize("call, error, words", [
    (lambda: tpp.rope_tables(5, 4), ValueError, r"1-D sequence of token positions.*np\.arange\(5\)"),
    (lambda: tpp.rope_tables([0, 1], 0), ValueError, "head_dim=0; expected an even int >= 2"),
    (lambda: tpp.rope_tables([0, 1], -4), ValueError, "head_dim=-4"),
    (lambda: tpp.rope_tables([0, 1], 3), ValueError, "head_dim=3"),
    (lambda: tpp.rope_tables([0, 1], 4, base=-1), ValueError, "base=-1; expected a finite number > 0"),
    (lambda: tpp.rope_tables([0, float("nan")], 4), ValueError, "NaN"),
    (lambda: tpp.nblocks(10, 0), ValueError, "b=0; expected an int >= 1"),
    (lambda: tpp.nblocks(10, -3), ValueError, "b=-3"),
    (lambda: tpp.nblocks(10, 2.5), ValueError, "b=2.5"),
    (lambda: tpp.nblocks(-1, 2), ValueError, "n=-1; expected an int >= 0"),
    (lambda: tpp.spmm.bcsr(np.ones((4, 4)), 0, 2), ValueError, "bm=0; expected a positive int"),
    (lambda: tpp.spmm.random_block_sparse(8, 8, 0, 4, .5, np.random.default_rng(0)), ValueError, "bm=0"),
    (lambda: tpp.spmm.random_block_sparse(9, 8, 4, 4, .5, np.random.default_rng(0)), ValueError,
     "m=9; expected a positive multiple of bm=4"),
    (lambda: tpp.spmm.random_block_sparse(8, 8, 4, 4, .5, 0), TypeError, "default_rng"),
    (lambda: tpp.vnni_pack(np.ones((4, 4), np.float32), 4.0), ValueError, "factor=4.0; expected the int"),
    (lambda: tpp.vnni_pack(np.ones((4, 4), np.float32), True), ValueError, "factor=True"),
    (lambda: tpp.aligned(None), TypeError, "not numeric data"),
    (lambda: tpp.empty(2**64), ValueError, "more than an array can address"),
    (lambda: tpp.empty((2**40, 2**40)), ValueError, "more than an array can address"),
    (lambda: tpp.brgemm(4, 4, 4, dtype=np.ones(3)), ValueError, r"dtype=array.*a dtype such as 'f32'"),
    (lambda: tpp.brgemm(4, 4, 4, isa=[]), ValueError, r"isa=\[\]: expected one of 'avx2'"),
    (lambda: timing.calibrate(lambda: None, float("nan")), ValueError, "min_run=nan; expected a finite number"),
    (lambda: timing.calibrate(lambda: None, "1"), ValueError, "min_run='1'"),
    (lambda: timing.median_time(lambda: None, warmup=float("inf")), ValueError, "warmup=inf"),   # once: a hang
    (lambda: timing.median_time(lambda: None, 0.001, 0.0, runs=0), ValueError, "runs=0; expected an int >= 1"),
    (lambda: timing.time_runs(lambda: None, 0), ValueError, "reps=0"),
    (lambda: timing.calibrate(5), TypeError, "fn=5 is not callable"),
])
def test_helpers_explain_bad_arguments(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_helpers_still_take_what_they_took():
    cos, sin = tpp.rope_tables(np.arange(3), 4, base=500000)
    assert cos.shape == sin.shape == (3, 2)
    assert tpp.rope_tables([0.5, 1.5], 2)[0].dtype == np.float32       # scaled positions
    assert tpp.nblocks(np.int64(10), 4) == 3 and tpp.nblocks(0, 4) == 0
    assert tpp.vnni_pack(np.ones((4, 4), np.int8), np.int64(4)).shape == (1, 4, 4)
    assert tpp.vnni_pack(np.ones((4, 4), np.int8), "int8").shape == (1, 4, 4)


# -- exceptions that name the fix (issue 11: "Wrong exception types") --------------------------------

def test_isa_names_are_read_as_tppasm_isa_reads_them():
    assert tpp.brgemm(4, 4, 4, isa=" AVX2") is tpp.brgemm(4, 4, 4, isa="avx2")
    for bad in ("bogus", 3, ""):
        with pytest.raises(ValueError, match="'avx2', 'avx512', 'amx', 'sve'.*natively") as e:
            tpp.brgemm(4, 4, 4, isa=bad)
        assert type(e.value) is ValueError


@pytest.mark.parametrize("desc", [None, "relu", 3])
def test_get_kernel_wants_a_descriptor(desc):
    with pytest.raises(TypeError, match="tppasm.brgemm.Brgemm.*tppasm.relu"):
        tpp.get_kernel(desc)
    with pytest.raises(TypeError, match="already a kernel"):
        tpp.get_kernel(tpp.relu(2, 4))
    with pytest.raises(TypeError, match="AMX BRGEMM"):
        tpp.tileconfig(None)


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e30", "x"])
def test_spin_time_must_be_finite(value, monkeypatch):
    from isa.pool import Pool
    monkeypatch.setenv("TPPASM_SPIN_US", value)
    with pytest.raises(ValueError, match="TPPASM_SPIN_US.*microseconds from 0 to"):
        Pool(2)
    monkeypatch.delenv("TPPASM_SPIN_US")
    for bad, error in ((float("inf"), ValueError), ("5", TypeError), (-1, ValueError)):
        with pytest.raises(error, match="spin_us"):
            Pool(2, spin_us=bad)
    for bad, error in (("2", TypeError), (0, ValueError), (10**6, ValueError), (2.0, TypeError)):
        with pytest.raises(error, match="Pool\\(nthreads="):
            Pool(bad)


def test_pool_argument_is_checked_at_decoration():
    with pytest.raises(TypeError, match="pool='x': expected an isa.pool.Pool"):
        kernel("a", Loop(0, 2), pool="x")


def test_python_path_wants_arrays():
    relu = tpp.relu(2, 4)
    k = kernel("a", Loop(0, 2))(lambda i, X, Y: relu(X[i], Y[i]))
    with pytest.raises(TypeError, match="NumPy arrays.*got list, NoneType"):
        k.python([1], None)
    with pytest.raises(TypeError, match="takes 2 arrays"):
        k.python(np.ones((2, 2, 4), np.float32))


@pytest.mark.parametrize("expr, words", [
    ("X[i].T", "transform\\('transpose'"), ("X[i].transpose()", "transform\\('transpose'"),
    ("np.transpose(X[i])", "transform\\('transpose'"), ("X[i].reshape(8)", "tpp.block"),
    ("X[i].astype(np.float64)", "tpp.copy\\(m, n, dtype"), ("X[i].copy()", "tpp.copy"),
    ("X[i].sum()", "only supports indexing and slicing"), ("np.sum(X[i])", "only tppasm kernels")])
def test_numpy_idioms_on_traced_views_name_the_alternative(expr, words):
    relu = tpp.relu(2, 4)
    body = eval(f"lambda i, X, Y: (relu({expr}, Y[i]))", {"np": np, "relu": relu})
    with pytest.raises(TraceError, match=words) as e:
        kernel("a", Loop(0, 2))(body)(np.ones((2, 2, 4), np.float32), np.zeros((2, 2, 4), np.float32))
    assert isinstance(e.value, TypeError)


def _gen(i, X, Y):
    yield


async def _coro(i, X, Y):
    pass


async def _agen(i, X, Y):
    yield


class _GenCall:
    def __call__(self, i, X, Y):
        yield


@pytest.mark.parametrize("body", [_gen, _coro, _agen, _GenCall()], ids=["generator", "async", "async-gen", "__call__"])
def test_bodies_that_are_not_plain_functions_are_refused(body):
    with pytest.raises(TypeError, match="plain 'def'"):
        kernel("a", Loop(0, 2))(body)
    k = kernel("a", Loop(0, 2))(lambda i, X, Y: None)
    with pytest.raises(TypeError, match="plain 'def'"):
        k.init(body)


def test_a_body_that_returns_a_generator_is_refused():
    relu = tpp.relu(2, 4)
    lazy = kernel("a", Loop(0, 2))(lambda i, X, Y: (relu(X[i], Y[i]) for _ in (0,)))
    X, Y = np.ones((2, 2, 4), np.float32), np.zeros((2, 2, 4), np.float32)
    for run in (lambda: lazy(X, Y), lambda: lazy.python(X, Y)):
        with pytest.raises(TypeError, match="returned a generator"):
            run()
    assert not Y.any()


BAD = [None, "x", -1, 0, 2**64, float("inf"), float("nan"), 1.5, [], (), object(), True, np.ones(3), b"x"]


def _public_calls():
    """(name, callable with the bad value in one argument) for every public constructor and entry."""
    import inspect
    from isa.pool import Pool, set_num_threads
    good = {
        tpp.brgemm: (4, 4, 4), tpp.unary: ("relu", 2, 4), tpp.relu: (2, 4), tpp.zero: (2, 4), tpp.copy: (2, 4),
        tpp.binary: ("add", 2, 4), tpp.ternary: ("muladd", 2, 4), tpp.reduce: ("add", 2, 4),
        tpp.transform: ("transpose", 4, 4), tpp.aligned: (np.ones(4),), tpp.block: (np.ones((4, 4)), 2, 2),
        tpp.unblock: (np.ones((2, 2, 2, 2)),), tpp.empty: ((4, 4), "f32"),
        tpp.vnni_pack: (np.ones((4, 4), np.float32), 2), tpp.vnni_unpack: (np.ones((2, 4, 2), np.float32),),
        tpp.get_kernel: (tpp.eltwise.Unary("relu", 2, 4),), tpp.tileconfig: (None,),
        tpp.nblocks: (10, 4), tpp.rope_tables: ([0, 1], 4), tpp.block_spmm: (2, 2, 4, 2),
        tpp.spmm.bcsr: (np.ones((4, 4)), 2, 2),
        tpp.spmm.random_block_sparse: (8, 8, 4, 4, 0.5, np.random.default_rng()),
        tpp.rotary: (1, 4, 4), tpp.quantize: (2, 4), tpp.dequant: (2, 4),
        Loop: (0, 4), Pool: (2,), set_num_threads: (2,),
    }
    for fn, args in good.items():
        params = [p for p in inspect.signature(fn).parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                                                       p.KEYWORD_ONLY)]
        for i, p in enumerate(params):
            for bad in BAD:
                a, k = list(args), {}
                if i < len(a):
                    a[i] = bad
                else:
                    k[p.name] = bad
                yield f"{fn.__name__}({p.name}={bad!r})", lambda fn=fn, a=a, k=k: fn(*a, **k)
    relu, g = tpp.relu(2, 4), tpp.brgemm(4, 4, 4)
    X, A, C = np.ones((2, 4), np.float32), np.ones((2, 4, 4), np.float32), np.ones((4, 4), np.float32)
    lk = kernel("A", Loop(0, 2))(lambda i, X: relu(X[i], X[i]))
    from loops.races import check
    for bad in BAD:
        yield "relu(bad)", lambda b=bad: relu(b, X)
        yield "brgemm(count=bad)", lambda b=bad: g(A, A, C, count=b)
        yield "kernel(spec=bad)", lambda b=bad: kernel(b, Loop(0, 2))
        yield "kernel(loop=bad)", lambda b=bad: kernel("a", b)
        yield "kernel(races=bad)", lambda b=bad: kernel("a", Loop(0, 2), races=b)
        yield "kernel(body=bad)", lambda b=bad: kernel("a", Loop(0, 2))(b)
        yield "lk(bad)", lambda b=bad: lk(b)
        yield "lk.python(bad)", lambda b=bad: lk.python(b)
        yield "lk.explain(bad)", lambda b=bad: lk.explain(b)
        yield "lk.with_spec(bad)", lambda b=bad: lk.with_spec(b)
        yield "lk.init(bad)", lambda b=bad: lk.init(b)
        yield "check(arrays=bad)", lambda b=bad: check(lk, b)
        yield "check(spec=bad)", lambda b=bad: check(lk, (np.ones((2, 2, 4), np.float32),), b)
        yield "check(nthreads=bad)", lambda b=bad: check(lk, (np.ones((2, 2, 4), np.float32),), nthreads=b)


def test_public_entries_raise_only_type_or_value_errors():
    """A fuzz over every public entry of tppasm and loops (but the tuner's): a bad value in any one
    argument raises TypeError or ValueError, never AttributeError, RuntimeError or OverflowError."""
    import warnings
    leaks = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)         # old parameter names are fuzzed too
        for name, call in _public_calls():
            try:
                call()
            except (TypeError, ValueError):
                pass
            except Exception as e:                      # pragma: no cover - reported below
                leaks.append(f"{name}: {type(e).__name__}: {e}")
    assert not leaks, "\n".join(leaks[:20])
