"""Round 12 fixes of values at the edges: huge Python ints as parameters (refused with the project's
ValueError, and named in a message without converting them whole), NumPy references that stay quiet
on inf * 0, what dequant and rotary document, and kernel views of SVE code without capstone."""
import importlib
import sys
import warnings

import numpy as np
import pytest

import tppasm as tpp
from tppasm import display
from tppasm.rotary import rope_tables

quant, rotary = (importlib.import_module(f"tppasm.{name}") for name in ("quant", "rotary"))  # (modules, not functions)

HUGE = 10 ** 5000            # past the 4300 digits str() converts by default
BIG = 10 ** 400              # past a float's range


# 1. a huge int as scale=, eps=, base=: the ValueError 1e39 gets, not a bare OverflowError

@pytest.mark.parametrize("build", [lambda v: tpp.softmax(4, 4, scale=v), lambda v: tpp.layernorm(4, 16, eps=v),
                                   lambda v: tpp.rmsnorm(4, 16, eps=v)], ids=["softmax", "layernorm", "rmsnorm"])
@pytest.mark.parametrize("value", [BIG, -BIG], ids=["positive", "negative"])
def test_norm_float_parameter_refuses_an_int_past_a_float(build, value):
    with pytest.raises(ValueError, match=r"expected a finite fp32 value .*\(401 digits\)|401 digits.*finite fp32"):
        build(value)


def test_rope_tables_refuses_a_base_past_a_float():
    with pytest.raises(ValueError, match="base=.*expected a finite number > 0"):
        rope_tables([0, 1], 8, base=BIG)


def test_rope_tables_says_positions_are_beyond_int64():
    with pytest.raises(ValueError, match=r"beyond int64 \(e\.g\. 10{30}\); pass them as floats"):
        rope_tables([10 ** 30], 4)
    cos, _ = rope_tables([10 ** 19], 4)          # (uint64 still fits NumPy: accepted as before)
    assert cos.shape == (1, 2)


# 2. messages that name a huge int are built without converting it whole

def test_shown_describes_a_huge_int_by_its_digit_count():
    assert display.shown(HUGE) == "<an int of 5001 digits>"
    assert display.shown(-HUGE + 1) == "-<an int of 5000 digits>"
    assert display.shown([HUGE, 2]) == "[<an int of 5001 digits>, 2]"
    assert display.shown(BIG) == "100000000000...000000 (401 digits)"
    assert display.shown(12345) == "12345"


@pytest.mark.parametrize("digits", [602, 603, 604, 700, 5000])
def test_int_text_counts_digits_exactly_at_powers_of_ten(digits):
    for value in (10 ** (digits - 1), 10 ** digits - 1):
        text = display.int_text(value)
        assert text == f"<an int of {digits} digits>" or text == str(value)


def test_a_norm_refusing_a_huge_int_names_it_not_the_str_digit_limit():
    with pytest.raises(ValueError, match="scale=-<an int of 5001 digits>; expected a finite fp32 value"):
        tpp.softmax(4, 4, scale=-HUGE)
    with pytest.raises(ValueError, match="base=<an int of 5001 digits>"):
        rope_tables([0, 1], 8, base=HUGE)


# 3. the rotary and dequant references: inf * 0 is NaN, without a RuntimeWarning

def test_rotary_and_dequant_references_are_quiet_on_inf_times_zero():
    x = np.array([[np.inf, 1.0]], np.float32)
    table = np.zeros((1, 1), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = tpp.rotary(1, 2, 2).reference(x, table, table, np.empty_like(x))
        out = np.empty((1, 1), np.float32)
        tpp.dequant(1, 1).reference(np.ones((1, 1), np.int32), np.zeros(1, np.int32),
                                    np.array([np.inf], np.float32), np.zeros(1, np.float32), out)
    assert y is None and np.isnan(out).all()


# 4. dequant documents that the scales' fp32 product loses precision below 2^-126

def test_dequant_documents_the_scale_product_underflow():
    for doc in (quant.__doc__, quant.Dequant.__doc__, tpp.dequant.__doc__):
        assert "2^-126" in doc
    c = np.full((1, 1), 2 * 10 ** 9, np.int32)
    scales = np.array([1e-23], np.float32)
    args = (c, np.zeros(1, np.int32), scales, scales)
    k = tpp.dequant(1, 1)
    assert k(*args)[0, 0] == k.reference(*args)[0, 0] == 0.0       # as documented: the product is 0


# 5. rotary: cos and sin share ldt, and the docs say how to give both one row stride

def test_rotary_documents_that_cos_and_sin_share_ldt():
    assert "same row stride" in tpp.rotary.__doc__ and "np.ascontiguousarray" in tpp.rotary.__doc__
    assert "one for both tables" in rotary.__doc__
    x = np.ones((8, 8), np.float32)
    cos, sin = np.ones((8, 12), np.float32)[:, :4], np.zeros((8, 4), np.float32)
    k = tpp.rotary(8, 8, 8)
    assert np.array_equal(k(x, np.ascontiguousarray(cos), np.ascontiguousarray(sin)), x)   # the advice works


# 6. SVE kernels without capstone: repr and the notebook view never raise; disassembly says what to install

@pytest.fixture
def no_capstone(monkeypatch):
    monkeypatch.setitem(sys.modules, "capstone", None)      # `import capstone` raises ModuleNotFoundError


@pytest.fixture
def sve_kernel(monkeypatch):
    k = tpp.relu(3, 5, isa="sve")
    monkeypatch.setattr(k, "_instructions", None, raising=False)    # not what an earlier repr kept
    return k


def test_sve_kernel_repr_without_capstone_leaves_out_the_instruction(no_capstone, sve_kernel):
    text = repr(sve_kernel)
    assert text.startswith("<ReluKernel tppasm.unary('relu', 3, 5") and " on sve: " in text and "bytes" in text
    assert str(sve_kernel) == text and repr([sve_kernel]) == f"[{text}]"
    page = sve_kernel._repr_html_()
    assert "pip install capstone" in page and "<details>" not in page


def test_sve_instruction_mix_without_capstone_says_what_to_install(no_capstone, sve_kernel):
    with pytest.raises(ModuleNotFoundError, match=r"needs capstone: pip install capstone \(or tppasm\[test\]\)"):
        sve_kernel.instruction_mix()
    with pytest.raises(ModuleNotFoundError, match="pip install capstone"):
        display.machine_code(sve_kernel)
    with pytest.raises(ModuleNotFoundError, match="pip install capstone"):
        sve_kernel.disassemble()


def test_sve_kernel_repr_names_the_instruction_with_capstone(sve_kernel):
    pytest.importorskip("capstone")
    assert "(sve), " in repr(sve_kernel) and "<details>" in sve_kernel._repr_html_()
