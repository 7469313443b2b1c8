"""The SVE block-sparse x dense kernel (tppasm.sve.spmm) against ``BlockSpmm.reference`` at VL 128,
256 and 512 (and 1024 / 2048 for fixed edge shapes): natively on an SVE host that runs that length,
else under qemu.

Hypothesis draws block sizes (1 to 32, odd ones and tails of the register tile included), n (tails
at every VL), kb, sparsity from 0 (every block column stored) to 1 (an empty block row), beta,
dtype (f32, bf16) and padded leading dimensions. Each case is one block row: its stored blocks sit
at ``[start, end)`` of colidx / values, with entries outside that range set to out-of-range block
columns (the kernel must neither check nor read them). C is NaN where the reference does not write
(beta=0: all of it; beta=1: the padding between n and ldc) and every element of C is checked:
|got - want| <= ATOL_PER_TERM * (terms summed) + RTOL * |want|. Bad index arrays must give an
all-NaN C block.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import tppasm
from isa.aarch64.native import run_calls
from tppasm.spmm import BlockSpmm
from tests.aarch64.marks import vl_params
from tests.aarch64.sve_cases import DescCase, close, same_examples_at_every_vl, view

VLS = (128, 256, 512)
RTOL, ATOL_PER_TERM = 1e-5, 2e-6       # fp32 fused multiply-adds (bf16 products are exact in fp32)
SETTINGS = dict(max_examples=30, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

case = st.fixed_dictionaries({
    "bm": st.sampled_from([1, 2, 3, 5, 7, 8, 10, 13, 16, 32]),
    "bk": st.sampled_from([1, 2, 3, 4, 6, 9, 16, 22, 32]),
    "n": st.sampled_from([1, 3, 4, 7, 8, 15, 16, 17, 31, 33, 64, 65, 100]),
    "kb": st.integers(1, 6),
    "sparsity": st.floats(0.0, 1.0),
    "beta": st.sampled_from([0, 1]),
    "dtype": st.sampled_from(["f32", "bf16"]),
    "pad": st.integers(0, 3),
    "start": st.integers(0, 3),
    "seed": st.integers(0, 2 ** 16)})


def spmm_case(bm, bk, n, kb, sparsity, beta, dtype, pad, start, seed, after=2):
    """One block row as a DescCase: ``start`` unused blocks, then round((1 - sparsity) * kb) stored
    blocks in increasing distinct block columns, then ``after`` unused blocks."""
    bk += bk % 2 if dtype == "bf16" else 0
    desc = BlockSpmm(bm=bm, bk=bk, n=n, kb=kb, ldb=n + pad, ldc=n + (pad + 1) % 4, dtype=dtype, beta=beta)
    stored = int(round((1 - sparsity) * kb))
    count = start + stored + after
    rng = np.random.default_rng(seed)
    cols = np.sort(rng.choice(kb, stored, replace=False))

    def fill(spec, vw, _rng):
        if spec.name == "rowptr":
            vw[...] = [start, start + stored]
        elif spec.name == "colidx":
            vw[...] = rng.choice([-1, kb, kb + 5, -(2 ** 31)], count)     # outside the row: never checked
            vw[start:start + stored] = cols
    return DescCase(desc, seed=seed, count=count, fill=fill, scale=1.0)


def terms(c):
    """Products summed into each element of C (for the tolerance)."""
    rowptr = view(c.bufs[0], c.specs[0], c.count)
    return int(rowptr[1] - rowptr[0]) * c.desc.bk + c.desc.beta


def run_all(cases, bits):
    run_calls([c.call() for c in cases], vl_bits=bits)
    for c in cases:
        (got, want), = c.results()
        bad = close(got, want, RTOL, ATOL_PER_TERM * max(terms(c), 1))
        assert not bad.size, (f"VL {bits}: {c.desc} count={c.count}: {bad.size} elements of C differ, first at "
                              f"flat {bad[0]}: got {got[bad[0]]!r}, expected {want[bad[0]]!r}")


@pytest.mark.parametrize("bits", vl_params(VLS))
@same_examples_at_every_vl
@settings(**SETTINGS)
@given(st.lists(case, min_size=3, max_size=5))
def test_block_spmm(bits, drawn):
    run_all([spmm_case(**s) for s in drawn], bits)


EDGES = [dict(bm=1, bk=1, n=1, kb=1, sparsity=0.0, beta=0, dtype="f32", pad=0, start=0, seed=1),
         dict(bm=32, bk=32, n=70, kb=3, sparsity=0.0, beta=1, dtype="bf16", pad=1, start=2, seed=2),
         dict(bm=19, bk=40, n=129, kb=2, sparsity=0.5, beta=0, dtype="f32", pad=2, start=1, seed=3),
         dict(bm=6, bk=2, n=33, kb=4, sparsity=1.0, beta=1, dtype="bf16", pad=0, start=3, seed=4),
         dict(bm=4, bk=4, n=20, kb=2, sparsity=1.0, beta=0, dtype="f32", pad=0, start=0, seed=5),
         dict(bm=3, bk=5, n=9, kb=5, sparsity=0.0, beta=1, dtype="f32", pad=1100, start=0, seed=6)]  # beyond #imm12


@pytest.mark.parametrize("bits", vl_params(VLS + (1024, 2048)))
def test_block_spmm_edges(bits):
    """A 1x1 block, 32x32 bf16 blocks, a k loop with a rest, empty rows, strides beyond add #imm12."""
    run_all([spmm_case(**e) for e in EDGES], bits)


def corrupt(c, rowptr=None, colidx=None):
    """Overwrite the case's index arrays; C's block must then come back all NaN (padding untouched)."""
    if rowptr is not None:
        c.bufs[0][:2] = rowptr
    if colidx is not None:
        for p, v in colidx.items():
            c.bufs[1][p] = v
    view(c.expected[4], c.specs[4], c.count)[...] = np.nan
    return c


@pytest.mark.parametrize("bits", vl_params(VLS))
def test_bad_indices_poison_c(bits):
    """rowptr decreasing or past count, a negative or too large block column: NaN in every element."""
    base = dict(bm=5, bk=4, n=19, kb=4, sparsity=0.25, beta=1, pad=1, start=1, seed=7)
    cases = [corrupt(spmm_case(dtype="f32", **base), rowptr=[3, 2]),
             corrupt(spmm_case(dtype="bf16", **base), rowptr=[1, 7]),         # count is 1 + 3 + 2 = 6
             corrupt(spmm_case(dtype="f32", **base), rowptr=[-1, 2]),
             corrupt(spmm_case(dtype="f32", **base), colidx={2: -1}),
             corrupt(spmm_case(dtype="bf16", **base), colidx={3: 4})]
    run_all(cases, bits)


def test_public_call_builds_on_sve():
    """``tppasm.block_spmm(..., isa="sve")`` has a generator (f32 fmla, bf16 widening multiply-adds)."""
    assert "fmla" in tppasm.block_spmm(4, 4, 33, 3, isa="sve").disassemble()
    assert "bfmlalt" in tppasm.block_spmm(4, 4, 33, 3, "bf16", beta=1, isa="sve").disassemble()
