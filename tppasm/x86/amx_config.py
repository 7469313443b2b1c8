"""The kernels that load and release the AMX tile configuration for loop nests of
``tile_setup=False`` BRGEMMs (:mod:`tppasm.x86.amx`): ``tppasm.tileconfig(gemm)`` in a nest's
``init``, ``tppasm.tilerelease()`` in its ``fini``.

>>> from tppasm.brgemm import Brgemm
>>> [f.disassemble().count(op) for f, op in ((tileconfig_function(Brgemm(m=16, n=16, k=32, dtype="bf16")), "ldtilecfg"),
...                                          (tilerelease_function(), "tilerelease"))]
[1, 1]
"""
from isa.x86 import Function, rsp

from ..backends import register
from .amx import plan
from .tile_code import write_config


def tileconfig_function(desc):
    """A no-argument function that loads the tile config ``desc``'s ``tile_setup=False`` kernel expects.

    >>> from tppasm.brgemm import Brgemm
    >>> tileconfig_function(Brgemm(m=16, n=16, k=32, dtype="bf16")).disassemble().count("ldtilecfg")
    1
    """
    cfg = plan(desc).regions()[0][2]
    fn = Function("amx_tileconfig", [])
    fn.stack(64)
    write_config(fn.asm, 0, cfg)
    fn.asm.ldtilecfg([rsp])
    return fn.finalize()


def tilerelease_function():
    """A no-argument function that releases the tiles (``tilerelease``).

    >>> tilerelease_function().disassemble().count("tilerelease")
    1
    """
    fn = Function("amx_tilerelease", [])
    fn.asm.tilerelease()
    return fn.finalize()


@register("x86", "amx_tileconfig")
def _generate_tileconfig(desc, isa):
    return tileconfig_function(desc.gemm)


@register("x86", "amx_tilerelease")
def _generate_tilerelease(desc, isa):
    return tilerelease_function()
