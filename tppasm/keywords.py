"""The constructors' keywords in messages: the fix for a dtype given where an int goes, and the
refusal of keywords a constructor does not take (a field's public name:
:func:`tppasm.display.public_name`).

>>> from tppasm.eltwise import Unary
>>> dtype_hint(Unary("relu", 2, 3), "bfloat16")
"; dtype is a keyword: dtype='bf16'"
"""
import dataclasses

import numpy as np

from . import display
from .dtypes import SPELLINGS, imported, name_of

OUTPUT_DTYPE = {"out_dtype": "c_dtype", "c_dtype": "out_dtype"}    # the two names of an output dtype keyword


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
    does not take; for the other name of its output dtype keyword ``takes``, name ``takes``.

    >>> refuse_keywords("softmax", {"c_dtype": "bf16"})
    Traceback (most recent call last):
    ...
    TypeError: softmax() takes no c_dtype=: its output dtype is out_dtype=; write out_dtype='bf16'
    """
    for name, value in wrong.items():
        if OUTPUT_DTYPE.get(name) == takes:
            raise TypeError(f"{who}() takes no {name}=: its output dtype is {takes}=; write "
                            f"{takes}={display.shown(value)}")
        raise TypeError(f"{who}() got an unexpected keyword argument {name!r}")
