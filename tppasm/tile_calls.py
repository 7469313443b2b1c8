"""Python calls of ``tile_setup=False`` AMX BRGEMMs: they configure the tiles themselves.

A ``tile_setup=False`` kernel trusts the tile configuration that its loop nest's ``init`` loaded
(:func:`tppasm.tileconfig`). Called from Python, nothing loaded one (an AMX core raises #UD: the
process dies of SIGILL) or another kernel's is loaded (its tile shapes: sums silently wrong). So
:func:`tppasm.brgemm` returns such a kernel as a :class:`SelfConfiguring` wrapper: a call from Python
runs the same BRGEMM built with ``tile_setup=True``, which loads its configuration where another is
loaded, and a loop body's call (traced, then run by the nest's native code) is the kernel's own.
"""
import functools
from dataclasses import replace

from . import kernel as kernel_module
from .lazy import KernelWrapper, one_wrapper


def on_tiles(kernel):
    """Whether ``kernel`` is an AMX tile BRGEMM (bf16 or int8 at the "amx" level).

    >>> import tppasm
    >>> on_tiles(tppasm.brgemm(16, 16, 32, dtype="bf16", isa="amx")), on_tiles(tppasm.brgemm(16, 16, 32, isa="amx"))
    (True, False)
    """
    return kernel.isa == "amx" and kernel.desc.kind == "brgemm" and kernel.desc.dtype in ("bf16", "i8")


def configuring(kernel):
    """The kernel of ``kernel``'s BRGEMM that loads its own tile configuration (``tile_setup=True``).

    >>> import tppasm
    >>> g = tppasm.brgemm(16, 16, 32, dtype="bf16", tile_setup=False, isa="amx")
    >>> configuring(g).desc.tile_setup, g.desc.tile_setup
    (True, False)
    """
    return kernel_module.get_kernel(replace(kernel.desc, tile_setup=True), kernel.isa)


class SelfConfiguring(KernelWrapper):
    """A ``tile_setup=False`` AMX BRGEMM ``kernel`` whose calls from Python configure the tiles
    first (through :func:`configuring`); in a loop body it is the kernel itself. Its other
    attributes are the kernel's (``desc``, ``raw``, ...: what loop nests and pools run).

    >>> import tppasm
    >>> g = tppasm.brgemm(16, 16, 32, dtype="bf16", tile_setup=False, isa="amx")
    >>> type(g).__mro__[1].__name__, g.kernel.desc.tile_setup, tppasm.tileconfig(g).desc.gemm == g.desc
    ('SelfConfiguring', False, True)
    """

    def __call__(self, *arrays, **named):
        if kernel_module.TRACING:               # a loop body: recorded for the nest, which configures
            return self.kernel(*arrays, **named)
        return self.python_kernel(*arrays, **named)

    @functools.cached_property
    def python_kernel(self):
        """The kernel a call from Python runs: :func:`configuring` of the wrapped one."""
        return configuring(self.kernel)


def self_configuring(kernel):
    """``kernel`` as :class:`SelfConfiguring` where it is a ``tile_setup=False`` AMX tile BRGEMM (one
    wrapper per kernel), else ``kernel`` itself.

    >>> import tppasm
    >>> g = tppasm.brgemm(16, 16, 32, dtype="bf16", isa="amx")
    >>> self_configuring(g) is g
    True
    """
    if not on_tiles(kernel) or kernel.desc.tile_setup:
        return kernel
    return one_wrapper(kernel, SelfConfiguring)
