"""An adversarial pass over the element-wise TPPs (unary, binary, ternary, reduce) at AVX2 and AVX-512,
natively and in the interpreter: every tail width of both vector lengths below and above the unrolled
loops, leading dimensions past n and 4 KiB-aliased ones, each operand against a PROT_NONE page at its
start or its end (natively, in a forked child) or in a buffer of exactly its extent (interpreted), outputs
poisoned and every byte between rows compared; NaN payloads, infinities, signed zeros, fp32 and bf16
denormals, the largest finite values and the overflow edges of the transcendentals against the float64
references; native and interpreted results bit for bit; in-place calls of every documented form; and the
refusals. What test_eltwise.py and test_gap_draws.py draw at random is not repeated here.

Signed zeros are compared except where the kernels follow torch and the references NumPy: relu(-0) and
max/min of -0 and +0 give the first operand (torch's rule; np.maximum gives the second), gelu_erf_fast
gives +0 left of its table (its docstring: "-inf gives 0") and gelu_erf_bwd +0 for x < -14.1.
"""
import multiprocessing as mp

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tppasm
from tppasm.dtypes import dtype as D
from tppasm.eltwise import BINARY_OPS, GRAD_OPS, UNARY_OPS, Binary, Reduce, Ternary, Unary
from tppasm.kernel import Kernel, get_kernel
from tppasm.operand import OperandError
from tests.support import assert_same_non_finite, isa_params, native, poisoned, run_raw, ulp_errors
from tests.tpp.test_eltwise import EXACT, assert_close
from tests.tpp.test_transform_tails import _guarded

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")   # (bf16 NaNs cast)
ISAS = isa_params()
NATIVE = [pytest.param(i, id=i, marks=pytest.mark.skipif(not native(i), reason=f"host runs no {i} natively"))
          for i in ("avx2", "avx512")]
F32, BF16 = np.float32, D("bf16")
FAST = dict(deadline=None, max_examples=30)
# every tail width of 8 and 16 lanes, below and past the unrolled loops (3 blocks of 4 vectors)
TAILS = list(range(1, 34)) + [47, 48, 49, 63, 64, 65, 95, 96, 97, 127, 128, 129, 191, 192, 193, 255, 256, 257, 300]
TAILS_INTERP = [1, 5, 8, 13, 16, 17, 31, 50, 97, 200]


def _ld(n, dt, salt):
    """A row stride for n columns of ``dt``: n, n + 1, n + 7 or the next multiple of 4 KiB (aliased rows)."""
    kind = (n + salt) % 4
    if kind == 3:
        per_page = 4096 // D(dt).itemsize
        return -(-n // per_page) * per_page
    return n + (0, 1, 7)[kind]


# name -> (descriptor for (m, n, ld), inputs positive?); ld(dtype, salt) draws one operand's row stride
CASES = {
    "copy f32->bf16": (lambda m, n, ld: Unary("copy", m, n, ld("f32", 0), ld("bf16", 1), "f32", "bf16"), False),
    "copy bf16->f32": (lambda m, n, ld: Unary("copy", m, n, ld("bf16", 0), ld("f32", 1), "bf16", "f32"), False),
    "zero bf16": (lambda m, n, ld: Unary("zero", m, n, n, ld("bf16", 1), "bf16"), False),
    "relu mask f32": (lambda m, n, ld: Unary("relu", m, n, ld("f32", 0), ld("f32", 1), bitmask=True), False),
    "relu mask bf16": (lambda m, n, ld: Unary("relu", m, n, ld("bf16", 0), ld("bf16", 1), "bf16", bitmask=True),
                       False),
    "relu_bwd mask bf16->f32": (lambda m, n, ld: Unary("relu_bwd", m, n, ld("bf16", 0), ld("f32", 1), "bf16", "f32",
                                                       bitmask=True), False),
    "gelu_bwd f32": (lambda m, n, ld: Unary("gelu_bwd", m, n, ld("f32", 0), ld("f32", 1)), False),
    "gelu_erf_fast f32": (lambda m, n, ld: Unary("gelu_erf_fast", m, n, ld("f32", 0), ld("f32", 1)), False),
    "exp bf16": (lambda m, n, ld: Unary("exp", m, n, ld("bf16", 0), ld("bf16", 1), "bf16"), False),
    "rsqrt f32->bf16": (lambda m, n, ld: Unary("rsqrt", m, n, ld("f32", 0), ld("bf16", 1), "f32", "bf16"), True),
    "add row f32": (lambda m, n, ld: Binary("add", m, n, ld("f32", 0), n, ld("f32", 1), bcast_b="row"), False),
    "max col sigmoid bf16": (lambda m, n, ld: Binary("max", m, n, n, ld("bf16", 0), ld("bf16", 1), "bf16",
                                                     bcast_a="col", post="sigmoid"), False),
    "div scalar f32->bf16": (lambda m, n, ld: Binary("div", m, n, ld("f32", 0), n, ld("bf16", 1), "f32", "bf16",
                                                     bcast_b="scalar"), True),
    "muladd row bf16->f32": (lambda m, n, ld: Ternary("muladd", m, n, n, ld("bf16", 0), ld("f32", 1), "bf16",
                                                      "f32", bcast_a="row"), False),
    "reduce max cols bf16": (lambda m, n, ld: Reduce("max", m, n, "cols", ld("bf16", 0), "bf16", "bf16"), False),
    "reduce sumsq rows f32->bf16": (lambda m, n, ld: Reduce("sumsq", m, n, "rows", ld("f32", 0), "f32", "bf16"),
                                    False),
    # 34, 48, 62 rows: blocks of 16 rows (the first, the middle ones, the last with the rest)
    "reduce add rows tall": (lambda m, n, ld: Reduce("add", 20 + 14 * m, n, "rows", ld("f32", 0)), False),
}


def _extent(spec):
    if len(spec.shape) == 1:
        return spec.shape[0]
    return (spec.shape[0] - 1) * spec.strides[0] + spec.shape[1]


def _view(flat, spec):
    item = flat.itemsize
    return np.ndarray(spec.shape, flat.dtype, buffer=flat, strides=tuple(s * item for s in spec.strides))


def _poison(flat):
    flat[...] = 0xA5 if flat.dtype == np.uint8 else np.array(np.nan).astype(flat.dtype)


def _fill(rng, arr, positive):
    if arr.dtype == np.uint8:
        arr[...] = rng.integers(0, 256, arr.shape)
        return
    x = rng.standard_normal(arr.shape) * 3
    arr[...] = (np.abs(x) + 0.5 if positive else x).astype(F32).astype(arr.dtype)


def _bits(a):
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.itemsize])


