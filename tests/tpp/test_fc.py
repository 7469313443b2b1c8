"""tppasm.fc, the fully connected layer on TPPs: forward and backward against float64 NumPy for
random shapes (odd k and n for the bf16 VNNI tails), every activation, with and without bias;
outputs poisoned with NaN and checked written."""
import contextlib
import multiprocessing
import platform

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tppasm import fc, fc_dots, fc_parallel, kernel
from tppasm.dtypes import dtype as D
from tppasm.eltwise import GRAD_OPS, UNARY_OPS
from tppasm.operand import OperandError
from tppasm.x86.math import ACCURACY_ABS
from tppasm.x86.entry import NATIVE_CHECKS


def nan(shape, dt):
    return np.full(shape, np.nan, np.float32).astype(D(dt))


def close(got, want, magnitude, dt, atol=1e-30):
    """|got - want| within the dtype's rounding of the sum of |terms| (magnitude), or ``atol``."""
    tol = (2.0 ** -7 if dt == "bf16" else 2e-6) * (magnitude + np.abs(want)) + atol
    err = np.abs(got.astype(np.float64) - want)
    assert np.isfinite(got.astype(np.float64)).all(), "an output element was not written"
    worst = np.unravel_index(np.argmax(err / tol), err.shape)
    assert (err <= tol).all(), f"error {err[worst]} at {worst} over the tolerance {tol[worst]} (got {got[worst]})"


@contextlib.contextmanager
def split_rows():
    """Every GEMM cut into row blocks, whatever its size (the threshold of real calls is far above
    the shapes tested here)."""
    names = [(fc_parallel, "MIN_FLOPS"), (fc_parallel, "BF16_MIN_FLOPS"), (fc_dots, "ROWS_MIN_FLOPS"),
             (fc_dots, "BF16_ROWS_MIN_FLOPS"), (fc_dots, "DOT_MIN_FLOPS")]
    saved = [getattr(module, name) for module, name in names]
    for module, name in names:
        setattr(module, name, 1)
    try:
        yield
    finally:
        for (module, name), value in zip(names, saved):
            setattr(module, name, value)


@given(n=st.integers(1, 24), m=st.integers(1, 24), k=st.integers(1, 24), dt=st.sampled_from(fc.DTYPES),
       act=st.sampled_from(fc.ACTS), bias=st.booleans(), threads=st.sampled_from([1, 1, 3]),
       seed=st.integers(0, 2 ** 16))
def test_forward_and_backward_match_numpy(n, m, k, dt, act, bias, threads, seed):
    with split_rows():
        check_layer(n, m, k, dt, act, bias, threads, seed)


@settings(max_examples=12, deadline=None)
@given(n=st.integers(129, 300), m=st.sampled_from([128, 144, 160, 200, 256]), k=st.sampled_from([64, 128, 192, 200]),
       dt=st.sampled_from(fc.DTYPES), act=st.sampled_from([None, "relu", "gelu"]), threads=st.sampled_from([1, 2]),
       seed=st.integers(0, 2 ** 16))
def test_padded_panels_and_row_runs_match_numpy(n, m, k, dt, act, threads, seed):
    """Shapes whose panels' rows are padded (m or k of 128, 160, 256: rows an even number of lines
    of 512 bytes or more) and whose products go in runs of rows (more than 128 rows, k in blocks)."""
    with split_rows():
        check_layer(n, m, k, dt, act, True, threads, seed, scale=k ** -0.5)


@pytest.mark.parametrize("n, m, k", [(1, 40, 33), (3, 64, 65), (5, 48, 32), (2, 17, 200), (16, 70, 100), (31, 40, 65)])
@pytest.mark.parametrize("dt", fc.DTYPES)
@pytest.mark.parametrize("act", fc.ACTS)
def test_few_rows_against_a_large_weight(n, m, k, dt, act):
    """The forward of gemm_nt's dot products (w streamed as stored), odd k among them, rows of w
    split; the backward's dx reads an fp32 w in place, its columns split."""
    assert fc.dots(n, m, k)
    with split_rows():
        check_layer(n, m, k, dt, act, bias=k % 2 == 1, threads=3, seed=n * m * k, scale=k ** -0.5)
        dx = fc._backward_plan(n, m, k, dt, act, 3).dx
        assert isinstance(dx, fc.StripGemm) if dt == "bf16" else dx.in_place


