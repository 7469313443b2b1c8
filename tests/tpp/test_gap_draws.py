"""What the other property tests never draw (.devx/fz14d/REPORT.md's list), drawn here: BRGEMMs with
lda < k, gelu_erf_fast, stream_c/pace with bias, activations, bf16 C and offset/address batches, int8
signs with beta=1 and relu, up to 40 blocks; element-wise TPPs with mixed output dtypes, ldo != lda,
every post op and broadcast; in-place calls; the public call and the allocating form on misaligned
arrays; AMX (interpreted) with NaN/inf and lda < k; SVE with lda < k; fc's pack, pre=False and
partial backward. Each example goes through the public call (tppasm.testing.check: poisoned outputs,
guards and row pads compared bit for bit, every element against the kernel's ``reference``)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import tppasm
import tppasm.fc as fc
from tppasm.brgemm import Brgemm
from tppasm.dtypes import dtype as np_dtype
from tppasm.eltwise import BINARY_OPS, GRAD_OPS, REDUCE_OPS, UNARY_OPS
from tppasm.kernel import get_kernel
from tppasm.layout import empty_for
from tppasm.testing import check
from tppasm.testing.compare import compare, documented_atol, is_summing
from tppasm.testing.strategies import operands
from tests.support import isa_params, native_params
from tests.tpp.test_brgemm import _round_trip

FAST = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FLOATS = ["f32", "bf16"]
BCASTS = [None, "row", "col", "scalar"]
POSTS = [None] + sorted(op for op in UNARY_OPS if op != "zero")
ACTS = [None, "relu", "gelu", "gelu_erf", "gelu_erf_fast", "sigmoid", "tanh"]


def _made(build):
    """The kernel ``build()`` makes; an example whose keywords it refuses (ValueError) is dropped."""
    try:
        return build()
    except ValueError:
        assume(False)


def _assert_checks(kernel, arrays_, count=None):
    problems = check(kernel, arrays_, count)
    assert not problems, f"{kernel!r}:\n" + "\n".join(problems)


# -- 1. BRGEMM descriptors ------------------------------------------------------------------------

@st.composite
def gap_brgemms(draw, dtype):
    """(descriptor, count): lda < k half the time, up to 40 blocks (small tiles then), stream_c and
    pace with everything else, int8 signs with beta=1 and relu."""
    count = draw(st.sampled_from([1, 2, 3, 17, 40]))
    top = 20 if count <= 3 else 6
    m, n, k = (draw(st.integers(1, top)) for _ in range(3))
    lda = draw(st.integers(1, k - 1)) if k > 1 and draw(st.booleans()) else k + draw(st.sampled_from([0, 3]))
    ldb, ldc = (n + draw(st.sampled_from([0, 0, 5])) for _ in range(2))
    batch = draw(st.sampled_from(["stride", "offset", "address"]))
    strided = batch == "stride"
    i8 = dtype == "i8"
    return Brgemm(
        m=m, n=n, k=k, lda=lda, ldb=ldb, ldc=ldc, batch=batch, dtype=dtype,
        stride_a=m * lda + draw(st.sampled_from([0, 3])) if strided else 0,
        stride_b=k * ldb + draw(st.sampled_from([0, 4])) if strided else 0,
        beta=draw(st.integers(0, 1)),
        c_dtype=draw(st.sampled_from(FLOATS)) if dtype == "bf16" else "",
        bias=not i8 and draw(st.booleans()),
        act=draw(st.sampled_from([None, "relu"] if i8 else ACTS)),
        signs=draw(st.sampled_from(["us", "ss", "su", "uu"])) if i8 else "us",
        stream_c=draw(st.booleans()), pace=draw(st.sampled_from([0, 0, 1, 8]))), count


@pytest.mark.parametrize("dtype", ["f32", "bf16", "i8"])
@pytest.mark.parametrize("isa", isa_params())
@settings(max_examples=12, **FAST)
@given(data=st.data())
def test_brgemm_gap_descriptors(isa, dtype, data):
    """BRGEMMs of every batch kind through the public call, every element of C checked."""
    desc, count = data.draw(gap_brgemms(dtype))
    _made(desc.validate)
    _round_trip(desc, isa, (None, "native"), count, data.draw(st.integers(0, 2 ** 32 - 1)),
                data.draw(st.integers(0, 1)))


# -- 2 and 4. element-wise TPPs: mixed dtypes, strides, posts, broadcasts; public and allocating calls

def _pad(draw):
    return draw(st.sampled_from([0, 1, 3, 16]))


@st.composite
def gap_eltwise(draw, isa):
    """A binary/ternary/reduce/gradient/relu-bitmask kernel with a mixed output dtype, ldo != lda,
    any post op and broadcasts."""
    kind = draw(st.sampled_from(["binary", "ternary", "reduce", "grad", "relu_mask"]))
    m, n = draw(st.integers(1, 9)), draw(st.integers(1, 70))
    dt, odt = draw(st.sampled_from(FLOATS)), draw(st.sampled_from(FLOATS))
    kw = dict(dtype=dt, out_dtype=odt, isa=isa)
    if kind in ("binary", "ternary"):
        bca, bcb = draw(st.sampled_from(BCASTS)), draw(st.sampled_from(BCASTS))
        kw.update(lda=0 if bca else n + _pad(draw), ldb=0 if bcb else n + _pad(draw), bcast_a=bca, bcast_b=bcb)
        if kind == "ternary":
            ldc = n + _pad(draw)
            return lambda: tppasm.ternary("muladd", m, n, ldc=ldc, **kw)
        op, post, ldo = draw(st.sampled_from(sorted(BINARY_OPS))), draw(st.sampled_from(POSTS)), n + _pad(draw)
        return lambda: tppasm.binary(op, m, n, ldo=ldo, post=post, **kw)
    if kind == "reduce":
        op, over = draw(st.sampled_from(sorted(REDUCE_OPS))), draw(st.sampled_from(["rows", "cols"]))
        ldx = n + _pad(draw)
        return lambda: tppasm.reduce(op, m, n, over=over, ldx=ldx, **kw)
    op = "relu" if kind == "relu_mask" else draw(st.sampled_from(sorted(GRAD_OPS)))
    bitmask = kind == "relu_mask" or (op == "relu_bwd" and draw(st.booleans()))
    ldx, ldo = n + _pad(draw), n + _pad(draw)
    return lambda: tppasm.unary(op, m, n, ldx=ldx, ldo=ldo, bitmask=bitmask, **kw)


@st.composite
def public_kernels(draw, isa):
    """Row-wise TPPs the eltwise/norm property tests call only through run_raw."""
    kind = draw(st.sampled_from(["unary", "binary", "softmax", "layernorm", "rmsnorm", "swiglu", "rotary"]))
    m, n = draw(st.integers(1, 6)), draw(st.integers(1, 90))
    kw = dict(dtype=draw(st.sampled_from(FLOATS)), out_dtype=draw(st.sampled_from(FLOATS)), isa=isa)
    ldx, ldo, ld3 = n + _pad(draw), n + _pad(draw), n + _pad(draw)
    if kind == "unary":
        op = draw(st.sampled_from(POSTS[1:]))
        return lambda: tppasm.unary(op, m, n, ldx=ldx, ldo=ldo, **kw)
    if kind == "binary":
        op, bcb = draw(st.sampled_from(sorted(BINARY_OPS))), draw(st.sampled_from(BCASTS))
        return lambda: tppasm.binary(op, m, n, lda=ldx, ldb=0 if bcb else n, ldo=ldo, bcast_b=bcb, **kw)
    if kind == "softmax":
        mask = draw(st.sampled_from([None, "row", "full"]))
        scale = draw(st.sampled_from([1.0, 0.0, -0.5, 3.0]))
        return lambda: tppasm.softmax(m, n, ldx=ldx, ldo=ldo, scale=scale, mask=mask,
                                      ldm=ld3 if mask == "full" else 0, **kw)
    if kind in ("layernorm", "rmsnorm"):
        return lambda: getattr(tppasm, kind)(m, n, ldx=ldx, ldo=ldo, **kw)
    if kind == "swiglu":
        return lambda: tppasm.swiglu(m, n, ldg=ldx, ldu=ld3, ldo=ldo, **kw)
    half, heads, pads = draw(st.integers(1, 20)), draw(st.integers(1, 3)), (_pad(draw), _pad(draw))
    return lambda: tppasm.rotary(m, 2 * half * heads, 2 * half, ldx=2 * half * heads + pads[0],
                                 ldt=half + pads[1], **kw)


def _assert_allocating_form(kernel, drawn):
    """``outs = kernel(inputs)``: the outputs' shapes and dtypes are empty_for's, values the reference's."""
    allocated = kernel.desc.allocated()
    specs = kernel.operands
    inputs = [a for s, a in zip(specs, drawn) if s.name not in allocated]
    got = kernel(*inputs)
    got = got if isinstance(got, tuple) else (got,)
    ref = [empty_for(s) if s.name in allocated else a.copy() for s, a in zip(specs, drawn)]
    with np.errstate(all="ignore"):
        kernel.reference(*ref)
    wants = [(s.name, r) for s, r in zip(specs, ref) if s.name in allocated]
    assert len(got) == len(wants), kernel
    for out, (name, want) in zip(got, wants):
        assert (out.shape, out.dtype) == (want.shape, want.dtype), (kernel, name, out.shape, out.dtype)
        floor = 2.0 ** -126 + documented_atol(kernel, "kernel", inputs)      # (gelu_erf_fast's 2^-22 max(1, |x|))
        problems = compare(name, out, want, None, None, floor, None, is_summing(kernel, "kernel"))
        assert not problems, f"{kernel!r} (allocating form):\n" + "\n".join(problems)


