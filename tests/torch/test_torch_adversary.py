"""An adversarial pass over tppasm.torch: every shape, layout, dtype, mode and transform a careless
user may hand ``linear`` or ``Linear``, against torch's linear (+ activation) in float64, forward and
every gradient; refusals are TypeError/ValueError naming a fix that works; no byte outside an operand
is touched."""
import copy
import math
import pickle
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e .[test] pins torch==2.13.0)")

import tppasm.torch as tt  # noqa: E402

from .test_linear import TORCH_ACT  # noqa: E402

F = torch.nn.functional
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
EPS = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
LAYOUTS = ["contiguous", "transposed", "stepped", "expanded", "negative", "offset", "channels_last"]


def laid_out(values, how):
    """``values`` as a tensor of the same shape, dtype and values in layout ``how``: transposed
    storage, every other element of a larger tensor, broadcast along dim 0 (stride 0; the values of
    row 0 everywhere), a lazy negation of the negated values, or one element past a fresh
    allocation (misaligned)."""
    shape = tuple(values.shape)      # (a layout that does not apply to the rank: contiguous)
    if how == "transposed" and values.dim() >= 2:
        return values.permute(*reversed(range(values.dim()))).contiguous().permute(*reversed(range(values.dim())))
    if how == "stepped":
        big = torch.zeros([2 * s + 1 for s in shape], dtype=values.dtype)
        view = big[tuple(slice(1, 2 * s + 1, 2) for s in shape)]
        view.copy_(values)
        return view
    if how == "expanded" and values.dim() >= 1 and shape[0]:
        return values[:1].clone().expand(shape)
    if how == "negative":
        return torch._neg_view(-values)
    if how == "channels_last" and values.dim() == 4:
        return values.contiguous(memory_format=torch.channels_last)
    if how == "offset":
        flat = torch.zeros(values.numel() + 1, dtype=values.dtype)[1:]
        return flat.view(shape).copy_(values) if values.numel() else flat.view(shape)
    return values.clone()


def reference(x, w, b, act):
    """act(x @ w.T + b) in float64, on leaves that require grad (the same values as the operands)."""
    leaves = [None if t is None else t.detach().double().requires_grad_() for t in (x, w, b)]
    return TORCH_ACT[act](F.linear(*leaves)), leaves


def close(got, want, dtype, scale=1.0):
    """|got - want| within the dtype's rounding, scaled by the values' size (and ``scale``)."""
    assert got.shape == want.shape
    if want.numel():
        bound = EPS[dtype] * scale * (1 + want.abs().max().item())
        err = (got.double() - want).abs().max().item()
        assert err <= bound, f"error {err} > {bound}"


def torch_error(x, w, b, act, want):
    """The error torch's own linear makes in x's dtype against the float64 ``want``."""
    with torch.no_grad():
        b = None if b is None else b.detach().to(x.dtype)
        y = TORCH_ACT[act](F.linear(x.detach(), w.detach(), b))
    return (y.double() - want).abs().max().item() if want.numel() else 0.0


@settings(max_examples=40, deadline=None)
@given(dt=st.sampled_from(["f32", "bf16"]),
       lead=st.sampled_from([(), (0,), (1,), (3,), (2, 3), (2, 0, 3), (2, 3, 2), (1, 2, 1, 2)]),
       k=st.sampled_from([0, 1, 2, 3, 7, 16, 17, 31, 33, 64, 65, 70]), m=st.sampled_from([0, 1, 2, 5, 16, 17, 33, 70]),
       act=st.sampled_from(tt.ACTS), bias=st.sampled_from(["none", "0-d", "(1,)", "(m,)", "(m,) f32"]),
       layouts=st.tuples(*[st.sampled_from(LAYOUTS)] * 3), needs=st.tuples(st.booleans(), st.booleans(), st.booleans()),
       mode=st.sampled_from(["grad", "no_grad", "inference"]), seed=st.integers(0, 2**16))
