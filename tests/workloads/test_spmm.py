"""The block-sparse x dense TPP (tppasm.block_spmm) and the loop-DSL SpMM (bench.spmm.SpmmNest)
against NumPy: hypothesis over shapes, block sizes (4x4 to 32x32 and odd ones), leading dimensions,
sparsity from 0 (dense) to 1 (empty), beta; every inner-product variant (fp32, bf16 with and without
AVX512-BF16, AVX2 and AVX-512), natively and in the interpreter with operands sized exactly (a read
past one faults); outputs poisoned with NaN. Bad index arrays are refused with an explanation by the
public call and poison C (never a read outside the operands) in the raw kernel."""
import inspect

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import tppasm as tpp
from bench.spmm import SPECS, SpmmNest
from tppasm.operand import OperandError
from tppasm.spmm import BlockSpmm, bcsr, check_bcsr, random_block_sparse
from tppasm.x86.brgemm import target_features
from tppasm.x86.spmm import generate
from isa.cpu import host
from tests.support import interp_available, native

BF16 = tpp.dtypes.dtype("bf16")
# (isa, dtype, features, where): features None = the target's own through the public call
VARIANTS = [("avx2", "f32", None, "native"), ("avx2", "bf16", None, "native"),
            ("avx512", "f32", None, "native"), ("avx512", "bf16", ("avx512_bf16",), "native"),
            ("avx512", "bf16", (), "native"),
            ("avx512", "f32", (), "interp"), ("avx512", "bf16", ("avx512_bf16",), "interp"),
            ("avx512", "bf16", (), "interp"), ("avx2", "bf16", (), "interp")]


def _params():
    out = []
    for isa, dt, feats, where in VARIANTS:
        name = f"{isa}-{where}-{dt}" + ("" if feats is None else "-" + ("+".join(feats) or "noext"))
        runs = native(isa) if where == "native" else interp_available()
        marks = [] if runs else [pytest.mark.skip(reason=f"host cannot run {isa} {where}")]
        if where == "native" and feats and not set(feats) <= target_features(isa):
            marks = [pytest.mark.skip(reason=f"host lacks {feats}")]
        out.append(pytest.param(isa, dt, feats, where, id=name, marks=marks))
    return out


def _exact(arr):
    """A copy of ``arr`` in a buffer of exactly its size (the interpreter maps only that)."""
    buf = np.empty(arr.size, arr.dtype)
    buf[...] = arr.reshape(-1)
    return buf.reshape(arr.shape)


