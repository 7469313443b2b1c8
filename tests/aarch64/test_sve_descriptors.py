"""tppasm descriptors on the SVE backend: every kind x dtype built through ``Kernel(desc, "sve")``,
run at VL 128, 256 and 512 against ``desc.reference``, natively on an SVE host that runs that length,
else under qemu. Shapes (with tails and padded leading dimensions) are drawn by hypothesis; every
operand buffer is poisoned (NaN / sentinel) outside the elements the reference writes, and every
byte of every written buffer is checked. All kernels of one example run in one batch (one qemu
process) per vector length."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from isa.aarch64.native import run_calls
from tppasm.brgemm import Brgemm
from tppasm.eltwise import GRAD_OPS, UNARY_OPS, Binary, Reduce, Ternary, Transform, Unary
from tppasm.gemm_nt import GemmNT
from tppasm.glu import SwiGLU
from tppasm.kernel import Kernel
from tppasm.norm import LayerNorm, RMSNorm, Softmax
from tppasm.rotary import Rotary
from tppasm.sve.brgemm import MmlaBrgemm
from tppasm.sve.math import ACCURACY
from tests.aarch64.marks import needs_sve_runner, vl_params
from tests.aarch64.sve_cases import AddressCase, DescCase, close, same_examples_at_every_vl
from tests.support import NAN, SPECIALS, assert_same_non_finite, samples, sprinkle, ulp_errors

VLS = (128, 256, 512)
EXACT = {"copy", "identity", "zero", "relu", "negate", "square", "sqrt", "relu_bwd",
         "add", "sub", "mul", "div", "max", "min", "muladd"}
DTYPES = [("f32", "f32"), ("bf16", "bf16"), ("f32", "bf16"), ("bf16", "f32")]
SETTINGS = dict(max_examples=15, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

shape = st.fixed_dictionaries({
    "m": st.integers(1, 4), "n": st.sampled_from([1, 3, 4, 7, 8, 15, 17, 33, 64, 70]),
    "pad": st.integers(0, 3), "seed": st.integers(0, 2 ** 16)})


def tolerance(case):
    """(rtol, atol) for a case's written buffers: 0 for exact ops, else per op family and dtype."""
    d = case.desc
    bf16_out = getattr(d, "out_dtype", getattr(d, "c_dtype", "")) == "bf16"
    op = getattr(d, "op", None)
    if d.kind == "transform" or (op in EXACT and d.kind != "reduce" and getattr(d, "post", None) is None):
        return 0.0, 0.0
    if d.kind == "brgemm":
        if d.dtype == "i8":
            return 0.0, 0.0
        return (1e-2, 1e-2) if bf16_out else (2e-5, 2e-5 * d.k)
    if d.kind == "reduce":
        return (1e-2, 1e-2) if bf16_out or d.dtype == "bf16" else (1e-5, 1e-4 * max(d.m, d.n))
    if bf16_out:
        return 8e-3, 1e-6
    return (2e-5, 1e-4) if op in GRAD_OPS else (2e-5, 1e-6)


def run_all(cases, bits):
    run_calls([c.call() for c in cases], vl_bits=bits)
    for c in cases:
        rtol, atol = tolerance(c)
        for got, want in c.results():
            if got.dtype.kind in "iu":
                bad = np.flatnonzero(got != want)
            else:
                bad = close(got, want, rtol, atol)
            assert not bad.size, (f"VL {bits}: {c.desc}: {bad.size} elements differ, first at flat "
                                  f"{bad[0]}: got {got[bad[0]]!r}, expected {want[bad[0]]!r}")


@pytest.mark.parametrize("bits", vl_params(VLS))
@same_examples_at_every_vl
@settings(**SETTINGS)
@given(shape)
def test_unary(bits, s):
    m, n, pad, seed = s["m"], s["n"], s["pad"], s["seed"]
    cases = []
    for i, op in enumerate([*UNARY_OPS, *GRAD_OPS]):
        dt, out = DTYPES[i % len(DTYPES)]
        cases.append(DescCase(Unary(op, m, n, ldi=n + pad, ldo=n + (pad + 1) % 4, dtype=dt, out_dtype=out),
                              seed=seed + i))
    cases.append(DescCase(Unary("relu", m, n, ldi=n + pad, bitmask=True), seed=seed))
    cases.append(DescCase(Unary("relu_bwd", m, n, ldo=n + pad, bitmask=True, dtype="bf16"), seed=seed))
    run_all(cases, bits)


