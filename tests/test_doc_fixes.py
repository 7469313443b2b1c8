"""Fixes of documents that did not tell the truth (fuzzing report fz10c): help() and repr of kernels,
the BRGEMM parameter text, the leading-dimension keywords, the tuner's budget line, CLI help."""
import re
import time
from pathlib import Path

import numpy as np
import pytest

import tppasm
from loops import Loop, kernel
from loops import tune
from loops.tune_progress import Progress
from tppasm import display
from tppasm.testing import _roles, assert_matches_reference

M, N, K = 3, 5, 4


def _blocks(count=2):
    rng = np.random.default_rng(0)
    a = [rng.standard_normal((M, K)).astype(np.float32) for _ in range(count)]
    b = [rng.standard_normal((K, N)).astype(np.float32) for _ in range(count)]
    return a, b, sum(x @ y for x, y in zip(a, b))


# -- 1. batched BRGEMMs with beta=0 only write C ----------------------------------------------------

@pytest.mark.parametrize("batch", ["offset", "address"])
def test_batched_beta0_help_says_c_is_written_and_allocated(batch):
    rows = [r for r in display.operand_rows(tppasm.brgemm(M, N, K, batch=batch)) if r[0] == "c"]
    assert rows[0][3] == "written; allocated and returned when left out"
    beta1 = [r for r in display.operand_rows(tppasm.brgemm(M, N, K, batch=batch, beta=1)) if r[0] == "c"]
    assert beta1[0][3] == "read and written"


def test_address_batch_allocates_c():
    a, b, want = _blocks()
    g = tppasm.brgemm(M, N, K, batch="address")
    for c in (g(a, b), g(a, b, None), g.reference(a, b)):
        np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5)
    assert "c = k(a, b" in display.call_forms(g.kernel)


def test_offset_batch_allocates_c():
    a, b, want = _blocks()
    bufa, bufb = np.concatenate([x.ravel() for x in a]), np.concatenate([x.ravel() for x in b])
    offsets = np.array([[0, 0], [M * K, K * N]], np.int64)
    g = tppasm.brgemm(M, N, K, batch="offset")
    for c in (g(bufa, bufb, offsets), g(bufa, bufb, None, offsets)):
        np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5)


def test_batched_too_few_arrays_names_the_call_forms():
    a, b, _ = _blocks()
    with pytest.raises(TypeError, match=r"call it as k\(a, b, c\[, count=n\]\) or c = k\(a, b"):
        tppasm.brgemm(M, N, K, batch="address")(a)
    with pytest.raises(TypeError, match="beta=1: C is read, so always passed"):
        tppasm.brgemm(M, N, K, batch="address", beta=1)(a, b)


def test_batched_forgotten_offsets_or_bias_still_explained():
    a, b, _ = _blocks()
    c = np.empty((M, N), np.float32)
    with pytest.raises(ValueError, match="takes the block offsets after C"):
        tppasm.brgemm(M, N, K, batch="offset")(a[0], b[0], c)
    with pytest.raises(ValueError, match="built with bias=True"):
        tppasm.brgemm(M, N, K, batch="address", bias=True)(a, b, c)


def test_assert_matches_reference_poisons_batched_beta0_c(monkeypatch):
    a, b, _ = _blocks()
    g = tppasm.brgemm(M, N, K, batch="address")
    assert _roles(g, "batched", [a, b, np.empty((M, N), np.float32)], None)[2] == [2]
    assert_matches_reference(g, a, b)                     # C left out: allocated, as the call does
    monkeypatch.setattr(g.kernel, "_raw", lambda *args: None)       # a kernel that never writes C
    with pytest.raises(AssertionError):
        assert_matches_reference(g, a, b, np.zeros((M, N), np.float32))


# -- 2. every kind's repr is the constructor call that builds it ------------------------------------

KERNELS = [
    lambda: tppasm.unary("relu", 2, 8, ldx=9),
    lambda: tppasm.binary("add", 2, 8, ldo=10),
    lambda: tppasm.ternary("muladd", 2, 8),
    lambda: tppasm.reduce("add", 2, 8, over="cols"),
    lambda: tppasm.transform("transpose", 4, 8),
    lambda: tppasm.brgemm(2, 8, 4, lda=6, act="relu"),
    lambda: tppasm.brgemm(2, 8, 4, batch="offset"),
    lambda: tppasm.softmax(2, 8, scale=0.5),
    lambda: tppasm.layernorm(2, 8, ldx=9),
    lambda: tppasm.rmsnorm(2, 8, eps=1e-5),
    lambda: tppasm.rotary(2, 8, 4, ldx=9),
    lambda: tppasm.quantize(2, 8, ldx=9, dtype="bf16"),
    lambda: tppasm.dequant(2, 8, ldx=9, out_dtype="bf16", beta=1),
    lambda: tppasm.swiglu(2, 8, ldg=9),
    lambda: tppasm.gemm_nt(2, 8, 4, ldb=5),
    lambda: tppasm.block_spmm(2, 2, 16, 3, ldc=17, beta=1),
    lambda: tppasm.relu(2, 8, isa="avx2"),
]


