"""The torch operators ``tppasm::linear`` and ``tppasm::linear_backward`` (registered with
``torch.library``): real kernels run :mod:`tppasm.fc` on zero-copy NumPy views of the tensors,
fake kernels give shapes to ``torch.compile``, ``linear``'s autograd formula calls
``linear_backward``, and an AutocastCPU kernel runs ``linear`` under ``torch.autocast("cpu")`` as
torch runs its own (:func:`_autocast`).

>>> import torch
>>> x = torch.tensor([[1.0, -2.0]]); w = torch.eye(2)
>>> linear(x, w, act="relu").tolist()
[[1.0, 0.0]]
>>> y, z = torch.ops.tppasm.linear(x, w, None, None); list(z.shape)         # z: only for the gelus
[0]
"""
import functools
import math
from typing import Optional

import numpy as np
import torch
import torch.autograd.forward_ad as _forward_ad
from torch import Tensor
from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters as _interpreters

from .. import fc
from ..layout import empty
from ..operand import as_ndarray, tensor_numpy

ACTS = fc.ACTS
_GELUS = fc.GELUS
_DTYPES = (torch.float32, torch.bfloat16)
_PLAIN = (Tensor, torch.nn.Parameter)    # a Parameter has no __torch_function__ of its own; other subclasses may
# a tensor of torch's old vmap (grad(..., is_grads_batched=True), jacobian(vectorize=True)), which no transform check sees
_legacy_batched = torch._C._functorch.is_legacy_batchedtensor
_VMAP = torch._C._functorch.TransformType.Vmap
_OPERATOR_TRANSFORMS = (_VMAP, torch._C._functorch.TransformType.Functionalize)


def linear(x, weight, bias=None, act=None):
    """``act(x @ weight.T + bias)`` on tppasm kernels, differentiable in x, weight and bias.

    ``x`` is (..., in_features) and ``weight`` (out_features, in_features), both float32 or both
    bfloat16 on the CPU; ``bias`` is (out_features,) in x's dtype or float32 (as
    :func:`tppasm.fc.forward` takes it), one value (a 0-d tensor, broadcast as torch's linear does),
    or None; ``act`` is one of :data:`ACTS` ("gelu" is
    torch's ``approximate="tanh"``, "gelu_erf" its default, "gelu_erf_fast" the same to an absolute
    error of 2^-22 max(1, |z|), the class of torch's own, in 21 instructions a vector against ~55).
    Large GEMMs are shared by rows among ``torch.get_num_threads()`` threads
    (:class:`tppasm.fc.RowGemm`). Where nothing records a gradient (plain inference), a gelu runs
    fused into the GEMM's epilogue. bfloat16 products accumulate in float32; denormal bfloat16
    inputs and products may count as zero (the bf16 dot instructions flush them; torch keeps them).

    >>> import torch
    >>> x = torch.ones(2, 3, requires_grad=True)
    >>> y = linear(x, torch.ones(4, 3), torch.zeros(4), act="gelu_erf"); y.sum().backward()
    >>> list(y.shape), list(x.grad.shape)
    ([2, 4], [2, 3])

    Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` it casts x, weight and bias to bfloat16
    and returns bfloat16, as torch's linear does (gradients reach float32 tensors in float32);
    under ``dtype=torch.float16`` (tppasm has no float16 kernels) it computes in float32 and
    returns float16, torch's dtype there. ``torch.func.grad``, ``vjp``, ``jacrev`` and ``vmap``
    take it (a vmap over x alone is one call, the batch as more rows: :func:`_linear_vmap`);
    forward mode (``jvp``, ``jacfwd``, ``hessian``) and second derivatives are refused. Under those
    transforms call this function (or :class:`Linear`), not ``torch.ops.tppasm.linear``, which
    torch cannot differentiate there (pytorch issue 168393). ``torch.compile`` with the "aot_eager"
    or "inductor" backend takes ``torch.func.grad`` over it, and ``grad`` over a compiled function;
    with the "eager" backend torch fails inside dynamo there (pytorch issue 170834).
    ``torch.func.functionalize`` runs the operator itself.

    >>> w = torch.ones(4, 3, requires_grad=True)
    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     y = linear(x, w)
    >>> y.dtype, torch.autograd.grad(y.sum(), w)[0].dtype
    (torch.bfloat16, torch.float32)
    >>> torch.func.grad(lambda w: linear(x, w).sum())(w)[0].tolist()
    [2.0, 2.0, 2.0]
    """
    if act is not None and not isinstance(act, str):
        raise TypeError(f"tppasm.torch.linear: act={act!r} ({type(act).__name__}); expected one of {ACTS}")
    if type(x) not in _PLAIN or type(weight) not in _PLAIN or bias is not None and type(bias) not in _PLAIN:
        _refuse_non_tensors(x, weight, bias)
        if any(isinstance(t, torch.fx.Proxy) for t in (x, weight, bias)):     # torch.fx.symbolic_trace: a node
            if act not in ACTS:
                raise ValueError(f"tppasm.torch.linear: act={act!r}; expected one of {ACTS}")
            if isinstance(weight, Tensor) and isinstance(bias, Tensor):    # a constant bias, broadcast as in eager
                bias = _broadcast_bias(bias, weight)
            return torch.ops.tppasm.linear(x, weight, bias, act)[0]
    bias = _broadcast_bias(bias, weight)
    _refuse_dual(x, weight, bias)
    if _unwatched(x, weight, bias):
        if _records_gradient(x, weight, bias):
            return _Direct.apply(x, weight, bias, act)[0]
        return _forward(x, weight, bias, act, pre=False)[0]
    if not torch._C._are_functorch_transforms_active() or _only_vmap():
        return torch.ops.tppasm.linear(x, weight, bias, act)[0]     # (under vmap: its batching rule)
    # torch.func takes an autograd.Function (see _Transformable), which autocast does not reach into: cast here
    call = functools.partial(_autocast, _Linear.apply) if torch.is_autocast_enabled("cpu") else _Linear.apply
    return call(x, weight, bias, act)[0]