@pytest.mark.parametrize("bits", vl_params(VLS))
@same_examples_at_every_vl
@settings(**SETTINGS)
@given(shape, st.sampled_from([None, "row", "col", "scalar"]), st.sampled_from([None, "row", "col", "scalar"]))
def test_binary_ternary(bits, s, bcast_a, bcast_b):
    m, n, pad, seed = s["m"], s["n"], s["pad"], s["seed"]
    cases = []
    for i, op in enumerate(["add", "sub", "mul", "div", "max", "min"]):
        dt, out = DTYPES[i % len(DTYPES)]
        cases.append(DescCase(Binary(op, m, n, lda=n + pad, ldb=n, ldo=n + pad, dtype=dt, out_dtype=out,
                                     bcast_a=bcast_a, bcast_b=bcast_b), seed=seed + i))
    cases.append(DescCase(Binary("add", m, n, bcast_b=bcast_b or "row", post="gelu"), seed=seed))
    cases.append(DescCase(Binary("mul", m, n, dtype="bf16", bcast_a=bcast_a, post="sigmoid"), seed=seed))
    for i, (dt, out) in enumerate(DTYPES):
        cases.append(DescCase(Ternary("muladd", m, n, lda=n + pad, ldc=n + pad, dtype=dt, out_dtype=out,
                                      bcast_a=bcast_a, bcast_b=bcast_b), seed=seed + i))
    run_all(cases, bits)


@pytest.mark.parametrize("bits", vl_params(VLS))
@same_examples_at_every_vl
@settings(**SETTINGS)
@given(shape)
def test_reduce_transform(bits, s):
    m, n, pad, seed = s["m"], s["n"], s["pad"], s["seed"]
    cases = []
    for i, (op, over) in enumerate([(o, v) for o in ("add", "max", "sumsq") for v in ("rows", "cols")]):
        dt, out = DTYPES[i % len(DTYPES)]
        cases.append(DescCase(Reduce(op, m, n, over=over, ldi=n + pad, dtype=dt, out_dtype=out), seed=seed + i))
    for i, (op, dt) in enumerate([("transpose", "f32"), ("transpose", "bf16"), ("transpose", "i8"),
                                  ("transpose", "i64"), ("vnni2", "bf16"), ("vnni4", "i8"), ("unvnni2", "bf16"),
                                  ("unvnni4", "u8"), ("vnni4", "bf16"), ("unvnni2", "i32"),
                                  ("vnni2", "i64"), ("vnni4", "f32"), ("unvnni4", "i32")]):   # last 3: scalar code
        ldi = n + pad if op in ("transpose", "vnni2", "vnni4") else 0
        ldo = m + pad if op == "transpose" else n + pad if op.startswith("un") else 0
        cases.append(DescCase(Transform(op, m + 2, n, ldi=ldi if op != "transpose" else n + pad,
                                        ldo=ldo + 2 * (op == "transpose"), dtype=dt), seed=seed + i))
    run_all(cases, bits)


gemm_shape = st.fixed_dictionaries({
    "m": st.sampled_from([1, 3, 5, 7, 9, 13]), "n": st.sampled_from([1, 4, 13, 17, 33, 40]),
    "k": st.sampled_from([1, 2, 3, 5, 8, 9, 17, 32]), "count": st.integers(1, 3), "pad": st.integers(0, 2),
    "seed": st.integers(0, 2 ** 16)})


