"""The ``pace`` at which a batch-1 projection streams its weights fastest on this host.

A GEMV (one token through a projection) reads each weight once: its speed is the speed of the
weight stream from memory. ``tppasm.brgemm(..., pace=P)`` makes a kernel's k loop issue its
weight loads at most one k group per P cycles (see :mod:`tppasm.brgemm`); whether that helps,
and which P, depends on the memory system, so :func:`measure` times it: m = 1 BRGEMMs over
the layer's panels of K x 64 weights (32 on AVX2: :func:`~bench.models.llama_weights.panel_columns`),
larger together than the last-level cache, one sweep per pace in turn (interleaved), split
across the pool's threads like the layer's projections. Measured on Zen 4, three runs of 31
rounds over 64 MiB (then the default size): int8 on 1 thread 23.7-25.1 GB/s at
pace 0, 24.7-28.7 at 12; on 2 threads 33.4-50.5 at 0, 34.6-57.1 at 8; bf16 fastest at 0
(25.5-28.1 and 56.5-61.0).

On AMX hosts the choice is also between kernels (:func:`choices`): the AMX tile kernels, which
take no pace (:data:`TILES`), and the AVX-512 ones at each pace. An Emerald Rapids Xeon's tile
kernels decoded a bf16 LLaMA layer at 76% of the read bandwidth on 1 thread, where Zen 4's
AVX-512 kernels read 92%; which one streams faster there is measured, not assumed.

>>> from bench.common import pool_of
>>> pace, rates = best("i8", pool_of(1), paces=(0, 8), mib=2, rounds=1)
>>> pace in rates, list(rates) == choices("i8", (0, 8))
(True, True)
"""
import time

import numpy as np

import tppasm as tpp
from isa.cpu import caches, host
from loops import Loop, kernel
from tppasm.brgemm import A_DTYPE, C_DTYPES, VNNI, Brgemm
from tppasm.x86.brgemm import tile_kernel

from .llama_weights import panel_columns

PACES = (0, 4, 8, 12, 16)
TILES = "tiles"           # the choice of the AMX tile kernels (they take no pace)
K = 2048                  # a panel's rows: the layer's hidden size (its columns: panel_columns())


def stream_kernel(choice, isa=None):
    """``tppasm.brgemm`` keywords of the decoding kernels of ``choice``: None, the host's own
    kernels (AMX tiles where it has them) at pace 0; :data:`TILES`, the AMX tile kernels; an int,
    the vector kernels at that pace (on an AMX host the AVX-512 ones). ``isa``: the host's.

    >>> stream_kernel(8, "amx"), stream_kernel(8, "avx512"), stream_kernel(TILES, "amx"), stream_kernel(None)
    ({'pace': 8, 'isa': 'avx512'}, {'pace': 8}, {}, {})
    >>> stream_kernel(TILES, "avx512")
    Traceback (most recent call last):
    ValueError: pace='tiles' takes AMX tile kernels; this host's are avx512: give an int pace (0 to 64) or None
    """
    isa = isa or host().isa
    if choice is None:
        return {}
    if isinstance(choice, str) and choice == TILES:
        if isa != "amx":
            raise ValueError(f"pace={TILES!r} takes AMX tile kernels; this host's are {isa}: give an int pace "
                             "(0 to 64) or None")
        return {}
    Brgemm(1, 1, 1, pace=choice).validate()
    return {"pace": choice, "isa": "avx512"} if isa == "amx" else {"pace": choice}


def choices(dtype, paces=PACES, isa=None):
    """The decoding kernels :func:`measure` times, as :func:`stream_kernel` choices: on AMX hosts
    the tile kernels and the AVX-512 ones at each of ``paces``; elsewhere ``paces`` where the
    host's kernels follow pace (:func:`follows_pace`), else pace 0 alone.

    >>> choices("bf16", (0, 8), "amx"), choices("i8", (0, 8), "avx512"), choices("i8", (0, 8), "sve")
    (['tiles', 0, 8], [0, 8], [0])
    """
    isa = isa or host().isa
    if isa == "amx":
        return [TILES, *paces]
    return list(paces) if follows_pace(dtype, isa) else [0]


