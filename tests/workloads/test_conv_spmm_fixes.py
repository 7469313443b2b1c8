"""Regression tests for the convolution and block-sparse defects a fuzzing pass found (fz10b): an
unsigned rowptr that decreases, conv2d_reference's inputs, ConvNest/Conv/Blocking knobs and
operands, random_block_sparse's integer dtypes, bench spmm's % peak at sparsity 1, and the layout
helpers' dtypes and sizes."""
import warnings

import numpy as np
import pytest

import bench.spmm as bench_spmm
from bench.common import Report
from bench.conv_nest import Blocking, Conv, ConvNest
from tppasm.conv_layout import (block_activations, block_weights, conv2d_reference, unblock_activations)
from tppasm.dtypes import DtypeError
from tppasm.operand import OperandError
from tppasm.spmm import bcsr, check_bcsr, random_block_sparse

LAYER = Conv(n=1, c=4, k=8, h=3, w=3, r=3, s=3, pad=1)          # a 3x3: several calls per output tile


@pytest.fixture(scope="module")
def torch():
    """torch, imported once (seconds) outside the tests' own time; skipped where it is not installed."""
    return pytest.importorskip("torch")


# -- check_bcsr ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.uint32, np.uint64])
def test_check_bcsr_refuses_a_decreasing_rowptr_of_any_integer_dtype(dtype):
    with pytest.raises(ValueError, match=r"rowptr decreases at block row 1 \(2 then 1\)"):
        check_bcsr(np.array([0, 2, 1], dtype), np.zeros(2, np.int32), 2, 4)
    check_bcsr(np.array([0, 1, 2], dtype), np.zeros(2, np.int32), 2, 4)          # non-decreasing: fine


# -- conv2d_reference ------------------------------------------------------------------------------

def test_conv2d_reference_takes_bf16_torch_tensors(torch):
    x = torch.arange(8, dtype=torch.bfloat16).reshape(1, 2, 2, 2)
    w = torch.ones(3, 2, 1, 1, dtype=torch.bfloat16)
    ref = conv2d_reference(x.float().numpy(), w.float().numpy())
    np.testing.assert_array_equal(conv2d_reference(x, w), ref)


def test_conv2d_reference_refuses_masked_and_complex_inputs():
    x = np.ma.masked_array(np.ones((1, 1, 2, 2)), mask=[[[[True, False], [False, False]]]])
    with pytest.raises(OperandError, match=r"conv2d_reference: x is a NumPy masked array.*filled"):
        conv2d_reference(x, np.ones((1, 1, 1, 1)))
    with pytest.raises(DtypeError, match=r"conv2d_reference: w holds complex128; expected real numbers.*w\.real"):
        conv2d_reference(np.ones((1, 1, 2, 2)), np.ones((1, 1, 1, 1), complex))


@pytest.mark.parametrize("kwargs, message", [
    (dict(pad=(1, 0)), r"conv2d_reference: pad=\(1, 0\); expected one int >= 0.*asymmetric padding is not supported"),
    (dict(stride=0), r"conv2d_reference: stride=0; expected one int >= 1"),
    (dict(pad=10 ** 6), r"conv2d_reference: with pad=1000000 the array would be .* GiB, more than this machine's"),
])
def test_conv2d_reference_names_its_bad_stride_and_pad(kwargs, message):
    with pytest.raises(ValueError, match=message):
        conv2d_reference(np.ones((1, 1, 2, 2)), np.ones((1, 1, 1, 1)), **kwargs)


# -- layout helpers --------------------------------------------------------------------------------

