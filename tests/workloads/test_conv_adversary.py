"""An adversarial pass over the convolution helpers (tppasm.conv_layout) and the BRGEMM convolution
of bench.conv_nest / bench.conv, as a demanding or careless user would call them.

Layouts: every kind of input (C and Fortran order, views, read-only, lists, integers, float16 and
float64, torch tensors bf16 too), channel blocks that do and do not divide C (and exceed it), pads
0..3, N = 0; the round trip is exact and every element sits where the docstring says. The
convolution: drawn shapes beyond ResNet-50's (odd sizes, strides 1-3, kernels 1-7 square or
not, padding past kernel/2, C and K off the block), every Blocking knob and spec kind, fp32 and
bf16, on 1 and 2 threads, with the blocked input, weights and output against inaccessible pages,
the output NaN-poisoned (every element must be written, no byte beside it changed), against
torch.nn.functional.conv2d in float64 (conv2d_reference where torch is absent) within a bound
stated per dtype. The bench's knobs: every blocking and spec candidate it enumerates for shapes
that are not ResNet-50's builds and gives the same convolution. Bad knobs and arrays are refused
with a TypeError/ValueError that names the argument and the fix."""
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tppasm as tpp
from bench import conv as bconv
from bench.conv_nest import Blocking, Conv, ConvNest
from isa.pool import get_num_threads, set_num_threads
from tppasm.conv_layout import block_activations, block_weights, conv2d_reference, unblock_activations
from tppasm.dtypes import DtypeError
from tests.tpp.test_transform_adversary import fenced

BF16 = tpp.dtypes.dtype("bf16")
U = 2.0 ** -24                      # fp32's unit roundoff


@pytest.fixture(autouse=True)
def restore_threads():
    before = get_num_threads()
    yield
    set_num_threads(before)


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def reference(x, w, stride, pad):
    """(sum, sum of |products|) of the convolution in float64: torch's conv2d, else conv2d_reference."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    torch = _torch()
    if torch is None:
        return conv2d_reference(x, w, stride, pad), conv2d_reference(np.abs(x), np.abs(w), stride, pad)
    conv = lambda a, b: torch.nn.functional.conv2d(  # noqa: E731
        torch.from_numpy(a), torch.from_numpy(b), stride=stride, padding=pad).numpy()
    return conv(x, w), conv(np.abs(x), np.abs(w))


def assert_conv_close(got, x, w, stride, pad, dtype, what=""):
    """fp32: each of the C*R*S products rounds its sum once (bound (C*R*S + 2) u * sum|products|);
    bf16: exact products of bf16 inputs summed in fp32 (twice that, for a dot instruction that
    may round the product and the sum), the output then rounded to bf16 (2^-8 of |result|)."""
    ref, mag = reference(x, w, stride, pad)
    terms = w.shape[1] * w.shape[2] * w.shape[3]
    bound = (terms + 2) * U * mag if dtype == "f32" else (2 * terms + 4) * U * mag
    if dtype == "bf16":
        bound = bound * (1 + 2.0 ** -8) + 2.0 ** -8 * np.abs(ref)
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, expected {ref.shape}"
    bad = ~(np.abs(got - ref) <= bound + 1e-30)
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} elements off, first at "
                           f"{np.argwhere(bad)[0].tolist()}: {got[bad][0]} vs {ref[bad][0]}")


def operands(shape, dtype, seed):
    """Random NCHW input and KCRS weights, rounded to ``dtype``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((shape.n, shape.c, shape.h, shape.w)).astype(np.float32)
    w = rng.standard_normal((shape.k, shape.c, shape.r, shape.s)).astype(np.float32)
    return (x.astype(BF16), w.astype(BF16)) if dtype == "bf16" else (x, w)