@pytest.mark.parametrize("isa", native_params())
@settings(max_examples=40, **FAST)
@given(data=st.data())
def test_eltwise_gap_kernels(isa, data):
    """Mixed output dtypes, ldo != lda, every post op and broadcast, on misaligned arrays."""
    kernel = _made(data.draw(gap_eltwise(isa)))
    drawn = data.draw(operands(kernel, specials=data.draw(st.booleans()), align=False))
    _assert_checks(kernel, drawn)


@pytest.mark.parametrize("isa", native_params())
@settings(max_examples=30, **FAST)
@given(data=st.data())
def test_public_and_allocating_calls_on_misaligned_arrays(isa, data):
    """The public call and ``outs = kernel(inputs)`` (outputs laid out as empty_for says)."""
    kernel = _made(data.draw(public_kernels(isa)))
    drawn = data.draw(operands(kernel, align=False))
    _assert_checks(kernel, drawn)
    if kernel.desc.allocated():
        _assert_allocating_form(kernel, drawn)


# -- 3. in-place calls ----------------------------------------------------------------------------

@st.composite
def in_place(draw, isa):
    """(kernel, input operand name): a kernel whose output may be its input (same dtype and ld)."""
    kind = draw(st.sampled_from(["unary", "binary", "softmax", "layernorm", "rmsnorm"]))
    m = draw(st.integers(1, 4))
    large = kind in ("softmax", "layernorm", "rmsnorm") and draw(st.booleans())
    n = draw(st.integers(2049, 5000)) if large else draw(st.integers(1, 100))
    ld = n + _pad(draw)
    kw = dict(dtype=draw(st.sampled_from(FLOATS)), isa=isa)
    if kind == "unary":
        op = draw(st.sampled_from(POSTS[1:]))
        return (lambda: tppasm.unary(op, m, n, ldx=ld, ldo=ld, **kw)), "x"
    if kind == "binary":
        op, bc, post = (draw(st.sampled_from(c)) for c in (sorted(BINARY_OPS), BCASTS, [None, "relu", "tanh"]))
        return (lambda: tppasm.binary(op, m, n, lda=ld, ldo=ld, bcast_b=bc, ldb=0 if bc else n, post=post,
                                      **kw)), "a"
    if kind == "softmax":
        mask = draw(st.sampled_from([None, "row"]))
        return (lambda: tppasm.softmax(m, n, ldx=ld, ldo=ld, mask=mask, scale=0.5, **kw)), "x"
    return (lambda: getattr(tppasm, kind)(m, n, ldx=ld, ldo=ld, **kw)), "x"


