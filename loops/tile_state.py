"""The AMX tile state of a loop nest, checked when the nest is built.

A ``tile_setup=False`` BRGEMM (:func:`tppasm.brgemm`) runs on the tile configuration its nest's
``init`` loads with :func:`tppasm.tileconfig`, as PARLOOPER's kernels do. Without one an AMX core
raises #UD (the process dies of SIGILL); on another kernel's configuration (other tile shapes) the
sums are silently wrong. So a nest is refused, with the fix named, when its body calls such a kernel
and its ``init`` loads no configuration, or one that kernel does not expect, or when another
tile kernel of the same body would leave a different configuration loaded (a ``tile_setup=True``
BRGEMM of other tile shapes, or a ``block_spmm`` on tiles).
"""
from tppasm.tile_calls import on_tiles
from tppasm.x86.amx import plan
from tppasm.x86.spmm import AmxSpmmGen


def check_tile_state(body, init):
    """TypeError naming the fix unless every ``tile_setup=False`` AMX BRGEMM of the traced ``body``
    finds the configuration that the traced ``init`` loads last.

    >>> import tppasm
    >>> from loops import Loop, kernel
    >>> g = tppasm.brgemm(16, 16, 32, dtype="bf16", tile_setup=False, isa="amx")
    >>> @kernel("a", Loop(0, 2))
    ... def mm(i, A, B, C):
    ...     g(A, B, C)
    >>> import numpy as np
    >>> bf16 = tppasm.dtypes.dtype("bf16")
    >>> A, B, C = np.zeros((1, 16, 32), bf16), np.zeros((1, 16, 16, 2), bf16), np.zeros((16, 16), np.float32)
    >>> mm(A, B, C)
    Traceback (most recent call last):
    ...
    TypeError: brgemm(A, B, C, count=1): a tile_setup=False AMX BRGEMM runs on the tile configuration that its ...
    """
    waiting = [c for c in body.all_calls() if on_tiles(c.kernel) and not c.kernel.desc.tile_setup]
    if not waiting:
        return
    loads = [c for c in init.all_calls() if c.kernel.desc.kind == "amx_tileconfig"]
    if not loads:
        raise TypeError(f"{waiting[0].text}: a tile_setup=False AMX BRGEMM runs on the tile configuration that its "
                        "nest's init loads, and this nest's init loads none; add an init hook that calls "
                        "tppasm.tileconfig(gemm)() (and a fini hook that calls tppasm.tilerelease()()), or build the "
                        "kernel with tile_setup=True")
    loaded = loads[-1].kernel.desc.gemm
    want = _configs(loaded)[:1]          # what tppasm.tileconfig loads: the first region's
    for call in waiting:
        if _configs(call.kernel.desc)[:1] != want:
            raise TypeError(f"{call.text}: this tile_setup=False AMX BRGEMM expects other tile shapes than the "
                            f"configuration the nest's init loads (tppasm.tileconfig of the {loaded.m}x{loaded.n}x"
                            f"{loaded.k} BRGEMM); load tppasm.tileconfig(<this kernel>) instead, or build this kernel "
                            "with tile_setup=True")
    for call in body.all_calls():
        if on_tiles(call.kernel) and call.kernel.desc.tile_setup and _configs(call.kernel.desc) != want:
            raise TypeError(f"{call.text}: a tile_setup=True AMX BRGEMM loads its own tile configuration, which the "
                            "body's tile_setup=False kernels would then run on; build it with tile_setup=False and "
                            "the tile shapes of the others (and one configuration), or build them all with "
                            "tile_setup=True")
        if call.kernel.isa == "amx" and call.kernel.desc.kind == "block_spmm" and AmxSpmmGen.fits(call.kernel.desc):
            raise TypeError(f"{call.text}: this block_spmm runs on AMX tiles and loads its own tile configuration, so "
                            "the body's tile_setup=False BRGEMMs would run on its tile shapes; build those with "
                            "tile_setup=True (they configure themselves), or run the block_spmm in a nest of its own")


def _configs(desc):
    """The tile configurations (64 bytes each) of the regions of ``desc``'s AMX BRGEMM, in order."""
    return [bytes(region[2]) for region in plan(desc).regions()]