def _fence(a, at_end, keep):
    """A copy of ``a`` (C order) whose bytes end at (or start after) an inaccessible page."""
    region, b = fenced(a.nbytes, at_end, 64)
    keep.append(region)
    out = b.view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def convolve(shape, dtype, blocking, spec, x, w, ends=(True, True, True)):
    """Our convolution (NCHW float64) of ``x`` and ``w``, the blocked operands against guard pages
    (``ends``: input, weights, output at the end of their mapping, else at its start) and the
    output's mapping filled with NaN bytes first: every element must be written, none beside it."""
    nest = ConvNest(shape, dtype, blocking, spec=spec)
    keep = []
    xb = _fence(block_activations(x, blocking.bc, shape.pad, dtype), ends[0], keep)
    wb = _fence(block_weights(w, blocking.bc, blocking.bk, dtype, blocking.fold), ends[1], keep)
    like = nest.output()
    region, yb = fenced(like.nbytes, ends[2], 64)
    region[...] = 0xFF                                   # NaN in f32 and bf16
    y = yb.view(like.dtype).reshape(like.shape)
    nest(xb, wb, y)
    start = yb.ctypes.data - region.ctypes.data
    outside = np.concatenate([region[:start], region[start + yb.size:]])
    assert (outside == 0xFF).all(), f"{shape} {blocking} {spec}: bytes beside the output changed"
    got = unblock_activations(nest.result(y)).astype(np.float64)
    assert not np.isnan(got).any(), f"{shape} {blocking} {spec}: {int(np.isnan(got).sum())} outputs not written"
    return got


# -- layouts ---------------------------------------------------------------------------------------

KINDS = ["C", "F", "view", "readonly", "list", "int32", "float16", "float64", "bf16", "torch", "torch bf16",
         "torch transposed"]


def as_kind(x, kind):
    """``x`` (float32 NCHW) as a user might hold it, and the values the helpers should see."""
    if kind == "F":
        return np.asfortranarray(x), x
    if kind == "view":                           # a non-contiguous view with a negative stride
        big = np.zeros(x.shape[:3] + (2 * x.shape[3],), x.dtype)
        big[..., ::-2] = x
        return big[..., ::-2], x
    if kind == "readonly":
        x = x.copy()
        x.flags.writeable = False
        return x, x
    if kind == "list":
        return x.tolist(), x.astype(np.float64)
    if kind in ("int32", "float16", "float64", "bf16"):
        y = (x * 10).astype(np.int32) if kind == "int32" else x.astype(BF16 if kind == "bf16" else kind)
        return y, y
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(x.copy())
    if kind == "torch bf16":
        t = t.bfloat16()
        return t, t.float().numpy().astype(BF16)
    if kind == "torch transposed":
        t = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 1, 3, 2))).transpose(2, 3)
    return t, x


@settings(max_examples=80, deadline=None)
@given(n=st.integers(0, 3), c=st.integers(1, 70), h=st.integers(1, 6), w=st.integers(1, 6),
       bc=st.sampled_from([1, 2, 3, 16, 32, 64, 100]), pad=st.integers(0, 3), kind=st.sampled_from(KINDS),
       to=st.sampled_from([None, "f32", "bf16"]), seed=st.integers(0, 2 ** 16))
def test_activations_round_trip_from_every_kind_of_input(n, c, h, w, bc, pad, kind, to, seed):
    x = np.random.default_rng(seed).standard_normal((n, c, h, w)).astype(np.float32)
    given_x, seen = as_kind(x, kind)
    if kind == "list" and n == 0:            # [] holds no C, H, W: refused, naming the array to pass
        with pytest.raises(ValueError, match=r"x is an empty list, which has no C, H or W; .*np.empty\(\(0, C, H, W\)"):
            block_activations(given_x, bc, pad, to)
        return
    before = np.array(seen, copy=True)
    xb = block_activations(given_x, bc, pad, to)
    want = seen if to is None else seen.astype(tpp.dtypes.dtype(to))
    cb = -(-c // bc)
    assert xb.shape == (n, cb, h + 2 * pad, w + 2 * pad, bc) and xb.dtype == want.dtype
    assert xb.flags.c_contiguous and xb.ctypes.data % 64 == 0 and not np.shares_memory(xb, seen)
    inner = xb[:, :, pad:pad + h, pad:pad + w]
    assert (xb == 0).sum() - (inner == 0).sum() == xb.size - inner.size, "the zero rim"
    flat = inner.transpose(0, 1, 4, 2, 3).reshape(n, cb * bc, h, w)
    assert (flat[:, c:] == 0).all(), "channels past C"
    np.testing.assert_array_equal(flat[:, :c], want)
    back = unblock_activations(xb, channels=c, pad=pad)
    assert back.dtype == want.dtype and back.flags.c_contiguous and not np.shares_memory(back, xb)
    np.testing.assert_array_equal(back, want)
    np.testing.assert_array_equal(np.asarray(seen, dtype=before.dtype), before)      # the input is untouched


def test_special_values_survive_the_round_trip_bit_for_bit():
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 1e-45, -3.4e38, 0.0], np.float32).reshape(1, 2, 2, 2)
    for dt in (None, "bf16"):
        want = x if dt is None else x.astype(BF16)
        back = unblock_activations(block_activations(x, 3, 2, dt), channels=2, pad=2)
        assert back.tobytes() == want.tobytes()


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 12), c=st.integers(1, 9), r=st.sampled_from([1, 3, 5, 7]), s=st.sampled_from([1, 2, 3, 7]),
       bc=st.sampled_from([1, 2, 3, 4, 5, 16]), dtype=st.sampled_from(["f32", "bf16"]), fold=st.booleans(),
       data=st.data())
