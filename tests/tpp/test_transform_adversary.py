"""An adversarial pass over the layout transforms (transpose, vnni2/vnni4 and their unpacks) as a
demanding user would call them: every op and dtype the descriptor accepts, shapes 1..70 and large or
odd ones, leading dimensions past the minimum (4 KiB-aliased ones, which take transform's lag path,
and near-aliased ones), operands against inaccessible pages, at avx2 and avx512 natively and at
avx2, avx512 and amx in isa.x86.interp. A transform moves bits, not values: inputs are random bytes
(NaN payloads, signalling NaNs, -0.0, denormals, int8 -128, every bf16 pattern) and the reference
is NumPy's transpose of the unsigned-integer view. Outputs start as a NaN poison that no input
element equals, so every element must be written, and no byte between or past the output rows may
change. Shapes, leading dimensions and dtypes the transform does not take must raise a
TypeError/ValueError that names the fix."""
import contextlib
import ctypes
import mmap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tppasm
from tppasm.dtypes import dtype as D
from tppasm.eltwise import Transform
from tppasm.kernel import get_kernel
from tppasm.x86.transform import _lag
from tests.support import native, run_raw

OPS = ("transpose", "vnni2", "vnni4", "unvnni2", "unvnni4")
DTYPES = ("f32", "bf16", "i8", "u8", "i32", "i64")
TAIL_DTYPES = ("f32", "bf16", "i8", "i32", "i64")      # u8 moves bytes as i8 does (drawn tests take it)
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
# output poison, bytes of the unsigned view: f32 0x7FA5A5A5 and bf16 0x7FA5 are NaNs with a payload,
# f64 would read 0x7FA5... as one too; each input element equal to it is changed in one bit
POISON = {1: 0xA5, 2: 0x7FA5, 4: 0x7FA5A5A5, 8: 0x7FA5A5A5A5A5A5A5}
# bit patterns that only a bit-exact copy keeps (besides the random bytes around them)
SPECIALS = {
    4: [0x7FC00001, 0x7F800001, 0xFFBFFFFF, 0x80000000, 0x00000001, 0x807FFFFF, 0x7F800000, 0xFF800000],
    2: [0x7FC1, 0x7F81, 0xFFFF, 0x8000, 0x0001, 0x807F, 0x7F80, 0xFF80],
    1: [0x80, 0x7F, 0xFF, 0x00, 0x01],
    8: [0x8000000000000000, 0x7FF0000000000001, 0xFFFFFFFFFFFFFFFF, 0x1, 0x7FF8000000000000],
}
_X86 = ("avx2", "avx512")
_INTERPRETED = [pytest.param(i, id=f"{i}-interp") for i in ("avx2", "avx512", "amx")]


def _native_params():
    return [pytest.param(i, id=i, marks=() if native(i) else pytest.mark.skip(
        reason=f"the host does not run {i} natively")) for i in _X86]