def _tolerance(desc, arrays):
    """(rtol, atol) for the written outputs: bf16 two ulps; fp32 transcendentals a few ulps (gelu_erf_fast its
    absolute 2^-22 max(1, |x|)); reductions summed in another order: count * 2^-23 of the sum of |terms|."""
    out = desc.out_dtype
    rtol = 2.0 ** -7 if out == "bf16" else 4e-6
    if desc.kind == "reduce":
        x = np.abs(arrays[0].astype(np.float64)) ** (2 if desc.op == "sumsq" else 1)
        scale = x.sum(0 if desc.over == "rows" else 1)
        count = desc.m if desc.over == "rows" else desc.n
        return rtol, scale * (count * 2.0 ** -23 + (2.0 ** -8 if out == "bf16" else 0)) + 1e-30
    if desc.kind == "unary" and desc.op == "gelu_erf_fast":
        return rtol, 2.0 ** -22 * np.maximum(1, np.abs(arrays[0].astype(np.float64)))
    return rtol, 1e-6 if desc.op.endswith("_bwd") else 1e-30


def _exact(desc):
    if desc.kind == "reduce":
        return desc.op == "max"
    return desc.op in EXACT and getattr(desc, "post", None) is None


def _run_case(desc, isa, interpret, guard, seed, positive=False):
    """Run ``desc`` on operands in their own buffers (against PROT_NONE pages where ``guard``); the list of
    problems: outputs off the reference, an unwritten element, a byte outside an operand changed."""
    kernel = Kernel(desc, isa)
    specs = desc.operands()
    rng = np.random.default_rng(seed)
    flats, arrays = [], []
    for i, spec in enumerate(specs):
        count = _extent(spec)
        flat = _guarded(count, spec.dtype, (seed + i) % 2 == 0) if guard else np.empty(count, D(spec.dtype))
        _poison(flat)
        arr = _view(flat, spec)
        if not spec.writable or desc.kind == "ternary":
            _fill(rng, arr, positive)
        flats.append(flat)
        arrays.append(arr)
    want = [a.copy() for a in arrays]
    with np.errstate(all="ignore"):
        kernel.reference(*want)
    before = [f.copy() for f in flats]
    run_raw(kernel, arrays, isa=isa, interpret=interpret)
    problems, where = [], f"{desc} on {isa}{' (interpreted)' if interpret else ''}"
    for spec, flat, arr, old, ref in zip(specs, flats, arrays, before, want):
        inside = np.zeros(flat.shape, bool)
        _view(inside, spec)[...] = True
        if not spec.writable:
            inside[...] = False                     # an input changes nowhere
        if (_bits(flat)[~inside] != _bits(old)[~inside]).any():
            problems.append(f"{where}: bytes outside {spec.name}'s elements changed")
        if not spec.writable:
            continue
        if arr.dtype == np.uint8 or _exact(desc):
            same = (_bits(arr) == _bits(ref)) | (np.isnan(arr.astype(F32)) & np.isnan(ref.astype(F32)))
            if desc.op in ("relu", "max"):          # (-0 or +0: the module docstring)
                same |= (arr.astype(F32) == 0) & (ref.astype(F32) == 0)
            if not same.all():
                problems.append(f"{where}: {spec.name} differs at {np.argwhere(~same)[:3].tolist()}: "
                                f"{arr[~same][:3]} for {ref[~same][:3]}")
            continue
        got, exp = arr.astype(np.float64), ref.astype(np.float64)
        rtol, atol = _tolerance(desc, arrays)
        bad = ~(np.abs(got - exp) <= rtol * np.abs(exp) + atol)
        if bad.any():
            problems.append(f"{where}: {spec.name} off at {np.argwhere(bad)[:3].tolist()}: got {got[bad][:3]}, "
                            f"want {exp[bad][:3]}")
    return problems


