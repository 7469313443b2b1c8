"""Affine index expressions of traced loop bodies: loop indices and thread coordinates as
:class:`Affine` sums with int coefficients, their comparisons (:class:`Compare`) and the truth of
a comparison in an ``if`` (:class:`Cond`), which the tracer of :mod:`loops.trace` running on this
thread (``thread_state.tracer``) decides, exploring both branches.

>>> i = Affine(((0, 1),), 0, {0: "i"})
>>> 2 * i + 3, (i < 4).test
(2*i + 3, i < 4)
"""
import operator
import threading
from dataclasses import dataclass

import numpy as np

thread_state = threading.local()     # this thread's tracer (and loops.trace's mode and depth)


class TraceError(TypeError):
    """The body does something the tracer cannot compile; the message names the legal alternative.

    >>> import loops
    >>> issubclass(loops.TraceError, TypeError)        # catch it as either
    True
    """


def _comparison(op):
    """An Affine rich comparison: ``i < 3`` is the Cond ``i - 3 < 0``, for an 'if' to test."""
    def compare(self, other):
        return self._cmp(other, op)
    return compare


def _refused(op):
    """A method of :class:`Affine` for ``op``, which no affine offset can use: TraceError naming the fix."""
    def method(self, *args):
        self._not_linear(op)
    return method


class Affine:
    """``const + sum(coef * var)`` over loop indices and thread coordinates (ints only)."""

    __slots__ = ("terms", "const", "names")

    def __init__(self, terms=(), const=0, names=None):
        self.terms = tuple(sorted((v, c) for v, c in terms if c))
        self.const = const
        self.names = names or {}

    @staticmethod
    def of(x, names=None):
        if isinstance(x, Affine):
            return x
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
            raise TraceError(f"cannot combine a loop index with {type(x).__name__} {x!r}; only ints "
                             "(and other indices) can be added, subtracted or multiplied")
        return Affine((), int(x), names)

    @property
    def is_const(self):
        return not self.terms

    def vars(self):
        return {v for v, _ in self.terms}

    def _lin(self, other, sign):
        other = Affine.of(other)
        d = dict(self.terms)
        for v, c in other.terms:
            d[v] = d.get(v, 0) + sign * c
        return Affine(d.items(), self.const + sign * other.const, self.names or other.names)

    def __add__(self, other):
        return self._lin(other, 1)

    __radd__ = __add__

    def __sub__(self, other):
        return self._lin(other, -1)

    def __rsub__(self, other):
        return Affine.of(other, self.names)._lin(self, -1)

    def __neg__(self):
        return Affine(((v, -c) for v, c in self.terms), -self.const, self.names)

    def __pos__(self):
        return self

    def __mul__(self, other):
        if isinstance(other, Affine):
            if other.is_const:
                other = other.const
            elif self.is_const:
                return other * self.const
            else:
                raise TraceError(f"{self} * {other}: a product of two loop indices is not affine; "
                                 "offsets must be linear in the indices (multiply by ints only)")
        k = Affine.of(other).const
        return Affine(((v, c * k) for v, c in self.terms), self.const * k, self.names)

    __rmul__ = __mul__

    def _not_affine(self, op):
        raise TraceError(f"'{op}' on loop index {self} is not compilable: offsets must be affine "
                         "(+, -, * by an int); use a blocked loop (Loop(..., blocks=[...]), letter written "
                         "twice) or a loop step instead of dividing indices or taking their remainder")

    def __floordiv__(self, o):
        self._not_affine("//")

    def __rfloordiv__(self, o):
        self._not_affine("//")

    def __truediv__(self, o):
        self._not_affine("/")

    __rtruediv__ = __truediv__

    def __mod__(self, o):
        self._not_affine("%")

    __rmod__ = __mod__

    def __divmod__(self, o):
        self._not_affine("divmod")

    __rdivmod__ = __divmod__

    def _not_linear(self, op):
        raise TraceError(f"'{op}' on loop index {self} is not compilable: offsets must be affine "
                         "(+, -, * by an int), e.g. X[2 * i + 1]; for a piecewise offset (abs, a mirror) "
                         "branch with an 'if' on the index and write an affine offset in each branch")

    __abs__ = _refused("abs()")
    __pow__ = __rpow__ = _refused("**")
    __lshift__ = __rlshift__ = _refused("<<")
    __rshift__ = __rrshift__ = _refused(">>")
    __and__ = __rand__ = _refused("&")
    __or__ = __ror__ = _refused("|")
    __xor__ = __rxor__ = _refused("^")
    __invert__ = _refused("~")
    __round__ = _refused("round()")
    __floor__, __ceil__, __trunc__ = _refused("math.floor()"), _refused("math.ceil()"), _refused("math.trunc()")

    def __index__(self):
        raise TraceError(f"loop index {self} used as a Python int (range(), list index, int(), shape, ...); "
                         "inside a traced body indices may only index array arguments (A[i, j]), appear "
                         "in affine offsets, or be compared in an 'if'; an array indexed by a loop index "
                         "must be a parameter of the body (not a global, closure variable or "
                         "functools.partial argument): declare it as one and pass it in the call")

    __int__ = __index__

    # NumPy swallows __index__'s error when it indexes an array and converts the index instead:
    # __array__ raises the same TraceError there; __array_ufunc__ = None keeps 3 == i, np.int64(2) * i
    # working (NumPy defers to Affine's reflected operators instead of converting i to an array).
    __array_ufunc__ = None

    def __array__(self, *args, **kwargs):
        self.__index__()

    def __hash__(self):
        raise TraceError(f"loop index {self} cannot be hashed (dict key, set member); compare it in an 'if' instead")

    def __bool__(self):
        raise TraceError(f"loop index {self} used as a truth value; write a comparison, e.g. 'if {self} == 0:'")

    def _cmp(self, other, op):
        if not isinstance(other, (Affine, int, np.integer)) or isinstance(other, (bool, np.bool_)):
            # NotImplemented would make '==' quietly False (a branch that never runs) and '<' a bare TypeError
            raise TraceError(f"cannot compare loop index {self} with {type(other).__name__} {other!r}: "
                             "an 'if' in a body compares indices with ints or other indices "
                             f"(e.g. 'if {self} {op} 2:')")
        return Cond(self - other, op)

    __eq__, __ne__, __lt__, __le__, __gt__, __ge__ = (
        _comparison(op) for op in ("==", "!=", "<", "<=", ">", ">="))

    def evaluate(self, env):
        """Value for ``env`` (var -> int or NumPy array)."""
        out = self.const
        for v, c in self.terms:
            out = out + c * env[v]
        return out

    def magnitude(self, box):
        """A bound on ``|value|`` and on every partial sum while evaluating it over ``box``: whether
        int64 arithmetic (NumPy, the native nest) computes it exactly.

        >>> Affine((("a", -3),), 5).magnitude({"a": (-4, 2)})
        17
        """
        return abs(self.const) + sum(abs(c) * max(abs(box[v][0]), abs(box[v][1])) for v, c in self.terms)

    def bounds(self, box):
        """(min, max) over ``box`` (var -> (lo, hi) inclusive)."""
        lo = hi = self.const
        for v, c in self.terms:
            a, b = box[v]
            lo += min(c * a, c * b)
            hi += max(c * a, c * b)
        return lo, hi

    def __repr__(self):
        parts = []
        for v, c in self.terms:
            name = self.names.get(v, v)
            t = name if abs(c) == 1 else f"{abs(c)}*{name}"
            parts.append(("- " if c < 0 else "+ ") + t if parts else ("-" if c < 0 else "") + t)
        if self.const or not parts:
            parts.append(f"{'- ' if self.const < 0 else '+ '}{abs(self.const)}" if parts else str(self.const))
        return " ".join(parts)


