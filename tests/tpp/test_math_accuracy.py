"""Accuracy of the vectorized transcendentals (tppasm.x86.math) on dense samples, through the
unary TPPs: error in fp32 ulps against NumPy's float64 result rounded to fp32, and the
documented special values. AVX2 runs 2^20 samples per domain natively; AVX-512 (interpreter)
a sparser grid over the same domains."""
import math

import numpy as np
import pytest

import tppasm
from tppasm.eltwise import GRAD_OPS, UNARY_OPS
from tppasm.kernel import get_kernel
from tppasm.eltwise import Unary
from tests.support import INF, NAN, SPECIALS, isa_params, native, run_raw, samples, ulp_errors

# op, domain, max ulps (bwd ops: ulps of max(|ref|, 1), i.e. absolute error in units of 2^-23)
BOUNDS = [
    ("exp", (-87.3, 88.7), 2),
    ("sigmoid", (-87.0, 87.0), 3),
    ("tanh", (-10.0, 10.0), 3),
    ("gelu", (-3.0, 12.0), 16),          # tanh form: ill-conditioned for x << 0 (see below)
    ("gelu_erf", (-13.0, 12.0), 6),
    ("gelu_bwd", (-12.0, 12.0), 4),
    ("gelu_erf_bwd", (-12.0, 12.0), 4),
    ("reciprocal", (1e-37, 1e37), 2),
    ("rsqrt", (1e-37, 1e37), 2),
    ("sqrt", (0.0, 1e37), 0),
]


def run(op, x, isa):
    """op applied to 1-D x (bwd ops with dy = 1)."""
    k = get_kernel(Unary(op, 1, x.size), isa)
    y = np.full((1, x.size), np.nan, np.float32)
    args = ((np.ones_like(x)[None], x[None], y) if op in GRAD_OPS else (x[None], y))
    if native(isa):
        k(*args)
    else:
        run_raw(k, args, isa=isa)
    return y[0]


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("op, domain, bound", BOUNDS, ids=[b[0] for b in BOUNDS])
def test_max_ulp_error(isa, op, domain, bound):
    x = samples(op, *domain, 1 << 20 if native(isa) else 1 << 11)
    err = ulp_errors(op, x, run(op, x, isa))
    worst = int(np.argmax(err))
    assert err[worst] <= bound, f"{op}: {err[worst]:.1f} ulp at x={x[worst]!r}"


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("op", ["reciprocal", "rsqrt"])
def test_denormal_inputs(isa, op):
    """Denormal x (AVX2's vrcpps and vrsqrtps take them as 0 and gave inf): within the bound, NaN
    for a negative x of rsqrt, and inf where the result overflows, as the reference."""
    tiny = np.float32(np.finfo(np.float32).tiny)
    x = np.concatenate([np.geomspace(1.4e-45, tiny, 200), [tiny * 0.5, 1.4e-45]]).astype(np.float32)
    x = np.concatenate([x, -x])
    got = run(op, x, isa)
    with np.errstate(all="ignore"):
        want = UNARY_OPS[op](x.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])
    finite = np.isfinite(want)
    err = ulp_errors(op, x[finite], got[finite])
    assert err.max() <= 2, f"{op}: {err.max():.1f} ulp at x={x[finite][np.argmax(err)]!r}"


def test_gelu_tanh_error_follows_conditioning():
    """For x << 0 the tanh-form gelu has condition number |x f'/f| ~ 2u'(x) x (up to ~300 at
    x=-10): rounding u costs that many ulps in any fp32 evaluation. Error / max(1, cond) stays small."""
    x = np.linspace(-10.0, 12.0, 1 << 20, dtype=np.float32)
    x = x[x != 0]
    err = ulp_errors("gelu", x, run("gelu", x, "avx2" if native("avx2") else "avx512"))
    f, x64 = UNARY_OPS["gelu"], x.astype(np.float64)
    cond = np.abs((f(x64 * (1 + 1e-7)) - f(x64)) / 1e-7 / f(x64))
    assert (err / np.maximum(1.0, cond)).max() <= 4


@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("op", sorted(SPECIALS))
def test_specials(isa, op):
    cases = SPECIALS[op]
    x = np.array([c[0] for c in cases] + [NAN], np.float32)
    want = np.array([c[1] for c in cases] + [NAN], np.float32)
    got = run(op, x, isa)
    np.testing.assert_array_equal(got, want)             # NaN == NaN here
    np.testing.assert_array_equal(np.signbit(got[want == 0]), np.signbit(want[want == 0]))


def test_accuracy_table_matches_bounds():
    """The table documented in tppasm.x86.math agrees with what this file enforces."""
    from tppasm.x86 import math as xm
    names = {"gelu": "gelu_tanh", "gelu_bwd": "gelu_tanh_grad", "gelu_erf_bwd": "gelu_erf_grad"}
    for op, _, bound in BOUNDS:
        name = names.get(op, op)
        if name in xm.ACCURACY:
            assert xm.ACCURACY[name] == bound, name
    assert tppasm.unary("exp", 1, 1).desc.op == "exp"


