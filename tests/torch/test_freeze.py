"""tppasm.torch.Linear.freeze: the weight packed once for calls that record no gradient, values
as the unfrozen layer's and torch's, training calls unchanged, a changed weight refused until
frozen again."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e .[test] pins torch==2.13.0)")

import torch.nn.utils.prune  # noqa: E402
import tppasm.torch as tt  # noqa: E402
from tppasm import fc  # noqa: E402

from .test_linear import MODES, TOL, TORCH_ACT  # noqa: E402

F = torch.nn.functional


def layer(dtype, act, n_in=40, n_out=70, bias=True):
    torch.manual_seed(0)
    return tt.Linear(n_in, n_out, bias=bias, act=act, dtype=dtype)


@pytest.fixture
def packed_calls(monkeypatch):
    """How many fc.forward_arrays calls (the torch layer's) were given a packed weight."""
    seen, forward = [], fc.forward_arrays

    def spy(x, w, *args, **kwargs):
        seen.append(isinstance(w, fc.PackedWeight))
        return forward(x, w, *args, **kwargs)
    monkeypatch.setattr(fc, "forward_arrays", spy)
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("act", tt.ACTS)
@pytest.mark.parametrize("shape", [(5, 40), (2, 33, 40), (100, 40)])
@pytest.mark.parametrize("mode", ["no_grad", "inference", "inference-enable-grad", "no-grad-tensors"])
@pytest.mark.parametrize("bias", [True, False])
def test_frozen_calls_read_the_packed_weight_and_match_torch(packed_calls, dtype, act, shape, mode, bias):
    net = layer(dtype, act, bias=bias).freeze()
    x = torch.randn(*shape).to(dtype)
    if mode == "no-grad-tensors":
        net.requires_grad_(False)
    context = MODES.get(mode, torch.enable_grad)
    with context():
        y = net(x)
    assert packed_calls == [True] and y.dtype == dtype and not y.requires_grad
    ref = TORCH_ACT[act](F.linear(x.double(), net.weight.detach().double(),
                                  None if net.bias is None else net.bias.detach().double()))
    torch.testing.assert_close(y.double(), ref, **TOL[dtype])
    with context():
        net.unfreeze()(x)
    assert packed_calls == [True, False]


def test_training_calls_take_the_plain_path_and_have_gradients(packed_calls):
    net = layer(torch.float32, "gelu_erf").freeze()
    x = torch.randn(6, 40, requires_grad=True)
    net(x).sum().backward()
    assert packed_calls == [False] and x.grad.shape == x.shape and net.weight.grad is not None


@pytest.mark.parametrize("change", ["in place", "dtype"])
def test_a_changed_weight_is_refused_until_frozen_again(change):
    net = layer(torch.float32, "relu").freeze()
    x = torch.randn(3, 40)
    with torch.no_grad():
        if change == "in place":
            net.weight.mul_(2)
        else:
            net.bfloat16()
            x = x.bfloat16()
        with pytest.raises(ValueError, match=r"weight changed after freeze\(\).*call layer.freeze\(\) again"):
            net(x)
        y = net.freeze()(x)
        ref = torch.relu(F.linear(x.double(), net.weight.double(), net.bias.double()))
        torch.testing.assert_close(y.double(), ref, **TOL[x.dtype])


def test_autocast_takes_the_unfrozen_path(packed_calls):
    net = layer(torch.float32, None).freeze()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        y = net(torch.randn(4, 40))
    assert y.dtype == torch.bfloat16 and True not in packed_calls


@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated")
@pytest.mark.parametrize("make, message", [
    (lambda: layer(torch.float64, None), "float64 tensor on cpu; freeze takes a dense float32 or bfloat16"),
    (lambda: layer(torch.float32, None).to("meta"), r"on meta .*layer.to_empty\(device='cpu'\), then "
                                                     r"layer.load_state_dict\(...\) or layer.reset_parameters\(\)"),
    (lambda: torch.nn.utils.parametrizations.weight_norm(layer(torch.float32, None)), "remove_parametrizations"),
    (lambda: torch.nn.utils.weight_norm(layer(torch.float32, None)), r"torch.nn.utils.remove_weight_norm\(layer\)"),
    (lambda: torch.nn.utils.spectral_norm(layer(torch.float32, None)), r"nn.utils.remove_spectral_norm\(layer\)"),
    (lambda: torch.nn.utils.prune.l1_unstructured(layer(torch.float32, None), "weight", 0.5), r"prune\.remove"),
])
def test_weights_the_kernels_cannot_take_are_refused(make, message):
    """(A weight computed at each access, by a parametrization or pruning, is a new tensor each
    time: its packing would be refused at every call, however often freeze() ran.)"""
    net = make()
    with pytest.raises(ValueError, match=message):
        net.freeze()


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_come_unfrozen_and_work(how, packed_calls):
    import copy
    import io
    net = layer(torch.float32, "relu").freeze()
    if how == "deepcopy":
        twin = copy.deepcopy(net)
    else:
        buffer = io.BytesIO()
        torch.save(net, buffer)
        twin = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    x = torch.randn(3, 40)
    with torch.no_grad():
        torch.testing.assert_close(twin(x), net(x))
    assert packed_calls == [False, True] and twin._frozen is None and net._frozen is not None


def test_state_dict_and_repr_are_those_of_the_layer():
    net = layer(torch.float32, "relu")
    before = net.state_dict()
    net.freeze()
    assert net.state_dict().keys() == before.keys() and "act='relu'" in repr(net)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("change", ["in place", "new parameter", "none"])
def test_frozen_calls_read_the_bias_as_it_is_now(dtype, change, packed_calls):
    net = layer(dtype, None).freeze()
    x = torch.randn(3, 40).to(dtype)
    with torch.no_grad():
        net(x)                                  # the bias as fc takes it is remembered here
        if change == "in place":
            net.bias.add_(1)
        elif change == "new parameter":
            net.bias = torch.nn.Parameter(net.bias * 2 - 1)
        y = net(x)
        ref = F.linear(x.double(), net.weight.double(), net.bias.double())
    assert packed_calls == [True, True]
    torch.testing.assert_close(y.double(), ref, **TOL[dtype])


@pytest.mark.parametrize("x, bias, error, message", [
    (torch.randn(3, 40, dtype=torch.float64), None, TypeError, r"x is torch.float64; .* pass x.float\(\)"),
    (torch.randn(3, 40).bfloat16(), None, TypeError, r"weight is torch.float32 and x torch.bfloat16"),
    (torch.randn(3, 41), None, ValueError, r"x \(3, 41\) and weight \(70, 40\) do not fit"),
    (torch.randn(3, 40).to_sparse(), None, ValueError, r"x is a torch.sparse_coo tensor.*to_dense\(\)"),
    (torch.randn(3, 40), torch.randn(70, dtype=torch.float64), TypeError, r"bias is torch.float64"),
    (torch.randn(3, 40), torch.randn(71), ValueError, r"bias has shape \(71,\); expected \(70,\)"),
])
def test_frozen_calls_refuse_what_the_kernels_cannot_take(x, bias, error, message):
    net = layer(torch.float32, None).freeze()
    if bias is not None:
        net.bias = torch.nn.Parameter(bias, requires_grad=False)
    with torch.no_grad(), pytest.raises(error, match=message):
        net(x)


def test_frozen_calls_take_strided_inputs(packed_calls):
    net = layer(torch.float32, "relu").freeze()
    x = torch.randn(40, 6).T                       # column-major
    with torch.no_grad():
        y = net(x)
    assert packed_calls == [True]
    torch.testing.assert_close(y.double(), torch.relu(F.linear(x.double(), net.weight.double(),
                                                                 net.bias.double())), **TOL[torch.float32])


def test_parameters_made_under_inference_mode_freeze_and_run():
    with torch.inference_mode():
        net = layer(torch.float32, "relu").freeze()       # inference tensors: no version counter
        x = torch.randn(3, 40)
        y = net(x)
        net.bias.add_(1)                                  # seen through the float32 bias's view
        y2 = net(x)
    ref = torch.relu(F.linear(x.double(), net.weight.double(), net.bias.double()))
    torch.testing.assert_close(y2.double(), ref, **TOL[torch.float32])
    assert not torch.equal(y, y2)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")      # torch's forward mode imports use it
def test_frozen_calls_refuse_a_dual_tensor():
    """A forward-mode tangent would be dropped without a word: refused, as unfrozen calls do."""
    import torch.autograd.forward_ad as fwAD
    net = layer(torch.float32, "relu").freeze()
    with fwAD.dual_level(), torch.no_grad():
        x = fwAD.make_dual(torch.randn(4, 40), torch.randn(4, 40))
        with pytest.raises(RuntimeError, match="no forward-mode derivative"):
            net(x)


@pytest.mark.parametrize("optimizer", [
    lambda p: torch.optim.Adam(p, lr=0.1, fused=True), lambda p: torch.optim.SGD(p, lr=0.1, fused=True),
    lambda p: torch.optim.AdamW(p, lr=0.1)], ids=["adam-fused", "sgd-fused", "adamw"])
def test_an_optimizer_step_is_refused_until_frozen_again(optimizer):
    """torch's fused optimizers update in place without counting a version: freeze() watches the
    optimizer steps too; a parameter without a gradient is skipped by the step and stays frozen."""
    net, other = layer(torch.float32, None, n_in=64, n_out=64).freeze(), torch.nn.Linear(3, 3)
    x = torch.randn(8, 64)
    opt = optimizer([*net.parameters(), *other.parameters()])
    other(torch.randn(2, 3)).sum().backward()
    opt.step()                                      # net's parameters have no gradient: not stepped
    with torch.no_grad():
        net(x)
    F.linear(x, net.weight, net.bias).pow(2).mean().backward()
    opt.step()
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"weight changed after freeze\(\) \(.*optimizer step.*call layer.freeze"):
            net(x)
        torch.testing.assert_close(net.freeze()(x), F.linear(x, net.weight, net.bias), **TOL[torch.float32])


