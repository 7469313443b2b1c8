"""Element-wise TPP descriptors and their NumPy references: unary, binary, ternary, reductions and
layout transforms.

A 2-D operand is (rows m, cols n) with a row stride in elements (row-major, NumPy's) named after
the operand: ``ldx`` for x (and dy), ``lda``/``ldb``/``ldc`` for a/b/c, ``ldo`` for out (the
descriptors keep the field ``ldi`` for x; ``ldi=`` still works in the constructors, deprecated).
bf16 operands are computed in fp32 (inputs widened exactly, outputs rounded to nearest even);
with a bf16 output the x86 kernels evaluate exp and gelu_erf to 2^-16 relative (~1/128 of the
rounding that follows) in fewer instructions. ``gelu_erf_fast`` is gelu_erf to an absolute error of
2^-22 max(1, |x|) (torch's own GELU's class; x86 evaluates it from tables of polynomials, SVE as
gelu_erf), its reference the exact gelu_erf.
Broadcast operands (``bcast_a``/``bcast_b``) are 1-D: ``"row"`` one row of n values used by every
row, ``"col"`` one value per row (m values), ``"scalar"`` one value (shape (1,)).

>>> import numpy as np
>>> from tppasm.kernel import get_kernel
>>> x = np.array([[-1.0, 2.0]], np.float32); y = np.empty_like(x)
>>> get_kernel(Unary(op="relu", m=1, n=2))(x, y); y.tolist()
[[0.0, 2.0]]
"""
import math
from dataclasses import dataclass

import numpy as np

from .dtypes import dtype as to_dtype
from .display import PUBLIC_NAMES, shown
from .kernel import Descriptor
from .keywords import refuse_keywords
from .operand import OperandSpec

F32 = np.float32
_K0, _K1 = math.sqrt(2 / math.pi), 0.044715


def _phi(x):
    """Standard normal CDF via erfc (no cancellation for x << 0)."""
    return 0.5 * np.vectorize(math.erfc, otypes=[np.float64])(-x / math.sqrt(2))


def _limits(x, y, at_neg, at_pos):
    """y, with GELU's limits where x is -inf / +inf (the float formulas meet inf * 0 there)."""
    return np.where(np.isneginf(x), at_neg, np.where(np.isposinf(x), at_pos, y))


def _gelu_tanh(x):
    with np.errstate(over="ignore", invalid="ignore"):
        return _limits(x, x / (1 + np.exp(-2 * _K0 * (x + _K1 * x ** 3))), -0.0, np.inf)   # = 0.5x(1 + tanh(u))


def _gelu_tanh_grad(x):
    with np.errstate(over="ignore", invalid="ignore"):
        u = _K0 * (x + _K1 * x ** 3)
        t = np.tanh(u)
        return _limits(x, 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _K0 * (1 + 3 * _K1 * x * x), 0.0, 1.0)


def _gelu_erf(x):
    with np.errstate(invalid="ignore"):
        return _limits(x, x * _phi(x), -0.0, np.inf)


def _gelu_erf_grad(x):
    with np.errstate(over="ignore", invalid="ignore"):
        return _limits(x, _phi(x) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi), 0.0, 1.0)


# op -> reference on float64 values (the result is rounded to the output dtype)
UNARY_OPS = {
    "copy": lambda x: x,
    "identity": lambda x: x,
    "zero": None,
    "relu": lambda x: np.maximum(x, 0),
    "negate": lambda x: -x,
    "square": lambda x: x * x,
    "sqrt": np.sqrt,
    "reciprocal": lambda x: 1 / x,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "exp": np.exp,
    "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "gelu": _gelu_tanh,
    "gelu_erf": _gelu_erf,
    "gelu_erf_fast": _gelu_erf,
}
# backward ops take (dy, x): dx = dy * f'(x)
GRAD_OPS = {
    "relu_bwd": lambda x: (~(x <= 0)).astype(np.float64),      # 1 for a NaN x: torch passes its gradient
    "gelu_bwd": _gelu_tanh_grad,
    "gelu_erf_bwd": _gelu_erf_grad,
}

