"""``kernel.reference(...)`` takes exactly the argument forms the kernel call takes and does the same
with NumPy (count inferred, outputs allocated when left out), or refuses them with the call's error;
and the call's own refusals of keywords name the fix."""
import inspect

import numpy as np
import pytest

import tppasm as tpp
from tppasm import spmm
from tppasm.dtypes import DtypeError
from tppasm.operand import OperandError

RNG = np.random.default_rng(7)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _z(*shape, dtype=np.float32):
    return np.zeros(shape, dtype)


def _relu_bitmask():
    x = _f32(2, 11)
    return tpp.relu(2, 11, bitmask=True), (x,), (x, _z(2, 11), _z(2, 2, dtype=np.uint8))


def _brgemm_bias():
    a, b, bias = _f32(3, 2, 4), _f32(3, 4, 5), _f32(5)
    return tpp.brgemm(2, 5, 4, bias=True, act="relu"), (a, b, bias), (a, b, _z(2, 5), bias)


def _brgemm_offset():
    a, b = _f32(3 * 8), _f32(3 * 20)
    offsets = np.array([[0, 40], [8, 0], [16, 20]], np.int64)
    full = (a, b, _z(2, 5), offsets)
    return tpp.brgemm(2, 5, 4, batch="offset"), full, full


def _brgemm_address():
    full = ([_f32(2, 4) for _ in range(3)], [_f32(4, 5) for _ in range(3)], _z(2, 5))
    return tpp.brgemm(2, 5, 4, batch="address"), full, full


def _block_spmm():
    rowptr, colidx, values = spmm.bcsr(spmm.random_block_sparse(2, 6, 2, 2, 0.0, RNG), 2, 2)
    b = _f32(6, 3)
    return tpp.block_spmm(2, 2, 3, 3), (rowptr, colidx, values, b), (rowptr, colidx, values, b, _z(2, 3))


CASES = {   # name: () -> (kernel, the inputs of the allocating form, every operand)
    "relu": lambda: (lambda x: (tpp.relu(2, 3), (x,), (x, _z(2, 3))))(_f32(2, 3)),
    "exp": lambda: (lambda x: (tpp.unary("exp", 2, 3), (x,), (x, _z(2, 3))))(_f32(2, 3)),
    "relu-bitmask": _relu_bitmask,
    "add-row": lambda: (lambda a, b: (tpp.binary("add", 2, 3, bcast_b="row"), (a, b), (a, b, _z(2, 3))))(
        _f32(2, 3), _f32(3)),
    "muladd": lambda: (lambda a, b, c: (tpp.ternary("muladd", 2, 3), (a, b, c), (a, b, c)))(
        _f32(2, 3), _f32(2, 3), _f32(2, 3)),
    "softmax-row-mask": lambda: (lambda x, m: (tpp.softmax(2, 3, mask="row"), (x, m), (x, m, _z(2, 3))))(
        _f32(2, 3), np.array([0, -np.inf, 0], np.float32)),
    "layernorm": lambda: (lambda x, g, b: (tpp.layernorm(2, 3), (x, g, b), (x, g, b, _z(2, 3))))(
        _f32(2, 3), _f32(3), _f32(3)),
    "brgemm": lambda: (lambda a, b: (tpp.brgemm(2, 5, 4), (a, b), (a, b, _z(2, 5))))(_f32(3, 2, 4), _f32(3, 4, 5)),
    "brgemm-bias": _brgemm_bias,
    "brgemm-offset": _brgemm_offset,
    "brgemm-address": _brgemm_address,
    "block_spmm": _block_spmm,
}


def _copy(args):
    return tuple([x.copy() for x in a] if isinstance(a, list) else a.copy() for a in args)


def _outcome(run, args, kwargs):
    """What ``run(*args, **kwargs)`` gives: ("error", type, message) or ("ok", returned, args after)."""
    try:
        got = run(*args, **kwargs)
    except Exception as e:              # noqa: BLE001 (the call's and the reference's errors are compared)
        return "error", type(e), str(e).replace(".reference()", ".__call__()")
    return "ok", got, args


def _same(got, want):
    if isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
    elif want is None:
        assert got is None
    else:
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2e-5, atol=2e-5)


def _forms(inputs, full):
    """The argument forms to try: (label, arrays, keywords)."""
    extra = full + (full[-1].copy() if not isinstance(full[-1], list) else full[-1][0].copy(),)
    return [("inputs", inputs, {}), ("every operand", full, {}), ("one array too many", extra, {}),
            ("one input missing", inputs[:-1], {}), ("count=2", full, {"count": 2}),
            ("count=2, inputs", inputs, {"count": 2}), ("count=99", full, {"count": 99}),
            ("count=0", full, {"count": 0}), ("out= keyword", inputs, {"out": full[-1]}),
            ("unknown keyword", full, {"cnt": 1})]


