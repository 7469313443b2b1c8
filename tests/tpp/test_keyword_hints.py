"""A dtype keyword given to a constructor that does not take it (another one does) names the fix,
not Python's bare "unexpected keyword argument" (tppasm.keywords.HINTS)."""
import re

import pytest

import tppasm
from tppasm.keywords import refuse_keywords


def test_dequant_dtype_names_out_dtype():
    with pytest.raises(TypeError, match=r"dequant\(\) takes no dtype=: its input c is always int32 .*"
                                        r"write out_dtype='bf16'"):
        tppasm.dequant(4, 4, dtype="bf16")


def test_dequant_keeps_its_other_refusals():
    with pytest.raises(TypeError, match=r"takes no c_dtype=.*write out_dtype='bf16'"):
        tppasm.dequant(4, 4, c_dtype="bf16")
    with pytest.raises(TypeError, match=r"takes no ldc=.*write ldx=3"):
        tppasm.dequant(4, 4, ldc=3)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'colour'"):
        tppasm.dequant(4, 4, colour=1)


@pytest.mark.parametrize("name", ["out_dtype", "c_dtype"])
def test_quantize_output_dtype_says_it_is_fixed(name):
    with pytest.raises(TypeError, match=rf"quantize\(\) takes no {name}=: q is always uint8"):
        tppasm.quantize(4, 4, **{name: "bf16"})


@pytest.mark.parametrize("who, name, fix", [
    ("relu", "out_dtype", r"write tppasm.unary\('relu', m, n, \.\.\., out_dtype='f32'\)"),
    ("zero", "out_dtype", r"write dtype='f32'"),
    ("zero", "c_dtype", r"write dtype='f32'"),
    ("transform", "out_dtype", r"tppasm.copy\(\.\.\., out_dtype='f32'\)"),
    ("block_spmm", "out_dtype", r"c is always f32.*tppasm.copy\(\.\.\., out_dtype='f32'\)"),
    ("block_spmm", "c_dtype", r"c is always f32"),
], ids=lambda v: v if v.isidentifier() else "fix")
def test_hint_names_the_fix(who, name, fix):
    with pytest.raises(TypeError, match=rf"{who}\(\) takes no {name}=: .*{fix}"):
        refuse_keywords(who, {name: "f32"})


@pytest.mark.parametrize("takes", [None, "out_dtype"])
def test_hint_wins_over_the_output_dtype_alias(takes):
    """relu takes no out_dtype at all: c_dtype= must not be told to write out_dtype=."""
    with pytest.raises(TypeError, match=r"relu\(\) takes no c_dtype=: .*tppasm.unary\('relu'"):
        refuse_keywords("relu", {"c_dtype": "bf16"}, takes)


def test_no_output_dtype_keyword_refuses_plainly():
    with pytest.raises(TypeError, match=r"softmax\(\) got an unexpected keyword argument 'colour'"):
        refuse_keywords("softmax", {"colour": 1}, None)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'c_dtype'"):
        refuse_keywords("other", {"c_dtype": 1}, None)


@pytest.mark.parametrize("make, fix", [
    (lambda **kw: tppasm.relu(2, 2, **kw), r"tppasm.unary\('relu', m, n, \.\.\., out_dtype='bf16'\)"),
    (lambda **kw: tppasm.zero(2, 2, **kw), r"write dtype='bf16'"),
    (lambda **kw: tppasm.transform("transpose", 2, 2, **kw), r"tppasm.copy\(\.\.\., out_dtype='bf16'\)"),
    (lambda **kw: tppasm.block_spmm(4, 4, 16, 2, **kw), r"c is always f32.*tppasm.copy\(\.\.\., out_dtype='bf16'\)")])
def test_constructors_without_an_output_dtype_name_the_fix(make, fix):
    with pytest.raises(TypeError, match=fix):
        make(out_dtype="bf16")
    with pytest.raises(TypeError, match="unexpected keyword argument 'fo'"):
        make(fo=1)


def test_a_dtype_object_is_written_as_its_name_in_the_fix():
    import numpy as np
    with pytest.raises(TypeError, match=r"write dtype='f32'$"):
        tppasm.zero(4, 8, out_dtype=np.float32)
    with pytest.raises(TypeError, match=r"write out_dtype='f32'$"):
        tppasm.softmax(4, 4, c_dtype=np.float32)


