"""Structure of two speed fixes, and their results at the boundary shapes (fz17e items 1 and 2).

- ``reduce(op, m, n, over="rows")`` of a tall array walks each strip of columns down a block of
  ROW_BLOCK rows (its partial results in a stack row), then the next strip, then the next block of
  rows; a strip down all m rows met a new page at every row and ran 2-5x slower past the caches.
  Each column still adds its rows in order: the sums are those of a plain fp32 loop, bit for bit.
- softmax keeps rows of up to 24 vectors (384 floats) in registers on AVX-512 (16 before), and the
  multi-pass route of longer rows with a bf16 output keeps the fp32 exponentials in a stack row
  instead of computing each twice.

No test here times anything: they read the generated code (its row counters), count what the
generators emit, and check results against NumPy with guarded, poisoned copies.
"""
import re

import numpy as np
import pytest

import tppasm
from tppasm.eltwise import Reduce
from tppasm.norm import Softmax
from tppasm.testing import assert_matches_reference
from tppasm.x86 import math as xm, norm as x86_norm, reduce as x86_reduce
from tests.support import isa_params, native

ISAS = isa_params(("avx2", "avx512"))


def _row_counts(desc, isa):
    """The immediates loaded into r10, the row counter of each strip walk, in the code of ``desc``."""
    text = x86_reduce.generate_reduce(desc, isa).disassemble()
    counts = []
    for imm in re.findall(r"mov r10d?,(\w+)", text):
        counts.append(int(imm[:-1], 16) if imm.endswith("h") else int(imm))
    return counts


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_tall_reduce_over_rows_walks_blocks_of_rows(isa, dtype):
    block = x86_reduce.ROW_BLOCK
    counts = _row_counts(Reduce("add", 4097, 1024, "rows", dtype=dtype), isa)
    assert counts and max(counts) < 2 * block, counts           # never a strip down all 4097 rows
    assert block in counts and block + 4097 % block in counts   # the last block takes the rest


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_short_reduce_over_rows_walks_all_rows(isa):
    m = 2 * x86_reduce.ROW_BLOCK - 1
    assert set(_row_counts(Reduce("max", m, 300, "rows"), isa)) == {m}


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_wide_tall_reduce_keeps_one_chunk_of_partial_results(isa):
    """Columns go by chunks of CHUNK (the stack row's length): a loop over whole chunks, then the rest."""
    n = 2 * x86_reduce.CHUNK + 70
    text = x86_reduce.generate_reduce(Reduce("add", 100, n, "rows"), isa).disassemble()
    assert re.search(r"mov (rcx|ecx),2\b", text), "no loop over the 2 whole chunks"
    frame = sum(int(imm, 16) for imm in re.findall(r"sub rsp,(\w+)h", text))      # (by pages: a stack probe)
    assert 4 * x86_reduce.CHUNK <= frame < 4 * x86_reduce.CHUNK + 4096


def _column_loop(op, x):
    """The per-column result of a plain fp32 loop over the rows, in order (np.maximum keeps NaN)."""
    acc = np.full(x.shape[1], 0.0 if op == "add" else -np.inf, np.float32)
    for row in np.asarray(x, np.float32):
        acc = acc + row if op == "add" else np.maximum(acc, row)
    return acc


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("op", ["add", "max"])
@pytest.mark.parametrize("m, n, pad", [(32, 17, 0), (47, 2049, 3), (100, 64, 0), (129, 4100, 5), (300, 1, 0)])
def test_tall_reduce_sums_each_column_in_row_order(isa, op, m, n, pad):
    if not native(isa):
        pytest.skip(f"{isa} does not run here")
    rng = np.random.default_rng(m * n)
    x = tppasm.empty((m, n + pad))[:, :n]
    x[...] = rng.standard_normal((m, n)).astype(np.float32) * 100
    if op == "max":
        x[rng.integers(m), rng.integers(n)] = np.nan
    out = np.empty(n, np.float32)
    tppasm.reduce(op, m, n, over="rows", ldx=n + pad, isa=isa)(x, out)
    np.testing.assert_array_equal(out.view(np.uint32), _column_loop(op, x).view(np.uint32))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype, out_dtype", [("f32", "f32"), ("bf16", "f32"), ("f32", "bf16"), ("bf16", "bf16")])
@pytest.mark.parametrize("m, n", [(31, 40), (32, 33), (33, 2048), (65, 2049), (48, 4096 + 15)])
def test_tall_reduce_matches_numpy_with_guards(isa, dtype, out_dtype, m, n):
    if not native(isa):
        pytest.skip(f"{isa} does not run here")
    rng = np.random.default_rng(m + n)
    x = tppasm.empty((m, n), dtype)
    x[...] = rng.standard_normal((m, n)).astype(np.float32)
    for op in ("add", "max", "sumsq"):
        kernel = tppasm.reduce(op, m, n, over="rows", dtype=dtype, out_dtype=out_dtype, isa=isa)
        assert_matches_reference(kernel, x, tppasm.empty((n,), out_dtype))


def _route(desc, isa, monkeypatch):
    """"registers" or "passes": the route generate_softmax takes for ``desc``."""
    taken = []
    real = x86_norm._softmax_in_registers
    monkeypatch.setattr(x86_norm, "_softmax_in_registers", lambda *a: taken.append(1) or real(*a))
    x86_norm.generate_softmax(desc, isa)
    return "registers" if taken else "passes"


