"""The LLM row-wise TPPs on the SVE backend (rotary, SwiGLU, quantize, dequant; tppasm/sve/rotary.py,
glu.py, quant.py) against each descriptor's ``reference`` at VL 128, 256 and 512, natively on an
SVE host that runs that length, else under qemu. Hypothesis draws m, n (tails at every VL), the
padding of each leading dimension and the options; every dtype combination runs in each example.
Buffers are poisoned (NaN / 0x5A) outside what the reference writes and every element of every
written buffer is compared (poison included).

Tolerances, per element ``|got - want| <= atol + rtol |want|``:

- quantize: none. Codes and scales are compared bit for bit: the kernel does the reference's fp32
  operations (two correctly rounded divisions, one multiply, round to nearest even), so nothing is
  ambiguous. Rows of ties (x*inv exactly k + 0.5), all-zero rows, denormal and huge rows are drawn.
- dequant: the kernel rounds twice in fp32 (v*(col*row)), the reference once from float64:
  rtol 2^-22; with beta=1 the sum can cancel, so atol 2^-21 of the case's largest |v*col*row|.
- rotary: ``x1*c`` is rounded before the fused ``- x2*s``; with |cos|, |sin| <= 1 the error is
  below 3 * 2^-24 max|x|: atol 2^-20 max|x|.
- swiglu: the sigmoid emitter's 3 ulp (tppasm.sve.math.ACCURACY) and two multiplies: rtol 2^-20.
- bf16 out adds rtol 2^-7: a kernel value a few fp32 ulps off the reference's can round to the
  neighbouring bf16 (one bf16 ulp is at most 2^-7 of the value); the atols above keep a factor 2
  of room for that rounding of a cancelled, near-zero value.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from isa.aarch64.native import run_calls
from tppasm.glu import SwiGLU
from tppasm.quant import Dequant, Quantize
from tppasm.rotary import Rotary
from tests.aarch64.marks import needs_sve_runner, vl_params
from tests.aarch64.sve_cases import DescCase, InPlaceCase, close, same_examples_at_every_vl, sve_kernel, view

VLS = (128, 256, 512)
DTYPES = [("f32", "f32"), ("bf16", "bf16"), ("f32", "bf16"), ("bf16", "f32")]
SETTINGS = dict(max_examples=50, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BF16_RTOL = 2.0 ** -7

rows = st.fixed_dictionaries({
    "m": st.integers(1, 4), "n": st.sampled_from([1, 3, 4, 7, 8, 15, 17, 33, 64, 70]),
    "pads": st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)), "seed": st.integers(0, 2 ** 16)})
heads = st.fixed_dictionaries({
    "m": st.integers(1, 3), "half": st.sampled_from([1, 2, 3, 4, 5, 8, 9, 16, 17, 33]), "heads": st.integers(1, 3),
    "pads": st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)), "seed": st.integers(0, 2 ** 16)})


def _input(case, name):
    i = next(i for i, s in enumerate(case.specs) if s.name == name)
    return view(case.bufs[i], case.specs[i], 1).astype(np.float64)


def tolerance(case):
    """(rtol, atol) of a case (see the module docstring)."""
    d = case.desc
    bf16 = BF16_RTOL if getattr(d, "out_dtype", "f32") == "bf16" else 0.0
    if d.kind == "quantize":
        return 0.0, 0.0
    if d.kind == "rotary":
        return bf16, 2.0 ** -20 * np.abs(_input(case, "x")).max()
    if d.kind == "swiglu":
        return bf16 + 2.0 ** -20, 1e-30
    v = np.abs(_input(case, "c") + _input(case, "offset")[None, :])
    p = v * np.abs(_input(case, "col_scale"))[None, :] * np.abs(_input(case, "row_scale"))[:, None]
    return bf16 + 2.0 ** -22, 2.0 ** -21 * p.max()


def check(case, bits):
    rtol, atol = tolerance(case)
    for got, want in case.results():
        if (rtol, atol) == (0.0, 0.0):                      # bit for bit, NaN poison included
            g, w = got.view(np.uint8).reshape(-1), want.view(np.uint8).reshape(-1)
            bad = np.flatnonzero(g != w)
        else:
            g, w, bad = got, want, close(got, want, rtol, atol)
        assert not bad.size, (f"VL {bits}: {case.desc}: {bad.size} elements (bytes if exact) differ, first at "
                              f"flat {bad[0]}: got {g[bad[0]]!r}, expected {w[bad[0]]!r}")


def run_all(cases, bits):
    run_calls([c.call() for c in cases], vl_bits=bits)
    for c in cases:
        check(c, bits)


def unit_tables(spec, v, rng):
    """cos/sin of random angles (|value| <= 1, as rope tables are); x keeps its normal values."""
    if spec.name in ("cos", "sin"):
        v[...] = (np.cos if spec.name == "cos" else np.sin)(rng.uniform(-4, 4, v.shape)).astype(np.float32)


def quantize_rows(spec, v, rng):
    """Rows of x that probe the reference's edges: all zero, ties of the rounding (max 127, so
    inv = 1), denormal magnitudes, huge magnitudes; the rest stay normal."""
    if spec.name != "x":
        return
    for i in range(v.shape[0]):
        kind = rng.integers(0, 5)
        if kind == 1:
            v[i] = 0.0
        elif kind == 2:
            ties = rng.integers(-20, 20, v.shape[1]) + 0.5
            ties[rng.integers(0, v.shape[1])] = rng.choice([127.0, -127.0])
            v[i] = ties.astype(np.float32)
        elif kind == 3:
            v[i] = (rng.standard_normal(v.shape[1]) * 1e-39).astype(np.float32)
        elif kind == 4:
            v[i] = (rng.standard_normal(v.shape[1]) * 1e36).astype(np.float32)


@pytest.mark.parametrize("bits", vl_params(VLS))
@same_examples_at_every_vl
@settings(**SETTINGS)
@given(heads, rows)
def test_rotary_swiglu(bits, h, s):
    m, half, nh, (pi, po, pt), seed = h["m"], h["half"], h["heads"], h["pads"], h["seed"]
    n = nh * 2 * half
    cases = []
    for i, (dt, out) in enumerate(DTYPES):
        d = Rotary(m, n, 2 * half, ldi=n + pi, ldo=n + po, ldt=half + pt, dtype=dt, out_dtype=out)
        cases.append(DescCase(d, seed=seed + i, fill=unit_tables))
    for dt in ("f32", "bf16"):
        d = Rotary(m, n, 2 * half, ldi=n + pi, ldo=n + pi, ldt=half + pt, dtype=dt, out_dtype=dt)
        cases.append(InPlaceCase(d, "x", seed=seed, fill=unit_tables))
    m, n, (pg, pu, po), seed = s["m"], s["n"], s["pads"], s["seed"]
    for i, (dt, out) in enumerate(DTYPES):
        cases.append(DescCase(SwiGLU(m, n, ldg=n + pg, ldu=n + pu, ldo=n + po, dtype=dt, out_dtype=out),
                              seed=seed + i))
    cases.append(InPlaceCase(SwiGLU(m, n, ldg=n + pg, ldu=n + pu, ldo=n + pg, dtype="bf16"), "gate", seed=seed))
    run_all(cases, bits)


@pytest.mark.parametrize("bits", vl_params(VLS))
@same_examples_at_every_vl
@settings(**SETTINGS)
@given(rows)
def test_quantize_dequant(bits, s):
    m, n, (pi, po, _), seed = s["m"], s["n"], s["pads"], s["seed"]
    cases = [DescCase(Quantize(m + 2, n, ldi=n + pi, ldo=n + po, dtype=dt), seed=seed + i, fill=quantize_rows)
             for i, dt in enumerate(("f32", "bf16"))]
    for i, (out, beta) in enumerate([("f32", 0), ("f32", 1), ("bf16", 0), ("bf16", 1)]):
        cases.append(DescCase(Dequant(m, n, ldi=n + pi, ldo=n + po, out_dtype=out, beta=beta), seed=seed + i))
    run_all(cases, bits)


@needs_sve_runner(128)
def test_quantize_all_zero_row_is_the_references():
    """An all-zero row: the reference floors max|x| at 1e-30, so its scale is 1e-30/127 (not 0) and
    every code is the zero point; the kernel writes exactly that."""
    d = Quantize(2, 5)
    case = DescCase(d, fill=lambda spec, v, rng: v.__setitem__(0, 0.0) if spec.name == "x" else None)
    q, scale = case.expected[1].reshape(2, 5), case.expected[2]
    assert (q[0] == 128).all() and scale[0] == np.float32(1e-30) / np.float32(127)
    run_all([case], 128)


@needs_sve_runner(128)
def test_dequant_wraps_c_plus_offset_in_int32():
    """c + offset past the int32 range wraps, as on x86 and in the reference."""
    def edges(spec, v, rng):
        if spec.name == "c":
            v[0], v[1] = 2 ** 31 - 5, -2 ** 31 + 3
        elif spec.name == "offset":
            v[...] = np.where(np.arange(v.size) % 2, 100, -100)
        else:
            v[...] = 1.0                                   # the scales
    case = DescCase(Dequant(2, 21), fill=edges)
    out = case.expected[-1][:42].reshape(2, 21)
    assert out[0, 1] < 0 and out[1, 0] > 0
    run_all([case], 128)


@needs_sve_runner(128)
def test_dequant_extreme_scales_whose_product_fits_stay_exact():
    """As on x86: the scales' product is taken first, so a tiny row scale times a huge column scale
    stays finite, and a huge one times a denormal keeps its bits."""
    def scales(rs, cs):
        def fill(spec, v, rng):
            if spec.name == "c":
                v[...] = np.arange(1, v.size + 1) * 1000
            elif spec.name in ("row_scale", "col_scale"):
                v[...] = rs if spec.name == "row_scale" else cs
            elif spec.name == "offset":
                v[...] = 0
        return fill
    cases = [DescCase(Dequant(1, 19), fill=scales(rs, cs)) for rs, cs in [(1e-30, 3.4e38), (1e38, 1e-44)]]
    for case in cases:
        assert np.isfinite(case.expected[-1][:19]).all()
    run_all(cases, 128)


@pytest.mark.parametrize("bits", vl_params(VLS))
def test_quantize_non_finite_rows_get_a_non_finite_scale(bits):
    """As on x86: a NaN makes its row's scale NaN (beside an inf too), an inf alone makes it inf,
    in a first, last or tail lane; the finite rows stay bit for bit the reference's."""
    n = 37

    def special(spec, v, rng):
        if spec.name == "x":
            v[0, 5], v[0, n - 1] = np.nan, -np.inf
            v[1, n - 1] = np.inf
            v[2, 0] = np.nan
    case = DescCase(Quantize(4, n), fill=special)
    run_calls([case.call()], vl_bits=bits)
    (q, want_q), (scale, want_s) = case.results()
    assert np.isnan(scale[[0, 2]]).all() and scale[1] == np.inf, scale
    assert q.reshape(4, n)[3].tobytes() == want_q.reshape(4, n)[3].tobytes() and scale[3] == want_s[3]


@pytest.mark.parametrize("desc", [Rotary(2, 12, 4), SwiGLU(2, 9), Quantize(2, 9), Dequant(2, 9, beta=1)])
def test_descriptors_take_the_sve_generators(desc):
    """``Kernel(desc, "sve")`` finds these generators (no NotImplementedError) and the code is
    position independent."""
    from tppasm.cache import position
    code = sve_kernel(desc).raw.code
    assert position.audit(code, "sve") is None and len(code) % 4 == 0
