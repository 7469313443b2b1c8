"""Dynamic int8 quantization TPPs around the i8 BRGEMM (u8 activations x s8 weights, int32 C).

- :class:`Quantize`: per row, ``scale = max(max|x|, 1e-30) / 127`` and ``q = round(x / scale) + 128`` as uint8
  (symmetric values with the zero point 128 that ``vpdpbusd``'s unsigned operand needs; round to
  nearest even), for activations quantized per token at run time. A row holding a NaN gets scale
  NaN, else one holding an infinity gets scale inf, on every backend; that row's codes are then
  unspecified, and dequantizing it gives NaN or inf, never a finite number. The 1e-30 floor keeps
  an all-zero row's scale finite: a row whose values all lie below it in magnitude is quantized in
  steps of 1e-30 / levels(bits) (7.9e-33 for 8 bits), so only its values under half a step get the
  zero point (as all of a zero row's do) and dequantize to 0. ``bits=7`` (``tppasm.quantize(...,
  bits=7)``) takes ``scale = max|x| / 63`` and the zero point 64 instead: codes 1..127, the u7
  activations that ``tppasm.brgemm(..., a_bits=7)`` multiplies exactly with AVX2's ``vpmaddubsw``
  (two products of 127 * 128 fit int16; fbgemm's "reduce_range"). In general ``levels(bits) =
  2**(bits-1) - 1`` steps either side of ``zero_point(bits) = 2**(bits-1)``;
- :class:`Dequant`: ``out = beta*out + (c + offset) * row_scale * col_scale``: an int32 BRGEMM
  result back to f32/bf16, ``offset`` per column (int32; ``-zero_point(bits) * column sums of the s8
  weights``, -128 or -64, removes the zero point; ``c + offset`` wraps in int32, as the BRGEMM's own
  sums do), ``row_scale`` per row (the activations'), ``col_scale`` per column (the weights' per-channel
  scales); ``beta=1`` accumulates (a residual). The kernels multiply the two scales first and round
  that product to fp32, so a result that fits in fp32 never overflows on the way (a row scale of
  1e-30 beside a column scale of 3e38 is fine); but a product below fp32's normal range (2^-126,
  about 1.2e-38) keeps fewer bits or becomes 0, however large c is: 1e-23 * 1e-23 is 0, so
  c = 2e9 gives 0, not 2e-37 (the reference rounds alike; int8 models' scales are far from this).

>>> import numpy as np, tppasm
>>> x = np.array([[0.5, -1.0, 0.25]], np.float32)
>>> q, s = np.empty((1, 3), np.uint8), np.empty(1, np.float32)
>>> tppasm.quantize(1, 3)(x, q, s); q.tolist(), round(float(s[0]) * 127, 6)
([[192, 1, 160]], 1.0)
>>> tppasm.quantize(1, 3, bits=7)(x, q, s); q.tolist(), round(float(s[0]) * 63, 6), zero_point(7)
([[96, 1, 80]], 1.0, 64)
"""
from dataclasses import dataclass

import numpy as np

from .display import shown
from .eltwise import _default, _dtypes, _full, _ld, _positive, _store, _to_f64
from .kernel import Descriptor, get_kernel
from .keywords import refuse_keywords
from .operand import OperandSpec

ZERO_POINT = 128                   # of the default 8-bit codes: zero_point(8)
BITS = (8, 7)                      # quantize's bits=: 8 (codes 1..255) or 7 (codes 1..127, for u7 BRGEMMs)


def levels(bits=8):
    """The code steps from the zero point to max|x|: ``2**(bits-1) - 1`` (127 for 8 bits, 63 for 7).

    >>> levels(8), levels(7)
    (127, 63)
    """
    return (1 << (bits - 1)) - 1


def zero_point(bits=8):
    """The code of 0: ``2**(bits-1)`` (128 for 8 bits, 64 for 7); codes lie in 1..2*zero_point-1.

    >>> zero_point(8), zero_point(7)
    (128, 64)
    """
    return 1 << (bits - 1)


def _check_bits(desc):
    bits = desc.bits
    if not (isinstance(bits, (int, np.integer)) and not isinstance(bits, bool) and bits in BITS):
        raise ValueError(f"{desc.kind}: bits={shown(bits)}; expected 8 (codes 1..255, zero point 128) or 7 (codes "
                         "1..127, zero point 64, for u7 BRGEMMs: tppasm.brgemm(..., a_bits=7))")


@dataclass(frozen=True)
class _Rows(Descriptor):
    """m rows of n in, m rows of n out, with their row strides."""

    m: int
    n: int
    ldi: int = 0
    ldo: int = 0

    def __post_init__(self):
        self._normalize()
        _default(self, ldi=self.n, ldo=self.n)

    def validate(self):
        _positive(self, "m", "n")
        _ld(self, "ldi", self.n)
        _ld(self, "ldo", self.n)


