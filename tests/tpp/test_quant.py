"""Per-row int8 quantization, int32 dequantization and SwiGLU TPPs x dtype x ISA against their NumPy
references: random shapes with tails, leading dimensions past n, poisoned outputs, pads untouched;
quantize -> i8 BRGEMM -> dequant against the float product. The quantize tests draw bits (8: codes
1..255 around 128; 7: codes 1..127 around 64) and also run the SVE kernel (natively or under qemu)."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tppasm
import tppasm.testing
from isa.aarch64.native import Call, run_calls
from tppasm.dtypes import dtype as D
from tppasm.glu import SwiGLU
from tppasm.kernel import get_kernel
from tppasm.quant import Dequant, Quantize, levels, zero_point
from tests.aarch64.marks import needs_sve_runner
from tests.aarch64.sve_cases import sve_kernel
from tests.support import isa_params, native, poisoned, run_raw
from tests.tpp.test_norm import assert_close, operand, pads_untouched, run, shape

ISAS = isa_params()
# quantize's kernels: x86's, and SVE's at the shortest and longest vector length (the same code)
QUANT_ISAS = ISAS + [pytest.param(f"sve{vl}", marks=needs_sve_runner(vl), id=f"sve-vl{vl}") for vl in (128, 512)]
BITS = st.sampled_from([7, 8])


def quantize_kernel(isa, desc):
    return sve_kernel(desc) if isa.startswith("sve") else get_kernel(desc, isa)


def run_quantize(isa, k, x, q, scale):
    """Run quantize kernel ``k`` on x (a view of a poisoned buffer's rows), q (likewise) and scale."""
    if isa.startswith("sve"):                          # the whole buffers: rows ld apart, pads poisoned
        run_calls([Call(k.raw.code, [x.base], [q.base, scale])], vl_bits=int(isa[3:]))
    else:
        run_raw(k, (x, q, scale), isa=isa)


@pytest.mark.parametrize("isa", QUANT_ISAS)
@given(dt=st.sampled_from(["f32", "bf16"]), bits=BITS, shp=st.data(), seed=st.integers(0, 2 ** 16),
       zero_row=st.booleans())
def test_quantize(isa, dt, bits, shp, seed, zero_row):
    m, n, pi, po = shp.draw(shape(isa))
    rng = np.random.default_rng(seed)
    k = quantize_kernel(isa, Quantize(m, n, n + pi, n + po, dt, bits))
    x = operand(rng, m, n, dt, n + pi)
    if zero_row:
        x[0] = 0                                      # max |x| = 0: scale stays finite, q = the zero point
    q = poisoned((m, n), np.uint8, n + po, fill=7)
    scale = np.full(m, np.nan, np.float32)
    want_q, want_s = q.copy(), scale.copy()
    k.reference(x, want_q, want_s)
    if zero_row:
        assert (want_q[0] == zero_point(bits)).all()
    assert 1 <= want_q.min() and want_q.max() <= 2 * zero_point(bits) - 1
    run_quantize(isa, k, x, q, scale)
    np.testing.assert_array_equal(q, want_q)
    np.testing.assert_array_equal(scale, want_s)
    assert (q.base[:, n:] == 7).all(), "kernel wrote past a row's end"


@pytest.mark.parametrize("isa", QUANT_ISAS)
@given(dt=st.sampled_from(["f32", "bf16"]), bits=BITS, shp=st.data(), seed=st.integers(0, 2 ** 16))
def test_quantize_non_finite_rows_get_a_non_finite_scale(isa, dt, bits, shp, seed):
    """A row with a NaN gets scale NaN (even beside an inf), one with an inf and no NaN scale inf,
    wherever they sit (the first, last or a tail lane); other rows are untouched by them."""
    m, n, pi, po = shp.draw(shape(isa))
    m = max(m, 3)
    rng = np.random.default_rng(seed)
    k = quantize_kernel(isa, Quantize(m, n, n + pi, n + po, dt, bits))
    x = operand(rng, m, n, dt, n + pi)
    cols = [shp.draw(st.integers(0, n - 1)) for _ in range(3)]
    x[0, cols[1]] = rng.choice([np.inf, -np.inf])
    x[0, cols[0]] = np.nan                            # (over the inf when n = 1)
    x[1, cols[2]] = rng.choice([np.inf, -np.inf])
    q = poisoned((m, n), np.uint8, n + po, fill=7)
    scale = np.full(m, 1.0, np.float32)
    want_q, want_s = q.copy(), scale.copy()
    k.reference(x, want_q, want_s)
    run_quantize(isa, k, x, q, scale)
    assert np.isnan(scale[0]) and scale[1] == np.inf
    np.testing.assert_array_equal(scale, want_s)
    np.testing.assert_array_equal(q[2:], want_q[2:])
    assert (q.base[:, n:] == 7).all(), "kernel wrote past a row's end"


def extreme_rows(rng, m, n):
    """Finite rows at the edges: fp32's largest values, denormals, all zero, ties of the rounding
    at 8 and 7 bits (max|x| = 127 or 63 makes inv 1), one huge value beside tiny ones; normal rows."""
    big, tiny = np.finfo(np.float32).max, np.float32(1e-45)
    x = (rng.standard_normal((m, n)) * 3).astype(np.float32)
    for i in range(m):
        kind = i % 7
        if kind == 1:
            x[i] = rng.choice([big, -big, big / 3, 0], n)
        elif kind == 2:
            x[i] = rng.integers(-8, 9, n) * tiny
        elif kind == 3:
            x[i] = 0
        elif kind in (4, 5):
            x[i] = rng.integers(-40, 40, n) + 0.5
            x[i, rng.integers(n)] = rng.choice([-1, 1]) * (127.0 if kind == 4 else 63.0)
        elif kind == 6:
            x[i] = rng.standard_normal(n).astype(np.float32) * 1e-30
            x[i, rng.integers(n)] = rng.choice([-big, big])
    return x


@pytest.mark.parametrize("isa", QUANT_ISAS)
@pytest.mark.parametrize("seed", range(3))
def test_quantize_7_bit_codes_lie_in_1_to_127(isa, seed):
    """bits=7 (for u7 BRGEMMs, whose vpmaddubsw is exact only for u8 <= 127): every code of a finite
    row lies in 1..127, whatever the magnitudes, zero maps to 64 and the codes dequantize to x within
    half a step ((q - 64) * scale, scale = max|x| / 63); and they are the reference's, bit for bit."""
    m, n = 14, 37
    rng = np.random.default_rng(seed)
    k = quantize_kernel(isa, Quantize(m, n, bits=7))
    x = poisoned((m, n), np.float32, n)
    x[...] = extreme_rows(rng, m, n)
    q, scale = poisoned((m, n), np.uint8, n, fill=255), np.full(m, np.nan, np.float32)
    run_quantize(isa, k, x, q, scale)
    assert 1 <= q.min() and q.max() <= 127, (q.min(), q.max())
    assert (q[x == 0] == 64).all()
    amax = np.maximum(np.abs(x.astype(np.float64)).max(axis=1), 1e-30)
    np.testing.assert_allclose(scale, amax / 63, rtol=2 ** -23)
    err = np.abs((q.astype(np.float64) - 64) * scale[:, None] - x) / scale[:, None]
    assert err.max() <= 0.5 + 1e-5, err.max()
    want_q, want_s = q.copy(), scale.copy()
    k.reference(x, want_q, want_s)
    np.testing.assert_array_equal(q, want_q)
    np.testing.assert_array_equal(scale, want_s)
    assert (levels(7), zero_point(7), levels(8), zero_point(8)) == (63, 64, 127, 128)


@pytest.mark.parametrize("bad", [6, 9, 0, -8, True, False, "7", 7.0, None, np.float32(8)])
def test_quantize_refuses_bits_other_than_7_or_8(bad):
    """bits is 8 or 7, an int: the message names both and what each means (a bool, a string or a float
    is refused too, by the constructor and by the descriptor)."""
    fix = (r"quantize: bits=.*; expected 8 \(codes 1\.\.255, zero point 128\) or 7 \(codes 1\.\.127, zero point "
           r"64, for u7 BRGEMMs: tppasm\.brgemm\(\.\.\., a_bits=7\)\)")
    with pytest.raises(ValueError, match=fix):
        tppasm.quantize(4, 16, bits=bad)
    with pytest.raises(ValueError, match=fix):
        Quantize(4, 16, bits=bad)


def test_quantize_bits_defaults_to_8_and_takes_numpy_ints():
    assert Quantize(4, 16) == Quantize(4, 16, bits=8) and Quantize(4, 16).bits == 8
    d = Quantize(4, 16, bits=np.int64(7))
    assert type(d.bits) is int and d == Quantize(4, 16, 0, 0, "f32", 7)
    assert tppasm.quantize(4, 16, bits=7).desc.bits == 7


@pytest.mark.parametrize("isa", ISAS)
@given(odt=st.sampled_from(["f32", "bf16"]), beta=st.sampled_from([0, 1]), shp=st.data(), seed=st.integers(0, 2 ** 16))
def test_dequant(isa, odt, beta, shp, seed):
    m, n, pi, po = shp.draw(shape(isa))
    rng = np.random.default_rng(seed)
    k = get_kernel(Dequant(m, n, n + pi, n + po, odt, beta), isa)
    c = poisoned((m, n), np.int32, n + pi, fill=0)
    c[...] = rng.integers(-2 ** 20, 2 ** 20, (m, n))
    offset = rng.integers(-2 ** 16, 2 ** 16, n).astype(np.int32)
    rs, cs = rng.random(m).astype(np.float32), rng.random(n).astype(np.float32)
    out = operand(rng, m, n, odt, n + po) if beta else poisoned((m, n), D(odt), n + po)
    want = run(k, (c, offset, rs, cs, out), isa)
    assert_close(out, want, odt, scale=float(np.abs(want.astype(np.float64)).max()) + 1)
    pads_untouched(out)


@pytest.mark.parametrize("isa", ISAS)
def test_dequant_wraps_c_plus_offset_in_int32(isa):
    """c + offset past the int32 range wraps (as the BRGEMM's int32 sums do), in the kernel and
    in the reference alike."""
    k = get_kernel(Dequant(2, 21), isa)
    c = np.full((2, 21), 2 ** 31 - 5, np.int32)
    c[1] = -2 ** 31 + 3
    offset = np.where(np.arange(21) % 2, 100, -100).astype(np.int32)
    out = np.zeros((2, 21), np.float32)
    want = run(k, (c, offset, np.ones(2, np.float32), np.ones(21, np.float32), out), isa)
    np.testing.assert_array_equal(out, want)
    assert out[0, 1] < 0 and out[1, 0] > 0                # wrapped, both ways


@pytest.mark.parametrize("isa", ISAS)
def test_dequant_extreme_scales_whose_product_fits_stay_exact(isa):
    """A tiny row scale times a huge column scale fits in fp32 (c * col_scale alone would overflow),
    as does a huge one times a denormal (c * col_scale alone would lose bits): the kernel multiplies
    the two scales first."""
    k = get_kernel(Dequant(1, 19), isa)
    c = np.arange(1, 20, dtype=np.int32)[None] * 1000
    for rs, cs in [(1e-30, 3.4e38), (1e38, 1e-44)]:
        out = np.zeros((1, 19), np.float32)
        want = run(k, (c, np.zeros(19, np.int32), np.full(1, rs, np.float32), np.full(19, cs, np.float32), out), isa)
        assert np.isfinite(want).all()
        np.testing.assert_allclose(out, want, rtol=2 ** -21)


@pytest.mark.parametrize("isa", ISAS)
@given(dts=st.sampled_from([("f32", "f32"), ("bf16", "bf16"), ("f32", "bf16")]), shp=st.data(),
       seed=st.integers(0, 2 ** 16))
def test_swiglu(isa, dts, shp, seed):
    m, n, pg, po = shp.draw(shape(isa))
    dt, odt = dts
    rng = np.random.default_rng(seed)
    k = get_kernel(SwiGLU(m, n, n + pg, n, n + po, dt, odt), isa)
    gate, up = operand(rng, m, n, dt, n + pg), operand(rng, m, n, dt, n)
    out = poisoned((m, n), D(odt), n + po)
    want = run(k, (gate, up, out), isa)
    assert_close(out, want, odt, scale=float(np.abs(want.astype(np.float64)).max()) + 1)
    pads_untouched(out)


@pytest.mark.skipif(not native("avx2"), reason="needs a host that runs AVX2 code")
def test_int8_linear_roundtrip():
    """quantize -> u8 x s8 BRGEMM -> dequant (zero point removed by the offset) ~ the float product."""
    rng = np.random.default_rng(3)
    m, k, n = 5, 64, 48
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    ws = np.abs(w).max(axis=0) / 127
    wq = np.rint(w / ws).astype(np.int8)
    q, s = np.empty((m, k), np.uint8), np.empty(m, np.float32)
    tppasm.quantize(m, k)(x, q, s)
    c = np.empty((m, n), np.int32)
    tppasm.brgemm(m, n, k, "i8")(q[None], tppasm.vnni_pack(wq, 4)[None], c)
    offset = (-128 * wq.astype(np.int32).sum(axis=0)).astype(np.int32)
    out = np.empty((m, n), np.float32)
    tppasm.dequant(m, n)(c, offset, s, ws.astype(np.float32), out)
    ref = x @ w
    assert np.abs(out - ref).max() < 0.03 * np.abs(ref).max()


def test_dequant_with_beta_1_reads_out_so_out_is_always_passed():
    """beta=1 adds to out: a call without it would add to uninitialized memory."""
    c, off = np.zeros((2, 16), np.int32), np.zeros(16, np.int32)
    scales = np.ones(2, np.float32), np.ones(16, np.float32)
    k = tppasm.dequant(2, 16, beta=1)
    for call in (k, k.reference):
        with pytest.raises(TypeError, match=r"out is read and written, so always passed\); got 4 arrays"):
            call(c, off, *scales)
    out = np.ones((2, 16), np.float32)
    k(c, off, *scales, out)
    assert (out == 1).all()
    assert tppasm.dequant(2, 16)(c + 3, off, *scales).tolist() == np.full((2, 16), 3.0).tolist()   # beta=0 allocates


def test_dequant_beta1_reference_rounds_the_product_before_the_add():
    """3 * 0.1 - 0.3: the kernels add out to the fp32 product (0.0 here); a float64 sum gives -7.5e-9."""
    k = tppasm.dequant(4, 16, beta=1)
    c = np.full((4, 16), 3, np.int32)
    args = (c, np.zeros(16, np.int32), np.full(4, 0.1, np.float32), np.ones(16, np.float32))
    got, ref = np.full((4, 16), -0.3, np.float32), np.full((4, 16), -0.3, np.float32)
    k(*args, got)
    k.reference(*args, ref)
    assert (ref == 0).all() and (got == ref).all()
    tppasm.testing.assert_matches_reference(k, max_examples=20)
