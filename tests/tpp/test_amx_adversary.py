"""An adversarial pass over the AMX BRGEMM (tppasm.x86.amx, amx_pipe, amx_chunk, amx_config), interpreted.

Every operand is its own region of the interpreter's memory (``Machine.map`` leaves unmapped gaps
between regions), cut to the exact extent its descriptor gives it: a read or write one byte past
either end of A, B, C, the offsets, the pointer arrays or the bias faults (MemoryFault), as a guard
page would natively. Gaps inside an operand (ld past the row, strides past the block, B's VNNI
padding) hold poison (NaN for bf16, 77 for int8) that a result would show, and C's gaps and its
whole body with beta=0 hold a NaN / int pattern compared bit for bit afterwards. Values are small
integers, so every fp32 sum is exact and the kernels must equal the float64 / int64 reference
exactly (a bf16 C: rounded once, to nearest even); activations other than relu are compared with
a tolerance. Huge leading dimensions and strides run with each row placed at its real address in
the interpreter's sparse 64-bit memory."""
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import tppasm
from isa.x86.interp import InvalidOpcode, Machine
from tppasm import backends
from tppasm.brgemm import Brgemm
from tppasm.x86.amx import generate, plan
from tppasm.x86.amx_chunk import visits
from tppasm.x86.amx_config import tileconfig_function, tilerelease_function
from tests.tpp.test_amx import BF16, NATIVE, _cfg_tuple

POISON = {"bf16": (np.uint16(0x7FC1), BF16), "f32": (np.uint32(0x7FC0_0A5A), np.float32),
          "i32": (np.uint32(0xA5A5_A5A5), np.int32)}
INT8 = {"u": np.uint8, "s": np.int8}


# -- operands ----------------------------------------------------------------------------------------

def _values(rng, size, kind, values):
    """bf16: integers in [-8, 8] ("exact") or normal; int8 of signedness ``kind``: uniform, the
    extremes, or all the largest ("wrap")."""
    if kind == "bf16":
        return (rng.integers(-8, 9, size) if values == "exact" else rng.standard_normal(size)).astype(BF16)
    info = np.iinfo(INT8[kind])
    if values == "wrap":                      # every product the largest of its sign: the sums run far
        return np.full(size, info.max, INT8[kind])
    if values == "extreme":
        return rng.choice(np.array([info.min, info.max, info.min + 1, info.max - 1]), size).astype(INT8[kind])
    top = 127 if values == "u7" else info.max
    return rng.integers(info.min, top + 1, size).astype(INT8[kind])


def _grid(shape, strides):
    return sum(np.arange(s).reshape((-1,) + (1,) * (len(shape) - 1 - i)) * st
               for i, (s, st) in enumerate(zip(shape, strides)))


def _buffer(rng, starts, shape, strides, kind, values, used=None):
    """A flat buffer just long enough for blocks of ``shape`` / ``strides`` (elements) at ``starts``:
    values where a block has an element (``used`` masks a block's elements), poison between them."""
    extent = max(starts) + int(np.dot(np.array(shape) - 1, strides)) + 1
    mask = np.zeros(extent, bool)
    grid = _grid(shape, strides)
    for s in starts:
        mask[(s + (grid if used is None else grid[used])).reshape(-1)] = True
    flat = np.empty(extent, BF16 if kind == "bf16" else INT8[kind])
    flat[mask] = _values(rng, int(mask.sum()), kind, values)
    flat[~mask] = np.nan if kind == "bf16" else 77
    return flat


def _views(flat, starts, shape, strides):
    es = flat.itemsize
    return [np.lib.stride_tricks.as_strided(flat[s:], shape, [x * es for x in strides]) for s in starts]


def _layouts(d):
    f = d.vnni
    used = np.ones((d.groups, d.n, f), bool)
    if d.k % f:
        used[-1, :, d.k % f:] = False          # the padding entries: poisoned, never used
    kinds = ("bf16", "bf16") if d.dtype == "bf16" else tuple(d.signs)
    return ((d.m, d.k), (d.lda, 1)), ((d.groups, d.n, f), (d.ldb * f, f, 1)), used, kinds


