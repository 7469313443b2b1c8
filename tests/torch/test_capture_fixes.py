"""tppasm.torch under torch's program transforms, as torch's linear behaves: functionalize runs the
operator, an empty vmap batch of meta tensors stays on meta, and refusals give advice that applies
(a module's dtype, a tensor subclass that holds no values)."""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.func import functionalize, vmap

import tppasm.torch as tt
from tppasm.operand import OperandError


def test_functionalize_takes_linear_and_the_module():
    torch.manual_seed(0)
    x, w, b = torch.randn(4, 6), torch.randn(5, 6), torch.randn(5)
    layer = tt.Linear(6, 5, act="relu")
    torch.testing.assert_close(functionalize(lambda x: tt.linear(x, w, b, "relu").add_(1))(x),
                               F.linear(x, w, b).relu() + 1)
    torch.testing.assert_close(functionalize(layer)(x), F.linear(x, layer.weight, layer.bias).relu())


def test_an_empty_vmap_batch_of_meta_tensors_stays_on_meta():
    x, ws = torch.empty(4, 6, device="meta"), torch.empty(0, 5, 6, device="meta")
    y = vmap(lambda w: tt.linear(x, w))(ws)
    assert y.device.type == "meta" and tuple(y.shape) == (0, 4, 5)


def test_a_layer_of_another_dtype_is_told_to_convert_x_or_the_layer():
    with pytest.raises(TypeError, match=r"x\.bfloat16\(\).*\.float\(\) / \.bfloat16\(\)"):
        tt.Linear(6, 5).bfloat16()(torch.randn(4, 6))


def test_a_fake_weight_is_said_to_hold_no_values():
    with FakeTensorMode():
        layer = tt.Linear(6, 5)
        with pytest.raises(OperandError, match="FakeTensor .*holds no memory"):
            layer.freeze()