@pytest.mark.parametrize("n, m, k", [(40, 1, 33), (70, 8, 65), (300, 12, 256), (100, 30, 17), (33, 3, 7)])
@pytest.mark.parametrize("dt", fc.DTYPES)
@pytest.mark.parametrize("act", fc.ACTS)
def test_few_out_features(n, m, k, dt, act):
    """The forward of gemm_nt's dot products for few out features (a classifier's head), the rows of
    x and y split among the threads, each adding the bias to its own rows."""
    assert n > fc.DOT_ROWS and fc.dots(n, m, k)
    with split_rows():
        check_layer(n, m, k, dt, act, bias=k % 2 == 1, threads=3, seed=n * m * k, scale=k ** -0.5)
        gemm = fc._forward_plan(n, m, k, dt, k % 2 == 1, act, 3, act in fc.GELUS).gemm
    assert gemm.by_rows and len(gemm.blocks) == 3


@pytest.mark.parametrize("n, m, k", [(33, 130, 96), (34, 130, 201), (40, 200, 120)])
@pytest.mark.parametrize("dt", fc.DTYPES)
@pytest.mark.parametrize("act", [None, "relu", "gelu"])
@pytest.mark.parametrize("shared_post", [0, 1 << 30])
def test_rows_fewer_than_the_weight(n, m, k, dt, act, shared_post, monkeypatch):
    """The transposed forward ((w @ x.T).T: x, not w, is moved), odd k among them, rows of w split;
    each thread transposing back its block, or the caller all of them (``fc.SHARED_POST``)."""
    assert not fc.dots(n, m, k) and fc.transposed(n, m, k)
    monkeypatch.setattr(fc, "SHARED_POST", shared_post)
    with split_rows():
        check_layer(n, m, k, dt, act, bias=k % 2 == 1, threads=3, seed=n * m * k, scale=k ** -0.5)


@pytest.mark.parametrize("n, m, k, dt, moves_x", [
    (64, 4096, 4096, "f32", True), (96, 4096, 4096, "f32", True), (128, 4096, 4096, "f32", False),
    (128, 4096, 4096, "bf16", True), (191, 1024, 1024, "f32", True), (192, 1024, 1024, "bf16", False),
    (256, 768, 3072, "f32", False), (1024, 1024, 1024, "f32", False), (8, 4096, 4096, "bf16", True)])
def test_the_transposed_forward_is_for_fewer_rows_than_192_and_an_x_of_at_most_1_5_mib(n, m, k, dt, moves_x):
    assert fc.transposed(n, m, k, dt) is moves_x


@pytest.mark.parametrize("n, m, k", [(70, 130, 128), (100, 64, 192), (70, 200, 65), (300, 20, 7)])
@pytest.mark.parametrize("dt", fc.DTYPES)
@pytest.mark.parametrize("act", [None, "relu", "gelu_erf", "gelu_erf_fast"])
@pytest.mark.parametrize("panels", [True, False])
def test_weight_panels(n, m, k, dt, act, panels):
    """The panel GEMMs: W transposed in panels of 64 rows (an edge panel where 64 does not divide
    m) or in one, k in batch blocks of 64 where they divide it, else whole (odd for bf16: W padded);
    in the backward, w and x in panels of 64 columns."""
    assert not fc.dots(n, m, k) and not fc.transposed(n, m, k)
    with split_rows(), panels_from(0 if panels else 1 << 40):
        check_layer(n, m, k, dt, act, bias=True, threads=3, seed=n + m + k, scale=k ** -0.5)


@pytest.mark.parametrize("n, m, k", [(200, 128, 160), (300, 160, 128), (196, 256, 131)])
@pytest.mark.parametrize("dt", fc.DTYPES)
@pytest.mark.parametrize("act", [None, "relu", "gelu_erf"])
@pytest.mark.parametrize("threads", [1, 3])
def test_one_panel_with_padded_rows(n, m, k, dt, act, threads):
    """One panel of W (the forward) and of w or x (the backward's dx and dw, fp32), whose packed
    rows (an even number of 64-byte lines, 512 bytes or more) lie one line further apart: the
    kernels read them at that stride, and nothing of the padding reaches an output. bf16 packings
    by the vnni2 transform (the backward's, an odd k's W) stay contiguous."""
    forward, backward = fc._forward_plan(n, m, k, dt, True, None, 1), fc._backward_plan(n, m, k, dt, None, 1)
    contiguous = dt == "bf16" and k % 2
    assert forward.path == "panels" and forward.gemm.panels == [(0, m)]
    assert forward.gemm.lds == {m: m if contiguous else fc.panel_stride(m)} and fc.panel_stride(m) > m
    assert backward.dw.lds == backward.dx.lds == {k: k if dt == "bf16" else fc.panel_stride(k)}
    with split_rows():
        check_layer(n, m, k, dt, act, bias=True, threads=threads, seed=n + m + k, scale=k ** -0.5)