def _operands(dtype, mib):
    """(X, W, Out) of a sweep over ``mib`` MiB of weights (panels of K x the layer's
    :func:`panel_columns`, VNNI-packed)."""
    if dtype not in ("bf16", "i8"):
        raise ValueError(f"stream_pace: dtype={dtype!r}; expected 'bf16' or 'i8'")
    bn = panel_columns()
    size = np.dtype(tpp.dtypes.numpy_dtype(dtype)).itemsize
    panels = max(1, ((mib or default_mib()) << 20) // (K * bn * size))
    f = VNNI[dtype]
    W = tpp.empty((panels, K // f, bn, f), dtype)
    W.view(np.uint8)[...] = 1
    X = tpp.empty((1, 1, K), A_DTYPE[dtype])
    X.view(np.uint8)[...] = 1
    return X, W, tpp.empty((panels, 1, bn), C_DTYPES[dtype][0])


def _run(operands, choice, pool):
    X, W, out = operands
    gemm = tpp.brgemm(1, W.shape[2], K, tpp.dtypes.name_of(W.dtype), **stream_kernel(choice))

    @kernel("A", Loop(0, W.shape[0]), pool=pool)
    def stream(j, X, W, Out):
        gemm(X, W[j:j + 1], Out[j])
    return lambda: stream(X, W, out)


def sweep(dtype, choice, pool, mib=None):
    """(run, bytes): one read of ``mib`` MiB (default :func:`default_mib`) of ``dtype`` ("bf16" or
    "i8") weights through m = 1 BRGEMMs of ``choice`` (:func:`stream_kernel`: a pace, or
    :data:`TILES`), panels split across the pool's threads."""
    operands = _operands(dtype, mib)
    return _run(operands, choice, pool), operands[1].nbytes


def default_mib():
    """Four times the last-level cache, at least 128 MiB: a sweep that the caches cannot hold (at
    twice, 2 threads on Zen 4 read 41 GB/s where 512 MiB gave 31-34: the L3 still held part)."""
    return max(128, 4 * max(c.size for c in caches()) >> 20)


def follows_pace(dtype, isa=None):
    """Whether ``isa``'s (default: this host's) BRGEMM kernels of ``dtype`` follow ``pace``: the
    AVX2 and AVX-512 ones do, AMX tile kernels (bf16, int8) and SVE ones ignore it.

    >>> follows_pace("i8", "avx512"), follows_pace("i8", "amx"), follows_pace("bf16", "sve")
    (True, False, False)
    """
    isa = isa or host().isa
    return isa in ("avx2", "avx512", "amx") and not tile_kernel(dtype, isa)


def measure(dtype, pool, paces=PACES, mib=None, rounds=11):
    """{choice: GB/s}, the median over ``rounds`` interleaved sweeps of ``mib`` MiB of ``dtype``
    ("bf16" or "i8") weights (the same for every choice) through m = 1 BRGEMMs of each of
    :func:`choices` (``paces``; on AMX hosts also the tile kernels)."""
    operands = _operands(dtype, mib)
    paces = choices(dtype, paces)
    runs = {p: _run(operands, p, pool) for p in paces}
    times = {p: [] for p in paces}
    for run in runs.values():
        run()                                             # JIT, and the pages touched once
    for r in range(rounds):
        for p in (paces if r % 2 == 0 else paces[::-1]):
            start = time.perf_counter()
            runs[p]()
            times[p].append(time.perf_counter() - start)
    return {p: operands[1].nbytes / float(np.median(t)) / 1e9 for p, t in times.items()}


def best(dtype, pool, **kw):
    """(the fastest choice, {choice: GB/s}) from :func:`measure` (keyword arguments go to it); of
    equal rates the first of :func:`choices` (the tile kernels, then the lowest pace)."""
    rates = measure(dtype, pool, **kw)
    return max(rates, key=rates.get), rates
