"""int8 BRGEMM with each signedness of A and B: u8 x s8 (vpdpbusd/tdpbusd's), s8 x s8, s8 x u8,
u8 x u8, exact int32 results (wrapping), on every x86 ISA (AVX-512 and AMX in the interpreter)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import tppasm as tpp
from tppasm.brgemm import Brgemm
from tppasm.kernel import Kernel
from tppasm.operand import OperandError
from tests.support import isa_params, native, run_raw

SIGNS = ("us", "ss", "su", "uu")
INT = {"u": np.uint8, "s": np.int8}


def _operands(d, count, rng):
    at, bt = (INT[c] for c in d.signs)
    a = rng.integers(np.iinfo(at).min, np.iinfo(at).max + 1, (count, d.m, d.k)).astype(at)
    b = np.stack([tpp.vnni_pack(rng.integers(np.iinfo(bt).min, np.iinfo(bt).max + 1, (d.k, d.n)).astype(bt), 4)
                  for _ in range(count)])
    c = rng.integers(-1000, 1000, (d.m, d.n)).astype(np.int32)
    return a, np.ascontiguousarray(b), c


def _run(kernel, a, b, c, count):
    if kernel.isa == "amx" and not native("amx"):
        from isa.x86.interp import Machine
        m = Machine()
        pa, pb, pc = m.map(a), m.map(b), m.map(c)
        m.call(kernel.raw.code, args=[pa, pb, pc, count])
        c[...] = m.read(pc, like=c)
    else:
        run_raw(kernel, [a, b, c], [count])


@pytest.mark.parametrize("isa", isa_params(("avx2", "avx512")) + [pytest.param("amx", id="amx-interp")])
@given(st.sampled_from(SIGNS), st.integers(1, 20), st.integers(1, 40), st.integers(1, 10),
       st.integers(1, 3), st.sampled_from([0, 1]), st.integers(0, 2**32 - 1))
def test_every_signedness_is_exact(isa, signs, m, n, groups, count, beta, seed):
    d = Brgemm(m=m, n=n, k=4 * groups, dtype="i8", signs=signs, beta=beta)
    a, b, c = _operands(d, count, np.random.default_rng(seed))
    want = c.copy()
    d.reference(a, b, want, count=count)
    got = c.copy() if beta else np.full_like(c, -12345)
    _run(Kernel(d, isa), a, b, got, count)
    np.testing.assert_array_equal(got, want)


def test_amx_picks_the_matching_dot_product():
    for signs, insn in zip(SIGNS, ("tdpbusd", "tdpbssd", "tdpbsud", "tdpbuud")):
        assert insn in Kernel(Brgemm(m=16, n=16, k=64, dtype="i8", signs=signs), "amx").disassemble()


def test_signs_are_checked():
    with pytest.raises(ValueError, match="signs"):
        tpp.brgemm(m=4, n=4, k=4, dtype="i8", signs="xx")
    with pytest.raises(ValueError, match="signs"):
        tpp.brgemm(m=4, n=4, k=4, dtype="f32", signs="ss")
    g = tpp.brgemm(m=4, n=4, k=4, dtype="i8", signs="ss")
    a = np.zeros((1, 4, 4), np.uint8)                       # signs="ss" wants int8 A
    with pytest.raises(OperandError, match="int8"):
        g(a, np.zeros((1, 1, 4, 4), np.int8), np.zeros((4, 4), np.int32), count=1)
    # the advice is the kernel that takes the array as it is, before a conversion that wraps -1 to 255
    for b_dtype, letter in ((np.uint8, "'u' for b"), (np.int8, None)):
        with pytest.raises(OperandError, match=f"build the kernel with 'u' for a in signs=.*if every value fits"
                           if letter is None else f"build the kernel with {letter} in signs="):
            g(a if letter is None else a.view(np.int8), np.zeros((1, 1, 4, 4), b_dtype), np.zeros((4, 4), np.int32),
              count=1)