@pytest.mark.parametrize("isa", native_params())
@settings(max_examples=25, **FAST)
@given(data=st.data())
def test_in_place_calls(isa, data):
    """``out`` is the input array itself: bf16, ld > n, broadcasts, n past 2048 for softmax and the norms."""
    build, source = data.draw(in_place(isa))
    kernel = _made(build)
    specs = kernel.operands
    names = [s.name for s in specs]
    drawn = list(data.draw(operands(kernel, align=False)))
    shared = names.index(source)
    out = names.index("out")
    ref = [empty_for(s) if i == out else a.copy() for i, (s, a) in enumerate(zip(specs, drawn))]
    with np.errstate(all="ignore"):
        kernel.reference(*ref)
    drawn[out] = drawn[shared]                       # the output is the input
    kernel(*drawn)
    floor = 2.0 ** -126 + documented_atol(kernel, "kernel", ref)       # (gelu_erf_fast's 2^-22 max(1, |x|))
    problems = compare("out", drawn[out], ref[out], None, None, floor, None, is_summing(kernel, "kernel"))
    assert not problems, f"{kernel!r} in place:\n" + "\n".join(problems)


# -- 5. AMX in the interpreter, SVE under the emulator ---------------------------------------------

def _root(a):
    """The array owning ``a``'s memory, through as_strided's wrapper (rows overlap where lda < k: the
    view's own size is not its extent, so the whole buffer must be mapped)."""
    while True:
        base = a.base if isinstance(a.base, np.ndarray) else getattr(a.base, "base", None)
        if not isinstance(base, np.ndarray):
            return a
        a = base


