"""Shared test helpers: run a kernel's raw code natively or, where the host lacks the ISA, in the
interpreter (isa.x86.interp), on views of poisoned buffers; build kernels at each ISA level the
host runs natively (:func:`kernel_level`, the ``isa_level`` fixture of tests/conftest.py)."""
import contextlib
import os

import numpy as np
import pytest

from isa.cpu import host
from tppasm.eltwise import GRAD_OPS, UNARY_OPS

X86_ISAS = ("avx2", "avx512")


def native(isa):
    """True when this host can execute ``isa`` code directly."""
    return isa in host().levels


def native_levels():
    """The ISA levels this host runs natively, or only ``TPPASM_ISA``'s when it forces one.

    Tests that take the ``isa_level`` fixture run once per level (kernels built inside the test
    target it); the TPP tests parametrize over :data:`X86_ISAS` themselves (:func:`isa_params`).
    """
    return [host().isa] if os.environ.get("TPPASM_ISA", "").strip() else list(host().levels)


@contextlib.contextmanager
def kernel_level(isa):
    """Kernels built inside (``isa=None``, the default) target ``isa`` instead of the host's level."""
    h = host()
    old, h.isa = h.isa, isa
    try:
        yield isa
    finally:
        h.isa = old


_POOLS = {}


def pool_of(n):
    """The process's pool when it has ``n`` threads, else a pool of ``n`` made once (short spins)."""
    from isa.pool import Pool, get_pool
    if n == get_pool().nthreads:
        return get_pool()
    if n not in _POOLS:
        _POOLS[n] = Pool(n, spin_us=5)
    return _POOLS[n]


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


def native_params(isas=X86_ISAS):
    """pytest params for tests that call kernels through their public call (in place, allocating,
    tppasm.testing's checks), which runs natively only: each ISA the host runs, the others skipped
    with the reason (their code is checked in the interpreter by the tests that take
    :func:`isa_params` and call :func:`run_raw`)."""
    return [pytest.param(isa, id=isa) if native(isa) else
            pytest.param(isa, id=isa, marks=pytest.mark.skip(
                reason=f"public calls run natively and this host has no {isa} ({host().best_isa} is its best)"))
            for isa in isas]


def _root(arr):
    root = arr
    while isinstance(root.base, np.ndarray):
        root = root.base
    return root


def run_raw(kernel, arrays, scalars=(), isa=None, interpret=False):
    """Call ``kernel``'s raw code with the data pointers of ``arrays`` and the ``scalars``.

    Natively when possible (and not ``interpret``); otherwise in the interpreter, mapping each
    array's whole underlying buffer (so reads past an operand inside its buffer are possible but
    reads outside fault) and writing the results back. Returns the interpreter's Machine (or None
    when native).
    """
    isa = isa or kernel.isa
    if native(isa) and not interpret:
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


# -- accuracy of the transcendentals (tests/tpp/test_math_accuracy.py, tests/aarch64/test_sve_descriptors.py)
LOG_SPACED = {"reciprocal", "rsqrt", "sqrt"}


def samples(op, lo, hi, count):
    """``count`` fp32 points over [lo, hi]: log-spaced for the ops of LOG_SPACED, else linear."""
    if op in LOG_SPACED:
        return np.exp(np.linspace(np.log(max(lo, 1e-37)), np.log(hi), count)).astype(np.float32)
    return np.linspace(lo, hi, count, dtype=np.float32)


def ulp_errors(op, x, got):
    """|got - op(x)| in fp32 ulps of the reference (float64, rounded to fp32); bwd ops count ulps
    of max(|ref|, 1). NaN where NaN is expected counts 0."""
    f = UNARY_OPS.get(op) or GRAD_OPS[op]
    with np.errstate(all="ignore"):
        ref32 = f(x.astype(np.float64)).astype(np.float32)
    mag = np.abs(ref32)
    if op in GRAD_OPS:
        mag = np.maximum(mag, np.float32(1.0))
    ulp = np.spacing(np.maximum(mag, np.finfo(np.float32).tiny)).astype(np.float64)
    err = np.abs(got.astype(np.float64) - ref32.astype(np.float64)) / ulp
    err[np.isnan(got) & np.isnan(ref32)] = 0
    return err


INF, NAN = np.inf, np.nan
SPECIALS = {     # (x, f(x)) pairs; NaN in gives NaN out everywhere
    "exp": [(0.0, 1.0), (-0.0, 1.0), (INF, INF), (-INF, 0.0), (100.0, INF), (-110.0, 0.0)],
    "sigmoid": [(INF, 1.0), (-INF, 0.0), (0.0, 0.5)],
    "tanh": [(INF, 1.0), (-INF, -1.0), (0.0, 0.0), (-0.0, -0.0), (20.0, 1.0)],
    "gelu": [(INF, INF), (-INF, -0.0), (0.0, 0.0)],
    "gelu_erf": [(INF, INF), (-INF, -0.0), (0.0, 0.0), (-20.0, -0.0)],
    "gelu_bwd": [(INF, 1.0), (-INF, 0.0), (0.0, 0.5)],
    "gelu_erf_bwd": [(INF, 1.0), (-INF, 0.0), (0.0, 0.5)],
    "reciprocal": [(0.0, INF), (-0.0, -INF), (INF, 0.0), (-INF, -0.0), (1e-40, INF), (-1e-40, -INF), (1e-45, INF)],
    # subnormals: 2^-134 (~4.6e-41) and 2^-148 (~2.8e-45) have exact results
    "rsqrt": [(0.0, INF), (INF, 0.0), (-1.0, NAN), (2.0 ** -134, 2.0 ** 67), (2.0 ** -148, 2.0 ** 74), (-1e-40, NAN)],
    "sqrt": [(0.0, 0.0), (INF, INF), (-1.0, NAN)],
}


# -- non-finite inputs (tests/tpp/test_eltwise.py, test_brgemm.py, tests/aarch64/test_sve_descriptors.py)
def sprinkle(rng, x, rate=0.15):
    """x with NaN, -NaN, inf and -inf in random lanes (first, last and tail lanes included)."""
    hit = rng.random(x.shape) < rate
    x[hit] = rng.choice(np.float32([np.nan, -np.nan, np.inf, -np.inf]), hit.sum()).astype(x.dtype)
    return x


def assert_same_non_finite(got, want, what):
    """NaN where the reference has NaN, the same inf where it has inf; finite lanes are left to
    each op's accuracy tests (checked here only for staying finite)."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    bad = (np.isnan(g) != np.isnan(w)) | (np.isinf(w) & (g != w)) | (np.isfinite(w) & ~np.isfinite(g))
    assert not bad.any(), f"{what}: {bad.sum()} lanes differ, e.g. got {g[bad][:4]} want {w[bad][:4]}"


def threads_disagreeing(call, args, rounds=6):
    """Call ``call(*args[t])`` ``rounds`` times in each of ``len(args)`` threads at once; the threads
    whose results differed from the same call made alone first (an empty list when all agree)."""
    import threading
    alone = [np.array(call(*a)) for a in args]
    wrong = []

    def run(t):
        for _ in range(rounds):
            if not np.array_equal(call(*args[t]), alone[t]):
                wrong.append(t)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(len(args))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return wrong