@pytest.mark.parametrize("make, fix", [
    (lambda: tppasm.softmax(4, 4, ldi=8), r"ldi= is now ldx=.*write ldx=8"),
    (lambda: tppasm.quantize(4, 4, ldi=8), r"write ldx=8"),
    (lambda: tppasm.binary("add", 4, 4, ldx=8), r"lda= and ldb=; write lda=8"),
    (lambda: tppasm.ternary("muladd", 4, 4, ldo=8), r"output c is ldc=; write ldc=8"),
    (lambda: tppasm.brgemm(4, 4, 4, ldo=8), r"write ldc=8"),
    (lambda: tppasm.zero(4, 4, ldx=8), r"write ldo=8")])
def test_a_row_stride_named_as_another_constructor_names_it(make, fix):
    with pytest.raises(TypeError, match=fix):
        make()


def test_quantize_ldq_names_ldo():
    with pytest.raises(TypeError, match=r"quantize\(\) takes no ldq=: the row stride of q \(the output\) is ldo=.*"
                                        r"write ldo=8"):
        tppasm.quantize(4, 4, ldq=8)


# every (constructor, keyword) of tppasm.keywords.HINTS, written out: a hint dropped from the table
# (gemm_nt's ldo=, rotary's ldi= went unnoticed) must fail here, not fall back to Python's bare refusal
HINTED = [("binary", "ldx"), ("block_spmm", "c_dtype"), ("block_spmm", "out_dtype"), ("brgemm", "ldo"),
          ("brgemm", "ldx"), ("dequant", "dtype"), ("dequant", "ldc"), ("dequant", "ldi"), ("gemm_nt", "ldo"),
          ("gemm_nt", "ldx"), ("layernorm", "ldi"), ("quantize", "c_dtype"), ("quantize", "ldi"),
          ("quantize", "ldq"), ("quantize", "out_dtype"), ("relu", "c_dtype"), ("relu", "out_dtype"),
          ("rmsnorm", "ldi"), ("rotary", "ldi"), ("softmax", "ldi"), ("ternary", "ldo"), ("ternary", "ldx"),
          ("transform", "c_dtype"), ("transform", "out_dtype"), ("zero", "c_dtype"), ("zero", "ldx"),
          ("zero", "out_dtype")]
MAKE = {"binary": lambda **kw: tppasm.binary("add", 4, 4, **kw),
        "block_spmm": lambda **kw: tppasm.block_spmm(4, 4, 16, 2, **kw),
        "brgemm": lambda **kw: tppasm.brgemm(4, 4, 4, **kw), "dequant": lambda **kw: tppasm.dequant(4, 4, **kw),
        "gemm_nt": lambda **kw: tppasm.gemm_nt(4, 4, 4, **kw),
        "layernorm": lambda **kw: tppasm.layernorm(4, 16, **kw), "quantize": lambda **kw: tppasm.quantize(4, 4, **kw),
        "relu": lambda **kw: tppasm.relu(2, 2, **kw), "rmsnorm": lambda **kw: tppasm.rmsnorm(4, 16, **kw),
        "rotary": lambda **kw: tppasm.rotary(4, 8, 8, **kw), "softmax": lambda **kw: tppasm.softmax(4, 4, **kw),
        "ternary": lambda **kw: tppasm.ternary("muladd", 4, 4, **kw),
        "transform": lambda **kw: tppasm.transform("transpose", 2, 2, **kw),
        "zero": lambda **kw: tppasm.zero(4, 4, **kw)}


def test_the_table_of_hints_is_the_one_tested():
    from tppasm.keywords import HINTS
    assert sorted(HINTS) == HINTED


@pytest.mark.parametrize("who, name", HINTED, ids=[f"{w}-{n}" for w, n in HINTED])
def test_every_constructor_gives_its_hint(who, name):
    value = 8 if name.startswith("ld") else "bf16"
    with pytest.raises(TypeError) as e:
        MAKE[who](**{name: value})
    assert f"{who}() takes no {name}=: " in str(e.value)
    if name.startswith("ld"):                               # a row stride: the keyword to write instead
        assert re.search(r"write ld[a-z]=8\b", str(e.value)), e.value


@pytest.mark.parametrize("make, tail", [
    (lambda: tppasm.reduce("add", 4, 8, ldo=9), r"'ldo' \(did you mean ldx=\?\); it takes op, m, n, over, ldx, "),
    (lambda: tppasm.brgemm(4, 4, 4, ldd=3), r"'ldd' \(did you mean ldc=\?\); it takes m, n, k, dtype, lda, "),
    (lambda: tppasm.softmax(2, 3, colour=1), r"'colour'; it takes m, n, ldx, ldo, dtype, out_dtype, scale, mask"),
])
def test_an_unknown_keyword_is_told_what_the_constructor_takes(make, tail):
    with pytest.raises(TypeError, match=r"got an unexpected keyword argument " + tail):
        make()