@pytest.mark.parametrize("n, m, k, dt", [(130, 200, 2048, "f32"), (128, 192, 2112, "f32"), (128, 200, 4160, "bf16")])
@pytest.mark.parametrize("threads", [1, 2])
def test_transposed_forward_in_runs(n, m, k, dt, threads):
    """The transposed forward of an x.T over 1 MiB: w's rows in runs, k in batch blocks of 64, x.T's
    rows padded where 128 of them would be 512 bytes apart."""
    plan = fc._forward_plan(n, m, k, dt, True, "relu", threads)
    assert plan.path == "transposed" and plan.gemm.bk == fc.PANEL_K and plan.pack_x.ld == fc.panel_stride(n)
    assert sum(len(run) for run in plan.gemm.runs) == 2
    check_layer(n, m, k, dt, "relu", bias=True, threads=threads, seed=n + m + k, scale=k ** -0.5)


@pytest.mark.parametrize("n, m, k", [(3, 40, 33), (70, 130, 128), (20, 200, 65), (9, 3, 7), (30, 64, 64)])
@pytest.mark.parametrize("dt", fc.DTYPES)
@pytest.mark.parametrize("act", fc.ACTS)
@pytest.mark.parametrize("panels, dots_bytes", [(64, 1 << 40), (128, 1 << 40), (None, 1 << 40), (None, 0)])
def test_packed_weights(n, m, k, dt, act, panels, dots_bytes, monkeypatch):
    """fc.pack: w in panels of 64 or 128 rows (an edge panel where they do not divide m) or in
    one, the threads taking runs of panels or of rows; up to DOT_ROWS rows stream w itself where
    its packing outgrows PACKED_DOTS_BYTES."""
    monkeypatch.setattr(fc, "PACKED_DOTS_BYTES", dots_bytes)
    monkeypatch.setattr(fc, "PACKED_PANEL_BYTES", (panels or 0) * k * (2 if dt == "bf16" else 4))
    rng = np.random.default_rng(n + m + k)
    x = (rng.standard_normal((n, k)) * k ** -0.5).astype(np.float32).astype(D(dt))
    w = rng.standard_normal((m, k)).astype(np.float32).astype(D(dt))
    b = rng.standard_normal(m).astype(np.float32)
    with split_rows(), panels_from(0 if panels else 1 << 40), native_calls_only():
        packed = fc.pack(w)
        assert len(packed.panels) == (-(-m // panels) if panels else 1)
        y, z = fc.forward(x, packed, b, act, out=nan((n, m), dt), threads=3)
        y2, _ = fc.forward(x, packed, b, act, out=nan((n, m), dt), pre=False, threads=3)
        path = fc._forward_plan(n, m, k, dt, True, act, 3, act in fc.GELUS, True).path
    assert path == ("dots" if fc.dots(n, m, k) and (n <= fc.PACKED_DOT_ROWS or not dots_bytes) else "panels")
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    z64, mag = x64 @ w64.T + b, np.abs(x64) @ np.abs(w64).T + np.abs(b)
    want = z64 if act is None else UNARY_OPS[act](z64)
    if z is not None:
        close(z, z64, mag, dt)
    close(y, want, 1.13 * mag, dt, atol=act_error(act, z64))
    close(y2, want, 1.13 * mag, dt, atol=act_error(act, z64))


@pytest.mark.parametrize("n, m, k", [(3, 131, 40), (9, 200, 33), (16, 129, 70), (41, 67, 20)])
@pytest.mark.parametrize("act", [None, "gelu"])
def test_few_rows_bf16_dx_in_strips(n, m, k, act):
    """bf16 dx for up to STRIP_ROWS rows: w packed a strip of its rows at a time (strips of 64
    here, the last one shorter and odd), each thread taking a run of its columns."""
    with split_rows(), fc_setting("STRIP_BYTES", 0):
        dx = fc._backward_plan(n, m, k, "bf16", act, 3).dx
        strips = dx.strips
        assert isinstance(dx, fc.StripGemm) and not isinstance(fc._backward_plan(65, m, k, "bf16", act, 3).dx,
                                                               fc.StripGemm)
        assert len(strips) == -(-m // 64) and strips[-1][1] - strips[-1][0] == m % 64
        check_layer(n, m, k, "bf16", act, bias=True, threads=3, seed=n * m * k, scale=k ** -0.5)


def panels_from(nbytes):
    """Weights of more than ``nbytes`` in panels (real calls: above a core's L2)."""
    return fc_setting("PANEL_BYTES", nbytes)


@contextlib.contextmanager
def fc_setting(name, value):
    """fc's constant ``name`` set to ``value`` (its plans made anew) while the block runs."""
    saved = getattr(fc, name)
    setattr(fc, name, value)
    fc._forward_plan.cache_clear()
    fc._backward_plan.cache_clear()
    try:
        yield
    finally:
        setattr(fc, name, saved)
        fc._forward_plan.cache_clear()
        fc._backward_plan.cache_clear()


@contextlib.contextmanager
def native_calls_only():
    """Fail a call of any kernel that its native entry refused and handed to the Python path (a
    batch stride unlike the kernel's, say), which costs 10-20 us a call on a 2-vCPU Zen 4: the
    packed operands fc builds must be exactly what its kernels were built for."""
    calls = []
    if not NATIVE:
        yield calls
        return
    slow = kernel.Kernel._slow_call

    def spy(self, arrays, values):
        calls.append(f"{self.desc} with {[(a.shape, a.strides) for a in arrays]}")
        return slow(self, arrays, values)
    kernel.Kernel._slow_call = spy
    try:
        yield calls
    finally:
        kernel.Kernel._slow_call = slow
    assert not calls, f"{len(calls)} kernel call(s) took the Python path: {calls[0]}"


NATIVE = NATIVE_CHECKS and platform.machine() in ("x86_64", "AMD64")


def check_layer(n, m, k, dt, act, bias, threads, seed, scale=1.0):
    with native_calls_only():
        _check_layer(n, m, k, dt, act, bias, threads, seed, scale)


def _check_layer(n, m, k, dt, act, bias, threads, seed, scale=1.0):
    """``scale``: of x, so that long rows keep z near 1, where the gelu gradients' own accuracy
    (tested in test_eltwise) is not lost in the tolerance of tiny values."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, k)) * scale).astype(np.float32).astype(D(dt))
    w = rng.standard_normal((m, k)).astype(np.float32).astype(D(dt))
    b = rng.standard_normal(m).astype(np.float32) if bias else None
    gelu = act in fc.GELUS
    y, z = fc.forward(x, w, b, act, out=nan((n, m), dt), pre=nan((n, m), dt) if gelu else None, threads=threads)
    if gelu:
        check_fused_gelu(x, w, b, act, dt, threads)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    z64 = x64 @ w64.T + (0 if b is None else b)
    mag = np.abs(x64) @ np.abs(w64).T + (0 if b is None else np.abs(b))
    if gelu:
        close(z, z64, mag, dt)
        # the activation of the stored z (the TPP's own accuracy is tested in test_eltwise)
        close(y, UNARY_OPS[act](z.astype(np.float64)), 0, dt, atol=act_error(act, z))
    else:
        close(y, z64 if act is None else np.maximum(z64, 0), mag, dt)
    dy = rng.standard_normal((n, m)).astype(np.float32).astype(D(dt))
    saved = y if act == "relu" else z
    outs = (nan((n, k), dt), nan((m, k), dt), nan((m,), "f32"))
    dx, dw, db = fc.backward(dy, x, w, act, saved, *outs, threads=threads)
    assert all(a is b for a, b in zip((dx, dw, db), outs))
    dz = dy.astype(np.float64)
    # the gelu gradient TPPs' absolute error (test_math_accuracy), carried through each product
    err = np.abs(dz) * 2.0 ** -20 if gelu else np.zeros_like(dz)
    if act is not None:
        dz = dz * GRAD_OPS[fc.GRADIENTS[act]](saved.astype(np.float64))
    close(dx, dz @ w64, np.abs(dz) @ np.abs(w64), dt, atol=err @ np.abs(w64) + 1e-30)
    close(dw, dz.T @ x64, np.abs(dz).T @ np.abs(x64), dt, atol=err.T @ np.abs(x64) + 1e-30)
    close(db, dz.sum(0), np.abs(dz).sum(0), dt, atol=err.sum(0) + 1e-30)


def check_fused_gelu(x, w, b, act, dt, threads):
    """``pre=False``: the gelu fused (no z), y within the sums' rounding times the gelu's slope
    (at most 1.13) plus its own error (:func:`act_error`; bf16 C: 2^-16 of |y|) of act(x @ w.T + b)."""
    (n, _), m = x.shape, w.shape[0]
    y, z = fc.forward(x, w, b, act, out=nan((n, m), dt), pre=False, threads=threads)
    assert z is None
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    z64 = x64 @ w64.T + (0 if b is None else b)
    mag = np.abs(x64) @ np.abs(w64).T + (0 if b is None else np.abs(b))
    want = UNARY_OPS[act](z64)
    close(y, want, 1.13 * mag, dt, atol=1e-6 * np.abs(want) + act_error(act, z64))


def test_pre_and_gradients_take_python_and_numpy_bools():
    """``pre=True`` and ``np.True_`` allocate z as None does; ``np.False_`` fuses the gelu as False does;
    backward's dx, dw, db take NumPy's bools as Python's."""
    x, w = np.ones((2, 3), np.float32), np.full((4, 3), 0.5, np.float32)
    y, z = fc.forward(x, w, act="gelu")
    for pre in (True, np.True_):
        y2, z2 = fc.forward(x, w, act="gelu", pre=pre)
        assert np.array_equal(y2, y) and np.array_equal(z2, z)
    y3, z3 = fc.forward(x, w, act="gelu", pre=np.False_)
    assert z3 is None and np.allclose(y3, y, rtol=1e-6)
    dy = np.ones((2, 4), np.float32)
    dx, dw, db = fc.backward(dy, x, w, dx=np.False_, dw=np.True_, db=False)
    assert dx is None and db is None and np.array_equal(dw, fc.backward(dy, x, w)[1])


def act_error(act, z):
    """The absolute error an activation TPP may add at z (gelu_erf_fast: its contract)."""
    return ACCURACY_ABS[act] * np.maximum(1, np.abs(z.astype(np.float64))) if act in ACCURACY_ABS else 1e-7


def test_row_blocks():
    assert fc.RowGemm(10, 4, 4, threads=3, min_flops=1).blocks == [(0, 4), (4, 7), (7, 10)]
    assert fc.RowGemm(2, 4, 4, threads=3, min_flops=1).blocks == [(0, 1), (1, 2)]
    assert fc.RowGemm(512, 512, 512, threads=4).blocks == [(0, 128), (128, 256), (256, 384), (384, 512)]
    assert len(fc.RowGemm(64, 64, 64, threads=4).blocks) == 1          # too little work to share


def test_one_panel_is_cut_per_thread_for_few_rows():
    """A weight of one panel shared by two threads: for up to COLUMN_SPLIT_ROWS rows each thread packs
    and multiplies its own columns (whole vectors of 16 but the last), above them row blocks share it."""
    few = fc.PanelGemm(fc.COLUMN_SPLIT_ROWS, 1000, 64, threads=2)
    assert few.panels == [(0, 512), (512, 1000)] and few.groups == [[(0, 512, 0, 256)], [(512, 1000, 0, 256)]]
    assert few.blocks == [(0, fc.COLUMN_SPLIT_ROWS)]
    many = fc.PanelGemm(fc.COLUMN_SPLIT_ROWS + 1, 1000, 64, threads=2)
    assert many.panels == [(0, 1000)] and many.groups is None and len(many.blocks) == 2
    assert fc.PanelGemm(64, 1000, 64, threads=1).panels == [(0, 1000)]
    assert fc.PanelGemm(64, 1000, 64, threads=2, b_layout="km").panels == [(0, 1000)]     # (the backward's)


def test_row_blocks_run_in_a_forked_child():
    x, w = np.ones((64, 64), np.float32), np.ones((64, 64), np.float32)
    with split_rows():
        fc.forward(x, w, threads=2)                       # the parent's pool has threads now
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(1) as pool:                         # the child has none: it must not wait for them
            y = pool.apply_async(fc.forward, (x, w), dict(threads=2)).get(timeout=30)[0]
    assert (y == 64).all()


def test_backward_computes_only_what_is_asked():
    x, w, dy = np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), np.ones((2, 4), np.float32)
    assert fc.backward(dy, x, w, dx=False, dw=False, db=False) == (None, None, None)
    dx, dw, db = fc.backward(dy, x, w, dw=False)
    assert dw is None and dx.tolist() == [[4.0] * 3] * 2 and db.tolist() == [2.0] * 4


@pytest.mark.parametrize("n, m, k", [(0, 3, 2), (2, 0, 3), (2, 3, 0), (0, 0, 0)])
def test_empty_dimensions(n, m, k):
    x, w, b = np.ones((n, k), np.float32), np.ones((m, k), np.float32), np.full(m, -1.0, np.float32)
    y, _ = fc.forward(x, w, b, "relu")
    assert y.shape == (n, m) and (y == max(k - 1.0, 0)).all()
    dx, dw, db = fc.backward(np.ones((n, m), np.float32), x, w, "relu", y)
    assert dx.shape == (n, k) and dw.shape == (m, k) and db.shape == (m,)
    assert not dx.any() and not dw.any() and (db == (n if k > 1 else 0)).all()


@pytest.mark.parametrize("call, message", [
    (lambda: fc.forward(np.ones((2, 3)), np.ones((4, 3))), "float32 or all bfloat16"),
    (lambda: fc.forward(np.ones((2, 3), np.float32), np.ones((4, 3), D("bf16"))), "float32 or all bfloat16"),
    (lambda: fc.forward(np.ones((2, 3), np.float32), np.ones((4, 2), np.float32)), "out_features, 3"),
    (lambda: fc.forward(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), np.ones(3, np.float32)),
     "bias must be float32 of shape \\(4,\\)"),
    (lambda: fc.forward(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), act="tanh"), "act='tanh'"),
    (lambda: fc.forward(np.ones((2, 4), np.float32), fc.pack(np.ones((3, 3), np.float32))), "out_features, 4"),
    (lambda: fc.forward(np.ones((2, 3), D("bf16")), fc.pack(np.ones((3, 3), np.float32))), "float32 or all bfloat16"),
    (lambda: fc.backward(np.ones((2, 4), np.float32), np.ones((2, 3), np.float32), np.ones((4, 3), np.float32),
                         "relu"), "saved must be y"),
])
def test_bad_arguments_are_explained(call, message):
    with pytest.raises(ValueError, match=message):
        call()


