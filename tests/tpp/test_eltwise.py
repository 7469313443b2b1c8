"""Element-wise TPPs (unary, binary, ternary, reductions, transforms) x dtype x ISA against the
NumPy references: random shapes (1, non-multiples of the vector width), leading dimensions past
n, broadcasts; outputs poisoned with NaN and every element checked, pads checked untouched."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tppasm
from tppasm.dtypes import dtype as D
from tppasm.eltwise import (BINARY_OPS, GRAD_OPS, REDUCE_OPS, UNARY_OPS, Binary, Reduce, Ternary,
                            Transform, Unary)
from tppasm.kernel import get_kernel
from tppasm.operand import OperandError
from tppasm.x86.math import ACCURACY_ABS
from tests.support import assert_same_non_finite, isa_params, native, poisoned, run_raw, sprinkle

ISAS = isa_params()
EXACT = {"copy", "identity", "zero", "relu", "negate", "square", "sqrt", "add", "sub", "mul", "div",
         "max", "min", "relu_bwd"}
POSITIVE = {"sqrt", "rsqrt", "reciprocal"}


def limits(isa):
    """Shapes: the interpreter is slow, keep avx512 small."""
    return 40 if not native(isa) else 70


def shape(isa):
    """(m, n, ld pad 1, ld pad 2); natively n sometimes reaches the column loops (>= 12 vectors)."""
    hi = limits(isa)
    n = st.integers(1, hi) if not native(isa) else st.one_of(st.integers(1, hi), st.integers(90, 300))
    return st.tuples(st.integers(1, hi), n, st.integers(0, 9), st.integers(0, 9))


def data(rng, m, n, op=None, dt="f32", ld=None):
    x = rng.standard_normal((m, n)) * 3
    if op in POSITIVE:
        x = np.abs(x) + 0.05
    out = poisoned((m, n), D(dt), ld)
    out[...] = x.astype(np.float32).astype(D(dt))
    return out


def conditioning(op, x):
    """|f(x(1+2^-23)) - f(x)|: how much one ulp of input moves the exact result (ill-conditioned
    ops like gelu at x << 0 cannot be closer to the float64 reference than this)."""
    f = UNARY_OPS.get(op) or GRAD_OPS.get(op)
    if f is None or x is None:
        return 0.0
    x64 = x.astype(np.float32).astype(np.float64)
    with np.errstate(all="ignore"):
        return np.nan_to_num(np.abs(f(x64 * (1 + 2.0 ** -23)) - f(x64)), nan=0.0, posinf=0.0)


def assert_close(got, want, exact, bf16, op="", x=None, cond_op=None):
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    if exact:
        np.testing.assert_array_equal(got64, want64, err_msg=op)
        return
    rtol = 2.0 ** -7 if bf16 else 1.2e-6
    atol = (2.0 ** -7 if bf16 else 3e-7) if op.endswith("_bwd") else 1e-30
    atol = atol + 4 * conditioning(cond_op or op, x)
    if op in ACCURACY_ABS:                          # an absolute contract
        atol = atol + ACCURACY_ABS[op] * np.maximum(1, np.abs(x.astype(np.float64)))
    bad = ~(np.abs(got64 - want64) <= rtol * np.abs(want64) + atol) & ~(np.isnan(got64) & np.isnan(want64))
    assert not bad.any(), f"{op}: {bad.sum()} elements off, e.g. got {got64[bad][:4]} want {want64[bad][:4]}"


def pads_untouched(arr, fill_nan=True):
    base = arr.base
    if base is None or base.shape == arr.shape:
        return
    pad = base[..., arr.shape[-1]:].astype(np.float64)
    assert np.isnan(pad).all(), "kernel wrote past the last column of a row"


def check(kernel, arrays, outs, isa):
    """Run ``kernel`` on copies, compare outputs with its reference."""
    want = [a.copy() for a in arrays]
    kernel.reference(*want)
    run_raw(kernel, arrays, isa=isa)
    return want


@pytest.mark.parametrize("isa", ISAS)
@given(op=st.sampled_from(sorted(UNARY_OPS)), dts=st.sampled_from([("f32", "f32"), ("bf16", "bf16"),
                                                                  ("f32", "bf16"), ("bf16", "f32")]),
       shp=st.data(), seed=st.integers(0, 2 ** 16))
def test_unary(isa, op, dts, shp, seed):
    m, n, pi, po = shp.draw(shape(isa))
    dt, odt = dts
    rng = np.random.default_rng(seed)
    k = get_kernel(Unary(op, m, n, n + pi, n + po, dt, odt), isa)
    x = data(rng, m, n, op, dt, n + pi)
    out = poisoned((m, n), D(odt), n + po)
    arrays = (out,) if op == "zero" else (x, out)
    want = check(k, arrays, [out], isa)
    assert_close(out, want[-1], op in EXACT, odt == "bf16" and op not in EXACT, op, x)
    pads_untouched(out)


@pytest.mark.parametrize("isa", ISAS)
@given(op=st.sampled_from(sorted(GRAD_OPS)), dt=st.sampled_from(["f32", "bf16"]), shp=st.data(),
       seed=st.integers(0, 2 ** 16))
def test_unary_bwd(isa, op, dt, shp, seed):
    m, n, pi, po = shp.draw(shape(isa))
    rng = np.random.default_rng(seed)
    k = get_kernel(Unary(op, m, n, n + pi, n + po, dt), isa)
    dy, x = data(rng, m, n, None, dt, n + pi), data(rng, m, n, None, dt, n + pi)
    out = poisoned((m, n), D(dt), n + po)
    want = check(k, (dy, x, out), [out], isa)
    assert_close(out, want[-1], op in EXACT, dt == "bf16", op, x)
    pads_untouched(out)


@pytest.mark.parametrize("isa", ISAS)
@given(dt=st.sampled_from(["f32", "bf16"]), shp=st.data(), seed=st.integers(0, 2 ** 16))
def test_relu_bitmask(isa, dt, shp, seed):
    m, n, pi, po = shp.draw(shape(isa))
    rng = np.random.default_rng(seed)
    fwd = get_kernel(Unary("relu", m, n, n + pi, n + po, dt, bitmask=True), isa)
    x = data(rng, m, n, None, dt, n + pi)
    out = poisoned((m, n), D(dt), n + po)
    mask = np.full((m, -(-n // 8)), 0xA5, np.uint8)
    want = check(fwd, (x, out, mask), [out, mask], isa)
    assert_close(out, want[1], True, False, "relu")
    np.testing.assert_array_equal(mask, want[2])
    bwd = get_kernel(Unary("relu_bwd", m, n, n + pi, n + po, dt, bitmask=True), isa)
    dy = data(rng, m, n, None, dt, n + pi)
    dx = poisoned((m, n), D(dt), n + po)
    want = check(bwd, (dy, mask, dx), [dx], isa)
    assert_close(dx, want[2], True, False, "relu_bwd")
    pads_untouched(dx)


def _wide(x, bcast):
    x = x.astype(np.float32)
    return x[None, :] if bcast == "row" else x[:, None] if bcast == "col" else x[0] if bcast == "scalar" else x


def bcast_operand(rng, bcast, m, n, dt, ld, op=None):
    if bcast is None:
        return data(rng, m, n, op, dt, ld)
    length = {"row": n, "col": m, "scalar": 1}[bcast]
    v = rng.standard_normal(length) * 3
    if op == "div":
        v = np.sign(v) * (np.abs(v) + 0.5)
    return v.astype(np.float32).astype(D(dt))


@pytest.mark.parametrize("isa", ISAS)
@given(op=st.sampled_from(sorted(BINARY_OPS)), dt=st.sampled_from(["f32", "bf16"]),
       bca=st.sampled_from([None, "row", "col", "scalar"]), bcb=st.sampled_from([None, "row", "col", "scalar"]),
       post=st.sampled_from([None, None, "relu", "gelu"]), shp=st.data(), seed=st.integers(0, 2 ** 16))
def test_binary(isa, op, dt, bca, bcb, post, shp, seed):
    m, n, pa, pb = shp.draw(shape(isa))
    rng = np.random.default_rng(seed)
    k = get_kernel(Binary(op, m, n, n + pa, n + pb, n + pa, dt, dt, bca, bcb, post), isa)
    a = bcast_operand(rng, bca, m, n, dt, n + pa)
    b = bcast_operand(rng, bcb, m, n, dt, n + pb, op)
    out = poisoned((m, n), D(dt), n + pa)
    want = check(k, (a, b, out), [out], isa)
    exact = op in EXACT and post in (None, "relu")
    with np.errstate(all="ignore"):
        pre = np.broadcast_to(BINARY_OPS[op](_wide(a, bca), _wide(b, bcb)), (m, n)).astype(np.float32)
    assert_close(out, want[2], exact, dt == "bf16", f"{op}+{post}", pre, post)
    pads_untouched(out)


@pytest.mark.parametrize("isa", ISAS)
@given(dts=st.sampled_from([("f32", "f32"), ("bf16", "bf16"), ("bf16", "f32")]),
       bca=st.sampled_from([None, "row", "col", "scalar"]), bcb=st.sampled_from([None, "row", "col", "scalar"]),
       shp=st.data(), seed=st.integers(0, 2 ** 16))
def test_ternary_muladd(isa, dts, bca, bcb, shp, seed):
    m, n, pa, pc = shp.draw(shape(isa))
    dt, odt = dts
    rng = np.random.default_rng(seed)
    k = get_kernel(Ternary("muladd", m, n, n + pa, n, n + pc, dt, odt, bca, bcb), isa)
    a = bcast_operand(rng, bca, m, n, dt, n + pa)
    b = bcast_operand(rng, bcb, m, n, dt, n)
    c = data(rng, m, n, None, odt, n + pc)
    want = check(k, (a, b, c), [c], isa)
    assert_close(c, want[2], False, odt == "bf16", "muladd")
    pads_untouched(c)


@pytest.mark.parametrize("isa", ISAS)
@given(op=st.sampled_from(sorted(REDUCE_OPS)), over=st.sampled_from(["rows", "cols"]),
       dts=st.sampled_from([("f32", "f32"), ("bf16", "f32"), ("bf16", "bf16")]), shp=st.data(),
       seed=st.integers(0, 2 ** 16))
def test_reduce(isa, op, over, dts, shp, seed):
    m, n, pi, _ = shp.draw(shape(isa))
    dt, odt = dts
    rng = np.random.default_rng(seed)
    k = get_kernel(Reduce(op, m, n, over, n + pi, dt, odt), isa)
    x = data(rng, m, n, None, dt, n + pi)
    out = np.full(n if over == "rows" else m, np.nan, np.float32).astype(D(odt))
    want = check(k, (x, out), [out], isa)
    # fp32 sums in another order: error bound ~ count * eps * sum |x|
    count = m if over == "rows" else n
    scale = REDUCE_OPS["sumsq" if op == "sumsq" else "add"](np.abs(x.astype(np.float64)) ** (2 if op == "sumsq" else 1),
                                                            0 if over == "rows" else 1)
    tol = scale * (count * 2.0 ** -23 + (2.0 ** -8 if odt == "bf16" else 0)) + 1e-6
    err = np.abs(out.astype(np.float64) - want[1].astype(np.float64))
    assert (err <= tol).all(), f"max err {err.max()}"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("bitmask", [False, True])
def test_relu_bwd_passes_dy_unless_x_is_at_most_zero(isa, bitmask):
    """0 where x <= 0 even for an inf or NaN dy, else dy, a NaN x's too (as torch's
    threshold_backward: NaN <= 0 is false), in the kernel and in both references (the plain one
    computed dy * 0 = NaN; a NaN x gave 0); the bitmask relu sets a NaN's bit."""
    dy = np.float32([[np.inf, np.nan, -np.inf, np.inf, 2.0, np.nan, 3.0]])
    x = np.float32([[-1.0, -1.0, 0.0, np.nan, 1.0, 5.0, -0.0]])
    want = np.float32([[0, 0, 0, np.inf, 2.0, np.nan, 0]])
    mask = np.zeros((1, 1), np.uint8)
    run_raw(get_kernel(Unary("relu", 1, 7, bitmask=True), isa), (x, np.empty_like(x), mask), isa=isa)
    assert mask.tolist() == [[0b0111000]]           # x[3] (NaN), x[4], x[5]
    k = get_kernel(Unary("relu_bwd", 1, 7, bitmask=bitmask), isa)
    out = poisoned((1, 7), np.float32, 7)
    got_ref = check(k, (dy, mask if bitmask else x, out), [out], isa)[2]
    np.testing.assert_array_equal(got_ref, want)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("post", ["relu", "negate", "square", "exp", "sigmoid", "gelu"])
