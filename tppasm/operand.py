"""What a kernel accepts for each array argument, and the Python check that explains a refusal.

A kernel's native entry checks the same facts with a handful of compares per array (see
:mod:`tppasm.x86.entry`); when that fails, :func:`check` runs here and raises a message that says
what was expected and what to write instead.

The native entry takes NumPy arrays only. Torch tensors and other objects with ``__dlpack__``
reach :func:`call` instead, which views them as NumPy arrays over the same memory
(:func:`as_ndarray`: no copy, so a kernel's writes land in the caller's tensor) and enters the
kernel again with those.
"""
import ctypes
import dataclasses
import functools
import operator
import sys
from dataclasses import dataclass

import numpy as np

from .display import shown
from .dtypes import dtype as to_dtype, imported, name_of

FLOATS = ("f32", "bf16")
# leading dimensions that two operands share: advice for one must hold for the other
SHARED_LDS = {"ldt": " (cos and sin share ldt: both tables need rows that far apart; np.ascontiguousarray of each, "
                     "with ldt=0, makes them so)"}


class OperandError(ValueError):
    """An array argument does not match the kernel's descriptor."""


@dataclass(frozen=True)
class OperandSpec:
    """One array argument: ``shape`` and ``strides`` (in elements) as the kernel was built for.

    ``batch=True`` adds a leading dimension of at least ``count`` entries whose stride is
    ``strides[0]``. ``ld_name`` names the constructor parameter that sets the row stride, and
    ``dtype_param`` the one that sets the dtype where f32 and bf16 are both legal, for messages.
    ``max_value``: the largest value the kernel is promised its elements hold (None: the dtype's;
    :func:`tppasm.testing.strategies.operands` draws within it), e.g. a BRGEMM's A with ``a_bits=7``.
    """

    name: str
    dtype: str
    shape: tuple
    strides: tuple
    writable: bool = False
    batch: bool = False
    ld_name: str = ""
    dtype_param: str = ""
    max_value: int = None

    @property
    def np_dtype(self):
        return to_dtype(self.dtype)

    def full_shape(self, count):
        return ((count,) if self.batch else ()) + tuple(self.shape)

    def nbytes(self, count=1):
        """Bytes spanned from the first to one past the last element touched."""
        es = self.np_dtype.itemsize
        dims = self.full_shape(count)
        return es * (1 + sum((d - 1) * s for d, s in zip(dims, self.strides)))


