"""Softmax (scale, mask), layer norm, RMSNorm and rotary TPPs x dtype x ISA against their NumPy
references: random shapes with tails, leading dimensions past n, outputs poisoned with NaN and
every element checked, row pads checked untouched, in-place calls, refused descriptors."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tppasm
from tppasm.dtypes import dtype as D
from tppasm.kernel import get_kernel
from tppasm.norm import LayerNorm, RMSNorm, Softmax
from tppasm.glu import SwiGLU
from tppasm.rotary import Rotary, rope_tables
from tests.support import assert_same_non_finite, isa_params, native, poisoned, run_raw, sprinkle

ISAS = isa_params()
DTYPES = st.sampled_from([("f32", "f32"), ("bf16", "bf16"), ("f32", "bf16"), ("bf16", "f32")])


def shape(isa):
    """(m, n, ld pad in, ld pad out); natively n also reaches the column loops (many vectors)."""
    hi = 70 if native(isa) else 24
    n = st.one_of(st.integers(1, hi), st.integers(90, 600)) if native(isa) else st.integers(1, 40)
    return st.tuples(st.integers(1, hi // 4 + 1), n, st.integers(0, 9), st.integers(0, 9))


def operand(rng, m, n, dt, ld, scale=3.0):
    out = poisoned((m, n), D(dt), ld)
    out[...] = (rng.standard_normal((m, n)) * scale).astype(np.float32).astype(D(dt))
    return out


def run(kernel, arrays, isa):
    want = [a.copy() for a in arrays]
    kernel.reference(*want)
    run_raw(kernel, arrays, isa=isa)
    return want[-1]


def assert_close(got, want, odt, scale=1.0):
    """Outputs within fp32 (or one bf16 rounding) of the float64 reference, relative to ``scale``."""
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    assert not np.isnan(got64).any(), "an output element was not written (NaN poison left)"
    tol = (2.0 ** -7 * np.abs(want64) + 2.0 ** -16 * scale) if odt == "bf16" else 4e-6 * scale
    bad = np.abs(got64 - want64) > tol
    assert not bad.any(), f"{bad.sum()} elements off, e.g. got {got64[bad][:4]} want {want64[bad][:4]}"


def pads_untouched(arr):
    base = arr.base
    if base is not None and base.shape != arr.shape:
        assert np.isnan(base[..., arr.shape[-1]:].astype(np.float64)).all(), "kernel wrote past a row's end"


@pytest.mark.parametrize("isa", ISAS)
@given(dts=DTYPES, masked=st.sampled_from([None, "row", "full"]), scale=st.sampled_from([1.0, 0.125, 2.5]),
       shp=st.data(), seed=st.integers(0, 2 ** 16), pm=st.integers(0, 5))
def test_softmax(isa, dts, masked, scale, shp, seed, pm):
    m, n, pi, po = shp.draw(shape(isa))
    dt, odt = dts
    rng = np.random.default_rng(seed)
    ldm = n + pm if masked == "full" else 0                  # the row stride of a full mask only
    k = get_kernel(Softmax(m, n, n + pi, n + po, dt, odt, scale, masked, ldm), isa)
    x = operand(rng, m, n, dt, n + pi)
    out = poisoned((m, n), D(odt), n + po)
    rows = m if masked == "full" else 1
    mask = poisoned((rows, n), np.float32, n + pm)
    mask[...] = np.where(rng.random((rows, n)) < 0.4, -np.inf, 0.0)
    mask[np.arange(rows), rng.integers(n, size=rows)] = 0.0     # one column kept in every row
    mask = mask[0] if masked == "row" else mask
    want = run(k, (x, mask, out) if masked else (x, out), isa)
    assert_close(out, want, odt)
    if masked:
        assert (out.astype(np.float32)[np.broadcast_to(mask, out.shape) == -np.inf] == 0).all(), \
            "a masked column got weight"
    pads_untouched(out)



@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n", [37, 128, 300])      # rows in registers and in passes, on either ISA
def test_softmax_tiny_probabilities_to_a_few_ulps(isa, n):
    """Logits spread down to 95 below the row's maximum: every probability down to 2^-125 within
    4 fp32 ulps of the float64 softmax (where an absolute tolerance sees nothing), those under it
    within 2^-125, none negative: the exponent of exp's 2^n must be right over all of exp's range."""
    rng = np.random.default_rng(n)
    x = -rng.uniform(0.0, 95.0, (3, n)).astype(np.float32)
    x[:, rng.integers(n, size=3)] = 0.0
    x[2, :] = np.linspace(-95.0, 0.0, n, dtype=np.float32)
    out = np.full_like(x, np.nan)
    k = get_kernel(Softmax(3, n, n, n, "f32", "f32", 1.0, None, 0), isa)
    run_raw(k, (x, out), isa=isa)
    e = np.exp(x.astype(np.float64))
    want = e / e.sum(axis=1, keepdims=True)
    normal = want >= 2.0 ** -125
    assert (out >= 0).all()
    rel = np.abs(out - want)[normal] / want[normal]
    assert rel.max() <= 4 * 2.0 ** -23, f"{rel.max() / 2.0 ** -23:.1f} ulp"
    assert np.abs(out - want)[~normal].max(initial=0) <= 2.0 ** -125

@pytest.mark.parametrize("isa", ISAS)
@given(dts=DTYPES, shp=st.data(), seed=st.integers(0, 2 ** 16), offset=st.sampled_from([0.0, 100.0]))
def test_layernorm(isa, dts, shp, seed, offset):
    m, n, pi, po = shp.draw(shape(isa))
    dt, odt = dts
    rng = np.random.default_rng(seed)
    k = get_kernel(LayerNorm(m, n, n + pi, n + po, dt, odt, eps=1e-5), isa)
    x = operand(rng, m, n, dt, n + pi)
    x[...] = (x.astype(np.float32) + offset).astype(D(dt))     # a large mean: the two-pass variance holds
    gamma, beta = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    out = poisoned((m, n), D(odt), n + po)
    want = run(k, (x, gamma, beta, out), isa)
    assert_close(out, want, odt, scale=float(np.abs(gamma).max() * 4 + np.abs(beta).max()))
    pads_untouched(out)


@pytest.mark.parametrize("isa", ISAS)
@given(dts=DTYPES, shp=st.data(), seed=st.integers(0, 2 ** 16))
def test_rmsnorm(isa, dts, shp, seed):
    m, n, pi, po = shp.draw(shape(isa))
    dt, odt = dts
    rng = np.random.default_rng(seed)
    k = get_kernel(RMSNorm(m, n, n + pi, n + po, dt, odt, eps=1e-6), isa)
    x = operand(rng, m, n, dt, n + pi)
    gamma = rng.standard_normal(n).astype(np.float32)
    out = poisoned((m, n), D(odt), n + po)
    want = run(k, (x, gamma, out), isa)
    assert_close(out, want, odt, scale=float(np.abs(gamma).max() * 4))
    pads_untouched(out)


@pytest.mark.parametrize("isa", ISAS)
@given(dts=DTYPES, half=st.one_of(st.integers(1, 20), st.sampled_from([32, 64])), heads=st.integers(1, 5),
       m=st.integers(1, 6), pads=st.tuples(st.integers(0, 9), st.integers(0, 9), st.integers(0, 5)),
       seed=st.integers(0, 2 ** 16))
def test_rotary(isa, dts, half, heads, m, pads, seed):
    dt, odt = dts
    d = 2 * half
    n = d * heads
    rng = np.random.default_rng(seed)
    k = get_kernel(Rotary(m, n, d, n + pads[0], n + pads[1], half + pads[2], dt, odt), isa)
    x = operand(rng, m, n, dt, n + pads[0], scale=1.0)
    cos, sin = (poisoned((m, half), np.float32, half + pads[2]) for _ in range(2))
    cos[...], sin[...] = rope_tables(rng.integers(0, 4096, m), d)
    out = poisoned((m, n), D(odt), n + pads[1])
    want = run(k, (x, cos, sin, out), isa)
    assert_close(out, want, odt, scale=2.0)
    pads_untouched(out)


@pytest.mark.parametrize("isa", ISAS)
@given(kind=st.sampled_from(["softmax", "softmax row mask", "layernorm", "rmsnorm", "rotary", "swiglu"]),
       dts=DTYPES, shp=st.data(), seed=st.integers(0, 2 ** 16))
def test_non_finite_inputs_follow_the_reference(isa, kind, dts, shp, seed):
    """NaN and infinities in some lanes: each output lane is NaN / inf exactly where the
    reference's is (a row's statistics carry them to the whole row)."""
    m, n, pi, po = shp.draw(shape(isa))
    if kind == "rotary":
        n = 2 * max(1, n // 2)                       # one head of n: pairs (x[j], x[j + n/2])
    dt, odt = dts
    rng = np.random.default_rng(seed)
    x = sprinkle(rng, operand(rng, m, n, dt, n + pi), 0.03)
    out = poisoned((m, n), D(odt), n + po)
    gamma = rng.standard_normal(n).astype(np.float32)
    if kind.startswith("softmax"):
        masked = "row" if "mask" in kind else None
        k = get_kernel(Softmax(m, n, n + pi, n + po, dt, odt, 1.0, masked, n), isa)
        mask = np.where(rng.random(n) < 0.3, -np.inf, 0.0).astype(np.float32)
        args = (x, mask, out) if masked else (x, out)
    elif kind == "layernorm":
        k = get_kernel(LayerNorm(m, n, n + pi, n + po, dt, odt, eps=1e-5), isa)
        args = (x, gamma, rng.standard_normal(n).astype(np.float32), out)
    elif kind == "rmsnorm":
        k = get_kernel(RMSNorm(m, n, n + pi, n + po, dt, odt, eps=1e-6), isa)
        args = (x, gamma, out)
    elif kind == "rotary":
        half = n // 2
        k = get_kernel(Rotary(m, n, n, n + pi, n + po, half, dt, odt), isa)
        cos, sin = (np.ascontiguousarray(t, np.float32) for t in rope_tables(rng.integers(0, 4096, m), n))
        args = (x, cos, sin, out)
    else:
        k = get_kernel(SwiGLU(m, n, n + pi, n, n + po, dt, odt), isa)
        args = (x, sprinkle(rng, operand(rng, m, n, dt, n), 0.03), out)
    with np.errstate(all="ignore"):
        want = run(k, args, isa)
    assert_same_non_finite(out, want, f"{kind} {dts}")
    pads_untouched(out)


@pytest.mark.parametrize("isa", ISAS)
def test_in_place(isa):
    """Each op may write over its input (the models normalize their activations in place)."""
    rng = np.random.default_rng(7)
    m, n = 3, 40
    g, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    cos, sin = rope_tables(np.arange(m), 10)
    for desc, extra in ((Softmax(m, n, scale=0.5), ()), (LayerNorm(m, n), (g, b)), (RMSNorm(m, n), (g,)),
                        (Rotary(m, n, 10), (cos, sin))):
        x = rng.standard_normal((m, n)).astype(np.float32)
        want = x.copy()
        desc.reference(x.copy(), *extra, want)
        run_raw(get_kernel(desc, isa), (x, *extra, x), isa=isa)
        np.testing.assert_allclose(x, want, rtol=1e-5, atol=1e-6, err_msg=desc.kind)


@pytest.mark.parametrize("make, message", [
    (lambda: Softmax(2, 3, scale=float("nan")), "finite"),
    (lambda: Softmax(2, 3, scale="1"), "finite float"),
    (lambda: Softmax(2, 3, mask="col"), "mask"),
    (lambda: Softmax(2, 3, mask="full", ldm=2), "ldm"),
    (lambda: LayerNorm(2, 3, eps=0.0), "smallest normal"),
    (lambda: LayerNorm(2, 3, eps=1e-50), "smallest normal"),        # 0 in fp32: constant rows were NaN
    (lambda: RMSNorm(2, 3, eps=1e-39), "smallest normal"),          # subnormal in fp32
    (lambda: LayerNorm(2, 3, eps=1e39), "fp32"),                    # inf in fp32
    (lambda: RMSNorm(2, 3, eps=3.5e38), "fp32"),
    (lambda: Softmax(2, 3, scale=-1e39), "fp32"),
    (lambda: Softmax(2, 3, ldm=7), "mask='full'"),                  # ldm of no mask
    (lambda: Softmax(2, 3, mask="row", ldm=7), "mask='full'"),
    (lambda: RMSNorm(2, 3, ldi=2), "ldx"),
    (lambda: LayerNorm(2, 3, dtype="i8"), "dtype"),
    (lambda: Rotary(2, 6, 4), "divide"),
    (lambda: Rotary(2, 6, 3), "even"),
    (lambda: Rotary(2, 8, 4, ldt=1), "ldt"),
])
def test_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make().validate()


def test_smallest_normal_eps_keeps_constant_rows_finite():
    x, g = np.ones((1, 4), np.float32), np.ones(4, np.float32)
    out = tppasm.layernorm(1, 4, eps=float(np.finfo(np.float32).tiny))(x, g, np.full(4, 0.5, np.float32))
    assert out.tolist() == [[0.5] * 4]
    assert tppasm.rmsnorm(1, 4, eps=float(np.finfo(np.float32).tiny))(np.zeros((1, 4), np.float32), g).tolist() == \
        [[0.0] * 4]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dts", [("f32", "f32"), ("bf16", "f32"), ("f32", "bf16")])
@pytest.mark.parametrize("value", [0.1, 7.78125, 1e6, -3.3])
def test_layernorm_of_a_row_of_equal_values_is_beta(isa, dts, value):
    """Its mean is exact (the sum of 0.1 x 33 and 1/63 round in fp32; x0 + sum(x - x0)/n does
    not), so every deviation is 0 and the output is beta, as in the reference, whatever eps."""
    dt, odt = dts
    for n in (1, 33, 63, 100):
        for eps in (1e-5, float(np.finfo(np.float32).tiny)):
            k = get_kernel(LayerNorm(2, n, dtype=dt, out_dtype=odt, eps=eps), isa)
            x = np.full((2, n), value, np.float32).astype(D(dt))
            rng = np.random.default_rng(n)
            g, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
            out = poisoned((2, n), D(odt), n)
            want = run(k, (x, g, b, out), isa)
            np.testing.assert_array_equal(out.astype(np.float32), want.astype(np.float32))


def test_wrong_operands_explained():
    import tppasm
    k = tppasm.layernorm(2, 4)
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match="gamma has shape"):
        k(x, np.zeros(3, np.float32), np.zeros(4, np.float32), x)
    row = tppasm.softmax(2, 4, mask="row")
    with pytest.raises(ValueError, match=r"mask has 2 dimensions .* takes \(x, mask, out\), or \(x, mask\)"):
        row(x, x)                         # (x, out): out taken for the mask
