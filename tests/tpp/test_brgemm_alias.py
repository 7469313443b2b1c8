"""BRGEMM with rows a multiple of 4 KiB apart (``lda`` = 1024 fp32, 2048 bf16, 4096 int8; ``ldb``
likewise): such rows share one L1 set, so a register tile keeps at most
:data:`tppasm.x86.blocking.ALIASED_ROWS` of them (its A broadcasts), and B lines that would crowd one
set get no prefetch into L1 (:meth:`tppasm.x86.brgemm.Gen.near_distance`). The structure of the
generated code, then its results against the NumPy reference (poisoned C, the interpreter faulting
on any read past an operand) over aliasing leading dimensions."""
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tppasm.brgemm import Brgemm
from tppasm.x86.blocking import ALIASED_ROWS, plan, rows_per_set
from tppasm.x86.brgemm import Gen, generate_brgemm, target_features
from tests.support import native
from tests.tpp.test_brgemm import _params, _round_trip

ES = {"f32": 4, "bf16": 2, "i8": 1}
# (isa, dtype, features): every inner product of the AVX2 and AVX-512 kernels
VARIANTS = [("avx2", "f32", ()), ("avx2", "bf16", ()), ("avx2", "i8", ()), ("avx2", "i8", ("avx_vnni",)),
            ("avx512", "f32", ()), ("avx512", "bf16", ()), ("avx512", "bf16", ("avx512_bf16",)),
            ("avx512", "i8", ()), ("avx512", "i8", ("avx512_vnni",))]


def _a_rows(desc, isa, features):
    """The A rows (of the first row tile) that the kernel reads: the displacements from the A
    pointer, over the row stride, of every access but the prefetches (of the next row tile)."""
    gen = Gen(desc, isa, frozenset(features))
    text = gen.build().disassemble()
    row, at = desc.lda * ES[desc.dtype], re.compile(rf"\[{gen.r['a_k']}(?:([+-])([0-9a-f]+)h)?\]")
    return {round(int(disp or "0", 16) * (-1 if sign == "-" else 1) / row)
            for line in text.splitlines() if "prefetch" not in line for sign, disp in at.findall(line)}


@pytest.mark.parametrize("isa, dtype, features", VARIANTS, ids=lambda v: "+".join(v) if isinstance(v, tuple) else v)
@pytest.mark.parametrize("row_bytes", [4096, 8192, 4100])
def test_a_tile_keeps_few_rows_that_share_a_set(isa, dtype, features, row_bytes):
    """A rows 4 KiB (or 8 KiB, or 4 KiB + 4 bytes) apart: at most ALIASED_ROWS rows per tile; one
    line further apart, the same shape keeps its tile (a taller one for fp32)."""
    n = 16 if isa == "avx512" else 8                  # one vector: the model's tallest tiles
    es = ES[dtype]
    lda = row_bytes // es
    aliased = Brgemm(m=64, n=n, k=64, lda=lda, dtype=dtype)
    spread = Brgemm(m=64, n=n, k=64, lda=lda + 64 // es, dtype=dtype)
    assert rows_per_set(lda * es, 16) == 16
    rows = _a_rows(aliased, isa, features)
    assert 1 < len(rows) <= ALIASED_ROWS, (aliased, rows)
    assert len(_a_rows(spread, isa, features)) >= len(rows), spread
    if dtype == "f32":
        assert len(_a_rows(spread, isa, features)) > ALIASED_ROWS, spread


@pytest.mark.parametrize("dtype", ["f32", "bf16", "i8"])
@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_b_rows_sharing_a_set_get_no_l1_prefetch(isa, dtype):
    """B rows 4 KiB apart: each prefetcht0 eight k groups ahead would land in the set of the lines
    in use; one line further apart they are prefetched as before."""
    es = ES[dtype]
    vnni = 4 // es
    aliased = Brgemm(m=64, n=64, k=64, ldb=4096 // es // vnni, dtype=dtype)
    spread = Brgemm(m=64, n=64, k=64, ldb=4096 // es // vnni + 16, dtype=dtype)
    assert "prefetcht0" not in generate_brgemm(aliased, isa, ()).disassemble()
    assert "prefetcht0" in generate_brgemm(spread, isa, ()).disassemble()


@st.composite
def aliasing(draw, dtype, small):
    """Descriptors with A's (and sometimes B's, C's) rows 2, 4 or 8 KiB (+ 0 or 4 bytes) apart and
    more rows than ALIASED_ROWS."""
    es = ES[dtype]
    m = draw(st.integers(8, 24 if small else 48))                 # more than ALIASED_ROWS
    n, k = draw(st.integers(1, 24 if small else 48)), draw(st.integers(1, 40 if small else 96))
    row = draw(st.sampled_from([2048, 4096, 8192]))
    lda = row // es + draw(st.sampled_from([0, 0, 4 // es]))
    vnni = 4 // es
    ldb, ldc = draw(st.sampled_from([n, n, 1024])), draw(st.sampled_from([n, 1024]))   # B rows: 4 bytes a column
    return Brgemm(m=m, n=n, k=k, lda=lda, ldb=ldb, ldc=ldc, dtype=dtype, beta=draw(st.integers(0, 1)),
                  bias=dtype != "i8" and draw(st.booleans()), act=draw(st.sampled_from([None, "relu"])),
                  stride_a=m * lda + draw(st.sampled_from([0, 16])), stride_b=-(-k // vnni) * vnni * ldb)


@pytest.mark.parametrize("isa, dtype, features", _params())
@settings(max_examples=10)
@given(data=st.data())
def test_brgemm_aliasing_lds_match_reference(isa, dtype, features, data):
    feats, where = features
    small = not native(isa) or where == "interp"
    desc = data.draw(aliasing(dtype, small))
    desc.validate()
    variant = (tuple(target_features(isa)) if feats is None else feats, where)
    _round_trip(desc, isa, variant, data.draw(st.integers(1, 3)), data.draw(st.integers(0, 2 ** 32 - 1)))


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("m, n, k", [(7, 8, 4096), (8, 8, 1024), (7, 16, 2048), (7, 64, 4096)])
def test_one_tile_of_every_row_is_not_split(isa, m, n, k):
    """A tile of all m <= 8 rows has no next tile whose rows would crowd the set: the plan is the one
    that ignores the aliasing (4 + 3 rows read B twice: avx2 7 x 8 x 4096 took 1.5x as long)."""
    desc = Brgemm(m=m, n=n, k=k, lda=k)
    gen = Gen(desc, isa, frozenset())
    assert gen.plan == plan(desc, gen.v, gen.dot, 0)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("m", [9, 12, 16])
def test_a_tile_of_every_row_past_the_ways_is_split(isa, m):
    """9 to 16 rows 4 KiB apart would fit one AVX-512 tile, but an L1 set holds 8 lines (8 ways, the
    fewest of the parts the model targets: tppasm.x86.blocking.SINGLE_TILE_ROWS, which this does
    not import so as to check its value): fp32 1024 x 16 x 1024 took 729 us with 16 rows in one set,
    409 with 6."""
    ways = 8
    desc = Brgemm(m=m, n=16, k=1024, lda=1024)
    gen = Gen(desc, isa, frozenset())
    assert rows_per_set(4096, gen.plan.rows) <= ways, gen.plan
    assert 1 < len(_a_rows(desc, isa, ())) <= ways