def test_max_and_min_with_a_post_op(isa, op, post):
    """max/min then a post op, over vectors interleaved four at a time (each with its own opmask)
    and a tail: the values and NaN lanes of the reference (the op's scratch once shared a register
    with its result on AVX2, and an opmask with the other chains on AVX-512)."""
    rng = np.random.default_rng(len(op + post))
    m, n = 3, 77
    a = (rng.standard_normal((m, n)) * 3).astype(np.float32)
    b = (rng.standard_normal((m, n)) * 3).astype(np.float32)
    a[rng.random((m, n)) < 0.1] = np.nan
    b[rng.random((m, n)) < 0.1] = np.nan
    out = poisoned((m, n), np.float32, n)
    want = check(get_kernel(Binary(op, m, n, post=post), isa), (a, b, out), [out], isa)[2]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("isa", ISAS)
@given(kind=st.sampled_from(["unary", "grad", "binary", "reduce"]), pick=st.integers(0, 99),
       dt=st.sampled_from(["f32", "bf16"]), shp=st.data(), seed=st.integers(0, 2 ** 16))
def test_non_finite_inputs_follow_the_references(isa, kind, pick, dt, shp, seed):
    """NaN and infinities in any lane: each op gives what its NumPy reference gives (np.maximum's
    NaN rule for max/min and reduce max; GELU's limits at +-inf)."""
    m, n, pa, _ = shp.draw(shape(isa))
    rng = np.random.default_rng(seed)
    x = sprinkle(rng, data(rng, m, n, None, dt, n + pa))
    if kind == "reduce":
        op = sorted(REDUCE_OPS)[pick % len(REDUCE_OPS)]
        over = "rows" if pick % 2 else "cols"
        k = get_kernel(Reduce(op, m, n, over, n + pa, dt, "f32"), isa)
        outs = (np.full(n if over == "rows" else m, 7.0, np.float32),)
        args = (x,) + outs
    elif kind == "binary":
        op = ("max", "min")[pick % 2]
        post = (None, "relu", "negate", "exp", "sigmoid", "gelu_erf")[pick % 6]
        k = get_kernel(Binary(op, m, n, n + pa, n + pa, n + pa, dt, dt, post=post), isa)
        y = sprinkle(rng, data(rng, m, n, None, dt, n + pa))
        outs = (poisoned((m, n), D(dt), n + pa),)
        args = (x, y) + outs
    elif kind == "grad":
        op = sorted(GRAD_OPS)[pick % len(GRAD_OPS)]
        k = get_kernel(Unary(op, m, n, n + pa, n + pa, dt, dt), isa)
        outs = (poisoned((m, n), D(dt), n + pa),)
        args = (data(rng, m, n, None, dt, n + pa), x) + outs
    else:
        op = sorted(o for o in UNARY_OPS if o != "zero")[pick % (len(UNARY_OPS) - 1)]
        k = get_kernel(Unary(op, m, n, n + pa, n + pa, dt, dt), isa)
        outs = (poisoned((m, n), D(dt), n + pa),)
        args = (x,) + outs
    with np.errstate(all="ignore"):
        want = check(k, args, outs, isa)
    assert_same_non_finite(outs[0], want[-1], f"{kind} {op}")


