"""What a serial nest's fused native entry (the second call onwards: ``loops.decorator._Instance``'s
``_emit_serial_run``) runs with: thread 0 of 1, as the Python launch passes; and what it must not
run at all: a nest calling kernels this host cannot execute keeps refusing on every call."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tppasm as tpp
from isa.cpu import host
from loops import Loop, kernel, thread

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_serial_nest_is_thread_0_on_every_call():
    """A one-slot-per-thread scratch indexed by ``thread().tid``: a tid of 1 wrote past the slot a
    serial nest is given (here a second, poisoned slot stands in for the memory after it)."""
    copy, add = tpp.unary("identity", 1, 8), tpp.binary("add", 1, 8)

    @kernel("ab", Loop(0, 4), Loop(0, 3), scratch=("S",))
    def nest(i, j, X, S, Y):
        copy(X[i, j], S[thread().tid])
        add(S[thread().tid], X[i, j], Y[i, j])
    X = np.arange(4 * 3 * 8, dtype=np.float32).reshape(4, 3, 1, 8)
    for call in range(3):                               # the first call launches from Python
        S = np.full((2, 1, 8), np.nan, np.float32)
        Y = np.full_like(X, np.nan)
        nest(X, S, Y)
        assert np.array_equal(Y, 2 * X), call
        assert np.isnan(S[1]).all(), f"call {call} wrote the slot of thread 1"
        assert (S[0] == X[-1, -1]).all(), call


def _a_level_this_host_lacks():
    return next((isa for isa in ("amx", "avx512") if isa not in host().levels), None)


_LACKING_NEST = """
    import ml_dtypes, numpy as np
    import tppasm as tpp
    from loops import Loop, kernel
    dtype = {dtype!r}
    g = tpp.brgemm(16, 16, 32, dtype=dtype, isa={isa!r})

    @kernel("a", Loop(0, 2))
    def nest(i, A, B, C):
        g(A[i], B[i], C[i])
    np_dtype = ml_dtypes.bfloat16 if dtype == "bf16" else np.float32
    A = np.zeros((2, 1, 16, 32), np_dtype)
    B = np.zeros((2, 1, 16, 16, 2) if dtype == "bf16" else (2, 1, 32, 16), np_dtype)
    C = np.zeros((2, 16, 16), np.float32)
    for call in range(3):
        try:
            nest(A, B, C)
            print("ran")
        except tpp.ISAUnavailableError:
            print("refused")
        print("entry runs the nest:", nest._last.runs_in_entry, flush=True)
"""


@pytest.mark.skipif(_a_level_this_host_lacks() is None, reason="this host runs every x86 level: nothing to refuse")
def test_a_nest_over_kernels_this_host_cannot_run_refuses_every_call():
    """In a subprocess: the fused entry running such a nest dies of SIGILL (on the 2nd call, the
    first through the entry), which would end the test run rather than fail a test."""
    isa = _a_level_this_host_lacks()
    script = textwrap.dedent(_LACKING_NEST.format(isa=isa, dtype="bf16" if isa == "amx" else "f32"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, f"rc {proc.returncode}: {proc.stdout}{proc.stderr[-2000:]}"
    assert proc.stdout.split("\n")[:-1] == ["refused", "entry runs the nest: False"] * 3, proc.stdout
