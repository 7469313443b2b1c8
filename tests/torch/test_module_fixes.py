"""tppasm.torch.Linear and linear where torch.nn.Linear's habits meet them: parameters still on
meta, a layer in a dtype the kernels do not take, torch.nn.Linear's positional device, and what
the documentation says of writes torch counts no version for and of tools that fold a weight."""
import pathlib

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e .[test] pins torch==2.13.0)")

import tppasm.torch as tt  # noqa: E402

F = torch.nn.functional
META_FIX = r"a meta tensor holds no values.*layer.to_empty\(device='cpu'\), then layer.load_state_dict"
README = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("call, message", [
    (lambda: tt.Linear(8, 4, device="meta")(torch.randn(3, 8)), "weight is a tensor on meta and x on cpu"),
    (lambda: tt.Linear(8, 4, act="gelu", device="meta")(torch.randn(3, 8)), "weight is a tensor on meta and x on cpu"),
    (lambda: tt.linear(torch.randn(3, 8), torch.ones(4, 8), torch.empty(4, device="meta")),
     "bias is a tensor on meta and x on cpu"),
    (lambda: tt.Linear(8, 4)(torch.randn(3, 8, device="meta")), "weight is a tensor on cpu and x on meta"),
    (lambda: torch.ops.tppasm.linear(torch.randn(3, 8), torch.empty(4, 8, device="meta"), None, None),
     "weight is a tensor on meta and x on cpu"),
], ids=["layer", "layer-gelu", "bias", "x", "operator"])
def test_meta_operands_among_cpu_ones_are_refused(call, message, grad):
    """The dispatcher takes a call with a meta operand to the fake kernel, whose output holds no
    values: refused, naming how a layer built on meta gets its values."""
    with torch.set_grad_enabled(grad), pytest.raises(ValueError, match=f"{message}; {META_FIX}"):
        call()


def test_all_meta_calls_give_shapes_and_a_layer_built_on_meta_runs_once_given_values():
    net = tt.Linear(8, 4, act="relu", device="meta")
    y = net(torch.empty(2, 5, 8, device="meta"))
    assert y.device.type == "meta" and y.shape == (2, 5, 4)
    assert tt.linear(torch.empty(3, 8, device="meta"), torch.empty(4, 8, device="meta")).shape == (3, 4)
    net.to_empty(device="cpu")
    net.reset_parameters()
    x = torch.randn(3, 8)
    torch.testing.assert_close(net.freeze()(x), torch.relu(F.linear(x, net.weight, net.bias)))


@pytest.mark.parametrize("convert", ["half", "double"])
@pytest.mark.parametrize("x_dtype", ["same", "float32"])
def test_a_layer_in_another_dtype_is_told_to_convert_itself(convert, x_dtype):
    net = getattr(tt.Linear(8, 4), convert)()
    x = torch.randn(2, 8).to(net.weight.dtype if x_dtype == "same" else torch.float32)
    with pytest.raises(TypeError, match=rf"layer's weight is {net.weight.dtype}; .*call layer.float\(\) or "
                                        r"layer.bfloat16\(\)"):
        net(x)


def test_a_layer_with_a_float64_bias_is_told_to_convert_itself():
    net = tt.Linear(8, 4)
    net.bias = torch.nn.Parameter(net.bias.detach().double())
    with pytest.raises(TypeError, match=r"layer's bias is torch.float64; .*call layer.float\(\)"):
        net(torch.randn(2, 8))


def test_a_layer_without_a_weight_tensor_gets_linears_error():
    net = tt.Linear(8, 4)
    net.weight = None
    with pytest.raises(TypeError, match="weight is a NoneType; expected a torch.Tensor"):
        net(torch.randn(2, 8))


def test_a_float16_x_on_a_float32_layer_is_told_to_convert_x():
    with pytest.raises(TypeError, match=r"x is torch.float16; .*pass x.float\(\)"):
        tt.Linear(8, 4)(torch.randn(2, 8).half())


@pytest.mark.parametrize("act", ["cpu", torch.device("cpu"), torch.float32])
def test_torch_linears_positional_device_is_explained(act):
    with pytest.raises(ValueError, match=r"expected one of .*act is tppasm.torch.Linear's 4th argument, where "
                                         r"torch.nn.Linear takes device: pass device= and dtype= by keyword"):
        tt.Linear(8, 4, True, act)


def test_an_unknown_act_name_gets_no_device_note():
    with pytest.raises(ValueError, match=r"act='swish'; expected one of \(None, .*\)$"):
        tt.Linear(8, 4, act="swish")


@pytest.mark.parametrize("text", [tt.Linear.freeze.__doc__, README], ids=["freeze", "README"])
def test_writes_torch_counts_no_version_for_are_documented(text):
    """Collectives and fused functional optimizer steps write parameters without a version: a
    frozen layer cannot see them, so the documentation says to freeze again after them."""
    text = " ".join(text.split())
    assert "dist.broadcast" in text and "all_reduce" in text and "torch.optim.adam.adam(..., fused=True)" in text


def test_the_readme_says_tools_that_fold_a_linear_ignore_act():
    assert "fuse_linear_bn_eval" in README and "ignore `act`" in " ".join(README.split())
