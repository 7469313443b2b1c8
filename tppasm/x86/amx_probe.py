"""Whether this CPU runs the batch-chunked AMX BRGEMM (:mod:`tppasm.x86.amx_chunk`) faster than
the one that walks the whole batch per macro block: timed once per host, then remembered.

The cycle model of ``python -m bench amx-static`` could not decide it: at bf16 64 x 64 x 64 x 16
chunks modelled at 97% of the AMX peak against 79% if the core renames tile registers as it
renames vector ones, and at 54% against 62% if a tile load waits for every earlier reader of its
tile. The first AMX host measured (an Emerald Rapids core) renames tiles, yet ran chunks slower:
a tile load waited for the tile stores before it, which the model has done since (chunks 72%
against 75% renamed). Such timings are properties of each microarchitecture, so where AMX runs
natively the first AMX BRGEMM a process generates with ``TPPASM_AMX_CHUNKS`` unset (or ``auto``)
first times both kernels of that shape (:data:`PROBE`): interleaved rounds, about 20 ms. Chunks
are kept where their median is at least :data:`MARGIN` faster. The verdict goes to the disk cache
(:func:`tppasm.cache.remember`, keyed by the CPU's model and microcode), so later processes on
the host reuse it. ``TPPASM_AMX_CHUNKS=1`` or ``=0`` overrides it; where AMX is interpreted,
chunks stay off unless set.
"""
import os
import sys
import threading
import time

from isa.cpu import host, identity

from .. import cache, forking
from .switch import switch

ENV = "TPPASM_AMX_CHUNKS"
PROBE = dict(m=64, n=64, k=64, dtype="bf16", count=16)    # issue #12's AMX goal shape
MARGIN = 1.03          # chunks win only by this much: within it, the unchunked default stays
ROUNDS, CALLS = 7, 64

_LOCK = threading.Lock()
_verdict = None        # this process's, once decided
forking.guard(sys.modules[__name__], "_LOCK", threading.Lock)


def setting():
    """``TPPASM_AMX_CHUNKS``: "1" (chunks on), "0" (off) or "auto" (unset: the host's verdict).

    >>> os.environ.get(ENV) is not None or setting() == "auto"
    True
    """
    return switch(ENV, "batch chunks on", "off", "timed once on an AMX host, off where AMX is interpreted")


def decide(time_kernel, rounds=ROUNDS):
    """{'chunks', 'speedup'} from ``time_kernel(chunked)`` (seconds for a fixed number of calls
    of the unchunked / chunked kernel), timed in ``rounds`` interleaved rounds; speedup is the
    median ratio unchunked / chunked.

    >>> timings = iter([2.0, 1.0] * 7)         # unchunked, chunked: chunks twice as fast
    >>> decide(lambda chunked: next(timings), rounds=7)
    {'chunks': True, 'speedup': 2.0}
    """
    ratios = sorted(time_kernel(False) / time_kernel(True) for _ in range(rounds))
    speedup = ratios[len(ratios) // 2]
    return {"chunks": speedup >= MARGIN, "speedup": round(speedup, 3)}


def verdict(build):
    """Whether AMX BRGEMMs should use batch chunks on this host (see the module docstring);
    ``build(chunked)`` returns the raw kernel of :data:`PROBE` either way (only called where AMX
    runs natively and no verdict is stored).

    >>> os.environ.get(ENV) is not None or "amx" in host().levels or verdict(None) is False
    True
    """
    global _verdict
    value = setting()
    if value != "auto":
        return value == "1"
    if "amx" not in host().levels:
        return False
    with _LOCK:
        if _verdict is None:
            _verdict = _stored_or_timed(build)
    return _verdict


def _stored_or_timed(build):
    key = f"{identity()} {sorted(PROBE.items())} margin={MARGIN}"
    record = cache.recall("amx", key)
    if not (isinstance(record, dict) and isinstance(record.get("chunks"), bool)):
        record = decide(_native_timer(build))
        cache.remember("amx", key, record)
    return record["chunks"]


def _native_timer(build):
    """time_kernel(chunked) for :func:`decide`: CALLS native calls of the built kernel on fixed
    operands (zeros: the data does not change AMX timing)."""
    import ctypes

    import numpy as np
    m, n, k, count = PROBE["m"], PROBE["n"], PROBE["k"], PROBE["count"]
    a = np.zeros(count * m * k, np.uint16)
    b = np.zeros(count * k * n, np.uint16)
    c = np.zeros(m * n, np.float32)
    kernels = {}
    for chunked in (False, True):
        fn = build(chunked)
        call = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(fn.address)
        kernels[chunked] = (fn, call)       # fn keeps the code mapped

    def time_kernel(chunked):
        call = kernels[chunked][1]
        start = time.perf_counter()
        for _ in range(CALLS):
            call(a.ctypes.data, b.ctypes.data, c.ctypes.data, count)
        return time.perf_counter() - start
    time_kernel(False), time_kernel(True)         # warm both
    return time_kernel


def reset():
    """Forget this process's verdict (tests; a changed ``TPPASM_AMX_CHUNKS`` needs no reset).

    >>> reset()
    """
    global _verdict
    _verdict = None