def _sweep(case, isa, tails, interpret, guard):
    make, positive = CASES[case]
    problems = []
    for n in tails:
        m = 1 + n % 3
        desc = make(m, n, lambda dt, salt: _ld(n, dt, salt))
        problems += _run_case(desc, isa, interpret, guard, seed=n, positive=positive)
    return problems


def _in_child(work):
    """``work()``'s problems, computed in a forked child: a fault there (an access past a guard page) is
    reported as the signal that killed it instead of killing pytest."""
    parent, child = mp.get_context("fork").Pipe(duplex=False)

    def run():
        child.send(work())
        child.close()

    proc = mp.get_context("fork").Process(target=run)
    proc.start()
    child.close()
    try:
        got = parent.recv() if parent.poll(300) else ["the child sent nothing in 300 s"]
    except EOFError:                                # (it died before sending)
        got = None
    proc.join(60)
    assert proc.exitcode == 0, f"the child exited with {proc.exitcode} (negative: killed by that signal)"
    return got


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("isa", NATIVE)
def test_every_tail_against_guard_pages(isa, case):
    """Natively, each operand against an inaccessible page at its start or its end: n = 1..33 and around
    every multiple of the unrolled loop, lds n, n + 1, n + 7 and 4 KiB apart."""
    problems = _in_child(lambda: _sweep(case, isa, TAILS, False, True))
    assert not problems, "\n".join(problems[:8])


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_tails_in_the_interpreter(isa, case):
    """The same in the interpreter, every operand in a buffer of exactly its extent (an access past it
    raises MemoryFault)."""
    problems = _sweep(case, isa, TAILS_INTERP, True, False)
    assert not problems, "\n".join(problems[:8])


@pytest.mark.parametrize("isa", NATIVE)
def test_wide_tall_reductions_against_guard_pages(isa):
    """Reductions over the rows of tall arrays wider than one chunk of 2048 columns (its partial results
    on the stack), and over the columns of wide rows, each column tail, against guard pages."""
    def work():
        problems = []
        for n in (2047, 2048, 2049, 4111):
            for desc in (Reduce("max", 33, n, "rows", n + 3, "bf16", "f32"), Reduce("sumsq", 49, n, "rows"),
                         Reduce("add", 3, n, "cols", n + 1, "f32", "bf16")):
                problems += _run_case(desc, isa, False, True, seed=n)
        return problems
    problems = _in_child(work)
    assert not problems, "\n".join(problems[:8])


def test_amx_level_runs_the_avx512_code():
    """The AMX level (interpreted on hosts without it) runs the same element-wise code as AVX-512."""
    from tppasm.x86.eltwise import generate_binary, generate_ternary, generate_unary
    from tppasm.x86.reduce import generate_reduce
    gens = {"unary": generate_unary, "binary": generate_binary, "ternary": generate_ternary,
            "reduce": generate_reduce}
    for case, (make, _) in CASES.items():
        for n in (7, 33, 200):
            desc = make(2, n, lambda dt, salt: _ld(n, dt, salt))
            assert gens[desc.kind](desc, "amx").code == gens[desc.kind](desc, "avx512").code, (case, n)


# -- values: NaN payloads, infinities, signed zeros, denormals, edges ---------------------------------
SPECIAL_BITS = [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FA00000, 0x7FC12345, 0x7F800000, 0xFF800000,
                0, 0x80000000, 1, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00800000, 0x80800000, 0x00010000,
                0x807F0000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F0000, 0x3F800000, 0xBF800000, 0x3F808000, 0x3F818000]