def _refuse_non_tensors(x, weight, bias):
    """The TypeError naming the fix for an operand that is not a tensor (the operator's schema would
    refuse it with a RuntimeError that does not say what to pass), the ValueError for a nested one
    (a jagged tensor would refuse the operator with a NotImplementedError naming only the operator)."""
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if isinstance(t, Tensor) and t.is_nested:
            raise ValueError(f"tppasm.torch.linear: {name} is a nested tensor; tppasm kernels take dense tensors"
                             + (": pass x.values() (the rows of a jagged x) and rewrap the result, e.g. torch.nested."
                                "nested_tensor_from_jagged(linear(x.values(), weight, bias), x.offsets())"
                                if name == "x" else f": pass a dense {name}"))
        if not isinstance(t, (Tensor, torch.fx.Proxy)) and (t is not None or name != "bias"):
            fix = f"torch.from_numpy({name})" if isinstance(t, np.ndarray) else f"torch.as_tensor({name})"
            raise TypeError(f"tppasm.torch.linear: {name} is a {type(t).__name__}; expected a torch.Tensor"
                            f"{' or None' if name == 'bias' else ''}: pass {fix}")


def _broadcast_bias(bias, weight):
    """A ``bias`` of one value (shape () or (1,)) expanded to weight's out_features, as torch's linear
    broadcasts it (differentiably: its gradient is the sum); any other bias as given.

    >>> _broadcast_bias(torch.tensor(0.5), torch.ones(3, 2)).tolist()
    [0.5, 0.5, 0.5]
    """
    if bias is not None and bias.dim() <= 1 and bias.numel() == 1 and weight.dim() == 2:
        return bias.expand(weight.shape[0])
    return bias