NEGATE = {"==": "!=", "!=": "==", "<": ">=", ">=": "<", ">": "<=", "<=": ">"}
PY_OPS = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal,
          ">": np.greater, ">=": np.greater_equal}


@dataclass(frozen=True)
class Compare:
    """``expr op 0``: one traced decision."""

    expr: Affine
    op: str

    def key(self):
        return (self.expr.terms, self.expr.const, self.op)

    def holds(self, env):
        return PY_OPS[self.op](self.expr.evaluate(env), 0)

    def __repr__(self):
        e = self.expr
        rhs = -e.const
        lhs = Affine(e.terms, 0, e.names) if e.terms else Affine((), e.const)
        return f"{lhs} {self.op} {rhs if e.terms else 0}"


class Cond:
    """A comparison of indices; its truth is decided by the tracer (both branches are explored)."""

    __slots__ = ("test",)

    def __init__(self, expr, op):
        self.test = Compare(expr, op)

    def __bool__(self):
        t = self.test
        if t.expr.is_const:
            return bool(PY_OPS[t.op](t.expr.const, 0))
        return _tracer("an 'if' on loop indices").decide(t)

    def __and__(self, o):
        raise TraceError("combine index comparisons with 'and'/'or'/'not', not '&'/'|'/'~'")

    __or__ = __rand__ = __ror__ = __invert__ = __and__

    # As a Python bool: the tracer's decision for this path, 1 or 0, so `(i == 0) != (j == 0)`,
    # `(i == 0) == True`, `int(i == 0)`, `sum([...])` and `max(...)` hold per iteration (without
    # __eq__ Python would compare the objects' identities: a branch decided once for every iteration).
    def _as_int(self):
        return int(bool(self))

    def _other(self, other):
        if isinstance(other, Cond):
            return other._as_int()
        if isinstance(other, (Affine, bool, int, np.bool_, np.integer)):
            return other
        raise TraceError(f"cannot combine the index comparison '{self.test!r}' with {type(other).__name__} "
                         f"{other!r}: in a body it acts as a Python bool (0 or 1 per iteration) and combines "
                         "with other comparisons, bools and ints only")

    __index__ = __int__ = _as_int

    def __hash__(self):
        return hash(self._as_int())

    def __float__(self):
        return float(self._as_int())


def _cond_op(op):
    """A method of :class:`Cond` applying ``op`` to its value (0 or 1 on this path) and ``other``."""
    def method(self, other):
        return op(self._as_int(), self._other(other))
    return method


def _cond_rop(op):
    def method(self, other):
        return op(self._other(other), self._as_int())
    return method


for _name, _op in (("eq", operator.eq), ("ne", operator.ne), ("lt", operator.lt), ("le", operator.le),
                   ("gt", operator.gt), ("ge", operator.ge), ("add", operator.add), ("sub", operator.sub),
                   ("mul", operator.mul)):
    setattr(Cond, f"__{_name}__", _cond_op(_op))
    if _name in ("add", "sub", "mul"):
        setattr(Cond, f"__r{_name}__", _cond_rop(_op))


def _tracer(what):
    t = getattr(thread_state, "tracer", None)
    if t is None:
        raise TraceError(f"{what} outside a traced loop body")
    return t