@pytest.mark.parametrize("isa", ISAS)
@given(op=st.sampled_from(["transpose", "vnni2", "vnni4", "unvnni2", "unvnni4"]),
       dt=st.sampled_from(["f32", "bf16", "i8"]), shp=st.data(), seed=st.integers(0, 2 ** 16))
def test_transform(isa, op, dt, shp, seed):
    m, n, pi, po = shp.draw(shape(isa))
    rng = np.random.default_rng(seed)
    desc = Transform(op, m, n, (n + pi) if not op.startswith("un") else 0,
                     (m + po) if op == "transpose" else (n + po) if op.startswith("un") else 0, dt)
    k = get_kernel(desc, isa)
    specs = desc.operands()
    arrays = []
    for spec in specs:
        buf = rng.integers(-100, 100, spec.shape[:-1] + (spec.strides[-2] if len(spec.shape) == 2 else spec.shape[-1],))
        arr = buf.astype(D(dt))[..., :spec.shape[-1]] if len(spec.shape) == 2 else buf.astype(D(dt))
        arrays.append(arr)
    before = arrays[1].base.copy() if arrays[1].base is not None else None
    want = check(k, arrays, [arrays[1]], isa)
    np.testing.assert_array_equal(arrays[1], want[1])
    if before is not None:
        cols = arrays[1].shape[-1]
        np.testing.assert_array_equal(arrays[1].base[..., cols:], before[..., cols:])


