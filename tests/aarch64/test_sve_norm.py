"""Softmax, layer norm and RMSNorm on the SVE backend (:mod:`tppasm.sve.norm`), run at VL 128, 256
and 512 (natively on an SVE host that runs that length, else under qemu) against each descriptor's
``reference``. Hypothesis draws m, n (tails of every VL), the padding of each leading dimension,
the dtypes, softmax's scale and mask (-inf entries, one finite column kept per row), a large mean
for layer norm; every example also runs each kind in place. Every buffer is NaN-poisoned outside
what the reference writes; written elements are checked against tolerances stated per dtype, the
rest byte for byte (and the runner fails on any write outside the outputs)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from isa.aarch64.native import run_calls
from tppasm.kernel import Kernel
from tppasm.norm import LayerNorm, RMSNorm, Softmax
from tests.aarch64.marks import vl_params
from tests.aarch64.sve_cases import DescCase, InPlaceCase, same_examples_at_every_vl, view

VLS = (128, 256, 512)
DTYPES = [("f32", "f32"), ("bf16", "bf16"), ("f32", "bf16"), ("bf16", "f32")]
SETTINGS = dict(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

example = st.fixed_dictionaries({
    "m": st.integers(1, 5), "n": st.sampled_from([1, 3, 4, 15, 16, 17, 33, 64, 70, 130]),
    "pads": st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
    "dtypes": st.integers(0, 3), "scale": st.sampled_from([1.0, 0.125, 2.5]),
    "mask": st.sampled_from([None, "row", "full"]), "offset": st.sampled_from([0.0, 100.0]),
    "seed": st.integers(0, 2 ** 16)})


def softmax_mask(spec, vw, rng):
    """About 40% of the mask -inf, but one finite (0) column in every row."""
    if spec.name != "mask":
        return
    rows = vw.reshape(-1, vw.shape[-1])
    rows[...] = np.where(rng.random(rows.shape) < 0.4, -np.inf, 0.0)
    rows[np.arange(rows.shape[0]), rng.integers(rows.shape[1], size=rows.shape[0])] = 0.0


def shifted(offset):
    """A fill that adds ``offset`` to x (a large mean: the variance must not cancel)."""
    def fill(spec, vw, rng):
        if spec.name == "x":
            vw[...] = (vw.astype(np.float32) + offset).astype(vw.dtype)
    return fill


def tolerance(case):
    """(rtol, atol) of a case's outputs: softmax's are in [0, 1] and relative; a norm's absolute part
    scales with its terms (|x_hat| <~ 4 times gamma, plus beta), where outputs cancel to ~0."""
    d = case.desc
    bf16 = d.out_dtype == "bf16"
    if d.kind == "softmax":
        return (8e-3 if bf16 else 2e-5), 1e-6
    gamma, *beta = (view(b, s, 1) for b, s in zip(case.bufs[1:], d.operands()[1:-1]))
    scale = 4 * np.abs(gamma).max() + (np.abs(beta[0]).max() if beta else 0)
    return (8e-3 if bf16 else 2e-5), 4e-6 * float(scale)


def check(got, want, rtol, atol, what):
    """Every element of the buffer: NaN poison byte for byte, the rest within rtol/atol."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    poisoned = np.isnan(w)
    same_bytes = got.view(np.uint8).reshape(got.size, -1) == want.view(np.uint8).reshape(want.size, -1)
    bad = np.flatnonzero((poisoned & ~same_bytes.all(1)) | (~poisoned & ~(np.abs(g - w) <= atol + rtol * np.abs(w))))
    assert not bad.size, (f"{what}: {bad.size} elements differ, first at flat {bad[0]}: got {got[bad[0]]!r}, "
                          f"expected {want[bad[0]]!r}")


def run_all(cases, bits):
    run_calls([c.call() for c in cases], vl_bits=bits)
    for c in cases:
        rtol, atol = tolerance(c)
        for got, want in c.results():
            check(got, want, rtol, atol, f"VL {bits}: {c.desc}{' in place' if isinstance(c, InPlaceCase) else ''}")


