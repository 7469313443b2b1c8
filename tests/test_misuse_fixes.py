"""Misuses of the public API that were silently accepted, crashed, or raised errors that did not
name the fix (fuzzing report fz7b, sections 2-5): each is now refused with a TypeError or
ValueError saying what to pass, or (the cache) declined without harm."""
import ctypes
import warnings

import numpy as np
import numpy.ma as ma
import pytest

import bench.__main__ as bench_main
import tppasm as tpp
from isa.cpu import host
from isa.x86.function import JitFunction
from tppasm import cache, fc, spmm
from tppasm.cache.disk import DiskStore
from tppasm.operand import OperandError
from tppasm.testing import assert_matches_reference

# -- 2. a NumPy masked array is refused by the helpers as kernels refuse it ----------------------------
MASKED = ma.masked_invalid(np.array([[1.0, np.nan], [2.0, 3.0]], np.float32))     # the NaN is masked out
EYE = np.eye(2, dtype=np.float32)


@pytest.mark.parametrize("call, where", [
    (lambda: tpp.aligned(MASKED), "aligned: x"),
    (lambda: tpp.block(MASKED, 1, 1), "block: x"),
    (lambda: tpp.vnni_pack(MASKED, 2), "vnni_pack: b"),
    (lambda: tpp.unblock(ma.masked_array(np.zeros((1, 1, 2, 2)))), "unblock: xb"),
    (lambda: fc.forward(MASKED, EYE), "fc.forward: x"),
    (lambda: fc.forward(EYE, MASKED), "fc.forward: w"),
    (lambda: fc.forward(EYE, EYE, ma.masked_invalid(np.float32([1, np.nan]))), "fc.forward: bias"),
    (lambda: fc.backward(EYE, MASKED, EYE), "fc.backward: x"),
    (lambda: fc.pack(MASKED), "fc.pack: w"),
    (lambda: spmm.bcsr(MASKED, 1, 1), "bcsr: x"),
    (lambda: tpp.rope_tables(ma.masked_array([0, 7], mask=[0, 1]), 2), "rope_tables: positions"),
])
def test_helpers_refuse_a_masked_array_naming_the_fix(call, where):
    with pytest.raises(OperandError, match=f"^{where} is a NumPy masked array, whose mask .* pass x.filled"):
        call()


def test_fc_refuses_a_masked_output_array():
    out = ma.masked_array(np.empty((2, 2), np.float32))
    with pytest.raises(OperandError, match=r"fc.forward: out is a NumPy masked array.*pass x.data"):
        fc.forward(EYE, EYE, out=out)


def test_helpers_still_take_plain_arrays():
    assert tpp.aligned(MASKED.filled(0)).tolist() == [[1.0, 0.0], [2.0, 3.0]]
    assert fc.forward(MASKED.filled(0), EYE)[0].tolist() == [[1.0, 0.0], [2.0, 3.0]]       # (y, None)


# -- 3. JitFunction arguments: no None/True as addresses, no raw ctypes errors ---------------------------
@pytest.fixture
def ret_only():
    """A function taking (ptr, i32, f32) that returns at once (it reads no argument)."""
    if host().arch != "x86_64":
        pytest.skip("x86 machine code")
    return JitFunction("f", b"\xc3", ["ptr", "i32", "f32"], None)


X = np.zeros(4, np.float32)


@pytest.mark.parametrize("args, words", [
    ((None, 1, 2.0), "f(): argument 0 (ptr) is None, not an address; pass an int address such as x.ctypes.data"),
    ((True, 1, 2.0), "argument 0 (ptr) is True, not an address"),
    ((np.True_, 1, 2.0), "argument 0 (ptr) is a numpy.bool, not an address"),
    ((X, 1, 2.0), "argument 0 (ptr) is a NumPy array, not an address; pass the int x.ctypes.data"),
    ((np.array(8), 1, 2.0), "argument 0 (ptr) is a NumPy array"),
    (("abc", 1, 2.0), "argument 0 (ptr) is 'abc', not an address"),
    ((0, None, 2.0), "argument 1 (i32) is None, not an integer"),
    ((0, "3", 2.0), "argument 1 (i32) is '3', not an integer; pass an int, e.g. int('3')"),
    ((0, 1, "2"), "argument 2 (f32) is '2', not a real number; pass a float, e.g. float('2')"),
    ((0, 1, 2j), "argument 2 (f32) is a complex, not a real number"),
    ((0, 1, True), "argument 2 (f32) is True, not a real number"),
])
def test_jit_function_refuses_arguments_of_the_wrong_type(ret_only, args, words):
    with pytest.raises(TypeError) as e:
        ret_only(*args)
    assert words in str(e.value)


def test_jit_function_takes_ints_numpy_scalars_and_ctypes_pointers(ret_only):
    assert ret_only(X.ctypes.data, 1, 2.0) is None
    assert ret_only(np.intp(X.ctypes.data), np.int8(1), np.float32(2)) is None
    assert ret_only(X.ctypes.data_as(ctypes.c_void_p), True, 2) is None       # a bool flag is an int
    assert ret_only(0, -1, float("nan")) is None                               # an explicit null pointer
    with pytest.raises(ValueError, match="does not fit i32"):
        ret_only(0, 1 << 31, 2.0)


