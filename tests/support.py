"""Shared test helpers: run a kernel's raw code natively or, where the host lacks the ISA, in the
interpreter (isa.x86.interp), on views of poisoned buffers."""
import numpy as np
import pytest

from isa.cpu import host

X86_ISAS = ("avx2", "avx512")


def native(isa):
    """True when this host can execute ``isa`` code directly."""
    return isa in host().levels


def interp_available():
    try:
        import isa.x86.interp  # noqa: F401
        return True
    except ImportError:
        return False


def isa_params(isas=X86_ISAS):
    """pytest params: each ISA runs natively, or in the interpreter, or is skipped with the reason."""
    out = []
    for isa in isas:
        if native(isa):
            out.append(pytest.param(isa, id=isa))
        elif isa != "amx" and interp_available():
            out.append(pytest.param(isa, id=f"{isa}-interp"))
        else:
            out.append(pytest.param(isa, id=isa, marks=pytest.mark.skip(
                reason=f"host has no {isa} ({host().best_isa} is its best) and no interpreter")))
    return out


def _root(arr):
    root = arr
    while isinstance(root.base, np.ndarray):
        root = root.base
    return root


def run_raw(kernel, arrays, scalars=(), isa=None):
    """Call ``kernel``'s raw code with the data pointers of ``arrays`` and the ``scalars``.

    Natively when possible; otherwise in the interpreter, mapping each array's whole underlying
    buffer (so reads past an operand inside its buffer are possible but reads outside fault) and
    writing the results back. Returns the interpreter's Machine (or None when native).
    """
    isa = isa or kernel.isa
    if native(isa):
        kernel._raw(*(a.ctypes.data for a in arrays), *scalars)
        return None
    from isa.x86.interp import Machine
    m = Machine()
    roots, args = [], []
    for a in arrays:
        root = _root(a)
        offset = a.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        addr = next((ad for r, ad in roots if r is root), None)
        if addr is None:
            addr = m.map(root)
            roots.append((root, addr))
        args.append(addr + offset)
    m.call(kernel.raw.code, args=args + [int(s) for s in scalars])
    for root, addr in roots:
        if root.flags.writeable:
            root[...] = m.read(addr, like=root)
    return m


def poisoned(shape, dtype, ld=None, rng=None, fill=np.nan):
    """An array of ``shape`` whose rows are ``ld`` apart inside a NaN-filled buffer."""
    shape = tuple(shape)
    ld = ld or shape[-1]
    buf = np.full(shape[:-1] + (ld,), fill, dtype=np.float32).astype(dtype)
    return buf[..., :shape[-1]]