def _interpreted(kernel, drawn, count):
    """Run ``kernel``'s raw code in isa.x86.interp on ``drawn`` (each root buffer mapped)."""
    from isa.x86.interp import Machine
    machine, mapped, args = Machine(), [], []
    for a in drawn:
        root = _root(a)
        addr = next((ad for r, ad in mapped if r is root), None)
        if addr is None:
            addr = machine.map(root)
            mapped.append((root, addr))
        args.append(addr + a.__array_interface__["data"][0] - root.__array_interface__["data"][0])
    machine.call(kernel.raw.code, args=args + [count])
    for root, addr in mapped:
        root[...] = machine.read(addr, like=root)


@settings(max_examples=10, **FAST)
@given(data=st.data())
def test_amx_with_specials_and_small_lda(data):
    """AMX code (in the interpreter, which faults on a misaligned non-temporal store) with NaN/inf
    operands, overlapping A rows and stream_c."""
    dtype = data.draw(st.sampled_from(["bf16", "i8"]))
    m, n, k = data.draw(st.integers(1, 20)), data.draw(st.integers(1, 20)), data.draw(st.integers(2, 40))
    kw = dict(lda=data.draw(st.integers(1, k - 1)), beta=data.draw(st.integers(0, 1)), dtype=dtype,
              stream_c=data.draw(st.booleans()))
    if dtype == "bf16":
        kw.update(bias=data.draw(st.booleans()), act=data.draw(st.sampled_from(ACTS)),
                  c_dtype=data.draw(st.sampled_from(FLOATS)))
    else:
        kw.update(signs=data.draw(st.sampled_from(["us", "ss", "su", "uu"])),
                  act=data.draw(st.sampled_from([None, "relu"])))
    kernel = get_kernel(tppasm.brgemm(m, n, k, **kw).desc, "amx")       # AMX code, run in the interpreter
    drawn = data.draw(operands(kernel, max_count=2, specials=dtype == "bf16", align=False))
    count = drawn[0].shape[0]
    ref = [a.copy() for a in drawn]
    with np.errstate(all="ignore"):
        kernel.reference(*ref, count=count)
    _interpreted(kernel, drawn, count)
    c = [s.name for s in kernel.operands].index("c")
    floor = 2.0 ** 20 * 2.0 ** -126                  # bf16 dots flush denormals (tppasm.testing)
    problems = compare("c", drawn[c], ref[c], None, None, floor, None, True)
    assert not problems, f"{kernel!r} (AMX, interpreted):\n" + "\n".join(problems)


def _sve_cases():
    from tests.aarch64.marks import vl_params
    return vl_params((128,))


