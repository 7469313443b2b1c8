"""Round 12 mutation survivors (.devx/fz12g): edges the suite did not pin down.

- the block-sparse kernel poisons C when a block column index equals kb (one past the last),
  without reading the B panel past B's end;
- the AMX epilogue's relu keeps a NaN, as the reference does;
- the conv layout helpers and vnni_unpack refuse the wrong inputs at their boundaries (a size just
  over the host's memory, a pad that leaves no pixel, bf16 weights with bc=1, k = g*f + 1);
- the 4-byte transpose gets rows 4-7 of each 8x8 register block right.
"""
import ml_dtypes
import numpy as np
import pytest

import tppasm as tpp
import tppasm.conv_layout as conv_layout
from tests.support import interp_available, isa_params, run_raw
from tests.workloads.test_spmm import _exact
from tppasm.brgemm import Brgemm
from tppasm.conv_layout import block_activations, block_weights, unblock_activations
from tppasm.eltwise import Transform
from tppasm.kernel import get_kernel
from tppasm.layout import vnni_pack, vnni_unpack
from tppasm.spmm import BlockSpmm
from tppasm.x86.amx import generate as generate_amx
from tppasm.x86.spmm import generate as generate_spmm

BF16 = ml_dtypes.bfloat16
needs_interp = pytest.mark.skipif(not interp_available(), reason="no x86 interpreter (isa.x86.interp)")


def _interpret(code, arrays, scalars=()):
    """Run raw ``code`` in the interpreter on ``arrays`` (each mapped alone), writing results back."""
    from isa.x86.interp import Machine
    m = Machine()
    addrs = [m.map(x) for x in arrays]
    m.call(code, args=addrs + [int(s) for s in scalars])
    for x, addr in zip(arrays, addrs):
        if x.flags.writeable:
            x[...] = m.read(addr, like=x)


# 1. block-sparse: colidx == kb is out of range (P07)

def test_block_spmm_refuses_a_block_column_equal_to_kb():
    spmm = tpp.block_spmm(4, 4, 20, 3)
    rp, ci = np.array([0, 2], np.int32), np.array([0, 3], np.int32)
    values, b, c = np.ones((2, 4, 4), np.float32), np.ones((12, 20), np.float32), np.zeros((4, 20), np.float32)
    for call in (spmm, spmm.reference):
        with pytest.raises(ValueError, match=r"colidx\[1\] = 3 is not a block column of A: expected 0..2"):
            call(rp, ci, values, b, c, count=2)
    assert (c == 0).all()


@needs_interp
@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_raw_block_spmm_poisons_c_for_a_block_column_equal_to_kb(isa):
    desc = BlockSpmm(bm=4, bk=4, n=20, kb=3)
    rp, ci = _exact(np.array([0, 2], np.int32)), _exact(np.array([0, 3], np.int32))   # colidx[1] = kb
    values, b = _exact(np.ones((2, 4, 4), np.float32)), _exact(np.ones((12, 20), np.float32))
    c = _exact(np.zeros((4, 20), np.float32))
    _interpret(generate_spmm(desc, isa, ()).code, [rp, ci, values, b, c], [2])   # (a read past B faults)
    assert np.isnan(c).all(), f"{isa}: colidx = kb did not poison C"


# 2. AMX epilogue relu and NaN (A02); the interpreter runs AMX code on hosts without it

@needs_interp
@pytest.mark.parametrize("c_dtype", ["f32", "bf16"])
def test_amx_relu_keeps_nan_as_the_reference(c_dtype):
    desc = Brgemm(m=16, n=16, k=32, dtype="bf16", c_dtype=c_dtype, act="relu")
    a = np.ones((1, 16, 32), BF16)
    a[0, 0, 0], a[0, 5, 3] = np.nan, -np.inf        # row 0: NaN; row 5: -inf -> relu 0
    b = np.ones((1, 16, 16, 2), BF16)
    c = np.zeros((16, 16), BF16 if c_dtype == "bf16" else np.float32)
    want = np.asarray(desc.compute(list(a), list(b), c.copy(), None), np.float32)
    assert np.isnan(want[0]).all() and (want[5] == 0).all()
    _interpret(generate_amx(desc).code, [a, b, c], [1])
    got = c.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[1:], want[1:])


# 3. refusals at the boundary (K05, K02, K04, Y04)

def test_block_activations_refuses_more_than_the_machine_memory(monkeypatch):
    monkeypatch.setattr(conv_layout, "_memory", lambda: 1 << 20)       # a host of 1 MiB
    with pytest.raises(ValueError, match=r"more than this machine's .* GiB of memory; check bc=16 and pad=0"):
        block_activations(np.zeros((1, 16, 129, 128), np.float32), bc=16)   # 1.008 MiB
    assert block_activations(np.zeros((1, 16, 128, 128), np.float32), bc=16).nbytes == 1 << 20


def test_unblock_activations_refuses_a_pad_that_leaves_no_pixel():
    xb = np.ones((1, 1, 4, 6, 2), np.float32)
    with pytest.raises(ValueError, match=r"pad=2 less than half of 4x6"):
        unblock_activations(xb, pad=2)
    assert unblock_activations(xb, pad=1).shape == (1, 2, 2, 4)


def test_block_weights_bf16_refuses_bc_1():
    w = np.ones((4, 1, 3, 3), np.float32)
    with pytest.raises(ValueError, match=r"bc=1 must be even; pad the channels with bc=2"):
        block_weights(w, bc=1, bk=4, dtype="bf16")
    assert block_weights(w, bc=2, bk=4, dtype="bf16").shape == (1, 1, 3, 3, 1, 4, 2)
    assert block_weights(w, bc=1, bk=4, dtype="bf16", fold=True).shape == (1, 1, 3, 2, 4, 2)


def test_vnni_unpack_refuses_k_one_past_the_packed_rows():
    bv = vnni_pack(np.arange(6.0).reshape(3, 2), 2)                  # g=2, f=2: rows 1..4
    with pytest.raises(ValueError, match=r"k=5 must be an int in 1..4"):
        vnni_unpack(bv, 5)
    assert vnni_unpack(bv, 4).shape == (4, 2)


# 4. the 4-byte transpose, every row of its 8x8 register blocks (X01)

@pytest.mark.parametrize("isa", isa_params())
@pytest.mark.parametrize("dtype", ["f32", "i32"])
@pytest.mark.parametrize("m, n", [(8, 8), (16, 24), (19, 13)])
def test_transpose_4_byte_against_numpy(isa, dtype, m, n):
    x = np.arange(m * n).reshape(m, n).astype(tpp.dtypes.dtype(dtype))
    out = np.full((n, m), -1).astype(x.dtype)
    run_raw(get_kernel(Transform("transpose", m, n, 0, 0, dtype), isa), (x, out), isa=isa)
    np.testing.assert_array_equal(out, x.T)
