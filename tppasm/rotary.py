"""Rotary position embedding (RoPE, LLaMA's "rotate half" form) as a TPP, with its NumPy reference.

Row i of x (m, n) holds n / head_dim heads of head_dim values; each head's halves x1, x2 (head_dim/2
values each) become ``x1*cos - x2*sin`` and ``x2*cos + x1*sin`` with the row's fp32 tables
``cos[i]``, ``sin[i]`` of head_dim/2 values (row stride ``ldt``, one for both tables: their rows must
be the same number of elements apart). The output may be x itself (the same array, ``ldo == ldx``);
a call whose output overlaps x otherwise raises OperandError.

>>> import numpy as np, tppasm
>>> x = np.array([[1.0, 2.0]], np.float32); out = np.empty_like(x)
>>> cos, sin = np.zeros((1, 1), np.float32), np.ones((1, 1), np.float32)
>>> tppasm.rotary(1, 2, 2)(x, cos, sin, out); out.tolist()
[[-2.0, 1.0]]
"""
import math
from dataclasses import dataclass

import numpy as np

from .display import shown
from .eltwise import _default, _dtypes, _full, _ld, _positive, _store, _to_f64
from .kernel import Descriptor, get_kernel
from .keywords import refuse_keywords
from .layout import as_array
from .operand import OperandSpec


@dataclass(frozen=True)
class Rotary(Descriptor):
    """RoPE over heads of ``head_dim`` (even; n a multiple of it); tables (m, head_dim/2) fp32."""

    m: int
    n: int
    head_dim: int
    ldi: int = 0
    ldo: int = 0
    ldt: int = 0
    dtype: str = "f32"
    out_dtype: str = ""

    kind = "rotary"

    def __post_init__(self):
        self._normalize()
        _default(self, ldi=self.n, ldo=self.n, out_dtype=self.dtype,
                 ldt=self.head_dim // 2 if isinstance(self.head_dim, int) else 0)

    def validate(self):
        _positive(self, "m", "n")
        hd = self.head_dim
        if not isinstance(hd, int) or hd < 2 or hd % 2 or self.n % hd:
            raise ValueError(f"rotary: head_dim={shown(hd)} must be an even int >= 2 that divides n={self.n} "
                             "(n = heads * head_dim)")
        _ld(self, "ldi", self.n)
        _ld(self, "ldo", self.n)
        _ld(self, "ldt", self.head_dim // 2)
        _dtypes(self, "dtype", "out_dtype")

    def operands(self):
        half = self.head_dim // 2
        table = [OperandSpec(name, "f32", (self.m, half), (self.ldt, 1), ld_name="ldt") for name in ("cos", "sin")]
        return (_full("x", self.dtype, self.m, self.n, self.ldi, "ldx"), *table,
                _full("out", self.out_dtype, self.m, self.n, self.ldo, "ldo", writable=True))

    def reference(self, x, cos, sin, out):
        half = self.head_dim // 2
        x = _to_f64(x).reshape(self.m, -1, 2, half)
        c, s = _to_f64(cos)[:, None, :], _to_f64(sin)[:, None, :]
        x1, x2 = x[:, :, 0], x[:, :, 1]
        with np.errstate(all="ignore"):          # inf * 0 is NaN, as in the kernels, without a warning
            y = np.stack([x1 * c - x2 * s, x2 * c + x1 * s], axis=2)
        _store(out, y.reshape(self.m, self.n))


def rotary(m, n, head_dim, ldx=0, ldo=0, ldt=0, dtype="f32", out_dtype="", isa=None, **wrong):
    """The RoPE kernel for m rows of n / head_dim heads; it takes (x, cos, sin, out).

    Each head's halves x1, x2 (head_dim / 2 values each; head_dim even, n a multiple of it) become
    ``x1*cos - x2*sin`` and ``x2*cos + x1*sin`` with row i's fp32 tables ``cos[i]``, ``sin[i]`` (m,
    head_dim / 2; see :func:`rope_tables`). ``ldx``, ``ldo``, ``ldt``: the row strides of x, out and
    the tables in elements (0: dense). cos and sin share ``ldt``, so both need the same row stride: for
    tables with different strides pass ``np.ascontiguousarray`` of each (and ldt=0), or slice both from
    arrays of one width. ``dtype``/``out_dtype``: "f32" or "bf16" (out_dtype left out:
    dtype). out may be x itself (``ldo == ldx``); an out overlapping x otherwise raises OperandError.
    ``isa``: the ISA level to generate for (None: the host's).

    >>> import numpy as np, tppasm
    >>> from tppasm.rotary import rope_tables
    >>> cos, sin = rope_tables(np.arange(2), 4)
    >>> x = np.ones((2, 4), np.float32); out = np.empty_like(x)
    >>> tppasm.rotary(2, 4, 4)(x, cos, sin, out); np.round(out[0], 4).tolist()
    [1.0, 1.0, 1.0, 1.0]
    """
    refuse_keywords("rotary", wrong)
    return get_kernel(Rotary(m, n, head_dim, ldx, ldo, ldt, dtype, out_dtype), isa)


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _finite(number):
    """math.isfinite, False (not OverflowError) for an int past a float's range such as 10**400."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


def rope_tables(positions, head_dim, base=10000.0):
    """fp32 (len(positions), head_dim/2) cos and sin tables: angle p * base**(-2j / head_dim).

    >>> cos, sin = rope_tables([0, 1], 2)
    >>> [round(float(v), 4) for v in (cos[1, 0], sin[1, 0])], cos.dtype.name
    ([0.5403, 0.8415], 'float32')
    """
    pos = as_array(positions, "rope_tables", "positions")  # (a bf16 torch tensor too, which np.asarray refuses)
    given = pos.dtype
    if pos.dtype.name == "bfloat16":
        pos = pos.astype(np.float32)
    if pos.ndim == 1 and pos.dtype == object and all(_is_int(p) for p in pos):
        raise ValueError(f"rope_tables: positions hold ints beyond int64 (e.g. {shown(max(pos, key=abs))}); pass them as "
                         "floats: np.asarray(positions, np.float64)")
    if pos.ndim != 1 or pos.dtype.kind not in "iuf":
        hint = (f"; for positions 0..{int(positions) - 1} pass np.arange({int(positions)})"
                if pos.ndim == 0 and pos.dtype.kind in "iu" and not isinstance(positions, bool) else "")
        raise ValueError(f"rope_tables: positions must be a 1-D sequence of token positions (ints, or floats for "
                         f"scaled positions), e.g. np.arange(seq_len); got {type(positions).__name__} of shape "
                         f"{pos.shape} and dtype {given}{hint}")
    if pos.dtype.kind == "f" and not np.isfinite(pos).all():
        raise ValueError("rope_tables: positions hold NaN or infinities; pass finite token positions")
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"rope_tables: head_dim={head_dim!r}; expected an even int >= 2 (the values of one head, "
                         "rotated in two halves: the tables hold head_dim / 2 angles per position)")
    if isinstance(base, bool) or not isinstance(base, (int, float, np.integer, np.floating)) or \
            not (_finite(base) and base > 0):
        raise ValueError(f"rope_tables: base={shown(base)}; expected a finite number > 0 (10000.0 in most models)")
    inv = float(base) ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = pos.astype(np.float64)[:, None] * inv[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