@pytest.mark.parametrize("call, message", [
    (lambda: block_activations(np.ones((1, 1, 1, 1), np.complex64), 1), r"block_activations: x holds complex64"),
    (lambda: block_activations(np.array([[[["a"]]]]), 1), r"block_activations: x holds <U1"),
    (lambda: block_weights(np.ones((1, 1, 1, 1), np.complex64), 1, 1), r"block_weights: w holds complex64"),
    (lambda: block_weights(np.array([[[["a"]]]]), 1, 1), r"block_weights: w holds <U1"),
    (lambda: unblock_activations(np.ones((1, 1, 1, 1, 1), bool)), r"unblock_activations: xb holds bool"),
])
def test_layout_helpers_refuse_what_is_not_real_numbers(call, message):
    with pytest.raises(DtypeError, match=message + r"; expected real numbers: a float .* or integer array"):
        call()


@pytest.mark.parametrize("call, knobs", [
    (lambda: block_activations(np.ones((1, 3, 4, 4), np.float32), 2, pad=10 ** 6), "bc=2 and pad=1000000"),
    (lambda: block_weights(np.ones((2, 3, 1, 1), np.float32), 2 ** 40, 1), "bc=1099511627776"),
])
def test_layout_helpers_name_the_knob_of_an_impossible_size(call, knobs):
    with pytest.raises(ValueError, match=f"with {knobs} the array would be .* GiB, more than this machine's"):
        call()


# -- Conv, Blocking, ConvNest ----------------------------------------------------------------------

@pytest.mark.parametrize("make, message", [
    (lambda: Blocking(bc=0), r"Blocking: bc=0; expected an int >= 1 \(input channels per block\), "
                             r"e\.g\. Blocking\(\.\.\., bc=64\)"),
    (lambda: Blocking(bk=0), r"Blocking: bk=0; expected an int >= 1"),
    (lambda: Blocking(bc=-4), r"Blocking: bc=-4; expected an int >= 1"),
    (lambda: Blocking(bc=True), r"Blocking: bc=True; expected an int >= 1"),
    (lambda: Blocking(bw=-1), r"Blocking: bw=-1; expected an int >= 0 \(output pixels per BRGEMM"),
    (lambda: Blocking(batch="r", cstep=-7), r"Blocking: cstep=-7; expected an int >= 0"),
    (lambda: Blocking(kblock=-5), r"Blocking: kblock=-5; expected an int >= 1"),
    (lambda: Blocking(hblock=0), r"Blocking: hblock=0; expected an int >= 1"),
    (lambda: Blocking(rows=2.0), r"Blocking: rows=2\.0; expected an int >= 1"),
    (lambda: Blocking(fold="yes"),
     r"Blocking: fold='yes'; expected True or False, e\.g\. Blocking\(\.\.\., fold=True\)"),
    (lambda: Blocking(gather=1), r"Blocking: gather=1; expected True or False"),
    (lambda: Blocking(batch="k"), r"Blocking: batch='k'; expected one of \('c', 'r', 's'\)"),
    (lambda: Conv(n=1, c=0, k=8, h=3, w=3), r"Conv: c=0; expected an int >= 1 \(input channels\), e\.g\. Conv\("),
    (lambda: Conv(n=-1, c=4, k=8, h=3, w=3), r"Conv: n=-1; expected an int >= 1 \(images\)"),
    (lambda: Conv(n=1, c=2.5, k=8, h=3, w=3), r"Conv: c=2\.5; expected an int >= 1"),
    (lambda: Conv(n=1, c=4, k=8, h=3, w=3, pad=-1), r"Conv: pad=-1; expected an int >= 0"),
    (lambda: ConvNest(LAYER, "f32", Blocking(bc=4, bk=8), stream_out="no"),
     r"ConvNest: stream_out='no'; expected None \(stream large outputs\), True or False"),
    (lambda: ConvNest(LAYER, "f32", Blocking(bc=4, bk=8), stream_out=1), r"ConvNest: stream_out=1; expected None"),
])
def test_bad_knobs_name_the_knob_its_range_and_an_example(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_numpy_integer_knobs_are_taken_as_ints():
    shape = Conv(n=np.int64(1), c=np.int32(4), k=8, h=3, w=3)
    assert type(shape.c) is int and repr(shape) == repr(Conv(n=1, c=4, k=8, h=3, w=3))
    assert Blocking(bc=np.int64(4), fold=np.True_).fold is True


def test_stream_out_true_without_effect_warns():
    with pytest.warns(UserWarning, match=r"stream_out=True has no effect on 4->8 3x3.*several calls per output tile"):
        assert not ConvNest(LAYER, "f32", Blocking(bc=4, bk=8), stream_out=True).stream_out
    with warnings.catch_warnings():
        warnings.simplefilter("error")               # where it does take effect: no warning
        assert ConvNest(Conv(n=1, c=16, k=16, h=4, w=4), "f32", Blocking(bc=16, bk=16), stream_out=True).stream_out


def test_conv_nest_takes_torch_tensors_as_zero_copy_views(torch):
    nest = ConvNest(LAYER, "f32", Blocking(bc=4, bk=8))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 3, 3)).astype(np.float32)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    y = torch.from_numpy(nest.output())
    y.fill_(float("nan"))
    version = y._version
    nest(torch.from_numpy(block_activations(x, 4, 1)), torch.from_numpy(block_weights(w, 4, 8)), y)
    np.testing.assert_allclose(unblock_activations(y.numpy()), conv2d_reference(x, w, 1, 1), rtol=1e-4, atol=1e-4)
    assert y._version > version                      # autograd told that y changed in place
    with pytest.raises(ValueError, match=r"conv: input of shape \(1, 1, 5, 5, 4\) is not C-contiguous.*contiguous\(\)"):
        nest(torch.from_numpy(block_activations(x, 4, 1)).transpose(2, 3), block_weights(w, 4, 8), y)