def test_weights_sit_where_the_docstring_says(k, c, r, s, bc, dtype, fold, data):
    """Every element of block_weights' result against the layout formula: (K/bk, C/bc, R, S, bc, bk),
    bf16 VNNI2 pairs over bc (or over S*bc with fold, a zero pad row when odd), zeros past C."""
    bk = data.draw(st.sampled_from([d for d in range(1, k + 1) if k % d == 0]), "bk")
    if dtype == "bf16" and bc % 2 and not fold:
        with pytest.raises(ValueError, match=f"bc={bc} must be even; pad the channels with bc={bc + 1}, .*fold=True"):
            block_weights(np.ones((k, c, r, s), np.float32), bc, bk, dtype)
        return
    w = np.random.default_rng(k * c + r).standard_normal((k, c, r, s)).astype(np.float32)
    wb = block_weights(w, bc, bk, dtype, fold)
    cb = -(-c // bc)
    padded = np.zeros((k, cb * bc, r, s), np.float32)
    padded[:, :c] = w.astype(tpp.dtypes.dtype(dtype)).astype(np.float32)
    logical = padded.reshape(k // bk, bk, cb, bc, r, s).transpose(0, 2, 4, 5, 3, 1)   # kb cb r s bc bk
    if fold:
        logical = logical.reshape(k // bk, cb, r, s * bc, bk)
    rows = logical.shape[-2]
    assert wb.flags.c_contiguous and wb.ctypes.data % 64 == 0
    if dtype == "bf16":
        pairs = -(-rows // 2)
        assert wb.shape == logical.shape[:-2] + (pairs, bk, 2)
        unpacked = wb.swapaxes(-1, -2).reshape(logical.shape[:-2] + (2 * pairs, bk))
        assert (unpacked[..., rows:, :] == 0).all()
        wb = unpacked[..., :rows, :]
    assert wb.shape == logical.shape
    np.testing.assert_array_equal(wb.astype(np.float32), logical)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 2), c=st.integers(1, 5), k=st.integers(1, 4), r=st.sampled_from([1, 2, 3, 5, 7]),
       s=st.sampled_from([1, 3, 4]), stride=st.integers(1, 3), pad=st.integers(0, 4), data=st.data())
def test_reference_convolution_matches_torch(n, c, k, r, s, stride, pad, data):
    torch = pytest.importorskip("torch")
    h = data.draw(st.integers(max(1, r - 2 * pad), 9), "h")
    w = data.draw(st.integers(max(1, s - 2 * pad), 9), "w")
    rng = np.random.default_rng(n + 10 * c)
    x, wt = rng.standard_normal((n, c, h, w)), rng.standard_normal((k, c, r, s))
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), stride=stride, padding=pad).numpy()
    got = conv2d_reference(x, wt, stride, pad)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    xi = (x * 8).astype(np.int32)
    np.testing.assert_allclose(conv2d_reference(xi, torch.from_numpy(wt), stride, pad),
                               conv2d_reference(xi.astype(np.float64), wt, stride, pad), rtol=0, atol=0)


X = np.ones((1, 3, 4, 4), np.float32)
W = np.ones((8, 3, 3, 3), np.float32)