EDGES = [88.7, 88.72, 88.7228, 88.73, 88.8, 89, 100, -87.3, -87.4, -88, -100, -103.9, -104, -104.1, -120, 20, -20,
         9.01, -9.01, 44, -44, 15, -15, -13, -13.5, -14, -14.1, -14.2, -5.6, 5.6, 6, -6, 6.4, -6.4, 2.0 ** 126,
         -2.0 ** 126, 2.0 ** 127, 1.5 * 2.0 ** 126, 2.0 ** -126, 2.0 ** -127, 1e-40, -1e-40, 0.55, -0.55,
         0.5499999, 1e-20, -1e-20, 1e20, -1e20, 3e19, -3e19]
SPECIALS = np.concatenate([np.array(SPECIAL_BITS, np.uint32).view(F32), np.array(EDGES, F32)])
DTYPE_PAIRS = [("f32", "f32"), ("f32", "bf16"), ("bf16", "bf16"), ("bf16", "f32")]
# the sign of a zero result follows torch or the docstring there, not the NumPy reference (module docstring)
UNSIGNED_ZERO = {"relu", "gelu_erf_fast", "gelu_erf_bwd"}
OPS = sorted((set(UNARY_OPS) | set(GRAD_OPS)) - {"zero"})
ESTIMATES = {"avx2": {"rsqrt"}, "avx512": {"rsqrt", "reciprocal"}}     # vrsqrtps, vrcp14ps, ...: not bit exact


def _as(dt, x):
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(x, F32).astype(D(dt))


def _unary_on(op, dt, odt, x, isa, interpret, dy=1.5):
    """op on the row ``x`` (``dt``), the kernel's result and the reference's."""
    n = x.shape[-1]
    k = get_kernel(Unary(op, 1, n, dtype=dt, out_dtype=odt), isa)
    ins = [_as(dt, np.full((1, n), dy)), x] if op in GRAD_OPS else [x]
    out = np.full((1, n), np.nan, F32).astype(D(odt))
    want = [a.copy() for a in ins] + [out.copy()]
    with np.errstate(all="ignore"):
        k.reference(*want)
    run_raw(k, ins + [out], isa=isa, interpret=interpret)
    return out, want[-1]


def _signed_zeros_agree(got, want):
    g, w = got.astype(F32), want.astype(F32)
    zero = (g == 0) & (w == 0)
    return (np.signbit(g[zero]) == np.signbit(w[zero])).all()


@pytest.mark.parametrize("dts", DTYPE_PAIRS, ids=["-".join(p) for p in DTYPE_PAIRS])
@pytest.mark.parametrize("isa", ISAS + [pytest.param("avx512", id="avx512-interp-forced")])
def test_unary_specials_follow_the_references(isa, dts, request):
    """Every unary and gradient op on NaNs (quiet, signalling, with payloads, negative), +-inf, +-0,
    fp32 and bf16 denormals, +-FLT_MAX and the edges of each transcendental: NaN exactly where the
    reference has NaN, the same infinities, finite values within the op's accuracy (exact ops bit for
    bit, bf16 results rounded to nearest even), and zeros of the reference's sign."""
    interpret = request.node.callspec.id.startswith("avx512-interp-forced")
    dt, odt = dts
    x = _as(dt, SPECIALS[None])
    for op in OPS:
        got, want = _unary_on(op, dt, odt, x, isa, interpret)
        what = f"{op} {dt}->{odt} on {isa}"
        assert_same_non_finite(got, want, what)
        finite = np.isfinite(want.astype(F32)) & np.isfinite(got.astype(F32))
        assert_close(got[finite], want[finite], op in EXACT, odt == "bf16" and op not in EXACT, op,
                     x[np.broadcast_to(finite, x.shape)])
        if op not in UNSIGNED_ZERO:
            assert _signed_zeros_agree(got, want), f"{what}: a zero of the other sign, x={x[got == 0]}"


def _binary_on(op, dt, odt, bca, bcb, isa, interpret, rng):
    m, n = 5, 37
    pool = np.concatenate([SPECIALS, (rng.standard_normal(20) * 3).astype(F32)])
    shape = {None: (m, n), "row": (n,), "col": (m,), "scalar": (1,)}
    a, b = (_as(dt, rng.choice(pool, shape[bc])) for bc in (bca, bcb))
    k = get_kernel(Binary(op, m, n, dtype=dt, out_dtype=odt, bcast_a=bca, bcast_b=bcb), isa)
    out = np.full((m, n), np.nan, F32).astype(D(odt))
    want = [a.copy(), b.copy(), out.copy()]
    with np.errstate(all="ignore"):
        k.reference(*want)
    run_raw(k, [a, b, out], isa=isa, interpret=interpret)
    return out, want[2]


BCAST_PAIRS = [(None, None), (None, "row"), ("col", None), ("scalar", "row"), ("row", "col"), (None, "scalar")]


