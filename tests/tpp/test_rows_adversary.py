"""An adversarial pass over the row-wise TPPs (softmax, layer norm, RMSNorm, SwiGLU, rotary, quantize,
dequant) on x86: every operand laid against an inaccessible page (natively; in the interpreter, buffers
of exactly the operand's extent), outputs poisoned with a NaN payload no kernel writes, gaps between rows
checked untouched, every tail width, 4 KiB-aliased and huge row strides, in-place calls; special values
(fully masked rows, +-inf, NaN, 1e38, denormals, masks of -inf and large finite negatives, constant rows,
eps at its limits, the sigmoid's overflow edge, quantization's clamp edges) against the float64
references and the docstrings' contracts; native and interpreted runs of the same code bit for bit
(the AMX level runs the AVX-512 code); refusals that name the fix.

The tests at the end pin where fp32 arithmetic (the kernels', as documented) and float64 math part
ways: the references round as the kernels do, and the norms' overflow is a documented limit."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tppasm
from tppasm.dtypes import dtype as D
from tppasm.glu import SwiGLU
from tppasm.kernel import get_kernel
from tppasm.norm import LayerNorm, RMSNorm, Softmax
from tppasm.quant import Dequant, Quantize, zero_point
from tppasm.rotary import Rotary, rope_tables
from tppasm.x86.norm import CACHED, KEPT_MAX
from tests.support import assert_same_non_finite, interp_available, native, run_raw
from tests.tpp.test_norm import assert_close
from tests.tpp.test_transform_tails import _guarded

F32 = np.finfo(np.float32)
INF, NAN = np.inf, np.nan
FLOAT_PAIRS = [("f32", "f32"), ("bf16", "bf16"), ("f32", "bf16"), ("bf16", "f32")]
POISON = {"f32": np.uint32(0x7FC5A5A5), "bf16": np.uint16(0x7FC5), "u8": np.uint8(0), "i32": np.uint32(0x5A5A5A5A)}
BITS = {"f32": np.uint32, "bf16": np.uint16, "u8": np.uint8, "i32": np.uint32}


# (isa, interpreted): the levels this host runs natively, and every x86 level in the interpreter
MODES = [pytest.param((isa, False), id=isa) for isa in ("avx2", "avx512") if native(isa)] + \
    [pytest.param((isa, True), id=f"{isa}-interp", marks=() if interp_available() else
                  pytest.mark.skip(reason="no interpreter")) for isa in ("avx2", "avx512", "amx")]
NATIVE = [pytest.param(isa, id=isa) for isa in ("avx2", "avx512") if native(isa)] or \
    [pytest.param("avx2", id="avx2", marks=pytest.mark.skip(reason="host runs no x86 vector level natively"))]


# -- descriptors and operands -------------------------------------------------------------------------
KINDS = ["softmax", "softmax-row", "softmax-full", "layernorm", "rmsnorm", "swiglu", "rotary", "quantize",
         "quantize7", "dequant", "dequant-beta"]


def describe(kind, m, n, dts, pads, scale=1.0):
    """The descriptor of ``kind`` for (m, n) (rotary: n a multiple of its head_dim), row strides n + pads."""
    dt, odt = dts
    ldx, ldo, ld2 = n + pads[0], n + pads[1], n + pads[2]
    if kind.startswith("softmax"):
        mask = {"softmax": None, "softmax-row": "row", "softmax-full": "full"}[kind]
        return Softmax(m, n, ldx, ldo, dt, odt, scale, mask, ld2 if mask == "full" else 0)
    if kind == "layernorm":
        return LayerNorm(m, n, ldx, ldo, dt, odt, eps=1e-5)
    if kind == "rmsnorm":
        return RMSNorm(m, n, ldx, ldo, dt, odt, eps=1e-6)
    if kind == "swiglu":
        return SwiGLU(m, n, ldx, ld2, ldo, dt, odt)
    if kind == "rotary":
        head = rotary_head(n)
        return Rotary(m, n, head, ldx, ldo, head // 2 + pads[2], dt, odt)
    if kind.startswith("quantize"):
        return Quantize(m, n, ldx, ldo, dt, 7 if kind == "quantize7" else 8)
    return Dequant(m, n, ldx, ldo, odt, int(kind == "dequant-beta"))


def rotary_head(n):
    """A head_dim for a rotary row of n (n even): the largest even divisor up to 64 (several heads past it)."""
    return max(d for d in range(2, min(n, 64) + 1, 2) if n % d == 0)


def fill(spec, arr, rng):
    """Inputs drawn for the operand ``spec`` names (outputs are left as poisoned)."""
    shape = arr.shape
    if spec.name == "mask":
        rows = np.where(rng.random(shape) < 0.4, rng.choice([-INF, -1e30, -F32.max], shape), 0.0)
        rows = np.atleast_2d(rows)
        rows[np.arange(rows.shape[0]), rng.integers(shape[-1], size=rows.shape[0])] = 0.0   # one column kept
        arr[...] = rows.reshape(shape)
    elif spec.name in ("cos", "sin"):
        cos, sin = rope_tables(rng.integers(0, 1 << 20, shape[0]), 2 * shape[1])
        arr[...] = cos if spec.name == "cos" else sin
    elif spec.name in ("row_scale", "col_scale"):
        arr[...] = rng.random(shape).astype(np.float32) + 0.01
    elif spec.name == "c":
        arr[...] = rng.integers(-2 ** 20, 2 ** 20, shape)
    elif spec.name == "offset":
        arr[...] = rng.integers(-2 ** 16, 2 ** 16, shape)
    else:
        arr[...] = (rng.standard_normal(shape) * 3).astype(np.float32).astype(arr.dtype)


def view(flat, spec):
    """The operand ``spec`` over ``flat`` (its exact extent): rows as far apart as the kernel expects."""
    es = flat.itemsize
    return np.ndarray(spec.shape, flat.dtype, buffer=flat, strides=tuple(s * es for s in spec.strides))


def operands(desc, rng, guarded, ends):
    """(flat buffers, views): each operand in a buffer of its exact extent, poisoned, inputs filled;
    ``guarded``: against an inaccessible page, at the buffer's end where ``ends[i]`` else at its start."""
    flats, views = [], []
    for i, spec in enumerate(desc.operands()):
        count = spec.nbytes() // spec.np_dtype.itemsize
        flat = _guarded(count, spec.dtype, ends[i % len(ends)]) if guarded else np.empty(count, spec.np_dtype)
        flat.view(BITS[spec.dtype])[...] = POISON[spec.dtype]
        v = view(flat, spec)
        if not spec.writable or spec.name not in desc.allocated():      # inputs, and dequant's out with beta=1
            fill(spec, v, rng)
        flats.append(flat)
        views.append(v)
    return flats, views