@pytest.mark.parametrize("call, error, message", [
    (lambda: block_activations(np.zeros((1, 0, 4, 4), np.float32), 2), ValueError, r"has C=0; .*N may be 0"),
    (lambda: block_activations(np.zeros((2, 3, 0, 4)), 2, 1), ValueError, r"x of shape \(2, 3, 0, 4\) has H=0"),
    (lambda: block_activations(np.zeros((1, 3, 4, 0)), 2), ValueError, r"has W=0; a convolution's input needs C, H"),
    (lambda: block_activations(X, 0), ValueError, r"block_activations: bc=0; expected an int >= 1"),
    (lambda: block_activations(X, 2.0), ValueError, r"bc=2\.0; expected an int"),
    (lambda: block_activations(X, None), ValueError, r"bc=None; expected an int"),
    (lambda: block_activations(X, 2, 1.5), ValueError, r"pad=1\.5; expected an int >= 0"),
    (lambda: block_activations(X, 2, True), ValueError, r"pad=True; expected an int >= 0"),
    (lambda: block_activations(X[0], 2), ValueError, r"x must be NCHW \(4-D\), got shape \(3, 4, 4\)"),
    (lambda: block_activations(X > 0, 2), DtypeError, r"x holds bool; .*x\.astype\(np\.float32\)"),
    (lambda: block_activations(X.astype(object), 2), DtypeError, r"x holds object"),
    (lambda: block_activations(X.astype(np.complex64), 2), DtypeError, r"x holds complex64.*x\.real"),
    (lambda: block_activations(X, 2, dtype="f16x"), DtypeError, r"dtype='f16x' is not a tppasm dtype"),
    (lambda: block_activations(np.ma.masked_array(X), 2), ValueError, r"block_activations: x is a NumPy masked"),
    (lambda: block_weights(W, 2, 3), ValueError, r"bk=3 must divide the 8 output channels"),
    (lambda: block_weights(W, 2, 16), ValueError, r"bk=16 must divide the 8 output channels"),
    (lambda: block_weights(W, 0, 8), ValueError, r"bc=0; expected an int >= 1"),
    (lambda: block_weights(W, 2, 8.0), ValueError, r"bk=8\.0; expected an int >= 1"),
    (lambda: block_weights(W, 3, 8, "bf16"), ValueError, r"bc=3 must be even; pad the channels with bc=4.*fold=True"),
    (lambda: block_weights(W, 2, 8, fold="yes"), ValueError, r"fold='yes'; expected True .* or False"),
    (lambda: block_weights(W[0], 2, 8), ValueError, r"w must be KCRS \(4-D\)"),
    (lambda: block_weights(W.astype(complex), 2, 8), DtypeError, r"w holds complex128.*w\.real"),
    (lambda: unblock_activations(np.zeros((1, 2, 4, 4, 2)), channels=5), ValueError, r"channels=5 must be in 1\.\.4"),
    (lambda: unblock_activations(np.zeros((1, 2, 4, 4, 2)), channels=0), ValueError, r"channels=0; expected an int"),
    (lambda: unblock_activations(np.zeros((1, 2, 4, 6, 2)), pad=2), ValueError, r"pad=2 less than half of 4x6"),
    (lambda: unblock_activations(np.zeros((1, 8, 4, 4))), ValueError, r"expected \(N, C/bc, H, W, bc\)"),
    (lambda: conv2d_reference(X, W[:, :2]), ValueError, r"must agree on C"),
    (lambda: conv2d_reference(X, W, stride=(1, 1)), ValueError, r"stride=\(1, 1\); expected one int >= 1"),
    (lambda: conv2d_reference(X, W, pad=-1), ValueError, r"pad=-1; expected one int >= 0"),
    (lambda: conv2d_reference(X[:, :, :1, :1], W), ValueError, r"3-pixel kernel does not fit 1 pixels .* at least 1"),
    (lambda: conv2d_reference(X.astype(bool), W), DtypeError, r"conv2d_reference: x holds bool"),
])
def test_layout_helpers_refuse_with_the_fix(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_layout_helpers_take_empty_batches():
    """N = 0 is an empty batch (the layouts keep it); a 0-size KCRS weight keeps its blocked shape."""
    xb = block_activations(np.zeros((0, 3, 4, 5), np.float32), 2, 1)
    assert xb.shape == (0, 2, 6, 7, 2) and unblock_activations(xb, 3, 1).shape == (0, 3, 4, 5)
    assert conv2d_reference(np.zeros((0, 3, 4, 5)), W, 1, 1).shape == (0, 8, 4, 5)


# -- the convolution -----------------------------------------------------------------------------

def _draw_case(data):
    """(Conv, dtype, Blocking, spec, threads): a shape beyond ResNet-50's and knobs it takes."""
    r = data.draw(st.sampled_from([1, 2, 3, 5, 7]), "r")
    s = data.draw(st.sampled_from([r, r, 1, 3, 5]), "s")
    stride, pad = data.draw(st.integers(1, 3), "stride"), data.draw(st.integers(0, 3), "pad")
    h = data.draw(st.integers(max(1, r - 2 * pad), 11), "h")
    w = data.draw(st.integers(max(1, s - 2 * pad), 11), "w")
    bc = data.draw(st.sampled_from([1, 2, 3, 4, 5, 8, 16, 32, 64]), "bc")
    bk = data.draw(st.sampled_from([1, 2, 3, 8, 16, 24, 32]), "bk")
    c = data.draw(st.integers(1, min(3 * bc + 1, 40)), "c")
    shape = Conv(n=data.draw(st.integers(1, 3), "n"), c=c, k=bk * data.draw(st.integers(1, 2), "kb"), h=h, w=w, r=r,
                 s=s, stride=stride, pad=pad)
    dtype = data.draw(st.sampled_from(["f32", "bf16"]), "dtype")
    gather = shape.gatherable and data.draw(st.booleans(), "gather")
    if dtype == "bf16" and bc % 2 and gather:
        bc += 1                                          # (gather takes no fold, so bf16 needs an even bc)
    batch = "c" if gather else data.draw(st.sampled_from(["c", "r", "s"]), "batch")
    fold = batch != "s" and not gather and (data.draw(st.booleans(), "fold") or dtype == "bf16" and bc % 2 == 1)
    if dtype == "bf16" and bc % 2 and not fold:          # batch "s" takes no fold: an even bc then
        bc += 1
    cb = -(-c // bc)
    pixels = shape.p * shape.q if shape.flat or gather else shape.q
    bw = data.draw(st.sampled_from([d for d in range(1, pixels + 1) if pixels % d == 0]), "bw")
    spans = stride == 1 and not shape.flat and not gather and batch != "s" and bw == shape.q
    rows = data.draw(st.sampled_from([d for d in range(1, shape.p + 1) if shape.p % d == 0]), "rows") if spans else 1
    kblock, hblock = data.draw(st.integers(1, 3), "kblock"), data.draw(st.sampled_from([1, 2, 3, 4]), "hblock")
    if hblock % rows:
        hblock = rows
    threads = data.draw(st.sampled_from([1, 2]), "threads")
    spec = data.draw(st.sampled_from(bconv.spec_candidates(shape, threads)), "spec")
    spec += "c" * (kblock > 1 and data.draw(st.booleans(), "c blocked"))            # c and d written twice
    spec += "d" * (hblock > 1 and data.draw(st.booleans(), "d blocked"))
    blocking = Blocking(bc=bc, bk=bk, bw=bw, batch=batch, fold=fold, rows=rows, gather=gather, kblock=kblock,
                        hblock=hblock, cstep=data.draw(st.sampled_from([d for d in range(1, cb + 1) if cb % d == 0])),
                        prefetch=data.draw(st.booleans(), "prefetch"))
    return shape, dtype, blocking, spec, threads


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_drawn_convolutions_inside_guard_pages(data):
    shape, dtype, blocking, spec, threads = _draw_case(data)
    set_num_threads(threads)
    x, w = operands(shape, dtype, data.draw(st.integers(0, 2 ** 16), "seed"))
    ends = tuple(data.draw(st.tuples(st.booleans(), st.booleans(), st.booleans()), "ends"))
    got = convolve(shape, dtype, blocking, spec, x, w, ends)
    assert_conv_close(got, x, w, shape.stride, shape.pad, dtype, f"{shape!r} {dtype} {blocking!r} {spec} {threads}t")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("shape, blocking", [
    (Conv(n=3, c=10, k=16, h=7, w=9, r=3, s=3, stride=2, pad=2), Blocking(bc=4, bk=8)),
    (Conv(n=3, c=10, k=16, h=7, w=9, r=3, s=3, stride=2, pad=2), Blocking(bc=4, bk=8, batch="r", fold=True)),
    (Conv(n=1, c=7, k=24, h=9, w=9, r=5, s=5, pad=3), Blocking(bc=2, bk=8, batch="s", kblock=2, hblock=2)),
    (Conv(n=2, c=6, k=8, h=6, w=5, r=3, s=3, pad=1), Blocking(bc=6, bk=8, rows=3, batch="r")),
])
def test_one_and_two_threads_give_the_same_bits(shape, blocking, dtype):
    """A tile's reduction runs on one thread in loop order, so the thread count changes no bit of
    the result under any spec (specs that reorder the reduction may change the rounding)."""
    x, w = operands(shape, dtype, 5)
    for spec in bconv.spec_candidates(shape, 2) + ["Accddebfg"] * (blocking.kblock > 1 < blocking.hblock):
        outs = []
        for threads in (1, 2):
            set_num_threads(threads)
            outs.append(convolve(shape, dtype, blocking, spec, x, w))
        assert outs[0].tobytes() == outs[1].tobytes(), f"{spec}: 1 and 2 threads differ"
    assert_conv_close(outs[0], x, w, shape.stride, shape.pad, dtype)


def test_thread_count_from_the_environment():
    """TPPASM_NUM_THREADS=1 and =2 in fresh processes: the pool has that many threads and the
    convolution the same bits."""
    code = ("import hashlib, numpy as np, loops; from bench.conv_nest import Blocking, Conv, ConvNest; "
            "from tppasm.conv_layout import block_activations, block_weights; "
            "sh = Conv(n=1, c=5, k=16, h=9, w=7, r=3, s=3, stride=2, pad=2); rng = np.random.default_rng(0); "
            "x = rng.standard_normal((1, 5, 9, 7)).astype(np.float32); "
            "w = rng.standard_normal((16, 5, 3, 3)).astype(np.float32); "
            "nest = ConvNest(sh, 'f32', Blocking(bc=4, bk=8), spec='ACDebfg'); y = nest.output(); "
            "nest(block_activations(x, 4, 2), block_weights(w, 4, 8), y); "
            "print(loops.get_num_threads(), hashlib.sha256(y.tobytes()).hexdigest())")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    outs = []
    for n in ("1", "2"):
        env = dict(os.environ, TPPASM_NUM_THREADS=n, PYTHONPATH=root)
        run = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        outs.append(run.stdout.split())
    assert [o[0] for o in outs] == ["1", "2"] and outs[0][1] == outs[1][1]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("batch", ["c", "r", "s"])
def test_non_finite_inputs_propagate_as_in_torch(batch, dtype):
    """NaN and +-inf in the activations give NaN and inf exactly where torch's float64 conv2d does
    (inf in a weight tap that never meets the padding, likewise)."""
    torch = pytest.importorskip("torch")
    shape = Conv(n=1, c=4, k=8, h=6, w=5, r=3, s=3, pad=1)
    x, w = operands(shape, dtype, 3)
    x[0, 1, 2, 3], x[0, 2, 0, 0], x[0, 3, 5, 4] = np.inf, np.nan, -np.inf
    w[5, 0, 1, 1] = np.inf                               # the centre tap: never over the padding
    nest = ConvNest(shape, dtype, Blocking(bc=4, bk=8, batch=batch))
    y = nest.output()
    y[...] = 7
    nest(block_activations(x, 4, 1), block_weights(w, 4, 8, dtype), y)
    got = unblock_activations(y).astype(np.float64)
    want = torch.nn.functional.conv2d(torch.from_numpy(x.astype(np.float64)), torch.from_numpy(w.astype(np.float64)),
                                      padding=1).numpy()
    assert np.isnan(want).any() and np.isinf(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))


def test_inf_weights_on_padding_rows_are_skipped_as_documented():
    """bench.conv_nest skips the filter rows over the top and bottom zero padding ("those products
    are zeros"), so inf in such a tap gives finite outputs where IEEE (torch) gives 0 * inf = NaN;
    the padding columns are still multiplied and give NaN as torch does. Pinned, not endorsed."""
    shape = Conv(n=1, c=4, k=8, h=5, w=5, r=3, s=3, pad=1)
    x, w = operands(shape, "f32", 4)
    w[3, 1, 0, 1] = np.inf                               # top row, centre column
    w[4, 1, 1, 0] = np.inf                               # centre row, left column
    nest = ConvNest(shape, "f32", Blocking(bc=4, bk=8, batch="r"))
    y = nest.output()
    nest(block_activations(x, 4, 1), block_weights(w, 4, 8), y)
    got = unblock_activations(y)
    want = conv2d_reference(x, w, 1, 1)
    assert np.isnan(want[0, 3, 0]).all() and np.isfinite(got[0, 3, 0]).all()
    np.testing.assert_array_equal(np.isnan(got[0, 4]), np.isnan(want[0, 4]))
    assert np.isnan(got[0, 4, :, 0]).all()


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_nest_called_again_computes_the_new_operands(dtype):
    """The bf16 partial sums go through a scratch the nest keeps: a second call with other operands
    (and torch tensors, bf16 too) gives their convolution, not a blend with the first."""
    torch = pytest.importorskip("torch")
    shape = Conv(n=2, c=6, k=16, h=5, w=7, r=3, s=3, stride=2, pad=3)
    nest = ConvNest(shape, dtype, Blocking(bc=4, bk=8, batch="c", cstep=1))
    for seed in (1, 2):
        x, w = operands(shape, dtype, seed)
        xt = torch.from_numpy(block_activations(x, 4, 3, "f32"))
        wt = torch.from_numpy(block_weights(w, 4, 8, "f32")) if dtype == "f32" else block_weights(w, 4, 8, dtype)
        y = torch.full(nest.output().shape, float("nan"), dtype=torch.float32 if dtype == "f32" else torch.bfloat16)
        nest(xt.bfloat16() if dtype == "bf16" else xt, wt, y)
        assert_conv_close(unblock_activations(y.float().numpy()).astype(np.float64), x, w, 2, 3, dtype, f"call {seed}")


@pytest.mark.parametrize("spec, message", [
    ("aBcdefg", r"loop 'b' is declared parallel=False; write it lower case 'b'"),
    ("aFcdebg", r"loop 'f' is declared parallel=False"),
    ("Acdeb", r"loop 'f' does not appear; write every declared loop"),
    ("Acdebfgh", r"use letters a-g"),
    ("AcdEbfg", r"not adjacent to the parallel run"),
    ("", r"must be a non-empty string"),
    (None, r"must be a non-empty string"),
])
def test_bad_specs_are_refused_with_the_fix(spec, message):
    with pytest.raises(ValueError, match=message):
        ConvNest(Conv(n=1, c=4, k=8, h=5, w=5, r=3, s=3, pad=1), "f32", Blocking(bc=4, bk=8), spec=spec)


@pytest.mark.parametrize("make, message", [
    (lambda: ConvNest(Conv(1, 4, 8, 5, 5), "f16", Blocking(bc=4, bk=8)), r"ConvNest: dtype='f16'; expected 'f32' or"),
    (lambda: ConvNest(Conv(1, 4, 8, 5, 5), np.int8, Blocking(bc=4, bk=8)), r"ConvNest: dtype='i8'; expected 'f32' or"),
    (lambda: ConvNest(Conv(1, 4, 8, 5, 5), "f32", Blocking(bc=4, bk=16)), r"bk=16 must divide K=8"),
    (lambda: ConvNest(Conv(1, 4, 8, 5, 5, 3, 3, 2), "f32", Blocking(bc=4, bk=8, bw=3)), r"bw=3 must divide the 2"),
    (lambda: ConvNest(Conv(1, 12, 8, 5, 5), "f32", Blocking(bc=4, bk=8, cstep=4)), r"cstep=4 must divide the 3"),
    (lambda: ConvNest((1, 4, 8, 5, 5), "f32", Blocking()), r"shape=\(1, 4, 8, 5, 5\); expected a Conv"),
    (lambda: ConvNest(Conv(1, 4, 8, 5, 5), "f32", {"bc": 4}), r"blocking=\{'bc': 4\}; expected a Blocking"),
    (lambda: ConvNest(Conv(1, 4, 8, 5, 5), "f32", Blocking(bc=4, bk=8), pool="x"), r"pool='x': expected an isa"),
    (lambda: Conv(1, 4, 8, 1, 1, 3, 3).q, r"a 3-pixel kernel does not fit 1 pixels padded by 0; pad by at least 1"),
    (lambda: Conv(0, 4, 8, 5, 5), r"Conv: n=0; expected an int >= 1"),
])
def test_bad_nest_knobs_are_refused_with_the_fix(make, message):
    with pytest.raises((TypeError, ValueError), match=message):
        make()


@pytest.mark.parametrize("spelling, short", [(np.float32, "f32"), ("float32", "f32"), ("bfloat16", "bf16")])
def test_nest_dtype_takes_any_spelling(spelling, short):
    assert ConvNest(Conv(n=1, c=4, k=8, h=5, w=5, r=3, s=3, pad=1), spelling, Blocking(bc=4, bk=8)).dtype == short


def test_wrong_blocked_arrays_are_refused():
    nest = ConvNest(Conv(n=1, c=4, k=8, h=5, w=5, r=3, s=3, pad=1), "f32", Blocking(bc=4, bk=8))
    x, w, y = block_activations(X, 4, 1), block_weights(np.ones((8, 4, 3, 3), np.float32), 4, 8), nest.output()
    with pytest.raises(ValueError, match=r"input must be a C-contiguous array of shape \(1, 1, 7, 7, 4\)"):
        nest(x, w, y)                                     # the 4x4 image, not the 5x5 one
    x = block_activations(np.ones((1, 4, 5, 5), np.float32), 4, 1)
    with pytest.raises(ValueError, match=r"weights must be a C-contiguous array of shape \(1, 1, 3, 3, 4, 8\)"):
        nest(x, block_weights(np.ones((8, 4, 3, 3), np.float32), 4, 8, fold=True), y)
    with pytest.raises(ValueError, match="not C-contiguous"):
        nest(np.asfortranarray(x), w, y)


# -- the bench's knobs ---------------------------------------------------------------------------

ODD_LAYERS = [Conv(n=1, c=12, k=48, h=9, w=7, r=3, s=3, stride=2, pad=1),   # K off 32 and 64
              Conv(n=2, c=70, k=8, h=5, w=5),                                  # C past a 64 block, K = 8
              Conv(n=1, c=5, k=96, h=6, w=7, stride=2),                        # strided 1x1, odd C
              Conv(n=1, c=3, k=40, h=6, w=6, r=3, s=3, pad=1)]                 # AMX row spans, odd C


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("shape", ODD_LAYERS, ids=str)
def test_every_bench_knob_builds_and_gives_the_convolution(shape, dtype):
    """bench.conv.blockings for every host kind (AVX2, AVX-512, AMX; quick too; AMX's unprefetched
    variants) offers only knobs the nest takes for layers that are not ResNet-50's (it offered
    output-channel blocks of 32 and 64 whatever K), and each gives the convolution under the
    default spec; every spec candidate gives it under one blocking."""
    knobs = []
    for isa in ("avx2", "avx512", "amx"):
        for quick in (False, True):
            knobs += [b for b in bconv.blockings(shape, dtype, quick, isa) if b not in knobs]
    knobs += bconv.unprefetched(knobs[:2], dtype, amx=True)
    assert knobs and all(shape.k % b.bk == 0 for b in knobs)
    x, w = operands(shape, dtype, 9)
    for bl in knobs:
        got = convolve(shape, dtype, bl, bconv.default_spec(shape, 2), x, w)
        assert_conv_close(got, x, w, shape.stride, shape.pad, dtype, str(bl))
    for threads in (1, 2):
        set_num_threads(threads)
        for spec in bconv.spec_candidates(shape, threads):
            got = convolve(shape, dtype, knobs[-1], spec, x, w)
            assert_conv_close(got, x, w, shape.stride, shape.pad, dtype, f"{knobs[-1]} {spec}")


def test_tune_layer_on_a_layer_that_is_not_resnets():
    """bench.conv.tune_layer (quick) on a 3x3/2 layer of K = 48: it used to build bk=64 and fail."""
    shape = ODD_LAYERS[0]
    x, w = operands(shape, "f32", 11)
    nest, spec, views = bconv.tune_layer(shape, "f32", x, w, None, 1, quick=True)
    assert shape.k % nest.blocking.bk == 0 and spec in bconv.spec_candidates(shape, 1)
    assert_conv_close(bconv.result(nest, views).astype(np.float64), x, w, shape.stride, shape.pad, "f32")