@pytest.mark.parametrize("make", KERNELS)
def test_repr_is_a_call_that_builds_an_equal_kernel(make):
    k = make()
    call = re.search(r"(tppasm\.\w+\(.*\)) on ", repr(k)).group(1)
    again = eval(call, {"tppasm": tppasm})
    assert (again.desc, again.isa) == (k.desc, k.isa)
    inner = getattr(k, "kernel", k)          # (block_spmm's wrapper: help() shows its own class; see the report)
    assert type(inner).__doc__.startswith(call + ", JIT'd for")


def test_all_constructor_kinds_are_listed():
    kinds = {make().desc.kind for make in KERNELS}
    assert kinds <= set(display.CONSTRUCTORS)
    assert "ldi=" not in repr(tppasm.rotary(2, 8, 4, ldx=9))


# -- 3. help(tppasm.brgemm), gemm_nt, rotary explain their parameters -------------------------------

@pytest.mark.parametrize("fn, words", [
    (tppasm.brgemm, ["lda", "stride_a", '"offset"', '"address"', "bias=True", "act", "stream_c", "pace=P",
                     "c_dtype", "tile_setup", "signs", "isa"]),
    (tppasm.gemm_nt, ["lda", "ldb", "ldc", "c_dtype", "overlap", "isa"]),
    (tppasm.rotary, ["ldx", "ldo", "ldt", "out_dtype", "head_dim", "x itself", "isa"]),
])
def test_function_docstrings_explain_their_parameters(fn, words):
    missing = [w for w in words if w not in fn.__doc__]
    assert not missing


# -- 4. quantize's and dequant's stride keywords ------------------------------------------------------

@pytest.mark.parametrize("make, wrong, right", [(tppasm.dequant, "ldc", "ldx"), (tppasm.quantize, "ldq", "ldo")])
def test_operand_named_stride_keyword_names_the_one_to_write(make, wrong, right):
    with pytest.raises(TypeError, match=f"takes no {wrong}=.*write {right}=5"):
        make(2, 3, **{wrong: 5})
    with pytest.raises(TypeError, match="unexpected keyword argument 'ldz'"):
        make(2, 3, ldz=5)


def test_readme_names_the_stride_exceptions():
    text = " ".join((Path(__file__).parent.parent / "README.md").read_text().split())
    assert "quantize's output q has `ldo`, dequant's input c has `ldx`" in text


# -- 5. the tuner's budget line names the spec tune() picks ---------------------------------------

def test_progress_budget_line_names_the_winner(capsys):
    class Cand:
        spec, config, seconds = "aBC", {"bm": 8}, 0.0125
    Progress(4, enabled=True).close(budget_ended=True, winner=Cand())
    assert capsys.readouterr().err == ("tuning: the seconds budget ended the search after 0 of 4 candidates; "
                                       "picked aBC bm=8 (12.500 ms after the final rounds)\n")


def _make_clear():
    zero = tppasm.zero(4, 8)
    X = np.ones((8, 8, 4, 8), np.float32)

    @kernel("AB", Loop(0, 8), Loop(0, 8))
    def clear(i, j, X):
        zero(X[i, j])
    return clear, (X,), lambda: X


def test_search_budget_line_names_the_picked_spec(monkeypatch, capsys):
    measure = tune.measure

    def slow(*args, **kwargs):             # every candidate takes long: the budget ends the search
        measure(*args, **kwargs)
        time.sleep(0.03)
    monkeypatch.setattr(tune, "measure", slow)
    found = tune.search(_make_clear, seconds=0.3, progress=True, remember=False, model=False)
    lines = [line for line in capsys.readouterr().err.splitlines() if "budget ended" in line]
    assert len(lines) == 1 and f"; picked {found.record['spec']} (" in lines[0]


def test_search_that_finishes_names_the_picked_spec_and_calls_running_figures_first_timings(capsys):
    found = tune.search(_make_clear, progress=True, remember=False, model=False)
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(f"tuning: {found.record['timed']} of ") and "budget" not in err[-1]
    assert f"; picked {found.record['spec']} ({found.record['seconds'] * 1e3:.3f} ms after the final rounds)" \
        in err[-1]
    running = [line for line in err if line.startswith("tuning [")]
    assert running and all("fastest first timing " in line for line in running)


# -- 6. CLI help lines -------------------------------------------------------------------------------

def test_cli_help_lines(capsys):
    from bench import ddp_mlp, sve_static
    for parse, flag in ((ddp_mlp.parse, "--dtype"), (sve_static.parse, "--vl")):
        with pytest.raises(SystemExit):
            parse(["--help"])
        out = capsys.readouterr().out
        entry = out.split(f"\n  {flag} ", 1)[1].split("\n  -", 1)[0]    # its entry in the options, to the next
        assert re.search(r"[a-z]{4,}", entry.split("}", 1)[1]), f"{flag} has no help text:\n{entry}"


def test_help_on_a_block_spmm_kernel_shows_its_operands():
    import pydoc
    k = tppasm.block_spmm(bm=4, bk=4, n=16, kb=2)
    text = pydoc.render_doc(k, renderer=pydoc.plaintext)
    assert "values: 'float32[count, 4, 4]'" in text and "tppasm.block_spmm(4, 4, 16, 2)" in text
    assert type(k).__doc__ == type(k.kernel).__doc__ and isinstance(k, tppasm.spmm.BlockSpmmKernel)
