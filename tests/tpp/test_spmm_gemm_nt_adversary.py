"""An adversarial pass over the block-sparse product (tppasm.block_spmm, tppasm/x86/spmm.py) and the
dot-product GEMM (tppasm.gemm_nt, tppasm/x86/gemm_nt.py), as a demanding or careless user calls them.

Every operand of a raw call lies against an inaccessible page natively (at its end or its start,
drawn), or in a buffer of exactly its size in isa.x86.interp (avx2, avx512 and amx code), so a read
or write outside an operand faults. C starts as a NaN poison (0x7FA5A5A5, a payload no kernel
makes), so every element must be written (beta 0) or updated (beta 1), and no element between or
past C's rows may change. Integer-valued inputs make every fp32 partial sum exact, so those results
must equal NumPy's bit for bit in any summation order; normal-distributed ones are held to the
fp32 error bound, and NaN / inf in A, B or C must land where the float64 reference has them.

The sparse structure is user data: the checked call refuses a bad rowptr / colidx / count with an
error naming the fix and writes nothing; the raw kernel (what loop nests call) poisons C with NaN
and reads nothing past rowptr and the colidx entries it checks. The raw kernel trusts ``count``:
it must not exceed the blocks colidx and values hold (what the checked call verifies)."""
import mmap
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import tppasm
from tppasm.dtypes import dtype as D
from tppasm.gemm_nt import MAX_ROW_BYTES, GemmNT
from tppasm.operand import OperandError
from tppasm.spmm import BlockSpmm
from tppasm.x86.brgemm import target_features
from tppasm.x86.gemm_nt import generate_gemm_nt
from tppasm.x86.spmm import AmxSpmmGen, generate
from tests.support import assert_same_non_finite, interp_available, native, run_raw
from tests.tpp.test_transform_adversary import fenced

BF16 = D("bf16")
POISON = np.uint32(0x7FA5A5A5)
POISON16 = np.uint16(0x7FA5)
NAN_BITS = 0x7FC00000            # what the raw spmm kernel writes on bad indices
# (isa, features, where): features None = the target's; () = none (bf16 widened to fp32)
VARIANTS = [("avx2", None, "native"), ("avx512", None, "native"), ("avx512", (), "native"),
            ("avx2", None, "interp"), ("avx512", None, "interp"), ("avx512", (), "interp"), ("amx", None, "interp")]


def _params(variants=VARIANTS):
    out = []
    for isa, feats, where in variants:
        ok = native(isa) and set(feats or ()) <= target_features(isa) if where == "native" else interp_available()
        out.append(pytest.param(isa, feats, where, id=f"{isa}-{where}" + ("-widen" if feats == () else ""),
                                marks=() if ok else pytest.mark.skip(reason=f"host cannot run {isa} {where}")))
    return out


NATIVE = [v for v in VARIANTS if v[2] == "native"]
INTERP = [v for v in VARIANTS if v[2] == "interp"]


def _call(code, isa, where, arrays, scalars=()):
    """The raw code on ``arrays`` natively, or in the interpreter (each array's buffer mapped whole)."""
    if where == "native":
        code(*(x.ctypes.data for x in arrays), *scalars)
    else:
        run_raw(SimpleNamespace(raw=code, isa=isa), arrays, scalars, isa=isa, interpret=True)


def _place(nbytes, where, at_end):
    """(region, operand bytes): natively against a guard page (``fenced``, 64 bytes of slack on the
    other side), in the interpreter a buffer of exactly ``nbytes`` (any access outside faults)."""
    if where == "native":
        return fenced(nbytes, at_end, 64)
    region = np.empty(nbytes, np.uint8)
    return region, region


def _view(op, dtype, shape, strides):
    """``shape`` over the bytes ``op`` with element ``strides``: a view whose root is op's region."""
    dt = np.dtype(dtype)
    return np.ndarray(shape, dt, buffer=op, strides=tuple(s * dt.itemsize for s in strides))


def _extent(shape, strides):
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides))


def _values(rng, shape, dtype, exact, specials):
    """Integers in [-4, 4] (exact sums) or normals, as ``dtype``; NaN/inf in a few places."""
    x = rng.integers(-4, 5, shape).astype(np.float32) if exact else rng.standard_normal(shape).astype(np.float32)
    if specials and x.size:
        hit = rng.random(shape) < 0.03
        x[hit] = rng.choice(np.float32([np.nan, np.inf, -np.inf, -0.0]), int(hit.sum()))
    return x.astype(dtype)


def _outside(region_u, op, shape, strides, poison):
    """How many elements of ``region_u`` outside the view ``shape``/``strides`` of ``op`` lost the poison."""
    keep = np.ones(region_u.size, bool)
    start = (op.ctypes.data - region_u.ctypes.data) // region_u.itemsize
    _view(keep[start:], bool, shape, strides)[...] = False
    return int((region_u[keep] != poison).sum())