# -- 4. a record larger than the cache keeps is declined, and evicts nothing --------------------------------
def test_a_record_larger_than_the_cache_keeps_is_declined(tmp_path, monkeypatch):
    monkeypatch.setenv("TPPASM_CACHE_MB", "1")
    monkeypatch.delenv("TPPASM_CACHE", raising=False)
    with cache.using(tmp_path):
        assert cache.remember("mine", "small", {"a": 1})
        with pytest.warns(RuntimeWarning, match="TPPASM_CACHE_MB"):
            assert cache.remember("mine", "big", "x" * (2 << 20)) is False
        assert cache.recall("mine", "big") is None
        assert cache.recall("mine", "small") == {"a": 1} and cache.info()["entries"] == {"mine": 1}
        assert cache.info()["stats"]["evicted"] == 0


def test_a_blob_larger_than_the_cache_keeps_is_not_stored(tmp_path):
    s = DiskStore(tmp_path, cap_bytes=4096)
    s.put("kernel/small", b"\xc3", {})
    s.put("kernel/big", b"\x90" * 8192, {})
    s.flush()
    assert s.get("kernel/small")[0] == b"\xc3" and s.get("kernel/big") is None
    assert s.info()["stats"]["evicted"] == 0


# -- 5. align=, empty shapes, tppasm.testing and python -m bench --------------------------------------------
@pytest.mark.parametrize("align", [np.int8(64), np.int16(64), np.uint64(128)])
def test_align_takes_numpy_integers(align):
    assert tpp.empty((4,), "f32", align).ctypes.data % int(align) == 0
    assert tpp.aligned(np.arange(10.0)[1:], align).ctypes.data % int(align) == 0


@pytest.mark.parametrize("align", [2 ** 22, 2 ** 40, 2 ** 62, np.uint64(2 ** 63)])
def test_align_is_bounded(align):
    for call in (lambda: tpp.empty((4,), "f32", align), lambda: tpp.aligned(np.ones(3), align)):
        with pytest.raises(ValueError, match=r"align=.* must be a power of two number of bytes from 1 to 2097152"):
            call()


def test_an_empty_shape_numpy_refuses_is_explained():
    with pytest.raises(ValueError) as e:
        tpp.empty((0, 2 ** 64))
    assert "has no elements, but NumPy refuses it" in str(e.value) and "span 0 bytes" not in str(e.value)
    with pytest.raises(ValueError, match="has no elements"):
        tpp.empty((0, 2 ** 62))                     # (NumPy's own 'array is too big' before)
    assert tpp.empty((0, 2 ** 60), "u1").shape == (0, 2 ** 60)


def test_strategies_refuse_arguments_of_the_wrong_type():
    from tppasm.testing import strategies as S
    with pytest.raises(TypeError, match=r"arrays: shape=3 \(int\); expected a tuple of sizes, e.g. \(3,\)"):
        S.arrays("f32", 3)
    with pytest.raises(TypeError, match=r"shapes: ndim='2' \(str\); expected an int >= 0"):
        S.shapes("2")
    with pytest.raises(ValueError, match="block_sizes: step=0; expected an int >= 1"):
        S.block_sizes(0)


def test_assert_matches_reference_refuses_max_examples_beside_arrays():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="max_examples=10 is given with arrays, which are one example"):
        assert_matches_reference(tpp.relu(2, 3), x, np.empty_like(x), max_examples=10)


def test_assert_matches_reference_refuses_a_kernel_without_arrays():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kernel = tpp.tilerelease()
    with pytest.raises(TypeError, match="takes no arrays, so it has no results to compare"):
        assert_matches_reference(kernel)


@pytest.mark.parametrize("argv, words", [
    (["GEMM"], "python -m bench: error: unknown suite 'GEMM'; did you mean 'gemm'?"),
    (["--json", "x.json", "gemm"], "python -m bench: error: the suite comes first: python -m bench gemm --json x.json"),
    (["gemmm"], "unknown suite 'gemmm'; expected one of isa, tpp, gemm"),
])
def test_bench_names_an_unknown_or_misplaced_suite(capsys, argv, words):
    assert bench_main.main(argv) == 2
    assert words in capsys.readouterr().err


def test_data_address_reads_the_word_the_native_entries_read():
    """operand.data_address and the kernels' native entries read one word of the array object."""
    from tppasm import operand
    from tppasm.x86 import entry
    x = np.ones((3, 4), np.float32)[1:, 1:]
    assert operand._DATA_OFFSET == entry.DATA and operand.data_address(x) == x.ctypes.data


def test_a_kernel_built_from_an_invalid_descriptor_names_the_fix():
    """``Kernel(desc, isa)`` validates before it reads the operands (which trust the fields): an int8
    dtype spelled "u8" got a KeyError from the VNNI table."""
    from tppasm.brgemm import Brgemm
    from tppasm.kernel import Kernel
    with pytest.raises(ValueError, match="dtype='u8'; legal values: f32, bf16, i8"):
        Kernel(Brgemm(m=2, n=3, k=4, dtype="u8"), "avx2")