def _as_saved(t, shape, dtype):
    """Whether saved tensor ``t`` (None: not saved) still has the ``shape`` and ``dtype`` the forward
    saw (``t.data = ...`` may have replaced them: then the operator checks, and explains)."""
    return t is None or (t.dtype is dtype and t.shape == shape)


def _only_vmap():
    """Whether every active torch.func transform is a vmap or functionalize: the operator then takes
    it (its batching rule, functionalize's rule for an op that mutates nothing, and its own autograd
    below), without the autograd.Function that grad transforms need (~0.6 ms a call of torch's
    machinery at 64 x 16 x 256; functionalize has no rule for it)."""
    return all(i.key() in _OPERATOR_TRANSFORMS for i in _interpreters())


def _refuse_dual(*tensors):
    """Refuse a forward-mode dual tensor among ``tensors``: its tangent would be dropped without a word."""
    if _forward_ad._current_level >= 0 and any(
            t is not None and _forward_ad.unpack_dual(t).tangent is not None for t in tensors):
        _no_forward_mode(None)


def _records_gradient(*tensors):
    """Whether torch records a gradient of a call on ``tensors``: grad mode on, outside inference
    mode (which wins over ``torch.enable_grad()`` inside it), and one of them requiring grad."""
    return (torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
            and any(t is not None and t.requires_grad for t in tensors))


def _unwatched(*tensors):
    """Whether torch watches nothing of a call on ``tensors`` but their gradients: plain CPU tensors,
    no autocast, transform, tracing, compilation, profiler or Python mode (each of which needs the
    operators themselves). ``linear`` then runs the kernels directly (:class:`_Direct` where there
    is a gradient to record), skipping the dispatch of the Python custom ops: ~10 us a call, a third
    of a 1 x 16 -> 16 fp32 forward's, and ~40% of a forward + backward's."""
    if torch.compiler.is_compiling():          # first: what dynamo traces of this function folds away
        return False
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN or not t.is_cpu or _legacy_batched(t)):
            return False
    C = torch._C
    return not (torch.is_autocast_enabled("cpu") or C._are_functorch_transforms_active() or C._get_tracing_state()
                or C._len_torch_dispatch_stack() or C._len_torch_function_stack() or torch.autograd._profiler_enabled())


def _check(x, weight, bias, act, real=True, who="tppasm.torch.linear"):
    """Refuse what the kernels cannot take; ``real``: for the real kernel (fake kernels also see
    meta tensors, which take no device check)."""
    if act not in ACTS:
        raise ValueError(f"{who}: act={act!r}; expected one of {ACTS}")
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None:
            _check_tensor(who, name, t, x, real)
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"{who}: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not fit: "
                         "weight is (out_features, in_features) and x (..., in_features)")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"{who}: bias has shape {tuple(bias.shape)}; expected ({weight.shape[0]},), one value per "
                         f"output feature{_bias_fix(bias, weight.shape[0])}")


def _bias_fix(bias, m):
    """How to pass a ``bias`` of the wrong shape for ``m`` output features (:func:`_check`'s error)."""
    if bias.numel() == m:
        return f": pass bias.reshape({m})"
    if bias.numel() == 1:
        return f": pass bias.expand({m})" if bias.dim() <= 1 else f": pass bias.reshape(1).expand({m})"
    return " (a bias that is not one per output feature: add it to the result, linear(x, weight) + bias)"


