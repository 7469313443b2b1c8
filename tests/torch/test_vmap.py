"""tppasm.torch under torch.func.vmap: the operators' batching rules against torch's linear, over
x (one call, the batch as more rows), over weights and biases (ensembles), empty batches, and
jacrev's batch of cotangents; never torch's batching fallback (which warns, and refuses an empty
batch)."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e .[test] pins torch==2.13.0)")

import tppasm.torch as tt  # noqa: E402

from .test_linear import TOL, TORCH_ACT  # noqa: E402

F = torch.nn.functional
pytestmark = pytest.mark.filterwarnings("error:There is a performance drop")     # the fallback's warning


def reference(x, w, b, act):
    return TORCH_ACT[act](F.linear(x, w, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("act", tt.ACTS)
@pytest.mark.parametrize("batch", [0, 1, 3])
@pytest.mark.parametrize("sample, dim", [((6,), 0), ((4, 6), 0), ((4, 6), 1), ((2, 3, 6), 2)])
def test_vmap_over_x(dtype, act, batch, sample, dim):
    g = torch.Generator().manual_seed(batch)
    x = torch.randn(*sample[:dim], batch, *sample[dim:], generator=g).to(dtype)
    w, b = torch.randn(5, 6, generator=g).to(dtype), torch.randn(5, generator=g).to(dtype)
    got = torch.func.vmap(lambda x: tt.linear(x, w, b, act), in_dims=dim)(x)
    want = torch.func.vmap(lambda x: reference(x, w, b, act), in_dims=dim)(x)
    assert got.shape == want.shape == (batch, *sample[:-1], 5) and got.dtype == dtype
    torch.testing.assert_close(got, want, **TOL[dtype])


@pytest.mark.parametrize("act", tt.ACTS)
def test_raw_operator_under_vmap_gives_each_elements_outputs(act):
    """The operator's second output (z, for the gelus the pre-activation) comes out batched too."""
    x, w = torch.randn(3, 4, 6), torch.randn(5, 6)
    y, z = torch.func.vmap(lambda x: torch.ops.tppasm.linear(x, w, None, act))(x)
    for i in range(3):
        yi, zi = torch.ops.tppasm.linear(x[i], w, None, act)
        torch.testing.assert_close(y[i], yi) and torch.testing.assert_close(z[i], zi)


@pytest.mark.parametrize("batch", [0, 2])
@pytest.mark.parametrize("over", ["weight", "bias", "both", "all"])
def test_vmap_over_weights_is_an_ensemble(batch, over):
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(4, 6, generator=g), torch.randn(batch, 5, 6, generator=g), torch.randn(batch, 5, generator=g)
    xs = torch.randn(batch, 4, 6, generator=g)
    dims = {"weight": (None, 0, None), "bias": (None, None, 0), "both": (None, 0, 0), "all": (0, 0, 0)}[over]
    args = [xs if over == "all" else x, w if dims[1] == 0 else w[0] if batch else torch.randn(5, 6),
            b if dims[2] == 0 else b[0] if batch else torch.randn(5)]
    got = torch.func.vmap(lambda x, w, b: tt.linear(x, w, b, "relu"), in_dims=dims)(*args)
    want = torch.func.vmap(lambda x, w, b: reference(x, w, b, "relu"), in_dims=dims)(*args)
    assert got.shape == want.shape == (batch, 4, 5)
    torch.testing.assert_close(got, want, **TOL[torch.float32])


@pytest.mark.parametrize("act", ["relu", "gelu_erf"])
@pytest.mark.parametrize("rows", [0, 3])
def test_jacrev_batches_its_cotangents(act, rows):
    g = torch.Generator().manual_seed(2)
    x, w, b = torch.randn(rows, 6, generator=g), torch.randn(5, 6, generator=g), torch.randn(5, generator=g)
    for argnums in (0, 1, 2, (0, 1, 2)):
        got = torch.func.jacrev(lambda x, w, b: tt.linear(x, w, b, act), argnums=argnums)(x, w, b)
        want = torch.func.jacrev(lambda x, w, b: reference(x, w, b, act), argnums=argnums)(x, w, b)
        torch.testing.assert_close(got, want, **TOL[torch.float32])



@pytest.mark.parametrize("act", ["relu", "gelu_erf"])
def test_vmap_alone_takes_the_operator_with_autograd_below_it(act):
    """Under vmap alone ``linear`` calls the operator (no autograd.Function): the gradients of an
    outer backward through the vmapped call still follow torch's."""
    g = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(3, 4, 6, generator=g), torch.randn(5, 6, generator=g), torch.randn(5, generator=g)
    grads = []
    for f in (lambda x, w, b: tt.linear(x, w, b, act), lambda x, w, b: reference(x, w, b, act)):
        xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
        torch.func.vmap(f, in_dims=(0, None, None))(xs, ws, bs).pow(2).sum().backward()
        grads.append((xs.grad, ws.grad, bs.grad))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, **TOL[torch.float32])
