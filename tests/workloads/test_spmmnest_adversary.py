"""An adversarial pass over the loop-DSL SpMM (bench.spmm.SpmmNest) and the front end of ``python -m
bench spmm``, as a demanding user drives them; the kernel itself has its own (tests/tpp/
test_spmm_gemm_nt_adversary.py, test_amx_spmm_adversary.py).

Every spec of bench.spmm.SPECS, blocks from 1x1 to 32x32 (odd ones too), panels from 1 column to n,
sparsity 0 to 1, natively at avx2 and avx512, f32 and bf16: small-integer inputs make every sum
exact, so C must equal float64 NumPy bit for bit, C poisoned with NaN before each run. A BCSR from a
dense A, the same A with every block stored, hand-built structures (an empty block row, an unused
block column, duplicate and unsorted column indices, no stored block at all) and NaN / inf in stored
blocks; 1 and 2 threads and every spec agree bit for bit; the operands against guard pages. Wrong
knobs and operands are refused with an error naming the fix and leave C untouched. The suite's
options, its crossover (lowest sparsity from which on ours beats dense, sparsities in any order) and
``--json FILE`` (exactly FILE)."""
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import bench.spmm as bench_spmm
import tppasm as tpp
from bench.spmm import SPECS, SpmmNest
from tests.scripts import ROOT
from tests.support import kernel_level, native, pool_of
from tests.test_bench_cli import refused
from tests.tpp.test_transform_adversary import fenced
from tppasm.spmm import bcsr, random_block_sparse

BF16 = tpp.dtypes.dtype("bf16")
LEVELS = [pytest.param(isa, marks=() if native(isa) else pytest.mark.skip(reason=f"host cannot run {isa}"))
          for isa in ("avx2", "avx512")]


def _dt(dtype):
    return np.dtype(np.float32) if dtype == "f32" else BF16


def _pack(b, dtype):
    """B as the nest takes it: f32 as is, bf16 VNNI2-packed."""
    return tpp.vnni_pack(b, 2) if dtype == "bf16" else np.ascontiguousarray(b)


def _int_sparse(rng, m, k, bm, bk, sparsity, dtype):
    """A block-sparse A of small integers (exact in bf16, every kept block holding a nonzero)."""
    return random_block_sparse(m, k, bm, bk, sparsity, rng, np.int8).clip(-3, 3).astype(_dt(dtype))


def _all_blocks(a, bm, bk):
    """(rowptr, colidx, values) of ``a`` with every block stored, zero ones included."""
    mb, kb = a.shape[0] // bm, a.shape[1] // bk
    values = np.ascontiguousarray(a.reshape(mb, bm, kb, bk).transpose(0, 2, 1, 3).reshape(mb * kb, bm, bk))
    return np.arange(0, mb * kb + 1, kb, dtype=np.int32), np.tile(np.arange(kb, dtype=np.int32), mb), values


def _ref(a, b):
    """float64 A @ B summed element by element (no BLAS shortcuts around NaN, inf or zeros)."""
    with np.errstate(invalid="ignore"):
        return (a.astype(np.float64)[:, :, None] * b.astype(np.float64)[None, :, :]).sum(axis=1)


def _poisoned(m, n):
    return np.full((m, n), np.nan, np.float32)


# -- correctness --------------------------------------------------------------------------------

@pytest.mark.parametrize("isa", LEVELS)
@settings(max_examples=80, deadline=None)
@given(dtype=st.sampled_from(["f32", "bf16"]), spec=st.sampled_from(SPECS),
       bm=st.sampled_from([1, 2, 3, 4, 5, 8, 16, 32]), bk=st.sampled_from([1, 2, 3, 4, 6, 8, 16, 32]),
       mb=st.integers(1, 3), kb=st.integers(1, 3), bn=st.sampled_from([1, 5, 16, 17, 32, 48]), panels=st.integers(1, 3),
       sparsity=st.sampled_from([0.0, 0.5, 0.99, 1.0]), seed=st.integers(0, 99))
