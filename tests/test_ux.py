"""What a new user tripped over (issue 15): dtype spellings, count inference, the allocating call
form, signatures and help, pickling, a lazy import, the command line, the thread count, one
leading-dimension naming scheme, and readable displays."""
import inspect
import pickle
import pydoc
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest

import tppasm as tpp
from loops import Loop, get_num_threads, kernel, set_num_threads
from tppasm.dtypes import dtype as D, name_of
from tppasm.operand import OperandError

BF16 = D("bf16")


def run_python(code):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


# -- dtype spellings ------------------------------------------------------------------------------

F32 = ["f32", "float32", "fp32", np.float32, np.dtype(np.float32), "f4", "np.float32"]
BF = ["bf16", "bfloat16", BF16, BF16.type]
CONSTRUCTORS = [
    lambda dt: tpp.unary("exp", 2, 3, dtype=dt), lambda dt: tpp.relu(2, 3, dtype=dt),
    lambda dt: tpp.copy(2, 3, dtype=dt, out_dtype=dt), lambda dt: tpp.zero(2, 3, dtype=dt),
    lambda dt: tpp.binary("add", 2, 3, dtype=dt, out_dtype=dt), lambda dt: tpp.ternary("muladd", 2, 3, dtype=dt),
    lambda dt: tpp.reduce("max", 2, 3, dtype=dt, out_dtype=dt), lambda dt: tpp.transform("transpose", 2, 3, dtype=dt),
    lambda dt: tpp.brgemm(2, 3, 4, dtype=dt),
]


@pytest.mark.parametrize("make", CONSTRUCTORS)
def test_every_float_spelling_builds_the_same_kernel(make):
    for names in (F32, BF):
        first = make(names[0])
        for spelling in names[1:]:
            assert make(spelling) is first, spelling


def test_integer_and_torch_spellings(monkeypatch):
    g = tpp.brgemm(2, 3, 4, dtype="i8")
    assert tpp.brgemm(2, 3, 4, dtype=np.int8, c_dtype=np.int32) is g
    assert tpp.brgemm(2, 3, 4, dtype="int8", c_dtype="int32") is g
    assert tpp.transform("transpose", 2, 3, dtype=np.uint8).desc.dtype == "u8"
    assert tpp.vnni_pack(np.ones((4, 2), np.int8), np.int8).shape == tpp.vnni_pack(np.ones((4, 2)), "i8").shape
    assert tpp.empty((2,), "bfloat16").dtype == BF16 and tpp.empty((2,), np.int32).dtype == np.int32

    class FakeDtype:                     # torch.dtype stand-in: torch is not a test dependency
        def __init__(self, name):
            self.name = name

        def __str__(self):
            return f"torch.{self.name}"
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(dtype=FakeDtype))
    assert name_of(FakeDtype("bfloat16")) == "bf16" and name_of(FakeDtype("float32")) == "f32"
    assert tpp.relu(2, 3, dtype=FakeDtype("bfloat16")) is tpp.relu(2, 3, dtype="bf16")
    with pytest.raises(TypeError, match="torch.float64 is not a tppasm dtype: .*astype"):
        tpp.relu(2, 3, dtype=FakeDtype("float64"))


@pytest.mark.parametrize("bad, words", [
    (np.float64, "dtype=float64 is not a tppasm dtype: tppasm kernels compute in f32 or bf16"),
    ("float16", "not IEEE half"), ("float", "dtype='float' is not a tppasm dtype"),
    (np.dtype(">f4"), "dtype='>f4' is not a tppasm dtype: its byte order is not this machine's: use 'f32'"),
    (np.dtype(">i4"), "dtype='>i4' .*use 'i32'"),
    (np.dtype([("a", "<f4")]), r"dtype=\[\('a', '<f4'\)\] is not a tppasm dtype"),
    (None, None)])