def run(d, count, seed=0, values="exact", order=None, chunk=None, prefetch=True, stream=True, hooks=(),
        machine=None):
    """Run ``d``'s AMX kernel in the interpreter on operands of exact extent; ``order``: the blocks
    an offset / address batch visits (repeats and reversals allowed). Returns (C as written, the
    reference, C's whole buffer after, before, the mask of C's elements, the machine, the A and B
    blocks the batch visits)."""
    rng = np.random.default_rng(seed)
    (a_shape, a_str), (b_shape, b_str), used, (ka, kb) = _layouts(d)
    m = machine or Machine()
    a_val = "u7" if d.a_bits == 7 and values != "extreme" else values
    if d.batch == "stride":
        sa, sb = [i * d.stride_a for i in range(count)], [i * d.stride_b for i in range(count)]
        A, B = _buffer(rng, sa, a_shape, a_str, ka, a_val), _buffer(rng, sb, b_shape, b_str, kb, values, used)
        a_blk, b_blk = _views(A, sa, a_shape, a_str), _views(B, sb, b_shape, b_str)
        args = [m.map(A), m.map(B)]
    else:
        order = list(range(count)) if order is None else list(order)
        gap_a, gap_b = a_shape[0] * d.lda + 3, d.groups * d.vnni * d.ldb + 5
        sa, sb = [i * gap_a for i in range(max(order) + 1)], [i * gap_b for i in range(max(order) + 1)]
        A, B = _buffer(rng, sa, a_shape, a_str, ka, a_val), _buffer(rng, sb, b_shape, b_str, kb, values, used)
        a_all, b_all = _views(A, sa, a_shape, a_str), _views(B, sb, b_shape, b_str)
        a_blk, b_blk = [a_all[i] for i in order], [b_all[i] for i in order]
        if d.batch == "offset":
            args = [m.map(A), m.map(B)]
            offsets = m.map(np.array([[sa[i], sb[i]] for i in order], np.int64))
        else:                                       # every block its own region
            pa = [m.map(np.ascontiguousarray(A[s:s + _extent(a_shape, a_str)])) for s in sa]
            pb = [m.map(np.ascontiguousarray(B[s:s + _extent(b_shape, b_str)])) for s in sb]
            args = [m.map(np.array([p[i] for i in order], np.int64)) for p in (pa, pb)]
    bits, cdt = POISON[d.c_dtype]
    c_ext = (d.m - 1) * d.ldc + d.n
    before = np.full(c_ext, bits).view(cdt).copy()
    cmask = np.zeros(c_ext, bool)
    cmask[_grid((d.m, d.n), (d.ldc, 1)).reshape(-1)] = True
    if d.beta and d.c_dtype == "i32":
        far = values in ("extreme", "wrap")
        wide = rng.integers(-2 ** 31, 2 ** 31, c_ext) if far else rng.integers(-1000, 1000, c_ext)
        before[cmask] = wide[cmask]
    elif d.beta:
        wide = rng.integers(-64, 65, c_ext) if values == "exact" else rng.standard_normal(c_ext) * 3
        before[cmask] = wide[cmask].astype(cdt)
    bias = None
    if d.bias:
        bias = (rng.integers(-16, 17, d.n) / 4 if values == "exact" else rng.standard_normal(d.n)).astype(np.float32)
    want = d.compute(a_blk, b_blk, _views(before, [0], (d.m, d.n), (d.ldc, 1))[0].copy(), bias)
    c_addr = m.map(before)
    args.append(c_addr)
    if d.batch == "offset":
        args.append(offsets)
    if d.bias:
        args.append(m.map(bias))
    fn = generate(d, chunk, prefetch, stream)
    for hook in hooks:
        m.call(hook.code)
    m.call(fn.code, args=args + [count])
    after = m.read(c_addr, like=before)
    return _views(after, [0], (d.m, d.n), (d.ldc, 1))[0], want, after, before, cmask, m, (a_blk, b_blk)


def _extent(shape, strides):
    return int(np.dot(np.array(shape) - 1, strides)) + 1


def untouched(after, before, cmask):
    """C's gaps (between rows) kept their bits."""
    raw = lambda x: x.view(np.uint8).reshape(x.size, -1)[~cmask]      # noqa: E731
    assert (raw(after) == raw(before)).all(), "the kernel wrote between C's rows"


def exact(d, got, want, after, before, cmask):
    """C's gaps untouched and every element of C equal to the reference (NaN nowhere)."""
    untouched(after, before, cmask)
    g, w = np.asarray(got).astype(np.float64), np.asarray(want).astype(np.float64)
    assert not np.isnan(g).any(), "NaN in C: poison read, or an element not written"
    bad = g != w
    assert not bad.any(), f"{bad.sum()} of {g.size} elements differ: got {g[bad][:4]}, want {w[bad][:4]}"


