"""An adversarial pass over the x86 BRGEMM (AVX2 / AVX-512): what tests/tpp/test_brgemm.py and its
neighbours leave out. Operands against inaccessible pages at both ends (natively: a read or write
past an operand faults; in the interpreter: outside the mapped arrays), NaN / inf / -0.0 in B and
in a beta=1 C, int8 extremes whose sums wrap, a bf16 C rounded once to nearest even against a
float64 reference, overlapping / repeated / descending batch blocks, batch strides past 2 GiB,
batch chunk boundaries, and the refusals of a wrong call."""
import ctypes
import mmap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tppasm
from tppasm.brgemm import Brgemm, _view
from tppasm.dtypes import dtype as np_dtype
from tppasm.operand import OperandError
from tppasm.x86 import brgemm as x86_brgemm
from tests.support import assert_same_non_finite, native
from tests.tpp.test_brgemm import _check, _filled, _params, _run

PAGE = mmap.PAGESIZE
_MAPS = []     # the guarded mappings stay mapped while arrays view them (freed with the process)


def _guarded(nbytes, at_end):
    """``nbytes`` bytes directly before (``at_end``) or after an inaccessible page, as uint8."""
    pages = -(-max(nbytes, 1) // PAGE) + 2
    buf = mmap.mmap(-1, pages * PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None)
    for page in (0, pages - 1):
        assert libc.mprotect(ctypes.c_void_p(base + page * PAGE), PAGE, 0) == 0
    _MAPS.append(buf)
    start = (pages - 1) * PAGE - nbytes if at_end else PAGE
    return np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=start)


def _extent(spec):
    return 1 + sum((d - 1) * s for d, s in zip(spec.shape, spec.strides))


def _blocks_in(flat, spec, count, stride):
    """``count`` blocks of ``spec`` ``stride`` elements apart from the start of ``flat`` (its base is
    ``flat``, so the interpreter maps exactly ``flat``)."""
    es = flat.itemsize
    return np.ndarray((count,) + spec.shape, flat.dtype, buffer=flat,
                      strides=[stride * es] + [s * es for s in spec.strides])


def _flat(rng, size, dt, guard):
    """``size`` random elements of ``dt``: against a guard page (``guard`` "end" / "start") or plain."""
    vals = _filled(rng, size, dt)
    if guard is None:
        return vals
    flat = _guarded(size * vals.itemsize, guard == "end").view(vals.dtype)
    flat[...] = vals
    return flat


def _guarded_case(desc, count, rng, guards):
    """(call arguments, A blocks, B blocks, C, C's padding) with A, B and C each against a guard page
    at the end (the last block's last row ends at a page end) or the start (``guards``: three of
    "end" / "start" / None); C's padding between rows poisoned."""
    spec_a, spec_b = desc.block_specs()
    ga, gb, gc = guards
    if desc.batch == "stride":
        a = _blocks_in(_flat(rng, (count - 1) * desc.stride_a + _extent(spec_a), spec_a.dtype, ga), spec_a, count,
                       desc.stride_a)
        b = _blocks_in(_flat(rng, (count - 1) * desc.stride_b + _extent(spec_b), spec_b.dtype, gb), spec_b, count,
                       desc.stride_b)
        args, a_blocks, b_blocks = [a, b], list(a), list(b)
    elif desc.batch == "offset":
        bufs, offs = [], []
        for spec, g in ((spec_a, ga), (spec_b, gb)):
            size = _extent(spec) + int(rng.integers(0, 3)) * spec.strides[0]
            bufs.append(_flat(rng, size, spec.dtype, g))
            offs.append(rng.integers(0, size - _extent(spec) + 1, count))
            offs[-1][-1] = size - _extent(spec) if g == "end" else 0        # the page edge itself
        offsets = np.stack(offs, axis=1).astype(np.int64)
        a_blocks = [_view(bufs[0], int(o), spec_a) for o in offsets[:, 0]]
        b_blocks = [_view(bufs[1], int(o), spec_b) for o in offsets[:, 1]]
        args = [bufs[0], bufs[1], offsets]
    else:
        a_blocks = [_blocks_in(_flat(rng, _extent(spec_a), spec_a.dtype, ga), spec_a, 1, 0)[0] for _ in range(count)]
        b_blocks = [_blocks_in(_flat(rng, _extent(spec_b), spec_b.dtype, gb), spec_b, 1, 0)[0] for _ in range(count)]
        args = [a_blocks, b_blocks]
    c_dt = np_dtype(desc.c_dtype)
    size = (desc.m - 1) * desc.ldc + desc.n
    cflat = _guarded(size * c_dt.itemsize, gc == "end").view(c_dt) if gc else np.empty(size, c_dt)
    cflat[...] = np.array(-777 if c_dt.kind == "i" else np.nan, np.float32).astype(c_dt)
    c = np.ndarray((desc.m, desc.n), c_dt, buffer=cflat, strides=(desc.ldc * c_dt.itemsize, c_dt.itemsize))
    if desc.beta:
        c[...] = _filled(rng, c.shape, "i8" if c_dt.kind == "i" else desc.c_dtype).astype(c_dt)
    gaps = np.ones(size, bool)
    np.ndarray(c.shape, bool, buffer=gaps, strides=(desc.ldc, 1))[...] = False
    args.insert(2, c)
    if desc.bias:
        args.append(_filled(rng, desc.n, "f32"))
    return args, a_blocks, b_blocks, c, cflat[gaps]


