"""Ints in messages: one too long for ``str()`` (past ``sys.get_int_max_str_digits()``, at least 640
digits; converting it raises ValueError) is described by its digit count instead, so that the error
about a huge size can be built at all.

>>> int_text(12), int_text(-10**5000)
('12', '-<an int of 5001 digits>')
"""
import math

BITS = 2000          # ints of more bits than this are described, never converted whole


def int_text(value):
    """``repr(value)`` for an int (a bool: True, False), or its digit count for one too long to convert.

    >>> int_text(True), int_text(2**64), int_text(10**3000)
    ('True', '18446744073709551616', '<an int of 3001 digits>')
    """
    if value.bit_length() <= BITS:
        return repr(value) if type(value) in (bool, int) else int.__repr__(value)
    size = abs(value)
    digits = int(math.log10(size)) + 1           # a float's log10 may be off by one near a power of 10
    digits += (size >= 10 ** digits) - (size < 10 ** (digits - 1))
    return f"{'-' if value < 0 else ''}<an int of {digits} digits>"
