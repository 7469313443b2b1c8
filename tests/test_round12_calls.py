"""Calls and constructors (round 12): the allocating form on torch tensors returns tensors, and
refusals whose advice works: a batch count that varies with the loop indices, a block without its
batch axis, ldx (not the field ldi) and a dtype in its place, binary's posts, the other name of an
output dtype, tpp.empty's torch dtypes, tileconfig of a BRGEMM without tiles, beta=1.0, and
malformed cache sizes in the environment refused at first use, not at import."""
import inspect
import os
import subprocess
import sys

import numpy as np
import pytest

import tppasm as tpp
import tppasm.buffers as tb
import tppasm.kernel as tk
from loops import Loop, kernel
from tppasm.dtypes import dtype as to_dtype
from tppasm.eltwise import Unary
from tppasm.operand import OperandError
from tppasm.spmm import BlockSpmmKernel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BF16 = to_dtype("bf16")


def _python(code, tmp_path, **env):
    """Run ``code`` in a fresh interpreter from the repository root; (exit status, stdout + stderr)."""
    env = {**os.environ, "TPPASM_CACHE_DIR": str(tmp_path), **env}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    return r.returncode, r.stdout + r.stderr


# 1. the allocating form returns what it was given: torch tensors for tensors

def test_the_allocating_form_on_torch_tensors_returns_tensors_bf16_too():
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    k = tpp.relu(4, 8, dtype="bf16", ldo=12)
    for y in (k(x), k(x, None), k.reference(x)):
        assert type(y) is torch.Tensor and y.dtype is torch.bfloat16 and torch.equal(y, torch.relu(x))
    assert y.stride() == (12, 1)                        # the kernel's layout, no copy
    out, mask = tpp.relu(4, 8, bitmask=True)(x.float())
    assert type(out) is type(mask) is torch.Tensor and mask.dtype is torch.uint8
    assert type(k(x.view(torch.int16).numpy().view(BF16))) is np.ndarray       # NumPy in, NumPy out