def reference(desc, views):
    want = [np.array(v) for v in views]
    with np.errstate(all="ignore"):
        desc.reference(*want)
    return want


def check_outputs(desc, got, want):
    """Outputs against the reference: quantize bit for bit, the rest within fp32 (or one bf16 rounding)."""
    for spec, g, w in zip(desc.operands(), got, want):
        if not spec.writable:
            continue
        if desc.kind == "quantize":
            np.testing.assert_array_equal(g, w, err_msg=spec.name)
        else:
            scale = 1.0 if desc.kind == "softmax" else float(np.abs(w.astype(np.float64)).max()) + 1
            assert_close(g, w, spec.dtype, scale)


def gaps(flat, spec):
    """The elements of ``flat`` that the operand ``spec`` over it does not cover."""
    outside = np.ones(flat.shape, bool)
    view(outside, spec)[...] = False
    return outside


def run_case(desc, mode, rng, guarded=True, ends=(True, False)):
    """Run ``desc`` on fresh operands in ``mode``; check the outputs, that each was written whole, and that
    nothing outside the outputs' elements (nor any input) changed. Returns (views, want)."""
    isa, interp = mode
    k = get_kernel(desc, isa)
    flats, views = operands(desc, rng, guarded and native(isa) and not interp, ends)
    before = [f.copy() for f in flats]
    want = reference(desc, views)
    run_raw(k, views, isa=isa, interpret=interp)
    check_outputs(desc, views, want)
    for spec, flat, old, v in zip(desc.operands(), flats, before, views):
        if spec.writable:
            # written: the bits differ from the poison (a NaN payload no kernel makes; u8: 0, no finite row's code)
            unwritten = (v.view(BITS[spec.dtype]) == POISON[spec.dtype]).sum()
            assert not unwritten, f"{spec.name}: {unwritten} elements unwritten"
            outside = gaps(flat, spec)
            assert (flat.view(BITS[spec.dtype])[outside] == old.view(BITS[spec.dtype])[outside]).all(), \
                f"{spec.name}: the kernel wrote between rows"
        else:
            assert (flat.view(BITS[spec.dtype]) == old.view(BITS[spec.dtype])).all(), f"input {spec.name} changed"
    return views, want


# -- operands against guard pages, every output element written, nothing else touched ---------------
def _n(mode):
    if mode[1] or not native(mode[0]):
        return st.one_of(st.integers(1, 40), st.sampled_from([63, 64, 65, 129]))
    return st.one_of(st.integers(1, 70), st.integers(90, 600), st.sampled_from([1024, 2047, 2048, 2049, 4096, 4100]))


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=100, deadline=None)
@given(kind=st.sampled_from(KINDS), dts=st.sampled_from(FLOAT_PAIRS), data=st.data(), seed=st.integers(0, 2 ** 16),
       pads=st.tuples(st.integers(0, 9), st.integers(0, 9), st.integers(0, 9)),
       ends=st.tuples(st.booleans(), st.booleans()), scale=st.sampled_from([1.0, 0.125, -2.0, 0.0]))