@example(dtype="f32", spec="BA", bm=1, bk=1, mb=1, kb=1, bn=1, panels=1, sparsity=0.0, seed=0)      # smallest
@example(dtype="bf16", spec="aB", bm=32, bk=32, mb=2, kb=2, bn=48, panels=2, sparsity=0.5, seed=1)
@example(dtype="bf16", spec="Ba", bm=3, bk=2, mb=3, kb=3, bn=16, panels=3, sparsity=1.0, seed=2)   # C = 0
def test_every_spec_and_blocking_is_exact(isa, dtype, spec, bm, bk, mb, kb, bn, panels, sparsity, seed):
    """C == float64 NumPy bit for bit (integer inputs), from bcsr(A) and from A with every block stored."""
    if dtype == "bf16" and bk % 2:
        bk *= 2
    m, k, n = mb * bm, kb * bk, bn * panels
    rng = np.random.default_rng(seed)
    a = _int_sparse(rng, m, k, bm, bk, sparsity, dtype)
    b = rng.integers(-4, 5, (k, n)).astype(_dt(dtype))
    ref = _ref(a, b)
    with kernel_level(isa):
        assert tpp.block_spmm(bm, bk, bn, kb, dtype, ldb=n, ldc=n).kernel.isa == isa
        nest = SpmmNest(m, k, n, bm, bk, dtype, bn, spec)
        for structure in (bcsr(a, bm, bk), _all_blocks(a, bm, bk)):
            c = _poisoned(m, n)
            nest(*structure, _pack(b, dtype), c)
            np.testing.assert_array_equal(c, ref)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_threads_and_specs_agree_bit_for_bit(dtype):
    """Each C element is one kernel's sum whatever the order of the loops or the threads: 1 and 2
    threads, every spec, the same bits (normal values, so the order of a sum would show)."""
    rng = np.random.default_rng(7)
    m, k, n, bm, bk, bn = 48, 64, 96, 8, 16, 32
    a = random_block_sparse(m, k, bm, bk, 0.5, rng).astype(_dt(dtype))
    b = rng.standard_normal((k, n)).astype(_dt(dtype))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    results = []
    for threads in (1, 2):
        for spec in SPECS:
            c = _poisoned(m, n)
            SpmmNest(m, k, n, bm, bk, dtype, bn, spec, pool=pool_of(threads))(*bcsr(a, bm, bk), _pack(b, dtype), c)
            results.append(c)
    np.testing.assert_allclose(results[0], ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    for c in results[1:]:
        assert c.tobytes() == results[0].tobytes()


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_no_stored_block_gives_zeros(dtype):
    """Sparsity 1: bcsr()'s one unused block, a hand-built BCSR with no block at all (as
    scipy.sparse.bsr_matrix holds one), and unused garbage colidx entries: C all +0.0."""
    m, k, n, bm, bk = 8, 8, 32, 4, 4
    b = _pack(np.ones((k, n), _dt(dtype)), dtype)
    nest = SpmmNest(m, k, n, bm, bk, dtype, bn=16)
    empty = np.zeros(m // bm + 1, np.int32)
    for structure in (bcsr(np.zeros((m, k), _dt(dtype)), bm, bk),
                      (empty, np.zeros(0, np.int32), np.zeros((0, bm, bk), _dt(dtype))),
                      (empty, np.array([99, -5], np.int32), np.full((2, bm, bk), np.nan, _dt(dtype)))):
        c = _poisoned(m, n)
        nest(*structure, b, c)
        assert (c == 0).all() and not np.signbit(c).any()


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_hand_built_structures(dtype):
    """An empty block row, a block column never used, duplicate and unsorted column indices (the
    blocks add up, as scipy's BSR does), entries before rowptr[0] and values past the last block."""
    m, k, n, bm, bk = 12, 16, 32, 4, 4       # 3 block rows, 4 block columns (column 2 never used)
    rng = np.random.default_rng(3)
    rowptr = np.array([2, 5, 5, 7], np.int32)                   # block row 1 holds nothing
    colidx = np.array([-1, 9, 3, 0, 3, 1, 0], np.int32)         # row 0: 3, 0, 3 (unsorted, 3 twice)
    values = rng.integers(-3, 4, (9, bm, bk)).astype(_dt(dtype))
    b = rng.integers(-4, 5, (k, n)).astype(_dt(dtype))
    a = np.zeros((m, k))
    for i in range(3):
        for p in range(rowptr[i], rowptr[i + 1]):
            a[i * bm:(i + 1) * bm, colidx[p] * bk:(colidx[p] + 1) * bk] += values[p].astype(np.float64)
    c = _poisoned(m, n)
    SpmmNest(m, k, n, bm, bk, dtype, bn=16, spec="aB")(rowptr, colidx, values, _pack(b, dtype), c)
    np.testing.assert_array_equal(c, _ref(a, b))
    assert (c[bm:2 * bm] == 0).all()


@pytest.mark.parametrize("isa", LEVELS)
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_non_finite_in_stored_blocks_land_where_numpy_puts_them(isa, dtype):
    """NaN, inf and -inf in stored blocks (B holds zeros: inf * 0 is NaN) give NaN / inf in exactly
    the elements float64 NumPy does; the other rows stay exact."""
    rng = np.random.default_rng(5)
    m, k, n, bm, bk = 32, 32, 48, 8, 4
    a = _int_sparse(rng, m, k, bm, bk, 0.5, dtype).astype(np.float32)
    stored = np.argwhere(a != 0)
    for (r, col), v in zip(stored[rng.choice(len(stored), 6, replace=False)], [np.nan, np.inf, -np.inf] * 2):
        a[r, col] = v
    a = a.astype(_dt(dtype))
    b = rng.integers(-2, 3, (k, n)).astype(_dt(dtype))
    ref = _ref(a, b)
    assert np.isnan(ref).any() and np.isinf(ref).any() and np.isfinite(ref).any()
    with kernel_level(isa):
        c = _poisoned(m, n)
        SpmmNest(m, k, n, bm, bk, dtype, bn=16)(*bcsr(a, bm, bk), _pack(b, dtype), c)
    np.testing.assert_array_equal(c, ref)          # NaN where NaN, the same inf, the same finite values


def _fence(arr, at_end, region_fill=0x5A):
    """``arr`` copied against a guard page (its last byte before one, or its first after one)."""
    region, op = fenced(arr.nbytes, at_end, 64)
    region[...] = region_fill
    out = op.view(arr.dtype).reshape(arr.shape)
    out[...] = arr
    return region, out


@pytest.mark.parametrize("at_end", [True, False])
@pytest.mark.parametrize("dtype, spec", [("f32", "BA"), ("bf16", "aB")])
def test_operands_against_guard_pages(dtype, spec, at_end):
    """rowptr, colidx, values, B and C each against an inaccessible page: nothing outside them is
    read (a fault) or written (C's neighbours keep their bytes)."""
    rng = np.random.default_rng(11)
    m, k, n, bm, bk = 24, 32, 40, 8, 8
    a = _int_sparse(rng, m, k, bm, bk, 0.5, dtype)
    b = rng.integers(-4, 5, (k, n)).astype(_dt(dtype))
    ops = [_fence(x, at_end)[1] for x in (*bcsr(a, bm, bk), _pack(b, dtype))]
    region, c = _fence(_poisoned(m, n), at_end)
    outside = region.copy()
    SpmmNest(m, k, n, bm, bk, dtype, bn=20, spec=spec)(*ops, c)
    np.testing.assert_array_equal(c, _ref(a, b))
    start = c.ctypes.data - region.ctypes.data
    inside = np.zeros(region.size, bool)
    inside[start:start + c.nbytes] = True
    assert (region[~inside] == outside[~inside]).all()


# -- refusals -------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, kwargs, error, message", [
    ((12, 8, 32, 8, 4), {}, ValueError, r"bm=8 must divide m=12"),
    ((8, 8, 64, 4, 4), dict(bn=48), ValueError, r"bn=48 must divide n=64"),
    ((8, 8, 32, 4, 4), {}, ValueError, r"bn=64 must divide n=32"),            # the default bn
    ((8, 8, 32, 4, 4), dict(bn=0), ValueError, r"bn=0; expected a positive int"),
    ((-8, 8, 32, 4, 4), dict(bn=16), ValueError, r"m=-8; expected a positive int"),
    ((0, 8, 32, 4, 4), dict(bn=16), ValueError, r"m=0; expected a positive int"),
    ((8, 0, 32, 4, 4), dict(bn=16), ValueError, r"k=0; expected a positive int"),
    ((8, 8, 0, 4, 4), dict(bn=16), ValueError, r"n=0; expected a positive int"),
    ((8, 8, -32, 4, 4), dict(bn=16), ValueError, r"n=-32; expected a positive int"),
    ((8.0, 8, 32, 4, 4), dict(bn=16), ValueError, r"m=8\.0; expected a positive int"),
    ((8, 8, 32, 4, 4), dict(bn=16.0), ValueError, r"bn=16\.0; expected a positive int"),
    ((8, 8, 32, True, 4), dict(bn=16), ValueError, r"bm=True; expected a positive int"),
    ((6, 6, 32, 3, 3, "bf16"), dict(bn=16), ValueError, r"bk=3; expected an even int for dtype='bf16'"),
    ((8, 8, 32, 4, 4, "f16"), dict(bn=16), TypeError, r"dtype='f16' is not a tppasm dtype"),
    ((8, 8, 32, 4, 4), dict(bn=16, pool=2), TypeError, r"pool=2: expected an isa.pool.Pool"),
    ((8, 8, 32, 4, 4), dict(bn=16, pool=ThreadPoolExecutor(1)), TypeError,
     r"ThreadPoolExecutor.*expected an isa.pool.Pool \(e.g. Pool\(4\)\)"),
    ((8, 8, 32, 4, 4), dict(bn=16, spec="ABC"), ValueError, r"loop spec 'ABC'.*letters a-b"),
    ((8, 8, 32, 4, 4), dict(bn=16, spec="A"), ValueError, r"loop 'b' does not appear"),
])
def test_bad_knobs_are_refused_naming_them(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        SpmmNest(*args, **kwargs)


def test_numpy_integer_knobs_are_taken():
    nest = SpmmNest(*map(np.int64, (8, 8, 32, 4, 4)), bn=np.int32(16))
    c = _poisoned(8, 32)
    nest(*bcsr(np.ones((8, 8), np.float32), 4, 4), np.ones((8, 32), np.float32), c)
    assert (c == 8).all()


def _bad_calls(dtype):
    """(name, change to the arguments, error, message): each a wrong operand of a valid call."""
    dt = _dt(dtype)
    f32 = dtype == "f32"
    return [
        ("rowptr short", lambda o: o.update(rowptr=o["rowptr"][:-1]), ValueError,
         r"rowptr has 3 entries; A has 3 block rows, so 4"),
        ("rowptr int64", lambda o: o.update(rowptr=o["rowptr"].astype(np.int64)), ValueError,
         r"rowptr has dtype int64, expected int32.*astype\(np.int32\)"),
        ("rowptr falls", lambda o: o["rowptr"].__setitem__(1, 9), ValueError, r"rowptr decreases at block row 1"),
        ("rowptr list", lambda o: o.update(rowptr=o["rowptr"].tolist()), TypeError, r"np.asarray"),
        ("colidx column 4", lambda o: o["colidx"].__setitem__(0, 4), ValueError,
         r"colidx\[0\] = 4 is not a block column: expected 0..3"),
        ("colidx float", lambda o: o.update(colidx=o["colidx"].astype(np.float32)), ValueError,
         r"colidx must be a 1-D integer array \(int32"),
        ("colidx short", lambda o: o.update(colidx=o["colidx"][:2]), ValueError, r"it must stay in 0..2"),
        ("values float64", lambda o: o.update(values=o["values"].astype(np.float64)), ValueError,
         r"values has dtype float64, expected " + ("float32" if f32 else "bfloat16") + r".*convert with"),
        ("values fewer", lambda o: o.update(values=o["values"][:2]), ValueError, r"values holds 2 blocks but count="),
        ("values 2-D", lambda o: o.update(values=o["values"].reshape(len(o["values"]), -1)), ValueError,
         r"values has 2 dimensions .* expected 3: \(count, 4, 8\)"),
        ("values strided", lambda o: o.update(values=np.repeat(o["values"], 2, axis=2)[:, :, ::2]), ValueError,
         r"values has strides .*np.ascontiguousarray"),
        ("b float64", lambda o: o.update(b=o["b"].astype(np.float64)), ValueError,
         r"b has dtype float64, expected " + ("float32" if f32 else "bfloat16")),
        ("b too wide", lambda o: o.update(b=np.concatenate([o["b"]] * 2, axis=1)), ValueError,
         r"SpmmNest: b has shape \(" + ("32, 96" if f32 else "16, 96, 2") + r"\); expected \("
         + ("32, 48" if f32 else r"16, 48, 2\).*vnni_pack")),
        ("b padded rows", lambda o: o.update(b=np.concatenate([o["b"]] * 2, axis=1)[:, :48]), ValueError,
         r"SpmmNest: b is not C-contiguous.*np.ascontiguousarray\(b\)"),
        ("c float64", lambda o: o.update(c=o["c"].astype(np.float64)), ValueError, r"c has dtype float64"),
        ("c Fortran", lambda o: o.update(c=np.asfortranarray(o["c"])), ValueError,
         r"SpmmNest: c must be a C-contiguous \(12, 48\) float32 array"),
        ("c transposed", lambda o: o.update(c=_poisoned(48, 12).T), ValueError, r"C-contiguous \(12, 48\)"),
        ("c short", lambda o: o.update(c=o["c"][:8]), ValueError, r"SpmmNest: c must be a C-contiguous \(12, 48\)"),
        ("c list", lambda o: o.update(c=o["c"].tolist()), ValueError, r"operand c must be a NumPy array.*not list"),
        ("c read-only", lambda o: o["c"].setflags(write=False), ValueError, r"C is read-only"),
        ("c masked", lambda o: o.update(c=np.ma.masked_array(o["c"])), ValueError, r"masked array"),
    ] + ([] if f32 else [
        ("b not packed", lambda o: o.update(b=o["b"].reshape(-1, 48, 2).transpose(0, 2, 1).reshape(32, 48)
                                            .astype(dt)), ValueError, r"b has shape \(32, 48\).*vnni_pack")])


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_bad_operands_are_refused_and_leave_c_alone(dtype):
    m, k, n, bm, bk = 12, 32, 48, 4, 8
    rng = np.random.default_rng(2)
    a = _int_sparse(rng, m, k, bm, bk, 0.3, dtype)
    b = _pack(rng.integers(-4, 5, (k, n)).astype(_dt(dtype)), dtype)
    nest = SpmmNest(m, k, n, bm, bk, dtype, bn=16)
    for name, change, error, message in _bad_calls(dtype):
        rowptr, colidx, values = bcsr(a, bm, bk)
        ops = dict(rowptr=rowptr, colidx=colidx, values=values, b=b.copy(), c=_poisoned(m, n))
        change(ops)
        with pytest.raises(error, match=message):
            nest(*ops.values())
        assert np.isnan(np.asarray(ops["c"], dtype=np.float64)).all(), f"{name}: C was written"
    c = _poisoned(m, n)                                            # the nest still works afterwards
    nest(*bcsr(a, bm, bk), b, c)
    np.testing.assert_array_equal(c, _ref(a, b if dtype == "f32" else b.transpose(0, 2, 1).reshape(k, n)))


def test_torch_tensors_are_taken_and_written_in_place():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    a = _int_sparse(rng, 8, 16, 4, 8, 0.5, "bf16")
    b = tpp.vnni_pack(rng.integers(-4, 5, (16, 32)).astype(BF16), 2)
    c = torch.full((8, 32), float("nan"))
    version = c._version
    rowptr, colidx, values = bcsr(a, 4, 8)
    SpmmNest(8, 16, 32, 4, 8, "bf16", bn=16)(torch.from_numpy(rowptr), torch.from_numpy(colidx),
                                              torch.from_numpy(values.view(np.int16)).view(torch.bfloat16),
                                              torch.from_numpy(b.view(np.int16)).view(torch.bfloat16), c)
    np.testing.assert_array_equal(c.numpy(), _ref(a, b.transpose(0, 2, 1).reshape(16, 32)))
    assert c._version > version
    with pytest.raises(ValueError, match=r"SpmmNest: c must be a C-contiguous \(8, 32\) float32 array.*np.empty"):
        SpmmNest(8, 16, 32, 4, 8, "bf16", bn=16)(rowptr, colidx, values, b, torch.zeros(32, 8).T)


# -- the suite's front end ------------------------------------------------------------------------

@pytest.mark.parametrize("argv, words", [
    (["--sparsities", "1.5"], "argument --sparsities: '1.5': expected sparsities from 0 to 1"),
    (["--sparsities=-0.1"], "argument --sparsities: '-0.1'"),
    (["--sparsities", "nan"], "argument --sparsities: 'nan'"),
    (["--sparsities", "inf"], "argument --sparsities: 'inf'"),
    (["--sparsities", "0.5,0.50"], "each once"),
    (["--sparsities", "0.5,"], "argument --sparsities: '0.5,'"),
    (["--blocks", "4,4"], "argument --blocks: '4,4': expected positive numbers of block rows and columns"),
    (["--blocks", "0"], "argument --blocks: '0'"),
    (["--size", "64", "--blocks", "24"], "block size 24 does not divide --size 64, e.g. --blocks 4,8,16,32"),
    (["--size", "64", "--blocks", "128"], "block size 128 does not divide --size 64"),
    (["--size", "192", "--blocks", "3", "--dtypes", "f32,bf16"], "block size 3 is odd (bf16 blocks pair"),
    (["--size", "32"], "argument --size: 32 is not a multiple of 64"),
    (["--size", "65536", "--blocks", "8"], "argument --size: 65536: the arrays need about"),
    (["--json", "/nonexistent-dir/x.json"], "directory '/nonexistent-dir' does not exist"),
    (["--clock", "cpu", "--threads", "2"], "use it with --threads 1"),
])
def test_bad_options_are_refused_before_any_work(capsys, argv, words):
    err = refused(capsys, bench_spmm.parse, argv)
    assert words in err and "Traceback" not in err


def test_good_odd_options_parse():
    args = bench_spmm.parse(["--size", "192", "--blocks", "3,1,192", "--dtypes", "f32", "--sparsities", "1,0,0.99"])
    assert args.blocks == [3, 1, 192] and args.sparsities == [1.0, 0.0, 0.99]
    assert bench_spmm.parse(["--size", "64", "--blocks", "2", "--dtypes", "bf16"]).blocks == [2]


@pytest.mark.parametrize("sparsities, ratios, want", [
    ([0.0, 0.5, 0.9], [0.5, 1.5, 3.0], 0.5),
    ([0.9, 0.5, 0.0], [3.0, 1.5, 0.5], 0.5),          # the sweep given in decreasing order
    ([0.5, 0.0, 0.9], [1.5, 0.5, 3.0], 0.5),
    ([0.0, 0.5, 0.9], [2.0, 0.8, 3.0], 0.9),          # a dip: only from 0.9 on
    ([0.9, 0.0, 0.5], [3.0, 2.0, 0.8], 0.9),
    ([0.0, 0.5, 0.9], [1.2, 1.1, 1.3], 0.0),          # always faster
    ([0.0, 0.5, 0.9], [0.5, 1.0, 0.9], np.nan),       # never
    ([0.9, 0.5, 0.0], [1.5, 1.0, 0.5], 0.9),          # 1.0 is a tie, not a win
    ([0.3], [float("nan")], np.nan),
    ([], [], np.nan),
])
def test_crossover_of_synthetic_sweeps(sparsities, ratios, want):
    got = bench_spmm.crossover(sparsities, ratios)
    assert got == want or (np.isnan(want) and np.isnan(got))


def test_main_reports_the_crossover_of_an_unsorted_sweep(monkeypatch, tmp_path):
    """main() end to end with the timing stubbed: ours wins from sparsity 0.5 on, the sweep given
    as 0.9,0.5,0.1."""
    speed = {0.9: 3.0, 0.5: 1.5, 0.1: 0.5}
    monkeypatch.setattr(bench_spmm, "setup", lambda args: (None, 1, None))
    monkeypatch.setattr(bench_spmm, "tune", lambda *a: (64, "BA"))
    monkeypatch.setattr(bench_spmm, "bench_point", lambda rep, size, block, s, *a: speed[s])
    out = tmp_path / "r.json"
    bench_spmm.main(["--size", "64", "--blocks", "8", "--dtypes", "f32", "--sparsities", "0.9,0.5,0.1",
                     "--threads", "1", "--json", str(out)])
    assert [r["crossover sparsity"] for r in json.loads(out.read_text())] == [0.5]


def _bench(tmp_path, *argv):
    return subprocess.run([sys.executable, "-m", "bench", "spmm", *argv], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT})