X, W, DY = np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), np.ones((2, 4), np.float32)


def read_only(shape, dt="f32"):
    a = np.zeros(shape, D(dt))
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("call, error, message", [
    (lambda: fc.forward(X, W, [0.0] * 4), TypeError, r"fc.forward: bias is a list; .* np.asarray\(bias, np.float32\)"),
    (lambda: fc.forward([[1.0] * 3] * 2, W), TypeError, r"fc.forward: x is a list; .* np.asarray\(x, np.float32\)"),
    (lambda: fc.pack([[1.0] * 3] * 2), TypeError, r"fc.pack: w is a list; .* np.asarray\(w, np.float32\)"),
    (lambda: fc.forward(X, W, act="relu", pre=np.zeros((2, 4), np.float32)), ValueError,
     r"fc.forward: pre is given with act='relu', which has no pre-activation .* pass pre=None"),
    (lambda: fc.forward(X, W, pre="garbage"), ValueError, "pre is given with act=None"),
    (lambda: fc.forward(X, W, act="relu", pre=np.True_), ValueError, "pre is given with act='relu'"),
    (lambda: fc.forward(X, W, act="gelu", pre="garbage"), TypeError,
     r"fc.forward: pre must be a C-contiguous writable float32 array of shape \(2, 4\), got str"),
    (lambda: fc.forward(X, W, act="gelu", pre=np.zeros((4, 2), np.float32)), ValueError,
     r"fc.forward: pre must be .* got float32 of shape \(4, 2\)"),
    (lambda: fc.forward(X, W, act="gelu", pre=read_only((2, 4))), ValueError, "fc.forward: pre .* read-only"),
    (lambda: fc.forward(X, W, out=read_only((2, 4))), ValueError,
     r"fc.forward: out must be a C-contiguous writable .* got float32 of shape \(2, 4\), read-only; pass such an "
     "array"),
    (lambda: fc.backward(DY, X, W, "relu", np.ones((2, 4))), ValueError,
     r"fc.backward: saved has dtype float64, x float32; .* saved.astype\(x.dtype\)"),
    (lambda: fc.backward(DY, X, W, "gelu", np.ones((2, 4), D("bf16"))), ValueError, "saved has dtype bfloat16"),
    (lambda: fc.backward(DY, X, W, dx=read_only((2, 3))), ValueError,
     "fc.backward: dx must be a C-contiguous writable .* read-only"),
    (lambda: fc.backward(DY, X, W, dw=read_only((4, 3))), ValueError, "fc.backward: dw .* read-only"),
    (lambda: fc.backward(DY, X, W, db=read_only(4)), ValueError, "fc.backward: db .* read-only"),
    (lambda: fc.backward(DY, X, W, db=np.zeros(4, D("bf16"))), ValueError,
     "db must be a C-contiguous writable float32"),
    (lambda: fc.backward(DY, X, W, dx=None), TypeError,
     r"fc.backward: dx must be .* got NoneType; .* or pass True \(allocated\) or False \(not computed\)"),
])
def test_own_arguments_are_named(call, error, message):
    """fc's own arguments are checked before any kernel sees them, and refusals name them (not a
    kernel's operand) with the type the fault is of."""
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("threads, error", [("2", TypeError), (None, TypeError), ([2], TypeError), (True, TypeError),
                                            (2.5, TypeError), (np.float32(2), TypeError), (0, ValueError),
                                            (-3, ValueError), (np.int64(0), ValueError)])