def _case(rng, bm, bk, n, kb, mb, sparsity, dtype, ldb, ldc, beta):
    """Operands for the block rows of a random A: BCSR, B (VNNI for bf16) inside ldb-wide rows,
    C inside ldc-wide rows of NaN (or random for beta=1)."""
    dt = tpp.dtypes.dtype(dtype)
    a = random_block_sparse(mb * bm, kb * bk, bm, bk, sparsity, rng).astype(dt)
    rowptr, colidx, values = bcsr(a, bm, bk)
    b = rng.standard_normal((kb * bk, n)).astype(dt)
    f = 2 if dtype == "bf16" else 1
    bbuf = np.full((kb * bk // f, ldb, f), np.nan, np.float32).astype(dt)
    bbuf[:, :n] = tpp.vnni_pack(b, 2) if f == 2 else b[:, :, None]
    bop = bbuf[:, :n] if f == 2 else bbuf[:, :n, 0]
    cbuf = np.full((mb, bm, ldc), np.nan, np.float32)
    if beta:
        cbuf[..., :n] = rng.standard_normal((mb, bm, n))
    ref = a.astype(np.float64) @ b.astype(np.float64) + (cbuf[..., :n].reshape(mb * bm, n) if beta else 0)
    return (_exact(rowptr), _exact(colidx), _exact(values), bop, cbuf), ref


def _run_row(desc, isa, feats, where, rowptr, colidx, values, b, c, count):
    """One block row through the public call, the raw code natively, or the raw code in the interpreter."""
    if isa == "amx":
        code = generate(desc, "amx")
        if "amx" in host().levels:
            code(*(x.ctypes.data for x in (rowptr, colidx, values, b, c)), count)
            return
        where = "interp"
    elif where == "native" and feats is None:
        tpp.block_spmm(desc.bm, desc.bk, desc.n, desc.kb, desc.dtype, ldb=desc.ldb, ldc=desc.ldc, beta=desc.beta,
                       isa=isa)(rowptr, colidx, values, b, c, count=count)
        return
    else:
        code = generate(desc, isa, feats)
    arrays = (rowptr, colidx, values, b, c)
    if where == "native":
        code(*(x.ctypes.data for x in arrays), count)
        return
    from isa.x86.interp import Machine
    m, roots, args = Machine(), {}, []
    for x in arrays:
        root = x
        while isinstance(root.base, np.ndarray):
            root = root.base
        if id(root) not in roots:
            roots[id(root)] = (root, m.map(root))
        args.append(roots[id(root)][1] + x.ctypes.data - root.ctypes.data)
    m.call(code.code, args=args + [count])
    for root, addr in roots.values():
        if root.flags.writeable:
            root[...] = m.read(addr, like=root)


@pytest.mark.parametrize("isa, dtype, feats, where", _params())
@settings(max_examples=12)
@given(bm=st.sampled_from([1, 3, 4, 8, 16, 32]), bk=st.sampled_from([2, 4, 8, 16, 32, 36]), n=st.integers(1, 80),
       kb=st.integers(1, 4), mb=st.integers(1, 3), sparsity=st.sampled_from([0.0, 0.3, 0.7, 1.0]),
       pads=st.tuples(st.integers(0, 9), st.integers(0, 9)), beta=st.integers(0, 1), seed=st.integers(0, 99))
@example(bm=32, bk=32, n=80, kb=3, mb=2, sparsity=0.0, pads=(3, 5), beta=1, seed=0)   # k loop, masked tail
@example(bm=3, bk=36, n=17, kb=2, mb=3, sparsity=0.3, pads=(0, 0), beta=0, seed=1)    # k loop + remainder
@example(bm=8, bk=4, n=64, kb=4, mb=2, sparsity=1.0, pads=(0, 0), beta=0, seed=2)     # empty: C = 0
def test_block_rows_match_numpy(isa, dtype, feats, where, bm, bk, n, kb, mb, sparsity, pads, beta, seed):
    ldb, ldc = n + pads[0], n + pads[1]
    rng = np.random.default_rng(seed)
    (rowptr, colidx, values, b, cbuf), ref = _case(rng, bm, bk, n, kb, mb, sparsity, dtype, ldb, ldc, beta)
    desc = BlockSpmm(bm=bm, bk=bk, n=n, kb=kb, ldb=ldb, ldc=ldc, dtype=dtype, beta=beta)
    for i in range(mb):
        _run_row(desc, isa, feats, where, rowptr[i:i + 2], colidx, values, b, cbuf[i, :, :n], len(colidx))
    got = cbuf[..., :n].reshape(mb * bm, n)
    assert not np.isnan(got).any(), "an element of C was not written"
    assert np.isnan(cbuf[..., n:]).all(), "the kernel wrote past n"
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.sqrt(kb * bk) * (np.abs(ref).max() + 1))


@pytest.mark.skipif(not interp_available() and "amx" not in host().levels, reason="no AMX and no interpreter")
@settings(max_examples=12)
@given(bm=st.sampled_from([1, 4, 8, 16, 20, 32]), bk=st.sampled_from([2, 4, 8, 16, 32]), tiles=st.integers(1, 5),
       kb=st.integers(1, 3), mb=st.integers(1, 2), sparsity=st.sampled_from([0.0, 0.5, 1.0]),
       pads=st.tuples(st.sampled_from([0, 16]), st.sampled_from([0, 3])), beta=st.integers(0, 1),
       seed=st.integers(0, 99))
@example(bm=32, bk=32, tiles=5, kb=2, mb=2, sparsity=0.0, pads=(16, 3), beta=1, seed=0)   # 2 tile rows, 2+2+1 columns
@example(bm=20, bk=4, tiles=4, kb=3, mb=1, sparsity=0.5, pads=(0, 0), beta=0, seed=1)     # a 4-row second tile row
@example(bm=8, bk=16, tiles=4, kb=2, mb=2, sparsity=0.0, pads=(0, 0), beta=0, seed=2)     # 3 + 1 columns
def test_amx_block_rows_match_numpy(bm, bk, tiles, kb, mb, sparsity, pads, beta, seed):
    """bf16 on AMX tiles (natively on an AMX host, else in the interpreter): 1 or 2 tile rows,
    column groups of 3 or 2 tiles and their remainders, beta 0 and 1."""
    n = 16 * tiles
    ldb, ldc = n + pads[0], n + pads[1]
    rng = np.random.default_rng(seed)
    (rowptr, colidx, values, b, cbuf), ref = _case(rng, bm, bk, n, kb, mb, sparsity, "bf16", ldb, ldc, beta)
    desc = BlockSpmm(bm=bm, bk=bk, n=n, kb=kb, ldb=ldb, ldc=ldc, dtype="bf16", beta=beta)
    assert "tdpbf16ps" in generate(desc, "amx").disassemble()
    for i in range(mb):
        _run_row(desc, "amx", None, "interp", rowptr[i:i + 2], colidx, values, b, cbuf[i, :, :n], len(colidx))
    got = cbuf[..., :n].reshape(mb * bm, n)
    assert not np.isnan(got).any() and np.isnan(cbuf[..., n:]).all()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.sqrt(kb * bk) * (np.abs(ref).max() + 1))