def _layout(op, dt, m, n, ldx, ldo):
    """(descriptor, x shape, x ld, out shape, out ld) with ``ldx``/``ldo`` 0 for the defaults."""
    f = int(op[-1]) if "vnni" in op else 1
    packed = (-(-m // f), n, f)
    if op == "transpose":
        ldx, ldo = ldx or n, ldo or m
        return Transform(op, m, n, ldx, ldo, dt), (m, n), ldx, (n, m), ldo
    if op.startswith("vnni"):
        ldx = ldx or n
        return Transform(op, m, n, ldx, 0, dt), (m, n), ldx, packed, 0
    ldo = ldo or n
    return Transform(op, m, n, 0, ldo, dt), packed, 0, (m, n), ldo


def reference_bits(op, x, m, n):
    """The output of ``op`` as unsigned integers, from x's unsigned view: rows past k packed as 0.

    >>> reference_bits("vnni2", np.arange(6, dtype=np.uint16).reshape(3, 2), 3, 2).tolist()
    [[[0, 2], [1, 3]], [[4, 0], [5, 0]]]
    """
    if op == "transpose":
        return x.T
    f = int(op[-1])
    if op.startswith("vnni"):
        rows = np.zeros((-(-m // f) * f, n), x.dtype)
        rows[:m] = x
        return rows.reshape(-1, f, n).transpose(0, 2, 1)
    return x.transpose(0, 2, 1).reshape(-1, n)[:m]


def _count(shape, ld):
    """Elements from an operand's first to its last (rows ``ld`` apart; a packed one is dense)."""
    return int(np.prod(shape)) if len(shape) == 3 else (shape[0] - 1) * ld + shape[1]


def _view(flat, shape, ld):
    """``shape`` over ``flat`` (rows ``ld`` apart), a view whose base is ``flat``."""
    if len(shape) == 3:
        return flat.reshape(shape)
    return np.ndarray(shape, flat.dtype, buffer=flat, strides=(ld * flat.itemsize, flat.itemsize))


_PAGE = mmap.PAGESIZE


def fenced(nbytes, at_end, slack=0):
    """(region, operand bytes): a mapping whose first and last pages are inaccessible; ``region``
    (uint8) is all the bytes between, the operand's ``nbytes`` end at the last page (``at_end``)
    or start at the first, and ``slack`` bytes more lie on its other side, inside the region.

    >>> region, op = fenced(10, True); op.size, region.size % mmap.PAGESIZE, op[-1:].ctypes.data % mmap.PAGESIZE
    (10, 0, 4095)
    """
    pages = -(-(nbytes + slack) // _PAGE) + 2
    buf = mmap.mmap(-1, pages * _PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None)
    for page in (0, pages - 1):
        assert libc.mprotect(ctypes.c_void_p(base + page * _PAGE), _PAGE, 0) == 0
    region = np.frombuffer(buf, np.uint8, count=(pages - 2) * _PAGE, offset=_PAGE)
    start = region.size - nbytes if at_end else 0
    return region, region[start:start + nbytes]


def _inputs(rng, count, es):
    """``count`` random elements (as unsigned ints) with SPECIALS sprinkled in, none equal to the poison."""
    u = UINT[es]
    bits = rng.integers(0, 256, count * es, dtype=np.uint8).view(u)
    hit = rng.random(count) < 0.25
    bits[hit] = rng.choice(np.array(SPECIALS[es], u), int(hit.sum()))
    bits[bits == POISON[es]] ^= u(1)
    return bits


def check(isa, op, dt, m, n, ldx=0, ldo=0, *, at_end=(True, True), interpret=False, seed=0):
    """Run ``op`` and compare bits with :func:`reference_bits`; the poison outside the output stays.

    Natively x and out lie against inaccessible pages (``at_end``: whether each ends at one, else
    starts after one) with 64 bytes on the other side; ``interpret`` runs the code in isa.x86.interp
    on buffers holding just the operands (any access outside them faults there)."""
    desc, xshape, ldx, oshape, ldo = _layout(op, dt, m, n, ldx, ldo)
    es, u = D(dt).itemsize, UINT[D(dt).itemsize]
    kernel = get_kernel(desc, isa)
    xcount, ocount = _count(xshape, ldx), _count(oshape, ldo)
    if interpret:
        xbytes, oregion = np.empty(xcount * es, np.uint8), np.empty(ocount * es, np.uint8)
        obytes = oregion
    else:
        xbytes = fenced(xcount * es, at_end[0], 64)[1]
        oregion, obytes = fenced(ocount * es, at_end[1], 64)
    rng = np.random.default_rng(seed)
    xbytes.view(u)[...] = _inputs(rng, xcount, es)
    oregion.view(u)[...] = POISON[es]
    x, out = _view(xbytes.view(D(dt)), xshape, ldx), _view(obytes.view(D(dt)), oshape, ldo)
    want = reference_bits(op, x.view(u), m, n).copy()
    run_raw(kernel, (x, out), isa=isa, interpret=interpret)
    what = f"{op} {dt} {m}x{n} ldx={ldx} ldo={ldo} on {isa}{' (interpreter)' if interpret else ''}"
    got = out.view(u)
    unwritten = got == POISON[es]
    assert not unwritten.any(), f"{what}: {int(unwritten.sum())} output elements not written, e.g. at " \
                                f"{np.argwhere(unwritten)[:3].tolist()}"
    wrong = got != want
    assert not wrong.any(), f"{what}: {int(wrong.sum())} elements differ, first at {np.argwhere(wrong)[0].tolist()}"
    outside = np.ones(oregion.size // es, bool)
    start = (obytes.ctypes.data - oregion.ctypes.data) // es
    _view(outside[start:start + ocount], oshape, ldo)[...] = False
    changed = oregion.view(u)[outside] != POISON[es]
    assert not changed.any(), f"{what}: {int(changed.sum())} elements outside the output changed"


# -- drawn shapes, every op and dtype ----------------------------------------------------------
_PADS = st.sampled_from([0, 0, 1, 2, 3, 7, 16, 17, 33])


def _lds(op, m, n, padx, pado):
    """(ldx, ldo) past the minimum by the pads, 0 where the op takes none."""
    if op == "transpose":
        return n + padx, m + pado
    return (n + padx, 0) if op.startswith("vnni") else (0, n + pado)


@pytest.mark.parametrize("isa", _native_params())
@settings(max_examples=250, deadline=None)
@given(op=st.sampled_from(OPS), dt=st.sampled_from(DTYPES), m=st.integers(1, 70), n=st.integers(1, 70),
       padx=_PADS, pado=_PADS, at_end=st.tuples(st.booleans(), st.booleans()), seed=st.integers(0, 2 ** 16))
def test_drawn_transforms_move_bits_inside_guard_pages(isa, op, dt, m, n, padx, pado, at_end, seed):
    ldx, ldo = _lds(op, m, n, padx, pado)
    check(isa, op, dt, m, n, ldx, ldo, at_end=at_end, seed=seed)


@pytest.mark.parametrize("isa", _INTERPRETED)
@settings(max_examples=60, deadline=None)
@given(op=st.sampled_from(OPS), dt=st.sampled_from(DTYPES), m=st.integers(1, 70), n=st.integers(1, 70),
       padx=_PADS, pado=_PADS, seed=st.integers(0, 2 ** 16))
def test_drawn_transforms_in_the_interpreter(isa, op, dt, m, n, padx, pado, seed):
    """The same in isa.x86.interp, where AVX2-only hosts test the AVX-512 (and amx-level) code."""
    ldx, ldo = _lds(op, m, n, padx, pado)
    check(isa, op, dt, m, n, ldx, ldo, interpret=True, seed=seed)


# -- every tail, not a sample -------------------------------------------------------------------
def _edge_counts(block):
    """Counts around a block: 1, the tails below it, one block, the tails of a second one, and more."""
    return sorted({1, 2, block - 1, block, block + 1, 2 * block - 1, 2 * block, 2 * block + 3})


@pytest.mark.parametrize("isa", _native_params())
@pytest.mark.parametrize("dt", TAIL_DTYPES)
def test_every_transpose_tail_of_every_dtype(isa, dt):
    """Every column count up to two blocks and over against row counts around a block (i32 takes
    the f32 code, untested elsewhere), with the output at a guard page and then the input."""
    es = D(dt).itemsize
    rows = 16 if es == 1 else 8
    for n in range(1, 2 * rows + 4):
        for i, m in enumerate(_edge_counts(rows)):
            check(isa, "transpose", dt, m, n, n + i % 3, m + n % 2, at_end=(i % 2 == 0, i % 2 == 1), seed=n * 31 + m)


@pytest.mark.parametrize("isa", _native_params())
@pytest.mark.parametrize("op", OPS[1:])
@pytest.mark.parametrize("dt", TAIL_DTYPES)
def test_every_vnni_tail_of_every_dtype(isa, op, dt):
    """Every column count up to two 32-byte chunks and over, against a lone partial group and whole
    groups followed by a last group of each size (each takes its own unpack path: rows 2-3 of vnni4)."""
    f, cols = int(op[-1]), 32 // D(dt).itemsize
    for n in list(range(1, 2 * cols + 2)) + [3 * cols + 1]:
        for m in (1, f + 1, 2 * f + 2, 3 * f - 1):
            pad = n % 3
            ldx, ldo = (n + pad, 0) if op.startswith("vnni") else (0, n + pad)
            check(isa, op, dt, m, n, ldx, ldo, at_end=(n % 2 == 0, m % 2 == 0), seed=n * 7 + m)


# -- large and odd shapes, 4 KiB-aliased and near-aliased leading dimensions ------------------
def _big_cases():
    """(op, dtype, m, n, ldx, ldo), 0 for the minimum; ``a`` is 4 KiB in elements (the lds near it alias)."""
    cases = []
    for dt in DTYPES:
        a = 4096 // D(dt).itemsize
        cases += [("transpose", dt, 4096, 16, 0, 4096), ("transpose", dt, 1024, 8, 0, max(a, 1024)),
                  ("transpose", dt, 3, 4099, 0, 0), ("transpose", dt, 4099, 3, 0, 0),
                  ("transpose", dt, 1, 4099, 0, 0), ("transpose", dt, 4099, 1, 0, 0),
                  ("transpose", dt, 200, 13, a + 1, a), ("transpose", dt, 137, 17, a, a - 1),
                  ("transpose", dt, 73, 9, 0, a + 1), ("vnni2", dt, 4096, 16, a, 0), ("vnni4", dt, 1027, 8, a - 1, 0),
                  ("vnni4", dt, 3, 4099, 0, 0), ("unvnni2", dt, 4099, 3, 0, a), ("unvnni4", dt, 1025, 9, 0, a + 1),
                  ("unvnni2", dt, 3, 4099, 0, 0)]
    for dt, a in (("f32", 1024), ("i32", 1024), ("i64", 512)):   # the lag path and around it
        cases += [("transpose", dt, 72, 8, 0, a), ("transpose", dt, 71, 8, 0, a),
                  ("transpose", dt, 100, 100, a, 2 * a), ("transpose", dt, a - 24, 8, 0, a - 1),
                  ("transpose", dt, a, 8, 0, a + 1), ("transpose", dt, 264, 15, a, 3 * a),
                  ("transpose", dt, 130, 8, 0, a)]
    return cases


BIG = _big_cases()


def _lags(case):
    op, dt, m, n, ldx, ldo = case
    return op == "transpose" and _lag(m, n, ldx or n, ldo or m, D(dt).itemsize) > 0


def test_the_big_cases_take_the_lag_path_and_others():
    """The cases below reach the lag path for f32, i32 and i64, and plain code beside it."""
    lagging = {c[1] for c in BIG if _lags(c)}
    assert lagging == {"f32", "i32", "i64"} and sum(map(_lags, BIG)) >= 12
    assert any(not _lags(c) and c[1] == "f32" and c[5] == 1024 for c in BIG)


@pytest.mark.parametrize("isa", _native_params())
@pytest.mark.parametrize("case", BIG, ids=lambda c: "-".join(map(str, c)))
def test_big_and_aliased_shapes(isa, case):
    op, dt, m, n, ldx, ldo = case
    check(isa, op, dt, m, n, ldx, ldo, at_end=(True, True), seed=m + n)
    check(isa, op, dt, m, n, ldx, ldo, at_end=(False, False), seed=m * n)


@pytest.mark.parametrize("isa", _INTERPRETED)
def test_lagging_and_big_shapes_in_the_interpreter(isa):
    """The lag path (and a few big shapes) of each level's code in isa.x86.interp."""
    chosen = [c for c in BIG if _lags(c) or (c[2] * c[3] < 20000 and c[1] in ("i8", "bf16"))]
    for i, (op, dt, m, n, ldx, ldo) in enumerate(chosen):
        check(isa, op, dt, m, n, ldx, ldo, interpret=True, seed=i)


# rows of x so far apart that the lag path's loads 64 (f32) or 32 (i64) rows back only just fit a 32-bit
# displacement, or no longer do (then no lag), with 4 KiB-aliased output rows: (dtype, m, n, ldx, ldo, lags)
_LAG_EDGE = [("f32", 80, 8, 7456540, 1024, True), ("f32", 80, 8, 7456541, 1024, False),
             ("f32", 137, 13, 7456537, 1024, True), ("i64", 48, 8, 6710885, 512, True),
             ("i64", 50, 9, 6710885, 1024, True), ("i64", 48, 8, 6710887, 512, False)]


@pytest.mark.parametrize("isa", _native_params())
@pytest.mark.parametrize("dt,m,n,ldx,ldo,lags", _LAG_EDGE)
def test_the_lag_path_at_its_2gib_edge(isa, dt, m, n, ldx, ldo, lags):
    """x in a sparse mapping (only the touched pages become resident); the output's padding stays."""
    es = D(dt).itemsize
    assert (_lag(m, n, ldx, ldo, es) > 0) == lags
    buf = mmap.mmap(-1, ((m - 1) * ldx + n) * es,
                    flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000))
    x = np.ndarray((m, n), D(dt), buffer=buf, strides=(ldx * es, es))
    x[...] = np.arange(m * n).reshape(m, n) * 3 - 100
    out = np.full((n, ldo), 77, D(dt))
    run_raw(get_kernel(Transform("transpose", m, n, ldx, ldo, dt), isa), (x, out[:, :m]), isa=isa)
    assert np.array_equal(out[:, :m], x.T) and (out[:, m:] == 77).all()
    del x
    buf.close()


# -- values that survive only a copy of bits -----------------------------------------------------
@pytest.mark.parametrize("isa", _native_params())
@pytest.mark.parametrize("dt", DTYPES)
def test_special_values_through_the_public_call(isa, dt):
    """A public call (the checked entry, not the raw code) of each op keeps every special pattern:
    a NaN payload, a signalling NaN, -0.0, a denormal, int8 -128, bf16's own NaNs; vnni then unvnni
    gives the input's bits back."""
    es, u = D(dt).itemsize, UINT[D(dt).itemsize]
    m, n = 19, 11
    bits = np.resize(np.array(SPECIALS[es], u), m * n).reshape(m, n)
    x = bits.view(D(dt))
    out = tppasm.transform("transpose", m, n, dtype=dt, isa=isa)(x)
    assert np.array_equal(out.view(u), bits.T)
    for f in (2, 4):
        packed = tppasm.transform(f"vnni{f}", m, n, dtype=dt, isa=isa)(x)
        assert np.array_equal(packed.view(u), reference_bits(f"vnni{f}", bits, m, n))
        back = np.empty_like(x)
        tppasm.transform(f"unvnni{f}", m, n, dtype=dt, isa=isa)(packed, back)
        assert np.array_equal(back.view(u), bits)


# -- refusals -------------------------------------------------------------------------------------
T = tppasm.transform
REFUSED = [
    (lambda: T("transpose2", 4, 4), "is not one of transpose, vnni2"),
    (lambda: T(None, 4, 4), "op=None"),
    (lambda: T("transpose", 0, 4), "m must be an int >= 1"),
    (lambda: T("transpose", 4, -1), "n must be an int >= 1"),
    (lambda: T("transpose", 4.0, 4), "expected an int"),
    (lambda: T("transpose", True, 4), "expected an int"),
    (lambda: T("transpose", "4", 4), "expected an int"),
    (lambda: T("transpose", 4, 4, dtype="f64"), "the dtypes are f32"),
    (lambda: T("transpose", 4, 4, dtype=np.float64), "convert with .astype(np.float32)"),
    (lambda: T("transpose", 4, 4, dtype=np.float16), "convert with .astype(np.float32)"),
    (lambda: T("vnni2", 4, 4, dtype=np.int16), "convert with .astype(np.int8)"),
    (lambda: T("transpose", 4, 4, dtype=np.bool_), "the dtypes are f32"),
    (lambda: T("transpose", 4, 4, dtype=None), "the dtypes are f32"),
    (lambda: T("transpose", 4, 8, ldx=7), "ldx=7 is too small; it must be >= 8"),
    (lambda: T("transpose", 4, 8, ldx=-8), "it must be >= 8"),
    (lambda: T("transpose", 4, 8, ldo=3), "ldo=3 is too small; it must be >= 4"),
    (lambda: T("transpose", 4, 8, ldx=9.0), "expected an int"),
    (lambda: T("vnni4", 4, 8, ldx=7, dtype="i8"), "ldx=7 is too small"),
    (lambda: T("vnni2", 4, 8, ldo=8, dtype="bf16"), "leave ldo out"),
    (lambda: T("unvnni2", 4, 8, ldx=8, dtype="bf16"), "leave ldx out"),
    (lambda: T("unvnni4", 4, 8, ldo=7, dtype="i8"), "ldo=7 is too small; it must be >= 8"),
    (lambda: T("transpose", 4, 8, ldx=9, ldi=10), "pass ldx only"),
    (lambda: T("transpose", 4, 8, lda=10), "unexpected keyword argument 'lda'"),
    (lambda: T("transpose", 4, 8, isa="sse2"), "expected one of 'avx2'"),
    (lambda: T("transpose", 4, 8, ldx=2 ** 29), "keep leading dimensions, rows and strides under 2 GiB"),
    (lambda: T("transpose", 2 ** 40, 8), "under 2 GiB"),
    (lambda: T("vnni2", 5, 2 ** 30 + 3, dtype="bf16"), "under 2 GiB"),
]


@pytest.mark.parametrize("make,fix", REFUSED, ids=[f for _, f in REFUSED])
def test_refused_descriptors_name_the_fix(make, fix):
    with pytest.warns(DeprecationWarning) if "pass ldx only" in fix else contextlib.nullcontext():
        with pytest.raises((TypeError, ValueError)) as info:
            make()
    assert fix in str(info.value), str(info.value)


_x = np.arange(24, dtype=np.float32).reshape(4, 6)
_bf = np.arange(30).reshape(5, 6).astype(D("bf16"))
_shared = np.arange(200, dtype=np.float32)
_readonly = np.empty((6, 4), np.float32)
_readonly.flags.writeable = False
CALLS_REFUSED = [
    (lambda: T("transpose", 4, 6)(_x, np.empty((4, 6), np.float32)), "expected (6, 4)"),
    (lambda: T("transpose", 4, 6)(_x, np.empty((6, 4), np.float64)), "pass a float32 output"),
    (lambda: T("transpose", 4, 6)(_x.astype(np.int32), np.empty((6, 4), np.float32)), "convert with .astype"),
    (lambda: T("transpose", 4, 6)(np.asfortranarray(_x), np.empty((6, 4), np.float32)), "np.ascontiguousarray"),
    (lambda: T("transpose", 4, 6)(np.zeros((4, 8), np.float32)[:, :6], np.empty((6, 4), np.float32)),
     "build the kernel with ldx=8"),
    (lambda: T("transpose", 4, 6)(_x, np.zeros((6, 5), np.float32)[:, :4]), "build the kernel with ldo=5"),
    (lambda: T("transpose", 4, 6)(_x, np.empty((4, 6), np.float32).T), "pass a contiguous output"),
    (lambda: T("transpose", 4, 6)(_x[::-1], np.empty((6, 4), np.float32)), "np.ascontiguousarray"),
    (lambda: T("transpose", 4, 6)(_x, _readonly), "pass a writable array"),
    (lambda: T("transpose", 4, 6)(_x.ravel(), np.empty((6, 4), np.float32)), "expected 2"),
    (lambda: T("transpose", 4, 6)(_x.tolist(), np.empty((6, 4), np.float32)), "pass tppasm.aligned"),
    (lambda: T("transpose", 4, 6)(_x, np.empty((6, 4), np.float32), _x), "got 3 arrays"),
    (lambda: T("transpose", 8, 8)(_shared[:64].reshape(8, 8), _shared[32:96].reshape(8, 8)), "overlaps operand x"),
    (lambda: T("vnni2", 5, 6, dtype="bf16")(_bf, np.empty((2, 6, 2), D("bf16"))), "expected (3, 6, 2)"),
    (lambda: T("vnni2", 5, 6, dtype="bf16")(_bf, np.empty((3, 12), D("bf16"))), "expected 3"),
    (lambda: T("vnni2", 5, 6, dtype="bf16")(_bf, np.empty((3, 6, 2), np.uint16)), "pass a bfloat16 output"),
    (lambda: T("unvnni2", 5, 6, dtype="bf16")(np.empty((3, 7, 2), D("bf16"))[:, :6], np.empty((5, 6), D("bf16"))),
     "np.ascontiguousarray"),
]


@pytest.mark.parametrize("call,fix", CALLS_REFUSED, ids=[f for _, f in CALLS_REFUSED])
def test_refused_calls_name_the_fix(call, fix):
    """Arrays that do not match the kernel are refused before any code runs, with the fix."""
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    assert fix in str(info.value), str(info.value)


def test_misaligned_elements_and_views_that_match_run():
    """Arrays the kernel does take: an f32 operand one byte off alignment, views whose rows are ldx apart."""
    x = np.zeros(24 * 4 + 1, np.uint8)[1:].view(np.float32).reshape(4, 6)
    x[...] = np.arange(24).reshape(4, 6)
    out = np.empty((7, 4), np.float32)[:6]
    T("transpose", 4, 6)(x, out)
    assert np.array_equal(out, x.T)
    wide = np.arange(40, dtype=np.float32).reshape(4, 10)
    out = np.full((6, 9), np.nan, np.float32)
    T("transpose", 4, 6, ldx=10, ldo=9)(wide[:, :6], out[:, :4])
    assert np.array_equal(out[:, :4], wide[:, :6].T) and np.isnan(out[:, 4:]).all()