def test_unsupported_dtypes_say_what_to_use(bad, words):
    if bad is None:                      # None means the default for out_dtype
        assert tpp.copy(2, 3, out_dtype=None).desc.out_dtype == "f32"
        return
    with pytest.raises(TypeError, match=words):
        tpp.relu(2, 3, dtype=bad)
    with pytest.raises(ValueError):      # also a ValueError, as every descriptor check is
        tpp.relu(2, 3, dtype=bad)


def test_operand_dtype_errors_suggest_only_real_kernels():
    x = np.ones((2, 3))
    with pytest.raises(OperandError) as e:
        tpp.relu(2, 3)(x, np.empty((2, 3), np.float32))
    assert "astype(np.float32)" in str(e.value) and "build" not in str(e.value)
    with pytest.raises(OperandError) as e:
        tpp.relu(2, 3)(x.astype(BF16), np.empty((2, 3), np.float32))
    assert "build the kernel with dtype='bf16'" in str(e.value)
    g = tpp.brgemm(1, 2, 4, dtype="i8", batch="offset")
    a, b = np.ones((1, 4), np.uint8), tpp.vnni_pack(np.ones((4, 2), np.int8), 4)
    with pytest.raises(OperandError) as e:
        g(a, b, np.empty((1, 2), np.int32), np.zeros((1, 2), np.int32))
    assert "astype(np.int64)" in str(e.value) and "build" not in str(e.value)


# -- count ---------------------------------------------------------------------------------------

def test_count_is_inferred_from_the_blocks():
    g = tpp.brgemm(4, 4, 4)
    A = np.ones((16, 4, 4), np.float32)
    C = np.full((4, 4), np.nan, np.float32)
    g(A, A, C)
    assert (C == 64).all()               # 16 blocks, not 1
    g(A, A, C, count=3)
    assert (C == 12).all()
    with pytest.raises(TypeError, match="pass count=.*a holds 16 and b holds 8"):
        g(A, A[:8], C)
    with pytest.raises(OperandError, match="count"):
        g(A, A, C, count=17)
    with pytest.raises(OperandError, match="count=0"):
        g(A[:0], A[:0], C)


def test_count_inference_in_loop_bodies():
    g = tpp.brgemm(4, 4, 4)
    A = np.ones((3, 2, 4, 4), np.float32)
    C = np.full((3, 4, 4), np.nan, np.float32)

    @kernel("A", Loop(0, 3))
    def known(i, A, B, C):
        g(A[i, 0:2], B[i, 0:2], C[i])         # two blocks, known when traced
    known(A, A, C)
    assert (C == 8).all()

    @kernel("ab", Loop(0, 3), Loop(0, 2))
    def depends(i, k, A, B, C):
        g(A[i, k:], B[i, k:], C[i])           # the block count depends on k: count= is required
    with pytest.raises(TypeError, match="pass count="):
        depends(A, A, C)


def test_offset_and_address_batches_infer_count():
    g = tpp.brgemm(2, 2, 2, batch="address")
    blocks = [np.ones((2, 2), np.float32)] * 3
    C = np.empty((2, 2), np.float32)
    g(blocks, blocks, C)
    assert (C == 6).all()
    with pytest.raises(TypeError, match="pass count="):
        g(blocks, blocks[:2], C)
    h = tpp.brgemm(2, 2, 2, batch="offset")
    h(np.ones(8, np.float32), np.ones(8, np.float32), C, np.zeros((5, 2), np.int64))
    assert (C == 10).all()


# -- the allocating form ---------------------------------------------------------------------------