def cases_of(s):
    """The kernels of one example: each kind on its own buffers (dtypes rotated), then in place."""
    m, n, (pi, po, pm), i, seed = s["m"], s["n"], s["pads"], s["dtypes"], s["seed"]
    dts = [DTYPES[(i + j) % len(DTYPES)] for j in range(3)]
    lds = dict(ldi=n + pi, ldo=n + po)
    ldm = n + pm if s["mask"] == "full" else 0          # the row stride of a full mask only
    soft = Softmax(m, n, **lds, dtype=dts[0][0], out_dtype=dts[0][1], scale=s["scale"], mask=s["mask"], ldm=ldm)
    layer = LayerNorm(m, n, **lds, dtype=dts[1][0], out_dtype=dts[1][1], eps=1e-5)
    rms = RMSNorm(m, n, **lds, dtype=dts[2][0], out_dtype=dts[2][1], eps=1e-6)
    cases = [DescCase(soft, seed, fill=softmax_mask), DescCase(layer, seed + 1, fill=shifted(s["offset"])),
             DescCase(rms, seed + 2)]
    dt, ld = DTYPES[i][0], n + pi
    same = dict(ldi=ld, ldo=ld, dtype=dt, out_dtype=dt)
    cases += [InPlaceCase(Softmax(m, n, **same, scale=s["scale"], mask=s["mask"], ldm=ldm), "x", seed + 3,
                          softmax_mask),
              InPlaceCase(LayerNorm(m, n, **same), "x", seed + 4, shifted(s["offset"])),
              InPlaceCase(RMSNorm(m, n, **same), "x", seed + 5)]
    return cases


@pytest.mark.parametrize("bits", vl_params(VLS))
@same_examples_at_every_vl
@settings(**SETTINGS)
@given(example)
def test_norms(bits, s):
    run_all(cases_of(s), bits)


@pytest.mark.parametrize("bits", vl_params((128, 512)))
def test_wide_rows_and_extreme_logits(bits):
    """Rows of many steps (n = 1000 and 1001: a partial last step at every VL), a mean of 1000 for
    layer norm, and logits spread over about +-80 after the scale (exp's range ends, mostly zeros)."""
    cases = []
    for n in (1000, 1001):
        for j, (dt, odt) in enumerate(DTYPES):
            cases.append(DescCase(Softmax(2, n, ldi=n + 1, dtype=dt, out_dtype=odt, scale=9.0, mask="row"),
                                  seed=n + j, fill=softmax_mask))
        cases.append(DescCase(LayerNorm(2, n, ldo=n + 3, dtype="bf16", out_dtype="f32"), seed=n, fill=shifted(1e3)))
        cases.append(DescCase(RMSNorm(2, n, ldi=n + 2, out_dtype="bf16"), seed=n))
    run_all(cases, bits)


@pytest.mark.parametrize("bits", vl_params((128,)))
def test_layernorm_of_a_row_of_equal_values_is_beta(bits):
    """As on x86: the mean of a row of equal values is exact, so the output is beta exactly."""
    def equal(value):
        def fill(spec, v, rng):
            if spec.name == "x":
                v[...] = value
        return fill
    cases = [DescCase(LayerNorm(2, n, dtype=dt, out_dtype=odt, eps=eps), seed=n, fill=equal(value))
             for n in (33, 63) for value in (0.1, 7.78125, 1e6) for dt, odt in (("f32", "f32"), ("bf16", "f32"))
             for eps in (1e-5, float(np.finfo(np.float32).tiny))]
    run_all(cases, bits)


@pytest.mark.parametrize("make", [lambda: Softmax(3, 20, mask="full", ldm=24), lambda: LayerNorm(3, 20),
                                  lambda: RMSNorm(3, 20)], ids=["softmax", "layernorm", "rmsnorm"])
def test_registered_and_exact_rstd(make):
    """Each kind builds through Kernel(desc, "sve"); the norms' 1/sqrt is fsqrt + fdiv, no estimate."""
    text = Kernel(make(), "sve").disassemble()
    assert "fdiv" in text and ("fsqrt" in text or make().kind == "softmax")
    assert "frsqrte" not in text and "frecpe" not in text