# -- random_block_sparse ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["i8", "i32", "u8", np.int16, "f32", "bf16"])
@pytest.mark.parametrize("sparsity", [0.0, 0.5])
def test_random_block_sparse_keeps_its_exact_block_count_in_every_dtype(dtype, sparsity):
    for block in (1, 2):
        a = random_block_sparse(32, 32, block, block, sparsity, np.random.default_rng(0), dtype)
        blocks = (32 // block) ** 2
        assert int(bcsr(a, block, block)[0][-1]) == blocks - round(sparsity * blocks)


@pytest.mark.parametrize("dtype", [bool, np.complex64, "U1"])
def test_random_block_sparse_refuses_dtypes_without_normal_values(dtype):
    with pytest.raises(DtypeError, match=r"random_block_sparse: dtype=.*; expected a float .* or integer dtype"):
        random_block_sparse(4, 4, 2, 2, 0.5, np.random.default_rng(0), dtype)


# -- bench spmm ------------------------------------------------------------------------------------

def test_bench_spmm_gives_0_percent_peak_without_stored_blocks(monkeypatch, torch):
    """Sparsity 1 stores no block: no flops done, so 0% of the peak (and no peak loop timed)."""
    asked = []
    monkeypatch.setattr(bench_spmm, "peak_loop", lambda dtype, work, threads: asked.append(work) or (None, 1.0))
    monkeypatch.setattr(bench_spmm, "versus", lambda ours, theirs, rounds, peak_loop: (
        ours(), theirs(), (1e-3, 1e-3, 1.0) + ((0.5,) if peak_loop else ()))[-1])
    monkeypatch.setattr(bench_spmm, "quick_seconds", lambda fn, seconds: 1e-3)
    rep = Report("spmm", ["dtype", "block", "sparsity", "stored blocks", "ms ours", "ms torch dense", "ms torch csr",
                          "ms torch bsr", "GFLOP/s", "% peak", "ours/dense"])
    nest = bench_spmm.SpmmNest(64, 64, 64, 8, 8, "f32", 64)
    for sparsity in (1.0, 0.5):
        bench_spmm.bench_point(rep, 64, 8, sparsity, "f32", nest, torch, 1, np.random.default_rng(0), 1)
    assert [row["% peak"] for row in rep.rows] == [0.0, 50.0]
    assert len(asked) == 1 and asked[0] > 0 and rep.rows[0]["peak_gflops"] is None