@pytest.mark.parametrize("isa", ISAS)
def test_binary_specials_are_exact(isa):
    """add/sub/mul/div/max/min are correctly rounded in fp32 (and then to bf16): with NaNs, infinities,
    zeros, denormals and FLT_MAX in a, b or both, broadcast or not, the result is the reference's bit for bit
    (NaN payloads aside; max/min of -0 and +0 give a, as torch's)."""
    rng = np.random.default_rng(7)
    for op in sorted(BINARY_OPS):
        for dt, odt in DTYPE_PAIRS:
            for bca, bcb in BCAST_PAIRS:
                got, want = _binary_on(op, dt, odt, bca, bcb, isa, False, rng)
                g, w = got.astype(F32), want.astype(F32)
                same = (_bits(got) == _bits(want)) | (np.isnan(g) & np.isnan(w))
                if op in ("max", "min"):
                    same |= (g == 0) & (w == 0)
                assert same.all(), f"{op} {dt}->{odt} {bca}/{bcb} on {isa}: {g[~same][:4]} for {w[~same][:4]}"


@pytest.mark.parametrize("isa", NATIVE)
def test_native_and_interpreted_results_are_the_same_bits(isa):
    """The interpreter runs the very code the host runs: every unary and gradient op on the specials,
    binary ops on specials and broadcasts, and the reductions give the same bits, NaN payloads
    included (ops built on vrcp/vrsqrt estimates, whose tables the interpreter does not copy: within
    2^-12 relative after the Newton step, which makes them 2 ulps)."""
    for dt, odt in DTYPE_PAIRS:
        x = _as(dt, SPECIALS[None])
        for op in OPS:
            got, _ = _unary_on(op, dt, odt, x, isa, False)
            ran, _ = _unary_on(op, dt, odt, x, isa, True)
            g, r = got.astype(np.float64), ran.astype(np.float64)
            if op in ESTIMATES[isa] or (op == "gelu_erf" and odt == "bf16"):
                with np.errstate(invalid="ignore"):
                    near = np.abs(g - r) <= (2.0 ** -7 if odt == "bf16" else 2.0 ** -21) * np.abs(r)
                ok = near | (g == r) | (np.isnan(g) & np.isnan(r))
            else:
                ok = _bits(got) == _bits(ran)
            assert ok.all(), f"{op} {dt}->{odt} on {isa}: native {g[~ok][:4]}, interpreted {r[~ok][:4]}"
        for op in sorted(BINARY_OPS):
            for bca, bcb in BCAST_PAIRS[:3]:
                got, _ = _binary_on(op, dt, odt, bca, bcb, isa, False, np.random.default_rng(3))
                ran, _ = _binary_on(op, dt, odt, bca, bcb, isa, True, np.random.default_rng(3))
                assert (_bits(got) == _bits(ran)).all(), f"{op} {dt}->{odt} {bca}/{bcb} on {isa}"


# (op, lo, hi, bound): windows past the accuracy tests' domains up to the overflow and underflow edges and to
# FLT_MAX, in fp32 ulps (grads: of max(|f'|, 1)); results the reference has below 2^-126 are left out (the
# docstring allows them flushed)
EDGE_WINDOWS = [
    ("exp", 88.0, 88.72283, 2), ("exp", -87.33, -86.0, 2), ("exp", 88.7229, 3.4e38, 0),
    ("sigmoid", -87.33, -80.0, 3), ("sigmoid", 16.0, 17.4, 3), ("sigmoid", 17.4, 3.4e38, 0),
    ("sigmoid", -3.4e38, -104.0, 0),
    ("tanh", 9.1, 3.4e38, 0), ("tanh", -3.4e38, -9.1, 0), ("tanh", -1e-30, 1e-30, 1),
    ("gelu", 12.0, 3.4e38, 0), ("gelu_erf", 8.0, 3.4e38, 0), ("gelu_erf_fast", 6.0, 3.4e38, 0),
    ("gelu_bwd", 20.0, 3.4e38, 0), ("gelu_bwd", -3.4e38, -20.0, 0), ("gelu_erf_bwd", 12.0, 3.4e38, 0),
    ("gelu_erf_bwd", -3.4e38, -12.0, 4),
    ("reciprocal", 1e37, 8.5e37, 2), ("reciprocal", 1.2e-38, 1e-37, 2), ("rsqrt", 1e37, 3.4e38, 2),
    ("rsqrt", 1.2e-38, 1e-37, 2), ("sqrt", 1e37, 3.4e38, 0),
]


def _window(lo, hi, count):
    """``count`` fp32 values from lo to hi, log-spaced where the window spans decades (same signs)."""
    if lo * hi > 0 and hi / lo > 100 or lo * hi > 0 and lo / hi > 100:
        sign = np.sign(lo)
        return (sign * np.geomspace(abs(lo), abs(hi), count)).astype(F32)
    return np.linspace(lo, hi, count).astype(F32)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("op, lo, hi, bound", EDGE_WINDOWS, ids=[f"{op}[{lo:g},{hi:g}]" for op, lo, hi, _ in
                                                                  EDGE_WINDOWS])
