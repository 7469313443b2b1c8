"""The constructors' keywords in messages: the fix for a dtype given where an int goes, and the
refusal of keywords a constructor does not take (a field's public name:
:func:`tppasm.display.public_name`).

>>> from tppasm.eltwise import Unary
>>> dtype_hint(Unary("relu", 2, 3), "bfloat16")
"; dtype is a keyword: dtype='bf16'"
"""
import dataclasses
import difflib
import sys

import numpy as np

from . import display
from .dtypes import SPELLINGS, imported, name_of

OUTPUT_DTYPE = {"out_dtype": "c_dtype", "c_dtype": "out_dtype"}    # the two names of an output dtype keyword

# the fix for a keyword a constructor does not take, where another constructor takes it: (constructor,
# keyword) -> the message's tail, {value} being the value given, shown
_CONVERT = "to convert, call tppasm.copy(..., out_dtype={value}) on its output"
_SAME = {
    "relu": "relu's output has x's dtype=; for another, write tppasm.unary('relu', m, n, ..., out_dtype={value})",
    "zero": "zero writes only out, whose dtype is dtype=; write dtype={value}",
    "transform": "a transform moves elements without converting them (out has x's dtype=); " + _CONVERT,
    "block_spmm": "c is always f32 (dtype= is that of values and b); " + _CONVERT,
    "quantize": "q is always uint8 and scale f32 (dtype= is that of x)",
}
HINTS = {(who, name): tail for who, tail in _SAME.items() for name in ("out_dtype", "c_dtype")}
HINTS["dequant", "dtype"] = "its input c is always int32 and its output dtype is out_dtype=; write out_dtype={value}"
# row strides named as another constructor names them: ldi= (ldx='s old name), ldx= / ldo= where a kind names
# its operands a, b and c
HINTS.update({(who, "ldi"): "ldi= is now ldx= (the input's row stride); write ldx={value}"
              for who in ("quantize", "dequant", "layernorm", "rmsnorm", "softmax", "rotary")})
HINTS.update({(who, "ldx"): "its inputs' row strides are lda= and ldb=; write lda={value} (or ldb=)"
              for who in ("binary", "ternary", "brgemm", "gemm_nt")})
HINTS.update({(who, "ldo"): "the row stride of its output c is ldc=; write ldc={value}"
              for who in ("ternary", "brgemm", "gemm_nt")})
HINTS["zero", "ldx"] = "zero reads nothing: its only operand is out, whose row stride is ldo=; write ldo={value}"
# strides named after the operand (the README's rule), which the row-wise kinds call ldx= and ldo= whatever
# their operands' names
HINTS["quantize", "ldq"] = ("the row stride of q (the output) is ldo= (its strides are ldx= for the input, ldo= for "
                           "the output); write ldo={value}")
HINTS["dequant", "ldc"] = ("the row stride of c (the input) is ldx= (its strides are ldx= for the input, ldo= for "
                          "the output); write ldx={value}")


def dtype_hint(desc, value):
    """The fix for a dtype ``value`` given where an int goes (``tpp.copy(8, 8, "bf16")``: the third
    argument is ldx), naming the dtype keyword ``desc``'s constructor takes; "" when ``value`` is no
    dtype or the constructor takes none."""
    short = SPELLINGS.get(value.strip().lower()) if isinstance(value, str) else None   # (np.dtype('a'): bytes)
    if isinstance(value, (type, np.dtype)) or isinstance(value, imported("torch", "dtype") or ()):
        try:
            short = name_of(value)
        except TypeError:
            pass
    fields = {f.name for f in dataclasses.fields(desc)} if dataclasses.is_dataclass(desc) else set()
    keyword = next((k for k in ("dtype", "out_dtype", "c_dtype") if k in fields), None)
    return f"; {keyword} is a keyword: {keyword}={short!r}" if short and keyword else ""


def refuse_keywords(who, wrong, takes="out_dtype"):
    """Raise TypeError for the keywords ``wrong`` (a dict; none: nothing) that the constructor ``who``
    does not take; for the other name of its output dtype keyword ``takes`` (None: it takes none),
    name ``takes``; for a keyword in :data:`HINTS` (a dtype keyword another constructor takes), name its fix.

    >>> refuse_keywords("softmax", {"c_dtype": "bf16"})
    Traceback (most recent call last):
    ...
    TypeError: softmax() takes no c_dtype=: its output dtype is out_dtype=; write out_dtype='bf16'
    >>> refuse_keywords("dequant", {"dtype": "bf16"})          # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: dequant() takes no dtype=: its input c is always int32 ...; write out_dtype='bf16'
    """
    for name, value in wrong.items():
        hint = HINTS.get((who, name))
        if hint:
            raise TypeError(f"{who}() takes no {name}=: " + hint.format(value=_written(value)))
        if name in OUTPUT_DTYPE and OUTPUT_DTYPE[name] == takes:
            raise TypeError(f"{who}() takes no {name}=: its output dtype is {takes}=; write "
                            f"{takes}={_written(value)}")
        raise TypeError(f"{who}() got an unexpected keyword argument {name!r}{_takes(sys._getframe(1).f_code, name)}")


def _takes(code, name):
    """What the constructor whose ``code`` called :func:`refuse_keywords` takes instead of keyword
    ``name``: its parameters (those before ``**wrong``), the nearest one first where one is near."""
    params = [p for p in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount] if not p.startswith("_")]
    if not params:
        return ""
    near = difflib.get_close_matches(name, params, n=1)
    return (f" (did you mean {near[0]}=?)" if near else "") + f"; it takes {', '.join(params)}"


def _written(value):
    """``value`` as the code to write in a message's fix: a dtype by its tppasm name ('f32' for
    np.float32), anything else as shown."""
    try:
        return repr(name_of(value))
    except (TypeError, ValueError):
        return display.shown(value)