@pytest.mark.parametrize("case", CASES)
def test_reference_takes_the_call_forms_and_does_the_same(case):
    kernel, inputs, full = CASES[case]()
    for label, arrays, keywords in _forms(inputs, full):
        call = _outcome(kernel, _copy(arrays), keywords)
        ref = _outcome(kernel.reference, _copy(arrays), keywords)
        assert ref[0] == call[0], (label, call, ref)
        if call[0] == "error":
            assert ref[1:] == call[1:], label
        else:
            _same(ref[1], call[1])               # the same outputs returned (allocating form) or None
            _same(ref[2], call[2])               # and the same arrays afterwards (in place)


def test_reference_infers_count_and_refuses_one_the_blocks_cannot_honour():
    g = tpp.brgemm(2, 2, 2)
    A, B = np.ones((4, 2, 2), np.float32), np.ones((4, 2, 2), np.float32)
    C = np.zeros((2, 2), np.float32)
    g.reference(A, B, C)
    assert (C == 8).all()                        # all 4 blocks, as g(A, B, C)
    with pytest.raises(OperandError, match=r"holds 4 blocks but count=9; pass count<=4"):
        g.reference(A, B, C, count=9)


def test_block_spmm_reference_infers_count_and_allocates():
    a, b = np.ones((2, 6), np.float32), np.ones((6, 3), np.float32)
    rowptr, colidx, values = spmm.bcsr(a, 2, 2)
    k = tpp.block_spmm(2, 2, 3, 3)
    assert k.reference(rowptr[:2], colidx, values, b).tolist() == [[6.0] * 3] * 2
    assert k.desc.reference(rowptr[:2], colidx, values, b, c := np.zeros((2, 3), np.float32)) is None
    assert (c == 6).all()                        # the descriptor's default count: the stored blocks too


def test_reference_in_allocating_form_leaves_the_inputs_alone():
    x = np.array([[0.0, 1.0, 2.0]], np.float32)
    out = tpp.unary("exp", 1, 3).reference(x)
    assert x.tolist() == [[0.0, 1.0, 2.0]] and np.allclose(out, np.exp(x))
    out, mask = tpp.relu(1, 3, bitmask=True).reference(np.ones((1, 3), np.float32))
    assert out.tolist() == [[1.0] * 3] and mask.tolist() == [[7]]


def test_keyword_refusals_name_the_fix():
    k, x = tpp.relu(2, 3), np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match=r"positionally.*out=.*k\(x, out\)"):
        k(x, out=np.empty_like(x))
    with pytest.raises(TypeError, match=r"unary takes no count= \(it has no batch"):
        k(x, np.empty_like(x), count=2)
    with pytest.raises(TypeError, match=r"unexpected keyword cnt=; its only keyword is count="):
        tpp.brgemm(2, 2, 2)(np.ones((1, 2, 2), np.float32), np.ones((1, 2, 2), np.float32), cnt=1)


def test_random_block_sparse_names_the_dtypes():
    with pytest.raises(DtypeError, match="random_block_sparse: dtype='bf32' is not a tppasm dtype.*bf16"):
        spmm.random_block_sparse(4, 4, 2, 2, 0.5, np.random.default_rng(0), "bf32")
    assert spmm.random_block_sparse(4, 4, 2, 2, 0.5, np.random.default_rng(0), np.float64).dtype == np.float64


@pytest.mark.parametrize("batch, names", [("offset", ["a", "b", "c", "offsets", "bias"]),
                                          ("address", ["a", "b", "c", "bias"])])
def test_batched_brgemm_help_lists_its_operands(batch, names):
    g = tpp.brgemm(4, 5, 6, batch=batch, bias=True)
    params = inspect.signature(g).parameters
    assert list(params) == names + ["count"]
    assert params["c"].annotation == "float32[4, 5]"
    doc = inspect.getdoc(g)
    assert f"Call it as k({', '.join(names)}[, count=n])" in doc and "Operands:" in doc
    assert "a_ptrs" not in doc


def test_norm_summaries_are_whole_sentences_and_reprs_use_ldx():
    soft, norm = tpp.softmax(2, 3, ldx=4), tpp.layernorm(2, 3)
    assert inspect.getdoc(soft).splitlines()[0].endswith("over each row")
    assert inspect.getdoc(norm).splitlines()[0].endswith("gamma and beta are fp32 (n,)")
    assert "tppasm.softmax(2, 3, ldx=4)" in repr(soft) and "ldi" not in repr(soft)


def test_sve_brgemm_ignores_pace_and_does_not_show_it():
    paced = tpp.brgemm(4, 16, 8, isa="sve", pace=8)
    assert paced is tpp.brgemm(4, 16, 8, isa="sve") and "pace" not in repr(paced)
    with pytest.raises(ValueError, match="pace"):
        tpp.brgemm(4, 16, 8, isa="sve", pace=65)
