"""tppasm.torch: the tppasm::linear operator against torch's own linear layer (values and
gradients, f32 and bf16, every activation), torch.library.opcheck, nn.Module use, torch.compile,
CPU autocast and torch.func transforms."""
import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e .[test] pins torch==2.13.0)")

import tppasm.torch as tt  # noqa: E402

F = torch.nn.functional
TORCH_ACT = {None: lambda z: z, "relu": torch.relu, "gelu": lambda z: F.gelu(z, approximate="tanh"),
             "gelu_erf": F.gelu, "gelu_erf_fast": F.gelu}
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
       torch.float16: dict(rtol=5e-3, atol=5e-3)}


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


@pytest.mark.parametrize("act", ["gelu", "gelu_erf"])
@pytest.mark.parametrize("losses", ["z", "y+z"])
def test_a_loss_on_the_operators_z_gets_its_gradient(act, losses):
    """torch.ops.tppasm.linear's second output, z = x @ w.T + b (the gelus' pre-activation), takes
    part in a loss like y (its gradient was dropped: a loss on z gave zero gradients)."""
    x, w, b = inputs((2, 3, 5), 4, torch.float32)
    y, z = torch.ops.tppasm.linear(x, w, b, act)
    (z.sum() * 2 if losses == "z" else (y * y).sum() + 3 * z.sum()).backward()
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    z64 = x64 @ w64.T + b64
    y64 = torch.nn.functional.gelu(z64, approximate="tanh" if act == "gelu" else "none")
    (z64.sum() * 2 if losses == "z" else (y64 * y64).sum() + 3 * z64.sum()).backward()
    for got, want in ((x.grad, x64.grad), (w.grad, w64.grad), (b.grad, b64.grad)):
        torch.testing.assert_close(got.double(), want, **TOL[torch.float32])


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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("act", tt.ACTS)
@pytest.mark.parametrize("shape, out, bias", [((7, 13), 9, True), ((2, 3, 17), 5, False)])
def test_autocast_matches_torch_linear(dtype, act, shape, out, bias):
    """Under CPU autocast the float32 layer returns autocast's dtype, as torch.nn.Linear does, with
    its values, and float32 gradients for x and the float32 parameters (float16: computed in
    float32, no float16 kernels), through the module and the operator itself."""
    torch.manual_seed(0)
    plain = torch.nn.Linear(shape[-1], out, bias=bias)
    ours = tt.Linear(shape[-1], out, bias=bias, act=act)
    ours.load_state_dict(plain.state_dict())
    x = torch.randn(shape, requires_grad=True)
    with torch.autocast("cpu", dtype=dtype):
        want, got = TORCH_ACT[act](plain(x)), ours(x)
        op = torch.ops.tppasm.linear(x, ours.weight, ours.bias, act)[0]
    assert want.dtype == got.dtype == op.dtype == dtype
    torch.testing.assert_close(got, want, **TOL[dtype])
    torch.testing.assert_close(op, got, rtol=0, atol=0)
    dy = torch.randn(want.shape).to(dtype)
    leaves = [x, *ours.parameters()]
    for g, r in zip(torch.autograd.grad(got, leaves, dy), torch.autograd.grad(want, [x, *plain.parameters()], dy)):
        assert g.dtype == r.dtype == torch.float32
        torch.testing.assert_close(g, r, **TOL[dtype])


def test_compiled_module_under_autocast():
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = torch.nn.Sequential(tt.Linear(16, 32, act="gelu"), tt.Linear(32, 8, act="relu"))
    x = torch.randn(4, 16, requires_grad=True)

    def step(model):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = model(x)
        return y, torch.autograd.grad(y.float().sum(), (x, net[0].weight))

    (eager, grads), (compiled, cgrads) = step(net), step(torch.compile(net, backend="aot_eager", fullgraph=True))
    assert compiled.dtype == torch.bfloat16 and cgrads[1].dtype == torch.float32
    torch.testing.assert_close(compiled, eager)
    for c, e in zip(cgrads, grads):
        torch.testing.assert_close(c, e)


