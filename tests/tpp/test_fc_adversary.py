"""An adversarial pass over tppasm.fc: shapes at and around every plan threshold (the dots, few
columns, mid-size dots, transposed and panel forwards; the strip and panel backwards), operands
against inaccessible pages, non-finite and extreme values, thread counts, packed weights and the
arguments a careless caller passes. References are float64 NumPy; outputs are poisoned with NaN."""
import copy
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support import assert_same_non_finite, threads_disagreeing
from tests.tpp.test_fc import act_error, check_layer, close, fc_setting, nan, native_calls_only, split_rows
from tests.tpp.test_transform_tails import _guarded
from tppasm import fc
from tppasm.dtypes import dtype as D
from tppasm.eltwise import GRAD_OPS, UNARY_OPS

# (n, m, k, path of the fp32 forward, path of the bf16 one), pairs on either side of a threshold
BOUNDARIES = [
    (32, 64, 64, "dots", "dots"), (33, 64, 64, "panels", "panels"),                  # DOT_ROWS
    (31, 40, 129, "dots", "dots"), (33, 40, 129, "dots", "dots"),                    # past it: mid_dots
    (300, 8, 64, "dots", "dots"), (300, 9, 64, "panels", "panels"),                  # DOT_COLUMNS
    (300, 16, 256, "dots", "dots"), (300, 16, 255, "panels", "panels"),              # 16 columns, k >= 256
    (256, 32, 64, "dots", "dots"), (257, 32, 64, "panels", "panels"),                # 32 columns, n <= 256
    (64, 512, 512, "dots", "transposed"), (64, 513, 512, "transposed", "transposed"),  # MID_DOTS_MAX, bytes
    (48, 512, 512, "dots", "dots"), (49, 512, 512, "dots", "transposed"),            # MID_DOTS_BF16_ROWS
    (191, 1024, 1024, "transposed", "transposed"), (192, 1024, 1024, "panels", "panels"),  # TRANSPOSED_ROWS
    (200, 256, 1024, "panels", "panels"), (200, 257, 1024, "panels", "panels"),      # PANEL_BYTES 1 MiB: one / 64s
    (200, 513, 512, "panels", "panels"),                                              # an edge panel of 1
    (65, 100, 70, "panels", "panels"), (64, 100, 70, "panels", "panels"),            # STRIP_ROWS (bf16 dx)
    (40, 70, 1, "panels", "panels"), (40, 70, 63, "panels", "panels"), (70, 70, 64, "panels", "panels"),
    (70, 70, 65, "panels", "panels"), (70, 70, 128, "panels", "panels"),             # k: PANEL_K blocks
    (8, 70, 1, "dots", "dots"), (8, 70, 65, "dots", "dots"), (2, 70000, 2, "dots", "dots"),
    (1, 1, 1, "dots", "dots"), (1, 4097, 3, "dots", "dots"), (3, 5, 4097, "dots", "dots"),
    (1000, 1, 1000, "dots", "dots"), (70, 130, 4097, "transposed", "transposed"), (257, 63, 65, "panels", "panels"),
]


def plan_path(n, m, k, dt, packed=False):
    return fc._forward_plan(n, m, k, dt, True, "relu", 1, False, packed).path


@pytest.mark.parametrize("dt", fc.DTYPES)
@pytest.mark.parametrize("case", BOUNDARIES, ids=lambda c: "x".join(map(str, c[:3])))
def test_shapes_around_every_plan_threshold(case, dt):
    """Each shape takes the path it is listed for (so the pairs straddle the thresholds), and its
    forward and backward match NumPy with the threads taking parts (COLUMN_SPLIT_ROWS, the row and
    column splits, the strips of a bf16 dx below STRIP_ROWS)."""
    n, m, k = case[:3]
    assert plan_path(n, m, k, dt) == case[3 + (dt == "bf16")]
    act = fc.ACTS[(n + m + k) % len(fc.ACTS)]
    with split_rows():
        check_layer(n, m, k, dt, act, bias=(n + k) % 2 == 0, threads=2 + n % 2, seed=n * m + k, scale=k ** -0.5)


