"""``tppasm.torch.Linear``: ``torch.nn.Linear`` (same parameters, initialization and state dict)
whose forward and backward run tppasm kernels, with an activation fused.

>>> import torch
>>> plain = torch.nn.Linear(3, 2)
>>> fast = Linear(3, 2, act="relu"); _ = fast.load_state_dict(plain.state_dict())
>>> x = torch.randn(5, 3)
>>> bool(torch.allclose(fast(x), torch.relu(plain(x)), atol=1e-6))
True
"""
import torch

from .ops import ACTS, linear


class Linear(torch.nn.Linear):
    """``y = act(x @ weight.T + bias)`` for x (..., in_features); ``act`` in :data:`ACTS`
    (None, "relu", "gelu" = tanh form, "gelu_erf", "gelu_erf_fast" = erf to 2^-22 absolute); float32
    or bfloat16 (``dtype=`` or ``.to()``).
    Under ``torch.autocast("cpu")`` and torch.func transforms it behaves as :func:`linear` says
    (as ``torch.nn.Linear`` under autocast: bfloat16 out, float32 gradients to float32 parameters).

    >>> layer = Linear(4, 8, act="gelu", dtype=torch.bfloat16)
    >>> layer.extra_repr()
    "in_features=4, out_features=8, bias=True, act='gelu'"
    >>> layer(torch.ones(2, 4, dtype=torch.bfloat16)).dtype == torch.bfloat16
    True
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     y = Linear(4, 8)(torch.ones(2, 4))
    >>> y.dtype
    torch.bfloat16
    """

    def __init__(self, in_features, out_features, bias=True, act=None, device=None, dtype=None):
        if act not in ACTS:
            raise ValueError(f"tppasm.torch.Linear: act={act!r}; expected one of {ACTS}")
        super().__init__(in_features, out_features, bias, device, dtype)
        self.act = act

    def forward(self, x):
        return linear(x, self.weight, self.bias, self.act)

    def extra_repr(self):
        return f"{super().extra_repr()}, act={self.act!r}"