@pytest.mark.filterwarnings("error:There is a performance drop")    # torch's batching fallback: not taken
def test_functional_call_and_ensembles_run_the_given_weights(packed_calls):
    """torch.func.functional_call substitutes plain tensors for the parameters: they run as given
    (the packing is of the layer's own weight), also under vmap (model ensembling)."""
    net, x = layer(torch.float32, "relu").freeze(), torch.randn(4, 40)
    params = {"weight": torch.randn(70, 40), "bias": torch.randn(70)}
    stacked = {"weight": torch.randn(3, 70, 40), "bias": torch.randn(3, 70)}
    with torch.no_grad():
        y = torch.func.functional_call(net, params, (x,))
        ys = torch.func.vmap(lambda p: torch.func.functional_call(net, p, (x,)))(stacked)
    torch.testing.assert_close(y, torch.relu(F.linear(x, params["weight"], params["bias"])), **TOL[torch.float32])
    for i in range(3):
        torch.testing.assert_close(ys[i], torch.relu(F.linear(x, stacked["weight"][i], stacked["bias"][i])),
                                   **TOL[torch.float32])
    assert True not in packed_calls


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")     # torch's export imports use it
@pytest.mark.parametrize("mode", ["export", "compile"])
def test_a_frozen_layer_exports_and_compiles_whole(mode):
    """export and compile(fullgraph=True) take the operator (the frozen path read the weight's
    version and address first, which neither can)."""
    net, x = layer(torch.float32, "gelu").freeze(), torch.randn(5, 40)
    with torch.no_grad():
        run = torch.export.export(net, (x,)).module() if mode == "export" else torch.compile(net, fullgraph=True)
        y = run(x)
    torch.testing.assert_close(y, F.gelu(F.linear(x, net.weight, net.bias), approximate="tanh"), **TOL[torch.float32])


