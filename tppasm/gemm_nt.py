"""``C = A @ B.T``: every row of A dotted with every row of B, both read along k as stored.

A is (m, k) with row stride ``lda``, B is (n, k) with row stride ``ldb`` (``torch.nn.Linear``'s
weight layout: out_features rows of in_features), C is (m, n) with row stride ``ldc``. Where a
BRGEMM wants B as (k, n) rows (or VNNI-packed), which for a weight in this layout means a
transpose first, this kernel streams B once, a few of its rows at a time, each row's vector
multiplied by the vectors of a few rows of A held in registers, and reduces each accumulator
across lanes at the end. That is the product of few rows against a large weight (a decoder's next
token): memory-bound, not bound by broadcasts or a transpose.

dtypes: ``f32``, or ``bf16`` A and B (pairs along k: ``vdpbf16ps`` / ``bfdot`` where the target
has them, else widened exactly to fp32; the dot instructions count denormal inputs and products as
zero) with an ``f32`` or ``bf16`` C (rounded to nearest even once, from the fp32 sum). Sums
accumulate in fp32 in an order of the kernel's choosing. C must not overlap A or B: the kernel
writes C while it still reads them (NumPy's matmul copies an overlapping operand first; this
kernel does not: a call whose C overlaps A or B raises OperandError).

>>> import numpy as np, tppasm
>>> a = np.array([[1, 2, 3]], np.float32); b = np.array([[1, 0, 0], [1, 1, 1]], np.float32)
>>> tppasm.gemm_nt(1, 2, 3)(a, b).tolist()
[[1.0, 6.0]]
"""
from dataclasses import dataclass

import numpy as np

from isa.int_text import int_text

from .dtypes import dtype as to_dtype
from .eltwise import _default, _dtypes, _full, _ld, _positive, _store, _to_f64
from .kernel import Descriptor, get_kernel
from .keywords import refuse_keywords

C_DTYPES = {"f32": ("f32",), "bf16": ("f32", "bf16")}
MAX_ROW_BYTES = 1 << 26     # row strides the generated code reaches by displacements (< 2 GiB)


def _long_row_error(name, ld, width, size, itemsize):
    """The message for a row stride ``name``=``ld`` past :data:`MAX_ROW_BYTES`: a dense row (``ld`` is
    the ``width`` dimension of ``size`` items) is cut by splitting that dimension, a padded one by a copy."""
    limit = MAX_ROW_BYTES // itemsize
    if ld > size and size <= limit:             # (a dense copy's rows would fit)
        return (f"gemm_nt: {name}={int_text(ld)} spans more than {MAX_ROW_BYTES >> 20} MiB per row; call it on a copy "
                "with dense rows")
    fix = ("split k into chunks of at most {limit} and add the products (or use tpp.brgemm, whose k has no such "
           "limit)" if width == "k" else "split n into column blocks of at most {limit}, a call each")
    return (f"gemm_nt: {width}={int_text(size)} makes each row of {'A and B' if width == 'k' else 'C'} span more than "
            f"{MAX_ROW_BYTES >> 20} MiB; {fix.format(limit=limit)}")


@dataclass(frozen=True)
class GemmNT(Descriptor):
    """C (m, n) = A (m, k) @ B (n, k).T; row strides lda, ldb, ldc (0: dense)."""

    m: int
    n: int
    k: int
    lda: int = 0
    ldb: int = 0
    ldc: int = 0
    dtype: str = "f32"
    c_dtype: str = ""

    kind = "gemm_nt"

    def __post_init__(self):
        self._normalize()
        _default(self, lda=self.k, ldb=self.k, ldc=self.n, c_dtype="f32")

    def validate(self):
        _positive(self, "m", "n", "k")
        for name, least in (("lda", self.k), ("ldb", self.k), ("ldc", self.n)):
            _ld(self, name, least)
        _dtypes(self, "dtype")
        if self.c_dtype not in C_DTYPES[self.dtype]:
            raise ValueError(f"gemm_nt: c_dtype={self.c_dtype!r}; expected "
                             f"{' or '.join(map(repr, C_DTYPES[self.dtype]))} for dtype={self.dtype!r}")
        for name, dt, width in (("lda", self.dtype, "k"), ("ldb", self.dtype, "k"), ("ldc", self.c_dtype, "n")):
            size = to_dtype(dt).itemsize
            if getattr(self, name) * size > MAX_ROW_BYTES:
                raise ValueError(_long_row_error(name, getattr(self, name), width, getattr(self, width), size))

    def operands(self):
        return (_full("a", self.dtype, self.m, self.k, self.lda, "lda", dtype_param="dtype"),
                _full("b", self.dtype, self.n, self.k, self.ldb, "ldb", dtype_param="dtype"),
                _full("c", self.c_dtype, self.m, self.n, self.ldc, "ldc", writable=True, dtype_param="c_dtype"))

    def work(self):
        return 2 * self.m * self.n * self.k + super().work()

    def reference(self, a, b, c):
        with np.errstate(all="ignore"):
            _store(c, _to_f64(a) @ _to_f64(b).T)


def gemm_nt(m, n, k, lda=0, ldb=0, ldc=0, dtype="f32", c_dtype="", isa=None, **wrong):
    """The kernel (a, b, c): ``c = a @ b.T`` for a (m, k), b (n, k), c (m, n); ``kernel(a, b)``
    allocates and returns c.

    ``lda``, ``ldb``, ``ldc``: the row strides of a, b and c in elements (0: dense, k, k and n); b is
    (n, k) as stored, ``torch.nn.Linear``'s weight layout. ``dtype``: "f32", or "bf16" a and b (pairs
    along k: ``vdpbf16ps`` / ``bfdot`` where the target has them, else widened exactly to fp32);
    ``c_dtype``: "f32" (the default) or, with bf16, "bf16" (rounded to nearest even once, from the
    fp32 sum). Sums accumulate in fp32 in an order of the kernel's choosing. c must not overlap a or
    b (OperandError). ``isa``: the ISA level to generate for (None: the host's).

    >>> import numpy as np
    >>> w = np.ones((5, 4), np.float32); x = np.arange(8, dtype=np.float32).reshape(2, 4)
    >>> gemm_nt(2, 5, 4)(x, w)[:, 0].tolist()
    [6.0, 22.0]
    """
    refuse_keywords("gemm_nt", wrong, "c_dtype")
    return get_kernel(GemmNT(m, n, k, lda, ldb, ldc, dtype, c_dtype), isa)
