"""``tppasm.torch.Linear``: ``torch.nn.Linear`` (same parameters, initialization and state dict)
whose forward and backward run tppasm kernels, with an activation fused.

>>> import torch
>>> plain = torch.nn.Linear(3, 2)
>>> fast = Linear(3, 2, act="relu"); _ = fast.load_state_dict(plain.state_dict())
>>> x = torch.randn(5, 3)
>>> bool(torch.allclose(fast(x), torch.relu(plain(x)), atol=1e-6))
True
"""
import sys
import weakref

import torch
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm
from torch.optim.optimizer import register_optimizer_step_post_hook

from .. import fc
from ..dtypes import name_of
from .ops import (ACTS, _bias_view, _broadcast_bias, _check, _records_gradient, _refuse_dual, _run, _unwatched,
                  _view, linear)


class Linear(torch.nn.Linear):
    """``y = act(x @ weight.T + bias)`` for x (..., in_features); ``act`` in :data:`ACTS`
    (None, "relu", "gelu" = tanh form, "gelu_erf", "gelu_erf_fast" = erf to 2^-22 absolute); float32
    or bfloat16 (``dtype=``, which also takes tppasm's "f32" and "bf16", or ``.to()``).
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
            raise ValueError(f"tppasm.torch.Linear: act={act!r}; expected one of {ACTS}{_positional_device(act)}")
        super().__init__(in_features, out_features, bias, device, _torch_dtype(dtype))
        self.act = act
        self._frozen = None

    def freeze(self):
        """Pack the weight once (:func:`tppasm.fc.pack`) for the calls that record no gradient
        (``torch.no_grad()``, ``torch.inference_mode()``, or nothing requires grad), which then
        skip packing it per call (one Zen 4 core, 64 to 256 rows: bf16 1.12-1.17x, fp32 1.04-1.09x;
        a few rows stream the weight as stored, as before). Training calls are unchanged. A later
        in-place update of the weight, new data, strides or dtype under it, or an optimizer step over it
        (torch's fused optimizers count no versions, so the steps themselves are watched; a step over
        the bias alone is fine), is refused until ``freeze()`` runs again (or :meth:`unfreeze`); a
        weight that is another tensor than the one packed (one ``torch.func.functional_call``
        substitutes, a new Parameter, ``load_state_dict(..., assign=True)``) runs as given, unpacked,
        until ``freeze()`` packs it (once nothing else holds the Parameter packed, the next call drops
        its packing, as :meth:`unfreeze`). Writes torch counts no version for are not seen, so freeze
        again after them: through ``weight.data`` or a NumPy view, by torch.distributed collectives
        (``dist.broadcast``, ``all_reduce``), by fused optimizer kernels called without an ``Optimizer``
        (``torch.optim.adam.adam(..., fused=True)``, torch.distributed's functional optimizers), and
        updates in place of parameters made under ``torch.inference_mode()``. A bfloat16 bias is read as
        a float32 copy made when it changes, so writes to it through ``bias.data`` are not seen either.
        Copies and pickles of the module come unfrozen. Returns the module.

        >>> layer, x = Linear(3, 2).freeze(), torch.ones(4, 3)
        >>> with torch.no_grad():
        ...     y = layer(x)
        ...     _ = layer.weight.mul_(2)
        ...     layer(x)
        Traceback (most recent call last):
        ValueError: tppasm.torch.Linear: the weight changed after freeze() (an in-place update, an optimizer step, new data, strides or dtype); call layer.freeze() again to pack it, or layer.unfreeze()
        >>> with torch.no_grad():
        ...     bool(torch.allclose(layer.freeze()(x), 2 * y - layer.bias))
        True
        """
        if not isinstance(self._parameters.get("weight"), torch.nn.Parameter):
            raise ValueError("tppasm.torch.Linear.freeze: the weight is computed anew at each access (a "
                             "parametrization such as weight_norm, or pruning), so its packing could never be used; "
                             f"remove that first ({self._remover()}), or do not freeze the layer")
        w = self.weight.detach()
        if w.is_meta:
            raise ValueError("tppasm.torch.Linear.freeze: the weight is on meta (it holds no values); give the layer "
                             "its values first: layer.to_empty(device='cpu'), then layer.load_state_dict(...) or "
                             "layer.reset_parameters()")
        if w.dtype not in (torch.float32, torch.bfloat16) or not w.is_cpu or w.layout != torch.strided:
            raise ValueError(f"tppasm.torch.Linear.freeze: the weight is a {w.layout} {w.dtype} tensor on {w.device}; "
                             "freeze takes a dense float32 or bfloat16 CPU weight: call layer.float() or "
                             "layer.bfloat16() (and .cpu()) first")
        self._frozen = _Frozen(fc.pack(_view(w, "weight")), self.weight, self._state(self.weight))
        _watch_optimizer_steps(self)
        return self

    def _remover(self):
        """The call that removes what computes the weight at each access (freeze's error)."""
        for hook in self._forward_pre_hooks.values():        # torch.nn.utils' older hook API
            if isinstance(hook, (WeightNorm, SpectralNorm)):
                remove = "remove_weight_norm" if isinstance(hook, WeightNorm) else "remove_spectral_norm"
                return f"torch.nn.utils.{remove}(layer)"
        return ("torch.nn.utils.parametrize.remove_parametrizations(layer, 'weight') or "
                "torch.nn.utils.prune.remove(layer, 'weight')")

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
        """What freeze() checks of a parameter (``p.data = view`` keeps the version and may keep
        the address and shape); an inference tensor (made under ``torch.inference_mode()``)
        counts no versions, so its updates in place are not seen."""
        return (None if p.is_inference() else p._version), p.data_ptr(), p.dtype, p.shape, p.stride(), p.is_neg()

    def forward(self, x):
        if torch.jit.is_scripting():        # TorchScript (deprecated by torch): the operator, never the packing
            return torch.ops.tppasm.linear(x, self.weight, self.bias, self.act)[0]
        return self._forward(x)

    @torch.jit.unused
    def _forward(self, x):
        frozen, w, b = self._frozen, self.weight, self.bias
        # the packing serves eager calls that record no gradient (compilation, export and transforms
        # take the operator), with the weight it packed (not functional_call's, nor a new Parameter)
        if frozen is not None and w is frozen.weight and _unwatched(x, w, b) and not _records_gradient(x, w, b):
            _refuse_dual(x, w, b)
            if frozen.stepped or self._state(w) != frozen.weight_state:
                raise ValueError("tppasm.torch.Linear: the weight changed after freeze() (an in-place update, an "
                                 "optimizer step, new data, strides or dtype); call layer.freeze() again to pack it, "
                                 "or layer.unfreeze()")
            if x.dtype is not w.dtype or x.layout is not torch.strided or x.dim() < 1 or x.shape[-1] != w.shape[1]:
                _check(x, w, b, self.act)           # the error naming the fix
            return _run(x, frozen.packed, w.shape[0], self._frozen_bias(x, b, frozen), self.act, pre=False)[0]
        if frozen is not None and w is not frozen.weight and not torch.compiler.is_compiling() and sys.getrefcount(
                frozen.weight) <= 2:
            self._frozen = None         # only the packing holds the Parameter it packed: replaced for good
        try:
            return linear(x, w, b, self.act)
        except TypeError:
            _refuse_layer_dtype(w, b)               # the layer's fix, not the tensor's
            raise

    def _frozen_bias(self, x, b, frozen):
        """The bias as fc takes it (a float32 NumPy array), checked and made again only for another
        tensor or after an update in place (for a bfloat16 bias, its float32 copy)."""
        if b is None:
            return None
        state = self._state(b)
        if frozen.bias_state != state:
            b = _broadcast_bias(b, self.weight)         # one value (a 0-d bias), as linear takes it unfrozen
            _check(x, self.weight, b, self.act)
            frozen.bias, frozen.bias_state = _bias_view(b), state
        return frozen.bias

    def extra_repr(self):
        return f"{super().extra_repr()}, act={self.act!r}"


def _positional_device(act):
    """For an ``act`` that is a device or dtype (torch.nn.Linear's 4th argument is ``device``), the
    note saying so; else ""."""
    if isinstance(act, str):
        try:
            torch.device(act)
        except RuntimeError:
            return ""
    elif not isinstance(act, (torch.device, torch.dtype)):
        return ""
    return ("; act is tppasm.torch.Linear's 4th argument, where torch.nn.Linear takes device: pass device= and dtype= "
            "by keyword")


_TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def _torch_dtype(dtype):
    """``dtype`` as torch.nn.Linear takes it: None or a torch.dtype as given, tppasm's and NumPy's
    spellings of the dtypes tppasm kernels compute in as theirs; anything else a TypeError saying so.

    >>> _torch_dtype("bf16"), _torch_dtype("float32")
    (torch.bfloat16, torch.float32)
    """
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    try:
        name = name_of(dtype)
    except (TypeError, ValueError):
        name = None
    if name not in _TORCH_DTYPES:
        raise TypeError(f"tppasm.torch.Linear: dtype={dtype!r}; expected torch.float32 or torch.bfloat16 (or "
                        "tppasm's 'f32' or 'bf16'), the dtypes tppasm kernels compute in")
    return _TORCH_DTYPES[name]


def _refuse_layer_dtype(weight, bias):
    """Refuse a layer whose weight or bias is in a dtype the kernels do not take, naming the module's fix."""
    for name, t in (("weight", weight), ("bias", bias)):
        if isinstance(t, torch.Tensor) and t.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"tppasm.torch.Linear: the layer's {name} is {t.dtype}; tppasm kernels take torch.float32 "
                            "or torch.bfloat16: call layer.float() or layer.bfloat16(), and pass x in that dtype"
                            ) from None


class _Frozen:
    """What :meth:`Linear.freeze` keeps: the packed weight, the Parameter it packed and that
    Parameter's state then, the bias as fc takes it with the bias's state when that was made
    (None before the first call or after an optimizer stepped the bias), and whether an optimizer
    stepped the weight since (:func:`_after_optimizer_step`). The Parameter itself, so that no
    other takes its id while it is kept (not a weak reference, which ``torch.utils.swap_tensors``
    refuses): a layer that finds its weight replaced lets it go (:meth:`Linear._forward`)."""

    __slots__ = ("packed", "weight", "weight_state", "bias", "bias_state", "stepped")

    def __init__(self, packed, weight, weight_state):
        self.packed, self.weight, self.weight_state = packed, weight, weight_state
        self.bias, self.bias_state, self.stepped = None, None, False


_FROZEN_LAYERS = weakref.WeakSet()           # the layers freeze() packed, for _after_optimizer_step
_step_hook = []                              # its handle, once registered


def _watch_optimizer_steps(layer):
    """Have :func:`_after_optimizer_step` watch ``layer`` (the hook is registered on the first freeze)."""
    _FROZEN_LAYERS.add(layer)
    if not _step_hook:
        _step_hook.append(register_optimizer_step_post_hook(_after_optimizer_step))


def _after_optimizer_step(optimizer, args, kwargs):
    """Mark the frozen layers whose packed weight ``optimizer`` just stepped (one with a gradient:
    optimizers skip the others), and drop the bias kept of those whose bias it stepped (a bfloat16
    bias is kept as a float32 copy): torch's fused optimizers (``fused=True``) update parameters in
    place without counting a version, which :meth:`Linear._state` would have seen."""
    if not _FROZEN_LAYERS:
        return
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"] if p.grad is not None}
    for layer in list(_FROZEN_LAYERS):
        frozen = layer._frozen
        if frozen is None:
            continue
        bias = layer._parameters.get("bias")
        if id(frozen.weight) in stepped:
            frozen.stepped = True
        elif bias is not None and id(bias) in stepped:
            frozen.bias_state = None