def test_amx_falls_back_to_avx512_where_tiles_do_not_fit():
    for desc in (BlockSpmm(bm=4, bk=4, n=24, kb=2, dtype="bf16"), BlockSpmm(bm=40, bk=4, n=16, kb=2, dtype="bf16"),
                 BlockSpmm(bm=4, bk=4, n=16, kb=2)):
        text = generate(desc, "amx").disassemble()
        assert "tdpbf16ps" not in text and "zmm" in text


BAD_INDICES = [   # (rowptr, colidx entry 1, message)
    ([1, 0], 0, r"rowptr = \[1, 0\] must satisfy 0 <= rowptr\[0\] <= rowptr\[1\] <= count=2"),
    ([0, 3], 0, r"rowptr = \[0, 3\]"),
    ([-1, 1], 0, r"rowptr = \[-1, 1\]"),
    ([0, 2], 5, r"colidx\[1\] = 5 is not a block column of A: expected 0..2"),
    ([0, 2], -1, r"colidx\[1\] = -1"),
]


@pytest.mark.parametrize("rowptr, col, message", BAD_INDICES)
def test_bad_indices_are_refused_or_poison_c(rowptr, col, message):
    desc = BlockSpmm(bm=4, bk=4, n=20, kb=3)
    spmm = tpp.block_spmm(4, 4, 20, 3)
    rp, ci = np.array(rowptr, np.int32), np.array([0, col], np.int32)
    values, b = np.ones((2, 4, 4), np.float32), np.ones((12, 20), np.float32)
    c = np.zeros((4, 20), np.float32)
    with pytest.raises(ValueError, match=message):
        spmm(rp, ci, values, b, c, count=2)
    with pytest.raises(ValueError, match=message):
        spmm.reference(rp, ci, values, b, c, count=2)
    assert (c == 0).all()
    for isa, where, d in (("avx512", "native", desc), ("avx2", "native", desc), ("avx512", "interp", desc),
                          ("amx", "interp", BlockSpmm(bm=4, bk=4, n=16, kb=3, dtype="bf16"))):
        if (where == "native" and not native(isa)) or (where == "interp" and not interp_available()):
            continue
        vals = _exact(values.astype(tpp.dtypes.dtype(d.dtype)))
        bb = _exact(tpp.vnni_pack(b[:, :16].astype(BF16), 2)) if d.dtype == "bf16" else _exact(b)
        cc = np.zeros((4, d.n), np.float32)
        _run_row(d, isa, (), where, _exact(rp), _exact(ci), vals, bb, cc, 2)
        assert np.isnan(cc).all(), f"{isa} {where}: the raw kernel did not poison C"