@pytest.mark.parametrize("n, path", [(16, "dots"), (17, "panels")])
@pytest.mark.parametrize("dt", fc.DTYPES)
def test_packed_weights_around_packed_dot_rows(n, path, dt):
    """Up to PACKED_DOT_ROWS rows a packed weight is streamed as stored, past them its panels are read:
    both match the unpacked forward, and a pickled or copied packing gives the same bits."""
    m, k = 128, 64
    assert plan_path(n, m, k, dt, packed=True) == path
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, k)).astype(np.float32).astype(D(dt))
    w = rng.standard_normal((m, k)).astype(np.float32).astype(D(dt))
    b = rng.standard_normal(m).astype(np.float32)
    packed = fc.pack(w)
    y, _ = fc.forward(x, packed, b, "relu", out=nan((n, m), dt))
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    close(y, np.maximum(x64 @ w64.T + b, 0), np.abs(x64) @ np.abs(w64).T + np.abs(b), dt)
    for other in (pickle.loads(pickle.dumps(packed)), copy.deepcopy(packed), copy.copy(packed)):
        assert np.array_equal(fc.forward(x, other, b, "relu")[0], y)


def test_a_packing_is_stale_after_the_weight_changes_until_packed_again():
    """pack's documented contract: w must not change while its packing is used. The panels keep the
    old weight (17 rows), the dots (16 rows) stream the new one; packing again gives the new product."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((128, 64)).astype(np.float32)
    x = rng.standard_normal((17, 64)).astype(np.float32)
    packed, old = fc.pack(w), w.copy()
    w *= 2
    assert np.allclose(fc.forward(x, packed)[0], x @ old.T, atol=1e-4)
    assert np.allclose(fc.forward(x[:16], packed)[0], x[:16] @ w.T, atol=1e-4)
    assert np.allclose(fc.forward(x, fc.pack(w))[0], x @ w.T, atol=1e-4)


def test_backward_takes_a_packed_weight():
    """A PackedWeight passed to backward (as forward takes it) is its weight as stored."""
    rng = np.random.default_rng(1)
    x, w, dy = (rng.standard_normal(s).astype(np.float32) for s in ((5, 7), (3, 7), (5, 3)))
    got = fc.backward(dy, x, fc.pack(w))
    want = fc.backward(dy, x, w)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


# -- operands against inaccessible pages -----------------------------------------------------------
GUARD_SHAPES = [(4, 100, 70), (100, 5, 33), (64, 64, 256), (40, 200, 121), (300, 70, 65), (33, 40, 129), (1, 1, 1),
                (3, 17, 1), (2, 1, 3), (70, 130, 128)]


def guarded(shape, dt, at_end, fill):
    """A C-contiguous array of ``shape`` right before (``at_end``) or right after a PROT_NONE page."""
    a = _guarded(int(np.prod(shape)), dt, at_end).reshape(shape)
    a[...] = np.asarray(fill, np.float32).astype(D(dt))
    return a


@pytest.mark.parametrize("n, m, k", GUARD_SHAPES)
@pytest.mark.parametrize("dt", fc.DTYPES)
@pytest.mark.parametrize("at_end", [True, False])
def test_no_byte_outside_an_operand_is_touched(n, m, k, dt, at_end):
    """x, w, bias, dy and the saved activation end at (or start after) an inaccessible page, the
    outputs start after (or end at) one: a read or write past any of them faults. Every path,
    packed too, on one thread and on three."""
    rng = np.random.default_rng(n + m + k)

    def operand(shape, scale=1.0, d=dt):
        return guarded(shape, d, at_end, rng.standard_normal(shape) * scale)

    x, w, dy, b = operand((n, k), k ** -0.5), operand((m, k)), operand((n, m)), operand((m,), d="f32")
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    want = UNARY_OPS["gelu"](x64 @ w64.T + b)
    with split_rows():
        for threads in (1, 3):
            out, pre = guarded((n, m), dt, not at_end, np.nan), guarded((n, m), dt, not at_end, np.nan)
            y, z = fc.forward(x, w, b, "gelu", out=out, pre=pre, threads=threads)
            close(y, want, 1.13 * (np.abs(x64) @ np.abs(w64).T + np.abs(b)), dt, atol=1e-6)
            y2, _ = fc.forward(x, fc.pack(w), b, "gelu", out=guarded((n, m), dt, not at_end, np.nan), pre=False,
                               threads=threads)
            close(y2, want, 1.13 * (np.abs(x64) @ np.abs(w64).T + np.abs(b)), dt, atol=1e-6)
            saved = guarded((n, m), dt, at_end, z.astype(np.float32))
            grads = (guarded((n, k), dt, not at_end, np.nan), guarded((m, k), dt, not at_end, np.nan),
                     guarded((m,), "f32", not at_end, np.nan))
            fc.backward(dy, x, w, "gelu", saved, *grads, threads=threads)
            dz = dy.astype(np.float64) * GRAD_OPS["gelu_bwd"](saved.astype(np.float64))
            err = 2.0 ** -20 * np.abs(dy.astype(np.float64))
            close(grads[0], dz @ w64, np.abs(dz) @ np.abs(w64), dt, atol=err @ np.abs(w64) + 1e-30)
            close(grads[1], dz.T @ x64, np.abs(dz).T @ np.abs(x64), dt, atol=err.T @ np.abs(x64) + 1e-30)
            close(grads[2], dz.sum(0), np.abs(dz).sum(0), dt, atol=err.sum(0) + 1e-30)


# -- values ----------------------------------------------------------------------------------------
PATH_SHAPES = {"dots": (4, 100, 70), "few columns": (100, 5, 33), "mid dots": (64, 64, 256),
               "transposed": (40, 200, 121), "one panel": (300, 70, 65), "panels": (200, 257, 1024),
               "row dots": (33, 40, 129)}


@pytest.mark.parametrize("shape", PATH_SHAPES.values(), ids=PATH_SHAPES.keys())
@pytest.mark.parametrize("dt", fc.DTYPES)
def test_nan_and_inf_propagate_as_in_numpy(shape, dt):
    """NaN, inf and -inf in x, w, the bias and dy give NaN and infinities where float64 NumPy has
    them, forward (every activation, a gelu kept or fused) and backward (relu's gradient passes dy
    where y > 0 or is NaN, else 0, as torch does)."""
    n, m, k = shape
    rng = np.random.default_rng(n * m)
    x, w, b = rng.standard_normal((n, k)), rng.standard_normal((m, k)), rng.standard_normal(m)
    x[0, 0], x[1 % n, k - 1], x[2 % n, 3] = np.nan, np.inf, -np.inf
    w[0, 5], w[m - 1, k - 1], b[1 % m], b[2 % m] = np.inf, -np.inf, np.nan, -np.inf
    x, w = x.astype(np.float32).astype(D(dt)), w.astype(np.float32).astype(D(dt))
    b = b.astype(np.float32)
    dy = rng.standard_normal((n, m)).astype(np.float32)
    dy[0, m - 1], dy[n - 1, 0] = np.nan, np.inf
    dy = dy.astype(D(dt))
    x64, w64, dy64 = x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64)
    with np.errstate(all="ignore"):
        z64 = x64 @ w64.T + b
        for act in fc.ACTS:
            want = z64 if act is None else UNARY_OPS[act](z64)
            for pre in ((False, None) if act in fc.GELUS else (None,)):        # (None last: z for the backward)
                y, z = fc.forward(x, w, b, act, out=nan((n, m), dt), pre=pre, threads=2)
                assert_same_non_finite(y, want, f"y of {act} pre={pre}")
            saved = None if act is None else y if act == "relu" else z
            dx, dw, db = fc.backward(dy, x, w, act, saved, threads=2)
            dz = dy64
            if act is not None:
                s = saved.astype(np.float64)
                dz = np.where(~(s <= 0), dy64, 0) if act == "relu" else dy64 * GRAD_OPS[fc.GRADIENTS[act]](s)
            assert_same_non_finite(dx, dz @ w64, f"dx of {act}")
            assert_same_non_finite(dw, dz.T @ x64, f"dw of {act}")
            assert_same_non_finite(db, dz.sum(0), f"db of {act}")


@pytest.mark.parametrize("shape", PATH_SHAPES.values(), ids=PATH_SHAPES.keys())
def test_extreme_values(shape):
    """Products past fp32's range are inf as in float32 NumPy (same signs: no inf - inf), values near
    its top and fp32 subnormals are kept (no flush to zero), relu(-0.0 sums) is 0."""
    n, m, k = shape
    x, w = np.full((n, k), 3e38, np.float32), np.full((m, k), 2, np.float32)
    assert (fc.forward(x, w)[0] == np.inf).all() and (fc.forward(-x, w, act="relu")[0] == 0).all()
    for value in (np.float32(1e37 / k), np.float32(1e-39)):          # near the top; subnormal
        x = np.full((n, k), value, np.float32)
        sums(fc.forward(x, w)[0], 2.0 * k * value, k)
        dy = np.full((n, m), value, np.float32)
        sums(fc.backward(dy, x, w)[0], 2.0 * m * value, m)
        sums(fc.backward(dy, np.ones((n, k), np.float32), w)[1], n * float(value), n)


def sums(got, want, terms):
    """``got`` is the fp32 sum ``want`` of ``terms`` terms of one sign: within terms fp32 ulps."""
    assert np.isfinite(got).all() and (np.abs(got - want) <= terms * 2.0 ** -24 * want).all(), (got, want)


@pytest.mark.parametrize("shape", PATH_SHAPES.values(), ids=PATH_SHAPES.keys())
@pytest.mark.parametrize("act", [None, "relu", "gelu"])
def test_bf16_results_are_rounded_once_from_fp32_sums(shape, act):
    """The docstrings' bf16 contract: exact products, fp32 sums, one rounding to bf16 (with the bias
    and relu, or a gelu fused by pre=False): within half a bf16 ulp of the fp32 sum (through the
    gelu: its slope, at most 1.13, and its own error), whose own error is at most k + 1 fp32 ulps of
    the sum of |terms| (test_fc's tolerance allows 2^-7: this one catches a second rounding)."""
    n, m, k = shape
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((n, k)) * k ** -0.5).astype(np.float32).astype(D("bf16"))
    w = rng.standard_normal((m, k)).astype(np.float32).astype(D("bf16"))
    b = rng.standard_normal(m).astype(np.float32)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    z64 = x64 @ w64.T + b
    want = z64 if act is None else UNARY_OPS[act](z64)
    fp32_err = (k + 1) * 2.0 ** -24 * (np.abs(x64) @ np.abs(w64).T + np.abs(b))
    fp32_err = 1.13 * fp32_err + act_error(act, z64) + 2.0 ** -24 * np.abs(want) if act == "gelu" else fp32_err
    for packed in (False, True):
        y, _ = fc.forward(x, fc.pack(w) if packed else w, b, act, out=nan((n, m), "bf16"), pre=False)
        y = y.astype(np.float64)
        half_ulp = np.spacing((np.abs(want) + fp32_err).astype(np.float32)).astype(np.float64) * 2.0 ** 15
        bad = np.abs(y - want) > half_ulp + fp32_err
        assert not bad.any(), f"packed={packed}: {bad.sum()} elements off, e.g. {y[bad][:3]} for {want[bad][:3]}"


