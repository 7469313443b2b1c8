"""Element-wise TPP descriptors and their NumPy references (unary; binary and ternary follow).

A 2-D operand is (rows m, cols n) with a row stride ``ld`` in elements (row-major, NumPy's).

>>> import numpy as np
>>> from tppasm.kernel import get_kernel
>>> x = np.array([[-1.0, 2.0]], np.float32); y = np.empty_like(x)
>>> get_kernel(Unary(op="relu", m=1, n=2))(x, y); y
array([[0., 2.]], dtype=float32)
"""
from dataclasses import dataclass

import numpy as np

from .kernel import Descriptor
from .operand import OperandSpec

UNARY_OPS = {
    "copy": lambda x: x,
    "relu": lambda x: np.maximum(x, 0),
}


@dataclass(frozen=True)
class Unary(Descriptor):
    """out[m, n] = op(in[m, n])."""

    op: str
    m: int
    n: int
    ldi: int = 0
    ldo: int = 0
    dtype: str = "f32"

    kind = "unary"

    def __post_init__(self):
        object.__setattr__(self, "ldi", self.ldi or self.n)
        object.__setattr__(self, "ldo", self.ldo or self.n)

    def validate(self):
        if self.op not in UNARY_OPS:
            raise ValueError(f"unary op {self.op!r} is not one of {', '.join(UNARY_OPS)}")
        if self.m < 1 or self.n < 1:
            raise ValueError(f"m and n must be >= 1, got m={self.m}, n={self.n}")
        if self.ldi < self.n or self.ldo < self.n:
            raise ValueError(f"leading dimensions must be >= n={self.n}: ldi={self.ldi}, ldo={self.ldo}")

    def operands(self):
        return (OperandSpec("x", self.dtype, (self.m, self.n), (self.ldi, 1), ld_name="ldi"),
                OperandSpec("out", self.dtype, (self.m, self.n), (self.ldo, 1), writable=True, ld_name="ldo"))

    def reference(self, x, out):
        out[...] = UNARY_OPS[self.op](x.astype(np.float32)).astype(out.dtype)