def test_accuracy_up_to_the_edges(isa, op, lo, hi, bound):
    """The documented ulp bounds hold to the overflow edge of exp (finite right below ln FLT_MAX, inf above),
    at the far ends of sigmoid/tanh/gelu and their gradients (exactly the limit there), and for reciprocal
    and rsqrt between the normal range's ends and the bounds' domains."""
    x = _window(lo, hi, 4096 if native(isa) else 512)
    got = _unary_on(op, "f32", "f32", x[None], isa, False, dy=1.0)[0][0]
    err = ulp_errors(op, x, got)
    f = UNARY_OPS.get(op) or GRAD_OPS[op]
    with np.errstate(all="ignore"):
        ref = f(x.astype(np.float64)).astype(F32)
    err[(np.abs(ref) < np.finfo(F32).tiny) | (got == ref)] = 0
    np.testing.assert_array_equal(got[np.isinf(ref)], ref[np.isinf(ref)], err_msg=f"{op}: overflow")
    assert np.isfinite(got[np.isfinite(ref)]).all(), f"{op}: inf or NaN where the result is finite"
    worst = int(np.argmax(err))
    assert err[worst] <= bound, f"{op}: {err[worst]:.1f} ulp at x={x[worst]!r}: {got[worst]!r} for {ref[worst]!r}"