def config_left(d, chunked, m):
    """The config a kernel leaves loaded: its last region's (tile_setup=True), else the first one's."""
    p = plan(d)
    if not d.tile_setup:
        return m.tilecfg == _cfg_tuple(p.regions()[0][2])
    return m.tilecfg == _cfg_tuple(visits(p)[-1].cfg if chunked else p.regions()[-1][2])


# -- drawn shapes, layouts and options --------------------------------------------------------------

def _desc(draw, dtype, m, n, k, count):
    batch = draw(st.sampled_from(["stride", "offset", "address"]))
    lda = draw(st.sampled_from([k, k + 1, k + 37, max(1, k // 2), 1, 2048 // (2 if dtype == "bf16" else 1)]))
    f = 2 if dtype == "bf16" else 4
    ldb = draw(st.sampled_from([n, n + 3, 2048 // (2 * f)]))             # 2048: B's group rows 4 KiB apart
    kw = dict(m=m, n=n, k=k, dtype=dtype, lda=lda, ldb=ldb, ldc=n + draw(st.integers(0, 5)), batch=batch,
              beta=draw(st.sampled_from([0, 1])), tile_setup=draw(st.booleans()), prefetch=draw(st.booleans()),
              act=draw(st.sampled_from([None, "relu"])))
    if batch == "stride":
        groups = -(-k // f)
        kw["stride_a"] = draw(st.sampled_from([0, 1, m * lda, m * lda + 7]))
        kw["stride_b"] = draw(st.sampled_from([0, f, groups * f * ldb, groups * f * ldb + 3 * f]))
    if dtype == "bf16":
        kw.update(c_dtype=draw(st.sampled_from(["f32", "bf16"])), bias=draw(st.booleans()))
    else:
        kw["signs"] = draw(st.sampled_from(["us", "ss", "su", "uu"]))
        kw["a_bits"] = draw(st.sampled_from([8, 7])) if kw["signs"] == "us" else 8
    return Brgemm(**kw)


@st.composite
def cases(draw, dtype):
    f = 2 if dtype == "bf16" else 4
    m, n = draw(st.integers(1, 80)), draw(st.integers(1, 80))
    k = draw(st.one_of(st.integers(1, 40), st.integers(1, 300 if dtype == "bf16" else 300)))
    budget = max(1, 80 * 80 * 160 * 4 // (m * n * (-(-k // f) * f)))
    count = draw(st.integers(1, min(20, budget)))
    d = _desc(draw, dtype, m, n, k, count)
    order = None
    if d.batch != "stride":
        order = draw(st.one_of(st.lists(st.integers(0, count), min_size=count, max_size=count),
                               st.just(list(range(count))[::-1])))
    chunk = draw(st.sampled_from([None, 0, 1, 2, 3]))
    return d, count, order, chunk, draw(st.booleans())


def _run_drawn(case, seed, values="exact"):
    d, count, order, chunk, stream = case
    d.validate()
    hooks = () if d.tile_setup else (tileconfig_function(d),)
    r = run(d, count, seed, values, order, chunk, stream=stream, hooks=hooks)
    exact(d, *r[:5])
    assert config_left(d, bool(chunk), r[5]), "the wrong tile config left loaded"


@settings(max_examples=40)
@given(case=cases("bf16"), seed=st.integers(0, 2 ** 16))
@example(case=(Brgemm(m=80, n=80, k=300, dtype="bf16", c_dtype="bf16", beta=1, bias=True, act="relu"), 3,
               None, None, True), seed=1)                  # every tail region, the k loop + a tail step
@example(case=(Brgemm(m=33, n=47, k=263, dtype="bf16", lda=131, batch="offset", tile_setup=False), 4,
               [2, 2, 0, 4], 2, True), seed=2)             # lda < k, repeated blocks, chunks of 2, odd k
@example(case=(Brgemm(m=64, n=64, k=256, dtype="bf16", lda=1024, ldb=1024, stride_a=0, stride_b=0), 20,
               None, 0, True), seed=3)                     # crowded rows 2 / 4 KiB apart, the same block 20 times
def test_drawn_bf16(case, seed):
    _run_drawn(case, seed)


@settings(max_examples=30)
@given(case=cases("i8"), seed=st.integers(0, 2 ** 16), values=st.sampled_from(["exact", "extreme"]))
@example(case=(Brgemm(m=17, n=79, k=301, dtype="i8", signs="uu", beta=1, batch="address"), 5,
               [4, 3, 2, 1, 0], None, True), seed=4, values="extreme")     # reversed blocks, k loop + tail
@example(case=(Brgemm(m=48, n=48, k=63, dtype="i8", a_bits=7, act="relu", tile_setup=False), 3,
               None, 1, False), seed=5, values="exact")
def test_drawn_int8(case, seed, values):
    _run_drawn(case, seed, values)


# -- tails ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["bf16", "i8"])
def test_every_row_and_column_remainder(dtype):
    """m and n of every remainder of 16 (1..16, then one or two blocks more), with a k tail."""
    for r in range(1, 17):
        for m, n in ((r, 16 + (r * 5) % 16 + 1), (32 + r, r), (16 + r, 48 + (r * 7) % 16 + 1)):
            d = Brgemm(m=m, n=n, k=7 if dtype == "bf16" else 13, dtype=dtype, beta=r % 2, ldc=n + r % 3)
            exact(d, *run(d, 2, seed=r)[:5])


# group counts at each branch of plan(): one step, equal steps, 16-group steps and a tail step,
# up to UNROLL_K steps unrolled, then the runtime k loop (with and without a tail step)
GROUPS = [1, 2, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 66, 79, 80, 81, 83, 96, 97, 150]


@pytest.mark.parametrize("dtype", ["bf16", "i8"])
def test_every_k_tail_at_every_plan_branch(dtype):
    f = 2 if dtype == "bf16" else 4
    for g in GROUPS:
        for tail in range(f):
            k = g * f - tail
            d = Brgemm(m=20, n=36, k=k, dtype=dtype, beta=1, lda=k + tail)
            got, want, after, before, cmask, *_ = run(d, 2, seed=k)
            exact(d, got, want, after, before, cmask)


def test_bf16_c_is_rounded_once_to_nearest_even():
    """Exact fp32 sums of 256..4096 land between bf16 values (ties included): each C element is the
    sum rounded once, to nearest even, as the reference rounds the exact value."""
    d = Brgemm(m=40, n=40, k=130, dtype="bf16", c_dtype="bf16", beta=1, bias=True)
    got, want, after, before, cmask, *_ = run(d, 3, seed=7)
    exact(d, got, want, after, before, cmask)
    sums = want.astype(np.float64)
    assert (np.abs(sums) >= 256).sum() > 100          # where rounding happens: the test is not vacuous


def test_int8_sums_wrap_modulo_2_32():
    """C near the int32 limits plus extreme products: the result wraps as the reference does."""
    for signs in ("us", "ss", "su", "uu"):
        d = Brgemm(m=20, n=20, k=256, dtype="i8", signs=signs, beta=1, stride_a=0, stride_b=0)
        r = run(d, 20, seed=11, values="wrap")
        exact(d, *r[:5])
        before, cmask, (a_blk, b_blk) = r[3], r[4], r[6]
        f = d.vnni
        wide = before[cmask].astype(np.int64).reshape(d.m, d.n) + sum(
            x.astype(np.int64) @ np.swapaxes(y, 1, 2).reshape(-1, d.n).astype(np.int64) for x, y in zip(a_blk, b_blk))
        assert f == 4 and ((wide < -2 ** 31) | (wide >= 2 ** 31)).any()     # the sums did wrap


@pytest.mark.parametrize("act", ["gelu", "gelu_erf", "gelu_erf_fast", "sigmoid", "tanh"])
@pytest.mark.parametrize("c_dtype,chunk", [("f32", 0), ("bf16", 1)])
def test_activations_with_bias(act, c_dtype, chunk):
    d = Brgemm(m=40, n=33, k=45, dtype="bf16", c_dtype=c_dtype, beta=1, bias=True, act=act, ldc=35)
    got, want, after, before, cmask, *_ = run(d, 3, seed=13, values="normal", chunk=chunk)
    untouched(after, before, cmask)
    g, w = got.astype(np.float64), want.astype(np.float64)
    tol = 1e-5 * (1 + np.abs(w)) + (2.0 ** -7 * np.abs(w) if c_dtype == "bf16" else 0)
    assert not np.isnan(g).any() and (np.abs(g - w) <= tol).all()


# -- huge leading dimensions and strides: rows at their real addresses -----------------------------------

def _place(m, addr, arr):
    arr = np.ascontiguousarray(arr)
    m._add(addr, bytearray(arr.tobytes()), True, "row")      # a region of its own (unmapped around it)
    return addr


def run_sparse(d, count, chunk=None, seed=0):
    """Each row of A, B (a group row) and C its own region at its real offset from bases far apart."""
    rng = np.random.default_rng(seed)
    m, es, f = Machine(), (2 if d.dtype == "bf16" else 1), d.vnni
    ab = (BF16, BF16) if d.dtype == "bf16" else (np.uint8, np.int8)
    a_blocks = [rng.integers(-8, 9, (d.m, d.k)).astype(ab[0]) for _ in range(count)]
    b_blocks = [rng.integers(-8, 9, (d.groups, d.n, f)).astype(ab[1]) for _ in range(count)]
    base = [1 << 40, 1 << 44, 1 << 45, 1 << 46]
    for i in range(count):
        for r in range(d.m):
            _place(m, base[0] + (i * d.stride_a + r * d.lda) * es, a_blocks[i][r])
        for g in range(d.groups):
            _place(m, base[1] + (i * d.stride_b + g * d.ldb * f) * es, b_blocks[i][g])
    cdt = POISON[d.c_dtype][1]
    c0 = rng.integers(-50, 50, (d.m, d.n)).astype(cdt)
    for r in range(d.m):
        _place(m, base[2] + r * d.ldc * c0.itemsize, c0[r])
    bias = rng.integers(-4, 5, d.n).astype(np.float32) if d.bias else None
    args = base[:3] + ([_place(m, base[3], bias)] if d.bias else [])
    want = d.compute(a_blocks, b_blocks, c0.copy(), bias)
    m.call(generate(d, chunk).code, args=args + [count])
    got = np.stack([m.read(base[2] + r * d.ldc * c0.itemsize, like=c0[r]) for r in range(d.m)])
    return got, want


@pytest.mark.parametrize("kw,count,chunk", [
    (dict(m=40, n=33, k=67, dtype="bf16", stride_a=1 << 36, stride_b=(1 << 36) + 4), 3, None),
    (dict(m=40, n=33, k=67, dtype="bf16", stride_a=1 << 36, stride_b=(1 << 36) + 4), 3, 1),
    (dict(m=40, n=33, k=130, dtype="i8", stride_a=(1 << 37) + 1, stride_b=1 << 38, beta=1), 3, 2),
    (dict(m=32, n=20, k=67, dtype="bf16", lda=(1 << 26) - 128, beta=1), 2, None),     # A tile 1 ~2 GiB on
    (dict(m=32, n=20, k=67, dtype="i8", lda=(1 << 27) - 256, beta=1), 2, None),
    (dict(m=33, n=20, k=40, dtype="bf16", ldc=(1 << 25) - 64, beta=1), 2, None),
    (dict(m=33, n=20, k=40, dtype="bf16", c_dtype="bf16", ldc=(1 << 26) - 64, beta=1, bias=True), 2, None),
    (dict(m=20, n=20, k=67, dtype="bf16", ldb=(1 << 25) - 64, beta=1), 2, None),      # step 2's B ~2 GiB on
    (dict(m=20, n=20, k=300, dtype="bf16", ldb=(1 << 23) - 64, beta=1), 2, None),
    (dict(m=64, n=64, k=64, dtype="bf16", lda=1 << 24, ldc=1 << 22, beta=1), 3, 1),
])
def test_huge_leading_dimensions_and_strides(kw, count, chunk):
    d = Brgemm(**kw)
    d.validate()
    got, want = run_sparse(d, count, chunk)
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


@pytest.mark.parametrize("kw,name", [(dict(m=17, n=16, k=32, dtype="bf16", lda=1 << 26), "lda"),
                                     (dict(m=17, n=16, k=32, dtype="i8", ldc=1 << 25), "ldc"),
                                     (dict(m=16, n=16, k=64, dtype="bf16", ldb=1 << 25), "ldb")])
def test_offsets_past_32_bits_are_refused_naming_the_field(kw, name):
    with pytest.raises(ValueError, match=rf"{name}=.*cannot encode.*AMX tiles reach 16 rows.*split the operand"):
        tppasm.brgemm(isa="amx", **kw)


# -- tile state ------------------------------------------------------------------------------------------

def test_no_setup_kernel_trusts_the_loaded_config():
    """The contract of ``tile_setup=False``: the nest loads the config; unconfigured tiles are a #UD
    (SIGILL natively) and another kernel's config runs the kernel on that config's tile shapes,
    silently (k cut to 16 here): which is why only a nest's tileconfig(gemm) may precede it."""
    d = Brgemm(m=16, n=16, k=32, dtype="bf16", tile_setup=False)
    with pytest.raises(InvalidOpcode, match="not configured"):
        run(d, 1)
    other = Brgemm(m=16, n=16, k=16, dtype="bf16")
    got, want, *_ = run(d, 1, hooks=(tileconfig_function(other),))
    assert not np.array_equal(got.astype(np.float64), want.astype(np.float64))
    got, want, after, before, cmask, m, _ = run(d, 1, hooks=(tileconfig_function(other), tileconfig_function(d)))
    exact(d, got, want, after, before, cmask)


def test_a_setup_kernel_reconfigures_after_any_other_state():
    """tile_setup=True after another kernel's config, after a release, after a several-region kernel
    (which leaves its last region's config) and after itself: right every time."""
    m = Machine()
    two = Brgemm(m=40, n=20, k=64, dtype="bf16")
    one = Brgemm(m=16, n=16, k=64, dtype="i8", beta=1)
    for hooks in [(tileconfig_function(Brgemm(m=16, n=16, k=32, dtype="bf16")),), (tilerelease_function(),), ()]:
        for d in (two, one, two, two):
            got, want, after, before, cmask, *_ = run(d, 2, machine=m, hooks=hooks)
            exact(d, got, want, after, before, cmask)
            assert config_left(d, False, m)


def test_no_setup_kernels_restore_the_first_config_across_chunks():
    """Several regions (a row tail) in chunks: the nest's config is back when the call returns."""
    d = Brgemm(m=40, n=33, k=40, dtype="bf16", c_dtype="bf16", bias=True, tile_setup=False)
    m = Machine()
    for chunk in (0, 1, 2):
        got, want, after, before, cmask, *_ = run(d, 5, chunk=chunk, machine=m, hooks=(tileconfig_function(d),))
        exact(d, got, want, after, before, cmask)
        assert config_left(d, True, m)


# -- options ---------------------------------------------------------------------------------------------

def test_chunk_setting(monkeypatch, tmp_path):
    """TPPASM_AMX_CHUNKS=1 chunks where chunk_blocks says so (and runs right), 0 never, other values
    are refused naming the legal ones; the kernel cache keys on it."""
    monkeypatch.setenv("TPPASM_CACHE_DIR", str(tmp_path))
    d = Brgemm(m=64, n=64, k=64, dtype="bf16", c_dtype="bf16", beta=1, bias=True, act="relu")
    monkeypatch.setenv("TPPASM_AMX_CHUNKS", "1")
    on = generate(d)
    assert on.code != generate(d, 0).code
    got, want, after, before, cmask, *_ = run(d, 5)
    exact(d, got, want, after, before, cmask)
    monkeypatch.setenv("TPPASM_AMX_CHUNKS", "0")
    assert generate(d).code == generate(d, 0).code
    monkeypatch.setenv("TPPASM_AMX_CHUNKS", "yes")
    with pytest.raises(ValueError, match="TPPASM_AMX_CHUNKS='yes': expected 1"):
        generate(d)


@pytest.mark.parametrize("prefetch,stream", [(False, True), (True, False), ("all", True)])
def test_prefetch_and_stream_variants_compute_the_same(prefetch, stream):
    d = Brgemm(m=64, n=48, k=200, dtype="bf16", lda=2048, batch="address")
    got, want, after, before, cmask, *_ = run(d, 4, order=[3, 1, 1, 0], prefetch=prefetch, stream=stream)
    exact(d, got, want, after, before, cmask)


# -- refusals and dispatch -------------------------------------------------------------------------------

@pytest.mark.parametrize("kw,error,fix", [
    (dict(dtype="i8", bias=True), ValueError, r"bias=True; expected False for dtype='i8'"),
    (dict(dtype="i8", act="gelu"), ValueError, r"act='gelu'; expected None or 'relu' for dtype='i8'"),
    (dict(dtype="i8", c_dtype="f32"), ValueError, r"c_dtype='f32'; expected 'i32'"),
    (dict(dtype="bf16", c_dtype="i32"), ValueError, r"c_dtype='i32'; expected 'f32' or 'bf16'"),
    (dict(dtype="bf16", signs="ss"), ValueError, r"signs='ss'.*for dtype='i8', else 'us'"),
    (dict(dtype="bf16", a_bits=7), ValueError, r"a_bits=7 is for dtype='i8', signs='us'"),
    (dict(dtype="i8", signs="ss", a_bits=7), ValueError, r"a_bits=7 is for dtype='i8', signs='us'"),
    (dict(dtype="bf16", beta=2), ValueError, r"beta=2; expected 0 or 1"),
    (dict(dtype="bf16", batch="offset", stride_a=7), ValueError, r"left out with batch='offset'"),
    (dict(dtype="bf16", tile_setup=None), ValueError, r"tile_setup=None; expected True or False"),
    (dict(dtype="bf16", prefetch="all"), ValueError, r"prefetch='all'; expected True or False"),
    (dict(dtype="bf16", ldb=3), ValueError, r"ldb=3; expected an int in \[8, "),
    (dict(dtype="bf16", ldc=7), ValueError, r"ldc=7; expected an int in \[8, "),
    (dict(dtype="bf16", act="swish"), ValueError, r"act='swish'; expected None, 'relu'"),
    (dict(dtype="u8"), ValueError, r"dtype='u8'; legal values: f32, bf16, i8"),
    (dict(dtype="bf16", pace=65), ValueError, r"pace=65; expected an int in \[0, 64\]"),
    (dict(dtype="bf16", tile_stup=False), TypeError, r"tile_stup"),
])
def test_refusals_name_the_fix(kw, error, fix):
    with pytest.raises(error, match=fix):
        tppasm.brgemm(8, 8, 8, isa="amx", **kw)


@pytest.mark.skipif(NATIVE, reason="this host runs AMX code natively")
def test_calling_amx_code_here_is_refused_not_run():
    g = tppasm.brgemm(16, 16, 32, dtype="bf16", isa="amx")
    a, b = np.ones((1, 16, 32), BF16), np.ones((1, 16, 16, 2), BF16)
    with pytest.raises(tppasm.kernel.ISAUnavailableError, match="interpreter"):
        g(a, b, np.zeros((16, 16), np.float32))
    with pytest.raises(TypeError, match="uses no tiles"):
        tppasm.tileconfig(tppasm.brgemm(16, 16, 32, dtype="bf16", isa="avx512"))


def _same_features(monkeypatch):
    from tppasm.x86 import brgemm as x86_brgemm
    from tests.golden import FEATURES
    monkeypatch.setattr(x86_brgemm, "target_features", lambda isa: FEATURES[isa])


@pytest.mark.parametrize("desc", [
    Brgemm(13, 17, 19, beta=1, bias=True, act="gelu"), Brgemm(16, 16, 16, batch="offset"),
    tppasm.eltwise.Unary("gelu_erf", 5, 37), tppasm.eltwise.Binary("add", 4, 21, bcast_b="row"),
    tppasm.eltwise.Transform("vnni2", 12, 10, dtype="bf16"), tppasm.norm.Softmax(3, 40)],
    ids=lambda d: d.kind)
def test_other_tpps_take_the_avx512_code_at_the_amx_level(monkeypatch, desc):
    _same_features(monkeypatch)
    assert backends.generate(desc, "amx").code == backends.generate(desc, "avx512").code


def test_an_amx_level_f32_brgemm_runs_in_the_interpreter():
    d = Brgemm(m=13, n=17, k=19, ldc=20, beta=1, bias=True, act="relu")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 13, 19)).astype(np.float32), rng.standard_normal((2, 19, 17)).astype(np.float32)
    c = np.full((13, 20), np.nan, np.float32)
    c[:, :17] = rng.standard_normal((13, 17))
    bias = rng.standard_normal(17).astype(np.float32)
    want = d.compute(list(a), list(b), c[:, :17].copy(), bias)
    m = Machine()
    pc = m.map(c)
    m.call(backends.generate(d, "amx").code, args=[m.map(a), m.map(b), pc, m.map(bias), 2])
    out = m.read(pc, like=c)
    assert np.isnan(out[:, 17:]).all()
    np.testing.assert_allclose(out[:, :17], want, rtol=1e-5, atol=1e-5)