def test_any_shape_layout_bias_and_mode_matches_torch(dt, lead, k, m, act, bias, layouts, needs, mode, seed):
    dtype = DTYPES[dt]
    g = torch.Generator().manual_seed(seed)
    x = laid_out(torch.randn(*lead, k, generator=g).to(dtype), layouts[0])
    w = laid_out((torch.randn(m, k, generator=g) / max(k, 1) ** 0.5).to(dtype), layouts[1])
    bdt = torch.float32 if bias == "(m,) f32" else dtype
    b = {"none": None, "0-d": torch.randn((), generator=g), "(1,)": torch.randn(1, generator=g)}.get(
        bias, torch.randn(m, generator=g))
    b = None if b is None else laid_out(b.to(bdt), layouts[2] if b.dim() else "contiguous")
    # leaves that require grad keep the layout (a negative view is no leaf: its gradient goes to its base)
    x, w, b = (t if t is None or not need else t.detach().requires_grad_() for t, need in zip((x, w, b), needs))
    context = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference": torch.inference_mode}[mode]
    with context():
        y = tt.linear(x, w, b, act)
    want, leaves = reference(x, w, b, act)
    assert y.dtype == dtype and y.shape == want.shape and not y.is_neg()
    close(y, want, dtype, 1 + torch_error(x, w, b, act, want) / EPS[dtype])
    watched = [i for i, t in enumerate((x, w, b)) if t is not None and t.requires_grad]
    assert y.requires_grad == (mode == "grad" and bool(watched))
    if not y.requires_grad:
        return
    dy = torch.randn(y.shape, generator=g).to(dtype)
    got = torch.autograd.grad(y, [(x, w, b)[i] for i in watched], dy)
    ref = torch.autograd.grad(want, [leaves[i] for i in watched], dy.double(), allow_unused=True)
    for i, gr, rf in zip(watched, got, ref):
        t = (x, w, b)[i]
        assert gr.dtype == t.dtype and gr.shape == t.shape
        rf = torch.zeros(t.shape, dtype=torch.float64) if rf is None else rf
        close(gr, rf, dtype, 2 * (1 + math.log2(1 + k + m + math.prod(lead))))


@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("n, k, m, act", [(3, 1000, 5, "gelu_erf"), (2, 1023, 70, "relu"), (1, 4097, 3, None),
                                          (5, 33, 1023, "gelu"), (1, 1, 4097, "gelu_erf_fast"), (1000, 3, 2, "relu")])
def test_odd_large_sizes_match_torch(dt, n, k, m, act):
    dtype = DTYPES[dt]
    g = torch.Generator().manual_seed(k + m)
    x = torch.randn(n, k, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(m, k, generator=g) / k ** 0.5).to(dtype).requires_grad_()
    b = torch.randn(m, generator=g).to(dtype).requires_grad_()
    y = tt.linear(x, w, b, act)
    want, leaves = reference(x, w, b, act)
    close(y, want, dtype, 1 + torch_error(x, w, b, act, want) / EPS[dtype])
    dy = torch.randn(y.shape, generator=g).to(dtype)
    for gr, rf in zip(torch.autograd.grad(y, (x, w, b), dy), torch.autograd.grad(want, leaves, dy.double())):
        close(gr, rf, dtype, 2 * (1 + math.log2(n + k + m)))


def _nested():
    return torch.nested.nested_tensor([torch.randn(2, 5), torch.randn(3, 5)], layout=torch.jagged)


X, W, B = torch.randn(3, 5), torch.randn(4, 5), torch.randn(4)


