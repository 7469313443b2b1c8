"""Row-wise normalization TPPs and their NumPy references: softmax (with a scale and an additive
mask row), layer norm (gamma, beta) and RMSNorm (gamma).

Each works on the m rows of an (m, n) operand with row stride ``ldi`` (output ``ldo``); inputs and
outputs are f32 or bf16, computed in fp32 (bf16 widened exactly, outputs rounded to nearest even);
``mask``, ``gamma`` and ``beta`` are fp32 vectors of n values shared by every row. The output may
be the input itself (in place).

>>> import numpy as np, tppasm
>>> x = np.array([[0.0, 0.0], [1.0, 3.0]], np.float32); out = np.empty_like(x)
>>> tppasm.softmax(2, 2)(x, out); out[0].tolist()
[0.5, 0.5]
"""
import math
from dataclasses import dataclass

import numpy as np

from .display import shown
from .eltwise import _default, _dtypes, _full, _ld, _positive, _store, _to_f64
from .kernel import Descriptor, get_kernel
from .keywords import refuse_keywords
from .operand import OperandSpec


FLT_MAX = float(np.finfo(np.float32).max)
FLT_NORMAL = float(np.finfo(np.float32).tiny)      # the smallest normal fp32


def _real(desc, name, positive=False):
    """Normalize the float field ``name`` to a Python float; ValueError unless the kernels' fp32
    holds it (finite; and positive: at least the smallest normal fp32, which a flush to zero or
    an underflow cannot turn into 0)."""
    value = getattr(desc, name)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{desc.kind}: {name}={shown(value)}; expected a finite float")
    try:
        value = float(value)
    except OverflowError:              # an int past a float's range (10**400): refused as 1e39 is
        finite = False
    else:
        finite = math.isfinite(value) and abs(value) <= FLT_MAX
    if not finite:
        raise ValueError(f"{desc.kind}: {name}={shown(value)}; expected a finite fp32 value (|{name}| <= "
                         f"{FLT_MAX:.7g}): the kernels compute in fp32")
    if positive and value < FLT_NORMAL:
        raise ValueError(f"{desc.kind}: {name}={value!r}; expected a float >= {FLT_NORMAL:.7g} (fp32's smallest "
                         f"normal; the kernels compute in fp32, where a smaller {name} is 0 or flushed to 0)")
    object.__setattr__(desc, name, value)


MASKS = (None, "row", "full")


def _vector(name, n):
    return OperandSpec(name, "f32", (n,), (1,))


@dataclass(frozen=True)
class _RowOp(Descriptor):
    """The fields and checks the row-wise descriptors share (their own fields follow these)."""

    m: int
    n: int
    ldi: int = 0
    ldo: int = 0
    dtype: str = "f32"
    out_dtype: str = ""

    public_names = {"ldi": "ldx"}          # what the constructors call it (a kernel's repr shows these)

    def _post(self, *floats, positive=()):
        self._normalize()
        for name in floats:
            _real(self, name, positive=name in positive)
        _default(self, ldi=self.n, ldo=self.n, out_dtype=self.dtype)

    def validate(self):
        _positive(self, "m", "n")
        _ld(self, "ldi", self.n)
        _ld(self, "ldo", self.n)
        _dtypes(self, "dtype", "out_dtype")

    def _io(self):
        return (_full("x", self.dtype, self.m, self.n, self.ldi, "ldx"),
                _full("out", self.out_dtype, self.m, self.n, self.ldo, "ldo", writable=True))


@dataclass(frozen=True)
class Softmax(_RowOp):
    """out[i] = softmax(scale * x[i] + mask) over each row. ``mask="row"`` adds one fp32 row of n
    values to every row (0 keeps a column, -inf drops it: a padding mask); ``mask="full"`` adds an
    fp32 (m, n) operand with row stride ``ldm`` (a causal mask). Every row needs one finite value
    after masking, else its output is NaN."""

    scale: float = 1.0
    mask: str = None
    ldm: int = 0

    kind = "softmax"

    def __post_init__(self):
        self._post("scale")
        _default(self, ldm=self.n)

    def validate(self):
        super().validate()
        if self.mask not in MASKS:
            raise ValueError(f"softmax: mask={self.mask!r}; expected None, 'row' (n values for every row) "
                             "or 'full' (an (m, n) array)")
        _ld(self, "ldm", self.n)
        if self.mask != "full" and self.ldm != self.n:
            raise ValueError(f"softmax: ldm={self.ldm} is the row stride of mask='full' and this softmax has "
                             f"mask={self.mask!r}; leave ldm out, or pass mask='full' with an (m, n) mask")

    def operands(self):
        x, out = self._io()
        if self.mask == "full":
            return (x, OperandSpec("mask", "f32", (self.m, self.n), (self.ldm, 1), ld_name="ldm"), out)
        return (x, _vector("mask", self.n), out) if self.mask else (x, out)

    def reference(self, x, *rest):
        out = rest[-1]
        with np.errstate(all="ignore"):                  # the logits rounded to fp32 as the kernels round them
            y = _to_f64(_to_f64(x) * np.float64(np.float32(self.scale)))
            if self.mask:
                y = _to_f64(y + _to_f64(rest[0])[None, :] if self.mask == "row" else y + _to_f64(rest[0]))
            e = np.exp(y - y.max(axis=1, keepdims=True))
            _store(out, e / e.sum(axis=1, keepdims=True))


