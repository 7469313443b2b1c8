"""The loop-DSL BRGEMM convolution (bench.conv_nest) against a NumPy convolution: every shape class of
ResNet-50 (1x1, 3x3, strided 1x1 and 3x3, the 7x7/2 stem with padding 3, batch 1 and > 1), every
BRGEMM batch axis, fp32 and bf16, outputs poisoned with NaN so every element must be written; the
layout helpers and the errors bad knobs or arrays raise."""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tppasm as tpp
from bench.conv import spec_candidates, spread_spec
from isa.cpu import host
from tppasm.brgemm import Brgemm
from tppasm.kernel import get_kernel
from tests.support import interp_available, run_raw
from bench.conv_nest import Blocking, Conv, ConvNest
from tppasm.conv_layout import (block_activations, block_weights, conv2d_reference, out_size,
                                unblock_activations)

BF16 = tpp.dtypes.dtype("bf16")


def run_conv(shape, dtype, blocking, spec="Acdebfg", seed=0, stream_out=None, fold_weights=False):
    """(ours, reference) as NCHW float64 for random operands rounded to ``dtype`` (weights in
    ``block_weights(..., fold=True)``'s layout with ``fold_weights``)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((shape.n, shape.c, shape.h, shape.w)).astype(np.float32)
    w = rng.standard_normal((shape.k, shape.c, shape.r, shape.s)).astype(np.float32)
    if dtype == "bf16":
        x, w = x.astype(BF16), w.astype(BF16)
    nest = ConvNest(shape, dtype, blocking, spec=spec, stream_out=stream_out)
    y = nest.output()
    y[...] = np.nan
    weights = block_weights(w, blocking.bc, blocking.bk, dtype, fold_weights)
    nest(block_activations(x, blocking.bc, shape.pad), weights, y)
    got = unblock_activations(nest.result(y)).astype(np.float64)
    assert y.dtype == tpp.dtypes.dtype(dtype)
    assert not np.isnan(got).any(), "an output element was not written"
    return got, conv2d_reference(x.astype(np.float32), w.astype(np.float32), shape.stride, shape.pad)


def assert_close(got, ref, dtype):
    """fp32: the sums' rounding; bf16: exact products, fp32 sums, the output rounded to bf16."""
    scale = np.abs(ref).max() + 1
    rtol = 0 if dtype == "f32" else 2.0 ** -8
    np.testing.assert_allclose(got / scale, ref / scale, rtol=rtol, atol=2e-6 * np.sqrt(ref.size))


CLASSES = {     # name: (Conv, bc)
    "1x1": (Conv(n=2, c=8, k=16, h=6, w=5), 4),
    "1x1 stride 2": (Conv(n=1, c=8, k=8, h=7, w=6, stride=2), 4),
    "3x3 pad 1": (Conv(n=2, c=6, k=8, h=5, w=7, r=3, s=3, pad=1), 4),
    "3x3 stride 2 pad 1": (Conv(n=1, c=8, k=8, h=9, w=8, r=3, s=3, stride=2, pad=1), 8),
    "7x7 stride 2 pad 3 (stem)": (Conv(n=2, c=3, k=8, h=12, w=11, r=7, s=7, stride=2, pad=3), 4),
    "3x3 no pad": (Conv(n=1, c=4, k=8, h=6, w=6, r=3, s=3), 4),
}


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("batch", ["c", "r", "s", "c+fold", "r+fold"])
@pytest.mark.parametrize("name", list(CLASSES))
def test_every_shape_class(name, batch, dtype):
    shape, bc = CLASSES[name]
    got, ref = run_conv(shape, dtype, Blocking(bc=bc, bk=8, batch=batch[0], fold=batch.endswith("fold")))
    assert_close(got, ref, dtype)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", list(CLASSES))