def test_threads_must_be_a_positive_int(threads, error):
    with pytest.raises(error, match=r"fc.forward: threads=.* expected an int >= 1"):
        fc.forward(X, W, threads=threads)
    with pytest.raises(error, match=r"fc.backward: threads=.* expected an int >= 1"):
        fc.backward(DY, X, W, threads=threads)


def test_threads_takes_numpy_integers():
    for threads in (1, np.int64(3), np.uint8(2)):
        assert (fc.forward(X, W, threads=threads)[0] == 3).all()
        assert (fc.backward(DY, X, W, threads=threads)[2] == 2).all()
    assert (fc.forward(X, W)[0] == 3).all()                 # the default: one thread


@pytest.mark.parametrize("n", [3, 20, 70])                  # the dots, transposed and panel forwards
@pytest.mark.parametrize("dt", fc.DTYPES)
def test_strided_inputs_are_taken_and_strided_outputs_refused(n, dt):
    """Views with row strides past their width (x, w, dy, a bias slice) give the dense result; an
    output that is not a C-contiguous array of the right shape and dtype is refused, naming it."""
    rng = np.random.default_rng(n)
    m, k = 90, 64
    x = rng.standard_normal((n, k + 6)).astype(np.float32).astype(D(dt))[:, :k]
    w = rng.standard_normal((m, k + 3)).astype(np.float32).astype(D(dt))[:, :k]
    b = rng.standard_normal(2 * m).astype(np.float32)[::2]
    y, _ = fc.forward(x, w, b, "relu")
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    close(y, np.maximum(x64 @ w64.T + b, 0), np.abs(x64) @ np.abs(w64).T + np.abs(b), dt)
    dy = rng.standard_normal((n, m + 5)).astype(np.float32).astype(D(dt))[:, :m]
    dx, dw, db = fc.backward(dy, x, w)
    dy64 = dy.astype(np.float64)
    close(dx, dy64 @ w64, np.abs(dy64) @ np.abs(w64), dt)
    close(dw, dy64.T @ x64, np.abs(dy64).T @ np.abs(x64), dt)
    wide = nan((n, m + 4), dt)[:, :m]
    with pytest.raises(ValueError, match=r"out must be a C-contiguous .* not contiguous; pass such an array"):
        fc.forward(x, w, out=wide)
    with pytest.raises(ValueError, match="dw must be a C-contiguous"):
        fc.backward(dy, x, w, dw=nan((m, k), "f32" if dt == "bf16" else "bf16"))
    with pytest.raises(ValueError, match="x must be a 2-D array"):
        fc.forward(x[0], w)