@pytest.mark.parametrize("call, error, message, fixed", [
    *[(lambda dt=dt: tt.linear(X.to(dt), W.to(dt)), TypeError, rf"x is {dt}; .*pass x.float\(\) or x.bfloat16\(\)",
       lambda: tt.linear(X.to(torch.float32), W))
      for dt in (torch.float16, torch.float64, torch.int32, torch.int64, torch.complex64, torch.bool, torch.uint8)],
    (lambda: tt.linear(X, W.half()), TypeError, r"weight is torch.float16; .*pass weight.float\(\)",
     lambda: tt.linear(X, W.half().float())),
    (lambda: tt.linear(X, W.bfloat16()), TypeError, r"weight is torch.bfloat16 and x torch.float32.*x.bfloat16\(\)",
     lambda: tt.linear(X.bfloat16(), W.bfloat16())),
    (lambda: tt.linear(X.bfloat16(), W), TypeError, r"weight is torch.float32 and x torch.bfloat16.*x.float\(\)",
     lambda: tt.linear(X.bfloat16().float(), W)),
    (lambda: tt.linear(X, W, B.double()), TypeError, r"bias is torch.float64; .*pass bias.float\(\)",
     lambda: tt.linear(X, W, B.double().float())),
    (lambda: tt.linear(X, W, B.bfloat16()), TypeError, r"bias is torch.bfloat16 and x torch.float32.*bias.float\(\)",
     lambda: tt.linear(X, W, B.bfloat16().float())),
    (lambda: tt.linear(X, W, torch.ones(4, dtype=torch.int64)), TypeError, r"bias is torch.int64",
     lambda: tt.linear(X, W, torch.ones(4))),
    (lambda: tt.linear(torch.tensor(1.0), W), ValueError, r"x \(\) and weight \(4, 5\) do not fit", None),
    (lambda: tt.linear(X, W[0]), ValueError, r"weight \(5,\) do not fit: weight is \(out_features, in_features\)",
     lambda: tt.linear(X, W[0][None])[:, 0]),
    (lambda: tt.linear(X, W[None]), ValueError, r"weight \(1, 4, 5\) do not fit", lambda: tt.linear(X, W[None][0])),
    (lambda: tt.linear(X, W, B[:3]), ValueError, r"bias has shape \(3,\); expected \(4,\)", None),
    (lambda: tt.linear(X, W, B[None]), ValueError, r"pass bias.reshape\(4\)",
     lambda: tt.linear(X, W, B[None].reshape(4))),
    # (1, 1): the fix named was bias.expand(4), which torch refuses for a 2-d tensor
    (lambda: tt.linear(X, W, torch.ones(1, 1)), ValueError, r"pass bias.reshape\(1\).expand\(4\)",
     lambda: torch.ops.tppasm.linear(X, W, torch.ones(1, 1).reshape(1).expand(4), None)[0]),
    (lambda: torch.ops.tppasm.linear(X, W, torch.tensor(2.0), None), ValueError, r"pass bias.expand\(4\)",
     lambda: torch.ops.tppasm.linear(X, W, torch.tensor(2.0).expand(4), None)[0]),
    # a jagged x reached the operator: NotImplementedError naming only tppasm.linear.default
    (lambda: tt.linear(_nested(), W), ValueError, r"x is a nested tensor; .*x.values\(\)",
     lambda: tt.linear(_nested().values(), W)),
    (lambda: tt.Linear(5, 4)(_nested()), ValueError, r"x is a nested tensor", None),
    (lambda: tt.linear(X, W.to("meta")), ValueError, r"weight is a tensor on meta and x on cpu; a meta tensor holds no",
     None),
    (lambda: tt.linear(X, W, act="Relu"), ValueError, r"act='Relu'; expected one of",
     lambda: tt.linear(X, W, act="relu")),
    (lambda: tt.Linear(5, 4).half()(X.half()), TypeError, r"layer's weight is torch.float16.*layer.float\(\)",
     lambda: tt.Linear(5, 4).half().float()(X.half().float())),
], ids=[f"x-{dt}" for dt in ("f16", "f64", "i32", "i64", "c64", "bool", "u8")] + [
    "w-f16", "mixed-f32-bf16", "mixed-bf16-f32", "bias-f64", "bias-bf16-x-f32", "bias-int", "x-0d", "w-1d", "w-3d",
    "bias-short", "bias-1x4", "bias-1x1", "op-bias-0d", "x-jagged", "layer-jagged", "w-meta", "act-case", "layer-f16"])
def test_refusals_name_a_fix_that_works(call, error, message, fixed):
    with pytest.raises(error, match=message):
        call()
    if fixed is not None:
        assert torch.isfinite(fixed()).all()