# -- threads ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", PATH_SHAPES.values(), ids=PATH_SHAPES.keys())
@pytest.mark.parametrize("dt", fc.DTYPES)
def test_thread_counts_agree(shape, dt):
    """1, 2, 3 and 16 threads (each GEMM cut into as many parts as it has rows, columns or panels for)
    give the one-thread results to fp32 rounding, forward (packed too) and backward."""
    n, m, k = shape
    rng = np.random.default_rng(m)
    x = (rng.standard_normal((n, k)) * k ** -0.5).astype(np.float32).astype(D(dt))
    w = rng.standard_normal((m, k)).astype(np.float32).astype(D(dt))
    b, dy = rng.standard_normal(m).astype(np.float32), rng.standard_normal((n, m)).astype(np.float32).astype(D(dt))
    tol = dict(rtol=2e-5, atol=2e-5 * np.sqrt(k)) if dt == "f32" else dict(rtol=2 ** -7, atol=2 ** -7 * np.sqrt(k))
    with split_rows():
        results = []
        for threads in (1, 2, 3, 16):
            y, z = fc.forward(x, w, b, "gelu", out=nan((n, m), dt), pre=nan((n, m), dt), threads=threads)
            yp, _ = fc.forward(x, fc.pack(w), b, "relu", out=nan((n, m), dt), threads=threads)
            results.append([y, z, yp, *fc.backward(dy, x, w, "gelu", z, *(nan(s, t) for s, t in (
                ((n, k), dt), ((m, k), dt), ((m,), "f32"))), threads=threads)])
    for threads, got in zip((2, 3, 16), results[1:]):
        for name, a, want in zip(("y", "z", "packed y", "dx", "dw", "db"), got, results[0]):
            assert np.isfinite(a.astype(np.float32)).all(), f"{name} on {threads} threads: not all written"
            np.testing.assert_allclose(a.astype(np.float32), want.astype(np.float32),
                                       err_msg=f"{name} on {threads} threads", **tol)


