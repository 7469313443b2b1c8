"""AMX tile state for loop nests: :func:`tileconfig` loads the tile configuration that the
``tile_setup=False`` BRGEMM kernels of a nest expect (once per thread, in ``init``), and
:func:`tilerelease` releases the tiles (in ``fini``), as PARLOOPER does.

>>> import tppasm
>>> g = tppasm.brgemm(m=16, n=16, k=32, dtype="bf16", tile_setup=False, isa="amx")
>>> tppasm.tileconfig(g).desc.gemm == g.desc
True
"""
from dataclasses import dataclass

from . import display
from .brgemm import Brgemm
from .kernel import Descriptor, get_kernel


@dataclass(frozen=True)
class TileConfig(Descriptor):
    """Load the AMX tile configuration that ``tile_setup=False`` kernels of ``gemm`` expect."""

    gemm: Brgemm
    kind = "amx_tileconfig"

    def operands(self):
        return ()

    def reference(self):
        """Tile state has no NumPy counterpart: nothing to do."""


@dataclass(frozen=True)
class TileRelease(Descriptor):
    """Release the AMX tiles (``tilerelease``)."""

    kind = "amx_tilerelease"

    def operands(self):
        return ()

    def reference(self):
        """Tile state has no NumPy counterpart: nothing to do."""


def tileconfig(gemm):
    """The kernel that configures the AMX tiles for ``tile_setup=False`` kernels of ``gemm`` (a
    :class:`Brgemm` or a kernel built from one); a loop nest calls it once per thread in ``init``
    and :func:`tilerelease` in ``fini``, as PARLOOPER does:

    >>> import tppasm
    >>> g = tppasm.brgemm(m=32, n=32, k=32, dtype="bf16", tile_setup=False, isa="amx")
    >>> tileconfig(g).desc.kind, tilerelease().desc.kind
    ('amx_tileconfig', 'amx_tilerelease')
    """
    desc, isa = getattr(gemm, "desc", gemm), getattr(gemm, "isa", "amx")     # (a descriptor: for any level)
    if not isinstance(desc, Brgemm) or isa != "amx" or desc.dtype not in ("bf16", "i8"):
        why = ("" if not isinstance(desc, Brgemm) else f"its {isa} code uses no tiles, so it needs no tileconfig; "
               if isa != "amx" else f"a {desc.dtype!r} BRGEMM uses no tiles (AMX computes bf16 and int8); ")
        raise TypeError(f"tileconfig(gemm): gemm={display.shown(gemm)}; {why}pass the AMX BRGEMM (tppasm.brgemm(..., "
                        "dtype='bf16' or 'i8', isa='amx', tile_setup=False)) whose tile configuration the nest needs")
    return get_kernel(TileConfig(desc), "amx")


def tilerelease():
    """The kernel that releases the AMX tiles (for a loop nest's ``fini``); built on any host, it runs only where
    AMX does.

    >>> import tppasm
    >>> release = tppasm.tilerelease()
    >>> release.desc.kind, release.isa, release is tppasm.tilerelease()
    ('amx_tilerelease', 'amx', True)
    """
    return get_kernel(TileRelease(), "amx")