def test_torch_fx_traces_what_eager_takes_and_refuses_what_it_refuses():
    """symbolic_trace ran the operator on a constant bias as given (a 0-d bias, which eager
    broadcasts, failed at the graph's run) and refused nothing itself (an int act became a
    RuntimeError of the schema, a NumPy weight a NotImplementedError of fx)."""
    class Net(torch.nn.Module):
        def __init__(self, weight, bias, act):
            super().__init__()
            self.args = weight, bias, act

        def forward(self, x):
            return tt.linear(x, *self.args)

    x = torch.randn(3, 5)
    for bias in (torch.tensor(0.5), torch.full((1,), 0.5)):
        graph = torch.fx.symbolic_trace(Net(W, bias, "relu"))
        torch.testing.assert_close(graph(x), torch.relu(F.linear(x, W, bias)))
    with pytest.raises(TypeError, match=r"act=3 \(int\)"):
        torch.fx.symbolic_trace(Net(W, None, 3))
    with pytest.raises(TypeError, match=r"weight is a ndarray; .*torch.from_numpy\(weight\)"):
        torch.fx.symbolic_trace(Net(W.numpy(), None, None))
    with pytest.raises(ValueError, match=r"act='tanh'"):
        torch.fx.symbolic_trace(Net(W, None, "tanh"))


def test_a_frozen_layer_takes_the_bias_the_unfrozen_one_takes():
    """A layer whose bias is one value (a 0-d Parameter) ran unfrozen and was refused frozen."""
    layer = tt.Linear(5, 4)
    layer.bias = torch.nn.Parameter(torch.tensor(0.25))
    x = torch.randn(3, 5)
    want = F.linear(x, layer.weight, layer.bias).detach()
    with torch.no_grad():
        torch.testing.assert_close(layer(x), want)
        torch.testing.assert_close(layer.freeze()(x), want)
        layer.bias.fill_(-1.0)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))


@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("act", tt.ACTS)
def test_activations_at_extreme_values(dt, act):
    """Huge, tiny and non-finite pre-activations: as torch's activation, except that where torch's
    gelu computes inf * 0 (NaN) tppasm gives the limits: gelu(-inf) = 0, gelu(inf) = inf, with
    gradients 0 and 1."""
    dtype = DTYPES[dt]
    z = torch.tensor([-3e38, -1e30, -1e6, -100.0, -20.0, -5.5, -5.0, -3.0, -1e-30, 0.0, 1e-30, 3.0, 5.0, 100.0, 1e6,
                      3e38, float("nan")]).to(dtype)
    x = z[:, None].clone().requires_grad_()
    one = torch.ones(1, 1, dtype=dtype)
    y = tt.linear(x, one, None, act)
    with torch.no_grad():
        fused = tt.linear(x, one, None, act)                       # the gelus fused in the GEMM's epilogue
    want, (leaf, _, _) = reference(x, one, None, act)
    (gx,) = torch.autograd.grad(y.sum(), x)
    (gwant,) = torch.autograd.grad(want.sum(), leaf)
    atol = 2 ** -22 if act == "gelu_erf_fast" else EPS[dtype] * 1e-3      # its documented absolute error
    for got in (y, fused):
        torch.testing.assert_close(got.double(), want, rtol=EPS[dtype], atol=atol, equal_nan=True)
    torch.testing.assert_close(gx.double(), gwant, rtol=EPS[dtype], atol=EPS[dtype], equal_nan=True)
    inf = torch.tensor([[-math.inf], [math.inf]], dtype=dtype, requires_grad=True)
    y = tt.linear(inf, one, None, act)
    (g,) = torch.autograd.grad(y.sum(), inf)
    limits = {None: [-math.inf, math.inf], "relu": [0.0, math.inf]}.get(act, [0.0, math.inf])
    assert y.flatten().tolist() == limits
    assert g.flatten().tolist() == ([1.0, 1.0] if act is None else [0.0, 1.0])


