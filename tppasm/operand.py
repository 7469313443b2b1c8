"""What a kernel accepts for each array argument, and the Python check that explains a refusal.

A kernel's native entry checks the same facts with a handful of compares per array (see
:mod:`tppasm.x86.entry`); when that fails, :func:`check` runs here and raises a message that says
what was expected and what to write instead.
"""
from dataclasses import dataclass

import numpy as np

from .dtypes import dtype as to_dtype, name_of

FLOATS = ("f32", "bf16")


class OperandError(ValueError):
    """An array argument does not match the kernel's descriptor."""


@dataclass(frozen=True)
class OperandSpec:
    """One array argument: ``shape`` and ``strides`` (in elements) as the kernel was built for.

    ``batch=True`` adds a leading dimension of at least ``count`` entries whose stride is
    ``strides[0]``. ``ld_name`` names the constructor parameter that sets the row stride, and
    ``dtype_param`` the one that sets the dtype where f32 and bf16 are both legal, for messages.
    """

    name: str
    dtype: str
    shape: tuple
    strides: tuple
    writable: bool = False
    batch: bool = False
    ld_name: str = ""
    dtype_param: str = ""

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


def check(spec: OperandSpec, arr, count=1, who="kernel"):
    """Raise :class:`OperandError` unless ``arr`` is what ``spec`` describes."""
    where = f"{who}: operand {spec.name}"
    if not isinstance(arr, np.ndarray):
        raise OperandError(f"{where} must be a NumPy array, not {type(arr).__name__}")
    want = spec.np_dtype
    if arr.dtype != want:
        raise OperandError(f"{where} has dtype {arr.dtype}, expected {want} ('{spec.dtype}', as the kernel "
                           f"was built); {_dtype_fix(spec, arr.dtype)}")
    nd = len(spec.shape) + spec.batch
    if arr.ndim != nd:
        vnni = (f"; B of a bf16 or int8 BRGEMM is in the VNNI layout: pass tppasm.vnni_pack(B, {spec.shape[-1]})"
                if spec.name == "b" and len(spec.shape) == 3 else "")
        raise OperandError(f"{where} has {arr.ndim} dimensions {arr.shape}, expected {nd}: "
                           f"{_shape_text(spec)}{vnni}")
    if spec.batch and arr.shape[0] < count:
        raise OperandError(f"{where} holds {arr.shape[0]} blocks but count={count}; "
                           + (f"pass count<={arr.shape[0]}" if arr.shape[0] else "pass at least one block"))
    if tuple(arr.shape[spec.batch:]) != tuple(spec.shape):
        raise OperandError(f"{where} has shape {arr.shape}, expected {_shape_text(spec)}")
    es = arr.itemsize
    got = tuple(s // es if s % es == 0 else s / es for s in arr.strides)
    dims = arr.shape
    for axis, (g, w, d) in enumerate(zip(got, spec.strides, dims)):
        if d > 1 and g != w:
            if spec.ld_name and axis == nd - 2 and isinstance(g, int) and g >= spec.shape[-1]:
                hint = f"; build the kernel with {spec.ld_name}={g}"
            elif spec.batch and axis == 0 and spec.name in ("a", "b") and isinstance(g, int) and g > 0:
                hint = f"; build the kernel with stride_{spec.name}={g}, or pass np.ascontiguousarray(...)"
            else:
                hint = "; pass np.ascontiguousarray(...)"
            raise OperandError(f"{where} has strides {got} (elements), expected {spec.strides} on axis "
                               f"{axis}{hint}")
    if spec.writable and not arr.flags.writeable:
        raise OperandError(f"{where} is read-only but the kernel writes it; pass a writable array")


def _dtype_fix(spec, got):
    """How to pass what ``spec`` expects: convert, or (where the kernel family has one) build the
    kernel for ``got``; never a kernel that does not exist (float64, int32 offsets)."""
    want = spec.np_dtype
    module = "ml_dtypes" if spec.dtype == "bf16" else "np"
    fix = f"convert with .astype({module}.{want.name})"
    try:
        short = name_of(got)
    except TypeError:
        short = None
    if spec.dtype_param and short in FLOATS and spec.dtype in FLOATS:
        fix += f", or build the kernel with {spec.dtype_param}={short!r}"
    return fix


def _shape_text(spec):
    return "(count, " + ", ".join(map(str, spec.shape)) + ")" if spec.batch else str(tuple(spec.shape))