def test_allocating_form_returns_aligned_outputs():
    x = np.random.default_rng(0).standard_normal((5, 9)).astype(np.float32)
    y = tpp.relu(5, 9)(x)
    assert y.ctypes.data % 64 == 0 and y.dtype == np.float32 and (y == np.maximum(x, 0)).all()
    out, mask = tpp.relu(5, 9, bitmask=True)(x)
    assert mask.shape == (5, 2) and (out == y).all()
    C = tpp.brgemm(5, 3, 9)(x[None], np.ones((1, 9, 3), np.float32))
    np.testing.assert_allclose(C, x @ np.ones((9, 3)), rtol=1e-5)
    assert tpp.zero(2, 3)().tolist() == [[0.0] * 3] * 2
    with pytest.raises(TypeError, match="takes 3 arrays"):
        tpp.ternary("muladd", 5, 9)(x, x)          # c is read: never allocated
    with pytest.raises(TypeError, match="takes 3 arrays"):
        tpp.brgemm(5, 3, 9, beta=1)(x[None], np.ones((1, 9, 3), np.float32))


# -- signatures, help, reprs ----------------------------------------------------------------------

def test_signature_help_and_repr():
    k = tpp.relu(4, 8)
    assert str(inspect.signature(k)) == "(x: 'float32[4, 8]', out: 'float32[4, 8]' = None, /)"
    g = tpp.brgemm(8, 8, 8, dtype="bf16")
    assert str(inspect.signature(g)) == ("(a: 'bfloat16[count, 8, 8]', b: 'bfloat16[count, 4, 8, 2]', "
                                         "c: 'float32[8, 8]' = None, /, *, count=None)")
    text = pydoc.render_doc(k, renderer=pydoc.plaintext)
    assert "class ReluKernel" in text and "out = relu(x)" in text and "Operands:" in text
    assert "x    float32 (4, 8); read" in text and "= unary(...)" not in text
    assert type(k).__name__ == "ReluKernel" and isinstance(k, tpp.kernel.Kernel)
    assert repr(k).startswith("<ReluKernel tppasm.unary('relu', 4, 8) on ")
    assert "JIT " in repr(k) or "loaded from disk in " in repr(k)          # (disk: another process stored it)
    assert "bytes" in repr(k) and " for " not in repr(k)
    assert "accumulators" in repr(tpp.brgemm(16, 16, 16))
    assert "tdpbf16ps tmm" in repr(tpp.brgemm(16, 16, 32, dtype="bf16", isa="amx"))
    html = g._repr_html_()
    plain = g.disassemble()            # the host's bf16 dot product: AMX, AVX512-BF16 or the fp32 FMA
    dot = next(d for d in ("tdpbf16ps", "vdpbf16ps", "vfmadd231ps") if d in plain)
    assert "<table>" in html and f'<span class="asm-cmp">{dot}</span>' in html
    listing = k.disassemble()
    assert isinstance(listing, str) and "<pre" in listing._repr_html_()
    assert k.instruction_mix()["ret"] == 1


def test_loop_kernel_repr_and_html():
    relu = tpp.relu(8, 8)

    @kernel("Ab", Loop(0, 4), Loop(0, 4))
    def blocks(i, j, X, Y):
        relu(X[i, j], Y[i, j])
    X = np.random.default_rng(1).standard_normal((4, 4, 8, 8)).astype(np.float32)
    Y = np.empty_like(X)
    blocks(X, Y)
    assert repr(blocks).startswith("<LoopKernel blocks(X, Y) spec 'Ab': i in Loop(0, 4), j in Loop(0, 4)")
    blocks.tune(X, Y, budget=3, reps=1, progress=False)
    html = blocks._repr_html_()
    assert "def thread_body(tid)" in html and "last tuning" in html and "ReluKernel" in html
    assert "tuned:" in repr(blocks)
    assert str(inspect.signature(blocks)) == "(X, Y, /)"
    assert blocks.accesses(X, Y) == {"X": "read", "Y": "written"}


# -- pickling --------------------------------------------------------------------------------------

def test_kernels_pickle_and_rebuild_in_another_process():
    k = tpp.brgemm(4, 4, 4, dtype="bf16")
    assert pickle.loads(pickle.dumps(k)) is k
    b = tpp.brgemm(2, 2, 2, batch="address")
    assert pickle.loads(pickle.dumps(b)).kernel is b.kernel
    blob = pickle.dumps(tpp.relu(2, 3))
    out = run_python(f"import pickle, numpy as np; k = pickle.loads({blob!r}); "
                     "print(k(np.array([[-1, 2, -3], [4, -5, 6]], np.float32)).tolist())")
    assert out.strip() == "[[0.0, 2.0, 0.0], [4.0, 0.0, 6.0]]"