def _gemm_case(d, count, seed):
    flat = {"a": 3, "b": 3} if d.batch == "offset" else None
    a_spec, b_spec = d.block_specs()

    def fill(spec, v, rng):
        if spec.name == "offsets":
            ext = [1 + sum((x - 1) * st_ for x, st_ in zip(sp.shape, sp.strides)) for sp in (a_spec, b_spec)]
            v[...] = np.stack([rng.integers(0, 2 * e + 1, v.shape[0]) for e in ext], 1)
        elif spec.name == "b" and d.dtype == "bf16" and d.k % 2 and not isinstance(d, MmlaBrgemm):
            v[..., -1, :, 1] = np.nan          # padding of the last VNNI pair: never used
    return DescCase(d, seed=seed, count=count, fill=fill, flat=flat, scale=1.0)


@pytest.mark.parametrize("bits", vl_params(VLS))
@same_examples_at_every_vl
@settings(**SETTINGS)
@given(gemm_shape)
def test_brgemm(bits, s):
    m, n, k, count, pad, seed = (s[key] for key in ("m", "n", "k", "count", "pad", "seed"))
    cases, i = [], 0
    for dtype, c_dtypes in (("f32", ("f32",)), ("bf16", ("f32", "bf16")), ("i8", ("i32",))):
        for batch in ("stride", "offset"):
            for beta in (0, 1):
                for c_dtype in c_dtypes:
                    act = [None, "relu"][i % 2] if dtype == "i8" else \
                        [None, "relu", "gelu", "sigmoid", "tanh", "gelu_erf", "gelu_erf_fast"][i % 7]
                    bias = dtype != "i8" and i % 3 == 0
                    d = Brgemm(m=m, n=n, k=k, lda=k + pad, ldb=n + (i % 2) * pad, ldc=n + pad, beta=beta,
                               dtype=dtype, c_dtype=c_dtype, batch=batch, bias=bias, act=act)
                    cases.append(_gemm_case(d, count, seed + i))
                    i += 1
    for j, signs in enumerate(("ss", "uu")):            # sdot / udot beside the default usdot
        cases.append(_gemm_case(Brgemm(m=m, n=n, k=k, dtype="i8", signs=signs, beta=j), count, seed + i + j))
    cases.append(_gemm_case(MmlaBrgemm(m=m, n=n, k=k, dtype="bf16", beta=1), count, seed))
    cases.append(_gemm_case(MmlaBrgemm(m=m, n=n, k=k, dtype="i8", lda=k + pad), count, seed))
    for j, signs in enumerate(("ss", "uu")):            # smmla / ummla: B is i8 / u8 as the signs say
        cases.append(_gemm_case(MmlaBrgemm(m=m, n=n, k=k, dtype="i8", signs=signs), count, seed + j))
    run_all(cases, bits)


def test_mmla_int8_signs():
    assert [s.dtype for s in MmlaBrgemm(m=2, n=2, k=8, dtype="i8", signs="uu").block_specs()] == ["u8", "u8"]
    assert [s.dtype for s in MmlaBrgemm(m=2, n=2, k=8, dtype="i8", signs="us").block_specs()] == ["u8", "i8"]
    with pytest.raises(ValueError, match="signs='su' is not supported.*swap the roles of A and B"):
        MmlaBrgemm(m=2, n=2, k=8, dtype="i8", signs="su").validate()


@pytest.mark.parametrize("bits", vl_params(VLS))
@same_examples_at_every_vl
@settings(**SETTINGS)
@given(gemm_shape)
def test_brgemm_address_batch(bits, s):
    m, n, k, count, pad, seed = (s[key] for key in ("m", "n", "k", "count", "pad", "seed"))
    cases = []
    for i, (dtype, c_dtype) in enumerate([("f32", "f32"), ("bf16", "bf16"), ("bf16", "f32"), ("i8", "i32")]):
        d = Brgemm(m=m, n=n, k=k, lda=k + pad, ldc=n + pad, beta=i % 2, dtype=dtype, c_dtype=c_dtype,
                   batch="address", bias=dtype != "i8" and i % 2 == 0, act="tanh" if dtype == "bf16" else None)
        cases.append(AddressCase(d, seed=seed + i, count=count))
    run_all(cases, bits)


