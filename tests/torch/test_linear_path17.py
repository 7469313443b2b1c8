"""fz17e item 3: ``tppasm.torch.linear`` (and ``fc.forward``) on mid-size layers takes the dot
products of :func:`tppasm.gemm_nt`, which read the weight in its (out, in) layout, where packing it
(or moving x and y for the transposed product) on every call cost more than the product saved:
no packing per call, no packed weight kept between calls (a NumPy write to the weight is seen)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e .[test] pins torch==2.13.0)")

from tppasm import fc, fc_dots  # noqa: E402
from tppasm.dtypes import dtype as D  # noqa: E402
from tppasm.fc_operands import TransposedB  # noqa: E402
from tppasm.torch import linear  # noqa: E402

# (rows, in, out): rows at most half of in, or a weight the transposed product would move x for (<= 64 rows)
MID = [(64, 256, 64, "f32"), (64, 256, 65, "f32"), (33, 64, 512, "f32"), (127, 256, 256, "f32"), (64, 128, 256, "f32"),
       (40, 96, 130, "f32"), (256, 512, 33, "f32"), (33, 128, 64, "bf16"), (48, 97, 256, "bf16")]
# the panels keep: short rows of w against many rows, bf16, a weight past MID_DOTS_BYTES, a packed weight
KEPT = [(64, 64, 256, "f32"), (129, 256, 256, "f32"), (256, 64, 256, "f32"), (64, 256, 64, "bf16"),
        (127, 256, 256, "bf16"), (48, 95, 256, "bf16"), (40, 64, 512, "bf16"), (64, 1024, 512, "f32"),
        # past the range measured (fc_dots.MID_DOTS_MAX), where the dots ran 1.5-2.5x slower
        (4096, 8192, 32, "f32"), (2048, 4096, 33, "f32"), (1024, 2048, 128, "f32"), (33, 96, 4096, "bf16")]


@pytest.fixture
def packings(monkeypatch):
    """The weight packings done per call (TransposedB's kernel calls, in PanelGemm and the
    transposed forward alike)."""
    done = []
    calls = TransposedB.calls

    def counted(self, rows, buffers):
        done.append(rows.shape)
        return calls(self, rows, buffers)
    monkeypatch.setattr(TransposedB, "calls", counted)
    return done


@pytest.mark.parametrize("n, k, m, dt", MID)
def test_mid_layers_read_the_weight_as_stored(n, k, m, dt, packings):
    assert fc_dots.mid_dots(n, m, k, dt) and fc._forward_plan(n, m, k, dt, True, None, 1).path == "dots"
    dtype = torch.float32 if dt == "f32" else torch.bfloat16
    x, w, b = torch.randn(n, k).to(dtype), (torch.randn(m, k) / k ** 0.5).to(dtype), torch.randn(m)
    with torch.no_grad():
        y = linear(x, w, b)
    assert packings == []
    want = torch.nn.functional.linear(x.double(), w.double(), b.double())
    tol = 1e-5 if dt == "f32" else 1e-2
    torch.testing.assert_close(y.double(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("n, k, m, dt", KEPT)
def test_other_layers_keep_their_path(n, k, m, dt):
    assert not fc_dots.mid_dots(n, m, k, dt)
    assert fc._forward_plan(n, m, k, dt, True, None, 1).path != "dots"
    assert fc._forward_plan(32, 512, 512, "f32", True, None, 1, False, True).path == "panels"    # packed


def test_a_numpy_write_to_the_weight_is_seen_by_the_next_call():
    """Nothing derived from the weight is kept between calls: a write through a NumPy view (which
    torch's _version does not see) changes the next result."""
    x, w = torch.randn(64, 256), torch.randn(64, 256)
    with torch.no_grad():
        linear(x, w)
        w.numpy()[3] *= -2
        torch.testing.assert_close(linear(x, w), x @ w.T, rtol=1e-5, atol=1e-4)


@settings(max_examples=12)
@given(n=st.integers(1, 160), k=st.integers(1, 300), m=st.integers(1, 300), bias=st.booleans(),
       act=st.sampled_from(fc.ACTS), grad=st.booleans(), seed=st.integers(0, 999))
def test_fp32_linear_matches_torch(n, k, m, bias, act, grad, seed):
    """Drawn shapes (the mid-dots rule's edges and tails among them), forward and, with ``grad``,
    the gradients of x, w and b."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, k, generator=g, requires_grad=grad)
    w = (torch.randn(m, k, generator=g) / k ** 0.5).requires_grad_(grad)
    b = torch.randn(m, generator=g, requires_grad=grad) if bias else None
    ref = {None: lambda z: z, "relu": torch.relu, "gelu": lambda z: torch.nn.functional.gelu(z, approximate="tanh"),
           "gelu_erf": torch.nn.functional.gelu, "gelu_erf_fast": torch.nn.functional.gelu}[act]
    with torch.set_grad_enabled(grad):
        y, want = linear(x, w, b, act=act), ref(torch.nn.functional.linear(x, w, b))
    torch.testing.assert_close(y, want, rtol=1e-5, atol=2e-5)
    if grad:
        dy = torch.randn(n, m, generator=g)
        inputs = [t for t in (x, w, b) if t is not None]
        got, exp = torch.autograd.grad(y, inputs, dy), torch.autograd.grad(want, inputs, dy)
        for a, e in zip(got, exp):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)



@settings(max_examples=10)
@given(n=st.integers(1, 64), k=st.integers(1, 300), m=st.integers(1, 300), act=st.sampled_from([None, "relu"]),
       seed=st.integers(0, 999))
def test_bf16_linear_matches_a_float64_reference(n, k, m, act, seed):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(n, k, generator=g).bfloat16(), (torch.randn(m, k, generator=g) / k ** 0.5).bfloat16()
    b = torch.randn(m, generator=g)
    with torch.no_grad():
        y = linear(x, w, b, act=act)
    z = torch.nn.functional.linear(x.double(), w.double(), b.double())
    want = z if act is None else torch.relu(z)
    mag = torch.nn.functional.linear(x.double().abs(), w.double().abs(), b.double().abs())
    assert y.dtype is torch.bfloat16 and bool(((y.double() - want).abs() <= 2 ** -7 * mag + 1e-6).all())


@pytest.mark.parametrize("n, m, k", [(33, 130, 96), (34, 130, 201), (40, 200, 120)])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_the_transposed_forward_still_runs_without_mid_dots(n, m, k, dt, monkeypatch):
    """tests/tpp/test_fc.py's transposed shapes take the dots now: the transposed product itself,
    with the rule off (as for a weight past MID_DOTS_BYTES)."""
    monkeypatch.setattr(fc_dots, "MID_DOTS_BYTES", 0)
    fc._forward_plan.cache_clear()
    try:
        assert fc._forward_plan(n, m, k, dt, True, "relu", 1).path == "transposed"
        rng = np.random.default_rng(n + m + k)
        x, w = rng.standard_normal((n, k)).astype(D(dt)), rng.standard_normal((m, k)).astype(D(dt))
        b = rng.standard_normal(m).astype(np.float32)
        y, _ = fc.forward(x, w, b, "relu")
        x64, w64 = x.astype(np.float64), w.astype(np.float64)
        tol = 1e-4 if dt == "f32" else 1e-2
        np.testing.assert_allclose(y.astype(np.float64), np.maximum(x64 @ w64.T + b, 0),
                                   rtol=tol, atol=tol * np.sqrt(k))
    finally:
        fc._forward_plan.cache_clear()