# -- import, command line, version, threads ---------------------------------------------------------

def test_import_is_lazy():
    out = run_python("import sys, tppasm, numpy as np; tppasm.relu(2, 3)(np.ones((2, 3), np.float32)); "
                     "print(sorted(m for m in ('ml_dtypes', 'hypothesis', 'loops', 'tppasm.testing') "
                     "if m in sys.modules)); tppasm.relu(2, 3, dtype='bf16'); print('ml_dtypes' in sys.modules)")
    assert out.split("\n")[:2] == ["[]", "True"]


def test_command_line_and_version(monkeypatch, capsys):
    from importlib.metadata import version
    from tppasm.__main__ import info, main
    assert tpp.__version__ == version("tppasm")
    assert main([]) == 0 and "usage: python -m tppasm" in capsys.readouterr().out
    import isa.cpu
    real = isa.cpu.host()
    every = types.SimpleNamespace(**{**real.__dict__, "features": {k: True for k in real.features},
                                     "levels": ["avx2", "avx512", "amx"]})
    every.as_dict = real.as_dict
    monkeypatch.setattr(isa.cpu, "host", lambda: every)
    monkeypatch.setenv("TPPASM_AMX_CHUNKS", "0")
    info()
    text = capsys.readouterr().out
    assert "features" in text and "absent" not in text
    assert "amx       batch chunks off (TPPASM_AMX_CHUNKS" in text


def test_thread_count_at_run_time():
    zero = tpp.zero(1, 4)

    @kernel("A", Loop(0, 8))
    def clear(i, X):
        zero(X[i:i + 1])
    X = np.ones((8, 4), np.float32)
    before = get_num_threads()
    try:
        set_num_threads(1)
        assert get_num_threads() == 1
        clear(X)
        assert "1 thread;" in clear.explain() and (X == 0).all()
        set_num_threads(3)
        X[...] = 1
        clear(X)
        assert "3 threads" in clear.explain() and (X == 0).all()
        with pytest.raises(ValueError, match="expected an int >= 1"):
            set_num_threads(0)
    finally:
        set_num_threads(before)


# -- leading dimensions -----------------------------------------------------------------------------

def test_one_leading_dimension_scheme():
    k = tpp.unary("relu", 2, 3, ldx=5, ldo=4)
    assert tpp.relu(2, 3, ldx=5, ldo=4) is k and "ldx=5" in repr(k)
    with pytest.warns(DeprecationWarning, match=r"ldi=\.\.\.\) is now ldx="):
        assert tpp.unary("relu", 2, 3, ldi=5, ldo=4) is k
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ValueError, match="disagree"):
            tpp.relu(2, 3, ldx=6, ldi=5)
        assert tpp.relu(2, 3, ldx=5, ldi=0, ldo=4) is k                # 0: the default, as everywhere
        assert tpp.relu(2, 3, ldx=0, ldi=5, ldo=4) is k
    assert tpp.reduce("add", 2, 3, ldx=4) is tpp.reduce("add", 2, 3, 'cols', 4)
    names = {p for f in (tpp.unary, tpp.relu, tpp.copy, tpp.reduce, tpp.transform, tpp.binary, tpp.ternary)
             for p in inspect.signature(f).parameters if p.startswith("ld")}
    assert names == {"ldx", "lda", "ldb", "ldc", "ldo", "ldi"}       # ldi: deprecated, keyword only
    with pytest.raises(OperandError, match="build the kernel with ldx=8"):
        tpp.relu(3, 5)(np.zeros((3, 8), np.float32)[:, :5], np.empty((3, 5), np.float32))