def test_operand_errors_name_the_fix():
    spmm = tpp.block_spmm(4, 4, 8, 2)
    rp, ci = np.array([0, 1], np.int32), np.zeros(1, np.int32)
    values, b, c = np.ones((1, 4, 4), np.float32), np.ones((8, 8), np.float32), np.zeros((4, 8), np.float32)
    with pytest.raises(OperandError, match="dtype int64, expected int32"):
        spmm(rp.astype(np.int64), ci, values, b, c, count=1)
    with pytest.raises(OperandError, match="holds 1 blocks but count=2"):
        spmm(np.array([0, 1], np.int32), ci, np.ones((2, 4, 4), np.float32), b, c, count=2)
    with pytest.raises(OperandError, match="shape"):
        spmm(rp, ci, values, b[:4], c, count=1)
    with pytest.raises(ValueError, match="bk=3; expected an even int"):
        tpp.block_spmm(4, 3, 8, 2, "bf16")
    with pytest.raises(ValueError, match="ldb=4; expected an int >= n=8"):
        tpp.block_spmm(4, 4, 8, 2, ldb=4)
    with pytest.raises(ValueError, match="dtype='i8'"):
        tpp.block_spmm(4, 4, 8, 2, "i8")


def test_bcsr_helpers():
    a = np.zeros((6, 8), np.float32)
    a[0, 7], a[5, 0], a[5, 5] = 1, 2, 3
    rowptr, colidx, values = bcsr(a, 3, 4)
    assert rowptr.tolist() == [0, 1, 3] and colidx.tolist() == [1, 0, 1]
    assert values[0, 0, 3] == 1 and values[2, 2, 1] == 3
    rowptr, colidx, values = bcsr(np.zeros((4, 4)), 2, 2)
    assert rowptr.tolist() == [0, 0, 0] and len(colidx) == len(values) == 1       # one unused block
    for bad, message in (((np.array([0, 1]), np.array([7]), 1, 2), "colidx\\[0\\] = 7"),
                         ((np.array([0, 2]), np.array([0]), 1, 2), "stay in 0..1"),
                         ((np.array([1, 0, 1]), np.array([0]), 1, 2), "stay in|decreases")):
        with pytest.raises(ValueError, match=message):
            check_bcsr(*bad)
    with pytest.raises(ValueError, match="sparsity=1.5"):
        random_block_sparse(4, 4, 2, 2, 1.5, np.random.default_rng(0))


def test_bcsr_helpers_edge_cases():
    rowptr, colidx, values = bcsr(np.zeros((0, 4), np.float32), 2, 2)      # no block rows
    assert rowptr.tolist() == [0] and colidx.tolist() == [0] and values.shape == (1, 2, 2)
    for rowptr, colidx in ((np.array([0.0, 0.5]), np.zeros(1, np.int32)), (np.array(["0", "1"]), np.zeros(1)),
                           (np.array([0, 1]), np.zeros((1, 1), np.int32))):
        with pytest.raises(OperandError, match="1-D integer array"):
            check_bcsr(rowptr, colidx, 1, 2)
    assert random_block_sparse(4, 4, 2, 2, 0.5, np.random.default_rng(0), dtype="bf16").dtype == BF16