GUARD = st.sampled_from(["end", "start"])


@st.composite
def _edge_descriptors(draw, dtype, small):
    top = 20 if small else 40
    m, n = draw(st.integers(1, top)), draw(st.integers(1, top + 8))
    k = draw(st.integers(1, 2 * top if dtype == "i8" else top))
    batch = draw(st.sampled_from(["stride", "offset", "address"]))
    lda = k + draw(st.sampled_from([0, 0, 1, 3]))
    ldb, ldc = n + draw(st.sampled_from([0, 0, 1, 7])), n + draw(st.sampled_from([0, 1, 5]))
    strided = batch == "stride"
    stride_a = m * lda + draw(st.sampled_from([0, 1, 17])) if strided else 0
    groups = -(-k // {"f32": 1, "bf16": 2, "i8": 4}[dtype])
    stride_b = groups * {"f32": 1, "bf16": 2, "i8": 4}[dtype] * ldb + (draw(st.sampled_from([0, 4])) if strided else 0)
    stride_b = stride_b if strided else 0
    c_dtype = draw(st.sampled_from(["f32", "bf16"])) if dtype == "bf16" else ""
    bias = dtype != "i8" and draw(st.booleans())
    act = draw(st.sampled_from([None, "relu"] + ([] if dtype == "i8" else ["gelu_erf_fast", "tanh"])))
    signs = draw(st.sampled_from(["us", "ss", "su", "uu"])) if dtype == "i8" else "us"
    return Brgemm(m=m, n=n, k=k, lda=lda, ldb=ldb, ldc=ldc, stride_a=stride_a, stride_b=stride_b,
                  beta=draw(st.integers(0, 1)), dtype=dtype, c_dtype=c_dtype, batch=batch, bias=bias, act=act,
                  signs=signs, prefetch=draw(st.booleans()), stream_c=draw(st.booleans()),
                  pace=draw(st.sampled_from([0, 0, 0, 3])))


@pytest.mark.parametrize("isa, dtype, features", _params())
@settings(max_examples=15)
@given(data=st.data())
def test_operands_against_guard_pages(isa, dtype, features, data):
    """Every batch kind, every signedness, both prefetch settings, lds past their minimum, tails of
    rows, columns and k: A, B and C each end at an inaccessible page or start after one, C's padding
    between rows stays poisoned and every element of C matches the reference."""
    small = not native(isa) or features[1] == "interp"
    desc = data.draw(_edge_descriptors(dtype, small))
    desc.validate()
    count = data.draw(st.integers(1, 3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    guards = (data.draw(GUARD), data.draw(GUARD), data.draw(GUARD))
    args, a_blocks, b_blocks, c, pad = _guarded_case(desc, count, rng, guards)
    c0 = c.copy()
    bias = args[-1] if desc.bias else None
    _run(desc, isa, features, args, count)
    _check(desc, c, pad.reshape(1, -1), a_blocks, b_blocks, c0, bias)


@pytest.mark.parametrize("isa, dtype, features", _params())
@settings(max_examples=8)
@given(data=st.data())
def test_columns_outer_against_guard_pages(isa, dtype, features, data):
    """The columns-outer loop order (each column block sweeps every row tile; the kernel takes it
    for blocks past L2, which no other test's shapes reach) forced on small descriptors, with and
    without batch chunks of one block: the same guarded round trip."""
    feats, where = features
    small = not native(isa) or where == "interp"
    desc = data.draw(_edge_descriptors(dtype, small))
    count = data.draw(st.integers(1, 3))
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    args, a_blocks, b_blocks, c, pad = _guarded_case(desc, count, rng, (data.draw(GUARD), data.draw(GUARD),
                                                                          data.draw(GUARD)))
    c0 = c.copy()
    per_chunk = data.draw(st.sampled_from([None, 1]))
    with pytest.MonkeyPatch.context() as mp:           # fresh code (explicit features: not the kernel cache)
        mp.setattr(x86_brgemm.Gen, "rows_outer", lambda self: False)
        if per_chunk:
            mp.setattr(x86_brgemm.Gen, "chunk_size", lambda self: 0 if self.bf16_out else per_chunk)
        _run(desc, isa, (tuple(x86_brgemm.target_features(isa)) if feats is None else feats, where), args, count)
    _check(desc, c, pad.reshape(1, -1), a_blocks, b_blocks, c0, args[-1] if desc.bias else None)


@pytest.mark.parametrize("isa", [i for i in ("avx2", "avx512") if native(i)])
@pytest.mark.parametrize("dtype, k", [("f32", 256), ("bf16", 512)])
def test_blocks_past_l2_take_columns_outer(isa, dtype, k):
    """A 512 x 200 x k block (A 512 KiB) is past L2: the kernel loops columns outer, and C (a column
    tail included) matches the reference."""
    desc = Brgemm(m=512, n=200, k=k, dtype=dtype, beta=1, bias=True, act="relu", ldc=203)
    gen = x86_brgemm.Gen(desc, isa, x86_brgemm.target_features(isa))
    gen.chunk = gen.chunk_size()
    assert not gen.rows_outer()
    rng = np.random.default_rng(1)
    args, a_blocks, b_blocks, c, pad = _guarded_case(desc, 2, rng, ("end", "start", "end"))
    c0 = c.copy()
    _run(desc, isa, (None, "native"), args, 2)
    _check(desc, c, pad.reshape(1, -1), a_blocks, b_blocks, c0, args[-1])


# -- values -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("isa, dtype, features", [p for p in _params() if p.values[1] != "i8"])
@settings(max_examples=10)
@given(m=st.integers(1, 9), n=st.integers(1, 40), k=st.integers(1, 9), count=st.integers(1, 3),
       c_dtype=st.sampled_from(["f32", "bf16"]), act=st.sampled_from([None, "relu", "tanh"]),
       seed=st.integers(0, 2 ** 16))
def test_non_finite_b_and_c_follow_the_reference(isa, dtype, features, m, n, k, count, c_dtype, act, seed):
    """NaN, -NaN, inf and -inf in B and in a beta=1 C (A holds zeros too: 0 * inf is NaN): C holds NaN
    and inf exactly where the float64 reference does, through relu (which keeps a NaN) and tanh."""
    c_dtype = c_dtype if dtype == "bf16" else "f32"
    desc = Brgemm(m=m, n=n, k=k, dtype=dtype, c_dtype=c_dtype, beta=1, act=act)
    rng = np.random.default_rng(seed)
    spec_a, spec_b = desc.block_specs()
    a = _filled(rng, (count,) + spec_a.shape, spec_a.dtype)
    a[rng.random(a.shape) < 0.2] = 0
    b_plain = _filled(rng, (count, k, n), "f32")
    b_plain[rng.random(b_plain.shape) < 0.1] = np.float32(rng.choice([np.nan, -np.nan, np.inf, -np.inf]))
    b = np.stack([tppasm.vnni_pack(x.astype(np_dtype(dtype)), desc.vnni) for x in b_plain]) if desc.vnni > 1 else \
        b_plain
    c = _filled(rng, (m, n), "f32")
    c[rng.random(c.shape) < 0.15] = np.float32(rng.choice([np.nan, np.inf, -np.inf]))
    c = c.astype(np_dtype(c_dtype))
    want = desc.compute(list(a), list(b), c.astype(np.float64))
    _run(desc, isa, features, [a, b, c], count)
    assert_same_non_finite(c, want, f"{desc}")


@pytest.mark.parametrize("isa", [i for i in ("avx2", "avx512") if native(i)])
@pytest.mark.parametrize("dtype, c_dtype", [("f32", "f32"), ("bf16", "f32"), ("bf16", "bf16")])
def test_signed_zeros(isa, dtype, c_dtype):
    """beta=1 keeps a -0.0 of C when every product is -0.0 (-0 + -0), and adds +0 products to +0;
    beta=0 sums of -0.0 products give +0.0 (the sum starts from +0, as the reference's does)."""
    f = {"f32": 1, "bf16": 2}[dtype]
    a = np.array([[[-0.0] * f]], np.float32).astype(np_dtype(dtype))
    b_plain = np.ones((1, f, 16), np.float32).astype(np_dtype(dtype))
    b = tppasm.vnni_pack(b_plain[0], f)[None] if f > 1 else b_plain
    g1 = tppasm.brgemm(1, 16, f, dtype, beta=1, c_dtype=c_dtype, isa=isa)
    c = np.full((1, 16), -0.0, np.float32).astype(np_dtype(c_dtype))
    g1(a, b, c)
    assert (c.astype(np.float32) == 0).all() and np.signbit(c.astype(np.float32)).all()
    c0 = tppasm.brgemm(1, 16, f, dtype, c_dtype=c_dtype, isa=isa)(a, b)
    assert (c0.astype(np.float32) == 0).all() and not np.signbit(c0.astype(np.float32)).any()


# int8 extremes: (A value, B value) pairs whose products are largest in magnitude per signedness
I8_EXTREMES = {"us": [(255, -128), (255, 127)], "ss": [(-128, -128), (-128, 127)],
               "su": [(-128, 255), (127, 255)], "uu": [(255, 255)]}
INT = {"u": np.uint8, "s": np.int8}


@pytest.mark.parametrize("isa, dtype, features", [p for p in _params() if p.values[1] == "i8"])
@pytest.mark.parametrize("signs", ["us", "ss", "su", "uu", "u7"])
@pytest.mark.parametrize("k", [1, 3, 6, 64])
def test_int8_extremes_wrap_modulo_2_32(isa, dtype, features, signs, k):
    """Every product at its largest magnitude (-128 x -128, 255 x 255, 255 x -128, ...; u7: 127 x
    -128), and C within a few sums of +-2**31 with beta=1: C is exact, wrapping modulo 2**32 as
    the reference (and vpdpbusd) does, for every k tail and every inner product."""
    a_bits = 7 if signs == "u7" else 8
    signs = "us" if signs == "u7" else signs
    pairs = [(127, -128), (127, 127)] if a_bits == 7 else I8_EXTREMES[signs]
    m, n, count = 3, 21, 2
    desc = Brgemm(m=m, n=n, k=k, dtype="i8", signs=signs, a_bits=a_bits, beta=1)
    at, bt = (INT[s] for s in signs)
    rng = np.random.default_rng(k)
    choice = rng.integers(0, len(pairs), (count, m, 1))
    a = np.array([p[0] for p in pairs])[choice].repeat(k, axis=2).astype(at)
    b_plain = np.array([p[1] for p in pairs])[rng.integers(0, len(pairs), (count, 1, n))].repeat(k, axis=1).astype(bt)
    b = np.stack([tppasm.vnni_pack(x, 4) for x in b_plain])
    edge = np.array([2 ** 31 - 1, -2 ** 31, 2 ** 31 - 2 * k * 255 * 255, -2 ** 31 + 2 * k * 255 * 255], np.int64)
    c = edge[rng.integers(0, 4, (m, n))].astype(np.int32)
    want = desc.compute(list(a), list(b), c.astype(np.int64))
    _run(desc, isa, features, [a, b, c], count)
    np.testing.assert_array_equal(c, want)


@pytest.mark.parametrize("isa", [i for i in ("avx2", "avx512") if native(i)])
def test_int8_sums_past_int32_wrap(isa):
    """255 x 255 over k = 4096 and 9 blocks is 2.4e9, past 2**31: C wraps (uu and us with beta=0)."""
    for signs, av, bv in (("uu", 255, 255), ("ss", -128, -128)):
        g = tppasm.brgemm(2, 16, 4096, "i8", signs=signs, isa=isa)
        at, bt = (INT[s] for s in signs)
        a = np.full((9, 2, 4096), av, at)
        b = np.full((9, 1024, 16, 4), bv, bt)
        got = g(a, b)
        want = (av * bv * 4096 * 9 + 2 ** 31) % 2 ** 32 - 2 ** 31
        assert (got == want).all(), (signs, got[0, 0], want)


def _bf16_exact_case(rng, m, n, k, count, beta):
    """bf16 A and B (and a bf16 C, an fp32 bias) whose products and sums are exact in fp32 but
    need rounding to bf16, ties included: small multiples of powers of two."""
    bf = np_dtype("bf16")
    a = (rng.integers(-8, 9, (count, m, k)) * 2.0 ** rng.integers(-3, 1, (count, m, k))).astype(np.float32)
    b = (rng.integers(-8, 9, (count, k, n)) * 2.0 ** rng.integers(-3, 1, (count, k, n))).astype(np.float32)
    c = (rng.integers(-255, 256, (m, n)) * 2.0 ** -7).astype(np.float32)
    bias = (rng.integers(-2 ** 12, 2 ** 12, n) * 2.0 ** -12).astype(np.float32)
    return a.astype(bf), b.astype(bf), c.astype(bf), bias


@pytest.mark.parametrize("isa, dtype, features", [p for p in _params() if p.values[1] == "bf16"])
@pytest.mark.parametrize("beta", [0, 1])
def test_bf16_c_rounds_once_to_nearest_even(isa, dtype, features, beta):
    """Sums exact in fp32 (so any order gives them) with more bits than bf16 holds: the bf16 C is
    the float64 reference rounded to nearest even, bit for bit (ties included), with bias and relu."""
    rng = np.random.default_rng(beta)
    m, n, k, count = 5, 37, 7, 3
    a, b_plain, c, bias = _bf16_exact_case(rng, m, n, k, count, beta)
    b = np.stack([tppasm.vnni_pack(x, 2) for x in b_plain])
    for act in (None, "relu"):
        desc = Brgemm(m=m, n=n, k=k, dtype="bf16", c_dtype="bf16", beta=beta, bias=True, act=act)
        got = c.copy()
        want = desc.compute(list(a), list(b), c.astype(np.float64), bias).astype(np_dtype("bf16"))
        exact = sum(x.astype(np.float64) @ y.astype(np.float64) for x, y in zip(a, b_plain)) + bias
        exact = exact + beta * c.astype(np.float64)
        assert (exact.astype(np.float32) == exact).all()     # exact in fp32: one rounding, to bf16
        assert (exact.astype(np.float32).astype(np_dtype("bf16")) != exact).any()     # rounding happens
        _run(desc, isa, features, [a, b, got, bias], count)
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


# -- batches ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("isa, dtype, features", _params())
@settings(max_examples=8)
@given(data=st.data())
def test_overlapping_and_repeated_blocks(isa, dtype, features, data):
    """Read-only inputs may overlap (documented for A's rows, lda < k): batch strides under a block,
    a zero stride (every block the same), offsets repeated, descending and far apart, the same
    address block twice: each block counts as often as the batch names it."""
    small = not native(isa) or features[1] == "interp"
    m, n, k = data.draw(st.integers(1, 12)), data.draw(st.integers(1, 40)), data.draw(st.integers(1, 20))
    lda = data.draw(st.sampled_from([k, max(1, k - 3), 1]))
    count = data.draw(st.integers(2, 4))
    batch = data.draw(st.sampled_from(["stride", "offset", "address"]))
    kw = dict(m=m, n=n, k=k, lda=lda, ldc=n + 3, dtype=dtype, batch=batch, beta=data.draw(st.integers(0, 1)))
    f = {"f32": 1, "bf16": 2, "i8": 4}[dtype]
    if batch == "stride":
        kw.update(stride_a=data.draw(st.sampled_from([0, 1, max(1, m * lda // 2)])),
                  stride_b=data.draw(st.sampled_from([0, 1, f, f * n])))
    desc = Brgemm(**kw)
    desc.validate()
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    spec_a, spec_b = desc.block_specs()
    if batch == "stride":
        a = _blocks_in(_filled(rng, (count - 1) * desc.stride_a + _extent(spec_a), spec_a.dtype), spec_a, count,
                       desc.stride_a)
        b = _blocks_in(_filled(rng, (count - 1) * desc.stride_b + _extent(spec_b), spec_b.dtype), spec_b, count,
                       desc.stride_b)
        args, a_blocks, b_blocks = [a, b], list(a), list(b)
    elif batch == "offset":
        far = 1 << (14 if small else 20)                 # elements: 4 MiB of fp32 natively
        bufs = [_filled(rng, far + _extent(s), s.dtype) for s in (spec_a, spec_b)]
        picks = [0, far, far // 3, far, 0, 7]            # repeated, descending, far apart
        offsets = np.array([[picks[i % 6], picks[(i + 1) % 6]] for i in range(count)], np.int64)
        a_blocks = [_view(bufs[0], int(o), spec_a) for o in offsets[:, 0]]
        b_blocks = [_view(bufs[1], int(o), spec_b) for o in offsets[:, 1]]
        args = [bufs[0], bufs[1], offsets]
    else:
        pool_a = [_filled(rng, spec_a.shape, spec_a.dtype) if lda == k else
                  _blocks_in(_filled(rng, _extent(spec_a), spec_a.dtype), spec_a, 1, 0)[0] for _ in range(2)]
        pool_b = [_filled(rng, spec_b.shape, spec_b.dtype) for _ in range(2)]
        a_blocks = [pool_a[i % 2] for i in (1, 0, 1, 1)[:count]]      # descending addresses, repeated
        b_blocks = [pool_b[i % 2] for i in (0, 0, 1, 0)[:count]]
        args = [a_blocks, b_blocks]
    c_dt = np_dtype(desc.c_dtype)
    cbuf = np.full((m, n + 3), -777 if c_dt.kind == "i" else np.nan, np.float32).astype(c_dt)
    c = cbuf[:, :n]
    if desc.beta:
        c[...] = _filled(rng, c.shape, "i8" if c_dt.kind == "i" else desc.c_dtype).astype(c_dt)
    args.insert(2, c)
    c0 = c.copy()
    _run(desc, isa, features, args, count)
    _check(desc, c, cbuf[:, n:], a_blocks, b_blocks, c0, None)


@pytest.mark.parametrize("isa", [i for i in ("avx2", "avx512") if native(i)])
@pytest.mark.parametrize("dtype, k", [("f32", 96), ("bf16", 96), ("i8", 192)])
def test_counts_around_batch_chunk_boundaries(isa, dtype, k):
    """Blocks of 96 x 96 x k make chunks of a few blocks (of the kernel's own size, no patching):
    counts of one chunk, one less, one more and many, with beta=1 and the epilogue applied once."""
    bias = dtype != "i8"
    desc = Brgemm(m=96, n=96, k=k, dtype=dtype, beta=1, bias=bias, act="relu")
    chunk = x86_brgemm.Gen(desc, isa, x86_brgemm.target_features(isa)).chunk_size()
    assert 1 < chunk < 8, chunk
    rng = np.random.default_rng(chunk)
    g = tppasm.brgemm(96, 96, k, dtype, beta=1, bias=bias, act="relu", isa=isa)
    spec_a, spec_b = desc.block_specs()
    for count in (chunk - 1, chunk, chunk + 1, 3 * chunk, 3 * chunk + 1):
        a = _filled(rng, (count,) + spec_a.shape, spec_a.dtype)
        b = _filled(rng, (count,) + spec_b.shape, spec_b.dtype)
        c = _filled(rng, (96, 96), "i8" if dtype == "i8" else "f32").astype(np_dtype(desc.c_dtype))
        rest = [_filled(rng, 96, "f32")] if bias else []
        c0 = c.copy()
        g(a, b, c, *rest)
        _check(desc, c, np.empty((96, 0), c.dtype), list(a), list(b), c0, rest[0] if rest else None)


_SPARSE = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000)


@pytest.mark.parametrize("isa", [i for i in ("avx2", "avx512") if native(i)])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "i8"])
def test_batch_strides_past_2gib_run(isa, dtype):
    """Blocks 2 GiB + 64 bytes apart (the batch step through a register, beside the bias pointer)
    in a sparse mapping: only the touched pages become resident."""
    es = {"f32": 4, "bf16": 2, "i8": 1}[dtype]
    stride = (2 ** 31 + 64) // es
    desc = Brgemm(m=5, n=19, k=10, dtype=dtype, stride_a=stride, stride_b=stride, beta=1, bias=dtype != "i8")
    spec_a, spec_b = desc.block_specs()
    count, rng = 3, np.random.default_rng(0)
    ops = []
    for spec in (spec_a, spec_b):
        buf = mmap.mmap(-1, ((count - 1) * stride + _extent(spec)) * es, flags=_SPARSE)
        blocks = _blocks_in(np.frombuffer(buf, np_dtype(spec.dtype)), spec, count, stride)
        blocks[...] = _filled(rng, blocks.shape, spec.dtype)
        ops.append((buf, blocks))
    (_, a), (_, b) = ops
    c = _filled(rng, (5, 19), "i8" if dtype == "i8" else "f32").astype(np_dtype(desc.c_dtype))
    rest = [] if dtype == "i8" else [_filled(rng, 19, "f32")]
    c0 = c.copy()
    tppasm.brgemm(5, 19, 10, dtype, stride_a=stride, stride_b=stride, beta=1, bias=dtype != "i8", isa=isa)(
        a, b, c, *rest)
    _check(desc, c, np.empty((5, 0), c.dtype), list(a), list(b), c0, rest[0] if rest else None)
    del a, b, ops


# -- refusals ---------------------------------------------------------------------------------------

def _ones(shape, dt):
    return np.ones(shape, np_dtype(dt))


def _i8_b(count):
    return np.stack([tppasm.vnni_pack(np.ones((4, 8), np.int8), 4)] * count)


def _bf16_b(count):
    return np.stack([tppasm.vnni_pack(_ones((4, 8), "bf16"), 2)] * count)


A32, B32, C32 = _ones((2, 4, 4), "f32"), _ones((2, 4, 8), "f32"), _ones((4, 8), "f32")
# (kernel keywords, call arguments (a function of nothing), what the message names)
WRONG_CALLS = [
    ({}, lambda: (A32.astype(np.float64), B32, C32), r"dtype float64, expected float32.*astype\(np.float32\)"),
    ({}, lambda: (A32, B32, np.asfortranarray(C32)), r"operand c has strides \(1, 4\)"),
    ({}, lambda: (A32, B32, _ones((4, 10), "f32")[:, :8]), r"build the kernel with ldc=10"),
    ({}, lambda: (A32, B32, _ones(32, "f32")), r"operand c has 1 dimensions"),
    ({}, lambda: (A32, B32, _ones((4, 8), "i32")), r"pass a float32 output"),
    ({}, lambda: (A32.tolist(), B32, C32), r"must be a NumPy array.*np.asarray\(a, np.float32\)"),
    ({}, lambda: (A32[0], B32, C32), r"add the batch axis: a\[None\]"),
    ({}, lambda: (A32, B32[:1], C32), r"pass count="),
    ({}, lambda: (A32[::-1], B32, C32), r"np.ascontiguousarray"),
    ({}, lambda: (A32, B32, C32, C32), r"takes 3 arrays"),
    (dict(beta=1), lambda: (A32, B32), r"c is read and written, so always passed"),
    (dict(dtype="bf16"), lambda: (A32.astype(np_dtype("bf16")), B32.astype(np_dtype("bf16"))),
     r"VNNI layout: pass tppasm.vnni_pack\(B, 2\)"),
    (dict(dtype="bf16"), lambda: (A32, _bf16_b(2)), r"expected bfloat16.*astype\(ml_dtypes.bfloat16\)"),
    (dict(dtype="bf16"), lambda: (A32.astype(np_dtype("bf16")), _bf16_b(2), _ones((4, 8), "bf16")),
     r"dtype bfloat16, expected float32"),
    (dict(dtype="bf16", c_dtype="bf16"), lambda: (A32.astype(np_dtype("bf16")), _bf16_b(2), C32),
     r"dtype float32, expected bfloat16"),
    (dict(dtype="i8"), lambda: (A32.astype(np.int8), _i8_b(2)), r"build the kernel with 's' for a in signs="),
    (dict(dtype="i8"), lambda: (A32.astype(np.uint8), _i8_b(2).astype(np.uint8)), r"'u' for b in signs="),
    (dict(dtype="i8"), lambda: (A32.astype(np.uint8), _i8_b(2), _ones((4, 8), "i64")), r"pass a int32 output"),
    (dict(dtype="i8"), lambda: (A32.astype(np.uint8), _bf16_b(2).view(np.int8)), r"expected \(count, 1, 8, 4\)"),
    (dict(bias=True), lambda: (A32, B32, C32, _ones(7, "f32")), r"bias has shape \(7,\), expected \(8,\)"),
    (dict(bias=True), lambda: (A32, B32, C32, np.ones(8)), r"bias has dtype float64"),
    (dict(bias=True), lambda: (A32, B32, C32, C32[0]), r"output c overlaps operand bias"),
    (dict(bias=True), lambda: (A32, B32, C32), r"built with bias=True: call it as k\(a, b, c, bias\)"),
    (dict(batch="offset"), lambda: (A32.ravel(), B32.ravel(), C32, np.zeros((2, 3), np.int64)),
     r"offsets has shape \(2, 3\), expected \(count, 2\)"),
    (dict(batch="offset"), lambda: (A32.ravel(), B32.ravel(), C32, np.zeros((2, 4), np.int64)[:, ::2]),
     r"np.ascontiguousarray"),
    (dict(batch="offset"), lambda: (A32.ravel(), B32.ravel(), C32, np.array([[2 ** 62, 0]], np.int64)),
     r"offset 4611686018427387904 for operand a is out of range.*0\.\.16"),
    (dict(batch="offset"), lambda: (A32.ravel(), B32.ravel(), A32.ravel()[:32].reshape(4, 8),
                                    np.zeros((1, 2), np.int64)), r"output c overlaps operand a"),
    (dict(batch="address"), lambda: ([A32[0], A32[1].astype(np.float64)], list(B32), C32), r"dtype float64"),
    (dict(batch="address"), lambda: ([], [], C32), r"count=0, expected an int from 1"),
    (dict(batch="address"), lambda: ([A32[0]], [C32[:4]], C32), r"output c is the same array as operand b"),
]


@pytest.mark.parametrize("kw, args, words", WRONG_CALLS, ids=[f"{i}" for i in range(len(WRONG_CALLS))])
def test_wrong_calls_are_refused_naming_the_fix(kw, args, words):
    """Wrong dtypes, shapes, layouts, contiguity, too few blocks, offsets out of range, outputs
    overlapping an input: a TypeError or ValueError (OperandError) that names the fix, before any
    code runs (C keeps its values)."""
    g = tppasm.brgemm(4, 8, 4, **kw)
    arrays = args()
    before = [x.copy() for x in arrays if isinstance(x, np.ndarray)]
    with pytest.raises((TypeError, ValueError), match=words):
        g(*arrays)
    assert all(np.array_equal(x, y, equal_nan=True) for x, y in
               zip([x for x in arrays if isinstance(x, np.ndarray)], before))


@pytest.mark.parametrize("count", [0, -1, 2 ** 30, True, 1.0, "2", None])
def test_counts_out_of_range_are_refused(count):
    """count 0 would run the batch loop 2**64 times (``dec``/``jnz``); it and every other count out
    of 1..2**30-1, or not an int, is refused (None infers it: 2 blocks)."""
    g = tppasm.brgemm(4, 8, 4)
    c = np.full((4, 8), np.nan, np.float32)
    if count is None:
        g(A32, B32, c, count=count)
        assert (c == 8).all()
        return
    with pytest.raises(OperandError, match="count=.*expected an int from 1 to 2\\*\\*30 - 1"):
        g(A32, B32, c, count=count)
    assert np.isnan(c).all()


@pytest.mark.parametrize("kw, words", [
    (dict(ldb=7), r"ldb=7; expected an int in \[8, 2\*\*40\)"), (dict(ldc=7), r"ldc=7; expected an int in \[8"),
    (dict(stride_b=-4), r"stride_b=-4"), (dict(dtype="i8", c_dtype="f32"), r"c_dtype='f32'; expected 'i32'"),
    (dict(c_dtype="i32"), r"c_dtype='i32'; expected 'f32'"), (dict(signs="ss"), r"signs='ss'.*for dtype='i8'"),
    (dict(dtype="i8", signs="xs"), r"signs='xs'"), (dict(dtype="i8", act="gelu"), r"None or 'relu' for dtype='i8'"),
    (dict(beta=True), r"beta=True"), (dict(beta=-1), r"beta=-1"), (dict(m=True), r"m=True"),
    (dict(stream_c=1), r"stream_c=1"), (dict(bias=1), r"bias=1"),
    (dict(lda=2 ** 29), r"lda=536870912 needs an address offset.*under 2 GiB"),
    (dict(ldb=2 ** 28), r"ldb=268435456 needs an address offset"),
    (dict(ldc=2 ** 29), r"ldc=536870912 needs an address offset"),
])
def test_bad_descriptors_name_the_parameter(kw, words):
    """lds under the row width, negative strides, dtype / c_dtype / signs mismatches, non-bool
    flags, and lds whose row offsets pass the 32-bit displacements: ValueError naming it."""
    with pytest.raises(ValueError, match=words):
        tppasm.brgemm(**{"m": 4, "n": 8, "k": 4, **kw})
