"""``tppasm.torch.Linear``: ``torch.nn.Linear`` (same parameters, initialization and state dict)
whose forward and backward run tppasm kernels, with an activation fused.

>>> import torch
>>> plain = torch.nn.Linear(3, 2)
>>> fast = Linear(3, 2, act="relu"); _ = fast.load_state_dict(plain.state_dict())
>>> x = torch.randn(5, 3)
>>> bool(torch.allclose(fast(x), torch.relu(plain(x)), atol=1e-6))
True
"""
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from .. import fc
from .ops import ACTS, _bias_view, _check, _records_gradient, _refuse_dual, _run, _unwatched, _view, linear


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

    __jit_ignored_attributes__ = ["_frozen"]        # a scripted layer runs the operator (see forward)

    def __init__(self, in_features, out_features, bias=True, act=None, device=None, dtype=None):
        if act not in ACTS:
            raise ValueError(f"tppasm.torch.Linear: act={act!r}; expected one of {ACTS}")
        super().__init__(in_features, out_features, bias, device, dtype)
        self.act = act
        self._frozen = None

    def freeze(self):
        """Pack the weight once (:func:`tppasm.fc.pack`) for the calls that record no gradient
        (``torch.no_grad()``, ``torch.inference_mode()``, or nothing requires grad), which then
        skip packing it per call (one Zen 4 core, 64 to 256 rows: bf16 1.12-1.17x, fp32 1.04-1.09x;
        a few rows stream the weight as stored, as before). Training calls are
        unchanged. A later in-place update, new tensor or dtype of the weight, or an optimizer step
        over it (torch's fused optimizers count no versions, so the steps themselves are watched),
        is refused until ``freeze()`` runs again (or :meth:`unfreeze`); weights that
        ``torch.func.functional_call`` substitutes run as given, unpacked. Writes through
        ``weight.data`` or a NumPy view are not seen, so freeze again after them, nor are updates
        in place of parameters made under ``torch.inference_mode()``, which count no versions. A
        bfloat16 bias is read as a float32 copy made when it changes, so writes to it through
        ``bias.data`` are not seen either. Copies and pickles of the module come unfrozen. Returns
        the module.

        >>> layer, x = Linear(3, 2).freeze(), torch.ones(4, 3)
        >>> with torch.no_grad():
        ...     y = layer(x)
        ...     _ = layer.weight.mul_(2)
        ...     layer(x)
        Traceback (most recent call last):
        ValueError: tppasm.torch.Linear: the weight changed after freeze() (an in-place update, an optimizer step, a new tensor or dtype); call layer.freeze() again to pack it, or layer.unfreeze()
        >>> with torch.no_grad():
        ...     bool(torch.allclose(layer.freeze()(x), 2 * y - layer.bias))
        True
        """
        if not isinstance(self._parameters.get("weight"), torch.nn.Parameter):
            raise ValueError("tppasm.torch.Linear.freeze: the weight is computed anew at each access (a "
                             "parametrization such as weight_norm, or pruning), so its packing could never be used; "
                             "remove that first (torch.nn.utils.parametrize.remove_parametrizations(layer, 'weight') "
                             "or torch.nn.utils.prune.remove(layer, 'weight')), or do not freeze the layer")
        w = self.weight.detach()
        if w.dtype not in (torch.float32, torch.bfloat16) or not w.is_cpu or w.layout != torch.strided:
            raise ValueError(f"tppasm.torch.Linear.freeze: the weight is a {w.layout} {w.dtype} tensor on {w.device}; "
                             "freeze takes a dense float32 or bfloat16 CPU weight: call layer.float() or "
                             "layer.bfloat16() (and .cpu()) first")
        self._frozen = _Frozen(fc.pack(_view(w, "weight")), self._state(self.weight))
        _watch_optimizer_steps(self)
        return self

    def unfreeze(self):
        """Drop the packed weight of :meth:`freeze`; returns the module."""
        self._frozen = None
        return self

    def __getstate__(self):
        state = dict(super().__getstate__())
        state["_frozen"] = None          # a copy's weight is another tensor: its packing would be refused
        return state

    @staticmethod
    def _state(p):
        """What freeze() checks of a parameter: an inference tensor (made under
        ``torch.inference_mode()``) counts no versions, so its updates in place are not seen."""
        return (None if p.is_inference() else p._version), p.data_ptr(), p.dtype, p.shape

    def forward(self, x):
        if torch.jit.is_scripting():        # TorchScript (deprecated by torch): the operator, never the packing
            return torch.ops.tppasm.linear(x, self.weight, self.bias, self.act)[0]
        return self._forward(x)

    @torch.jit.unused
    def _forward(self, x):
        frozen, w, b = self._frozen, self.weight, self.bias
        # the packing serves eager calls that record no gradient (compilation, export and transforms
        # take the operator), with a weight that is a Parameter (functional_call's are plain tensors)
        if frozen is not None and type(w) is torch.nn.Parameter and _unwatched(x, w, b) and not _records_gradient(
                x, w, b):
            _refuse_dual(x, w, b)
            if frozen.stepped or self._state(w) != frozen.weight_state:
                raise ValueError("tppasm.torch.Linear: the weight changed after freeze() (an in-place update, an "
                                 "optimizer step, a new tensor or dtype); call layer.freeze() again to pack it, or "
                                 "layer.unfreeze()")
            if x.dtype is not w.dtype or x.layout is not torch.strided or x.dim() < 1 or x.shape[-1] != w.shape[1]:
                _check(x, w, b, self.act)           # the error naming the fix
            return _run(x, frozen.packed, w.shape[0], self._frozen_bias(x, b, frozen), self.act, pre=False)[0]
        return linear(x, w, b, self.act)

    def _frozen_bias(self, x, b, frozen):
        """The bias as fc takes it (a float32 NumPy array), checked and made again only for another
        tensor or after an update in place (for a bfloat16 bias, its float32 copy)."""
        if b is None:
            return None
        state = self._state(b), b.stride()
        if frozen.bias_state != state:
            _check(x, self.weight, b, self.act)
            frozen.bias, frozen.bias_state = _bias_view(b), state
        return frozen.bias

    def extra_repr(self):
        return f"{super().extra_repr()}, act={self.act!r}"