# -- conversions: exact round-to-nearest-even against ml_dtypes --------------------------------
@pytest.mark.parametrize("isa", ISAS)
def test_bf16_rounding_edges(isa):
    bits = np.array([0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F80FFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x00000001,
                     0x80008000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0, 0x80000000,
                     0x3F7FFFFF, 0x477FFFFF], np.uint32)
    x = bits.view(np.float32).reshape(1, -1)
    out = np.empty(x.shape, D("bf16"))
    k = get_kernel(Unary("copy", 1, x.shape[1], dtype="f32", out_dtype="bf16"), isa)
    run_raw(k, (x, out), isa=isa)
    with np.errstate(invalid="ignore"):
        want = x.astype(D("bf16"))
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(out.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    assert np.isnan(out.astype(np.float32)[nan]).all()


# -- the public call path and errors -------------------------------------------------------------
def test_public_call_path_and_errors():
    k = tppasm.relu(3, 5)
    x = np.arange(-7, 8, dtype=np.float32).reshape(3, 5)
    out = np.full((3, 5), np.nan, np.float32)
    k(x, out)
    np.testing.assert_array_equal(out, np.maximum(x, 0))
    with pytest.raises(OperandError, match=r"shape \(3, 4\), expected \(3, 5\)"):
        k(x[:, :4], out)
    with pytest.raises(OperandError, match="dtype float64, expected float32"):
        k(x.astype(np.float64), out)
    with pytest.raises(OperandError, match="strides"):
        k(np.zeros((3, 10), np.float32)[:, ::2], out)
    with pytest.raises(OperandError, match="build the kernel with ldx=8"):
        k(np.zeros((3, 8), np.float32)[:, :5], out)
    with pytest.raises(OperandError, match="read-only"):
        ro = np.zeros((3, 5), np.float32)
        ro.flags.writeable = False
        k(x, ro)
    with pytest.raises(TypeError, match="takes 2 arrays"):
        k()
    b = tppasm.binary("add", 3, 5, bcast_b="row")
    with pytest.raises(OperandError, match=r"expected \(5,\)"):
        b(x, np.zeros(3, np.float32), out)


@pytest.mark.parametrize("make, message", [
    (lambda: tppasm.unary("relu", 4, 8, ldx=7), "ldx=7 is too small; it must be >= 8"),
    (lambda: tppasm.unary("nope", 4, 8), "not one of"),
    (lambda: tppasm.unary("relu", 0, 8), "m must be an int >= 1"),
    (lambda: tppasm.unary("exp", 4, 8, dtype="i8"), "dtype='i8'; expected one of f32, bf16"),
    (lambda: tppasm.binary("add", 4, 8, bcast_a="diag"), "bcast_a='diag'"),
    (lambda: tppasm.reduce("add", 4, 8, over="both"), "over='both'"),
    (lambda: tppasm.transform("transpose", 4, 8, ldo=3), "ldo=3 is too small; it must be >= 4"),
    (lambda: tppasm.unary("exp", 4, 8, bitmask=True), "bitmask=True is for relu"),
])
def test_descriptor_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("offset", [0, 1, 4])
def test_streaming_store_path(isa, offset, monkeypatch):
    """DRAM-sized contiguous outputs use non-temporal stores when 16-byte aligned, plain ones otherwise
    (threshold lowered here so the path runs on small arrays)."""
    from tppasm.x86 import eltwise as gen
    from tppasm.kernel import Kernel
    if not native(isa):
        from isa.x86.interp import reference
        if "sfence" not in reference():
            pytest.skip("the x86 interpreter does not model sfence yet")
    monkeypatch.setattr(gen, "NT_MIN_BYTES", 64)
    n = 203
    k = Kernel(Binary("add", 1, n), isa)
    z = Kernel(Unary("zero", 1, n), isa)
    buf = np.arange(2 * n + 16, dtype=np.float32)
    a, b = buf[:n][None], buf[n:2 * n][None]
    out = np.full(n + 16, np.nan, np.float32)[offset:offset + n][None]
    run_raw(k, (a, b, out), isa=isa)
    np.testing.assert_array_equal(out, a + b)
    run_raw(z, (out,), isa=isa)
    assert not out.any() and np.isnan(out.base[offset + n:]).all() and np.isnan(out.base[:offset]).all()
    assert "vmovntps" in k.disassemble() and "sfence" in k.disassemble()


def _guarded(shape, dt):
    """An array whose last byte is the last byte before a PROT_NONE page (so an overrun faults)."""
    import ctypes
    import mmap
    nbytes = int(np.prod(shape)) * D(dt).itemsize
    pages = -(-nbytes // mmap.PAGESIZE) + 1
    buf = mmap.mmap(-1, pages * mmap.PAGESIZE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None)
    guard = base + (pages - 1) * mmap.PAGESIZE
    assert libc.mprotect(ctypes.c_void_p(guard), mmap.PAGESIZE, 0) == 0
    start = (pages - 1) * mmap.PAGESIZE - nbytes
    arr = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=start).view(D(dt)).reshape(shape)
    return arr, buf


@pytest.mark.skipif(not native("avx2"), reason="needs a native AVX2 host")
def test_tails_never_touch_past_the_operand():
    """Operands end right before an inaccessible page: any read or write past the last element
    kills the child process (fp32 vmaskmovps and bf16 per-element tails, bitmask bytes, reductions)."""
    import multiprocessing as mp

    def child():
        rng = np.random.default_rng(0)
        for dt in ("f32", "bf16"):
            for m, n in ((1, 1), (1, 7), (3, 13), (2, 70), (1, 129)):
                x, _bx = _guarded((m, n), dt)
                x[...] = rng.standard_normal((m, n)).astype(np.float32).astype(D(dt))
                out, _bo = _guarded((m, n), dt)
                mask, _bm = _guarded((m, -(-n // 8)), "u8")
                tppasm.relu(m, n, dtype=dt, bitmask=True, isa="avx2")(x, out, mask)
                tppasm.unary("relu_bwd", m, n, dtype=dt, bitmask=True, isa="avx2")(x, mask, out)
                tppasm.binary("add", m, n, dtype=dt, bcast_b="row", post="gelu", isa="avx2")(x, x[0], out)
                tppasm.ternary("muladd", m, n, dtype=dt, isa="avx2")(x, x, out)
                red, _br = _guarded((m,), dt)
                tppasm.reduce("max", m, n, over="cols", dtype=dt, out_dtype=dt, isa="avx2")(x, red)
                red, _br = _guarded((n,), dt)
                tppasm.reduce("sumsq", m, n, over="rows", dtype=dt, out_dtype=dt, isa="avx2")(x, red)
                tr, _bt = _guarded((n, m), dt)
                tppasm.transform("transpose", m, n, dtype=dt, isa="avx2")(x, tr)
                f = 2 if dt == "bf16" else 1
                if f == 2:
                    vn, _bv = _guarded((-(-m // 2), n, 2), dt)
                    tppasm.transform("vnni2", m, n, dtype=dt, isa="avx2")(x, vn)
                    tppasm.transform("unvnni2", m, n, dtype=dt, isa="avx2")(vn, out)

    proc = mp.get_context("fork").Process(target=child)
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0, f"child exited with {proc.exitcode} (negative: killed by that signal)"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_of_equal_zeros_give_the_first_as_the_reference_does(isa, op):
    """x86 max and min return the first operand on ties (as torch); the reference says so too (NumPy's
    returns the second): seen through a reciprocal, +0 and -0 are +inf and -inf."""
    desc = Binary(op, 1, 2, post="reciprocal")
    a, b = np.array([[0.0, -0.0]], np.float32), np.array([[-0.0, 0.0]], np.float32)
    want = np.empty((1, 2), np.float32)
    desc.reference(a, b, want)
    assert want.tolist() == [[np.inf, -np.inf]]
    out = poisoned((1, 2), np.float32, 3)
    run_raw(get_kernel(desc, isa), (a, b, out), isa=isa)
    assert out.tolist() == want.tolist()