@pytest.mark.filterwarnings("error:There is a performance drop")    # torch's batching fallback: not taken
@pytest.mark.parametrize("autocast", [False, True], ids=["f32", "autocast-bf16"])
@pytest.mark.parametrize("act", tt.ACTS)
def test_func_grad_matches_torch(act, autocast):
    """torch.func.grad (which needs an autograd.Function with setup_context) and jacrev, in float32
    and under bf16 autocast, against torch's linear."""
    x, w, b = (t.detach() for t in inputs((2, 3, 7), 5, torch.float32))

    def loss(linear):
        def f(w, b, x):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                y = linear(x, w, b, act)
            return y.float().pow(2).sum()
        return f

    ref = lambda x, w, b, act: TORCH_ACT[act](F.linear(x, w, b))    # noqa: E731
    got = torch.func.grad(loss(tt.linear), argnums=(0, 1, 2))(w, b, x)
    want = torch.func.grad(loss(ref), argnums=(0, 1, 2))(w, b, x)
    for g, r in zip(got, want):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, r, **TOL[torch.bfloat16 if autocast else torch.float32])
    jac = torch.func.jacrev(lambda w: tt.linear(x, w, b, act))(w)
    torch.testing.assert_close(jac, torch.func.jacrev(lambda w: ref(x, w, b, act))(w), **TOL[torch.float32])


@pytest.mark.filterwarnings("error:There is a performance drop")    # torch's batching fallback: not taken
def test_func_vmap_of_grad_gives_per_sample_gradients():
    x, w, b = (t.detach() for t in inputs((6, 7), 5, torch.float32))
    loss = lambda linear: lambda w, b, x: torch.relu(linear(x, w, b)).pow(2).sum()     # noqa: E731
    per_sample = [torch.func.vmap(torch.func.grad(loss(f), argnums=(0, 1)), in_dims=(None, None, 0))(w, b, x)
                  for f in (tt.linear, F.linear)]
    for g, r in zip(*per_sample):
        assert g.shape == r.shape and g.shape[0] == 6
        torch.testing.assert_close(g, r, **TOL[torch.float32])


def test_batched_gradients_of_torchs_old_vmap_match_torch():
    """grad(..., is_grads_batched=True) and jacobian(vectorize=True) run torch's old vmap, which no
    transform check saw: the backward took the direct kernels and failed on a batched dy."""
    x, w, b = (t.detach() for t in inputs((4, 6), 5, torch.float32))
    dys = torch.randn(3, 4, 5)

    def grads(linear):
        xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
        return torch.autograd.grad(linear(xs, ws, bs), (xs, ws, bs), dys, is_grads_batched=True)
    for g, r in zip(grads(tt.linear), grads(F.linear)):
        torch.testing.assert_close(g, r, **TOL[torch.float32])
    jac = torch.autograd.functional.jacobian(lambda x: tt.linear(x, w, b), x, vectorize=True)
    torch.testing.assert_close(jac, torch.autograd.functional.jacobian(lambda x: F.linear(x, w, b), x),
                               **TOL[torch.float32])


@pytest.mark.parametrize("call, message", [
    (lambda x, w: torch.autograd.grad(torch.autograd.grad(tt.linear(x, w).pow(2).sum(), x, create_graph=True)[0].sum(),
                                      x), "no second derivative"),
    (lambda x, w: torch.func.grad(lambda x: torch.func.grad(lambda x: tt.linear(x, w).pow(2).sum())(x).sum())(x),
     "no second derivative"),
    (lambda x, w: torch.func.jvp(lambda x: tt.linear(x, w), (x,), (x,)), "no forward-mode derivative"),
    (lambda x, w: torch.func.hessian(lambda x: tt.linear(x, w).sum())(x), "no forward-mode derivative"),
    (lambda x, w: _dual_linear(x.detach(), w), "no forward-mode derivative"),
], ids=["double-backward", "grad-of-grad", "jvp", "hessian", "dual-tensor"])
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")      # torch's forward mode imports use it
def test_unsupported_derivatives_are_explained(call, message):
    with pytest.raises(RuntimeError, match=f"tppasm.torch.linear has {message} .*use .*torch.nn.functional.linear"):
        call(torch.randn(3, 4, requires_grad=True), torch.randn(2, 4))