def _emitter_loop(name, isa, table_regs=0):
    """A JIT'd ``y[i] = emit_<name>(x[i])`` over n floats (n a multiple of the vector width);
    ``table_regs``: registers for the constants (lane tables first), beside the emitter's."""
    from isa.x86 import Function, rax
    from tppasm.x86 import math as xm
    from tppasm.x86.vector import VectorISA
    v = VectorISA(isa)
    fn = Function("emitter_" + name, ["ptr", "ptr", "i64"])
    a, (x, y, n) = fn.asm, fn.args
    regs = [v.reg(i) for i in range(2 + xm.NTMP[name])]
    c = xm.Consts(v, [v.reg(len(regs) + i) for i in range(table_regs)])
    for values in xm.lane_tables(name, v):
        c.lanes(values)
    a.xor(rax, rax)
    top = a.label()
    a.bind(top)
    a.vmovups(regs[0], [x + rax * 4])
    xm.EMITTERS[name](a, v, regs[1], regs[0], regs[2:], c)
    a.vmovups([y + rax * 4], regs[1])
    a.add(rax, v.lanes(4))
    a.cmp(rax, n)
    a.jb(top)
    c.finish(fn)
    return fn.finalize()


@pytest.mark.parametrize("isa", [i for i in ("avx2", "avx512") if native(i)])
def test_gelu_erf_for_bf16_results(isa):
    """The cheaper gelu_erf of BRGEMM epilogues with a bf16 C: relative error within
    ACCURACY_BF16 (2^-16, against bf16's 2^-9 rounding) on [-13, 12] where the result is a
    normal number, and gelu_erf's special values."""
    from tppasm.x86 import math as xm
    f = _emitter_loop("gelu_erf_bf16", isa)
    x = np.concatenate([samples("gelu_erf", -13.0, 12.0, 1 << 20),
                        np.array([c[0] for c in SPECIALS["gelu_erf"]] + [NAN] * 12, np.float32)])
    assert x.size % 16 == 0
    y = np.full_like(x, np.nan)
    f(x.ctypes.data, y.ctypes.data, x.size)
    want = UNARY_OPS["gelu_erf"](x[:1 << 20].astype(np.float64))
    normal = np.abs(want) >= np.finfo(np.float32).tiny
    rel = np.abs(y[:1 << 20][normal] - want[normal]) / np.abs(want[normal])
    assert rel.max() <= xm.ACCURACY_BF16["gelu_erf_bf16"], f"{rel.max():.3g} at x={x[:1 << 20][normal][rel.argmax()]}"
    specials = y[1 << 20:(1 << 20) + len(SPECIALS["gelu_erf"])]
    np.testing.assert_array_equal(specials, [c[1] for c in SPECIALS["gelu_erf"]])
    assert np.signbit(specials[1]) and np.isnan(y[-1])


@pytest.mark.parametrize("isa", [i for i in ("avx2", "avx512") if native(i)])
@pytest.mark.parametrize("tables", ["stack", "registers"])
def test_gelu_erf_fast_absolute_error(isa, tables):
    """gelu_erf_fast (BRGEMM epilogues' table form): |error| <= ACCURACY_ABS * max(1, |x|) on
    dense samples of [-14, 13] and near 0, with its tables on the stack or in registers; +inf
    gives inf, -inf and the far left 0, a NaN stays NaN."""
    from tppasm.x86 import math as xm
    from tppasm.x86.vector import VectorISA
    regs = len(xm.lane_tables("gelu_erf_fast", VectorISA(isa))) if tables == "registers" else 0
    f = _emitter_loop("gelu_erf_fast", isa, table_regs=regs)
    x = np.concatenate([np.linspace(-14.0, 13.0, 1 << 20, dtype=np.float32),
                        np.linspace(-1e-3, 1e-3, 1 << 12, dtype=np.float32),
                        np.array([INF, -INF, NAN, 0.0, -20.0, 1e30, -1e30, 6.0] * 2, np.float32)])
    assert x.size % 16 == 0
    y = np.full_like(x, np.nan)
    f(x.ctypes.data, y.ctypes.data, x.size)
    dense = x.size - 16
    x64 = x[:dense].astype(np.float64)
    err = np.abs(y[:dense] - UNARY_OPS["gelu_erf"](x64)) / np.maximum(1.0, np.abs(x64))
    assert err.max() <= xm.ACCURACY_ABS["gelu_erf_fast"], f"{err.max():.3g} at x={x[err.argmax()]}"
    specials = np.array([INF, 0.0, NAN, 0.0, 0.0, 1e30, 0.0, 6.0 * _phi(6.0)], np.float32)
    np.testing.assert_array_equal(y[dense:dense + 8], specials)


def _phi(x):
    return np.float32(0.5 * (1 + math.erf(x / math.sqrt(2))))


@pytest.mark.parametrize("isa", [i for i in ("avx2", "avx512") if native(i)])
def test_exp_for_bf16_results(isa):
    """The cheaper exp of softmaxes with a bf16 output: relative error within ACCURACY_BF16 on
    the normal results of [-87.3, 88.7], and exp's special values."""
    from tppasm.x86 import math as xm
    f = _emitter_loop("exp_bf16", isa)
    x = np.concatenate([samples("exp", -87.3, 88.7, 1 << 20),
                        np.array([c[0] for c in SPECIALS["exp"]] + [NAN] * 16, np.float32)])
    x = x[:x.size // 16 * 16]
    y = np.full_like(x, np.nan)
    f(x.ctypes.data, y.ctypes.data, x.size)
    want = np.exp(x[:1 << 20].astype(np.float64))
    rel = np.abs(y[:1 << 20] - want) / want
    assert rel.max() <= xm.ACCURACY_BF16["exp_bf16"], f"{rel.max():.3g} at x={x[rel.argmax()]}"
    specials = y[1 << 20:(1 << 20) + len(SPECIALS["exp"])]
    np.testing.assert_array_equal(specials, [c[1] for c in SPECIALS["exp"]])
    assert np.isnan(y[-1])