def test_operands_against_guard_pages(mode, kind, dts, data, seed, pads, ends, scale):
    """Every kind, dtype pair, tail and row stride: outputs equal the float64 reference, every element is
    written, nothing between rows changes, inputs stay as they were, and no byte past an operand's first or
    last element is touched (natively: an inaccessible page there; interpreted: nothing else is mapped)."""
    m = data.draw(st.integers(1, 3 if mode[1] else 5), "m")
    n = data.draw(_n(mode), "n")
    if kind == "rotary":
        n = 2 * max(1, n // 2)
    run_case(describe(kind, m, n, dts, pads, scale), mode, np.random.default_rng(seed), ends=ends)


TAIL_NS = sorted(set(range(1, 34)) | {47, 48, 49, 63, 64, 65, 66, 383, 384, 385, 386, 2047, 2048, 2049, 4096, 4097})


@pytest.mark.parametrize("isa", NATIVE)
@pytest.mark.parametrize("kind", KINDS)
def test_every_tail_width_and_path(isa, kind):
    """Every tail width on either ISA (1-33 columns), both sides of the softmax's in-register limit
    (CACHED vectors: 64 / 384 floats), of its bf16 stack row (KEPT_MAX) and long rows; m = 1, 2 and 3 (a
    single row, one pair of interleaved rows, a pair and an odd row)."""
    assert CACHED == {True: 24, False: 8} and KEPT_MAX == 2048       # the limits the sizes above straddle
    rng = np.random.default_rng(len(kind))
    for i, n in enumerate(TAIL_NS):
        n = 2 * max(1, n // 2) if kind == "rotary" else n
        m = 1 + i % 3
        run_case(describe(kind, m, n, FLOAT_PAIRS[i % 4], (i % 3, (i + 1) % 4, i % 2)), (isa, False), rng)


@pytest.mark.parametrize("isa", NATIVE)
@pytest.mark.parametrize("kind", KINDS)
def test_4k_aliased_and_huge_row_strides(isa, kind):
    """Row strides of exactly 4 KiB (and 8 KiB: every row of x, out and the mask on the same cache sets)
    and a single row with a row stride of 2^28 elements (only the first row exists)."""
    rng = np.random.default_rng(1)
    for dts in FLOAT_PAIRS[:2]:
        es = D(dts[0]).itemsize
        for ld in (4096 // es, 8192 // es):
            for n in (ld // 8 + 3, ld - 5, ld):
                n = 2 * (n // 2) if kind == "rotary" else n
                run_case(describe(kind, 9, n, dts, (ld - n, ld - n, ld - n)), (isa, False), rng)
    run_case(describe(kind, 1, 100, ("f32", "f32"), (2 ** 28, 2 ** 28, 2 ** 28)), (isa, False), rng, guarded=False)


# -- native and interpreted runs agree bit for bit, special values included ----------------------------
SPECIALS = np.float32([INF, -INF, NAN, -NAN, 0.0, -0.0, F32.max, -F32.max, 1e38, -3e38, 1e-45, -1e-40,
                       F32.tiny, 1e-30, 88.7, -88.8, 104.0, -104.0, 1e30, 2e19, -2e19])


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@settings(max_examples=100, deadline=None)
@given(kind=st.sampled_from(KINDS), dts=st.sampled_from(FLOAT_PAIRS), m=st.integers(1, 4),
       n=st.one_of(st.integers(1, 40), st.sampled_from([64, 65, 100, 385])), rate=st.sampled_from([0.05, 0.3, 1.0]),
       seed=st.integers(0, 2 ** 16))
def test_native_and_interpreter_agree_bit_for_bit(isa, kind, dts, m, n, rate, seed):
    """The same code, natively and in the interpreter (and, for AVX-512, at the AMX level, which takes the
    AVX-512 code), gives the same bits on rows full of infinities, NaNs, fp32's extremes and denormals."""
    if not interp_available():
        pytest.skip("no interpreter")
    n = 2 * max(1, n // 2) if kind == "rotary" else n
    desc = describe(kind, m, n, dts, (3, 1, 2), scale=0.5)
    rng = np.random.default_rng(seed)
    _, views = operands(desc, rng, False, (True,))
    for spec, v in zip(desc.operands(), views):
        if not spec.writable and spec.dtype in ("f32", "bf16") and spec.name not in ("cos", "sin", "mask"):
            hit = rng.random(v.shape) < rate
            v[hit] = rng.choice(SPECIALS, hit.sum()).astype(v.dtype)
    runs = [(isa, not native(isa))] + [(isa, True)] * native(isa) + [("amx", True)] * (isa == "avx512")
    results = []
    for level, interp in runs:
        args = [np.array(v.base, copy=True) for v in views]
        args = [view(a, spec) for a, spec in zip(args, desc.operands())]
        run_raw(get_kernel(desc, level), args, isa=level, interpret=interp)
        results.append([a.view(BITS[s.dtype]) for a, s in zip(args, desc.operands()) if s.writable])
    for other, (level, interp) in zip(results[1:], runs[1:]):
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b, err_msg=f"{desc.kind} {level} interpreted={interp}")


# -- special values against the contracts ---------------------------------------------------------------
SOFTMAX_NS = [5, 37, 64, 65, 384, 385, 2100]        # in registers on both ISAs, on AVX-512 only, in passes


def softmax_rows(n):
    """Rows of n logits: fully masked, a single +inf, a NaN, +-3e38 and FLT_MAX beside lesser values, huge
    equal values, denormals, a single survivor among -inf, a spread down to -80."""
    hot = np.arange(n) == n // 2
    return np.float32([np.full(n, -INF), np.r_[INF, np.zeros(n - 1)], np.r_[np.zeros(n - 1), NAN],
                       np.where(hot, 3e38, -3e38), np.where(hot, F32.max, 0.0), np.where(hot, 0.0, -F32.max),
                       np.full(n, 1e38), np.full(n, -3e38), np.where(np.arange(n) % 2, 1e-45, -1e-40),
                       np.where(hot, 0.0, -INF), np.linspace(-80.0, 0.0, n)])


def softmax_of(row):
    """The docstring's softmax of a row (float64), None where it is NaN: no finite value after masking (and,
    as the reference, a +inf or a NaN logit)."""
    if np.isnan(row).any() or (row == INF).any() or not np.isfinite(row).any():
        return None
    e = np.exp(row - row.max())
    return e / e.sum()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dts", FLOAT_PAIRS, ids="-".join)
def test_softmax_special_rows_follow_the_docstring(mode, dts):
    """Fully masked, +inf and NaN rows are NaN; huge, equal and denormal logits are fine; each row's
    outcome is its own (rows go two at a time in registers: a NaN row must not leak into its partner)."""
    isa, interp = mode
    for n in SOFTMAX_NS[:4] if interp else SOFTMAX_NS:
        x = softmax_rows(n).astype(D(dts[0]))
        want = [softmax_of(row) for row in x.astype(np.float64)]
        m = len(want)
        for order in (np.arange(m), np.arange(m)[::-1]):
            out = np.full((m, n), 7.0, np.float32).astype(D(dts[1]))
            k = get_kernel(Softmax(m, n, dtype=dts[0], out_dtype=dts[1]), isa)
            run_raw(k, (x[order], out), isa=isa, interpret=interp)
            for got, i in zip(out.astype(np.float64), order):
                if want[i] is None:
                    assert np.isnan(got).all(), f"row {i} (n={n}) should be NaN: {got[:4]}"
                else:       # to a few fp32 ulps (one bf16 rounding) down to 2^-125, absolutely below
                    ulps = 2.0 ** -8 if dts[1] == "bf16" else 4 * 2.0 ** -23
                    tol = ulps * want[i] + 2.0 ** -125
                    assert (np.abs(got - want[i]) <= tol).all(), f"row {i} (n={n}): {got[:4]} want {want[i][:4]}"


@pytest.mark.parametrize("isa", NATIVE)
@pytest.mark.parametrize("n", [3, 64, 300, 2100])
@pytest.mark.parametrize("masked", ["row", "full"])
def test_softmax_masks_and_scales(isa, n, masked):
    """Masks of -inf, -1e30 and -FLT_MAX give masked columns exactly 0; a row masked everywhere by a large
    finite negative is uniform (as the reference: x + mask rounds to the same value); a row masked everywhere
    by -inf is NaN. Scales 0, -1, 1e-40 (denormal), 3e38 on moderate logits, against the reference."""
    rng = np.random.default_rng(n)
    m = 6
    for scale in (0.0, -1.0, 1e-40, 0.125, 3e38):
        x = np.float32(rng.uniform(-1, 1, (m, n)) if scale == 3e38 else rng.standard_normal((m, n)) * 4)
        dropped_at = -INF if scale == 3e38 else -1e29
        negatives = np.float32([-INF, -1e30, -F32.max])[rng.integers(3, size=(m, n))]
        mask = np.where(rng.random((m, n)) < 0.5, negatives, np.float32(0.0))
        mask[:, 0] = 0.0
        if masked == "full":
            mask[1], mask[2] = -1e30, -INF                       # masked everywhere: by a finite value, by -inf
        else:
            mask = mask[0]
        k = get_kernel(Softmax(m, n, scale=scale, mask=masked), isa)
        out = np.full((m, n), 7.0, np.float32)
        run_raw(k, (x, mask, out), isa=isa)
        want = reference(k.desc, [x, mask, out.copy()])[-1]
        assert_same_non_finite(out, want, f"scale={scale}")
        fin = np.isfinite(want)
        assert (np.abs(out[fin] - want[fin]) <= 4e-6).all(), f"scale={scale}"
        dropped = np.broadcast_to(mask, (m, n)) <= dropped_at        # (3e38 - 1e30 may stay the maximum)
        rows = [0, 3, 4, 5] if masked == "full" else range(m)
        assert (out[rows][dropped[rows]] == 0).all(), f"scale={scale}: a masked column got weight"
        if masked == "full":
            assert np.isnan(out[2]).all() and (scale == 3e38 or np.allclose(out[1], 1.0 / n, rtol=1e-6))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dts", FLOAT_PAIRS, ids="-".join)
def test_norms_of_constant_tiny_and_eps_extreme_rows(mode, dts):
    """Constant rows (any magnitude fp32's sum of squares holds): layer norm gives beta, RMSNorm
    c / sqrt(c^2 + eps) * gamma; rows of 1e-30 and eps at fp32's smallest normal or 1e30 follow the
    reference; a zero row with the smallest eps stays 0."""
    isa, interp = mode
    dt, odt = dts
    for n in (1, 9, 70) if interp else (1, 9, 70, 385, 4100):
        rng = np.random.default_rng(n)
        g, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        rows = np.float32([[c] * n for c in (3.0, -7.5, 1e15, -1e17, 1e-30, 0.0, 1e-20)])
        rows[6] = rng.standard_normal(n) * 1e-20            # squares under 2^-126: fp32 denormals
        x = rows.astype(D(dt))
        m = len(rows)
        for eps in (1e-5, float(F32.tiny), 1e30):
            for desc, args in ((LayerNorm(m, n, dtype=dt, out_dtype=odt, eps=eps), (g, b)),
                               (RMSNorm(m, n, dtype=dt, out_dtype=odt, eps=eps), (g,))):
                out = np.full((m, n), NAN, np.float32).astype(D(odt))
                run_raw(get_kernel(desc, isa), (x, *args, out), isa=isa, interpret=interp)
                want = reference(desc, [x, *args, out.copy()])[-1].astype(np.float64)
                got = out.astype(np.float64)
                if desc.kind == "layernorm":
                    assert (got[:6] == b.astype(D(odt)).astype(np.float64)).all(), f"eps={eps}: constant rows"
                rel = 2.0 ** -7 if odt == "bf16" else 2.0 ** -17     # of the row's largest output (fp32 sums of 4100)
                bad = np.abs(got - want) > rel * (np.abs(want).max(axis=1, keepdims=True) + 1e-37)
                assert not bad.any(), (desc.kind, eps, np.argwhere(bad)[:3], got[bad][:3], want[bad][:3])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dts", FLOAT_PAIRS, ids="-".join)
def test_swiglu_at_the_sigmoid_overflow_edge(mode, dts):
    """Gates every fp32 step across -88.7228 (where exp(-g) overflows), far left and right, infinities
    and NaN, times up = 1, -3, 0, +-inf: non-finite where the reference is, and the sign of the docstring's
    zeros (silu(g) = -0.0 left of the edge: -0.0 * 1 = -0.0, -0.0 * -3 = +0.0)."""
    isa, interp = mode
    dt, odt = dts
    edge = [np.float32(-88.72284)]
    for _ in range(40):
        edge.append(np.nextafter(edge[-1], np.float32(0)))
    far = [-1e38, -1e6, -104.0, -89.0, -88.0, -87.3, 87.3, 88.8, 1e6, 1e38, INF, -INF, NAN, 0.0, -0.0]
    gate_row = np.float32(edge + far)
    n = len(gate_row)
    ups = np.float32([1.0, -3.0, 0.0, INF, -INF])
    gate = np.repeat(gate_row[None], len(ups), 0).astype(D(dt))
    up = np.repeat(ups[:, None], n, 1).astype(D(dt))
    out = np.full(gate.shape, 7.0, np.float32).astype(D(odt))
    desc = SwiGLU(len(ups), n, dtype=dt, out_dtype=odt)
    run_raw(get_kernel(desc, isa), (gate, up, out), isa=isa, interpret=interp)
    want = reference(desc, [gate, up, out.copy()])[-1]
    assert_same_non_finite(out, want, "swiglu")
    got, w = out.astype(np.float64), want.astype(np.float64)
    zero = w == 0
    assert (np.signbit(got[zero]) == np.signbit(w[zero])).all(), "signed zeros differ"
    fin = np.isfinite(w)
    tol = 2.0 ** -7 if odt == "bf16" else 2.0 ** -20
    assert (np.abs(got[fin] - w[fin]) <= tol * np.abs(w[fin]) + 1e-38).all()


@pytest.mark.parametrize("mode", MODES)
def test_rotary_with_big_positions_and_infinities(mode):
    """Tables of positions up to 2^40 (and 10^15 as floats) rotate as the reference does; an inf in x with
    a 0 in the table gives NaN there (inf * 0), as the reference."""
    isa, interp = mode
    pos = np.array([0, 1, 2 ** 31 - 1, 2 ** 40, 10 ** 12 + 7], np.int64)
    m, head = len(pos), 20
    cos, sin = rope_tables(pos, head)
    cos[0, 3], sin[1, 2] = 0.0, 0.0
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, 3 * head)).astype(np.float32)
    x[0, 3], x[1, 12], x[2, 5] = INF, -INF, NAN
    for dt in ("f32", "bf16"):
        desc = Rotary(m, 3 * head, head, dtype=dt, out_dtype=dt)
        xx = x.astype(D(dt))
        out = np.full(x.shape, 7.0, np.float32).astype(D(dt))
        run_raw(get_kernel(desc, isa), (xx, cos, sin, out), isa=isa, interpret=interp)
        want = reference(desc, [xx, cos, sin, out.copy()])[-1]
        assert_same_non_finite(out, want, f"rotary {dt}")
        fin = np.isfinite(want.astype(np.float64))
        assert_close(out[fin], want[fin], dt, 4.0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bits", [8, 7])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_quantize_clamp_edges(mode, bits, dt):
    """Rows whose max|x| is fp32's largest (bf16: rounds to inf), exactly the level count (inv = 1: ties at
    .5 round to even), below the 1e-30 floor, denormal, zero and signed zero, NaN beside inf: codes and
    scales bit for bit as the reference, finite rows' codes in 1..2*zero_point-1, a zero maps to the zero
    point, NaN rows get scale NaN and inf rows scale inf."""
    isa, interp = mode
    lv = 2 ** (bits - 1) - 1
    rows = np.float32([[F32.max, -F32.max, F32.max / 3, 0, 1e-45, -0.0],
                       [lv, -lv, lv - 0.5, -(lv - 0.5), 0.5, 1.5],
                       [1e-31, -1e-31, 5e-32, 3.9e-33, 4e-33, 0],
                       [1e-45, -1e-45, 0, -0.0, 0, 0],
                       [0, -0.0, 0, 0, 0, 0],
                       [NAN, INF, 1, 2, -3, 0],
                       [-INF, INF, 0, 1, 1, 1],
                       [2.5, 2.5, 2.5, -2.5, 2.5, 2.5]])
    for width in (6, 23):                                        # a tail alone, and whole vectors plus a tail
        x = np.tile(rows, (1, -(-width // 6)))[:, :width].astype(D(dt))
        m = len(rows)
        desc = Quantize(m, width, dtype=dt, bits=bits)
        q, s = np.zeros((m, width), np.uint8), np.full(m, 5.0, np.float32)
        run_raw(get_kernel(desc, isa), (x, q, s), isa=isa, interpret=interp)
        wq, ws = reference(desc, [x, q.copy(), s.copy()])[1:]
        np.testing.assert_array_equal(s, ws)
        fin = np.isfinite(s)
        np.testing.assert_array_equal(q[fin], wq[fin])
        assert q[fin].min() >= 1 and q[fin].max() <= 2 * zero_point(bits) - 1
        assert (q[fin][x[fin].astype(np.float32) == 0] == zero_point(bits)).all()
        assert np.isnan(s[5]) and s[6] == INF


@pytest.mark.parametrize("mode", MODES)
def test_dequant_non_finite_scales(mode):
    """NaN and inf scales propagate (inf * 0 is NaN); beta=1 adds to an out holding infinities."""
    isa, interp = mode
    m, n = 3, 21
    c = np.arange(m * n, dtype=np.int32).reshape(m, n) - 30
    rs = np.float32([1.0, INF, NAN])
    cs = np.ones(n, np.float32)
    cs[[0, 17]] = [INF, 0.0]
    for beta in (0, 1):
        desc = Dequant(m, n, beta=beta)
        out = np.full((m, n), 2.0, np.float32)
        out[0, 5] = -INF
        args = (c, np.zeros(n, np.int32), rs, cs, out)
        want = reference(desc, list(args))[-1]
        run_raw(get_kernel(desc, isa), args, isa=isa, interpret=interp)
        assert_same_non_finite(out, want, f"dequant beta={beta}")
        fin = np.isfinite(want)
        np.testing.assert_array_equal(out[fin], want[fin])


# -- in place ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("isa", NATIVE)
@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("n", [7, 64, 65, 385, 2049, 4100])
def test_in_place_through_the_public_call(isa, dt, n):
    """The documented in-place calls (softmax, layer norm, RMSNorm: "the output may be the input itself";
    rotary: out is x with ldo == ldx) on padded rows, every path (registers, passes, the bf16 softmax's stack
    row and its recomputation past KEPT_MAX), through the public call, equal the out-of-place result."""
    rng = np.random.default_rng(n)
    m, ld = 5, n + 3
    g, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    nn = 2 * (n // 2)
    head = rotary_head(nn)
    cos, sin = rope_tables(rng.integers(0, 4096, m), head)
    cases = [(tppasm.softmax(m, n, ldx=ld, ldo=ld, dtype=dt, scale=0.3, isa=isa), (), n),
             (tppasm.layernorm(m, n, ldx=ld, ldo=ld, dtype=dt, isa=isa), (g, b), n),
             (tppasm.rmsnorm(m, n, ldx=ld, ldo=ld, dtype=dt, isa=isa), (g,), n),
             (tppasm.rotary(m, nn, head, ldx=ld, ldo=ld, dtype=dt, isa=isa), (cos, sin), nn)]
    for k, extra, cols in cases:
        buf = (rng.standard_normal((m, ld)) * 3).astype(np.float32).astype(D(dt))
        x, pads = buf[:, :cols], buf[:, cols:].copy()
        apart = np.empty((m, ld), D(dt))[:, :cols]
        k(x, *extra, apart)
        k(x, *extra, x)
        np.testing.assert_array_equal(x.astype(np.float32), apart.astype(np.float32), err_msg=k.desc.kind)
        np.testing.assert_array_equal(buf[:, cols:], pads, err_msg=f"{k.desc.kind}: a row's padding changed")


# -- refusals ------------------------------------------------------------------------------------------
X = np.zeros((4, 8), np.float32)
REFUSED = [
    (lambda: tppasm.softmax(0, 8), ValueError, r"m must be an int >= 1"),
    (lambda: tppasm.softmax(4, -1), ValueError, r"n must be an int >= 1"),
    (lambda: tppasm.softmax(2.0, 8), ValueError, r"m=2\.0; expected an int"),
    (lambda: tppasm.softmax(True, 8), ValueError, r"m=True; expected an int"),
    (lambda: tppasm.softmax(4, 8, ldx=7), ValueError, r"ldx=7 is too small; it must be >= 8"),
    (lambda: tppasm.softmax(4, 8, ldo=2 ** 31), ValueError, r"ldo=2147483648 needs an address offset"),
    (lambda: tppasm.softmax(1, 8, ldx=2 ** 40), ValueError, r"under 2 GiB, or split"),
    (lambda: tppasm.softmax(1, 2 ** 31 + 7), ValueError, r"n=2147483655.*under 2 GiB"),
    (lambda: tppasm.softmax(4, 8, dtype="i8"), ValueError, r"dtype='i8'; expected one of f32, bf16"),
    (lambda: tppasm.softmax(4, 8, out_dtype="u8"), ValueError, r"out_dtype='u8'; expected one of f32, bf16"),
    (lambda: tppasm.softmax(4, 8, dtype="f16"), TypeError, r"not a tppasm dtype; the dtypes are"),
    (lambda: tppasm.softmax(4, 8, scale=float("inf")), ValueError, r"expected a finite fp32 value"),
    (lambda: tppasm.softmax(4, 8, scale=-3.5e38), ValueError, r"\|scale\| <= 3\.402823e\+38"),
    (lambda: tppasm.softmax(4, 8, scale=None), ValueError, r"scale=None; expected a finite float"),
    (lambda: tppasm.softmax(4, 8, scale=1j), ValueError, r"expected a finite float"),
    (lambda: tppasm.softmax(4, 8, scale=10 ** 400), ValueError, r"expected a finite fp32 value"),
    (lambda: tppasm.softmax(4, 8, mask=True), ValueError, r"mask=True"),
    (lambda: tppasm.softmax(4, 8, mask="causal"), ValueError, r"expected None, 'row'.*or 'full'"),
    (lambda: tppasm.softmax(4, 8, mask="full", ldm=7), ValueError, r"ldm=7 is too small"),
    (lambda: tppasm.softmax(4, 8, ldm=9), ValueError, r"pass mask='full'"),
    (lambda: tppasm.softmax(4, 8, eps=1e-5), TypeError, r"unexpected keyword argument 'eps'"),
    (lambda: tppasm.softmax(4, 8, isa="avx7"), ValueError, r"expected one of 'avx2', 'avx512', 'amx', 'sve'"),
    (lambda: tppasm.softmax(4, 8, ldi=8), TypeError, r"ldi= is now ldx="),
    (lambda: tppasm.layernorm(4, 8, eps=-1e-5), ValueError, r"smallest normal"),
    (lambda: tppasm.layernorm(4, 8, eps="1e-5"), ValueError, r"eps='1e-5'; expected a finite float"),
    (lambda: tppasm.rmsnorm(4, 8, eps=True), ValueError, r"eps=True; expected a finite float"),
    (lambda: tppasm.rmsnorm(4, 8, scale=2.0), TypeError, r"unexpected keyword argument 'scale'"),
    (lambda: tppasm.swiglu(4, 8, ldu=7), ValueError, r"ldu=7 is too small"),
    (lambda: tppasm.swiglu(4, 8, dtype="i8"), ValueError, r"dtype='i8'"),
    (lambda: tppasm.rotary(4, 8, 4.0), ValueError, r"head_dim=4\.0; expected an int"),
    (lambda: tppasm.rotary(4, 8, 1), ValueError, r"head_dim=1 must be an even int >= 2 that divides n=8"),
    (lambda: tppasm.rotary(4, 8, 0), ValueError, r"head_dim=0 must be an even int >= 2"),
    (lambda: tppasm.rotary(2, 8, 4, ldt=2 ** 29), ValueError, r"ldt=536870912 needs an address offset"),
    (lambda: tppasm.rope_tables(np.arange(3), 3), ValueError, r"head_dim=3; expected an even int >= 2"),
    (lambda: tppasm.rope_tables(5, 4), ValueError, r"pass np\.arange\(5\)"),
    (lambda: tppasm.rope_tables([np.inf], 4), ValueError, r"NaN or infinities"),
    (lambda: tppasm.rope_tables([2 ** 70], 4), ValueError, r"beyond int64"),
    (lambda: tppasm.rope_tables(np.arange(3), 4, base=0), ValueError, r"base=0; expected a finite number > 0"),
    (lambda: tppasm.quantize(4, 8, dtype="i8"), ValueError, r"dtype='i8'"),
    (lambda: tppasm.quantize(4, 8, out_dtype="i8"), TypeError, r"q is always uint8"),
    (lambda: tppasm.dequant(4, 8, beta=2), ValueError, r"expected 0 \(overwrite out\) or 1 \(add to out\)"),
    (lambda: tppasm.dequant(4, 8, beta=True), ValueError, r"beta=True"),
    (lambda: tppasm.dequant(4, 8, dtype="f32"), TypeError, r"write out_dtype="),
    # calls
    (lambda: tppasm.softmax(4, 8)(X.astype(np.float64), X.copy()), ValueError, r"\.astype\(np\.float32\)"),
    (lambda: tppasm.softmax(4, 8)(X[:3], X.copy()), ValueError, r"x has shape \(3, 8\), expected \(4, 8\)"),
    (lambda: tppasm.softmax(4, 8)(np.asfortranarray(X), X.copy()), ValueError, r"np\.ascontiguousarray"),
    (lambda: tppasm.softmax(3, 8)(X[:3], X[1:]), ValueError, r"overlaps operand x.*runs in place only"),
    (lambda: tppasm.layernorm(3, 8)(X[:3], X[0], X[0], X[1:]), ValueError, r"overlaps operand x"),
    (lambda: tppasm.rotary(3, 8, 4)(X[:3], X[:3, :2].copy(), X[:3, :2].copy(), X[1:]), ValueError, r"overlaps"),
    (lambda: tppasm.rotary(4, 8, 4)(X, X[:, :2], X[:, :2].copy(), X.copy()), ValueError, r"kernel with ldt=8"),
    (lambda: tppasm.rmsnorm(4, 8)(X, X[0].astype(np.float64), X.copy()), ValueError, r"gamma has dtype float64"),
    (lambda: tppasm.softmax(4, 8, mask="row")(X, X[0, :7].copy(), X.copy()), ValueError, r"mask has shape \(7,\)"),
    (lambda: tppasm.quantize(4, 8)(X, X.astype(np.int8), np.zeros(4, np.float32)), ValueError, r"pass a uint8 output"),
    (lambda: tppasm.quantize(4, 8)(X, X.astype(np.uint8), np.zeros((4, 1), np.float32)), ValueError, r"expected 1"),
    (lambda: tppasm.dequant(4, 8)(X, X[0].astype(np.int32), X[:, 0], X[0], X.copy()), ValueError, r"np\.int32\)"),
    (lambda: tppasm.dequant(4, 8, beta=1)(X.astype(np.int32), X[0].astype(np.int32), X[:, 0], X[0]), TypeError,
     r"always passed"),
]


@pytest.mark.parametrize("make, error, message", REFUSED)
def test_refusals_name_the_fix(make, error, message):
    with pytest.raises(error, match=message):
        make()


# -- where fp32 arithmetic and float64 math part ways: the references round as the kernels do ------------
@pytest.mark.parametrize("isa", NATIVE)
def test_softmax_logits_overflowing_fp32_follow_the_reference(isa):
    """scale * x past FLT_MAX is +inf in fp32, as the reference rounds it: the row is NaN in both."""
    x = np.float32([[1e38, 0.0, 1.0], [1.0, 2.0, 3.0]])
    k = tppasm.softmax(2, 3, scale=10.0, isa=isa)
    out = k(x)
    assert_same_non_finite(out, k.reference(x), "softmax")
    assert np.isnan(out[0]).all() and np.isfinite(out[1]).all()


@pytest.mark.parametrize("isa", NATIVE)
@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_norms_of_rows_whose_squares_overflow_fp32(isa, kind):
    """The documented limit: the fp32 sum of squares overflows for values from ~1.8e19, and
    RMSNorm gives 0 there, layer norm beta (or NaN); the row beside it is unharmed."""
    x = np.float32([[2e19, -2e19, 1e19, 0.0], [1.0, -2.0, 3.0, 0.5]])
    g, b = np.ones(4, np.float32), np.float32([0.5, -1.0, 2.0, 0.0])
    k = tppasm.rmsnorm(2, 4, isa=isa) if kind == "rmsnorm" else tppasm.layernorm(2, 4, isa=isa)
    args = (x, g) if kind == "rmsnorm" else (x, g, b)
    out = k(*args)
    if kind == "rmsnorm":
        assert (out[0] == 0).all()
    else:
        assert (out[0] == b).all() or np.isnan(out[0]).all()
    np.testing.assert_allclose(out[1], k.reference(*args)[1], rtol=1e-5)


@pytest.mark.parametrize("isa", NATIVE)
def test_swiglu_of_a_denormal_gate_times_inf(isa):
    """silu of fp32's smallest denormal rounds to 0 (in the reference too), and 0 * inf is NaN."""
    g, u = np.float32([[1e-45, -1e-45, 1.0]]), np.float32([[INF, INF, INF]])
    k = tppasm.swiglu(1, 3, isa=isa)
    out = k(g, u)
    assert_same_non_finite(out, k.reference(g, u), "swiglu")
    assert np.isnan(out[0, :2]).all() and out[0, 2] == INF