def square_view(w, how):
    """Another tensor over the memory of square weight ``w``, as one of these makes it."""
    return {"transposed": lambda: w.t(), "as_strided": lambda: w.as_strided(w.shape, (0, 1)),
            "negative bit": lambda: torch._neg_view(w)}[how]()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("how", ["transposed", "as_strided", "negative bit"])
def test_other_strides_or_sign_under_the_packed_weight_are_refused(dtype, how):
    """``weight.data = view`` keeps the Parameter, its version, and (a square weight) its address
    and shape: the strides and the negative bit tell the view."""
    net, x = layer(dtype, None, n_in=16, n_out=16).freeze(), torch.randn(3, 16).to(dtype)
    with torch.no_grad():
        net(x)
        net.weight.data = square_view(net.weight.data, how)
        with pytest.raises(ValueError, match=r"weight changed after freeze\(\)"):
            net(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("how", ["new parameter", "transposed", "as_strided", "assign", "functional_call"])
def test_another_weight_tensor_runs_unpacked(packed_calls, dtype, how):
    """A weight that is not the Parameter freeze() packed (a new Parameter, perhaps a view of the
    packed memory, one load_state_dict(assign=True) or functional_call puts in) runs as given."""
    net, x = layer(dtype, "relu", n_in=16, n_out=16).freeze(), torch.randn(3, 16).to(dtype)
    with torch.no_grad():
        net(x)
        w = net.weight.detach()
        w = w * 2 if how == "new parameter" else square_view(w, "transposed" if how in ("assign", "functional_call")
                                                             else how)
        if how == "assign":
            net.load_state_dict({"weight": w, "bias": net.bias.detach()}, assign=True)
        elif how != "functional_call":
            net.weight = torch.nn.Parameter(w)
        params = {"weight": torch.nn.Parameter(w)} if how == "functional_call" else {}
        y = torch.func.functional_call(net, params, (x,))
        ref = torch.relu(F.linear(x.double(), w.double(), net.bias.double()))
    assert packed_calls == [True, False]
    torch.testing.assert_close(y.double(), ref, **TOL[dtype])


def test_functional_call_runs_another_models_parameters(packed_calls):
    """torch.func.functional_call(layer, dict(other.named_parameters()), x) under no_grad: the
    Parameters given run as given, and the layer keeps its packing."""
    net, other, x = layer(torch.float32, None).freeze(), torch.nn.Linear(40, 70), torch.randn(3, 40)
    with torch.no_grad():
        y = torch.func.functional_call(net, dict(other.named_parameters()), (x,))
        mine = net(x)
        torch.testing.assert_close(y, other(x), **TOL[torch.float32])
        torch.testing.assert_close(mine, F.linear(x, net.weight, net.bias), **TOL[torch.float32])
    assert packed_calls == [False, True]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("fused", [False, True], ids=["adam", "adam-fused"])
def test_a_step_over_the_bias_alone_keeps_the_packing(packed_calls, dtype, fused):
    """Bias-only training (BitFit) leaves the packed weight valid; the bias kept for fc (a float32
    copy of a bfloat16 bias, which a fused step changes without a version) is made again."""
    net, x = layer(dtype, "relu", n_in=16, n_out=16).freeze(), torch.randn(4, 16).to(dtype)
    net.weight.requires_grad_(False)
    opt = torch.optim.Adam([net.bias], lr=0.5, fused=fused)
    with torch.no_grad():
        net(x)                                      # the bias as fc takes it is kept here
    net(x).pow(2).sum().backward()
    opt.step()
    with torch.no_grad():
        y = net(x)
    ref = torch.relu(F.linear(x.double(), net.weight.double(), net.bias.detach().double()))
    assert packed_calls == [True, False, True]
    torch.testing.assert_close(y.double(), ref, **TOL[dtype])


def test_a_swapped_weight_is_refused_until_frozen_again():
    """torch.utils.swap_tensors (which .to() and load_state_dict use under
    torch.__future__.set_swap_module_params_on_conversion) refuses a tensor that has a weak
    reference: freeze() keeps none to the weight."""
    net, x = layer(torch.float32, None, n_in=16, n_out=16).freeze(), torch.randn(3, 16)
    with torch.no_grad():
        torch.utils.swap_tensors(net.weight, torch.nn.Parameter(net.weight.detach() * 2))
        with pytest.raises(ValueError, match=r"weight changed after freeze\(\)"):
            net(x)
        torch.testing.assert_close(net.freeze()(x), F.linear(x, net.weight, net.bias), **TOL[torch.float32])


def test_a_layer_lets_go_of_a_packing_whose_weight_was_replaced_for_good(packed_calls):
    """The packed Parameter is kept (a new one can then never pass for it); once only the packing
    holds it, the next call drops both, and the replaced layer runs unpacked."""
    import gc
    import weakref
    net, x = layer(torch.float32, None).freeze(), torch.randn(3, 40)
    gone = weakref.ref(net.weight)
    net.weight = torch.nn.Parameter(torch.randn(70, 40))
    with torch.no_grad():
        y = net(x)
    gc.collect()
    assert net._frozen is None and gone() is None and packed_calls == [False]
    torch.testing.assert_close(y, F.linear(x, net.weight, net.bias), **TOL[torch.float32])