@dataclass(frozen=True)
class Quantize(_Rows):
    """x (m, n) f32/bf16 -> q (m, n) uint8 and scale (m,) f32, per row (see the module); ``bits``: 8
    (codes 1..255, zero point 128) or 7 (codes 1..127, zero point 64)."""

    dtype: str = "f32"
    bits: int = 8

    kind = "quantize"

    def __post_init__(self):
        _check_bits(self)        # (before _normalize, whose "expected an int" for True or "7" names no 7 or 8)
        super().__post_init__()

    def validate(self):
        super().validate()
        _dtypes(self, "dtype")
        _check_bits(self)

    def operands(self):
        return (_full("x", self.dtype, self.m, self.n, self.ldi, "ldx"),
                _full("q", "u8", self.m, self.n, self.ldo, "ldo", writable=True),
                OperandSpec("scale", "f32", (self.m,), (1,), writable=True))

    def reference(self, x, q, scale):
        x32 = _to_f64(x).astype(np.float32)
        amax = np.maximum(np.abs(x32).max(axis=1), np.float32(1e-30))  # NaN and inf propagate
        lv, zp = np.float32(levels(self.bits)), zero_point(self.bits)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = lv / amax                                            # as the kernel: one fp32 division
            scale[...] = amax / lv
            codes = np.rint(x32 * inv[:, None]) + zp
        q[...] = np.clip(np.where(np.isfinite(codes), codes, zp), 0, 2 * zp - 1).astype(np.uint8)  # (unspecified)

    def unspecified(self, x, q, scale):
        """The codes of the rows whose scale is NaN or inf (see the module)."""
        return {"q": np.broadcast_to(~np.isfinite(scale)[:, None], q.shape)}


@dataclass(frozen=True)
class Dequant(_Rows):
    """out (m, n) = beta*out + (c + offset) * (row_scale * col_scale rounded to fp32), c int32 (see the
    module: a scale product below 2^-126 loses precision)."""

    out_dtype: str = "f32"
    beta: int = 0

    kind = "dequant"

    def validate(self):
        super().validate()
        _dtypes(self, "out_dtype")
        if self.beta not in (0, 1):
            raise ValueError(f"dequant: beta={self.beta!r}; expected 0 (overwrite out) or 1 (add to out)")

    def operands(self):
        return (_full("c", "i32", self.m, self.n, self.ldi, "ldx"),
                OperandSpec("offset", "i32", (self.n,), (1,)),
                OperandSpec("row_scale", "f32", (self.m,), (1,)),
                OperandSpec("col_scale", "f32", (self.n,), (1,)),
                _full("out", self.out_dtype, self.m, self.n, self.ldo, "ldo", writable=True))

    def allocated(self):
        """out when the kernel only writes it (beta=0); with beta=1 out is read too, so always passed."""
        return () if self.beta else ("out",)

    def reference(self, c, offset, row_scale, col_scale, out):
        # c + offset wraps in int32, as the kernels' vpaddd / add and the BRGEMM's int32 sums do
        s = (c.astype(np.int64) + offset.astype(np.int64) + 2 ** 31) % 2 ** 32 - 2 ** 31
        v = s.astype(np.float32).astype(np.float64)
        with np.errstate(all="ignore"):          # inf * 0 is NaN, as in the kernels, without a warning
            # the scales' product first, rounded to fp32, as the kernels take it (a product past fp32's
            # range as one value, not as two steps: 1e-30 * 3e38 does not overflow)
            v = v * (_to_f64(row_scale)[:, None] * _to_f64(col_scale)[None, :]).astype(np.float32).astype(np.float64)
            if self.beta:      # the product rounded to fp32 before the add, as the kernels take it
                v = v.astype(np.float32).astype(np.float64) + _to_f64(out)
        _store(out, v)


def quantize(m, n, ldx=0, ldo=0, dtype="f32", bits=8, isa=None, **wrong):
    """The kernel (x, q, scale): per-row dynamic quantization to uint8 (zero point 128); ``ldx``,
    ``ldo``: the row strides of x and q in elements (0: dense; q's is ``ldo``, not ``ldq``).
    ``bits=7``: ``scale = max|x| / 63``, zero point 64, codes 1..127 (for ``tppasm.brgemm(...,
    a_bits=7)``, exact with AVX2's ``vpmaddubsw``); 8 (the default) or 7 only.

    >>> import numpy as np, tppasm
    >>> x = np.zeros((2, 8), np.float32); x[:, :3] = [[1, -2, 0.5], [4, 0, -4]]
    >>> q, scale = tppasm.quantize(2, 3, ldx=8)(x[:, :3])
    >>> q.tolist(), (scale * 127).tolist()
    ([[192, 1, 160], [255, 128, 1]], [2.0, 4.0])
    >>> q, scale = tppasm.quantize(2, 3, ldx=8, bits=7)(x[:, :3])
    >>> q.tolist(), (scale * 63).tolist()
    ([[96, 1, 80], [127, 64, 1]], [2.0, 4.0])
    """
    if wrong:
        refuse_keywords("quantize", wrong, None)     # (an output dtype: fixed)
    return get_kernel(Quantize(m, n, ldx, ldo, dtype, bits), isa)


def dequant(m, n, ldx=0, ldo=0, out_dtype="f32", beta=0, isa=None, **wrong):
    """The kernel (c, offset, row_scale, col_scale, out): int32 -> scaled f32/bf16. ``ldx``, ``ldo``:
    the row strides of c and out in elements (0: dense; c's is ``ldx``, not ``ldc``); ``beta=1`` adds
    to out instead of overwriting it. ``row_scale[i] * col_scale[j]`` is rounded to fp32 first: a
    product below fp32's normal range (2^-126) loses precision (or is 0).

    >>> import numpy as np, tppasm
    >>> c = np.array([[10, 20]], np.int32); out = np.ones((1, 2), np.float32)
    >>> k = tppasm.dequant(1, 2, beta=1)
    >>> k(c, np.array([-10, 0], np.int32), np.array([0.5], np.float32), np.array([1, 2], np.float32), out)
    >>> out.tolist()
    [[1.0, 21.0]]
    """
    if wrong:
        refuse_keywords("dequant", wrong)
    return get_kernel(Dequant(m, n, ldx, ldo, out_dtype, beta), isa)
