"""The layout helpers: cache-line-aligned allocation, blocking and VNNI packing against naive references."""
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tppasm
from tppasm.dtypes import DTYPES

dims = st.integers(0, 9)


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(dims, min_size=0, max_size=3), name=st.sampled_from(sorted(DTYPES)),
       align=st.sampled_from([1, 16, 64, 256, 4096]))
def test_empty_is_aligned_and_writable(shape, name, align):
    x = tppasm.empty(shape, name, align)
    assert x.shape == tuple(shape) and x.dtype == DTYPES[name] and x.flags.c_contiguous and x.flags.writeable
    assert x.ctypes.data % align == 0
    x[...] = 3
    assert (x.astype(np.float64) == 3).all()


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 9), start=st.integers(0, 3), step=st.integers(1, 2))
def test_aligned_copies_only_when_needed(rows, cols, start, step):
    base = np.arange(rows * (cols * step + start), dtype=np.float32).reshape(rows, cols * step + start)
    view = base[:, start::step][:, :cols]
    out = tppasm.aligned(view)
    assert out.ctypes.data % 64 == 0 and out.flags.c_contiguous and (out == view).all()
    assert tppasm.aligned(out) is out


@pytest.mark.parametrize("align", [0, 3, 48, -64, 2.0, True])
def test_bad_alignment_says_what_is_legal(align):
    with pytest.raises(ValueError, match="power of two"):
        tppasm.empty((2, 2), "f32", align)


def test_bad_shape_and_dtype():
    with pytest.raises(ValueError, match="non-negative"):
        tppasm.empty((2, -1))
    with pytest.raises(TypeError, match="tppasm name"):
        tppasm.empty((2,), "no-such-type")
    with pytest.raises(TypeError, match="holds Python objects"):
        tppasm.empty((2,), object)
    for code, numpy_name in (("f16", "float128"), ("f8", "float64")):    # NumPy counts bytes, tppasm bits
        with pytest.raises(TypeError, match=f"NumPy reads '{code}' as {numpy_name}.*'float16' for half precision"):
            tppasm.empty((2,), code)


def test_the_fast_path_of_empty_keeps_every_check():
    """empty() remembers dtypes and takes tuples of ints without a second look; all else is checked."""
    assert tppasm.empty((2, 3), "bf16").dtype.name == "bfloat16"       # "bf16" is remembered now
    assert tppasm.empty([2, np.int64(3)], "bf16").shape == (2, 3)
    assert tppasm.empty(4, np.float32).shape == (4,)
    for shape in ((2, True), (2, 3.0), (2, -1), "23"):
        with pytest.raises(ValueError, match="non-negative integers"):
            tppasm.empty(shape, "bf16")
    with pytest.raises(TypeError, match="tppasm name"):
        tppasm.empty((2,), ["f32"])                                      # unhashable: never remembered
    with pytest.raises(ValueError, match="power of two"):
        tppasm.empty((2,), "bf16", np.int64(48))


@pytest.mark.parametrize("k", [2.5, True, "3", np.float32(2)])
def test_vnni_unpack_wants_an_int_k(k):
    with pytest.raises(ValueError, match=re.escape(f"k={k!r} must be an int in 1..4")):
        tppasm.vnni_unpack(tppasm.vnni_pack(np.ones((4, 3), np.float32), 2), k)
    assert tppasm.vnni_unpack(tppasm.vnni_pack(np.ones((0, 3), np.float32), 2)).shape == (0, 3)


def test_helpers_take_torch_tensors_as_kernels_do():
    torch = pytest.importorskip("torch")
    b = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    want = tppasm.vnni_pack(b.numpy(), 2)
    for helper in (lambda t: tppasm.vnni_pack(t, 2), lambda t: tppasm.aligned(t), lambda t: tppasm.block(t, 2, 3),
                   lambda t: tppasm.unblock(t.reshape(2, 1, 2, 3))):
        got = helper(b.to(torch.bfloat16))                   # bfloat16, which NumPy cannot import itself
        assert got.dtype == DTYPES["bf16"] and (got.astype(np.float32) == helper(b)).all()
    assert (tppasm.vnni_pack(b.to(torch.bfloat16), 2).astype(np.float32) == want).all()
    with pytest.raises(ValueError, match=r"requires grad.*x\.detach\(\)"):
        tppasm.vnni_pack(b.requires_grad_(), 2)