class _Frozen:
    """What :meth:`Linear.freeze` keeps: the packed weight and the weight's state when packed, the
    bias as fc takes it with the bias's state when that was made (None before the first call), and
    whether an optimizer stepped the weight or bias since (:func:`_after_optimizer_step`)."""

    __slots__ = ("packed", "weight_state", "bias", "bias_state", "stepped")

    def __init__(self, packed, weight_state):
        self.packed, self.weight_state, self.bias, self.bias_state = packed, weight_state, None, None
        self.stepped = False


_FROZEN_LAYERS = weakref.WeakSet()           # the layers freeze() packed, for _after_optimizer_step
_step_hook = []                              # its handle, once registered


def _watch_optimizer_steps(layer):
    """Have :func:`_after_optimizer_step` watch ``layer`` (the hook is registered on the first freeze)."""
    _FROZEN_LAYERS.add(layer)
    if not _step_hook:
        _step_hook.append(register_optimizer_step_post_hook(_after_optimizer_step))


def _after_optimizer_step(optimizer, args, kwargs):
    """Mark the frozen layers whose weight or bias ``optimizer`` just stepped (one with a gradient:
    optimizers skip the others): torch's fused optimizers (``fused=True``) update parameters in
    place without counting a version, which :meth:`Linear._state` would have seen."""
    if not _FROZEN_LAYERS:
        return
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"] if p.grad is not None}
    for layer in list(_FROZEN_LAYERS):
        if layer._frozen is not None and any(id(p) in stepped for p in (layer.weight, layer.bias) if p is not None):
            layer._frozen.stepped = True