def _check_tensor(who, name, t, x, real):
    """``t`` (named ``name``) a dense float32 or bfloat16 tensor in x's dtype (a bias: or float32),
    on the CPU if ``real``."""
    dt = t.dtype
    if dt is x.dtype and (dt is torch.float32 or dt is torch.bfloat16) and t.layout is torch.strided and (
            t.is_cpu or not real):
        return                                  # (the common case, first: a layer's call checks three)
    if t.layout != torch.strided:
        raise ValueError(f"{who}: {name} is a {t.layout} tensor; tppasm kernels take dense tensors: pass "
                         f"{name}.to_dense()")
    if real and not t.is_cpu:
        raise ValueError(f"{who}: {name} is a tensor on {t.device}; tppasm kernels run on the CPU: pass {name}.cpu()")
    if t.dtype not in _DTYPES:
        if t is x or x.dtype not in _DTYPES:
            fix = f"{name}.float() or {name}.bfloat16()"
        else:                                   # x's dtype (a bias: or float32)
            fix = f"{name}.float()" if x.dtype is torch.float32 else \
                f"{name}.bfloat16()" + (" or bias.float()" if name == "bias" else "")
        raise TypeError(f"{who}: {name} is {t.dtype}; tppasm kernels take torch.float32 or torch.bfloat16: pass {fix}")
    if name == "bias" and t.dtype is torch.bfloat16 and x.dtype is torch.float32:
        raise TypeError(f"{who}: bias is torch.bfloat16 and x {x.dtype}; a bias is in x's dtype or torch.float32: "
                        "pass bias.float()")
    if t.dtype != x.dtype and not (name == "bias" and t.dtype is torch.float32):
        other = "x.bfloat16()" if t.dtype is torch.bfloat16 else "x.float()"
        raise TypeError(f"{who}: {name} is {t.dtype} and x {x.dtype}; pass both in one dtype ({name}.to(x.dtype), "
                        f"or {other}; a tppasm.torch.Linear layer: convert x, or the layer with .float() / "
                        ".bfloat16())")


def _check_devices(who, x, **others):
    """Refuse operands on other devices than x in a fake kernel, which the dispatcher also takes
    for a meta operand among CPU ones: its empty output would be returned as the result."""
    for name, t in others.items():
        if t is not None and t.device != x.device:
            fix = ("a meta tensor holds no values: give it values on the CPU (a layer built on meta: "
                   "layer.to_empty(device='cpu'), then layer.load_state_dict(...) or layer.reset_parameters())"
                   if t.is_meta or x.is_meta else "tppasm kernels run on the CPU: pass all of them on the CPU (.cpu())")
            raise ValueError(f"{who}: {name} is a tensor on {t.device} and x on {x.device}; {fix}")


def _check_backward(dy, x, weight, saved, act, needs, real=True):
    """Refuse arguments of ``linear_backward`` that do not fit together (it is public as
    ``torch.ops.tppasm.linear_backward``, though autograd is its usual caller)."""
    who = "tppasm::linear_backward"
    _check(x, weight, None, act, real, who)
    if len(needs) != 3:
        raise ValueError(f"{who}: needs={needs!r}; expected 3 bools, whether dx, dweight and dbias are computed "
                         "(e.g. [True, True, True])")
    y_shape, z_shape = (*x.shape[:-1], weight.shape[0]), (math.prod(x.shape[:-1]), weight.shape[0])
    # saved is y (relu) or z (the gelus, 2-D); shapes may be symbolic (no sets)
    for name, t, shapes in (("dy", dy, (y_shape,)), ("saved", saved, (y_shape, z_shape)[:1 if x.dim() == 2 else 2])):
        if t is not None:
            _check_tensor(who, name, t, x, real)
            if tuple(t.shape) not in shapes:
                raise ValueError(f"{who}: {name} has shape {tuple(t.shape)}; expected {' or '.join(map(str, shapes))} "
                                 f"for x {tuple(x.shape)} and weight {tuple(weight.shape)}")
    if (saved is None) != (act is None):
        raise ValueError(f"{who}: saved is {'None' if saved is None else 'a tensor'} with act={act!r}; expected y for "
                         "relu, z (the operator's second output) for the gelus, None without an activation")