@pytest.mark.parametrize("isa", ISAS)
def test_relu_bwd_ignores_mask_bits_past_n(isa):
    """The bits of a relu mask's last byte past n are not the kernel's to read as gradients: set or not,
    dx is the reference's at every tail width, and nothing past a row's n is written."""
    for n in range(1, 34):
        m = 2
        k = get_kernel(Unary("relu_bwd", m, n, n + 3, n + 3, bitmask=True), isa)
        rng = np.random.default_rng(n)
        dy = poisoned((m, n), F32, n + 3)
        dy[...] = rng.standard_normal((m, n)).astype(F32)
        mask = rng.integers(0, 256, (m, -(-n // 8))).astype(np.uint8)
        used = (1 << (n % 8 or 8)) - 1              # the last byte's bits below n
        for past in (0x00, 0xFF):
            mask[:, -1] = (mask[:, -1] & used) | (past & ~used)
            out = poisoned((m, n), F32, n + 3)
            want = [dy.copy(), mask.copy(), out.copy()]
            k.reference(*want)
            run_raw(k, [dy, mask, out], isa=isa)
            np.testing.assert_array_equal(out, want[2], err_msg=f"n={n} past-n bits {past:#x} on {isa}")
            assert np.isnan(out.base[:, n:]).all(), f"n={n}: written past the row"


@pytest.mark.parametrize("isa", NATIVE)
@pytest.mark.parametrize("op", ["exp", "gelu_erf_fast", "sigmoid", "copy", "zero"])
@pytest.mark.parametrize("offset", [0, 1, 4])
def test_streaming_stores_of_interleaved_transcendentals(isa, op, offset, monkeypatch):
    """The non-temporal path (outputs past NT_MIN_BYTES, lowered here) for the interleaved transcendental
    chains too, and for a contiguous (m, n) walked as one row: every element written, nothing past it."""
    from tppasm.x86 import eltwise as gen
    monkeypatch.setattr(gen, "NT_MIN_BYTES", 64)
    m, n = 3, 203
    k = Kernel(Unary(op, m, n), isa)                # (not cached: the patched threshold stays here)
    x = np.linspace(-5, 5, m * n, dtype=F32).reshape(m, n)
    buf = np.full(m * n + 16, np.nan, F32)
    out = buf[offset:offset + m * n].reshape(m, n)
    want = [x.copy(), out.copy()] if op != "zero" else [out.copy()]
    k.reference(*want)
    run_raw(k, [x, out] if op != "zero" else [out], isa=isa)
    assert_close(out, want[-1], op in EXACT, False, op, x)
    assert np.isnan(buf[:offset]).all() and np.isnan(buf[offset + m * n:]).all()
    assert "vmovntps" in k.disassemble()


# -- in-place calls ------------------------------------------------------------------------------------
@st.composite
def in_place_calls(draw):
    """(descriptor, index of the input the output is, index of the output): every documented form."""
    form = draw(st.sampled_from(["unary", "relu_mask", "grad_dy", "grad_x", "binary_a", "binary_b",
                                 "ternary_a", "ternary_b"]))
    dt = draw(st.sampled_from(["f32", "bf16"]))
    m, n = draw(st.integers(1, 4)), draw(st.sampled_from(TAILS))
    ld = n + draw(st.sampled_from([0, 1, 5, 16]))
    if form == "unary":
        op = draw(st.sampled_from(sorted(set(UNARY_OPS) - {"zero"})))
        return Unary(op, m, n, ld, ld, dt), 0, 1
    if form == "relu_mask":
        return Unary("relu", m, n, ld, ld, dt, bitmask=True), 0, 1
    if form.startswith("grad"):
        op = draw(st.sampled_from(sorted(GRAD_OPS)))
        return Unary(op, m, n, ld, ld, dt), 0 if form == "grad_dy" else 1, 2
    other = draw(st.sampled_from([None, "row", "col", "scalar"]))
    side = form[-1]
    bc = {"bcast_b" if side == "a" else "bcast_a": other}
    lds = dict(lda=ld if side == "a" else n, ldb=ld if side == "b" else n)
    if form.startswith("binary"):
        op = draw(st.sampled_from(sorted(BINARY_OPS)))
        post = draw(st.sampled_from([None, "relu", "gelu_erf_fast", "tanh"]))
        return Binary(op, m, n, ldo=ld, dtype=dt, post=post, **lds, **bc), "ab".index(side), 2
    return Ternary("muladd", m, n, ldc=ld, dtype=dt, **lds, **bc), "ab".index(side), 2


@pytest.mark.parametrize("isa", ISAS)
@settings(**FAST)
@given(call=in_place_calls(), seed=st.integers(0, 2 ** 16))
def test_in_place_forms(isa, call, seed):
    """out is x, dy, x of a gradient, a or b (the other broadcast or not), or muladd's c is a or b: the
    result is the reference's on separate arrays, and the row pads stay poisoned."""
    desc, source, target = call
    specs = desc.operands()
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in specs:
        ld = spec.strides[0] if len(spec.shape) == 2 and spec.name != "mask" else None
        arr = poisoned(spec.shape, D(spec.dtype), ld) if spec.dtype != "u8" else np.zeros(spec.shape, np.uint8)
        _fill(rng, arr, desc.op in ("sqrt", "rsqrt", "reciprocal", "div"))
        arrays.append(arr)
    arrays[target] = arrays[source]
    want = [a.copy() for a in arrays]                # (muladd's c starts as the input it is)
    with np.errstate(all="ignore"):
        get_kernel(desc, isa).reference(*want)
    if native(isa):
        get_kernel(desc, isa)(*arrays)              # the public call: its overlap check lets these through
    else:
        run_raw(get_kernel(desc, isa), arrays, isa=isa)
    out = arrays[target]
    exact = _exact(desc)
    assert_close(out, want[target], exact, desc.out_dtype == "bf16" and not exact,
                 getattr(desc, "post", None) or desc.op, want[source], None)
    if getattr(desc, "bitmask", False):
        np.testing.assert_array_equal(arrays[2], want[2])
    if out.base is not None:
        assert np.isnan(out.base[:, desc.n:].astype(F32)).all(), "written past a row"


def _partial_overlaps():
    """(name, call) of calls whose output overlaps an input without being it."""
    m, n = 3, 8
    buf = np.zeros((m + 1, n), F32)
    bf = np.zeros((m, n), F32)
    yield "out one row below x", lambda: tppasm.unary("exp", m, n)(buf[1:], buf[:m])
    flat = buf.reshape(-1)[None]
    yield "out one element past x", lambda: tppasm.relu(1, n)(flat[:, 1:n + 1], flat[:, :n])
    yield "a row b inside out", lambda: tppasm.binary("add", m, n, bcast_b="row")(buf[:m], buf[0], buf[:m])
    yield "m = 1, row b is out's row", lambda: tppasm.binary("add", 1, n, bcast_b="row")(bf[:1], buf[0], buf[:1])
    yield "scalar b inside out", lambda: tppasm.binary("mul", m, n, bcast_b="scalar")(bf + 1, bf[1, 2:3], bf)
    yield "col a inside c", lambda: tppasm.ternary("muladd", m, n, bcast_a="col")(bf.reshape(-1)[:m], bf + 1, bf)
    yield "bf16 out over f32 x", lambda: tppasm.copy(1, n, out_dtype="bf16")(bf[:1], bf[:1].view(BF16)[:, :n])
    x = np.zeros((1, 64), F32)
    yield "mask over x", lambda: tppasm.relu(1, 64, bitmask=True)(x, np.zeros_like(x), x.view(np.uint8)[:, :8])
    dy = np.zeros((1, 8), F32)
    yield "relu_bwd out over its mask", lambda: tppasm.unary("relu_bwd", 1, 8, bitmask=True)(
        dy, x.view(np.uint8)[:, :1], x[:, :8])


@pytest.mark.parametrize("name, call", list(_partial_overlaps()), ids=[c[0] for c in _partial_overlaps()])
def test_partial_overlaps_are_refused(name, call):
    with pytest.raises(OperandError, match="pass a separate array for"):
        call()


# -- refusals ------------------------------------------------------------------------------------------
REFUSALS = [
    (lambda: tppasm.unary("relu", True, 8), ValueError, "m=True; expected an int"),
    (lambda: tppasm.unary("relu", 2, 8.0), ValueError, "n=8.0; expected an int"),
    (lambda: tppasm.unary("relu", 2, 8, ldx=9.0), ValueError, "ldx=9.0; expected an int"),
    (lambda: tppasm.unary("relu", 2, 8, ldo=7), ValueError, "ldo=7 is too small; it must be >= 8"),
    (lambda: tppasm.unary("zero", 2, 8, ldx=9), ValueError, "op 'zero' reads no x .*leave ldx out"),
    (lambda: tppasm.zero(2, 8, ldx=9), TypeError, "write ldo=9"),
    (lambda: tppasm.unary("copy", 2, 8, out_dtype="i8"), ValueError, "out_dtype='i8'; expected one of f32, bf16"),
    (lambda: tppasm.unary("exp", 2, 8, dtype=np.float64), ValueError, "convert with .astype"),
    (lambda: tppasm.unary("relu", 2, 8, bitmask="yes"), ValueError, "bitmask='yes'; expected True or False"),
    (lambda: tppasm.unary("gelu_bwd", 2, 8, bitmask=True), ValueError, "bitmask=True is for relu and relu_bwd"),
    (lambda: tppasm.relu(2, 8, out_dtype="bf16"), TypeError, r"write tppasm.unary\('relu'"),
    (lambda: tppasm.unary("relu", 2, 8, ldx=9, ldi=10), ValueError, "pass ldx only"),
    (lambda: tppasm.unary("relu", 3, 8, ldx=2 ** 40), ValueError, "keep leading dimensions, rows and strides under"),
    (lambda: tppasm.unary("RELU", 2, 8), ValueError, "is not one of copy, identity, zero, relu"),
    (lambda: tppasm.binary("add", 2, 8, post="zero"), ValueError, "expected a one-input op"),
    (lambda: tppasm.binary("add", 2, 8, post="relu_bwd"), ValueError, "expected a one-input op"),
    (lambda: tppasm.binary("pow", 2, 8), ValueError, "is not one of add, sub, mul, div, max, min"),
    (lambda: tppasm.binary("add", 2, 8, lda=9, bcast_a="row"), ValueError, "leave lda out, or pass bcast_a=None"),
    (lambda: tppasm.binary("add", 2, 8, ldb=9, bcast_b="scalar"), ValueError, "leave ldb out"),
    (lambda: tppasm.binary("add", 2, 8, bcast_b="rows"), ValueError, "bcast_b='rows'; expected one of"),
    (lambda: tppasm.ternary("fma", 2, 8), ValueError, "is not one of muladd"),
    (lambda: tppasm.ternary("muladd", 2, 8, ldc=4), ValueError, "ldc=4 is too small"),
    (lambda: tppasm.ternary("muladd", 2, 8, lda=9, bcast_a="col"), ValueError, "leave lda out"),
    (lambda: tppasm.reduce("min", 2, 8), ValueError, "is not one of add, max, sumsq"),
    (lambda: tppasm.reduce("add", 2, 8, out_dtype="i32"), ValueError, "out_dtype='i32'; expected one of f32, bf16"),
    (lambda: tppasm.reduce("add", 2, 8, ldx=7), ValueError, "ldx=7 is too small"),
]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")          # (ldi=, the old name of ldx)
@pytest.mark.parametrize("make, error, message", REFUSALS, ids=[r[2][:40] for r in REFUSALS])
def test_refusals_name_the_fix(make, error, message):
    with pytest.raises(error, match=message):
        make()


@pytest.mark.parametrize("call, message", [
    (lambda k: k(np.zeros((2, 8), F32), np.zeros((2, 8), F32)), "takes 3 arrays|mask"),
    (lambda k: k(np.zeros((2, 8), F32), np.zeros((2, 8), F32), np.zeros((2, 2), np.uint8)), r"expected \(2, 1\)"),
    (lambda k: k(np.zeros((2, 8), F32), np.zeros((2, 8), F32), np.zeros((2, 1), np.int8)), "uint8"),
])
def test_relu_mask_operand_refusals(call, message):
    """A bitmask relu's mask must be (m, ceil(n/8)) uint8 and is required."""
    with pytest.raises((OperandError, TypeError), match=message):
        call(tppasm.relu(2, 8, bitmask=True))