def check(spec: OperandSpec, arr, count=1, who="kernel", origin="numpy"):
    """Raise :class:`OperandError` unless ``arr`` is what ``spec`` describes.

    ``origin`` ("numpy", "torch" or "dlpack", see :func:`origin_of`) is what the caller passed
    before :func:`as_ndarray` viewed it, so that a fix is written in the caller's terms.

    >>> import numpy as np, tppasm
    >>> from tppasm.testing import check_operand
    >>> x_spec = tppasm.relu(2, 3).operands[0]
    >>> check_operand(x_spec, np.zeros((2, 3), np.float32))               # fits: nothing to say
    >>> check_operand(x_spec, np.zeros((3, 2), np.float32))
    Traceback (most recent call last):
    ...
    tppasm.operand.OperandError: kernel: operand x has shape (3, 2), expected ...
    """
    origin = origin if origin in _CONTIGUOUS else "numpy"
    where = f"{who}: operand {spec.name}"
    if not isinstance(arr, np.ndarray):
        raise OperandError(_not_an_array(where, arr, spec.writable, f"{_shape_text(spec)}, '{spec.dtype}'",
                                         _spelled(spec), spec.name))
    refuse_masked(arr, where, spec.writable)
    want = spec.np_dtype
    if arr.dtype != want:
        raise OperandError(f"{where} has dtype {arr.dtype}, expected {want} ('{spec.dtype}', as the kernel "
                           f"was built); {_dtype_fix(spec, arr.dtype, origin)}")
    nd = len(spec.shape) + spec.batch
    if arr.ndim != nd:
        raise OperandError(f"{where} has {arr.ndim} dimensions {arr.shape}, expected {nd}: "
                           f"{_shape_text(spec)}{_rank_fix(spec, arr.shape)}")
    if spec.batch and arr.shape[0] < count:
        raise OperandError(f"{where} holds {arr.shape[0]} blocks but count={count}; "
                           + (f"pass count<={arr.shape[0]}" if arr.shape[0] else "pass at least one block"))
    if tuple(arr.shape[spec.batch:]) != tuple(spec.shape):
        raise OperandError(f"{where} has shape {arr.shape}, expected {_shape_text(spec)}")
    es = arr.itemsize
    got = tuple(s // es if s % es == 0 else s / es for s in arr.strides)
    dims = arr.shape
    for axis, (g, w, d) in enumerate(zip(got, spec.strides, dims)):
        if spec.batch and axis == 0 and count == 1:      # the kernel reads the first block only
            continue
        if d > 1 and g != w:
            if spec.ld_name and axis == nd - 2 and isinstance(g, int) and g >= spec.shape[-1] and \
                    (got[-1] == 1 or dims[-1] == 1):
                hint = f"; build the kernel with {spec.ld_name}={g}" + SHARED_LDS.get(spec.ld_name, "")
            elif spec.batch and axis == 0 and spec.name in ("a", "b") and isinstance(g, int) and g > 0:
                hint = f"; build the kernel with stride_{spec.name}={g}, or pass {_CONTIGUOUS[origin]}"
            elif spec.writable:
                hint = ("; pass a contiguous output and copy it into this view afterwards (a contiguous copy "
                        "of the view itself would not receive the result)")
            else:
                hint = f"; pass {_CONTIGUOUS[origin]}"
            raise OperandError(f"{where} has strides {got} (elements), expected {spec.strides} on axis "
                               f"{axis}{hint}")
    if spec.writable and not arr.flags.writeable:
        raise OperandError(f"{where} is read-only{_READ_ONLY[origin]} but the kernel writes it; pass a writable array")


def _rank_fix(spec, shape):
    """How to pass an operand with the wrong number of axes: one block lacking the batch axis gets it
    (``b[None]``); a bf16 or int8 BRGEMM's B not yet in the VNNI layout is packed (and given the axis)."""
    name = spec.name
    if spec.batch and tuple(shape) == tuple(spec.shape):
        return f"; add the batch axis: {name}[None] (one block)"
    if name == "b" and len(spec.shape) == 3 and len(shape) in (len(spec.shape) - 1, len(spec.shape)):
        batch = "[None]" if spec.batch and len(shape) == len(spec.shape) - 1 else ""
        return (f"; B of a bf16 or int8 BRGEMM is in the VNNI layout: pass tppasm.vnni_pack(B, {spec.shape[-1]})"
                f"{batch}")
    if name == "mask" and spec.dtype == "f32":
        return "; a masked softmax takes (x, mask, out), or (x, mask) to allocate the output"
    if name == "bias" and len(shape) == 2:
        return "; this kernel was built with bias=True: call it as k(a, b, c, bias), or c = k(a, b, bias)"
    return ""


def refuse_masked(arr, where, writes=False):
    """Raise :class:`OperandError` if ``arr`` is a NumPy masked array: a kernel would read (or write)
    every element, whatever its mask says. ``where`` names the operand ("brgemm: operand a")."""
    masked = imported("numpy.ma", "MaskedArray")     # (no masked array exists before numpy.ma is imported)
    if masked is not None and isinstance(arr, masked):
        fix = ("pass x.data (the same memory; the mask stays as it is)" if writes
               else "pass x.filled(value) (masked elements replaced by value) or x.data (the values as stored, "
               "mask ignored)")
        raise OperandError(f"{where} is a NumPy masked array, whose mask a kernel cannot see (it "
                           f"{'writes' if writes else 'reads'} every element); {fix}")


_CONTIGUOUS = {"numpy": "np.ascontiguousarray(...)", "torch": "x.contiguous()",
               "dlpack": "a C-contiguous array"}
_READ_ONLY = {"numpy": "", "torch": "", "dlpack": " (its producer exported it read-only through DLPack)"}


def _spelled(spec):
    """The dtype of ``spec`` as NumPy code spells it: np.float32, ml_dtypes.bfloat16."""
    return f"{'ml_dtypes' if spec.dtype == 'bf16' else 'np'}.{spec.np_dtype.name}"


def _not_an_array(where, obj, writes, shape_dtype="shape, dtype", np_dtype="dtype", name="x"):
    if writes:
        fix = f"allocate it with tppasm.empty({shape_dtype}) (a converted copy would not receive the result)"
    else:
        fix = f"pass tppasm.aligned(np.asarray({name}, {np_dtype}))"
    return (f"{where} must be a NumPy array, a torch tensor or an object with __dlpack__, not "
            f"{type(obj).__name__}; {fix}")


def _dtype_fix(spec, got, origin="numpy"):
    """How to pass what ``spec`` expects, in the caller's terms (``origin``): convert an input,
    pass an output of the right dtype (a converted copy would not receive the result), or, where
    the kernel family has one, build the kernel for ``got``; never a kernel that does not exist
    (float64, int32 offsets)."""
    want = spec.np_dtype
    if spec.writable:
        fix = f"pass a {want} output (a converted copy would not receive the result)"
    else:
        fix = {"torch": f"convert with .to(torch.{want.name})", "dlpack": f"convert it to {want.name}"}.get(
            origin, f"convert with .astype({_spelled(spec)})")
    try:
        short = name_of(got)
    except TypeError:
        short = None
    if spec.dtype_param and short in FLOATS and spec.dtype in FLOATS:
        fix += f", or build the kernel with {spec.dtype_param}={short!r}"
    if spec.dtype_param == "signs" and {short, spec.dtype} == {"i8", "u8"}:     # .astype would wrap -1 to 255
        fix = (f"build the kernel with {'s' if short == 'i8' else 'u'!r} for {spec.name} in signs= (A's letter then "
               f"B's: 's' int8, 'u' uint8), or, if every value fits, {fix}")
    return fix


def _shape_text(spec):
    return "(count, " + ", ".join(map(str, spec.shape)) + ")" if spec.batch else str(tuple(spec.shape))


# -- operands that are not NumPy arrays ------------------------------------------------------------

def origin_of(obj):
    """"numpy", "torch", "dlpack" or None: which kind of operand ``obj`` is.

    >>> import numpy as np
    >>> origin_of(np.zeros(2)), origin_of([1.0])
    ('numpy', None)
    """
    if isinstance(obj, np.ndarray):
        return "numpy"
    tensor = imported("torch", "Tensor")        # a tensor exists only once torch is imported
    if tensor is not None and isinstance(obj, tensor):
        return "torch"
    return "dlpack" if hasattr(type(obj), "__dlpack__") else None


def as_ndarray(obj, name="x", who="kernel", writes=False):
    """``obj`` as a NumPy array over the same memory: a NumPy array itself (an instance of a subclass
    as a plain ``ndarray`` view, so that its shape, strides, dtype, flags and address are NumPy's,
    whatever the subclass's properties say; a masked array is refused), a CPU torch tensor
    (``torch.bfloat16`` as ``ml_dtypes.bfloat16``), or an object with ``__dlpack__`` on the CPU.

    Never copies, so what a kernel writes lands in ``obj``. ``writes``: the kernel writes ``obj``
    (a tensor that requires grad is then refused). Anything else raises :class:`OperandError`
    saying what to pass; the dtype, shape and strides are checked by the kernel afterwards.

    >>> import numpy as np
    >>> class Exported:                 # any DLPack producer, e.g. a JAX or CuPy-on-host array
    ...     def __init__(self, a): self.a = a
    ...     def __dlpack__(self, **kw): return self.a.__dlpack__(**kw)
    ...     def __dlpack_device__(self): return self.a.__dlpack_device__()
    >>> x = np.zeros(3, np.float32); v = as_ndarray(Exported(x)); v[0] = 1; x.tolist()
    [1.0, 0.0, 0.0]
    """
    if isinstance(obj, np.ndarray):
        if type(obj) is np.ndarray:
            return obj
        refuse_masked(obj, f"{who}: operand {name}", writes)
        return np.ndarray.view(obj, np.ndarray)
    tensor = imported("torch", "Tensor")
    if tensor is not None and isinstance(obj, tensor):
        if writes:
            refuse_write(obj, name, who)
        return _from_torch(obj, sys.modules["torch"], name, who, writes)
    kind = origin_of(obj)
    if kind == "dlpack":
        return _from_dlpack(obj, f"{who}: operand {name}")
    raise OperandError(_not_an_array(f"{who}: operand {name}", obj, writes, name=name))


def refuse_write(obj, name="x", who="kernel"):
    """Raise :class:`OperandError` if a kernel must not write the tensor ``obj`` in place."""
    tensor = imported("torch", "Tensor")
    if tensor is None or not isinstance(obj, tensor):
        return
    torch = sys.modules["torch"]
    if obj.requires_grad:
        raise OperandError(f"{who}: operand {name} is a tensor that requires grad, and the kernel writes it in place "
                           "where autograd cannot see; pass x.detach() (the same memory, outside autograd) or use the "
                           "tppasm.torch operators (tppasm.torch.Linear), which have a backward")
    if obj.is_inference() and not torch.is_inference_mode_enabled():
        raise OperandError(f"{who}: operand {name} is an inference tensor, which torch forbids writing outside "
                           "torch.inference_mode(); call the kernel inside torch.inference_mode() or pass a normal "
                           "tensor")


def data_address(a):
    """``a.ctypes.data`` of a NumPy array, in a seventh of the time (0.15 us against 1.0 on Zen 4:
    :mod:`tppasm.fc` spells a few calls' pointers per product): read from the array object, where
    numpy 1.x and 2.x keep it (the word after the object's head), once that held for a test array.

    >>> import numpy as np
    >>> x = np.ones((3, 4), np.float32)[1:]
    >>> data_address(x) == x.ctypes.data
    True
    """
    if _DATA_WORD_HOLDS and isinstance(a, np.ndarray):
        return _read_word(id(a) + _DATA_OFFSET).value
    return a.ctypes.data


_DATA_OFFSET = 16                  # PyArrayObject_fields.data: tppasm.x86.entry.DATA, which the native entries read
_read_word = ctypes.c_uint64.from_address


def _data_word_holds():
    probe = np.zeros((4, 4), np.float32)[1:, 2:]
    return sys.maxsize > 1 << 32 and sys.implementation.name == "cpython" and \
        _read_word(id(probe) + _DATA_OFFSET).value == probe.ctypes.data


_DATA_WORD_HOLDS = _data_word_holds()


def mark_written(objs):
    """Tell autograd that the torch tensors among ``objs`` were modified in place (their version
    counters move on, so a backward that saved one of them raises instead of using new values)."""
    tensor = imported("torch", "Tensor")
    if tensor is not None:
        tensors = [t for t in objs if isinstance(t, tensor)]
        if tensors:
            torch = sys.modules["torch"]
            # the C function torch.autograd.graph.increment_version calls (a third of its cost)
            getattr(torch._C, "_increment_version", torch.autograd.graph.increment_version)(tensors)


def call(kernel, objs, values):
    """Run ``kernel`` on operands some of which are not NumPy arrays (see :func:`as_ndarray`):
    the zero-copy views enter the kernel's native check; a refusal is explained in the caller's
    terms (``.contiguous()`` for a tensor, ``np.ascontiguousarray`` for an array)."""
    who, specs = kernel.desc.kind, kernel.operands
    try:
        arrays = [as_ndarray(obj, spec.name, who, spec.writable) for spec, obj in zip(specs, objs)]
    except OperandError:
        for spec, obj in zip(specs, objs):
            if origin_of(obj) is None:
                check(spec, obj, who=who)       # not an array at all: say which shape and dtype to pass
        raise
    try:
        if values:
            kernel(*arrays, **dict(zip(kernel.scalars, values)))
        else:
            kernel(*arrays)
    except OperandError:
        count = dict(zip(kernel.scalars, values)).get(kernel.desc.count_scalar, 1)
        for spec, arr, obj in zip(specs, arrays, objs):
            check(spec, arr, count, who, origin_of(obj))
        refuse_overlap(who, specs, arrays, count, [origin_of(obj) for obj in objs])   # in the caller's terms
        raise
    mark_written([obj for spec, obj in zip(specs, objs) if spec.writable])


def nones_at(arrays, places):
    """Whether ``arrays`` holds None at each of ``places`` (and nowhere else): outputs left out."""
    return all((a is None) == (i in places) for i, a in enumerate(arrays))


def without(arrays, places):
    return tuple(a for i, a in enumerate(arrays) if i not in places)


def like_inputs(outputs, inputs):
    """What an allocating call (``out = k(x)``) returns: its new NumPy ``outputs`` (an array or a
    tuple) as torch tensors over the same memory when an input is a torch tensor (a bf16 one through
    an int16 view, ``.view(torch.bfloat16)``: no copy), else as they are. Never imports torch.

    >>> import torch, tppasm
    >>> tppasm.relu(1, 2, dtype="bf16")(torch.tensor([[-1.0, 2.0]], dtype=torch.bfloat16))
    tensor([[0., 2.]], dtype=torch.bfloat16)
    """
    tensor = imported("torch", "Tensor")
    if tensor is None or not any(isinstance(x, tensor) for a in inputs
                                 for x in (a if isinstance(a, (list, tuple)) else (a,))):   # (address batches)
        return outputs
    return tuple(map(_as_tensor, outputs)) if isinstance(outputs, tuple) else _as_tensor(outputs)


def _as_tensor(a):
    torch = sys.modules["torch"]
    if a.dtype.name == "bfloat16":            # (torch.from_numpy refuses ml_dtypes' bfloat16)
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def scalar_arg(kind, name, value):
    """``value`` as a Python int in [1, 2**30) (NumPy integers welcome, bools not); ``kind`` and ``name``
    are what an error names.

    >>> import numpy as np
    >>> from tppasm.testing import scalar_arg
    >>> scalar_arg("brgemm", "count", np.int64(4))
    4
    >>> scalar_arg("brgemm", "count", 0)
    Traceback (most recent call last):
    ...
    tppasm.operand.OperandError: brgemm: count=0, expected an int from 1 to 2**30 - 1
    """
    try:
        v = operator.index(value)
    except TypeError:
        v = None
    if v is None or isinstance(value, (bool, np.bool_)) or not 1 <= v < 1 << 30:
        raise OperandError(f"{kind}: {name}={shown(value)}, expected an int from 1 to 2**30 - 1")
    return v


def any_strides(spec, arr):
    """``spec`` with ``arr``'s strides (in whole elements): what a NumPy computation takes."""
    es, strides = arr.itemsize, arr.strides
    if len(strides) != len(spec.strides) or any(s % es for s in strides):
        return spec
    return dataclasses.replace(spec, strides=tuple(s // es for s in strides))


def tensor_numpy(t):
    """The NumPy view of a CPU tensor that needs no grad, unchecked: ``t.numpy()``, with
    ``torch.bfloat16`` as ``ml_dtypes.bfloat16`` (NumPy has none: the same bits). Raises torch's
    TypeError or RuntimeError for what it cannot view (:func:`as_ndarray` explains those).

    >>> import torch
    >>> tensor_numpy(torch.ones(2, dtype=torch.bfloat16)).dtype.name
    'bfloat16'
    """
    torch = sys.modules["torch"]
    if t.dtype is torch.bfloat16:
        return t.view(torch.int16).numpy().view(_numpy_bf16())
    return t.numpy()


@functools.cache
def _numpy_bf16():
    """NumPy's bfloat16 (ml_dtypes loads on first use: import tppasm stays lazy), looked up once."""
    return to_dtype("bf16")


def _from_torch(t, torch, name, who, writes):
    if t.requires_grad:
        if torch.is_grad_enabled() and not writes:     # (a written one was refused before)
            raise OperandError(f"{who}: operand {name} is a tensor that requires grad, and autograd cannot see "
                               "through a kernel call; pass x.detach() (no gradient flows back through this call), "
                               "call it under torch.no_grad(), or use the tppasm.torch operators "
                               "(tppasm.torch.Linear), which have a backward")
        t = t.detach()
    try:
        return tensor_numpy(t)               # refuses other devices and layouts, explained below
    except (TypeError, RuntimeError) as e:
        where = f"{who}: operand {name}"
        if t.layout is not torch.strided:
            fix = "pass x.to_dense()" + (" and copy the result back (a dense copy would not receive it)"
                                         if writes else "")
            raise OperandError(f"{where} is a {t.layout} tensor; kernels take dense tensors: {fix}") from None
        if not t.is_cpu:
            fix = ("allocate it there (torch.empty(..., device='cpu')) and copy it to the device after the call (a "
                   "CPU copy of it would not receive the result)" if writes else "pass x.cpu()")
            raise OperandError(f"{where} is a tensor on {t.device}; tppasm kernels run on the CPU: {fix}") from None
        for bit, word, what in (("neg", "negative", "negation"), ("conj", "conjugate", "conjugation")):
            if getattr(t, f"is_{bit}")():          # x.conj(), torch._neg_view(x): views with a pending op
                fix = (f"pass a tensor without it (x.resolve_{bit}() is a copy, which would not receive the result)"
                       if writes else f"pass x.resolve_{bit}() (a copy with the {what} applied)")
                raise OperandError(f"{where} is a torch view with its {word} bit set (a lazy {what}, which the "
                                   f"kernel would not apply); {fix}") from None
        if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
            raise OperandError(f"{where} is a {type(t).__name__} (a tensor subclass), which holds no memory of its "
                               "own that a kernel could use (a FakeTensor, a wrapper subclass): pass the plain "
                               "tensor on the CPU that holds the values") from None
        raise OperandError(f"{where}: {e} (tppasm kernels take torch.float32, torch.bfloat16, torch.int8, "
                           "torch.uint8, torch.int32 and torch.int64 tensors)") from None


_DLPACK_DEVICES = {1: "CPU", 2: "CUDA", 3: "CUDA host", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI",
                   10: "ROCm", 13: "CUDA managed", 14: "oneAPI"}


def _from_dlpack(obj, where):
    device = getattr(obj, "__dlpack_device__", None)
    if device is not None:
        try:
            kind = int(device()[0])
        except Exception as e:          # a producer's own code: whatever it raises or returns
            raise OperandError(f"{where}: its __dlpack_device__() failed ({type(e).__name__}: {e}); it must return "
                               "(device_type, device_id) ints, (1, 0) for the CPU: pass a NumPy array or a torch "
                               "tensor instead") from e
        if kind != 1:
            raise OperandError(f"{where} is on the DLPack device {_DLPACK_DEVICES.get(kind, kind)}; tppasm kernels "
                               "run on the CPU: copy it to host memory first")
    try:
        try:
            return np.from_dlpack(obj, copy=False)
        except TypeError:
            return np.from_dlpack(obj)       # NumPy < 2.1 has no copy= (and never copies on the CPU)
    except Exception as e:              # (the producer's __dlpack__ may raise anything)
        bf16 = (" (NumPy's DLPack import has no bfloat16: pass a torch tensor or an ml_dtypes.bfloat16 NumPy "
                "array instead)" if "dtype" in str(e).lower() else "")
        raise OperandError(f"{where}: NumPy cannot import this DLPack object as a view: {type(e).__name__}: "
                           f"{e}{bf16}") from e


# -- outputs that overlap other operands ---------------------------------------------------------

# kinds whose output may be the very array an input is (same start, dtype, shape and strides): each
# output element is computed from the input elements at its own position (element-wise ops), or
# from a row the kernel has read in full before it writes that row (softmax, the norms, rotary)
IN_PLACE_KINDS = frozenset({"unary", "binary", "ternary", "swiglu", "softmax", "layernorm", "rmsnorm", "rotary"})


def in_place_ok(kind, out: OperandSpec, inp: OperandSpec):
    """Whether ``kind``'s output ``out`` may be the same array as its input ``inp``: an in-place kind,
    and specs of one dtype, shape and strides (strides of length-1 axes aside), neither batched.

    >>> spec = lambda name, w=False: OperandSpec(name, "f32", (2, 3), (3, 1), writable=w)
    >>> in_place_ok("unary", spec("out", True), spec("x")), in_place_ok("gemm_nt", spec("c", True), spec("a"))
    (True, False)
    """
    return (kind in IN_PLACE_KINDS and out.writable and not inp.writable and not out.batch
            and not inp.batch and out.dtype == inp.dtype and tuple(out.shape) == tuple(inp.shape)
            and all(d == 1 or s == t for d, s, t in zip(out.shape, out.strides, inp.strides)))


_TOO_HARD = getattr(getattr(np, "exceptions", np), "TooHardError", None) or np.TooHardError
_EMPTY_LIKE = {"numpy": "np.empty_like({})", "torch": "torch.empty_like({})", "dlpack": "a new array like {}"}


def _refuse_repeats(kind, name, array, origin):
    axes = [i for i, (d, s) in enumerate(zip(array.shape, array.strides)) if d > 1 and s == 0]
    if axes:
        like = _EMPTY_LIKE.get(origin or "numpy", _EMPTY_LIKE["numpy"]).format(name)
        raise OperandError(f"{kind}: output {name} has stride 0 on axis {axes[0]} (a broadcast view), so its "
                           f"elements share memory; pass an array of its own, e.g. {name} = {like}")


def refuse_overlap(kind, specs, arrays, count=1, origins=None, repeats=False):
    """Raise :class:`OperandError` if an output among ``arrays`` (checked against ``specs``) shares
    memory with another operand, unless it is the very same array as an input of an in-place kind
    (:func:`in_place_ok`). The kernel reads its inputs while it writes its outputs, so any other
    overlap would give wrong values. ``origins`` (see :func:`origin_of`) words the fix.
    ``repeats``: also refuse an output whose elements repeat (a zero stride), which the layout
    check refuses before a native call but NumPy's reference, taking any strides, would write.

    >>> from tppasm.eltwise import Unary, Transform
    >>> x = np.ones((2, 3), np.float32)
    >>> refuse_overlap("unary", Unary("relu", 2, 3).operands(), (x, x))        # in place: fine
    >>> y = np.ones((3, 3), np.float32)
    >>> refuse_overlap("transform", Transform("transpose", 3, 3).operands(), (y, y))
    Traceback (most recent call last):
    ...
    tppasm.operand.OperandError: transform: output out is the same array as operand x, and a transform kernel cannot run in place (an output element depends on input elements it may have overwritten); pass a separate array for out, e.g. out = np.empty_like(out)
    """
    views = None
    for w, sw in enumerate(specs):
        if not sw.writable:
            continue
        if repeats:
            _refuse_repeats(kind, sw.name, arrays[w], origins[w] if origins else None)
        for j, sj in enumerate(specs):
            if j == w or (sj.writable and j < w) or not np.may_share_memory(arrays[w], arrays[j]):
                continue
            if views is None:
                views = [a[:count] if s.batch else a for s, a in zip(specs, arrays)]
            vw, vj = views[w], views[j]
            same = (vw.dtype == vj.dtype and vw.shape == vj.shape
                    and vw.__array_interface__["data"][0] == vj.__array_interface__["data"][0]
                    and all(d == 1 or s == t for d, s, t in zip(vw.shape, vw.strides, vj.strides)))
            if same and in_place_ok(kind, sw, sj):
                continue
            if not same:
                try:
                    if not np.shares_memory(vw, vj, max_work=1 << 20):
                        continue
                except _TOO_HARD:
                    pass                              # (cannot tell in reasonable time: refused)
            origin = (origins[w] if origins else None) or "numpy"
            fix = (f"pass a separate array for {sw.name}, e.g. {sw.name} = "
                   f"{_EMPTY_LIKE.get(origin, _EMPTY_LIKE['numpy']).format(sw.name)}")
            other = f"output {sj.name}" if sj.writable else f"operand {sj.name}"
            if same:
                raise OperandError(f"{kind}: output {sw.name} is the same array as {other}, and a "
                                   f"{kind} kernel cannot run in place (an output element depends on input elements "
                                   f"it may have overwritten); {fix}")
            inplace = any(in_place_ok(kind, sw, s) for s in specs)
            hint = (f" (a {kind} kernel runs in place only on the very same array: same start, shape and strides)"
                    if inplace else "")
            why = "would write one over the other" if sj.writable else "would read values it has already overwritten"
            raise OperandError(f"{kind}: output {sw.name} overlaps {other} in memory, and the kernel {why}{hint}; "
                               f"{fix}")