@settings(max_examples=30, deadline=None)
@given(dt=st.sampled_from(["f32", "bf16"]), n=st.sampled_from([1, 2, 17]),
       k=st.sampled_from([1, 2, 15, 16, 17, 33, 65]),
       m=st.sampled_from([1, 3, 16, 17, 33]), act=st.sampled_from([None, "relu"]), seed=st.integers(0, 2**16),
       specials=st.lists(st.tuples(st.booleans(), st.floats(0, 1),
                                   st.sampled_from([math.nan, math.inf, -math.inf, 0.0])), max_size=4))
def test_nan_and_inf_propagate_as_in_torch(dt, n, k, m, act, seed, specials):
    dtype = DTYPES[dt]
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(n, k, generator=g), torch.randn(m, k, generator=g)
    for in_x, where, value in specials:
        t = x if in_x else w
        t.view(-1)[int(where * (t.numel() - 1))] = value
    x, w = x.to(dtype), w.to(dtype)
    want = TORCH_ACT[act](F.linear(x.double(), w.double()))
    for xx in (x, x.clone().requires_grad_()):
        y = tt.linear(xx, w, None, act).double()
        assert torch.equal(y.isnan(), want.isnan()) and torch.equal(y.isposinf(), want.isposinf())
        assert torch.equal(y.isneginf(), want.isneginf())


@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("act", [None, "gelu"])
def test_outputs_in_reused_memory_are_written_whole(dt, act):
    """Outputs of 64 KiB or more come from tppasm's pool: a call that reuses a freed NaN-filled
    output (and gradients) writes every element."""
    dtype = DTYPES[dt]
    n, k, m = 67, 129, 260
    g = torch.Generator().manual_seed(0)
    poison_x = torch.full((n, k), math.nan).to(dtype).requires_grad_()
    poison_w = torch.full((m, k), math.nan).to(dtype).requires_grad_()
    y = tt.linear(poison_x, poison_w, None, act)
    y.sum().backward()
    assert y.isnan().all() and poison_x.grad.isnan().all() and poison_w.grad.isnan().all()
    addresses = {t.data_ptr() for t in (y, poison_x.grad, poison_w.grad)}
    del y, poison_x, poison_w
    x = torch.randn(n, k, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(m, k, generator=g) / k ** 0.5).to(dtype).requires_grad_()
    y = tt.linear(x, w, None, act)
    y.backward(torch.ones_like(y))
    assert addresses & {t.data_ptr() for t in (y, x.grad, w.grad)}      # the poisoned memory came back
    want, leaves = reference(x, w, None, act)
    want.backward(torch.ones_like(want))
    for got, ref in ((y, want), (x.grad, leaves[0].grad), (w.grad, leaves[1].grad)):
        assert not got.isnan().any()
        close(got, ref, dtype, 20)


FENCED = """
    import sys
    import numpy as np, torch
    import tppasm.torch as tt
    from tppasm import layout
    from tests.tpp.test_transform_adversary import fenced
    kept, where, made = [], {"end": True}, []
    original = layout.empty

    def fenced_tensor(t):
        # a copy of t whose bytes end at an inaccessible page (or start right after one)
        region, view = fenced(t.numel() * t.element_size(), where["end"])
        kept.append(region)
        out = torch.from_numpy(view).view(t.dtype).view(t.shape)
        return out.copy_(t)

    def fenced_empty(shape, dtype="f32", align=64):
        a = original(shape, dtype)
        region = fenced(max(a.nbytes, 1) + 64, where["end"])[0]
        kept.append(region)
        made.append(a.shape)
        start = (region.size - a.nbytes) // 64 * 64 if where["end"] else 0
        return np.ndarray(a.shape, a.dtype, buffer=region, offset=start)

    for module in list(sys.modules.values()):          # every tppasm array: outputs and scratch
        if module is not layout and getattr(module, "empty", None) is original:
            module.empty = fenced_empty
    layout.empty = fenced_empty
    for end in (True, False):
        where["end"] = end
        for dt in (torch.float32, torch.bfloat16):
            for n, k, m, act in [(1, 1, 1, None), (3, 5, 7, "relu"), (2, 17, 33, "gelu"), (5, 70, 9, "gelu_erf"),
                                 (33, 31, 65, None), (1, 129, 3, "gelu_erf_fast"), (70, 3, 1, "relu")]:
                x, w, b = (fenced_tensor(torch.randn(s).to(dt)) for s in ((n, k), (m, k), (m,)))
                for t in (x, w, b):
                    t.requires_grad_()
                y = tt.linear(x, w, b, act)
                with torch.no_grad():
                    y2 = tt.linear(x, w, b, act)
                y.backward(fenced_tensor(torch.randn(n, m).to(dt)))
                assert torch.isfinite(y).all() and torch.isfinite(y2).all() and torch.isfinite(w.grad).all()
    print(len(kept) - len(made), len(made), "fenced")
"""