def test_python_threads_calling_at_once_agree():
    """Plans are shared between callers: several Python threads running the same layers at once (each
    with native threads of its own) get the results of calls made alone."""
    rng = np.random.default_rng(3)
    cases = []
    for n, m, k in PATH_SHAPES.values():
        x = rng.standard_normal((n, k)).astype(np.float32)
        w = rng.standard_normal((m, k)).astype(np.float32)
        cases.append((x, w))

    def layer(x, w):
        y, z = fc.forward(x, w, None, "gelu", threads=2)
        return np.concatenate([y.ravel(), fc.backward(y, x, w, "gelu", z, threads=2)[1].ravel()])

    assert threads_disagreeing(layer, cases, rounds=3) == []


# -- empty dimensions and the arguments a careless caller passes -----------------------------------
@pytest.mark.parametrize("n, m, k", [(0, 5, 3), (4, 0, 3), (4, 5, 0), (0, 0, 0), (1, 3, 0)])
@pytest.mark.parametrize("act", fc.ACTS)
@pytest.mark.parametrize("dt", fc.DTYPES)
def test_empty_dimensions_every_activation(n, m, k, act, dt):
    """k = 0: y = act(bias) (the bias in either dtype), z = bias, every element written; the gradients
    are zeros but db = the sum of dz; packed weights and threads too."""
    bias = np.linspace(-2, 2, m).astype(np.float32).astype(D(dt))
    x, w = np.ones((n, k), D(dt)), np.ones((m, k), D(dt))
    want = np.broadcast_to(bias.astype(np.float64), (n, m))
    want = want if act is None else UNARY_OPS[act](want)
    for weight in (w, fc.pack(w)):
        pre = nan((n, m), dt) if act in fc.GELUS else None
        y, z = fc.forward(x, weight, bias, act, out=nan((n, m), dt), pre=pre, threads=3)
        if y.size:
            close(y, want, 0, dt, atol=act_error(act, want))
        if act in fc.GELUS and y.size:
            close(z, np.broadcast_to(bias.astype(np.float64), (n, m)), 0, dt)
    saved = None if act is None else y if act == "relu" else z
    dy = np.ones((n, m), D(dt))
    dx, dw, db = fc.backward(dy, x, w, act, saved, nan((n, k), dt), nan((m, k), dt), nan((m,), "f32"), threads=3)
    assert not dx.astype(np.float32).any() and not dw.astype(np.float32).any()
    dz = np.ones((n, m)) if act is None else np.ones((n, m)) * GRAD_OPS[fc.GRADIENTS[act]](saved.astype(np.float64))
    if m:
        close(db, dz.sum(0), np.abs(dz).sum(0), "f32", atol=1e-6)


