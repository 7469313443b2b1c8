"""tppasm.torch: the tppasm::linear operator against torch's own linear layer (values and
gradients, f32 and bf16, every activation), torch.library.opcheck, nn.Module use, torch.compile."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e .[test] pins torch==2.13.0)")

import tppasm.torch as tt  # noqa: E402

F = torch.nn.functional
TORCH_ACT = {None: lambda z: z, "relu": torch.relu, "gelu": lambda z: F.gelu(z, approximate="tanh"),
             "gelu_erf": F.gelu}
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def inputs(shape, out, dtype, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(out, shape[-1], generator=g) / shape[-1] ** 0.5).to(dtype).requires_grad_()
    b = torch.randn(out, generator=g).to(dtype).requires_grad_() if bias else None
    return x, w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("act", tt.ACTS)
@pytest.mark.parametrize("shape, out, bias", [((7, 13), 9, True), ((2, 3, 17), 5, False), ((1, 1), 1, True)])
def test_values_and_gradients_match_torch(dtype, act, shape, out, bias):
    x, w, b = inputs(shape, out, dtype, bias)
    y = tt.linear(x, w, b, act)
    # the reference: torch's linear in float64 on the same (rounded) values
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b64 = None if b is None else b.detach().double().requires_grad_()
    ref = TORCH_ACT[act](F.linear(x64, w64, b64))
    assert y.dtype == dtype and y.shape == ref.shape
    torch.testing.assert_close(y.double(), ref, **TOL[dtype])
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    leaves = [t for t in (x, w, b) if t is not None]
    got = torch.autograd.grad(y, leaves, dy)
    want = torch.autograd.grad(ref, [t for t in (x64, w64, b64) if t is not None], dy.double())
    for g, r in zip(got, want):
        assert g.dtype == dtype
        torch.testing.assert_close(g.double(), r, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_large_outputs_live_in_numpy_memory_and_accumulate(dtype):
    """Outputs of 4 MiB or more (here dw, and y) are NumPy-backed tensors (huge pages): values and
    gradients as torch's, and a second backward accumulates into w.grad like any tensor."""
    x, w, b = inputs((2, 2048), 1024, dtype)
    y = tt.linear(x, w, b, "relu")
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    ref = torch.relu(F.linear(x64, w64, b64))
    torch.testing.assert_close(y.double(), ref, **TOL[dtype])
    for _ in range(2):
        tt.linear(x, w, b, "relu").sum().backward()
        ref.sum().backward(retain_graph=True)
    assert w.grad.dtype == dtype and w.grad.is_contiguous() and w.grad.nbytes >= 4 << 20
    for got, want in ((x.grad, x64.grad), (w.grad, w64.grad), (b.grad, b64.grad)):
        torch.testing.assert_close(got.double(), want, **TOL[dtype])


def test_only_needed_gradients_are_computed():
    x, w, b = inputs((4, 6), 3, torch.float32)
    x.requires_grad_(False)
    tt.linear(x, w, b, "relu").sum().backward()
    assert x.grad is None and w.grad is not None and b.grad is not None


@pytest.mark.parametrize("act", tt.ACTS)
def test_opcheck_linear(act):
    for dtype, bias in ((torch.float32, True), (torch.bfloat16, act is None)):
        x, w, b = inputs((3, 5), 4, dtype, bias)
        torch.library.opcheck(torch.ops.tppasm.linear.default, (x, w, b, act))


def test_opcheck_linear_backward():
    x, w, _ = inputs((3, 5), 4, torch.float32)
    dy, z = torch.randn(3, 4), torch.randn(3, 4)
    for needs in ([True, True, True], [False, True, False]):
        torch.library.opcheck(torch.ops.tppasm.linear_backward.default, (dy, x.detach(), w.detach(), z, "gelu", needs))


def test_module_trains_like_torch_linear():
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    ours = torch.nn.Sequential(tt.Linear(8, 16, act="relu"), tt.Linear(16, 4))
    ours.load_state_dict({k.replace("2.", "1."): v for k, v in plain.state_dict().items()})
    x, target = torch.randn(32, 8), torch.randn(32, 4)
    losses = []
    for net in (plain, ours):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        curve = []
        for _ in range(5):
            opt.zero_grad()
            loss = F.mse_loss(net(x), target)
            loss.backward()
            opt.step()
            curve.append(loss.item())
        losses.append(curve)
    assert losses[0][-1] < losses[0][0]
    torch.testing.assert_close(torch.tensor(losses[1]), torch.tensor(losses[0]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_module_uses_the_custom_op(backend):
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = torch.nn.Sequential(tt.Linear(16, 32, act="gelu"), tt.Linear(32, 8, act="relu"))
    x = torch.randn(4, 16, requires_grad=True)
    eager = net(x)
    (gx,) = torch.autograd.grad(eager.sum(), x)
    compiled = torch.compile(net, backend=backend, fullgraph=True)
    y = compiled(x)
    (cx,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(y, eager)
    torch.testing.assert_close(cx, gx)
    graph = torch._dynamo.explain(net)(x)
    assert graph.graph_break_count == 0 and graph.graph_count == 1


def test_meta_tensors_get_shapes():
    y = tt.linear(torch.empty(2, 5, 3, device="meta"), torch.empty(4, 3, device="meta"), None, "gelu")
    assert y.shape == (2, 5, 4) and y.device.type == "meta"


@pytest.mark.parametrize("call, error, message", [
    (lambda: tt.linear(torch.ones(2, 3, dtype=torch.float64), torch.ones(4, 3, dtype=torch.float64)), TypeError,
     r"x is torch.float64; .* pass x.float\(\) or x.bfloat16\(\)"),
    (lambda: tt.linear(torch.ones(2, 3), torch.ones(4, 3, dtype=torch.bfloat16)), TypeError,
     r"weight is torch.bfloat16 and x torch.float32; pass both in one dtype"),
    (lambda: tt.linear(torch.ones(2, 3), torch.ones(4, 2)), ValueError, r"x \(2, 3\) and weight \(4, 2\) do not fit"),
    (lambda: tt.linear(torch.ones(2, 3), torch.ones(4, 3), torch.ones(3)), ValueError, r"expected \(4,\)"),
    (lambda: tt.linear(torch.ones(2, 3), torch.ones(4, 3), act="tanh"), ValueError, "act='tanh'"),
    (lambda: tt.Linear(3, 4, act="swish"), ValueError, "act='swish'"),
])
def test_bad_arguments_are_explained(call, error, message):
    with pytest.raises(error, match=message):
        call()