def _tensor(a):
    """A torch tensor on ``a``'s memory (a float32 or bfloat16 array fc allocated with
    :func:`tppasm.empty`): zero-copy, so the memory is :mod:`tppasm.buffers`' from 64 KiB on,
    which later calls reuse once the tensor is freed, and from 4 MiB on NumPy asks the kernel to
    back with transparent huge pages where the system leaves that to madvise (a common default).
    torch's allocator does neither: a kernel writing a fresh 64 MiB gradient took 16,384 page
    faults (on Zen 4, torch.empty + fill of 64 MiB 21 ms, a NumPy-backed tensor 5 ms), and a
    training step of 128 x 512 -> 512 fp32 took 64-78 faults a call in torch's memory, none in the
    pool's. (fc allocates the outputs itself: outputs passed in would be checked against the
    inputs, ~5 us a step.)"""
    if a.dtype == np.float32:
        return torch.from_numpy(a)
    return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)


def _view(t, name="x"):
    """A zero-copy NumPy view of ``t`` (the operand ``name``) made contiguous (no autograd inside
    an operator's kernel); the tensors reaching here passed :func:`_check`, so the plain case is
    tried first."""
    if not t.is_contiguous():
        t = t.contiguous()
    if t.requires_grad:
        t = t.detach()
    try:
        return t.numpy() if t.dtype is torch.float32 else tensor_numpy(t)
    except (TypeError, RuntimeError):
        if t.is_neg():                      # a lazy negation, as torch's linear takes it: applied in a copy
            return tensor_numpy(t.resolve_neg())
        return as_ndarray(t, name, who="tppasm.torch")      # the error naming the fix


@torch.library.custom_op("tppasm::linear", mutates_args=())
def _linear(x: Tensor, weight: Tensor, bias: Optional[Tensor], act: Optional[str]) -> tuple[Tensor, Tensor]:
    """(y, z): y = act(x @ weight.T + bias); z the pre-activation for the gelus, else empty."""
    return _forward(x, weight, bias, act)


def _forward(x, weight, bias, act, pre=True):
    """The operator's kernel: (y, z) of :func:`_linear`; ``pre=False``: z is None (no backward
    will read it) and a gelu is fused (``fc.forward(pre=False)``)."""
    _check(x, weight, bias, act)
    return _run(x, _view(weight, "weight"), weight.shape[0], _bias_view(bias), act, pre)


def _bias_view(bias):
    """``bias`` as the float32 NumPy array fc takes (None for None)."""
    return None if bias is None else _view(bias if bias.dtype is torch.float32 else bias.float(), "bias")


def _run(x, w, out, b, act, pre=True):
    """(y, z) of :func:`_forward` for a checked x and weight, given as ``w`` (a NumPy view or
    :class:`tppasm.fc.PackedWeight`) of ``out`` rows and ``b`` (:func:`_bias_view`); y and z are
    fc's arrays (:func:`_tensor`), y shaped as x before it becomes a tensor (a tensor reshaped
    here would be a view, on which autograd refuses in-place ops: ``nn.ReLU(inplace=True)``).
    Each torch call costs about a microsecond here, so those that would change nothing are skipped."""
    rows = _view(_rows(x))
    keep = pre and act in _GELUS
    y = empty((rows.shape[0], out), rows.dtype)
    z = empty(y.shape, rows.dtype) if keep else None
    fc.forward_arrays(rows, w, b, act, y, z, torch.get_num_threads())
    y = _tensor(y if x.dim() == 2 else y.reshape(*x.shape[:-1], out))
    return y, (_tensor(z) if keep else x.new_empty(0)) if pre else None


def _rows(x):
    """x (..., k) as a 2-D tensor of rows."""
    return x if x.dim() == 2 else x.reshape(math.prod(x.shape[:-1]), x.shape[-1])     # -1: ambiguous for k = 0


@_linear.register_fake
def _(x, weight, bias, act):
    _check_devices("tppasm.torch.linear", x, weight=weight, bias=bias)
    _check(x, weight, bias, act, real=False)
    y = x.new_empty(*x.shape[:-1], weight.shape[0])
    z = x.new_empty(math.prod(x.shape[:-1]), weight.shape[0]) if act in _GELUS else x.new_empty(0)
    return y, z