@given(n=st.integers(1, 40), m=st.integers(1, 40), k=st.integers(1, 40), dt=st.sampled_from(fc.DTYPES),
       rows=st.integers(0, 3), cols=st.integers(0, 3), order=st.sampled_from("CF"), seed=st.integers(0, 2 ** 16))
def test_views_of_any_layout_give_the_dense_result(n, m, k, dt, rows, cols, order, seed):
    """x, w and dy as Fortran-ordered, reversed, strided or read-only views, and out as a
    C-contiguous block of rows inside a larger NaN buffer: the dense results, and nothing of the
    buffer outside the block written."""
    rng = np.random.default_rng(seed)

    def view(r, c):
        base = np.asarray(rng.standard_normal((r * (rows + 1), c + cols)), np.float32, order=order).astype(D(dt))
        a = base[::rows + 1, :c][::-1] if seed % 2 else base[::rows + 1, :c]
        a.flags.writeable = seed % 3 != 0
        return a

    x, w, dy = view(n, k), view(m, k), view(n, m)
    buf = nan((n + 2, m), dt)
    y, _ = fc.forward(x, w, out=buf[1:-1])
    assert np.isnan(buf[[0, -1]].astype(np.float32)).all()
    x64, w64, dy64 = x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64)
    close(y, x64 @ w64.T, np.abs(x64) @ np.abs(w64).T, dt)
    dx, dw, db = fc.backward(dy, x, w)
    close(dx, dy64 @ w64, np.abs(dy64) @ np.abs(w64), dt)
    close(dw, dy64.T @ x64, np.abs(dy64).T @ np.abs(x64), dt)
    close(db, dy64.sum(0), np.abs(dy64).sum(0), dt)


