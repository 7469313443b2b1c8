"""Environment switches of generated code that are "1", "0" or "auto" (unset: the host decides),
such as ``TPPASM_AMX_CHUNKS`` and ``TPPASM_FAR_PREFETCH``."""
import os

SETTINGS = ("1", "0", "auto")


def switch(name, on, off, auto):
    """The setting of environment variable ``name``: "1", "0" or "auto" (also when unset or empty);
    anything else raises ValueError naming the three, described by ``on``, ``off`` and ``auto``.

    >>> os.environ["DOC_SWITCH"] = " Auto "; switch("DOC_SWITCH", "on", "off", "the host's choice")
    'auto'
    >>> os.environ["DOC_SWITCH"] = "yes"; switch("DOC_SWITCH", "on", "off", "the host's choice")
    Traceback (most recent call last):
    ValueError: DOC_SWITCH='yes': expected 1 (on), 0 (off) or auto (unset: the host's choice)
    >>> del os.environ["DOC_SWITCH"]
    """
    value = os.environ.get(name, "").strip().lower() or "auto"
    if value not in SETTINGS:
        raise ValueError(f"{name}={os.environ[name]!r}: expected 1 ({on}), 0 ({off}) or auto (unset: {auto})")
    return value