@torch.library.custom_op("tppasm::linear_backward", mutates_args=())
def _linear_backward(dy: Tensor, x: Tensor, weight: Tensor, saved: Optional[Tensor], act: Optional[str],
                     needs: list[bool]) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias in float32) of ``linear``; a gradient ``needs`` leaves out is empty."""
    return _backward_kernel(dy, x, weight, saved, act, needs)


def _backward_kernel(dy, x, weight, saved, act, needs):
    """The operator's kernel: (dx, dweight, dbias) of :func:`_linear_backward`."""
    _check_backward(dy, x, weight, saved, act, needs)
    grads = _gradients(dy, x, weight, saved, act, needs, x.shape, weight.shape)
    return tuple(g if need else x.new_empty(0, dtype=torch.float32 if i == 2 else x.dtype)
                 for i, (g, need) in enumerate(zip(grads, needs)))


def _gradients(dy, x, weight, saved, act, needs, x_shape, w_shape):
    """[dx, dweight, dbias] (None where ``needs`` says no) as tensors, from checked tensors: ``dy``
    (y's shape and dtype), ``saved``, and x and the weight (of shapes ``x_shape`` and ``w_shape``),
    each read only for the gradient that needs it (the other may be None: not saved)."""
    n, k, m = math.prod(x_shape[:-1]), x_shape[-1], w_shape[0]
    dt = dy.dtype
    rows = _view(_rows(x)) if needs[1] else _stand_in((n, k), dt)
    w = _view(weight, "weight") if needs[0] else _stand_in((m, k), dt)
    saved = None if saved is None else _view(saved if saved.dim() == 2 else saved.reshape(n, m), "saved")
    grads = fc.backward_arrays(_view(dy if dy.dim() == 2 else dy.reshape(n, m), "dy"), rows, w, act, saved,
                               *map(bool, needs), torch.get_num_threads())
    if needs[0] and len(x_shape) != 2:
        grads = (grads[0].reshape(x_shape), *grads[1:])
    return [None if g is None else _tensor(g) for g in grads]


def _stand_in(shape, dtype):
    """A NumPy array of ``shape`` and ``dtype`` (a torch dtype) on one zero (strides 0): the operand
    of a product whose result is not computed (fc.backward reads x only for dweight, the weight
    only for dx)."""
    zero = _zero(dtype)
    return np.ndarray(shape, zero.dtype, zero, 0, (0,) * len(shape))


@functools.cache
def _zero(dtype):
    return tensor_numpy(torch.zeros(1, dtype=dtype))


@_linear_backward.register_fake
def _(dy, x, weight, saved, act, needs):
    _check_devices("tppasm::linear_backward", x, dy=dy, weight=weight, saved=saved)
    _check_backward(dy, x, weight, saved, act, needs, real=False)
    return (x.new_empty(x.shape) if needs[0] else x.new_empty(0),
            weight.new_empty(weight.shape) if needs[1] else x.new_empty(0),
            x.new_empty(weight.shape[0], dtype=torch.float32) if needs[2] else x.new_empty(0, dtype=torch.float32))


def _setup_context(ctx, inputs, output):
    x, weight, bias, act = inputs
    y, z = output
    needs = ctx.needs_input_grad
    ctx.act, ctx.bias_dtype, ctx.shapes = act, None if bias is None else bias.dtype, (x.shape, weight.shape, x.dtype)
    # as torch's linear: x only for the weight's gradient, the weight only for x's (an input that no
    # needed gradient reads is not kept, and may change in place before the backward)
    ctx.save_for_backward(x if needs[1] else None, weight if needs[0] else None,
                          y if act == "relu" else z if act in _GELUS else None)
    ctx.set_materialize_grads(False)        # an output no loss reads gets None: no pass over zeros