@pytest.mark.parametrize("vl", _sve_cases())
@settings(max_examples=2, database=None, **FAST)
@given(data=st.data())
def test_sve_brgemm_with_small_lda(vl, data):
    """SVE BRGEMMs with overlapping A rows, one batch under the emulator (qemu: few examples)."""
    from isa.aarch64.native import run_calls
    from tests.aarch64.sve_cases import DescCase, close
    cases = []
    for i, dtype in enumerate(["f32", "bf16", "i8"]):
        m, n, k = data.draw(st.integers(1, 9)), data.draw(st.integers(1, 33)), data.draw(st.integers(2, 20))
        kw = dict(dtype=dtype, lda=data.draw(st.integers(1, k - 1)), beta=data.draw(st.integers(0, 1)))
        if dtype != "i8":
            kw.update(bias=data.draw(st.booleans()), act=data.draw(st.sampled_from([None, "relu", "tanh"])))
        cases.append(DescCase(tppasm.brgemm(m, n, k, **kw).desc, seed=i, count=data.draw(st.integers(1, 3)),
                              scale=1.0))
    run_calls([c.call() for c in cases], vl)
    for case in cases:
        for got, want in case.results():
            rtol = 0.0 if got.dtype.kind in "iu" else 2 ** -7 if got.itemsize == 2 else 1e-4
            bad = close(got, want, rtol, rtol * 0.1 * case.desc.k * max(1.0, float(np.nanmax(np.abs(
                np.where(np.isfinite(want.astype(np.float64)), want.astype(np.float64), 0))))))
            assert not len(bad), (case.desc, got.reshape(-1)[bad[:4]], want.reshape(-1)[bad[:4]])


# -- 6. fc: pack(w), pre=False, partial backward ---------------------------------------------------

@settings(max_examples=20, **FAST)
@given(n=st.integers(1, 40), m=st.integers(1, 40), k=st.integers(1, 40), dtype=st.sampled_from(FLOATS),
       act=st.sampled_from(fc.ACTS), bias=st.booleans(), packed=st.booleans(), pre=st.sampled_from([None, False]),
       wanted=st.tuples(st.booleans(), st.booleans(), st.booleans()), threads=st.integers(1, 2),
       seed=st.integers(0, 2 ** 32 - 1))
def test_fc_packed_pre_and_partial_backward(n, m, k, dtype, act, bias, packed, pre, wanted, threads, seed):
    """fc.forward with pack(w) and pre=False; fc.backward computing only some of dx, dw, db."""
    rng = np.random.default_rng(seed)
    dt = np_dtype(dtype)
    x = (rng.standard_normal((n, k)) * k ** -0.5).astype(np.float32).astype(dt)
    w = rng.standard_normal((m, k)).astype(np.float32).astype(dt)
    b = rng.standard_normal(m).astype(np.float32) if bias else None
    pre = pre if act in fc.GELUS else None
    y, z = fc.forward(x, fc.pack(w) if packed else w, b, act, pre=pre, threads=threads)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    z64 = x64 @ w64.T + (0 if b is None else b)
    want = z64 if act is None else UNARY_OPS[act](z64)
    rt = 2 ** -7 if dtype == "bf16" else 1e-4
    err = np.abs(y.astype(np.float64) - want)
    assert (err <= rt * (np.abs(want) + 0.1 + 0.05 * np.abs(x64) @ np.abs(w64).T)).all(), ("y", err.max())
    if pre is False:
        assert z is None
        return
    dy = rng.standard_normal((n, m)).astype(np.float32).astype(dt)
    saved = y if act == "relu" else z
    grads = fc.backward(dy, x, w, act, saved, dx=wanted[0], dw=wanted[1], db=wanted[2], threads=threads)
    dz = dy.astype(np.float64)
    if act is not None:
        dz = dz * GRAD_OPS[fc.GRADIENTS[act]](saved.astype(np.float64))
    refs = [(dz @ w64, np.abs(dz) @ np.abs(w64)), (dz.T @ x64, np.abs(dz).T @ np.abs(x64)),
            (dz.sum(0), np.abs(dz).sum(0))]
    for name, got, on, (ref, mag) in zip(("dx", "dw", "db"), grads, wanted, refs):
        if not on:
            assert got is None, name
            continue
        tol = (2 ** -7 * (np.abs(ref) + mag) if dtype == "bf16" else 1e-4 * (np.abs(ref) + 0.05 * mag + 1e-3)) + 1e-6
        assert (np.abs(got.astype(np.float64) - ref) <= tol).all(), (name, np.abs(got.astype(np.float64) - ref).max())