# -- accuracy of the transcendentals, x86's domains and metric (tests/tpp/test_math_accuracy.py)
BOUNDS = [("exp", (-87.3, 88.7)), ("sigmoid", (-87.0, 87.0)), ("tanh", (-10.0, 10.0)), ("gelu", (-3.0, 12.0)),
          ("gelu_erf", (-13.0, 12.0)), ("gelu_bwd", (-12.0, 12.0)), ("gelu_erf_bwd", (-12.0, 12.0)),
          ("reciprocal", (1e-37, 1e37)), ("rsqrt", (1e-37, 1e37)), ("sqrt", (0.0, 1e37))]
NAMES = {"gelu": "gelu_tanh", "gelu_bwd": "gelu_tanh_grad", "gelu_erf_bwd": "gelu_erf_grad"}
SAMPLES = 1 << 16


@needs_sve_runner(256)
def test_transcendental_accuracy():
    from isa.aarch64.emulate import Call
    calls, xs = [], []
    for op, (lo, hi) in BOUNDS:
        x = samples(op, lo, hi, SAMPLES)
        xs.append(x)
        k = Kernel(Unary(op, 1, SAMPLES), "sve")
        ins = [np.ones_like(x), x] if op in GRAD_OPS else [x]
        calls.append(Call(k.raw.code, ins, [np.full(SAMPLES, np.nan, np.float32)]))
    run_calls(calls, vl_bits=256)
    worst = {}
    for (op, _), x, call in zip(BOUNDS, xs, calls):
        err = ulp_errors(op, x, call.outputs[0])
        worst[op] = float(err.max())
        assert err.max() <= ACCURACY[NAMES.get(op, op)], f"{op}: {err.max():.1f} ulp at x={x[err.argmax()]!r}"


@needs_sve_runner(128)
def test_specials():
    from isa.aarch64.emulate import Call
    calls, wants = [], []
    for op, cases in SPECIALS.items():
        x = np.array([c[0] for c in cases] + [NAN], np.float32)
        wants.append(np.array([c[1] for c in cases] + [NAN], np.float32))
        k = Kernel(Unary(op, 1, x.size), "sve")
        ins = [np.ones_like(x)[None], x[None]] if op in GRAD_OPS else [x[None]]
        calls.append(Call(k.raw.code, ins, [np.full((1, x.size), 7.0, np.float32)]))
    run_calls(calls, vl_bits=128)
    for op, want, call in zip(SPECIALS, wants, calls):
        got = call.outputs[0][0]
        np.testing.assert_array_equal(got, want, err_msg=op)
        np.testing.assert_array_equal(np.signbit(got[want == 0]), np.signbit(want[want == 0]), err_msg=op)