def _backward(ctx, dy, dz):
    """The gradients of x, weight and bias from those of y and of z (the gelus' pre-activation,
    which a loss may read too: its gradient takes no act' on its way)."""
    if dy is None and (dz is None or not dz.numel()):
        return None, None, None, None              # (no gradient reached either output)
    x, weight, saved = ctx.saved_tensors
    needs = list(ctx.needs_input_grad[:3])
    x_shape, w_shape, dt = ctx.shapes
    # torch.func transforms take an autograd.Function, not the operator (see _Transformable); a
    # backward that builds a graph (create_graph) takes the operator, which refuses a second derivative
    if (getattr(ctx, "direct", False) and not torch.is_grad_enabled() and _unwatched(dy, dz)
            and _as_saved(x, x_shape, dt) and _as_saved(weight, w_shape, dt) and (saved is None or saved.dtype is dt)):
        def call(dy, x, weight, saved, act, needs):     # torch gave dy (and dz) y's (z's) shape and dtype
            return _gradients(dy, x, weight, saved, act, needs, x_shape, w_shape)
    else:
        call = _LinearBackward.apply if torch._C._are_functorch_transforms_active() else \
            torch.ops.tppasm.linear_backward
        # the operators take tensors: of what was not saved (no needed gradient reads it), zeros
        device = (dy if dy is not None else dz).device
        x, weight = (torch.zeros((), dtype=dt, device=device).expand(shape) if t is None else t
                     for t, shape in ((x, x_shape), (weight, w_shape)))
    grads = None if dy is None else call(dy, x, weight, saved, ctx.act, needs)
    if dz is not None and dz.numel():
        more = call(dz.reshape(*x_shape[:-1], w_shape[0]), x, weight, None, None, needs)
        grads = more if grads is None else [g + h if need else g for g, h, need in zip(grads, more, needs)]
    dx, dw, db = grads
    return (dx if needs[0] else None, dw if needs[1] else None,
            db.to(ctx.bias_dtype) if needs[2] else None, None)


@_linear.register_vmap
def _linear_vmap(info, in_dims, x, weight, bias, act):
    """``torch.func.vmap`` of ``tppasm::linear``: over x alone (per-sample inference, ``vmap`` of
    ``grad`` or ``jacrev`` over inputs) one call, the batch as more rows; over weight or bias
    (ensembles) a call per element (:func:`_per_element`). torch's fallback loops, warns of it,
    and refuses an empty batch."""
    if in_dims[1] is None and in_dims[2] is None:
        x = x.movedim(in_dims[0], 0)
        y, z = torch.ops.tppasm.linear(x, weight, bias, act)
        if act not in _GELUS:
            return (y, z), (0, None)                # z: the empty tensor of every element
        return (y, z.reshape(info.batch_size, math.prod(x.shape[1:-1]), z.shape[-1])), (0, 0)
    return _per_element(info, in_dims, torch.ops.tppasm.linear, (x, weight, bias, act))


@_linear_backward.register_vmap
def _linear_backward_vmap(info, in_dims, dy, x, weight, saved, act, needs):
    """``torch.func.vmap`` of ``tppasm::linear_backward`` (``jacrev``'s batch of cotangents):
    :func:`_per_element`, which unlike torch's fallback takes an empty batch, without a warning."""
    return _per_element(info, in_dims, torch.ops.tppasm.linear_backward, (dy, x, weight, saved, act, needs))