# -- block_spmm: drawn structures, shapes and strides -------------------------------------------
def _spmm_operands(rng, d, where, at_end, start, cols, extra, exact, specials):
    """Placed operands (rowptr, colidx, values, b, c), C's region and the count: colidx holds
    ``cols`` at ``start``, garbage (out of range) in the entries the row does not use."""
    f, es, dt = d.vnni, (4 if d.dtype == "f32" else 2), D(d.dtype)
    count = max(1, start + len(cols) + extra)
    rp = _place(8, where, at_end[0])
    rowptr = _view(rp[1], np.int32, (2,), (1,))
    rowptr[...] = [start, start + len(cols)]
    colidx = _view(_place(4 * count, where, at_end[1])[1], np.int32, (count,), (1,))
    colidx[...] = rng.choice(np.int32([-1, d.kb, 2 ** 31 - 1, -2 ** 31]), count)
    colidx[start:start + len(cols)] = cols
    values = _view(_place(count * d.bm * d.bk * es, where, at_end[2])[1], dt, (count, d.bm, d.bk),
                   (d.bm * d.bk, d.bk, 1))
    values[...] = _values(rng, values.shape, dt, exact, specials)
    if f == 1:
        bshape, bstrides = (d.kb * d.bk, d.n), (d.ldb, 1)
    else:
        bshape, bstrides = (d.kb * d.bk // 2, d.n, 2), (2 * d.ldb, 2, 1)
    b_r, bb = _place(_extent(bshape, bstrides) * es, where, at_end[3])
    b_r.view(np.uint16)[...] = 0x7FC1                 # NaN in B's pads (bf16; f32 0x7FC17FC1)
    b = _view(bb, dt, bshape, bstrides)
    b[...] = _values(rng, bshape, dt, exact, specials)
    cshape, cstrides = (d.bm, d.n), (d.ldc, 1)
    c_r, cc = _place(_extent(cshape, cstrides) * 4, where, at_end[4])
    c_r.view(np.uint32)[...] = POISON
    c = _view(cc, np.float32, cshape, cstrides)
    if d.beta:
        c[...] = _values(rng, cshape, np.float32, exact, specials)
    return (rowptr, colidx, values, b, c), c_r, count


def _check_spmm(d, isa, feats, where, rng, at_end, start, cols, extra, exact, specials):
    (rowptr, colidx, values, b, c), c_r, count = _spmm_operands(rng, d, where, at_end, start, cols, extra, exact,
                                                                  specials)
    want = c.copy()
    bound = np.abs(c) if d.beta else np.zeros_like(c)
    with np.errstate(all="ignore"):
        d.reference(rowptr, colidx, values, b, want, count=count)
        d.reference(rowptr, colidx, np.abs(values), np.abs(b), bound, count=count)
    code = generate(d, isa, feats)
    _call(code, isa, where, (rowptr, colidx, values, b, c), (count,))
    what = f"{d} on {isa} {where} cols={list(cols)}"
    unwritten = c.view(np.uint32) == POISON
    assert not unwritten.any(), f"{what}: {int(unwritten.sum())} elements of C not written, e.g. " \
                                f"{np.argwhere(unwritten)[:3].tolist()}"
    assert _outside(c_r.view(np.uint32), c, c.shape, (d.ldc, 1), POISON) == 0, f"{what}: wrote outside C"
    assert_same_non_finite(c, want, what)
    fin = np.isfinite(want)
    if exact:
        assert np.array_equal(c[fin], want[fin]), f"{what}: exact sums differ"
    else:
        err = np.abs(c[fin].astype(np.float64) - want[fin])
        tol = 2.0 ** -16 * bound[fin] + 1e-30
        assert (err <= tol).all(), f"{what}: error {err.max()} over the bound"


@st.composite
def _spmm_draw(draw, bms=st.integers(1, 32), bks=st.integers(1, 32), ns=st.integers(1, 100), amx=False):
    dtype = "bf16" if amx else draw(st.sampled_from(["f32", "bf16"]))
    bm, bk = draw(bms), draw(bks)
    if dtype == "bf16":
        bk += bk % 2
    n = 16 * draw(st.integers(1, 5)) if amx else draw(ns)
    kb = draw(st.integers(1, 4))
    ldb = draw(st.sampled_from([n, n, n + 1, n + 3, n + 16, n + 17, -(-n // 1024) * 1024]))    # 4 KiB-aliased too
    ldc = draw(st.sampled_from([n, n, n + 1, n + 5, n + 16, -(-n // 1024) * 1024]))
    d = BlockSpmm(bm=bm, bk=bk, n=n, kb=kb, ldb=ldb, ldc=ldc, dtype=dtype, beta=draw(st.integers(0, 1)))
    return d, draw(st.integers(0, 2)), draw(st.lists(st.integers(0, kb - 1), max_size=6)), draw(st.integers(0, 2))


@pytest.mark.parametrize("isa, feats, where", _params(NATIVE))
@settings(max_examples=120, deadline=None)
@given(case=_spmm_draw(ns=st.one_of(st.integers(1, 100), st.integers(100, 300))),
       at_end=st.tuples(*[st.booleans()] * 5), exact=st.booleans(), specials=st.booleans(), seed=st.integers(0, 999))
@example(case=(BlockSpmm(bm=32, bk=32, n=300, kb=4, ldb=1024, ldc=1024, beta=1), 2, [3, 3, 0, 1, 3, 2], 2),
         at_end=(True,) * 5, exact=False, specials=False, seed=0)
@example(case=(BlockSpmm(bm=7, bk=36 - 4, n=17, kb=2, beta=0), 0, [], 0), at_end=(False,) * 5, exact=True,
         specials=False, seed=1)                                                      # an empty row: C = 0
def test_spmm_rows_inside_guard_pages(isa, feats, where, case, at_end, exact, specials, seed):
    d, start, cols, extra = case
    _check_spmm(d, isa, feats, where, np.random.default_rng(seed), at_end, start, cols, extra, exact, specials)


@pytest.mark.parametrize("isa, feats, where", _params(INTERP))
@settings(max_examples=12, deadline=None)
@given(case=_spmm_draw(bms=st.integers(1, 20), bks=st.integers(1, 20), ns=st.integers(1, 40)),
       exact=st.booleans(), specials=st.booleans(), seed=st.integers(0, 999))
def test_spmm_rows_in_the_interpreter(isa, feats, where, case, exact, specials, seed):
    d, start, cols, extra = case
    _check_spmm(d, isa, feats, where, np.random.default_rng(seed), (True,) * 5, start, cols, extra, exact, specials)


@pytest.mark.skipif(not interp_available(), reason="no interpreter")
@settings(max_examples=10, deadline=None)
@given(case=_spmm_draw(amx=True), exact=st.booleans(), specials=st.booleans(), seed=st.integers(0, 999))
@example(case=(BlockSpmm(bm=17, bk=2, n=48, kb=3, ldb=1024, ldc=50, dtype="bf16", beta=1), 1, [2, 2, 0], 1),
         exact=True, specials=False, seed=0)
def test_spmm_amx_tiles_in_the_interpreter(case, exact, specials, seed):
    """bf16 blocks of up to 32 x 32 with n a multiple of 16 take AMX tiles (DAZ/FTZ: no denormals drawn)."""
    d, start, cols, extra = case
    assert AmxSpmmGen.fits(d)
    _check_spmm(d, "amx", None, "interp", np.random.default_rng(seed), (True,) * 5, start, cols, extra, exact,
                specials)


@pytest.mark.parametrize("isa, feats, where", _params(NATIVE))
def test_every_block_size_up_to_32_and_some_past(isa, feats, where):
    """Every bm, bk in 1..32 (f32; bf16 where bk is even), n with a tail and one without, beta 0/1,
    integer values (exact sums), against guard pages; then blocks the docstring does not advertise
    but the descriptor takes (k loops with remainders, many row tiles)."""
    rng = np.random.default_rng(7)
    for bm in range(1, 33):
        for bk in range(1, 33):
            for dtype in ("f32", "bf16")[:1 + (bk % 2 == 0)]:
                n = (19, 32, 5, 48)[(bm + bk) % 4]
                d = BlockSpmm(bm=bm, bk=bk, n=n, kb=2, ldb=n + bk % 3, ldc=n + bm % 2, dtype=dtype, beta=bm % 2)
                _check_spmm(d, isa, feats, where, rng, ((bm + bk) % 2 == 0,) * 5, bk % 2, [1, 0, 1][:1 + bm % 3],
                            bm % 2, True, False)
    for bm, bk, dtype in ((33, 33, "f32"), (47, 34, "bf16"), (64, 100, "f32"), (100, 258, "bf16"), (255, 64, "f32")):
        for n in (1, 17, 70):
            d = BlockSpmm(bm=bm, bk=bk, n=n, kb=2, ldb=n + 3, ldc=n + n % 2, dtype=dtype, beta=n % 2)
            _check_spmm(d, isa, feats, where, rng, (n == 17,) * 5, 1, [1, 0, 1], 1, True, False)


@pytest.mark.parametrize("isa, feats, where", _params(NATIVE))
def test_every_n_tail(isa, feats, where):
    """n = 1..80 at blocks whose tiles hold one, several and many vectors."""
    rng = np.random.default_rng(3)
    for n in range(1, 81):
        for bm, bk, dtype in ((1, 2, "f32"), (5, 6, "bf16"), (16, 4, "f32"), (3, 18, "bf16")):
            d = BlockSpmm(bm=bm, bk=bk, n=n, kb=3, dtype=dtype, beta=n % 2)
            _check_spmm(d, isa, feats, where, rng, (n % 2 == 0,) * 5, 0, [2, 0], 0, True, n % 3 == 0)


# -- block_spmm: bad structures --------------------------------------------------------------------
_I32 = np.int32
BAD_CALLS = [   # (rowptr, colidx, values blocks, count or None, error, fix)
    ([0, 1, 2], [0, 1], 2, None, OperandError, "rowptr has shape (3,), expected (2,)"),
    ([0], [0, 1], 2, None, OperandError, "rowptr has shape (1,), expected (2,)"),
    (np.array([0, 1], np.int64), [0, 1], 2, None, OperandError, "convert with .astype(np.int32)"),
    (np.array([0, 1], np.uint32), [0, 1], 2, None, OperandError, "convert with .astype(np.int32)"),
    ([0, 2], np.array([0, 1], np.int64), 2, None, OperandError, "convert with .astype(np.int32)"),
    ([0, 1], np.array([0, 1], np.float32), 2, None, OperandError, "convert with .astype(np.int32)"),
    (np.array([0, 9, 1], _I32)[::2], [0, 1], 2, None, OperandError, "np.ascontiguousarray"),
    ([0, 2], np.array([0, 7, 1], _I32)[::2], 2, None, OperandError, "np.ascontiguousarray"),
    ([0, 2], np.array([[0], [1]], _I32), 2, None, OperandError, "expected 1"),
    ([1, 0], [0, 1], 2, None, ValueError, "0 <= rowptr[0] <= rowptr[1] <= count=2"),
    ([0, 3], [0, 1], 2, None, ValueError, "build it with tppasm.spmm.bcsr"),
    ([-1, 1], [0, 1], 2, None, ValueError, "rowptr = [-1, 1]"), ([-5, -1], [0, 1], 2, None, ValueError, "[-5, -1]"),
    ([2 ** 31 - 1, 2 ** 31 - 1], [0, 1], 2, None, ValueError, "<= count=2"),
    ([-2 ** 31, 0], [0, 1], 2, None, ValueError, "0 <= rowptr[0]"),
    ([0, 2], [0, 3], 2, None, ValueError, "colidx[1] = 3 is not a block column of A: expected 0..2"),
    ([0, 2], [-1, 0], 2, None, ValueError, "colidx[0] = -1"),
    ([1, 2], [0, 2 ** 31 - 1], 2, None, ValueError, "colidx[1] = 2147483647"),
    ([0, 2], [0, -2 ** 31], 2, None, ValueError, "colidx[1] = -2147483648"),
    ([0, 2], [0, 1], 2, 1, ValueError, "<= count=1"),
    ([0, 2], [0, 1], 2, 3, OperandError, "holds 2 blocks but count=3"),
    ([0, 2], [0, 1], 1, None, TypeError, "pass count="), ([0, 1], [0], 2, None, TypeError, "pass count="),
    ([0, 0], [0, 1], 2, 0, OperandError, "count=0, expected an int from 1"),
    ([0, 0], [0, 1], 2, -1, OperandError, "count=-1"),
    ([0, 0], [0, 1], 2, 2 ** 40, OperandError, "count=1099511627776"),
    ([0, 0], [0, 1], 2, 2 ** 64 + 1, OperandError, "expected an int from 1 to 2**30 - 1"),
    ([0, 0], [0, 1], 2, 1.0, OperandError, "count=1.0"), ([0, 0], [0, 1], 2, True, OperandError, "count=True"),
    ([0, 0], np.zeros(0, _I32), 0, None, OperandError, "count=0"),
    ([0.0, 1.0], [0, 1], 2, None, OperandError, "expected int32"),
]


@pytest.mark.parametrize("rowptr, colidx, blocks, count, error, fix", BAD_CALLS)
def test_bad_structures_are_refused_before_the_call(rowptr, colidx, blocks, count, error, fix):
    """A bad rowptr / colidx / count: the error names the fix, C and the other operands stay as they were."""
    if not native("avx2"):
        pytest.skip("needs a host that runs x86 code")
    spmm = tppasm.block_spmm(bm=4, bk=4, n=9, kb=3)
    rp = np.asarray(rowptr) if isinstance(rowptr, np.ndarray) or isinstance(rowptr[0], float) else \
        np.array(rowptr, _I32)
    ci = colidx if isinstance(colidx, np.ndarray) else np.array(colidx, _I32)
    values, b = np.ones((blocks, 4, 4), np.float32), np.ones((12, 9), np.float32)
    c = np.full((4, 9), 5.0, np.float32)
    kw = {} if count is None else {"count": count}
    for call in (spmm, spmm.reference):
        with pytest.raises(error) as info:
            call(rp, ci, values, b, c, **kw)
        assert fix in str(info.value), str(info.value)
        assert (c == 5).all() and (values == 1).all() and (b == 1).all()


def test_lists_and_overlaps_are_refused_with_the_fix():
    spmm = tppasm.block_spmm(bm=4, bk=4, n=8, kb=3)
    rp, ci, values, b = np.array([0, 2], _I32), np.array([0, 1], _I32), np.ones((2, 4, 4), np.float32), \
        np.ones((12, 8), np.float32)
    with pytest.raises(OperandError, match=r"np\.asarray\(rowptr, np\.int32\)"):
        spmm([0, 2], ci, values, b, np.zeros((4, 8), np.float32))
    buf = np.zeros(64, np.float32)
    for name, args in (("b", (rp, ci, values, b, b[:4])), ("values", (rp, ci, values, b, values.reshape(4, 8))),
                       ("colidx", (rp, buf[:2].view(_I32), values, b, buf[:32].reshape(4, 8))),
                       ("rowptr", (buf[:2].view(_I32), ci, values, b, buf[:32].reshape(4, 8)))):
        if name == "rowptr":
            args[0][...] = [0, 2]
        with pytest.raises(OperandError, match=f"output c overlaps operand {name}.*pass a separate array"):
            spmm(*args)
    ro = np.zeros((4, 8), np.float32)
    ro.flags.writeable = False
    with pytest.raises(OperandError, match="read-only"):
        spmm(rp, ci, values, b, ro)


BAD_RAW = [   # (rowptr, colidx at the row's entries; count) the raw kernel must answer with NaN in C
    ([1, 0], [0, 0], 2), ([0, 3], [0, 0], 2), ([-1, 1], [0, 0], 2), ([-2 ** 31, 0], [0, 0], 2),
    ([2 ** 31 - 1, 2 ** 31 - 1], [0, 0], 2), ([0, 1], [0, 0], 0), ([0, 2], [0, 3], 2), ([0, 2], [-1, 0], 2),
    ([0, 2], [0, 2 ** 31 - 1], 2), ([0, 2], [-2 ** 31, 0], 2), ([1, 2], [0, 3], 2), ([0, 2], [0, 1], 1),
]


@pytest.mark.parametrize("isa, feats, where", _params())
@pytest.mark.parametrize("dtype, n", [("f32", 20), ("bf16", 32)])
def test_raw_kernel_poisons_c_on_bad_structures(isa, feats, where, dtype, n):
    """Natively inside guard pages, in the interpreter in exact buffers: C all NaN, nothing outside
    C written, nothing read past rowptr or the colidx entries before the first bad one (only the
    blocks count names are mapped)."""
    for beta in (0, 1):
        d = BlockSpmm(bm=3 if isa != "amx" else 20, bk=4, n=n, kb=3, ldc=n + 3, dtype=dtype, beta=beta)
        for rowptr, cols, count in BAD_RAW:
            rng = np.random.default_rng(0)
            (rp, ci, values, b, c), c_r, stored = _spmm_operands(rng, d, where, (True,) * 5, 0, [0, 0], 0, True, False)
            rp[...] = rowptr
            ci[...] = cols
            _call(generate(d, isa, feats), isa, where, (rp, ci, values, b, c), (count,))
            bits = c.view(np.uint32)
            assert (bits == NAN_BITS).all(), f"{d} {isa} {where} rowptr={rowptr} cols={cols}: C not poisoned"
            assert _outside(c_r.view(np.uint32), c, c.shape, (d.ldc, 1), POISON) == 0


def test_raw_kernel_trusts_count_as_unsigned():
    """The raw count is the blocks stored, compared unsigned: an empty row with count 0 is C = +0.0,
    and a count of -1 (2**64 - 1) lets any row through (the checked call refuses both counts)."""
    if not native("avx512"):
        pytest.skip("needs avx512")
    code = generate(BlockSpmm(bm=2, bk=2, n=5, kb=2), "avx512")
    rp, ci, values, b = np.array([0, 0], _I32), np.zeros(1, _I32), np.ones((1, 2, 2), np.float32), np.ones((4, 5))
    for rows, count, want in (([0, 0], 0, 0.0), ([0, 1], -1, 2.0)):
        rp[...], c = rows, np.full((2, 5), np.nan, np.float32)
        code(*(x.ctypes.data for x in (rp, ci, values, b.astype(np.float32), c)), count)
        assert (c.view(np.uint32) == np.float32(want).view(np.uint32)).all()


def test_signed_zeros_are_ieee_sums():
    """beta=0 sums start at +0.0 (an empty row, or -0.0 products, give +0.0); beta=1 keeps C's -0.0
    when every product is -0.0 (-0 + -0 = -0; the reference's matmul gives +0.0 there, equal as values)."""
    rp, ci = np.array([0, 1], _I32), np.array([1], _I32)
    values, b = np.full((1, 2, 2), -0.0, np.float32), np.ones((4, 19), np.float32)
    for beta, c0, bits in ((1, -0.0, 0x80000000), (0, np.nan, 0), (0, -0.0, 0)):
        k = tppasm.block_spmm(bm=2, bk=2, n=19, kb=2, beta=beta)
        for rows in (rp, np.array([1, 1], _I32)):
            c = np.full((2, 19), c0, np.float32)
            want = c.copy()
            k(rows, ci, values, b, c)
            k.reference(rows, ci, values, b, want)
            assert (c.view(np.uint32) == bits).all() and (c == want).all(), (beta, rows, c[0, 0], want[0, 0])


@pytest.mark.parametrize("isa, feats, want", [("avx512", (), 2.0 ** -30), ("avx2", None, 2.0 ** -30),
                                               ("avx512", ("avx512_bf16",), 0.0), ("amx", None, 0.0)])
def test_denormal_bf16_values_count_as_zero_only_in_the_bf16_dot_instructions(isa, feats, want):
    """A denormal bf16 block element times a huge B: widened exactly where the code widens bf16 to
    fp32, 0 where vdpbf16ps / tdpbf16ps flush denormal inputs (tppasm.brgemm documents this; the
    spmm docstring does not)."""
    tiny, huge = np.float32(2.0 ** -130), np.float32(2.0 ** 100)       # bf16-exact: product 2^-30
    d = BlockSpmm(bm=1, bk=2, n=16, kb=1, dtype="bf16")
    rp, ci = np.array([0, 1], _I32), np.array([0], _I32)
    values = np.array([[[tiny, 0]]], np.float32).astype(BF16)
    b = tppasm.vnni_pack(np.full((2, 16), huge, np.float32).astype(BF16), 2)
    c = np.full((1, 16), np.nan, np.float32)
    where = "native" if native(isa) and set(feats or ()) <= target_features(isa) else "interp"
    if where == "interp" and not interp_available():
        pytest.skip("no interpreter")
    _call(generate(d, isa, feats), isa, where, (rp, ci, values, b, c), (1,))
    assert (c == np.float32(want)).all(), c[0, 0]


# -- block_spmm: descriptor edges ----------------------------------------------------------------
BAD_DESCRIPTORS = [
    (dict(bm=0), "bm=0; expected an int from 1 to 2**24 - 1"), (dict(bk=-1), "bk=-1"),
    (dict(bm=2 ** 24), "bm=16777216"), (dict(n=0), "n=0"), (dict(kb=0), "kb=0"),
    (dict(bm=2.0), "bm=2.0; expected an int"),
    (dict(dtype="bf16", bk=3), "bk=3; expected an even int for dtype='bf16'"), (dict(dtype="i8"), "dtype='i8'"),
    (dict(ldb=7), "ldb=7; expected an int >= n=8"), (dict(ldc=7), "ldc=7; expected an int >= n=8"),
    (dict(beta=2), "beta=2; expected 0 or 1"), (dict(beta=0.5), "beta=0.5"),
    (dict(kb=2 ** 20, bk=2 ** 8), "keeps B and C under 2 GiB"),
    (dict(bm=2 ** 20, ldc=2 ** 10), "keeps B and C under 2 GiB"),
    # a block of 2 GiB or more: the kernel's block offsets are 32-bit
    (dict(bm=2 ** 16, bk=2 ** 16, n=1, kb=1), "under 2 GiB"), (dict(bm=2 ** 14, bk=2 ** 15, n=1, kb=1), "under 2 GiB"),
    (dict(bm=2 ** 15, bk=2 ** 16, n=1, kb=1, dtype="bf16"), "under 2 GiB"),
]


@pytest.mark.parametrize("kwargs, fix", BAD_DESCRIPTORS)
def test_refused_descriptors_name_the_fix(kwargs, fix):
    args = dict(bm=4, bk=4, n=8, kb=2)
    args.update(kwargs)
    with pytest.raises(ValueError) as info:
        tppasm.block_spmm(**args)
    assert fix in str(info.value), str(info.value)


@pytest.mark.parametrize("isa", ["avx2", "avx512", "amx"])
def test_the_largest_accepted_shapes_generate(isa):
    """Edges the descriptor accepts build (blocks just under 2 GiB, 2**24 - 1 rows, a huge kb)."""
    for kwargs in (dict(bm=2 ** 24 - 1, bk=4, n=8, kb=2), dict(bm=2 ** 14, bk=2 ** 15 - 1, n=1, kb=1),
                   dict(bm=2 ** 15, bk=2 ** 15 - 2, n=1, kb=1, dtype="bf16"), dict(bm=1, bk=1, n=1, kb=2 ** 24 - 1),
                   dict(bm=1, bk=2, n=2 ** 24 - 1, kb=1, dtype="bf16")):
        d = BlockSpmm(**kwargs)
        d.validate()
        assert generate(d, isa).disassemble()


# -- gemm_nt -------------------------------------------------------------------------------------
GEMM_DTYPES = [("f32", "f32"), ("bf16", "f32"), ("bf16", "bf16")]


def _gemm_operands(rng, d, where, at_end, exact, specials):
    ops = []
    for rows, ld, end in ((d.m, d.lda, at_end[0]), (d.n, d.ldb, at_end[1])):
        r, o = _place(_extent((rows, d.k), (ld, 1)) * D(d.dtype).itemsize, where, end)
        r.view(np.uint16)[...] = 0x7FC1                       # NaN in the pads (bf16; f32 0x7FC17FC1)
        ops.append(_view(o, D(d.dtype), (rows, d.k), (ld, 1)))
        ops[-1][...] = _values(rng, (rows, d.k), D(d.dtype), exact, specials)
    poison = POISON if d.c_dtype == "f32" else POISON16
    c_r, cc = _place(_extent((d.m, d.n), (d.ldc, 1)) * poison.itemsize, where, at_end[2])
    c_r.view(poison.dtype)[...] = poison
    return ops[0], ops[1], _view(cc, D(d.c_dtype), (d.m, d.n), (d.ldc, 1)), c_r, poison


def _check_gemm(d, isa, feats, where, rng, at_end, exact, specials):
    a, b, c, c_r, poison = _gemm_operands(rng, d, where, at_end, exact, specials)
    want = np.zeros(c.shape, c.dtype)
    d.reference(a, b, want)
    code = generate_gemm_nt(d, isa, feats)
    _call(code, isa, where, (a, b, c))
    what = f"{d} on {isa} {where}{'-widen' if feats == () else ''}"
    unwritten = c.view(poison.dtype) == poison
    assert not unwritten.any(), f"{what}: {int(unwritten.sum())} elements of C not written"
    assert _outside(c_r.view(poison.dtype), c, c.shape, (d.ldc, 1), poison) == 0, f"{what}: wrote outside C"
    got, w = c.astype(np.float64), want.astype(np.float64)
    assert_same_non_finite(got, w, what)
    fin = np.isfinite(w)
    if exact:       # the fp32 sum is exact, so a bf16 C is rounded once, as the reference's
        assert np.array_equal(got[fin], w[fin]), f"{what}: exact sums differ"
        return
    with np.errstate(all="ignore"):
        bound = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T
    err = np.abs(got[fin] - w[fin])
    tol = (d.k + 8) * 2.0 ** -24 * bound[fin] + (2.0 ** -7 * np.abs(w[fin]) if d.c_dtype == "bf16" else 0)
    assert (err <= tol).all(), f"{what}: error {err.max()} over the bound"


_KS = st.one_of(st.integers(1, 300), st.sampled_from([511, 1023, 1025, 2047, 2049, 4096, 4097, 4099]))


@st.composite
def _gemm_draw(draw, ms=st.integers(1, 300), ns=st.integers(1, 300), ks=_KS):
    m, n, k = draw(ms), draw(ns), draw(ks)
    dt, cdt = draw(st.sampled_from(GEMM_DTYPES))

    def ld(least):
        return draw(st.sampled_from([least, least, least + 1, least + 7, least + 32, -(-least // 1024) * 1024 + 1024]))
    return GemmNT(m, n, k, ld(k), ld(k), ld(n), dt, cdt)


@pytest.mark.parametrize("isa, feats, where", _params(NATIVE))
@settings(max_examples=60, deadline=None)
@given(d=_gemm_draw(ms=st.one_of(st.integers(1, 20), st.integers(1, 300)), ns=st.one_of(st.integers(1, 20),
                                                                                         st.integers(1, 300))),
       at_end=st.tuples(*[st.booleans()] * 3), exact=st.booleans(), specials=st.booleans(), seed=st.integers(0, 999))
@example(d=GemmNT(5, 9, 4099, 4099, 5120, 9, "bf16", "bf16"), at_end=(True,) * 3, exact=True, specials=False, seed=0)
@example(d=GemmNT(300, 299, 257, 1024, 258, 1024), at_end=(False,) * 3, exact=False, specials=True, seed=1)
def test_gemm_nt_inside_guard_pages(isa, feats, where, d, at_end, exact, specials, seed):
    _check_gemm(d, isa, feats, where, np.random.default_rng(seed), at_end, exact, specials)


@pytest.mark.parametrize("isa, feats, where", _params(INTERP))
@settings(max_examples=10, deadline=None)
@given(d=_gemm_draw(ms=st.integers(1, 9), ns=st.integers(1, 11), ks=st.integers(1, 70)),
       exact=st.booleans(), specials=st.booleans(), seed=st.integers(0, 999))
def test_gemm_nt_in_the_interpreter(isa, feats, where, d, exact, specials, seed):
    _check_gemm(d, isa, feats, where, np.random.default_rng(seed), (True,) * 3, exact, specials)


@pytest.mark.parametrize("isa, feats, where", _params(NATIVE))
def test_gemm_nt_every_k_tail(isa, feats, where):
    """k = 1..130 (every tail of 8, 16 and 32 lanes, twice) at m, n that leave block remainders."""
    rng = np.random.default_rng(5)
    for k in range(1, 131):
        for dt, cdt in GEMM_DTYPES:
            d = GemmNT(1 + k % 6, 1 + k % 10, k, k + k % 3, k, 1 + k % 10 + k % 2, dt, cdt)
            _check_gemm(d, isa, feats, where, rng, (k % 2 == 0, k % 3 == 0, k % 2 == 1), True, k % 5 == 0)


BIG = 3.3895314e38                                                   # the largest finite bf16
# rows of three bf16 values whose fp32 sum is exact and lies on, next to or past a bf16 rounding
# tie (ties to even both ways, overflow to inf, a denormal part, inf, NaN)
BF16_SUMS = [(1, 2.0 ** -8, 0), (1 + 2.0 ** -7, 2.0 ** -8, 0), (1, 2.0 ** -8, 2.0 ** -16), (1, -2.0 ** -9, 0),
            (1, 2.0 ** -8, -2.0 ** -16), (BIG, 2.0 ** 119, 0), (-BIG, -2.0 ** 119, 0), (BIG, 2.0 ** 119, -2.0 ** 100),
            (2.0 ** -126, 2.0 ** -133, 0), (np.inf, 1, 0), (np.nan, 1, 0), (-2.0 ** 100, 2.0 ** 100, -0.0)]


@pytest.mark.parametrize("isa, feats, where", _params())
def test_gemm_nt_bf16_c_rounds_once_to_nearest_even(isa, feats, where):
    """c_dtype='bf16' is the fp32 sum rounded to nearest even once (ties to even, overflow to inf,
    NaN quiet): bit-exact against ml_dtypes' rounding of the exact fp32 sum, but for a denormal
    input, which the bf16 dot instructions flush to zero (gemm_nt's docstring does not say so)."""
    terms = np.array(BF16_SUMS, np.float32)
    exact = terms.astype(BF16)
    assert np.array_equal(exact.astype(np.float32), terms, equal_nan=True)
    m, k = terms.shape
    d = GemmNT(m, 3, k, dtype="bf16", c_dtype="bf16")
    b = np.ones((3, k), BF16)
    c = np.full((m, 3), np.nan, BF16)
    _call(generate_gemm_nt(d, isa, feats), isa, where, (exact, b, c))
    with np.errstate(all="ignore"):
        sums = terms.astype(np.float64).sum(axis=1)
    assert np.array_equal(sums.astype(np.float32), terms.sum(axis=1), equal_nan=True)      # fp32 sums exact
    want16 = sums.astype(np.float32).astype(BF16).view(np.uint16)
    tiny = np.abs(terms) < np.finfo(np.float32).tiny
    flushed16 = np.where(tiny, 0, terms).astype(np.float64).sum(axis=1).astype(np.float32).astype(BF16).view(np.uint16)
    got16 = c.view(np.uint16)[:, 0]
    fin = ~np.isnan(sums)
    # vdpbf16ps / tdpbf16ps treat denormal inputs as zero (DAZ): only a row with a denormal may differ
    ok = (got16 == want16) | (tiny.any(axis=1) & (got16 == flushed16))
    assert ok[fin].all(), [hex(v) for v in got16]
    assert all((g & 0x7FC0) == 0x7FC0 for g in got16[~fin]), "NaN not quiet"
    assert (c.view(np.uint16) == got16[:, None]).all()


LONG_ROWS = [   # (kwargs, fix)
    (dict(k=2 ** 24 + 1), "split k into chunks of at most 16777216"),
    (dict(k=2 ** 25 + 1, dtype="bf16"), "split k into chunks of at most 33554432"),
    (dict(k=4099, lda=2 ** 24 + 1), "lda=16777217 spans more than 64 MiB per row; call it on a copy with dense rows"),
    (dict(k=4099, ldb=2 ** 24 + 1), "ldb=16777217 spans more than 64 MiB"),
    (dict(n=2 ** 24 + 1), "split n into column blocks of at most 16777216"),
    (dict(n=2 ** 25 + 1, dtype="bf16", c_dtype="bf16"), "split n into column blocks of at most 33554432"),
    (dict(n=5, ldc=2 ** 24 + 1), "ldc=16777217 spans more than 64 MiB"), (dict(m=0), "m must be an int >= 1"),
    (dict(k=-3), "k must be an int >= 1"), (dict(lda=3), "lda=3 is too small; it must be >= 4"),
    (dict(ldc=2), "ldc=2 is too small; it must be >= 3"), (dict(dtype="i8"), "dtype='i8'; expected one of f32, bf16"),
    (dict(c_dtype="bf16"), "c_dtype='bf16'; expected 'f32' for dtype='f32'"),
    (dict(dtype="bf16", c_dtype="i32"), "expected 'f32' or 'bf16'"),
]


@pytest.mark.parametrize("kwargs, fix", LONG_ROWS)
def test_gemm_nt_refuses_with_the_fix(kwargs, fix):
    args = dict(m=2, n=3, k=4)
    args.update(kwargs)
    with pytest.raises(ValueError) as info:
        tppasm.gemm_nt(**args)
    assert fix in str(info.value), str(info.value)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_gemm_nt_rows_at_max_row_bytes_run(isa):
    """Row strides of exactly MAX_ROW_BYTES (accepted) over sparse mappings: the displacements of
    the last rows of a block reach 7 * 64 MiB."""
    if not native(isa):
        pytest.skip(f"host does not run {isa}")
    ld, (m, n, k), rng = MAX_ROW_BYTES // 4, (5, 9, 37), np.random.default_rng(0)
    d = GemmNT(m, n, k, ld, ld, ld, "f32")
    ops = []
    for rows, cols in ((m, k), (n, k), (m, n)):
        buf = mmap.mmap(-1, ((rows - 1) * ld + cols) * 4,
                        flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000))
        ops.append(np.ndarray((rows, cols), np.float32, buffer=buf, strides=(ld * 4, 4)))
        ops[-1][...] = rng.integers(-4, 5, (rows, cols)) if len(ops) < 3 else np.nan
    a, b, c = ops
    generate_gemm_nt(d, isa)(a.ctypes.data, b.ctypes.data, c.ctypes.data)
    assert np.array_equal(c, a.astype(np.float64) @ b.astype(np.float64).T)


def test_gemm_nt_public_call_refuses_what_does_not_match():
    if not native("avx2"):
        pytest.skip("needs a host that runs x86 code")
    g = tppasm.gemm_nt(3, 4, 5)
    a, b = np.ones((3, 5), np.float32), np.ones((4, 5), np.float32)
    buf = np.zeros(64, np.float32)
    with pytest.raises(OperandError, match="overlaps"):
        g(buf[:15].reshape(3, 5), b, buf[:12].reshape(3, 4))
    with pytest.raises(OperandError, match="overlaps"):
        g(a, buf[:20].reshape(4, 5), buf[8:20].reshape(3, 4))
    with pytest.raises(OperandError, match=r"astype\(np.float32\)"):
        g(a.astype(np.float64), b)
    with pytest.raises((OperandError, ValueError), match="ascontiguousarray|strides"):
        g(np.ones((5, 3), np.float32).T, b)
    with pytest.raises((OperandError, ValueError), match="shape"):
        g(a, b[:3])
    gram = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert np.array_equal(tppasm.gemm_nt(3, 3, 4)(gram, gram), gram @ gram.T)      # a is b: both only read
    c = tppasm.gemm_nt(3, 4, 5, dtype="bf16", c_dtype="bf16")(a.astype(BF16), b.astype(BF16))
    assert c.dtype == BF16 and (c.astype(np.float32) == 5).all()