def test_the_checking_wrapper_pickles_allocates_and_shows_the_kernel():
    import copy
    import pickle
    spmm = tpp.block_spmm(2, 2, 3, 2, ldc=5)
    rp, ci, values = np.array([0, 1], np.int32), np.array([1], np.int32), np.ones((1, 2, 2), np.float32)
    b = np.arange(12, dtype=np.float32).reshape(4, 3)
    for k in (spmm, pickle.loads(pickle.dumps(spmm)), copy.copy(spmm)):
        c = k(rp, ci, values, b)                   # beta=0: C allocated, with the row stride ldc
        assert c.strides == (20, 4) and c.tolist() == [[15.0, 17.0, 19.0]] * 2
    assert repr(spmm) == repr(spmm.kernel) and "c: 'float32[2, 3]' = None" in str(inspect.signature(spmm))
    with pytest.raises(TypeError, match="beta=1.*pass c"):
        tpp.block_spmm(2, 2, 3, 2, beta=1)(rp, ci, values, b)


@settings(max_examples=10)
@given(data=st.data())
def test_loop_dsl_spmm_matches_numpy(data):
    block = data.draw(st.sampled_from([4, 8, 16, 32]), "block")
    bm, bk = block, data.draw(st.sampled_from([block, 2 * block if block < 32 else 16]), "bk")
    mb, kb = data.draw(st.integers(1, 4), "mb"), data.draw(st.integers(1, 4), "kb")
    bn = data.draw(st.sampled_from([16, 32, 48]), "bn")
    n = bn * data.draw(st.integers(1, 3), "panels")
    dtype = data.draw(st.sampled_from(["f32", "bf16"]), "dtype")
    sparsity = data.draw(st.sampled_from([0.0, 0.5, 0.9, 1.0]), "sparsity")
    spec = data.draw(st.sampled_from(SPECS), "spec")
    rng = np.random.default_rng(data.draw(st.integers(0, 99), "seed"))
    dt = tpp.dtypes.dtype(dtype)
    a = random_block_sparse(mb * bm, kb * bk, bm, bk, sparsity, rng).astype(dt)
    b = rng.standard_normal((kb * bk, n)).astype(dt)
    nest = SpmmNest(mb * bm, kb * bk, n, bm, bk, dtype, bn, spec)
    c = np.full((mb * bm, n), np.nan, np.float32)
    nest(*bcsr(a, bm, bk), tpp.vnni_pack(b, 2) if dtype == "bf16" else b, c)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5 * np.sqrt(kb * bk) * (np.abs(ref).max() + 1))


def test_loop_dsl_spmm_python_mode_and_bad_structure():
    rng = np.random.default_rng(3)
    a = random_block_sparse(16, 16, 4, 4, 0.5, rng)
    b = rng.standard_normal((16, 32)).astype(np.float32)
    nest = SpmmNest(16, 16, 32, 4, 4, bn=16)
    rowptr, colidx, values = bcsr(a, 4, 4)
    c = np.full((16, 32), np.nan, np.float32)
    nest.lk.python(*nest.arrays(rowptr, colidx, values, b, c))
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-4)
    bad = colidx.copy()
    bad[-1] = 4
    with pytest.raises(ValueError, match="is not a block column"):
        nest(rowptr, bad, values, b, c)
    with pytest.raises(ValueError, match="rowptr has 4 entries; A has 4 block rows, so 5"):
        nest(rowptr[:4], colidx, values, b, c)


def test_bf16_torch_tensors_are_taken_by_bcsr_and_rope_tables():
    """np.asarray refuses a bf16 tensor; the helpers view it as kernels do."""
    torch = pytest.importorskip("torch")
    a = torch.zeros(4, 6, dtype=torch.bfloat16)
    a[0, 5], a[3, 0] = 1, 2
    rowptr, colidx, values = bcsr(a, 2, 3)
    assert rowptr.tolist() == [0, 1, 2] and colidx.tolist() == [1, 0] and values.dtype.name == "bfloat16"
    cos, sin = tpp.rope_tables(torch.arange(3, dtype=torch.bfloat16), 4)
    want = tpp.rope_tables(np.arange(3), 4)
    assert np.array_equal(cos, want[0]) and np.array_equal(sin, want[1])