@pytest.mark.parametrize("out_dtype", ["f32", "bf16"])
def test_softmax_rows_up_to_24_vectors_stay_in_registers_on_avx512(out_dtype, monkeypatch):
    def route(n, isa="avx512"):
        return _route(Softmax(4, n, out_dtype=out_dtype, scale=0.125, mask="row"), isa, monkeypatch)
    assert [route(n) for n in (256, 257, 384, 385)] == ["registers", "registers", "registers", "passes"]
    assert [route(n, "avx2") for n in (64, 65)] == ["registers", "passes"]


def _exps(desc, isa, monkeypatch):
    """How many exp vectors generate_softmax emits for ``desc``."""
    count = []
    for name in ("emit_exp", "emit_exp_bf16"):
        real = getattr(xm, name)
        monkeypatch.setattr(xm, name, lambda *a, real=real, **k: count.append(1) or real(*a, **k))
    x86_norm.generate_softmax(desc, isa)
    monkeypatch.undo()
    return len(count)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("mask", [None, "row", "full"])
def test_long_softmax_rows_compute_each_exp_once_for_a_bf16_output(isa, mask, monkeypatch):
    n = 1000
    once = _exps(Softmax(3, n, out_dtype="f32", mask=mask), isa, monkeypatch)       # exps stored in out
    assert _exps(Softmax(3, n, out_dtype="bf16", mask=mask), isa, monkeypatch) == once
    assert _exps(Softmax(3, n, dtype="bf16", out_dtype="bf16", mask=mask), isa, monkeypatch) == once
    longest = x86_norm.KEPT_MAX + 16                  # past the stack row: computed again, not kept
    assert (_exps(Softmax(1, longest, out_dtype="bf16"), isa, monkeypatch)
            > _exps(Softmax(1, longest, out_dtype="f32"), isa, monkeypatch))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype, out_dtype", [("f32", "f32"), ("f32", "bf16"), ("bf16", "bf16")])
@pytest.mark.parametrize("n", [255, 256, 257, 384, 385, 433, 1000])
def test_softmax_matches_numpy_around_the_register_limit(isa, dtype, out_dtype, n):
    if not native(isa):
        pytest.skip(f"{isa} does not run here")
    rng = np.random.default_rng(n)
    m = 3
    x = tppasm.empty((m, n), dtype)
    x[...] = (rng.standard_normal((m, n)) * 6).astype(np.float32)
    row = np.zeros(n, np.float32)
    row[rng.integers(n, size=4)] = -np.inf
    full = np.zeros((m, n), np.float32)
    full[:, -3:] = -np.inf
    for mask, extra in ((None, []), ("row", [row]), ("full", [full])):
        kernel = tppasm.softmax(m, n, scale=0.17, mask=mask, dtype=dtype, out_dtype=out_dtype, isa=isa)
        assert_matches_reference(kernel, x, *extra, tppasm.empty((m, n), out_dtype))


@pytest.mark.parametrize("isa", ISAS)
def test_long_bf16_softmax_in_place(isa):
    """bf16 in and out, one array: the scale pass reads the kept exponentials, then writes the row."""
    if not native(isa):
        pytest.skip(f"{isa} does not run here")
    m, n = 2, 1000
    x = tppasm.empty((m, n), "bf16")
    x[...] = np.random.default_rng(7).standard_normal((m, n)).astype(np.float32) * 4
    want = np.empty((m, n), np.float32)
    tppasm.softmax(m, n, dtype="bf16", out_dtype="f32", isa=isa)(x, want)
    tppasm.softmax(m, n, dtype="bf16", out_dtype="bf16", isa=isa)(x, x)
    np.testing.assert_allclose(np.asarray(x, np.float32), want, rtol=2 ** -7, atol=1e-7)


SMALL_THREAD_STACK = """
import threading, numpy as np, tppasm
def work():
    x = np.random.default_rng(0).standard_normal((2, 16384)).astype(np.float32)
    import ml_dtypes; y = np.empty((2, 16384), ml_dtypes.bfloat16)
    tppasm.softmax(2, 16384, out_dtype="bf16")(x, y)
    tall = np.ones((64, 16), np.float32); s = np.empty(16, np.float32)
    tppasm.reduce("add", 64, 16, over="rows")(tall, s)
    assert (s == 64).all() and np.isfinite(y.astype(np.float32)).all()
    print("ok")
threading.stack_size(64 << 10)
t = threading.Thread(target=work); t.start(); t.join()
"""


def test_stack_rows_fit_a_small_python_thread_stack():
    """The stack rows stay small (the exponentials of rows up to KEPT_MAX floats, the partial results
    of n columns): a Python thread may have 32-64 KiB of stack."""
    import subprocess
    import sys
    assert x86_norm.KEPT_MAX * 4 <= 8 << 10
    frame = x86_reduce.generate_reduce(Reduce("add", 64, 16, over="rows"), "avx512").disassemble()
    assert not re.search(r"sub rsp,[0-9A-F]{4,}h", frame), frame         # a few hundred bytes, not 8 KiB
    run = subprocess.run([sys.executable, "-c", SMALL_THREAD_STACK], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", (run.returncode, run.stderr[-2000:])


@pytest.mark.parametrize("n", range(1, 8))
def test_avx2_tail_masks_are_built_in_registers(n):
    """VectorISA.make_mask on AVX2: no dword stores read back by a 32-byte load (a load that cannot
    be store-forwarded); the kernel has no stack frame for it."""
    text = tppasm.unary("relu", 1, n, isa="avx2").disassemble()
    assert "vpmovsxbd" in text and "[rsp" not in text, text
    x = np.linspace(-1, 1, n, dtype=np.float32).reshape(1, n)
    y = np.full_like(x, np.nan)
    tppasm.unary("relu", 1, n, isa="avx2")(x, y)
    assert (y == np.maximum(x, 0)).all()