def _per_element(info, in_dims, op, args):
    """(outputs, out_dims) of ``op`` called on each element of a vmapped batch of ``args``,
    stacked along dimension 0; an empty batch gives empty outputs of the shapes that ``op``'s fake
    kernel gives an element."""
    batched = [isinstance(a, Tensor) and d is not None for a, d in zip(args, in_dims)]    # (needs' dims: a list)
    if info.batch_size == 0:
        meta = [a.new_empty(a.shape[:d] + a.shape[d + 1:], device="meta") if bat else
                a.to("meta") if isinstance(a, Tensor) else a for a, d, bat in zip(args, in_dims, batched)]
        device = next(a.device for a, bat in zip(args, batched) if bat)
        outs = [torch.empty(0, *o.shape, dtype=o.dtype, device=device) for o in op(*meta)]
    else:
        calls = [op(*(a.select(d, i) if bat else a for a, d, bat in zip(args, in_dims, batched)))
                 for i in range(info.batch_size)]
        outs = [torch.stack(o) for o in zip(*calls)]
    return tuple(outs), (0,) * len(outs)


def _no_second_derivative(ctx, *grads):
    raise RuntimeError("tppasm.torch.linear has no second derivative (tppasm::linear_backward is not differentiable): "
                       "for double backward, grad of grad or hessian use torch.nn.functional.linear")


def _no_forward_mode(ctx, *tangents):
    raise RuntimeError("tppasm.torch.linear has no forward-mode derivative (torch.func.jvp, jacfwd, hessian): use "
                       "reverse mode (torch.func.vjp, jacrev, grad) or torch.nn.functional.linear")


_linear.register_autograd(_backward, setup_context=_setup_context)
_linear_backward.register_autograd(_no_second_derivative)


def _autocast(call, x, weight, bias, act):
    """``call(x, weight, bias, act)`` -> (y, z) as CPU autocast runs torch's linear: x, weight and
    bias cast to autocast's dtype (float64 and non-CPU tensors left as autocast leaves them), the
    casts differentiable (float32 parameters get float32 gradients), autocast off inside. tppasm
    has no float16 kernels: under float16 autocast the inputs are cast to float32 and y and z
    rounded to float16, the dtype torch's linear returns there."""
    dtype = torch.get_autocast_dtype("cpu")
    compute = dtype if dtype in _DTYPES else torch.float32
    args = [t.to(compute) if t is not None and t.is_floating_point() and t.dtype != torch.float64
            and t.device.type == "cpu" else t for t in (x, weight, bias)]
    with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)):
        y, z = call(*args, act)
    return y.to(dtype), z.to(dtype)


torch.library.impl("tppasm::linear", "AutocastCPU", functools.partial(_autocast, torch.ops.tppasm.linear))


class _Transformable(torch.autograd.Function):
    """An operator as an autograd.Function with ``setup_context``, which torch.func transforms need
    and do not find in a ``torch.library.custom_op`` (its generated autograd.Function has none:
    pytorch issue 168393). vmap runs the operators' batching rules (:func:`_linear_vmap`); forward
    mode is refused."""
    generate_vmap_rule = True
    jvp = staticmethod(_no_forward_mode)


class _Linear(_Transformable):
    @staticmethod
    def forward(x, weight, bias, act):
        return torch.ops.tppasm.linear(x, weight, bias, act)

    setup_context = staticmethod(_setup_context)
    backward = staticmethod(_backward)


class _LinearBackward(_Transformable):
    @staticmethod
    def forward(dy, x, weight, saved, act, needs):
        return torch.ops.tppasm.linear_backward(dy, x, weight, saved, act, needs)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    backward = staticmethod(_no_second_derivative)


class _Direct(torch.autograd.Function):
    """``linear`` where torch watches only the gradients (:func:`_unwatched`): the operators'
    kernels run directly, forward and backward, as the operators' autograd formula says. The old
    form of forward (ctx first, no setup_context): with a setup_context, every apply binds the
    arguments with inspect.signature (~25 us), which only torch.func needs, and torch.func never
    reaches this class."""

    @staticmethod
    def forward(ctx, x, weight, bias, act):
        output = _forward(x, weight, bias, act)
        _setup_context(ctx, (x, weight, bias, act), output)
        ctx.direct = True
        return output

    backward = staticmethod(_backward)
    jvp = staticmethod(_no_forward_mode)