def test_x_aliasing_w_and_dy():
    """Inputs may share memory with each other: x as its own weight, dy as x."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((24, 24)).astype(np.float32)
    assert np.allclose(fc.forward(x, x)[0], x @ x.T, atol=1e-4)
    dx, dw, db = fc.backward(x, x, x)
    assert np.allclose(dx, x @ x, atol=1e-4) and np.allclose(dw, x.T @ x, atol=1e-4)
    assert np.allclose(db, x.sum(0), atol=1e-5)


@pytest.mark.parametrize("call, error, message", [
    (lambda: fc.forward(np.ones((2, 3), D("bf16")), np.ones((4, 3), D("bf16")), np.ones(5, D("bf16"))),
     ValueError, r"bias must be float32 of shape \(4,\) or bfloat16 as x, got bfloat16 of shape \(5,\)"),
    (lambda: fc.forward(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), np.ones(4, D("bf16"))),
     ValueError, r"bias must be float32 of shape \(4,\), got bfloat16"),
    (lambda: fc.forward(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), np.ones((1, 4), np.float32)),
     ValueError, r"bias must be float32 of shape \(4,\), got float32 of shape \(1, 4\)"),
    (lambda: fc.forward(np.ones((2, 3), ">f4"), np.ones((4, 3), ">f4")), ValueError,
     r"x is >f4 and w >f4; expected all float32"),
    (lambda: fc.forward(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), np.ones(4, ">f4")), ValueError,
     "bias must be float32"),
    (lambda: fc.forward(np.ones((2, 3), np.float16), np.ones((4, 3), np.float16)), ValueError,
     r"x is float16 and w float16; expected all float32 or all bfloat16"),
    (lambda: fc.forward(np.ones((1, 2, 3), np.float32), np.ones((4, 3), np.float32)), ValueError,
     r"x must be a 2-D array, got ndarray of shape \(1, 2, 3\)"),
    (lambda: fc.forward(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), out=np.empty((4, 2), np.float32)),
     ValueError, r"out must be a C-contiguous writable float32 array of shape \(2, 4\)"),
    (lambda: fc.forward(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32),
                        out=np.empty((2, 4), np.float32, order="F")), ValueError, "not contiguous"),
    (lambda: fc.forward(np.ones((2, 3), np.float32), np.ones((4, 3), np.float32), act="ReLU"), ValueError,
     "act='ReLU'; expected one of"),
    (lambda: fc.pack(np.ones(3, np.float32)), ValueError, r"fc.pack: w must be a 2-D array"),
    (lambda: fc.backward(np.ones((2, 4), np.float32), np.ones((2, 3), np.float32), np.ones((4, 3), np.float32),
                         None, np.ones((2, 4), np.float32)), ValueError, "or None when act is None"),
    (lambda: fc.backward(np.ones((2, 5), np.float32), np.ones((2, 3), np.float32), np.ones((4, 3), np.float32)),
     ValueError, r"dy has shape \(2, 5\); expected \(2, 4\)"),
    (lambda: fc.backward(np.ones((2, 4), np.float32), np.ones((2, 3), np.float32),
                         fc.pack(np.ones((5, 3), np.float32))), ValueError,
     r"dy has shape \(2, 4\); expected \(2, 5\)"),
    (lambda: fc.backward(np.ones((2, 4), np.float32), np.ones((2, 3), np.float32), np.ones((4, 3), np.float32),
                         dx=1), TypeError, "dx must be a C-contiguous writable float32 array of shape"),
])
def test_careless_arguments_are_refused_with_the_fix(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("threads", [0, -1, 1.5, True, None, "3", np.int8(-2)])
def test_bad_thread_counts_are_refused_on_every_path(threads):
    """Refused before any plan is made, whatever path (dots, panels, empty) the shape takes."""
    for n, m, k in ((2, 3, 4), (300, 70, 65), (2, 3, 0)):
        x, w = np.ones((n, k), np.float32), np.ones((m, k), np.float32)
        with pytest.raises((TypeError, ValueError), match=r"threads=.* expected an int >= 1"):
            fc.forward(x, w, threads=threads)
        with pytest.raises((TypeError, ValueError), match=r"threads=.* expected an int >= 1"):
            fc.backward(np.ones((n, m), np.float32), x, w, threads=threads)


@pytest.mark.parametrize("m", [1, 3, 5, 8])
def test_many_threads_and_a_long_bias_add_split_among_them(m):
    """Few out features on many rows: the row blocks of 1, 3 or 16 threads each add the bias to their own
    rows, viewed as long rows of lcm(m, 16) values against the bias repeated (BiasAdd), with the rest of
    each block as it is (on 16 threads, blocks too short for long rows)."""
    rng = np.random.default_rng(m)
    n, k = 20011, 33
    x = rng.standard_normal((n, k)).astype(np.float32)
    w = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    for threads in (1, 3, 16):
        with split_rows(), native_calls_only():
            y, _ = fc.forward(x, w, b, "relu", out=nan((n, m), "f32"), threads=threads)
            plan = fc._forward_plan(n, m, k, "f32", True, "relu", threads)
        assert plan.gemm.by_rows and len(plan.gemm.blocks) == threads
        assert all(add.long for add in plan.add_bias.values()) or threads == 16
        close(y, np.maximum(x64 @ w64.T + b, 0), np.abs(x64) @ np.abs(w64).T + np.abs(b), "f32")


@pytest.mark.parametrize("width", [64, 128])
def test_packed_edge_panels_on_threads(width):
    """A packing in panels of 64 or 128 rows with an edge panel of one row, runs of panels on 3
    threads, matches the unpacked forward."""
    n, m, k = 40, 2 * width + 1, 96
    with fc_setting("PACKED_PANEL_BYTES", width * k * 4), fc_setting("PANEL_BYTES", 0), split_rows():
        rng = np.random.default_rng(width)
        x = rng.standard_normal((n, k)).astype(np.float32)
        w = rng.standard_normal((m, k)).astype(np.float32)
        packed = fc.pack(w)
        assert sorted(packed.panels) == [(0, width), (width, 2 * width), (2 * width, m)]
        y, _ = fc.forward(x, packed, out=nan((n, m), "f32"), threads=3)
    close(y, x.astype(np.float64) @ w.astype(np.float64).T, np.abs(x) @ np.abs(w).T, "f32")


@given(n=st.integers(1, 300), m=st.integers(1, 300), k=st.integers(1, 300), dt=st.sampled_from(fc.DTYPES),
       act=st.sampled_from(fc.ACTS), bias=st.booleans(), threads=st.sampled_from([1, 2, 3, 5]),
       seed=st.integers(0, 2 ** 16))
def test_any_shape_up_to_300_matches_numpy(n, m, k, dt, act, bias, threads, seed):
    """Shapes drawn across every path (test_fc draws up to 24: mostly the dots), every part split
    among the threads."""
    with split_rows():
        check_layer(n, m, k, dt, act, bias, threads, seed, scale=k ** -0.5)