def test_spread_spec(name, dtype):
    """bench.conv.spread_spec: images, output-channel blocks and output rows (a flat layer's pixel
    blocks) in one parallel loop, on the pool's threads: every element written and right."""
    shape, bc = CLASSES[name]
    blocking = Blocking(bc=bc, bk=8, bw=shape.p * shape.q // 3 if shape.flat else 0)
    got, ref = run_conv(shape, dtype, blocking, spec=spread_spec(shape))
    assert_close(got, ref, dtype)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("name", list(CLASSES))
def test_every_spec_candidate_builds(name, n, threads):
    """bench.conv.spec_candidates offers the tuner only specs a nest accepts (no parallel
    reduction loop)."""
    shape, bc = CLASSES[name]
    shape = Conv(n, shape.c, shape.k, shape.h, shape.w, shape.r, shape.s, shape.stride, shape.pad)
    for spec in spec_candidates(shape, threads):
        ConvNest(shape, "f32", Blocking(bc=bc, bk=8), spec=spec)


@settings(max_examples=10)
@given(st.data())
def test_random_shapes_blockings_and_specs(data):
    r = data.draw(st.sampled_from([1, 3]), "r")
    stride = data.draw(st.sampled_from([1, 2]), "stride")
    pad = data.draw(st.integers(0, r // 2), "pad")
    h = data.draw(st.integers(max(1, r - 2 * pad), 9), "h")
    bc, bk = data.draw(st.sampled_from([2, 4, 6]), "bc"), data.draw(st.sampled_from([8, 16, 24]), "bk")
    c = data.draw(st.integers(1, 3 * bc), "c")
    shape = Conv(n=data.draw(st.integers(1, 3), "n"), c=c, k=bk * data.draw(st.integers(1, 2), "kb"), h=h,
                 w=data.draw(st.integers(max(1, r - 2 * pad), 9), "w"), r=r, s=r, stride=stride, pad=pad)
    cb = -(-c // bc)
    gather = shape.gatherable and data.draw(st.booleans(), "gather")
    pixels = shape.p * shape.q if shape.flat or gather else shape.q
    bw = data.draw(st.sampled_from([d for d in range(1, pixels + 1) if pixels % d == 0]), "bw")
    batch = "c" if gather else data.draw(st.sampled_from(["c", "r", "s"]), "batch")
    fold = batch != "s" and not gather and data.draw(st.booleans(), "fold")
    cstep = data.draw(st.sampled_from([d for d in range(1, cb + 1) if cb % d == 0]), "cstep")
    dtype = data.draw(st.sampled_from(["f32", "bf16"]), "dtype")
    spec = data.draw(st.sampled_from(spec_candidates(shape, 2)), "spec")
    spans = stride == 1 and not shape.flat and batch != "s" and bw == shape.q
    rows = data.draw(st.sampled_from([d for d in range(1, shape.p + 1) if shape.p % d == 0]), "rows") if spans else 1
    got, ref = run_conv(shape, dtype, Blocking(bc=bc, bk=bk, bw=bw, batch=batch, cstep=cstep, fold=fold, rows=rows,
                                               gather=gather), spec)
    assert_close(got, ref, dtype)


@settings(max_examples=12)
@given(st.data())
def test_gathered_strided_1x1(data):
    """gather=True: a strided 1x1 layer's pixels copied together and run as a flat GEMM, every
    output element written and right for any stride, size, pixel block, channel step and spec;
    the pixels it skips hold NaN (any read of them would show); run() copies the pixels again
    from the input views() was given, so a changed input gives the new result."""
    stride = data.draw(st.integers(2, 3), "stride")
    h, w = (data.draw(st.integers(1, 11), name) for name in ("h", "w"))
    bc, bk = data.draw(st.sampled_from([2, 4, 8]), "bc"), data.draw(st.sampled_from([8, 16]), "bk")
    c = bc * data.draw(st.integers(1, 3), "cb")
    shape = Conv(n=data.draw(st.integers(1, 3), "n"), c=c, k=bk * data.draw(st.integers(1, 2), "kb"), h=h, w=w,
                 stride=stride)
    pixels = shape.p * shape.q
    bw = data.draw(st.sampled_from([d for d in range(1, pixels + 1) if pixels % d == 0]), "bw")
    cstep = data.draw(st.sampled_from([d for d in range(1, c // bc + 1) if (c // bc) % d == 0]), "cstep")
    dtype = data.draw(st.sampled_from(["f32", "bf16"]), "dtype")
    spec = data.draw(st.sampled_from(spec_candidates(shape, 2)), "spec")
    nest = ConvNest(shape, dtype, Blocking(bc=bc, bk=bk, bw=bw, cstep=cstep, gather=True), spec=spec)
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    x, wt = (rng.standard_normal(s).astype(np.float32).astype(tpp.dtypes.dtype(dtype))
             for s in ((shape.n, c, h, w), (shape.k, c, 1, 1)))
    xb = block_activations(x, bc)
    read = np.zeros(xb.shape, bool)
    read[:, :, ::stride, ::stride] = True
    xb[~read] = np.nan
    y = nest.output()
    views = nest.views(xb, block_weights(wt, bc, bk, dtype), y)
    for x_now in (x, 2 * x + 1):
        xb[read] = block_activations(x_now, bc)[read]
        y[...] = np.nan
        nest.run(*views)
        ref = conv2d_reference(x_now.astype(np.float32), wt.astype(np.float32), stride, 0)
        assert_close(unblock_activations(y).astype(np.float64), ref, dtype)


ROW_SHAPES = [Conv(n=2, c=8, k=16, h=4, w=5, r=3, s=3, pad=1), Conv(n=1, c=6, k=8, h=6, w=6, r=3, s=3),
              Conv(n=1, c=4, k=8, h=4, w=3, r=5, s=5, pad=2), Conv(n=1, c=3, k=8, h=7, w=7, r=3, s=3, pad=1)]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("batch", ["c", "r", "c+fold", "r+fold"])
@pytest.mark.parametrize("shape", ROW_SHAPES, ids=str)
def test_rows_through_the_padded_width(shape, batch, dtype):
    """BRGEMMs over several output rows (rows > 1): every output element written and right, for
    every divisor of P, over 1 and 2 channel blocks; the output keeps the padded width, whose
    extra columns :meth:`ConvNest.result` leaves out."""
    for rows in [d for d in range(2, shape.p + 1) if shape.p % d == 0]:
        blocking = Blocking(bc=4, bk=8, batch=batch[0], fold=batch.endswith("fold"), rows=rows)
        nest = ConvNest(shape, dtype, blocking)
        assert nest.m == (rows - 1) * nest.wp + shape.q and nest.output().shape[3] == nest.wp
        got, ref = run_conv(shape, dtype, blocking)
        assert_close(got, ref, dtype)


@settings(max_examples=12)
@given(st.data())
def test_padding_rows_are_not_multiplied(data):
    """An output row takes only the filter rows over the image (a shorter batch with batch="r",
    no call for the others with "c" and "s"), so NaN in the top and bottom padding rows of the
    input changes nothing (any product with them would be NaN); bf16 converts each tile once."""
    r = data.draw(st.sampled_from([3, 5, 7]), "r")
    pad = data.draw(st.integers(1, r // 2), "pad")
    h, w = (data.draw(st.integers(max(1, r - 2 * pad), 9), name) for name in ("h", "w"))
    c = data.draw(st.sampled_from([4, 8]), "c")                    # one or two channel blocks
    shape = Conv(n=1, c=c, k=8, h=h, w=w, r=r, s=r, stride=data.draw(st.sampled_from([1, 2]), "stride"), pad=pad)
    dtype = data.draw(st.sampled_from(["f32", "bf16"]), "dtype")
    batch = data.draw(st.sampled_from(["c", "r", "s"]), "batch")
    blocking = Blocking(bc=4, bk=8, batch=batch, fold=batch != "s" and data.draw(st.booleans(), "fold"))
    nest = ConvNest(shape, dtype, blocking)
    assert nest.edge_rows and all(0 <= lo < hi <= r for _, lo, hi in nest.edge_rows)
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((8, c, r, r)).astype(np.float32)
    if dtype == "bf16":
        x, wt = x.astype(BF16), wt.astype(BF16)
    xb = block_activations(x, 4, pad)
    xb[:, :, :pad] = np.nan
    xb[:, :, pad + h:] = np.nan
    y = nest.output()
    y[...] = np.nan
    nest(xb, block_weights(wt, 4, 8, dtype), y)
    ref = conv2d_reference(x.astype(np.float32), wt.astype(np.float32), shape.stride, pad)
    assert_close(unblock_activations(y).astype(np.float64), ref, dtype)


def test_blocked_output_rows_and_loop_blocks():
    shape = Conv(n=2, c=8, k=32, h=6, w=6, r=3, s=3, pad=1)
    got, ref = run_conv(shape, "f32", Blocking(bc=4, bk=8, bw=3, kblock=2, hblock=2), spec="Acdcdebfg")
    assert_close(got, ref, "f32")


def test_flat_1x1_spans_output_rows():
    shape = Conv(n=1, c=8, k=8, h=4, w=3)              # 12 pixels, 6 per BRGEMM: two output rows each
    got, ref = run_conv(shape, "f32", Blocking(bc=8, bk=8, bw=6))
    assert_close(got, ref, "f32")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_flat_1x1_streaming_its_input(dtype):
    """A whole 8x8 image per BRGEMM against 16 output channels: the x86 kernel streams A (no batch
    chunks, next-tile prefetches; tppasm.x86.brgemm.Gen.streams_a), as ResNet-50's 56x56 1x1
    layers do, and the convolution still matches."""
    shape, bl = Conv(n=2, c=32, k=32, h=8, w=8), Blocking(bc=16, bk=16, bw=64)
    if host().arch == "x86_64":
        from tppasm.x86.brgemm import Gen, target_features
        desc = Brgemm(m=64, n=16, k=16, dtype=dtype, lda=16, ldb=16, ldc=16, stride_a=8 * 8 * 16, stride_b=16 * 16)
        isa = "avx512" if host().isa == "amx" else host().isa      # (AMX hosts: bf16 runs on tiles)
        assert Gen(desc, isa, target_features(isa)).streams_a()
    got, ref = run_conv(shape, dtype, bl)
    assert_close(got, ref, dtype)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("shape, bc, batch", [
    (Conv(n=2, c=3, k=8, h=12, w=11, r=7, s=7, stride=2, pad=3), 3, "r"),     # the stem, odd bc
    (Conv(n=1, c=5, k=16, h=6, w=7, r=3, s=3, pad=1), 5, "c"),                  # odd bc, one block
    (Conv(n=1, c=10, k=8, h=5, w=5, r=3, s=3, pad=1), 5, "r"),                  # two odd channel blocks
    (Conv(n=1, c=8, k=8, h=5, w=6, r=3, s=3, pad=1), 4, "c")])                  # even bc: either layout
def test_folded_weights(shape, bc, batch, dtype):
    """fold=True nests take block_weights(..., fold=True): in bf16 its VNNI2 pairs run over a
    filter row's S*bc values, so an odd bc (a 3-channel input) needs no zero channel; bf16 with an
    odd bc and no fold is refused, naming fold=True."""
    blocking = Blocking(bc=bc, bk=8, batch=batch, fold=True)
    got, ref = run_conv(shape, dtype, blocking, fold_weights=True)
    assert_close(got, ref, dtype)
    if bc % 2 == 0:
        again, _ = run_conv(shape, dtype, blocking)
        np.testing.assert_array_equal(again, got)
    elif dtype == "bf16":
        with pytest.raises(ValueError, match="fold=True"):
            ConvNest(shape, dtype, Blocking(bc=bc, bk=8, batch=batch))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("shape, blocking", [
    (Conv(n=2, c=32, k=32, h=8, w=8), Blocking(bc=16, bk=16, bw=64)),                 # flat, streams A
    (Conv(n=2, c=32, k=48, h=9, w=9, stride=2), Blocking(bc=16, bk=16)),              # strided 1x1
    (Conv(n=1, c=32, k=32, h=6, w=6, r=3, s=3, pad=1), Blocking(bc=16, bk=32, batch="r", fold=True))])
def test_streamed_output(shape, blocking, dtype):
    """stream_out=True: a one-call reduction stores the output around the caches (the BRGEMM's
    stream_c) and still matches; a reduction over several calls (the 3x3, or bf16 through its
    fp32 scratch) keeps plain stores, since it reads its partial sums back, and warns so."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nest = ConvNest(shape, dtype, blocking, stream_out=True)
        got, ref = run_conv(shape, dtype, blocking, stream_out=True)
    assert nest.stream_out == nest.single == (shape.r == 1)
    assert bool(caught) == (not nest.single) and all("has no effect" in str(w.message) for w in caught)
    assert_close(got, ref, dtype)
    assert not ConvNest(shape, dtype, blocking).stream_out            # small outputs: plain stores


@pytest.mark.parametrize("isa, dtype", [("avx2", "f32"), ("avx2", "bf16"), ("avx512", "f32"), ("avx512", "bf16"),
                                         ("amx", "bf16")])
def test_brgemm_reads_overlapping_a_rows(isa, dtype):
    """lda < k (what fold=True builds): rows of A overlap; natively where the host runs the ISA,
    else in the interpreter on a buffer that ends at A's last element."""
    m, n, k, lda, count = 5, 24, 12, 4, 2
    rng = np.random.default_rng(4)
    dt = tpp.dtypes.dtype(dtype)
    buf = rng.standard_normal(count * 40).astype(np.float32).astype(dt)
    a = np.lib.stride_tricks.as_strided(buf, (count, m, k), (40 * dt.itemsize, lda * dt.itemsize, dt.itemsize))
    assert (count - 1) * 40 + (m - 1) * lda + k <= buf.size
    b = rng.standard_normal((count, k, n)).astype(np.float32).astype(dt)
    bop = tpp.vnni_pack(b, 2) if dtype == "bf16" else b
    kernel = get_kernel(Brgemm(m=m, n=n, k=k, lda=lda, stride_a=40, dtype=dtype), isa)
    c = np.full((m, n), np.nan, np.float32)
    if isa in host().levels:
        kernel(a, bop, c, count=count)
    elif interp_available():
        run_raw(kernel, [buf, bop, c], [count])
    else:
        pytest.skip(f"no {isa} and no interpreter")
    ref = sum(a[i].astype(np.float64) @ b[i].astype(np.float64) for i in range(count))
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-5)


def test_layouts_round_trip():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 3, 4)).astype(np.float32)
    xb = block_activations(x, 4, pad=2)
    assert xb.shape == (2, 2, 7, 8, 4) and xb.ctypes.data % 64 == 0
    assert (xb[:, :, :2] == 0).all() and (xb[:, 1, :, :, 1:] == 0).all()       # rim and channels past C
    assert (unblock_activations(xb, channels=5, pad=2) == x).all()
    w = rng.standard_normal((8, 6, 3, 3)).astype(np.float32)
    wb = block_weights(w, 2, 4)
    assert wb.shape == (2, 3, 3, 3, 2, 4) and wb[1, 2, 0, 1, 1, 3] == w[7, 5, 0, 1]
    wv = block_weights(w, 2, 4, dtype="bf16")
    assert wv.shape == (2, 3, 3, 3, 1, 4, 2) and wv[1, 2, 0, 1, 0, 3, 1] == w[7, 5, 0, 1].astype(BF16)


def test_reference_convolution_by_hand():
    x = np.zeros((1, 1, 3, 3))
    x[0, 0, 1, 1] = 1.0
    w = np.arange(9.0).reshape(1, 1, 3, 3)
    assert conv2d_reference(x, w, 1, 1)[0, 0].tolist() == [[8, 7, 6], [5, 4, 3], [2, 1, 0]]
    assert conv2d_reference(x, w, 2, 1)[0, 0].tolist() == [[8, 6], [2, 0]]


@pytest.mark.parametrize("call, message", [
    (lambda: ConvNest(Conv(1, 4, 8, 4, 4), "f32", Blocking(bc=4, bk=3)), "bk=3 must divide K=8"),
    (lambda: ConvNest(Conv(1, 4, 8, 4, 4, 3, 3), "f32", Blocking(bc=4, bk=8, bw=3)), "bw=3 must divide"),
    (lambda: ConvNest(Conv(1, 12, 8, 4, 4), "f32", Blocking(bc=4, bk=8, cstep=2)), "cstep=2 must divide"),
    (lambda: ConvNest(Conv(1, 4, 8, 4, 4), "bf16", Blocking(bc=3, bk=8)), "bc=3 must be even, or fold=True"),
    (lambda: ConvNest(Conv(1, 3, 8, 8, 8, stride=2), "bf16", Blocking(bc=3, bk=8, gather=True)),
     "bc=3 must be even (gather=True takes no fold)"),
    (lambda: ConvNest(Conv(1, 4, 8, 4, 4), "f16", Blocking(bc=4, bk=8)), "dtype='f16'"),
    (lambda: ConvNest(Conv(1, 4, 8, 4, 4), "f32", Blocking(bc=4, bk=8, batch="k")), "batch='k'"),
    (lambda: ConvNest(Conv(1, 4, 8, 4, 4), "f32", Blocking(bc=4, bk=8, batch="s", fold=True)), "use batch='c' or 'r'"),
    (lambda: Conv(1, 4, 8, 2, 2, 5, 5).p, "does not fit"),
    (lambda: ConvNest(Conv(1, 4, 8, 5, 5, 3, 3, 2), "f32", Blocking(bc=4, bk=8, rows=2)), "needs stride 1"),
    (lambda: ConvNest(Conv(1, 4, 8, 4, 4), "f32", Blocking(bc=4, bk=8, rows=2)), "not a flat 1x1"),
    (lambda: ConvNest(Conv(1, 4, 8, 4, 4, 3, 3, 1, 1), "f32", Blocking(bc=4, bk=8, batch="s", rows=2)), "batch='c' or 'r'"),
    (lambda: ConvNest(Conv(1, 4, 8, 4, 4, 3, 3, 1, 1), "f32", Blocking(bc=4, bk=8, bw=2, rows=2)), "bw=0, not 2"),
    (lambda: ConvNest(Conv(1, 4, 8, 4, 4, 3, 3, 1, 1), "f32", Blocking(bc=4, bk=8, rows=3)), "divide the 4 output rows"),
    (lambda: ConvNest(Conv(1, 4, 8, 4, 4, 3, 3, 1, 1), "f32", Blocking(bc=4, bk=8, rows=0)), "rows=0"),
    (lambda: ConvNest(Conv(1, 4, 8, 4, 4, 3, 3, 1, 1), "f32", Blocking(bc=4, bk=8, rows=2, hblock=3)), "multiple of rows"),
    (lambda: ConvNest(Conv(1, 4, 8, 4, 4, 3, 3, 2, 1), "f32", Blocking(bc=4, bk=8, gather=True)), "is not one"),
    (lambda: ConvNest(Conv(1, 4, 8, 4, 4), "f32", Blocking(bc=4, bk=8, gather=True)), "use gather=False"),
    (lambda: ConvNest(Conv(1, 4, 8, 4, 4, stride=2), "f32", Blocking(bc=4, bk=8, batch="r", gather=True)),
     "use batch='c', fold=False, rows=1"),
    (lambda: block_weights(np.ones((4, 4, 1, 1)), 3, 4, dtype="bf16"), "bc=3 must be even"),
    (lambda: block_activations(np.ones((4, 4, 1)), 4), "NCHW"),
    (lambda: out_size(5, 3, 0), "stride=0"),
    (lambda: unblock_activations(np.ones((1, 1, 4, 4, 2)), pad=0.5), "pad=0.5; expected an int >= 0"),
    (lambda: unblock_activations(np.ones((1, 1, 4, 4, 2)), channels=1.5), "channels=1.5; expected an int >= 1"),
    (lambda: unblock_activations(np.ones((1, 1, 4, 4, 2)), channels=True), "channels=True"),
    (lambda: block_weights(np.ones((2, 2, 1, 1)), 2, 2, fold="no"), "fold='no'; expected True"),
])
def test_bad_knobs_are_explained(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_wrong_arrays_are_explained():
    nest = ConvNest(Conv(1, 4, 8, 4, 4, 3, 3, pad=1), "f32", Blocking(bc=4, bk=8))
    x, w, y = tpp.empty((1, 1, 6, 6, 4)), tpp.empty((1, 1, 3, 3, 4, 8)), nest.output()
    with pytest.raises(ValueError, match=r"input must be a C-contiguous array of shape \(1, 1, 6, 6, 4\)"):
        nest(x[:, :, :5], w, y)
    with pytest.raises(ValueError, match="weights must be"):
        nest(x, w.astype(np.float64)[..., :4], y)
    with pytest.raises(Exception, match="dtype"):
        nest(x.astype(np.float64), w, y)
    with pytest.raises(Exception, match="read-only"):
        y.flags.writeable = False
        nest(x, w, y)


def test_python_mode_matches_and_explain_shows_the_nest():
    shape = Conv(n=2, c=4, k=8, h=5, w=5, r=3, s=3, pad=1)
    nest = ConvNest(shape, "f32", Blocking(bc=4, bk=8, batch="r", fold=True), spec="Acdebfg")
    rng = np.random.default_rng(2)
    x = block_activations(rng.standard_normal((2, 4, 5, 5)).astype(np.float32), 4, pad=1)
    w = block_weights(rng.standard_normal((8, 4, 3, 3)).astype(np.float32), 4, 8)
    y1, y2 = nest.output(), nest.output()
    y1[...] = y2[...] = np.nan
    nest(x, w, y1)
    nest.lk.python(*nest.views(x, w, y2))
    np.testing.assert_allclose(y1, y2, rtol=1e-5, atol=1e-5)
    text = nest.lk.explain(*nest.views(x, w, y1))
    assert "for (n) in share(tid" in text and "brgemm(X[n, cb, oh:oh + 3, ow + s:ow + s + 5], W[kb, cb, 0:3]" in text


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("name", ["1x1", "3x3 pad 1", "7x7 stride 2 pad 3 (stem)"])
def test_blocking_without_prefetches(name, dtype, monkeypatch):
    """Blocking(prefetch=False): every BRGEMM of the nest is built with prefetch=False (what
    bench.conv's final round tries on AMX hosts), and the result is right; 'no' is refused."""
    shape, bc = CLASSES[name]
    built, brgemm = [], tpp.brgemm
    monkeypatch.setattr(tpp, "brgemm", lambda *args, **kw: built.append(kw.get("prefetch")) or brgemm(*args, **kw))
    got, ref = run_conv(shape, dtype, Blocking(bc=bc, bk=8, batch="r", prefetch=False))
    assert_close(got, ref, dtype)
    assert built and not any(built)
    with pytest.raises(ValueError, match="prefetch='no'; expected True or False"):
        Blocking(prefetch="no")