@contextlib.contextmanager
def inference_with_grad_enabled():
    """torch.enable_grad() inside torch.inference_mode(): inference mode wins, nothing is recorded."""
    with torch.inference_mode(), torch.enable_grad():
        yield


MODES = {"no_grad": torch.no_grad, "inference": torch.inference_mode,
         "inference-enable-grad": inference_with_grad_enabled}


def _dual_linear(x, w):
    """linear of a forward-mode dual tensor (which no tensor requires grad for)."""
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        return tt.linear(fwAD.make_dual(x, torch.ones_like(x)), w)


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
    (lambda: tt.linear(torch.ones(2, 3).to_sparse(), torch.ones(4, 3)), ValueError,
     r"x is a torch.sparse_coo tensor; .* pass x.to_dense\(\)"),
    (lambda: tt.linear(torch.ones(2, 3), torch.ones(4, 3).to_sparse()), ValueError, r"pass weight.to_dense\(\)"),
    (lambda: tt.linear(torch.ones(2, 3), torch.ones(4, 3), torch.ones(4).to_sparse()), ValueError,
     r"pass bias.to_dense\(\)"),
    (lambda: tt.linear(np.ones((2, 3), np.float32), torch.ones(4, 3)), TypeError,
     r"x is a ndarray; expected a torch.Tensor: pass torch.from_numpy\(x\)"),
    (lambda: tt.linear(torch.ones(2, 3), [[1.0] * 3] * 4), TypeError, r"pass torch.as_tensor\(weight\)"),
    (lambda: tt.linear(torch.ones(2, 3), torch.ones(4, 3), np.ones(4, np.float32)), TypeError,
     r"bias is a ndarray; expected a torch.Tensor or None"),
    (lambda: tt.linear(torch.ones(2, 3), torch.ones(4, 3), act=1), TypeError, r"act=1 \(int\); expected one of"),
    (lambda: tt.Linear(3, 4)(np.ones((2, 3), np.float32)), TypeError, r"pass torch.from_numpy\(x\)"),
    (lambda: torch.ops.tppasm.linear_backward(torch.ones(2, 4).to_sparse(), torch.ones(2, 3), torch.ones(4, 3), None,
                                              None, [True] * 3), ValueError,
     r"tppasm::linear_backward: dy is a torch.sparse_coo tensor; .* pass dy.to_dense\(\)"),
])
def test_bad_arguments_are_explained(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("args, error, message", [
    ((torch.ones(2, 5), torch.ones(2, 3), torch.ones(4, 3), None, None, [True] * 3), ValueError,
     r"dy has shape \(2, 5\); expected \(2, 4\) for x \(2, 3\) and weight \(4, 3\)"),
    ((torch.ones(2, 4), torch.ones(2, 3), torch.ones(4, 3), None, None, [True]), ValueError,
     r"needs=\[True\]; expected 3 bools"),
    ((torch.ones(2, 4), torch.ones(2, 3), torch.ones(4, 2), None, None, [True] * 3), ValueError,
     r"x \(2, 3\) and weight \(4, 2\) do not fit"),
    ((torch.ones(2, 4), torch.ones(2, 3), torch.ones(4, 3), None, "relu", [True] * 3), ValueError,
     "saved is None with act='relu'; expected y for relu"),
    ((torch.ones(2, 4), torch.ones(2, 3), torch.ones(4, 3), torch.ones(2, 4), None, [True] * 3), ValueError,
     "saved is a tensor with act=None"),
    ((torch.ones(2, 4), torch.ones(2, 3), torch.ones(4, 3), torch.ones(4, 2), "gelu", [True] * 3), ValueError,
     r"saved has shape \(4, 2\); expected \(2, 4\)"),
    ((torch.ones(1, 2, 4), torch.ones(1, 2, 3), torch.ones(4, 3), torch.ones(3, 4), "gelu", [True] * 3), ValueError,
     r"saved has shape \(3, 4\); expected \(1, 2, 4\) or \(2, 4\) for x \(1, 2, 3\)"),
    ((torch.ones(2, 4), torch.ones(2, 3), torch.ones(4, 3), torch.ones(2, 4, dtype=torch.float64), "relu", [True] * 3),
     TypeError, r"saved is torch.float64; .* pass saved.float\(\)"),
    ((torch.ones(2, 4, dtype=torch.bfloat16), torch.ones(2, 3), torch.ones(4, 3), None, None, [True] * 3), TypeError,
     r"dy is torch.bfloat16 and x torch.float32; pass both in one dtype"),
    ((torch.ones(2, 4), torch.ones(2, 3), torch.ones(4, 3), None, "tanh", [True] * 3), ValueError, "act='tanh'"),
])
@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_bad_backward_arguments_are_explained(args, error, message, device):
    """``torch.ops.tppasm.linear_backward`` is public: the real and the fake kernel refuse what does
    not fit."""
    args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
    with pytest.raises(error, match=r"tppasm::linear_backward: .*" + message):
        torch.ops.tppasm.linear_backward(*args)


def test_the_real_kernel_refuses_other_devices():
    """Only meta tensors are at hand on a CPU-only build: handed to the CPU kernel itself (the
    dispatcher would take them to the fake kernel), they stand for a tensor on any other device."""
    cpu = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    x, w = torch.empty(2, 3, device="meta"), torch.empty(4, 3, device="meta")
    with pytest.raises(ValueError, match=r"x is a tensor on meta; tppasm kernels run on the CPU: pass x.cpu\(\)"):
        torch.ops.tppasm.linear.default.redispatch(cpu, x, w, None, None)
    with pytest.raises(ValueError, match=r"tppasm::linear_backward: x is a tensor on meta; .* pass x.cpu\(\)"):
        torch.ops.tppasm.linear_backward.default.redispatch(cpu, torch.empty(2, 4, device="meta"), x, w, None, None,
                                                            [True] * 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("act", tt.ACTS)
@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
@pytest.mark.parametrize("shape, out", [((2, 0), 3), ((2, 4, 0), 3), ((0, 0), 3), ((0,), 2), ((0, 3), 2), ((3, 2), 0)])
def test_empty_dimensions_match_torch(dtype, act, shape, out):
    """No input features (y is act(bias), x's gradient empty, the weight's zeros), no rows (the
    weight's and bias's gradients zeros) or no outputs, with any leading shape, as torch's
    linear gives them."""
    torch.manual_seed(0)
    layer = tt.Linear(shape[-1], out, act=act, dtype=dtype)
    with torch.no_grad():                          # torch initializes the bias of no inputs to zeros
        layer.bias.copy_(torch.randn(out))
    x = torch.randn(shape).to(dtype).requires_grad_()
    y = layer(x)
    ref = TORCH_ACT[act](F.linear(x.double(), layer.weight.double(), layer.bias.double()))
    assert y.dtype == dtype and y.shape == ref.shape
    torch.testing.assert_close(y.double(), ref, **TOL[dtype])
    dy = torch.randn(y.shape).to(dtype)
    got = torch.autograd.grad(y, (x, layer.weight, layer.bias), dy)
    want = torch.autograd.grad(ref, (x, layer.weight, layer.bias), dy.double())
    for g, r in zip(got, want):
        assert g.dtype == dtype and g.shape == r.shape
        torch.testing.assert_close(g.double(), r.double(), **TOL[dtype])
    y = tt.linear(x, layer.weight, None, act)                   # no bias: act(0)
    assert y.shape == ref.shape and not y.any()


def test_fc_views_tensors_and_explains_those_it_cannot_take():
    """tppasm.fc takes CPU tensors (bf16 too) as views; a tensor that requires grad is refused
    under grad mode, saying what to pass, as are sparse ones."""
    from tppasm import fc
    x, w = torch.ones(2, 3, dtype=torch.bfloat16), torch.ones(4, 3, dtype=torch.bfloat16)
    assert (fc.forward(x, w)[0].astype(np.float32) == 3).all()
    with pytest.raises(ValueError, match=r"fc.forward: operand x is a tensor that requires grad.*x.detach\(\)"):
        fc.forward(torch.ones(2, 3, requires_grad=True), torch.ones(4, 3))
    with pytest.raises(ValueError, match=r"fc.backward: operand w is a torch.sparse_coo tensor.*to_dense\(\)"):
        fc.backward(torch.ones(2, 4), torch.ones(2, 3), torch.ones(4, 3).to_sparse())


@pytest.fixture
def routes(monkeypatch):
    """The route each call took: "plain" (the kernel run directly, no gradient), "direct" (its
    autograd.Function, kernels run directly) or "operator" (torch.ops.tppasm.linear); backward
    calls of the operator torch.ops.tppasm.linear_backward add "operator backward"."""
    from tppasm.torch import ops
    seen, forward, direct = [], ops._forward, ops._Direct.forward
    op, op_backward = torch.ops.tppasm.linear, torch.ops.tppasm.linear_backward

    def spy_forward(x, weight, bias, act, pre=True):
        if not pre:
            seen.append("plain")
        return forward(x, weight, bias, act, pre)

    def spy_direct(ctx, *args):
        seen.append("direct")
        return direct(ctx, *args)

    class Spy:
        """Counts the calls of an operator; torch's dispatch may still look up its overloads
        (``.default``) through ``torch.ops.tppasm``, so every other attribute is the operator's."""

        def __init__(self, op, name):
            self.op, self.name = op, name

        def __call__(self, *args):
            seen.append(self.name)
            return self.op(*args)

        def __getattr__(self, attr):
            return getattr(self.op, attr)
    spy_op, spy_op_backward = Spy(op, "operator"), Spy(op_backward, "operator backward")
    monkeypatch.setattr(ops, "_forward", spy_forward)
    monkeypatch.setattr(ops._Direct, "forward", staticmethod(spy_direct))
    monkeypatch.setattr(torch.ops.tppasm, "linear", spy_op)
    monkeypatch.setattr(torch.ops.tppasm, "linear_backward", spy_op_backward)
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("act", tt.ACTS)
@pytest.mark.parametrize("layout", ["2d", "3d", "strided", "no-bias"])
@pytest.mark.parametrize("mode", ["no_grad", "inference", "inference-enable-grad", "no-grad-inputs"])
def test_plain_calls_skip_the_operator_and_match_torch(routes, dtype, act, layout, mode):
    x, w, b = inputs((2, 3, 17) if layout == "3d" else (6, 17), 9, dtype, bias=layout != "no-bias")
    if layout == "strided":
        x, w = x.detach().T.contiguous().T, w.detach().T.contiguous().T     # column-major views
    context = MODES.get(mode)
    if context is None:
        x, w, b = (None if t is None else t.detach() for t in (x, w, b))
        context = torch.enable_grad
    with context():
        y = tt.linear(x, w, b, act)
    assert routes == ["plain"]
    ref = TORCH_ACT[act](F.linear(x.detach().double(), w.detach().double(), None if b is None else b.detach().double()))
    assert y.dtype == dtype and y.shape == ref.shape and not y.requires_grad
    torch.testing.assert_close(y.double(), ref, **TOL[dtype])


@pytest.mark.parametrize("act", tt.ACTS)
def test_training_calls_run_the_kernels_directly(routes, act):
    """Gradients are recorded by tppasm.torch's own autograd.Function, forward and backward
    without the operators' dispatch (test_values_and_gradients_match_torch checks the values)."""
    x, w, b = inputs((5, 7), 3, torch.float32)
    y = tt.linear(x, w, b, act)
    y.sum().backward()
    assert routes == ["direct"] and x.grad.shape == x.shape and b.grad.shape == b.shape


def reference_grads(x, w, b, act, dy):
    """Gradients of x, w, b of torch's linear + act in float64 (those that require grad)."""
    ref = [None if t is None else t.detach().double().requires_grad_(t.requires_grad) for t in (x, w, b)]
    TORCH_ACT[act](F.linear(*ref)).backward(dy.double())
    return [None if t is None else t.grad for t in ref]


@pytest.mark.parametrize("act", ["relu", "gelu"])
@pytest.mark.parametrize("layout", ["2d", "strided-3d"])
def test_direct_backwards_again_and_refuses_changed_inputs(routes, act, layout):
    """The direct route's backward of a retained graph runs again with the same gradients, and an
    input changed in place after the forward is refused as torch refuses it."""
    x, w, b = inputs((2, 3, 5) if layout == "strided-3d" else (4, 5), 6, torch.float32)
    if layout == "strided-3d":
        x = x.detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()
    y, dy = tt.linear(x, w, b, act), torch.randn(*x.shape[:-1], 6)
    y.backward(dy, retain_graph=True)
    first = [t.grad.clone() for t in (x, w, b)]
    y.backward(dy)
    assert routes == ["direct"]
    for t, g, want in zip((x, w, b), first, reference_grads(x, w, b, act, dy)):
        torch.testing.assert_close(t.grad, 2 * g)
        torch.testing.assert_close(g.double(), want, **TOL[torch.float32])
    y = tt.linear(x, w, b, act)
    with torch.no_grad():
        w.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("swap", ["x", "weight", "x-data-write"])
def test_backward_reads_what_the_saved_tensors_hold(swap):
    """Every backward reads the saved tensors as they are then, the same each time, as torch's
    linear: after ``t.data = ...`` (a new storage; vector_to_parameters does it) or a write through
    ``x.data``."""
    def grads(linear):
        x, w, b = inputs((4, 6), 3, torch.float32)
        x = x.detach().T.contiguous().T.requires_grad_()            # column-major: the forward copies it
        y, dy = linear(x, w, b), torch.ones(4, 3)
        if swap == "x":
            x.data = torch.zeros(4, 6)
        elif swap == "weight":
            w.data = torch.zeros(3, 6)
        else:
            x.data.zero_()
        out = [torch.autograd.grad(y, (x, w, b), dy, retain_graph=True) for _ in range(2)]
        return [g for pair in out for g in pair]
    ours = grads(tt.linear)
    for first, again in zip(ours[:3], ours[3:]):
        torch.testing.assert_close(first, again)
    if swap != "weight":        # (torch's addmm saved a transposed view of the old weight: it reads that)
        for got, want in zip(ours, grads(F.linear)):
            torch.testing.assert_close(got, want)


def test_raw_saved_tensor_hooks_after_the_forward_are_kept():
    """Hooks put on a node's saved tensors after the forward decide what the backward reads: x
    unpacked as zeros gives the weight a zero gradient (torch's addmm names its saved x mat1)."""
    x, w, b = inputs((2, 3), 4, torch.float32)
    y = tt.linear(x, w, b)
    y.grad_fn._raw_saved_tensors[0].register_hooks(lambda t: t, torch.zeros_like)
    y.sum().backward()
    want = reference_grads(x, w, b, None, torch.ones(2, 4))
    assert w.grad.abs().max() == 0
    torch.testing.assert_close(x.grad.double(), want[0], **TOL[torch.float32])
    torch.testing.assert_close(b.grad.double(), want[2], **TOL[torch.float32])


@pytest.mark.parametrize("shape", [(2, 5, 8), (8,)])
def test_outputs_of_any_rank_take_in_place_ops(shape):
    """y of a 1-D or 3-D x is no view: nn.ReLU(inplace=True) and ``+=`` after the layer work."""
    torch.manual_seed(0)
    layer, ref = tt.Linear(8, 8), torch.nn.Linear(8, 8)
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(*shape)
    for model in (layer, ref):
        y = model(x)
        y += 1
        torch.nn.ReLU(inplace=True)(y).sum().backward()
    torch.testing.assert_close(layer.weight.grad, ref.weight.grad, **TOL[torch.float32])


@pytest.mark.parametrize("case", ["frozen-weight-residual", "data-x-weight-updated", "bias-only-inference"])
def test_only_what_a_needed_gradient_reads_is_saved(case):
    """As torch's linear: a frozen weight's layer keeps no x (an in-place residual after it is
    fine), an x that needs no gradient keeps no weight (an update in place before the backward is
    fine), and bias-only training keeps neither (inference tensors, which autograd cannot save)."""
    def grads(linear):
        x, w, b = inputs((4, 5), 5, torch.float32)
        if case == "frozen-weight-residual":
            w.requires_grad_(False)
            h = x * 1
            h += linear(h, w, b)
            h.sum().backward()
            return x.grad, b.grad
        if case == "data-x-weight-updated":
            x.requires_grad_(False)
            y = linear(x, w, b)
            with torch.no_grad():
                w.add_(1)
            y.sum().backward()
            return w.grad, b.grad
        with torch.inference_mode():
            x, w = x.detach().clone(), w.detach().clone()
        linear(x, w, b).sum().backward()
        return (b.grad,)
    for got, want in zip(grads(tt.linear), grads(F.linear)):
        torch.testing.assert_close(got, want, **TOL[torch.float32])


@pytest.mark.parametrize("act", [None, "relu", "gelu"])
def test_saved_tensor_hooks_decide_what_the_backward_reads(act):
    """Under saved-tensor hooks (what save_on_cpu and checkpoint use) the backward reads the
    unpacked tensors, as torch's linear does: here the hooks give back zeros."""
    def run(linear):
        x, w, b = inputs((3, 5), 4, torch.float32)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, torch.zeros_like):
            y = TORCH_ACT[act](linear(x, w, b)) if linear is F.linear else tt.linear(x, w, b, act)
        y.sum().backward()
        return x.grad, w.grad, b.grad
    for got, want in zip(run(tt.linear), run(F.linear)):
        torch.testing.assert_close(got, want)


class _Passthrough(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("context", ["autocast", "profiler", "dispatch_mode", "function_mode"])
@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "grad"])
def test_the_operator_runs_where_torch_must_see_it(routes, context, grad):
    x, w, b = inputs((4, 8), 3, torch.float32)
    if not grad:
        x, w, b = (t.detach() for t in (x, w, b))
    manager = {"autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16), "profiler": torch.profiler.profile,
               "dispatch_mode": _Passthrough, "function_mode": lambda: torch.device("cpu")}[context]()
    with manager as m:
        y = tt.linear(x, w, b, "relu")
        if grad:
            y.float().sum().backward()
    # (a function mode hands the call back to the operator by name: the spy may see it twice)
    assert set(routes) == {"operator", *["operator backward"] * grad} and y.shape == (4, 3)
    if context == "profiler":
        assert any(e.name == "tppasm::linear" for e in m.events())


