"""The gated linear unit of LLaMA's MLP as one TPP: ``out = silu(gate) * up`` (SwiGLU), with
``silu(g) = g * sigmoid(g)``, for (m, n) operands with their own row strides; f32 or bf16 in and
out, computed in fp32. One pass instead of three (sigmoid, mul, mul) over the MLP's widest tensors.

silu is computed as in fp32 (and as torch computes it): ``sigmoid(g) = 1 / (1 + exp(-g))`` is 0
once exp(-g) overflows fp32, for g < -88.7228, so silu(g) is -0.0 there (math: a magnitude
below 3e-37), and silu(g) * up is a signed 0.0 for a finite up and NaN for up = +-inf (math: -+inf);
so is the silu of a gate of fp32's smallest denormals, which rounds to 0. The reference
(:meth:`SwiGLU.reference`, in float64, silu rounded to fp32 before the product) overflows at the
same point, so kernel and reference agree there too.

>>> import numpy as np, tppasm
>>> g, u = np.array([[0.0, 1.0]], np.float32), np.array([[5.0, 2.0]], np.float32); out = np.empty_like(g)
>>> tppasm.swiglu(1, 2)(g, u, out); [round(float(v), 4) for v in out[0]]
[0.0, 1.4621]
"""
from dataclasses import dataclass

import numpy as np

from .eltwise import _default, _dtypes, _full, _ld, _positive, _store, _to_f64
from .kernel import Descriptor, get_kernel
from .keywords import refuse_keywords

FP32_EXP_OVERFLOW = 2.0 ** 128 - 2.0 ** 103      # from here on, exp's value rounds to inf in fp32


@dataclass(frozen=True)
class SwiGLU(Descriptor):
    """out (m, n) = silu(gate) * up; row strides ldg, ldu, ldo."""

    m: int
    n: int
    ldg: int = 0
    ldu: int = 0
    ldo: int = 0
    dtype: str = "f32"
    out_dtype: str = ""

    kind = "swiglu"

    def __post_init__(self):
        self._normalize()
        _default(self, ldg=self.n, ldu=self.n, ldo=self.n, out_dtype=self.dtype)

    def validate(self):
        _positive(self, "m", "n")
        for name in ("ldg", "ldu", "ldo"):
            _ld(self, name, self.n)
        _dtypes(self, "dtype", "out_dtype")

    def operands(self):
        return (_full("gate", self.dtype, self.m, self.n, self.ldg, "ldg"),
                _full("up", self.dtype, self.m, self.n, self.ldu, "ldu"),
                _full("out", self.out_dtype, self.m, self.n, self.ldo, "ldo", writable=True))

    def reference(self, gate, up, out):
        g = _to_f64(gate)
        with np.errstate(all="ignore"):
            e = np.exp(-g)
            e[e >= FP32_EXP_OVERFLOW] = np.inf      # as the kernel's fp32 exp (see the module docstring)
            _store(out, _to_f64(g / (1 + e)) * _to_f64(up))          # silu rounded to fp32 first, as computed


def swiglu(m, n, ldg=0, ldu=0, ldo=0, dtype="f32", out_dtype="", isa=None, **wrong):
    """The kernel (gate, up, out): ``out = silu(gate) * up``, computed in fp32.

    >>> import numpy as np, tppasm
    >>> gate, up = np.array([[-1.0, 2.0]], np.float32), np.full((1, 2), 3.0, np.float32)
    >>> out = np.empty_like(gate); tppasm.swiglu(1, 2)(gate, up, out); [round(float(v), 4) for v in out[0]]
    [-0.8068, 5.2848]
    """
    refuse_keywords("swiglu", wrong)
    return get_kernel(SwiGLU(m, n, ldg, ldu, ldo, dtype, out_dtype), isa)