def _overlaps(n):
    """(call, message) pairs: fc calls whose outputs share memory with an input or with each other,
    on n x n operands (n = 64: one panel; 512: several, and two threads take parts)."""
    rng = np.random.default_rng(n)
    x, w, dy = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(3))
    o, buf = np.empty((n, n), np.float32), np.empty(2 * n * n, np.float32)
    part = buf[n * n // 2:][:n * n].reshape(n, n)           # half over x2, half past it
    x2 = buf[:n * n].reshape(n, n)
    x2[...] = x
    return [
        (lambda t: fc.forward(x, w, out=x, threads=t), "fc.forward: out shares memory with the input x"),
        (lambda t: fc.forward(x, w, out=w, threads=t), "out shares memory with the input w"),
        (lambda t: fc.forward(x, fc.pack(w), out=w, threads=t), "out shares memory with the input w"),
        (lambda t: fc.forward(x2, w, out=part, threads=t), "out shares memory with the input x"),
        (lambda t: fc.forward(x, w, o[3], out=o, threads=t), "out shares memory with the input bias"),
        (lambda t: fc.forward(x, w, act="gelu", out=o, pre=o, threads=t), "pre shares memory with the output out"),
        (lambda t: fc.forward(x, w, act="gelu", pre=x, threads=t), "pre shares memory with the input x"),
        (lambda t: fc.backward(dy, x, w, dx=x, threads=t), "fc.backward: dx shares memory with the input x"),
        (lambda t: fc.backward(dy, x, w, dx=dy, threads=t), "dx shares memory with the input dy"),
        (lambda t: fc.backward(dy, x, w, dx=False, dw=dy, threads=t), "dw shares memory with the input dy"),
        (lambda t: fc.backward(dy, x, w, dx=o, dw=o, threads=t), "dw shares memory with the output dx"),
        (lambda t: fc.backward(dy, x, w, db=dy[0], threads=t), "db shares memory with the input dy"),
        (lambda t: fc.backward(dy, x, w, "relu", x, dw=x, threads=t), "dw shares memory with the input x"),
    ]


@pytest.mark.parametrize("case", range(len(_overlaps(8))))
@pytest.mark.parametrize("n, threads", [(64, 1), (512, 2)])
def test_outputs_sharing_memory_are_refused(case, n, threads):
    """An output given that shares memory with an input or another output would be read after a
    kernel wrote it (a wrong result, on threads with no kernel check at all): refused with an
    OperandError naming both and the fix."""
    call, message = _overlaps(n)[case]
    with pytest.raises(OperandError, match=message + r".*pass a separate array .* or let it be allocated"):
        call(threads)


def test_separate_outputs_are_taken():
    rng = np.random.default_rng(0)
    x, w, dy = (rng.standard_normal((16, 16)).astype(np.float32) for _ in range(3))
    buf = np.full(3 * 256 + 16, np.nan, np.float32)          # outputs side by side in one buffer
    dx, dw, db = buf[:256].reshape(16, 16), buf[256:512].reshape(16, 16), buf[512:528]
    fc.backward(dy, x, w, dx=dx, dw=dw, db=db)
    y, z = fc.forward(x, w, act="gelu", out=buf[528:784].reshape(16, 16), pre=np.empty((16, 16), np.float32))
    assert np.allclose(dx, dy @ w, atol=1e-4) and np.allclose(dw, dy.T @ x, atol=1e-4)
    assert np.allclose(db, dy.sum(0), atol=1e-5) and np.allclose(z, x @ w.T, atol=1e-4)


def test_native_calls_are_checked_in_tests():
    """The suite turns fc_parallel.CHECK_RAW_CALLS on: a view that does not fit its kernel is refused
    before any native code runs, on the pool path as on one thread."""
    import functools
    from tppasm.eltwise import unary
    from tppasm.operand import OperandError
    assert fc_parallel.CHECK_RAW_CALLS
    k = unary("relu", 2, 3)
    good = functools.partial(k, np.ones((2, 3), np.float32), np.empty((2, 3), np.float32))
    bad = functools.partial(k, np.ones((2, 3), np.float32), np.empty((2, 2), np.float32))
    for shares in ([[bad]], [[good], [bad]]):
        with pytest.raises(OperandError, match="shape"):
            fc_parallel.parallel_kernels(shares)