@pytest.mark.parametrize("bits", vl_params(VLS))
def test_non_finite_inputs_follow_the_references(bits):
    """NaN, -NaN and infinities in random lanes (tails included): max/min, reduce max and add, the
    unary ops, BRGEMM epilogues, norms, rotary, SwiGLU and GemmNT (in A) give their references' NaNs
    and infinities (as tests/tpp/test_eltwise.py, test_brgemm.py and test_norm.py on x86)."""

    def fill(spec, v, rng):
        if spec.name != "dy":                          # (gradients: x only, as on x86)
            sprinkle(rng, v, 0.2)

    def sprinkle_all(spec, v, rng):
        if v.dtype.kind == "f":
            sprinkle(rng, v, 0.3)
    cases = [DescCase(Binary(op, 3, 37, dtype=dt, out_dtype=dt), seed=i, fill=fill)
             for i, (op, dt) in enumerate([("max", "f32"), ("min", "f32"), ("max", "bf16")])]
    cases += [DescCase(Reduce(op, 5, 21, over), seed=i, fill=fill)
              for i, (op, over) in enumerate([("max", "rows"), ("max", "cols"), ("add", "cols")])]
    cases += [DescCase(Unary(op, 3, 37), seed=i, fill=fill)
              for i, op in enumerate(sorted(o for o in UNARY_OPS if o != "zero"))]
    cases += [DescCase(Unary(op, 3, 37), seed=i, fill=fill) for i, op in enumerate(sorted(GRAD_OPS))]
    # relu_bwd of an inf or NaN dy where x <= 0: 0, as on x86 (dy * 0 gave NaN); of a NaN x: dy, and
    # the bitmask relu sets a NaN's bit (as torch)
    cases += [DescCase(Unary(op, 3, 37, bitmask=bitmask), seed=9, fill=sprinkle_all)
              for op in ("relu_bwd", "relu") for bitmask in (False, True)]
    cases += [DescCase(Brgemm(m=5, n=19, k=7, dtype=dt, act=act, bias=True), seed=i,
                       fill=lambda spec, v, rng: sprinkle(rng, v, 0.05) if spec.name == "a" else None)
              for i, (dt, act) in enumerate([("f32", "relu"), ("f32", "gelu"), ("bf16", "gelu_erf"), ("f32", "tanh")])]
    rare = lambda spec, v, rng: sprinkle(rng, v, 0.03) if spec.name in ("x", "gate", "up") else None  # noqa: E731
    cases += [DescCase(d, seed=i, fill=rare) for i, d in enumerate([
        Softmax(3, 37, mask="row"), Softmax(4, 70, dtype="bf16", out_dtype="bf16"), LayerNorm(3, 37),
        RMSNorm(3, 37, dtype="bf16"), Rotary(3, 32, 16), SwiGLU(3, 37)])]
    cases += [DescCase(GemmNT(5, 11, 37, dtype=dt, c_dtype=cdt), seed=i,
                       fill=lambda spec, v, rng: sprinkle(rng, v, 0.02) if spec.name == "a" else None)
              for i, (dt, cdt) in enumerate([("f32", "f32"), ("bf16", "f32"), ("bf16", "bf16")])]
    run_calls([c.call() for c in cases], vl_bits=bits)
    for c in cases:
        for got, want in c.results():
            assert_same_non_finite(got, want, f"VL {bits}: {c.desc}")


def test_kernel_on_foreign_host_explains():
    import platform
    if platform.machine() in ("aarch64", "arm64"):
        pytest.skip("native AArch64 host: the kernel is callable")
    k = Kernel(Unary("relu", 1, 4), "sve")
    assert k.raw.address is None and "fmax" in k.disassemble()
    with pytest.raises(RuntimeError, match="emulator"):
        k(np.zeros((1, 4), np.float32), np.zeros((1, 4), np.float32))


def test_native_call_on_sve_host():
    """On an SVE host the same kernels run natively through Kernel.__call__ (the Python-checked
    path: the x86 entry stub does not exist there)."""
    from isa.cpu import host
    if "sve" not in host().levels:
        pytest.skip(f"host has no SVE ({host().arch}); kernels run under qemu above")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 37)).astype(np.float32)
    out = np.full_like(x, np.nan)
    Kernel(Unary("gelu", 3, 37), "sve")(x, out)
    want = np.empty_like(x)
    Unary("gelu", 3, 37).reference(x, want)
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-7)
    d = Brgemm(m=5, n=19, k=7, dtype="bf16", c_dtype="bf16", bias=True, act="relu")
    k = Kernel(d, "sve")
    a = rng.standard_normal((2, 5, 7)).astype(np.float32).astype(k.operands[0].np_dtype)
    b = rng.standard_normal((2, 4, 19, 2)).astype(np.float32).astype(k.operands[1].np_dtype)
    c, bias = np.zeros((5, 19), a.dtype), rng.standard_normal(19).astype(np.float32)
    k(a, b, c, bias, count=2)
    want = c.copy()
    d.reference(a, b, want, bias, count=2)
    np.testing.assert_allclose(c.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2)


def test_sve_has_every_kind_of_the_x86_backend():
    """A TPP added for x86 only would leave models that use it unable to run on AArch64."""
    from tppasm import backends
    kinds = {fam: {k for f, k in backends.registered()          # not those a docstring example adds
                   if f == fam and backends._GENERATORS[f, k].__module__.startswith(f"tppasm.{fam}.")}
             for fam in ("x86", "sve")}
    assert kinds["x86"] - kinds["sve"] == {"amx_tileconfig", "amx_tilerelease"}