@dataclass(frozen=True)
class _Norm(_RowOp):
    eps: float = 1e-5

    def __post_init__(self):
        self._post("eps", positive=("eps",))


@dataclass(frozen=True)
class LayerNorm(_Norm):
    """out[i] = (x[i] - mean) / sqrt(var + eps) * gamma + beta, mean and (biased) variance over
    the row; gamma and beta are fp32 (n,)."""

    kind = "layernorm"

    def operands(self):
        x, out = self._io()
        return (x, _vector("gamma", self.n), _vector("beta", self.n), out)

    def reference(self, x, gamma, beta, out):
        x = _to_f64(x)
        with np.errstate(all="ignore"):
            mean = x.mean(axis=1, keepdims=True)
            var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
            _store(out, (x - mean) / np.sqrt(var + self.eps) * _to_f64(gamma) + _to_f64(beta))


@dataclass(frozen=True)
class RMSNorm(_Norm):
    """out[i] = x[i] / sqrt(mean(x[i]**2) + eps) * gamma (LLaMA's RMSNorm); gamma is fp32 (n,)."""

    eps: float = 1e-6

    kind = "rmsnorm"

    def operands(self):
        x, out = self._io()
        return (x, _vector("gamma", self.n), out)

    def reference(self, x, gamma, out):
        x = _to_f64(x)
        with np.errstate(all="ignore"):
            _store(out, x / np.sqrt((x * x).mean(axis=1, keepdims=True) + self.eps) * _to_f64(gamma))


def softmax(m, n, ldx=0, ldo=0, dtype="f32", out_dtype="", scale=1.0, mask=None, ldm=0, isa=None, **wrong):
    """The kernel ``out = softmax(scale * x (+ mask))`` over each of m rows; with a mask it takes
    (x, mask, out): additive fp32 values (0 or -inf), one row of n (``mask="row"``) or (m, n)
    (``mask="full"``, row stride ``ldm``). With a bf16 ``out_dtype`` the x86 kernels take exp to
    2^-16 relative (~1/128 of the rounding that follows) in fewer instructions.

    >>> import numpy as np, tppasm
    >>> x = np.zeros((1, 3), np.float32); out = np.empty_like(x)
    >>> mask = np.array([0, 0, -np.inf], np.float32)
    >>> tppasm.softmax(1, 3, mask="row")(x, mask, out); out.tolist()
    [[0.5, 0.5, 0.0]]
    """
    refuse_keywords("softmax", wrong)
    return get_kernel(Softmax(m, n, ldx, ldo, dtype, out_dtype, scale, mask, ldm), isa)


def layernorm(m, n, ldx=0, ldo=0, dtype="f32", out_dtype="", eps=1e-5, isa=None, **wrong):
    """The kernel ``out = (x - mean) / sqrt(var + eps) * gamma + beta`` per row; it takes
    (x, gamma, beta, out). The sums are fp32, as in torch's fp32 layer norm: a row whose squares
    around the mean overflow fp32 (deviations from about 1.8e19, 2^64) gives beta or NaN.

    >>> import numpy as np, tppasm
    >>> x = np.array([[1, 3]], np.float32); out = np.empty_like(x)
    >>> g, b = np.ones(2, np.float32), np.zeros(2, np.float32)
    >>> tppasm.layernorm(1, 2, eps=1e-6)(x, g, b, out); np.round(out, 4).tolist()
    [[-1.0, 1.0]]
    """
    refuse_keywords("layernorm", wrong)
    return get_kernel(LayerNorm(m, n, ldx, ldo, dtype, out_dtype, eps), isa)


def rmsnorm(m, n, ldx=0, ldo=0, dtype="f32", out_dtype="", eps=1e-6, isa=None, **wrong):
    """The kernel ``out = x / sqrt(mean(x**2) + eps) * gamma`` per row; it takes (x, gamma, out).
    The sum of squares is fp32, as in torch's fp32 RMSNorm: a row holding values from about 1.8e19
    (2^64) on overflows it and gives 0 (or NaN where x is infinite).

    >>> import numpy as np, tppasm
    >>> x = np.array([[3, 4]], np.float32); out = np.empty_like(x)
    >>> tppasm.rmsnorm(1, 2, eps=1e-9)(x, np.ones(2, np.float32), out); np.round(out * np.sqrt(12.5), 4).tolist()
    [[3.0, 4.0]]
    """
    refuse_keywords("rmsnorm", wrong)
    return get_kernel(RMSNorm(m, n, ldx, ldo, dtype, out_dtype, eps), isa)