def test_no_byte_outside_an_operand_is_touched():
    """Operands, outputs and scratch against inaccessible pages (both ends): forward, fused forward and
    backward of f32 and bf16 fault on any byte past an operand (in a subprocess: a fault kills it)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(FENCED)], capture_output=True, text=True, timeout=120,
                          cwd=__file__.rsplit("/tests/", 1)[0])
    assert done.returncode == 0, done.stderr[-3000:]
    operands, allocated = map(int, done.stdout.split()[:2])
    assert operands == 2 * 2 * 7 * 4 and allocated > 2 * 2 * 7 * 4          # outputs and gradients were fenced too


def test_inputs_are_never_written():
    """Forward and backward leave x, the weight (a view of a larger tensor, which x aliases) and the
    bias bit for bit as they were, and nothing around them."""
    for dtype in DTYPES.values():
        big = torch.randn(40, 40).to(dtype)
        before = big.clone()
        w = big[3:20, 2:35].requires_grad_(False)
        x = big[10:30, 2:35]
        b = big[0, :17]
        leaves = [t.detach().requires_grad_() for t in (x, w, b)]
        for act in tt.ACTS:
            y = tt.linear(*leaves, act)
            y.backward(torch.ones_like(y))
            with torch.no_grad():
                y2 = tt.linear(x, w, b, act)
            want = reference(x, w, b, act)[0]
            for got in (y, y2):
                close(got, want, dtype, 1 + torch_error(x, w, b, act, want) / EPS[dtype])
        assert torch.equal(big.view(torch.int16 if dtype is torch.bfloat16 else torch.int32),
                           before.view(torch.int16 if dtype is torch.bfloat16 else torch.int32))


def test_in_place_ops_on_outputs_and_outputs_that_outlive_their_inputs():
    x = torch.randn(6, 5, requires_grad=True)
    w = torch.randn(4, 5, requires_grad=True)
    for act in (None, "gelu"):                              # relu_ on y: allowed where the backward does not read y
        got = torch.autograd.grad(tt.linear(x, w, None, act).relu_().sum(), (x, w))
        want = torch.autograd.grad(TORCH_ACT[act](F.linear(x, w)).relu_().sum(), (x, w))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):     # as torch's relu: it saves y
        tt.linear(x, w, None, "relu").relu_().sum().backward()

    def make():
        x, w = torch.randn(64, 300), torch.randn(300, 300)
        return tt.linear(x, w), F.linear(x, w)
    y, want = make()
    rows = y[5:9]
    del y
    for _ in range(3):                                      # pooled memory freed and taken again
        tt.linear(torch.randn(64, 300), torch.randn(300, 300))
    torch.testing.assert_close(rows, want[5:9], rtol=1e-5, atol=1e-4)


def test_the_layer_round_trips_with_nn_linear_and_copies():
    torch.manual_seed(0)
    plain = torch.nn.Linear(7, 3)
    ours = tt.Linear(7, 3, act="gelu_erf")
    assert ours.load_state_dict(plain.state_dict()).missing_keys == []
    back = torch.nn.Linear(7, 3)
    back.load_state_dict(ours.state_dict())
    x = torch.randn(4, 7)
    want = F.gelu(plain(x))
    for layer in (ours, copy.deepcopy(ours), pickle.loads(pickle.dumps(ours)), ours.eval(), ours.train()):
        torch.testing.assert_close(layer(x), want)
    torch.testing.assert_close(F.gelu(back(x)), want)
    half = copy.deepcopy(ours).to(torch.bfloat16)
    torch.testing.assert_close(half(x.bfloat16()).double(), F.gelu(F.linear(x.bfloat16().double(),
                               half.weight.double(), half.bias.double())), rtol=1e-2, atol=1e-2)
    ours.requires_grad_(False)
    xr = x.clone().requires_grad_()
    ours(xr).sum().backward()
    assert ours.weight.grad is None and xr.grad is not None


@pytest.mark.parametrize("optimizer", ["SGD", "Adam", "AdamW-fused"])
def test_the_layer_follows_its_weights_through_optimizer_steps(optimizer):
    torch.manual_seed(0)
    layer = tt.Linear(6, 5, act="relu")
    make = {"SGD": lambda p: torch.optim.SGD(p, lr=0.3, momentum=0.9), "Adam": lambda p: torch.optim.Adam(p, lr=0.1),
            "AdamW-fused": lambda p: torch.optim.AdamW(p, lr=0.1, fused=True)}[optimizer]
    opt = make(layer.parameters())
    x = torch.randn(8, 6)
    for _ in range(3):
        opt.zero_grad()
        layer(x).pow(2).sum().backward()
        opt.step()
        want = torch.relu(F.linear(x, layer.weight, layer.bias)).detach()
        torch.testing.assert_close(layer(x).detach(), want)
        with torch.no_grad():
            torch.testing.assert_close(layer(x), want)
        with torch.inference_mode():
            torch.testing.assert_close(layer(x), want)


@pytest.mark.parametrize("autocast", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("dtypes", [("f32", "bf16", "f32"), ("bf16", "f32", None), ("f16", "f16", "f16"),
                                    ("f16", "bf16", "f32"), ("f32", "f32", "f32")])
def test_autocast_takes_mixed_inputs_as_torch(autocast, dtypes):
    names = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    xd, wd, bd = (None if d is None else names[d] for d in dtypes)
    x = X.to(xd).requires_grad_()
    w = W.to(wd).requires_grad_()
    b = None if bd is None else B.to(bd).requires_grad_()
    with torch.autocast("cpu", dtype=autocast):
        y = tt.linear(x, w, b, "gelu")
        want = F.gelu(F.linear(x, w, b), approximate="tanh")
    assert y.dtype == want.dtype == autocast
    torch.testing.assert_close(y, want, rtol=1e-2, atol=1e-2)
    leaves = [t for t in (x, w, b) if t is not None]
    for got, ref in zip(torch.autograd.grad(y.float().sum(), leaves), torch.autograd.grad(want.float().sum(), leaves)):
        assert got.dtype == ref.dtype
        torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_compile_takes_any_rank_zero_rows_and_a_one_value_bias():
    torch._dynamo.reset()
    w = torch.randn(4, 5, requires_grad=True)
    f = torch.compile(lambda x, b: tt.linear(x, w, b, "gelu_erf") * 2, backend="aot_eager", dynamic=True)
    for shape, bias in [((3, 5), torch.randn(4)), ((7, 5), torch.tensor(0.5)), ((2, 3, 5), None), ((5,), torch.ones(1)),
                        ((0, 5), torch.randn(4))]:
        x = torch.randn(shape, requires_grad=True)
        y = f(x, bias)
        want = F.gelu(F.linear(x, w, bias)) * 2
        torch.testing.assert_close(y, want)
        for got, ref in zip(torch.autograd.grad(y.sum(), (x, w)), torch.autograd.grad(want.sum(), (x, w))):
            torch.testing.assert_close(got, ref)


@pytest.mark.filterwarnings("error:There is a performance drop")    # torch's batching fallback: not taken
@pytest.mark.parametrize("in_dims", [(0, None, None), (None, 0, None), (None, None, 0), (0, 0, 0), (2, None, None),
                                     (None, 1, None), (1, 0, None)])
@pytest.mark.parametrize("act", [None, "gelu_erf"])
def test_vmap_and_grad_over_any_operand(in_dims, act):
    g = torch.Generator().manual_seed(0)
    batch = 3
    x, w, b = torch.randn(2, 5, generator=g), torch.randn(4, 5, generator=g), torch.randn(4, generator=g)
    args = [t.unsqueeze(d).expand(*t.shape[:d], batch, *t.shape[d:]) + torch.randn(
        *t.shape[:d], batch, *t.shape[d:], generator=g) if d is not None else t for t, d in zip((x, w, b), in_dims)]
    ours = torch.func.vmap(lambda x, w, b: tt.linear(x, w, b, act), in_dims=in_dims)(*args)
    want = torch.func.vmap(lambda x, w, b: TORCH_ACT[act](F.linear(x, w, b)), in_dims=in_dims)(*args)
    torch.testing.assert_close(ours, want)

    def loss(f):
        return lambda x, w, b: f(x, w, b).pow(2).sum()
    grads = torch.func.vmap(torch.func.grad(loss(lambda x, w, b: tt.linear(x, w, b, act)), argnums=(0, 1, 2)),
                            in_dims=in_dims)(*args)
    wants = torch.func.vmap(torch.func.grad(loss(lambda x, w, b: TORCH_ACT[act](F.linear(x, w, b))), argnums=(0, 1, 2)),
                            in_dims=in_dims)(*args)
    for got, ref in zip(grads, wants):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_modes_and_thread_counts_give_the_same_numbers(dt):
    """grad mode, no_grad and inference_mode, on 1, 2 or 3 threads: bit for bit the same y and
    gradients (a bf16 gelu that no gradient needs is fused: its y may be one bf16 unit apart)."""
    dtype = DTYPES[dt]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(257, 300, generator=g).to(dtype)
    w = (torch.randn(129, 300, generator=g) / 300 ** 0.5).to(dtype)
    b = torch.randn(129, generator=g)
    dy = torch.randn(257, 129, generator=g).to(dtype)
    threads = torch.get_num_threads()
    results = {}
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            for act in tt.ACTS:
                leaves = [t.clone().requires_grad_() for t in (x, w, b)]
                y = tt.linear(*leaves, act)
                grads = torch.autograd.grad(y, leaves, dy)
                with torch.no_grad():
                    y_no_grad = tt.linear(x, w, b, act)
                with torch.inference_mode():
                    y_inference = tt.linear(x, w, b, act)
                results[count, act] = (y, *grads, y_no_grad, y_inference)
    finally:
        torch.set_num_threads(threads)
    for (count, act), found in results.items():
        assert all(torch.equal(a, c) for a, c in zip(found, results[1, act]))
        y, _, _, _, y_no_grad, y_inference = found
        assert torch.equal(y_no_grad, y_inference)
        if dtype is torch.bfloat16 and act in ("gelu", "gelu_erf", "gelu_erf_fast"):
            torch.testing.assert_close(y_no_grad, y, rtol=2 ** -7, atol=2 ** -7)
        else:
            assert torch.equal(y_no_grad, y)


@pytest.mark.parametrize("act", [None, "relu", "gelu"])
def test_jacrev_and_vjp_over_every_operand(act):
    g = torch.Generator().manual_seed(2)
    args = torch.randn(2, 3, generator=g), torch.randn(4, 3, generator=g), torch.randn(4, generator=g)

    def ours(x, w, b):
        return tt.linear(x, w, b, act)

    def theirs(x, w, b):
        return TORCH_ACT[act](F.linear(x, w, b))
    for got, want in zip(torch.func.jacrev(ours, argnums=(0, 1, 2))(*args),
                         torch.func.jacrev(theirs, argnums=(0, 1, 2))(*args)):
        torch.testing.assert_close(got, want)
    y, pull = torch.func.vjp(ours, *args)
    y_want, pull_want = torch.func.vjp(theirs, *args)
    torch.testing.assert_close(y, y_want)
    cotangent = torch.randn(y.shape, generator=g)
    for got, want in zip(pull(cotangent), pull_want(cotangent)):
        torch.testing.assert_close(got, want)