# max and min: NaN wins, and on ties the first operand, as the kernels and torch (max(+0, -0) is +0; NumPy's is -0)
BINARY_OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
              "max": lambda a, b: np.where(a == b, a, np.maximum(a, b)),
              "min": lambda a, b: np.where(a == b, a, np.minimum(a, b))}
TERNARY_OPS = {"muladd": lambda a, b, c: c + a * b}
REDUCE_OPS = {"add": lambda x, axis: x.sum(axis), "max": lambda x, axis: x.max(axis),
              "sumsq": lambda x, axis: (x * x).sum(axis)}
TRANSFORMS = ("transpose", "vnni2", "vnni4", "unvnni2", "unvnni4")
BCASTS = (None, "row", "col", "scalar")
FLOAT_DTYPES = ("f32", "bf16")


def _positive(desc, *names):
    for name in names:
        value = getattr(desc, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{desc.kind}: {name} must be an int >= 1, got {shown(value)}")


def _ld(desc, name, minimum):
    value = getattr(desc, name)
    if not isinstance(value, int) or value < minimum:
        raise ValueError(f"{desc.kind}: {PUBLIC_NAMES.get(name, name)}={value!r} is too small; it must be "
                         f">= {minimum}")


def _unused(desc, name, used, why, instead=""):
    """Refuse a leading dimension the kernel has no use for, unless it is the value ``used`` anyway."""
    value = getattr(desc, name)
    if value != used:
        public = PUBLIC_NAMES.get(name, name)
        raise ValueError(f"{desc.kind}: {public}={value!r} does not apply: {why}; leave {public} out{instead}")


def _unused_broadcast_lds(desc):
    """A broadcast a or b is a 1-D vector: its ``lda``/``ldb`` can only be the default, n."""
    for side in ("a", "b"):
        bcast = getattr(desc, f"bcast_{side}")
        if bcast in ("row", "col", "scalar"):
            _unused(desc, f"ld{side}", desc.n, f"with bcast_{side}={bcast!r}, {side} is 1-D and has no row stride",
                    f", or pass bcast_{side}=None for a full (m, n) {side} whose rows are ld{side} apart")


def _dtypes(desc, *names, allowed=FLOAT_DTYPES):
    for name in names:
        value = getattr(desc, name)
        if value not in allowed:
            raise ValueError(f"{desc.kind}: {name}={shown(value)}; expected one of {', '.join(allowed)}")


def _default(desc, **values):
    for name, value in values.items():
        if not getattr(desc, name):
            object.__setattr__(desc, name, value)


def _to_f64(x):
    return np.asarray(x).astype(F32).astype(np.float64)


def _store(out, values):
    with np.errstate(all="ignore"):
        out[...] = np.asarray(values).astype(F32).astype(out.dtype)


def _full(name, dt, m, n, ld, ld_name, writable=False, dtype_param=""):
    return OperandSpec(name, dt, (m, n), (ld, 1), writable=writable, ld_name=ld_name, dtype_param=dtype_param)


def _bspec(name, dt, bcast, m, n, ld, ld_name):
    if bcast is None:
        return _full(name, dt, m, n, ld, ld_name, dtype_param="dtype")
    length = {"row": n, "col": m, "scalar": 1}[bcast]
    return OperandSpec(name, dt, (length,), (1,), dtype_param="dtype")


def _bview(x, bcast):
    """A broadcast operand as a 2-D-broadcastable float64 array."""
    x = _to_f64(x)
    if bcast == "row":
        return x[None, :]
    if bcast == "col":
        return x[:, None]
    return x[0] if bcast == "scalar" else x


@dataclass(frozen=True)
class Unary(Descriptor):
    """out[m, n] = op(x[m, n]); ``*_bwd`` ops take (dy, x) and give dy * op'(x).

    ``bitmask=True`` with relu adds an output ``mask`` (m, ceil(n/8)) uint8, bit j%8 of byte j//8
    set where x > 0 or x is NaN (not x <= 0: torch's relu backward passes the gradient of a NaN);
    with relu_bwd the mask replaces x as input.
    """

    op: str
    m: int
    n: int
    ldi: int = 0
    ldo: int = 0
    dtype: str = "f32"
    out_dtype: str = ""
    bitmask: bool = False

    kind = "unary"
    public_names = PUBLIC_NAMES

    def __post_init__(self):
        self._normalize()
        _default(self, ldi=self.n, ldo=self.n, out_dtype=self.dtype)

    def validate(self):
        if self.op not in UNARY_OPS and self.op not in GRAD_OPS:
            raise ValueError(f"unary op {shown(self.op)} is not one of {', '.join([*UNARY_OPS, *GRAD_OPS])}")
        _positive(self, "m", "n")
        _ld(self, "ldi", self.n)
        _ld(self, "ldo", self.n)
        _dtypes(self, "dtype", "out_dtype")
        if self.bitmask and self.op not in ("relu", "relu_bwd"):
            raise ValueError(f"unary: bitmask=True is for relu and relu_bwd, not {self.op!r}")

    @property
    def mask_bytes(self):
        return -(-self.n // 8)

    def _mask_spec(self, writable):
        return OperandSpec("mask", "u8", (self.m, self.mask_bytes), (self.mask_bytes, 1), writable=writable)

    def operands(self):
        x = _full("x", self.dtype, self.m, self.n, self.ldi, "ldx", dtype_param="dtype")
        out = _full("out", self.out_dtype, self.m, self.n, self.ldo, "ldo", writable=True, dtype_param="out_dtype")
        if self.op == "zero":
            return (out,)
        if self.op in GRAD_OPS:
            dy = _full("dy", self.dtype, self.m, self.n, self.ldi, "ldx", dtype_param="dtype")
            return (dy, self._mask_spec(False) if self.bitmask else x, out)
        return (x, out, self._mask_spec(True)) if self.bitmask else (x, out)

    def reference(self, *arrays):
        out = arrays[1] if self.bitmask and self.op == "relu" else arrays[-1]
        if self.op == "zero":
            out[...] = 0
            return
        if self.op in GRAD_OPS:
            dy, x = arrays[0], arrays[1]
            if self.bitmask:
                keep = unpack_bits(x, self.n)
                _store(out, np.where(keep, _to_f64(dy), 0.0))
                return
            with np.errstate(all="ignore"):
                if self.op == "relu_bwd":   # dy unless x <= 0 (a NaN x too), else 0 (an inf or NaN dy too), as torch
                    _store(out, np.where(_to_f64(x) <= 0, 0.0, _to_f64(dy)))
                else:
                    _store(out, _to_f64(dy) * GRAD_OPS[self.op](_to_f64(x)))
            return
        x = _to_f64(arrays[0])
        with np.errstate(all="ignore"):
            _store(out, UNARY_OPS[self.op](x))
        if self.bitmask:
            arrays[2][...] = np.packbits(~(x <= 0), axis=1, bitorder="little")


def unpack_bits(mask, n):
    """The (m, n) booleans of a relu bitmask (m, ceil(n/8)) uint8."""
    return np.unpackbits(mask, axis=1, bitorder="little")[:, :n].astype(bool)


def _validate_ab(desc, ops, out_ld):
    """The checks Binary and Ternary share: op, shape, leading dims, dtypes, broadcasts."""
    if desc.op not in ops:
        raise ValueError(f"{desc.kind} op {shown(desc.op)} is not one of {', '.join(ops)}")
    _positive(desc, "m", "n")
    for name in ("lda", "ldb", out_ld):
        _ld(desc, name, desc.n)
    _dtypes(desc, "dtype", "out_dtype")
    for name in ("bcast_a", "bcast_b"):
        if getattr(desc, name) not in BCASTS:
            raise ValueError(f"{desc.kind}: {name}={getattr(desc, name)!r}; expected one of {BCASTS}")


def _ab_operands(desc, out, out_ld):
    """Inputs a and b (each possibly broadcast) and the full, written output ``out``."""
    return (_bspec("a", desc.dtype, desc.bcast_a, desc.m, desc.n, desc.lda, "lda"),
            _bspec("b", desc.dtype, desc.bcast_b, desc.m, desc.n, desc.ldb, "ldb"),
            _full(out, desc.out_dtype, desc.m, desc.n, getattr(desc, out_ld), out_ld, writable=True,
                  dtype_param="out_dtype"))


@dataclass(frozen=True)
class Binary(Descriptor):
    """out = op(a, b), either input possibly broadcast; ``post`` applies a unary op after
    (a fused ``bias + gelu`` is ``Binary("add", m, n, bcast_b="row", post="gelu")``)."""

    op: str
    m: int
    n: int
    lda: int = 0
    ldb: int = 0
    ldo: int = 0
    dtype: str = "f32"
    out_dtype: str = ""
    bcast_a: str = None
    bcast_b: str = None
    post: str = None

    kind = "binary"

    def __post_init__(self):
        self._normalize()
        _default(self, lda=self.n, ldb=self.n, ldo=self.n, out_dtype=self.dtype)

    def validate(self):
        _validate_ab(self, BINARY_OPS, "ldo")
        if self.post is not None and (self.post not in UNARY_OPS or self.post == "zero"):
            posts = ", ".join(op for op in UNARY_OPS if op != "zero")
            raise ValueError(f"binary: post={shown(self.post)}; expected a one-input op to apply to the result: "
                             f"{posts} ('zero' and the *_bwd ops of tppasm.unary take no input or two)")

    def operands(self):
        return _ab_operands(self, "out", "ldo")

    def reference(self, a, b, out):
        with np.errstate(all="ignore"):
            y = BINARY_OPS[self.op](_bview(a, self.bcast_a), _bview(b, self.bcast_b))
            if self.post:
                y = UNARY_OPS[self.post](y.astype(F32).astype(np.float64))
            _store(out, np.broadcast_to(y, out.shape))


@dataclass(frozen=True)
class Ternary(Descriptor):
    """c = c + a * b (muladd), a and/or b possibly broadcast; c is read and written."""

    op: str
    m: int
    n: int
    lda: int = 0
    ldb: int = 0
    ldc: int = 0
    dtype: str = "f32"
    out_dtype: str = ""
    bcast_a: str = None
    bcast_b: str = None

    kind = "ternary"

    def __post_init__(self):
        self._normalize()
        _default(self, lda=self.n, ldb=self.n, ldc=self.n, out_dtype=self.dtype)

    def validate(self):
        _validate_ab(self, TERNARY_OPS, "ldc")

    def allocated(self):
        return ()                     # c is read, then written: the caller always passes it

    def operands(self):
        return _ab_operands(self, "c", "ldc")

    def reference(self, a, b, c):
        with np.errstate(all="ignore"):
            # fp32 FMA: a*b is exact in float64 for fp32 inputs, one rounding at the end
            _store(c, np.broadcast_to(TERNARY_OPS[self.op](_bview(a, self.bcast_a), _bview(b, self.bcast_b),
                                                           _to_f64(c)), c.shape))


@dataclass(frozen=True)
class Reduce(Descriptor):
    """out = op-reduction of x[m, n] over rows (``over="rows"``: out has n values, one per
    column) or over columns (``over="cols"``: m values, one per row). Accumulates in fp32."""

    op: str
    m: int
    n: int
    over: str = "cols"
    ldi: int = 0
    dtype: str = "f32"
    out_dtype: str = ""

    kind = "reduce"
    public_names = PUBLIC_NAMES

    def __post_init__(self):
        self._normalize()
        _default(self, ldi=self.n, out_dtype=self.dtype)

    def validate(self):
        if self.op not in REDUCE_OPS:
            raise ValueError(f"reduce op {shown(self.op)} is not one of {', '.join(REDUCE_OPS)}")
        if self.over not in ("rows", "cols"):
            raise ValueError(f"reduce: over={self.over!r}; expected 'rows' (one value per column) or 'cols'")
        _positive(self, "m", "n")
        _ld(self, "ldi", self.n)
        _dtypes(self, "dtype", "out_dtype")

    def operands(self):
        length = self.n if self.over == "rows" else self.m
        return (_full("x", self.dtype, self.m, self.n, self.ldi, "ldx", dtype_param="dtype"),
                OperandSpec("out", self.out_dtype, (length,), (1,), writable=True, dtype_param="out_dtype"))

    def reference(self, x, out):
        with np.errstate(all="ignore"):
            _store(out, REDUCE_OPS[self.op](_to_f64(x), 0 if self.over == "rows" else 1))


@dataclass(frozen=True)
class Transform(Descriptor):
    """Layout changes, element for element (any dtype):

    - ``transpose``: x (m, n), ld ``ldx`` -> out (n, m), ld ``ldo`` >= m;
    - ``vnni2``/``vnni4``: B (m=k, n) -> (ceil(k/f), n, f), f consecutive rows interleaved, rows
      past k zero (tppasm.layout.vnni_pack; bf16 uses vnni2, int8 vnni4);
    - ``unvnni2``/``unvnni4``: the inverse, (ceil(k/f), n, f) -> (k, n) with ld ``ldo``.
    """

    op: str
    m: int
    n: int
    ldi: int = 0
    ldo: int = 0
    dtype: str = "f32"

    kind = "transform"
    public_names = PUBLIC_NAMES

    def __post_init__(self):
        self._normalize()
        _default(self, ldi=self.n if not self.op.startswith("un") else 0,
                 ldo=self.m if self.op == "transpose" else self.n if self.op.startswith("un") else 0)

    @property
    def factor(self):
        return int(self.op[-1]) if "vnni" in self.op else 1

    def validate(self):
        if self.op not in TRANSFORMS:
            raise ValueError(f"transform op {shown(self.op)} is not one of {', '.join(TRANSFORMS)}")
        _positive(self, "m", "n")
        to_dtype(self.dtype)
        if self.op == "transpose":
            _ld(self, "ldi", self.n)
            _ld(self, "ldo", self.m)
        elif self.op.startswith("vnni"):
            _ld(self, "ldi", self.n)
            _unused(self, "ldo", 0, f"{self.op!r} writes a dense packed out {self._packed_shape()}")
        else:
            _ld(self, "ldo", self.n)
            _unused(self, "ldi", 0, f"{self.op!r} reads a dense packed x {self._packed_shape()}",
                    " (and pass np.ascontiguousarray(x) if yours is a view)")

    def _packed_shape(self):
        return (-(-self.m // self.factor), self.n, self.factor)

    def operands(self):
        m, n, f = self.m, self.n, self.factor
        packed = OperandSpec("x" if self.op.startswith("un") else "out", self.dtype, (-(-m // f), n, f),
                             (n * f, f, 1), writable=not self.op.startswith("un"))
        if self.op == "transpose":
            return (_full("x", self.dtype, m, n, self.ldi, "ldx"),
                    _full("out", self.dtype, n, m, self.ldo, "ldo", writable=True))
        if self.op.startswith("vnni"):
            return (_full("x", self.dtype, m, n, self.ldi, "ldx"), packed)
        return (packed, _full("out", self.dtype, m, n, self.ldo, "ldo", writable=True))

    def reference(self, x, out):
        from .layout import vnni_pack, vnni_unpack
        if self.op == "transpose":
            out[...] = x.T
        elif self.op.startswith("vnni"):
            out[...] = vnni_pack(x, self.factor)
        else:
            out[...] = vnni_unpack(x, self.m)


# -- public constructors (re-exported by tppasm) ------------------------------------------------
def _renamed(who, ldx, ldi):
    """``ldx``, taking the deprecated ``ldi=`` (the old unary/reduce/transform name) if given."""
    if ldi is None:
        return ldx
    import warnings
    warnings.warn(f"{who}(ldi=...) is now ldx=...: every leading dimension is named after its operand "
                  "(ldx for x, lda/ldb/ldc for a/b/c, ldo for out)", DeprecationWarning, stacklevel=3)
    if ldx and ldi and ldx != ldi:                 # (0 for either: the default)
        raise ValueError(f"{who}: ldx={shown(ldx)} and its old name ldi={shown(ldi)} disagree; pass ldx only")
    return ldi or ldx


def unary(op, m, n, ldx=0, ldo=0, dtype="f32", out_dtype="", bitmask=False, isa=None, *, ldi=None, **wrong):
    """The kernel ``out = op(x)`` for (m, n) operands; ``*_bwd`` ops take (dy, x, out).

    Call it as ``k(x, out)``, or ``out = k(x)`` to get a new (64-byte aligned) output (a torch tensor
    when x is one).
    ``ldx``/``ldo``: row strides of x (and dy) and out; dtypes in any spelling (``np.float32``,
    ``"bfloat16"``, ...).

    >>> import numpy as np, tppasm
    >>> k = tppasm.unary("exp", 1, 3); out = np.empty((1, 3), np.float32)
    >>> k(np.zeros((1, 3), np.float32), out); out.tolist()
    [[1.0, 1.0, 1.0]]
    """
    from .kernel import get_kernel
    refuse_keywords("unary", wrong)
    desc = Unary(op, m, n, _renamed("unary", ldx, ldi), ldo, dtype, out_dtype, bitmask)
    if desc.op == "zero":
        _unused(desc, "ldi", desc.n, "op 'zero' reads no x (it only writes out, whose rows are ldo apart)")
    return get_kernel(desc, isa)


def zero(m, n, dtype="f32", ldo=0, isa=None, **wrong):
    """The kernel ``out[...] = 0`` (it takes only ``out``).

    >>> import numpy as np, tppasm
    >>> out = np.ones((2, 2), np.float32); tppasm.zero(2, 2)(out); out.tolist()
    [[0.0, 0.0], [0.0, 0.0]]
    """
    refuse_keywords("zero", wrong, None)
    return unary("zero", m, n, ldo=ldo, dtype=dtype, out_dtype=dtype, isa=isa)


def relu(m, n, ldx=0, ldo=0, dtype="f32", bitmask=False, isa=None, *, ldi=None, **wrong):
    """The kernel ``out = max(x, 0)``; ``bitmask=True`` also writes the x > 0 bits to ``mask``.

    >>> import numpy as np, tppasm
    >>> x = np.array([[-1, 2, -3]], np.float32); out = np.empty_like(x)
    >>> mask = np.empty((1, 1), np.uint8); tppasm.relu(1, 3, bitmask=True)(x, out, mask); mask.tolist()
    [[2]]
    >>> tppasm.relu(1, 3)(x).tolist()          # the allocating form returns a new array
    [[0.0, 2.0, 0.0]]
    """
    refuse_keywords("relu", wrong, None)
    return unary("relu", m, n, _renamed("relu", ldx, ldi), ldo, dtype, dtype, bitmask, isa)


def copy(m, n, ldx=0, ldo=0, dtype="f32", out_dtype="", isa=None, *, ldi=None, **wrong):
    """The kernel ``out = x``, converting fp32 <-> bf16 (round to nearest even) when the dtypes differ.

    >>> import numpy as np, tppasm
    >>> out = np.empty((1, 2), tppasm.dtypes.dtype("bf16"))
    >>> tppasm.copy(1, 2, out_dtype="bfloat16")(np.array([[1.0, 3.0]], np.float32), out); out.astype(np.float32).tolist()
    [[1.0, 3.0]]
    """
    refuse_keywords("copy", wrong)
    return unary("copy", m, n, _renamed("copy", ldx, ldi), ldo, dtype, out_dtype, isa=isa)


def binary(op, m, n, lda=0, ldb=0, ldo=0, dtype="f32", out_dtype="", bcast_a=None, bcast_b=None,
           post=None, isa=None, **wrong):
    """The kernel ``out = op(a, b)`` (then ``post``, a unary op, if given); ``bcast_a``/``bcast_b``
    in None, "row" (n values), "col" (m values), "scalar" (1 value).

    >>> import numpy as np, tppasm
    >>> out = np.empty((2, 2), np.float32)
    >>> a, b = np.array([1, 2], np.float32), np.ones((2, 2), np.float32)
    >>> tppasm.binary("mul", 2, 2, bcast_a="col")(a, b, out); out.tolist()
    [[1.0, 1.0], [2.0, 2.0]]
    """
    from .kernel import get_kernel
    refuse_keywords("binary", wrong)
    desc = Binary(op, m, n, lda, ldb, ldo, dtype, out_dtype, bcast_a, bcast_b, post)
    _unused_broadcast_lds(desc)
    return get_kernel(desc, isa)


def ternary(op, m, n, lda=0, ldb=0, ldc=0, dtype="f32", out_dtype="", bcast_a=None, bcast_b=None, isa=None,
            **wrong):
    """The kernel ``c += a * b`` (op "muladd") with the same broadcasts as :func:`binary`.

    >>> import numpy as np, tppasm
    >>> c = np.ones((1, 2), np.float32)
    >>> a, b = np.array([[1, 2]], np.float32), np.array([3], np.float32)
    >>> tppasm.ternary("muladd", 1, 2, bcast_b="scalar")(a, b, c); c.tolist()
    [[4.0, 7.0]]
    """
    from .kernel import get_kernel
    refuse_keywords("ternary", wrong)
    desc = Ternary(op, m, n, lda, ldb, ldc, dtype, out_dtype, bcast_a, bcast_b)
    _unused_broadcast_lds(desc)
    return get_kernel(desc, isa)


def reduce(op, m, n, over="cols", ldx=0, dtype="f32", out_dtype="", isa=None, *, ldi=None, **wrong):
    """The kernel ``out = reduce_op(x)`` over "cols" (m results) or "rows" (n results); op in
    add, max, sumsq.

    >>> import numpy as np, tppasm
    >>> out = np.empty(3, np.float32)
    >>> tppasm.reduce("max", 2, 3, over="rows")(np.eye(2, 3, dtype=np.float32), out); out.tolist()
    [1.0, 1.0, 0.0]
    """
    from .kernel import get_kernel
    refuse_keywords("reduce", wrong)
    return get_kernel(Reduce(op, m, n, over, _renamed("reduce", ldx, ldi), dtype, out_dtype), isa)


def transform(op, m, n, ldx=0, ldo=0, dtype="f32", isa=None, *, ldi=None, **wrong):
    """The kernel for a layout transform: transpose, vnni2/vnni4 (pack), unvnni2/unvnni4.

    >>> import numpy as np, tppasm
    >>> from tppasm.dtypes import dtype
    >>> b = np.arange(4, dtype=np.float32).reshape(2, 2).astype(dtype("bf16"))
    >>> out = np.empty((1, 2, 2), b.dtype); tppasm.transform("vnni2", 2, 2, dtype="bf16")(b, out)
    >>> out[0].astype(np.float32).tolist()
    [[0.0, 2.0], [1.0, 3.0]]
    """
    from .kernel import get_kernel
    refuse_keywords("transform", wrong, None)
    return get_kernel(Transform(op, m, n, _renamed("transform", ldx, ldi), ldo, dtype), isa)