def test_quick_run_writes_exactly_its_json_file(tmp_path):
    """A real --quick run at size 64 (sparsity 1 first, an odd order): exit 0, one new file, the
    named one; every point checked against NumPy (its err recorded), and the crossover row."""
    proc = _bench(tmp_path, "--quick", "--size", "64", "--blocks", "8", "--sparsities", "1,0.5", "--dtypes", "f32",
                  "--threads", "1", "--json", "out.json")
    assert proc.returncode == 0, proc.stderr
    assert os.listdir(tmp_path) == ["out.json"]
    records = json.loads((tmp_path / "out.json").read_text())
    points = [r for r in records if "sparsity" in r]
    assert [(r["sparsity"], r["stored blocks"]) for r in points] == [(1.0, 0), (0.5, 32)]
    assert all(r["err"] <= 1e-5 for r in points) and points[0]["% peak"] == 0.0
    assert len(records) == 3 and "crossover sparsity" in records[2]


@pytest.mark.parametrize("argv, words", [
    (["--json", "/nonexistent-dir/x.json"], "does not exist (create it first)"),
    (["--json", "."], "expected the name of a file to write, not a directory"),
    (["--sparsities", "2"], "argument --sparsities: '2'"),
])
def test_bad_command_lines_fail_before_work(tmp_path, argv, words):
    proc = _bench(tmp_path, "--quick", "--size", "64", *argv)
    assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr
    assert os.listdir(tmp_path) == []