@settings(max_examples=40, deadline=None)
@given(mb=st.integers(1, 4), kb=st.integers(1, 4), bm=st.integers(1, 5), bk=st.integers(1, 5),
       outer=st.sampled_from("mn"))
def test_block_and_unblock(mb, kb, bm, bk, outer):
    x = np.random.default_rng(0).standard_normal((mb * bm, kb * bk)).astype(np.float32)
    xb = tppasm.block(x, bm, bk, outer=outer)
    assert xb.ctypes.data % 64 == 0
    for i in range(mb):
        for j in range(kb):
            got = xb[i, j] if outer == "m" else xb[j, i]
            assert (got == x[i * bm:(i + 1) * bm, j * bk:(j + 1) * bk]).all()
    back = tppasm.unblock(xb, outer=outer)
    assert back.ctypes.data % 64 == 0 and (back == x).all()


@settings(max_examples=60, deadline=None)
@given(lead=st.lists(st.integers(1, 3), max_size=2), k=st.integers(1, 11), n=st.integers(1, 7),
       factor=st.sampled_from([1, 2, 4]))
def test_vnni_pack_matches_naive(lead, k, n, factor):
    b = np.random.default_rng(1).integers(-100, 100, tuple(lead) + (k, n)).astype(np.int8)
    out = tppasm.vnni_pack(b, factor)
    groups = -(-k // factor)
    assert out.shape == tuple(lead) + (groups, n, factor) and out.ctypes.data % 64 == 0
    for idx in np.ndindex(*lead):
        for g in range(groups):
            for c in range(n):
                for f in range(factor):
                    row = g * factor + f
                    assert out[idx + (g, c, f)] == (b[idx + (row, c)] if row < k else 0)
    back = tppasm.vnni_unpack(out, k)
    assert back.ctypes.data % 64 == 0 and (back == b).all()


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(0, 13), cols=st.integers(0, 13), bm=st.integers(1, 5), bk=st.integers(1, 5),
       outer=st.sampled_from("mn"), dtype=st.sampled_from(["float32", "int8"]))
def test_padded_block_is_zero_filled_and_unblock_crops(rows, cols, bm, bk, outer, dtype):
    x = np.random.default_rng(2).integers(1, 100, (rows, cols)).astype(dtype)
    xb = tppasm.block(x, bm, bk, outer=outer, pad=True)
    mb, kb = tppasm.nblocks(rows, bm), tppasm.nblocks(cols, bk)
    assert xb.shape == ((mb, kb) if outer == "m" else (kb, mb)) + (bm, bk) and xb.dtype == x.dtype
    assert xb.ctypes.data % 64 == 0
    full = tppasm.unblock(xb, outer=outer)
    assert full.shape == (mb * bm, kb * bk)
    assert (full[:rows, :cols] == x).all() and (full[rows:] == 0).all() and (full[:, cols:] == 0).all()
    back = tppasm.unblock(xb, outer=outer, shape=(rows, cols))
    assert back.shape == (rows, cols) and back.ctypes.data % 64 == 0 and (back == x).all()


def test_block_errors_name_the_fix():
    x = np.zeros((10, 8), np.float32)
    with pytest.raises(ValueError, match="pad=True"):
        tppasm.block(x, 4, 4)
    with pytest.raises(ValueError, match="positive int"):
        tppasm.block(x, 0, 4, pad=True)
    xb = tppasm.block(x, 4, 4, pad=True)             # 12 x 8
    with pytest.raises(ValueError, match="pass the shape of the matrix"):
        tppasm.unblock(xb, shape=(8, 8))            # a whole block of padding: not what block() made
    with pytest.raises(ValueError, match=r"\(rows, cols\)"):
        tppasm.unblock(xb, shape=10)


def test_block_takes_numpy_unsigned_block_sizes():
    """-(-rows // np.uint8(2)) wrapped (OverflowError); sizes are ints inside."""
    x = np.arange(12.0).reshape(4, 3)
    assert np.array_equal(tppasm.block(x, np.uint8(2), np.uint64(3)), tppasm.block(x, 2, 3))
    assert tppasm.block(np.ones((300, 2)), np.int8(100), 2).shape == (3, 1, 100, 2)