@pytest.mark.parametrize("frozen", [False, True])
def test_fx_symbolic_trace_records_the_operator(frozen):
    """torch.fx.symbolic_trace of a module holding a Linear (or of a function calling linear) gets
    a tppasm.linear node and the same values (the proxy was refused as no tensor)."""
    net = torch.nn.Sequential(tt.Linear(6, 3, act="relu"), torch.nn.Tanh())
    if frozen:
        net[0].freeze()
    graph = torch.fx.symbolic_trace(net)
    assert torch.ops.tppasm.linear in [node.target for node in graph.graph.nodes]
    x = torch.randn(4, 6)
    with torch.no_grad():
        torch.testing.assert_close(graph(x), net(x))
    traced = torch.fx.symbolic_trace(lambda x, w: tt.linear(x, w, act="gelu"))
    w = torch.randn(3, 6)
    torch.testing.assert_close(traced(x, w), tt.linear(x, w, act="gelu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_relu_passes_the_gradient_of_a_nan_as_torch(dtype):
    """A NaN pre-activation: relu keeps it, and its gradient passes (torch's threshold_backward
    zeroes where y <= 0, which a NaN is not); it was zeroed."""
    def grads(linear):
        x, w, b = (t.to(dtype).requires_grad_() for t in (torch.ones(1, 2), torch.eye(2), torch.tensor([np.nan, 0])))
        y = linear(x, w, b)
        y.backward(torch.ones_like(y))
        return y, x.grad, w.grad, b.grad
    for got, want in zip(grads(lambda *a: tt.linear(*a, act="relu")), grads(lambda *a: torch.relu(F.linear(*a)))):
        torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")      # torch deprecates TorchScript
@pytest.mark.parametrize("act", tt.ACTS)
def test_torchscript_runs_the_operator(act, tmp_path):
    """torch.jit.script of a Linear (frozen or not, alone or in a Sequential) calls the operator:
    same values and gradients as eager, and a saved script loads back."""
    x, w, b = inputs((3, 6), 4, torch.float32)
    layer = tt.Linear(6, 4, act=act)
    layer.load_state_dict({"weight": w.detach(), "bias": b.detach()})
    for frozen in (False, True):
        if frozen:
            layer.freeze()
        net = torch.nn.Sequential(layer, torch.nn.Tanh())
        scripted = torch.jit.script(net)
        xs = x.detach().clone().requires_grad_()
        got = scripted(xs)
        got.sum().backward()
        want = torch.tanh(TORCH_ACT[act](F.linear(x, w, b)))
        want.sum().backward()
        torch.testing.assert_close(got, want, **TOL[torch.float32])
        torch.testing.assert_close(xs.grad, x.grad, **TOL[torch.float32])
        x.grad = None
    torch.jit.save(scripted, tmp_path / "net.pt")
    torch.testing.assert_close(torch.jit.load(tmp_path / "net.pt")(x), want, **TOL[torch.float32])


def test_meta_backward_and_mixed_devices_in_linear_backward():
    """All-meta training propagates shapes (stand-ins for what was not saved on dy's device), and
    linear_backward refuses a meta operand among CPU ones instead of returning empty memory."""
    x = torch.randn(3, 8, device="meta", requires_grad=True)
    w = torch.randn(4, 8, device="meta")            # needs no gradient: x is not saved
    tt.linear(x, w).sum().backward()
    assert x.grad.shape == x.shape and x.grad.is_meta
    with pytest.raises(ValueError, match="x on meta.*to_empty"):
        torch.ops.tppasm.linear_backward(torch.ones(3, 4), torch.ones(3, 8, device="meta"), torch.ones(4, 8), None,
                                         None, [True, True, True])


@pytest.mark.parametrize("grad_mode", [False, True], ids=["direct", "operator"])
def test_a_backward_that_no_gradient_reaches_returns_none(grad_mode):
    """The node called with no gradient for y or z (materialize_grads off) gives no gradients."""
    x, w, b = inputs((2, 3), 4, torch.float32)
    y = tt.linear(x, w, b, "gelu")
    with torch.set_grad_enabled(grad_mode):
        assert tuple(y.grad_fn.apply(None, None)) == (None, None, None, None)