def test_batched_and_sparse_allocating_forms_on_tensors_return_tensors():
    torch = pytest.importorskip("torch")
    blocks = [torch.ones(4, 4)] * 2
    assert type(tpp.brgemm(4, 4, 4)(torch.ones(2, 4, 4), torch.ones(2, 4, 4))) is torch.Tensor
    c = tpp.brgemm(4, 4, 4, batch="address")(blocks, blocks)
    assert type(c) is torch.Tensor and c.eq(8).all()
    spmm = tpp.block_spmm(bm=1, bk=1, n=1, kb=2)
    rowptr, colidx = torch.tensor([0, 2], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
    c = spmm(rowptr, colidx, torch.ones(2, 1, 1), torch.ones(2, 1))
    assert type(c) is torch.Tensor and c.item() == 2


def test_the_allocating_form_on_numpy_arrays_never_imports_torch(tmp_path):
    rc, out = _python("import sys, numpy as np, tppasm; y = tppasm.relu(2, 2)(np.ones((2, 2), np.float32)); "
                      "print(type(y).__name__, 'torch' in sys.modules)", tmp_path)
    assert rc == 0 and out.split() == ["ndarray", "False"], out


# 2. a batch count that depends on the loop indices

def test_a_count_varying_with_the_loop_indices_is_refused_as_such():
    nb, b = 5, 8
    P, V, O = tpp.empty((nb, nb, b, b)), tpp.empty((nb, b, b)), tpp.empty((nb, b, b))
    g = tpp.brgemm(b, b, b)

    @kernel("A", Loop(0, nb))
    def anti(i, P, V, O):
        g(P[i, i:], V[i:], O[i])

    with pytest.raises(TypeError, match="count cannot vary with the loop indices") as e:
        anti(P, V, O)
    assert "the same number" not in str(e.value)        # (a holds -i + 5 and b holds -i + 5: the same)

    @kernel("A", Loop(0, nb))
    def first_block(i, P, V, O):
        g(P[i, i:], V[i:], O[i], count=1)                # the advice: a constant count
    P[...], V[...] = 1, 1
    first_block(P, V, O)
    assert (O == b).all()


# 3. one block without the batch axis

def test_a_block_without_the_batch_axis_is_told_to_add_it():
    g = tpp.brgemm(7, 5, 7)
    with pytest.raises(OperandError, match=r"add the batch axis: a\[None\]"):
        g(np.ones((7, 7), np.float32), np.ones((7, 5), np.float32))
    g16 = tpp.brgemm(8, 8, 8, dtype="bf16")
    a, packed = np.ones((1, 8, 8), BF16), tpp.vnni_pack(np.ones((8, 8), BF16), 2)
    with pytest.raises(OperandError, match=r"add the batch axis: b\[None\]") as e:
        g16(a, packed)
    assert "vnni_pack" not in str(e.value)
    with pytest.raises(OperandError, match=r"vnni_pack\(B, 2\)\[None\]"):
        g16(a, np.ones((8, 8), BF16))                  # neither packed nor batched: both fixes
    assert g16(a, packed[None]).shape == (8, 8)


# 4. ldx, not the field ldi; a dtype where ldx goes

@pytest.mark.parametrize("make", [lambda: tpp.softmax(8, 8, ldx="a"), lambda: tpp.relu(8, 8, ldx=2.5),
                                  lambda: tpp.layernorm(8, 8, ldx=None)])
def test_leading_dimension_errors_name_the_keyword_ldx(make):
    with pytest.raises(ValueError, match="ldx=") as e:
        make()
    assert "ldi" not in str(e.value)


def test_a_dtype_in_the_ldx_position_is_told_dtype_is_a_keyword():
    for make in (lambda: tpp.copy(8, 8, "bf16"), lambda: tpp.softmax(8, 8, "bfloat16")):
        with pytest.raises(ValueError, match="dtype is a keyword: dtype='bf16'"):
            make()
    with pytest.raises(ValueError, match="expected an int$"):
        tpp.relu(8, 8, "eight")                          # not a dtype: no such advice


# 5. binary's posts

def test_binary_post_refusal_lists_the_posts():
    for post in ("zero", "gelu_bwd", "silu"):
        with pytest.raises(ValueError, match="one-input op.*relu, negate.*gelu_erf_fast") as e:
            tpp.binary("add", 8, 8, post=post)
        assert "not a unary op" not in str(e.value)


# 6. constructors' keywords and helpers

@pytest.mark.parametrize("make, takes", [
    (lambda: tpp.brgemm(8, 8, 8, dtype="bf16", out_dtype="bf16"), "c_dtype='bf16'"),
    (lambda: tpp.binary("add", 8, 8, c_dtype="bf16"), "out_dtype='bf16'"),
    (lambda: tpp.unary("relu", 8, 8, c_dtype="bf16"), "out_dtype='bf16'"),
    (lambda: tpp.copy(8, 8, c_dtype="bf16"), "out_dtype='bf16'"),
    (lambda: tpp.ternary("muladd", 8, 8, c_dtype="bf16"), "out_dtype='bf16'"),
    (lambda: tpp.reduce("add", 8, 8, c_dtype="bf16"), "out_dtype='bf16'"),
    (lambda: tpp.softmax(8, 8, c_dtype="bf16"), "out_dtype='bf16'"),
    (lambda: tpp.layernorm(8, 8, c_dtype="bf16"), "out_dtype='bf16'"),
    (lambda: tpp.rmsnorm(8, 8, c_dtype="bf16"), "out_dtype='bf16'"),
    (lambda: tpp.swiglu(8, 8, c_dtype="bf16"), "out_dtype='bf16'"),
    (lambda: tpp.rotary(8, 8, 8, c_dtype="bf16"), "out_dtype='bf16'"),
    (lambda: tpp.dequant(8, 8, c_dtype="bf16"), "out_dtype='bf16'"),
    (lambda: tpp.gemm_nt(8, 8, 8, out_dtype="bf16"), "c_dtype='bf16'")])
def test_the_other_name_of_the_output_dtype_names_the_keyword_taken(make, takes):
    with pytest.raises(TypeError, match=f"takes no .*_dtype=: its output dtype is .*; write {takes}"):
        make()


def test_unknown_constructor_keywords_are_still_refused():
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        tpp.binary("add", 8, 8, colour="red")
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        tpp.brgemm(8, 8, 8, colour="red")


def test_empty_takes_torch_float_dtypes_as_it_takes_numpy_ones():
    torch = pytest.importorskip("torch")
    for spelled, name in ((torch.float64, "float64"), (torch.float16, "float16"), ("f64", "float64"),
                          (np.float64, "float64"), (torch.bfloat16, "bfloat16")):
        assert tpp.empty((2, 3), spelled).dtype.name == name
    with pytest.raises(TypeError, match="is not a dtype"):
        tpp.empty((2,), torch.qint8)


def test_tileconfig_refuses_a_brgemm_without_tiles():
    for gemm in (tpp.brgemm(16, 16, 16), tpp.brgemm(16, 16, 16, dtype="bf16", isa="avx2"),
                 tpp.brgemm(16, 16, 16, batch="offset"), tpp.brgemm(16, 16, 16).desc):
        with pytest.raises(TypeError, match="uses no tiles"):
            tpp.tileconfig(gemm)
    amx = tpp.brgemm(16, 16, 16, dtype="bf16", isa="amx", tile_setup=False)
    assert tpp.tileconfig(amx).desc.kind == "amx_tileconfig"
    assert tpp.tileconfig(amx.desc).desc.kind == "amx_tileconfig"


def test_block_spmm_kernel_class_has_a_signature():
    assert list(inspect.signature(BlockSpmmKernel).parameters) == ["kernel"]
    assert "rowptr" in str(inspect.signature(tpp.block_spmm(bm=1, bk=1, n=1, kb=2)))


def test_brgemm_takes_beta_as_a_float_0_or_1():
    assert tpp.brgemm(4, 4, 4, beta=1.0) is tpp.brgemm(4, 4, 4, beta=1)
    assert tpp.brgemm(4, 4, 4, beta=np.float64(0)) is tpp.brgemm(4, 4, 4)
    with pytest.raises(ValueError, match=r"beta=0.5; expected an int, 0 or 1"):
        tpp.brgemm(4, 4, 4, beta=0.5)


def test_a_list_operand_is_told_to_convert_that_operand():
    spmm = tpp.block_spmm(bm=1, bk=1, n=1, kb=2)
    with pytest.raises(OperandError, match=r"np\.asarray\(rowptr, np\.int32\)"):
        spmm([0, 2], np.array([0, 1], np.int32), np.ones((2, 1, 1), np.float32), np.ones((2, 1), np.float32))


# 7. malformed cache sizes: refused at first use, not at import

def test_a_malformed_kernel_cache_size_is_refused_at_the_first_kernel_built(monkeypatch):
    monkeypatch.setattr(tk, "_LIMIT_UNREAD", True)
    monkeypatch.setenv("TPPASM_KERNEL_CACHE", "many")
    with pytest.raises(ValueError, match=r"TPPASM_KERNEL_CACHE='many': expected the number of kernels to keep"):
        tk.get_kernel(Unary("negate", 3, 29, ldo=31))
    limit = tk._CACHE.limit
    monkeypatch.setenv("TPPASM_KERNEL_CACHE", "600")
    try:
        tk.get_kernel(Unary("negate", 3, 29, ldo=31))
        assert tk._CACHE.limit == 600 and not tk._LIMIT_UNREAD
    finally:
        tk.set_kernel_cache_limit(limit)


def test_a_malformed_buffer_cache_size_is_refused_at_the_first_pooled_array(monkeypatch):
    monkeypatch.setattr(tb._POOL, "_limit", None)
    monkeypatch.setattr(tb._POOL, "free", {})       # (an earlier test's free buffer of that size needs no limit)
    monkeypatch.setenv("TPPASM_BUFFER_CACHE_MIB", "lots")
    with pytest.raises(ValueError, match=r"TPPASM_BUFFER_CACHE_MIB='lots': expected the MiB"):
        tpp.empty((tb.FROM,), "u8")
    monkeypatch.setenv("TPPASM_BUFFER_CACHE_MIB", "3")
    assert tb._POOL.limit == 3 << 20


def test_a_malformed_buffer_cache_size_is_refused_at_the_first_kernel_too(monkeypatch):
    monkeypatch.setattr(tk, "_LIMIT_UNREAD", True)
    monkeypatch.setattr(tb._POOL, "_limit", None)
    monkeypatch.setenv("TPPASM_BUFFER_CACHE_MIB", "lots")
    with pytest.raises(ValueError, match=r"TPPASM_BUFFER_CACHE_MIB='lots'"):
        tk.get_kernel(Unary("negate", 3, 29, ldo=30))


def test_import_and_the_cache_cli_work_with_malformed_cache_sizes(tmp_path):
    bad = {"TPPASM_KERNEL_CACHE": "many", "TPPASM_BUFFER_CACHE_MIB": "lots"}
    rc, out = _python("import tppasm, tppasm.__main__ as m; print('imported'); m.main(['cache', 'clear'])",
                      tmp_path, **bad)
    assert rc == 0 and "imported" in out and "Traceback" not in out, out
    rc, out = _python("import tppasm; tppasm.relu(2, 2)", tmp_path, **bad)
    assert rc == 1 and "TPPASM_KERNEL_CACHE='many'" in out.splitlines()[-1]


BIG = 10 ** 5000      # str() of it raises ValueError (past sys.get_int_max_str_digits())


@pytest.mark.parametrize("make", [
    lambda: tpp.brgemm(BIG, 4, 4), lambda: tpp.brgemm(4, 4, 4, lda=BIG), lambda: tpp.brgemm(4, 4, 4, beta=BIG),
    lambda: tpp.unary("relu", 4, 4, ldx=BIG), lambda: tpp.relu(-BIG, 4),
    lambda: tpp.brgemm(4, 4, 4)(np.ones((1, 4, 4), np.float32), np.ones((1, 4, 4), np.float32), count=BIG),
    lambda: tpp.empty((BIG, 2), "f32"), lambda: tpp.block(np.ones((4, 4), np.float32), BIG, 2)])
def test_a_huge_int_is_refused_with_its_size_not_the_int_to_str_limit(make):
    with pytest.raises(ValueError) as e:
        make()
    assert "sys.set_int_max_str_digits" not in str(e.value) and "digits" in str(e.value)


@pytest.mark.parametrize("make", [lambda: tpp.relu(3, 5), lambda: tpp.relu(3, 5, ldo=8), lambda: tpp.reduce("add", 3, 5),
                                  lambda: tpp.brgemm(4, 4, 4, dtype="bf16", c_dtype="bf16"), lambda: tpp.relu(1, 1)])
def test_an_allocated_output_has_the_operands_layout(make):
    from tppasm.layout import empty_for
    k = make()
    spec = k.operands[-1]
    out = empty_for(spec)
    es = out.itemsize
    assert out.shape == tuple(spec.shape) and out.strides == tuple(s * es for s in spec.strides)
    assert out.dtype == spec.np_dtype and out.ctypes.data % 64 == 0 and out.flags.writeable


def test_rotarys_ldt_advice_says_both_tables_share_it():
    x = np.ones((2, 8), np.float32)
    cos, sin = np.ones((2, 12), np.float32)[:, :4], np.ones((2, 4), np.float32)
    with pytest.raises(OperandError, match="cos and sin share ldt"):
        tpp.rotary(2, 8, 8)(x, cos, sin, np.empty_like(x))


@pytest.mark.parametrize("make", [
    lambda: tpp.unary("relu", 4, 4, c_dtype=BIG), lambda: tpp.dequant(4, 4, ldc=BIG),
    lambda: tpp.unary("relu", 4, 4, ldx=-BIG),
    lambda: tpp.gemm_nt(4, BIG, 4), lambda: tpp.softmax(4, 4, ldm=BIG), lambda: tpp.rotary(4, 4, BIG),
    lambda: tpp.dequant(4, 4, beta=BIG), lambda: tpp.block_spmm(BIG, 4, 4, 4), lambda: tpp.set_kernel_cache_limit(-BIG),
    lambda: tpp.empty((-BIG,)), lambda: tpp.empty((4,), align=BIG), lambda: tpp.nblocks(3, -BIG),
    lambda: tpp.vnni_pack(np.ones((4, 4), np.float32), BIG)])
def test_huge_ints_in_every_constructors_message_are_written_by_their_size(make):
    with pytest.raises((TypeError, ValueError)) as e:
        make()
    assert "sys.set_int_max_str_digits" not in str(e.value) and "digits" in str(e.value)


def test_a_dtype_in_dequants_ld_position_names_its_out_dtype_keyword():
    with pytest.raises(ValueError, match="out_dtype is a keyword: out_dtype='bf16'"):
        tpp.dequant(8, 8, "bf16")


def test_count_true_is_named_as_given():
    a = np.ones((1, 4, 4), np.float32)
    with pytest.raises(OperandError, match="count=True"):
        tpp.brgemm(4, 4, 4)(a, a, count=True)


def test_a_cache_size_of_thousands_of_digits_names_the_variable(monkeypatch):
    monkeypatch.setenv("TPPASM_KERNEL_CACHE", "9" * 5000)
    with pytest.raises(ValueError, match="TPPASM_KERNEL_CACHE="):
        tb.env_limit("TPPASM_KERNEL_CACHE", "the number of kernels to keep", 512)


def test_a_buffer_given_back_after_a_recount_dropped_it_is_ignored():
    class Ref:                                   # a weak reference no pool entry holds
        pass
    tb._give_back(Ref())                         # no KeyError (another thread's recount dropped it)


def test_an_offset_too_large_for_x86_names_the_keyword():
    with pytest.raises(ValueError, match=r"unary: ldx=1099511627776 needs an address offset"):
        tpp.unary("relu", 4, 4, ldx=1 << 40)
