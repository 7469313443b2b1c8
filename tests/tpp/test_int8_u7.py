"""int8 BRGEMM with ``a_bits=7`` (A promised 0..127): ``vpmaddubsw`` on x86 targets without a VNNI
dot, exact int32 results against the reference with A at its bound (127) and B at its extremes,
any k (tails of a quad), leading dimensions, batch kinds, beta and relu; the dispatch; the errors;
and that a broken promise shows (the rows it spoils are the descriptor's ``unspecified`` ones)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tppasm as tpp
from tppasm.brgemm import Brgemm
from tppasm.x86.brgemm import generate_brgemm, target_features
from tests.support import isa_params, native
from tests.tpp.test_brgemm import _run

# (isa, target features): the two targets that take vpmaddubsw, and one with a VNNI dot
TARGETS = [("avx2", ()), ("avx512", ()), ("avx2", ("avx_vnni",))]


def _where(isa, feats):
    """Natively where the host runs the target with these features, else in the interpreter."""
    return "native" if native(isa) and set(feats) <= target_features(isa) else "interp"


def _targets():
    """The TARGETS as params, "interp" in the id of those the interpreter runs (the ISA summary counts them so)."""
    marks = {p.values[0]: p for p in isa_params(("avx2", "avx512"))}
    return [pytest.param(isa, feats, id=f"{isa}{'-interp' if _where(isa, feats) == 'interp' else ''}-"
                         f"{'+'.join(feats) or 'novnni'}", marks=marks[isa].marks)
            for isa, feats in TARGETS]


def _blocks(rng, d, count):
    """A (count, m, lda) u7 with 127 in random places; B VNNI4 blocks with -128 and 127 in random places."""
    a = rng.integers(0, 128, (count, d.m, d.lda)).astype(np.uint8)
    a[rng.random(a.shape) < 0.2] = 127
    b = rng.integers(-128, 128, (count, d.groups, d.n, 4)).astype(np.int8)
    b[rng.random(b.shape) < 0.2] = -128
    return a[:, :, :d.k], b


@pytest.mark.parametrize("isa, feats", _targets())
@settings(max_examples=40)
@given(st.integers(1, 20), st.integers(1, 40), st.integers(1, 70), st.sampled_from([0, 0, 3]),
       st.integers(1, 3), st.sampled_from([0, 1]), st.sampled_from([None, "relu"]),
       st.sampled_from(["stride", "address"]), st.integers(0, 2 ** 32 - 1))
def test_u7_is_exact(isa, feats, m, n, k, pad, count, beta, act, batch, seed):
    rng = np.random.default_rng(seed)
    d = Brgemm(m=m, n=n, k=k, lda=k + pad, dtype="i8", beta=beta, act=act, batch=batch, a_bits=7)
    d.validate()
    a, b = _blocks(rng, d, count)
    c0 = rng.integers(-10 ** 6, 10 ** 6, (m, n)).astype(np.int32)
    want = d.compute(list(a), list(b), c0.astype(np.int64)).astype(np.int32)
    got = c0.copy() if beta else np.full_like(c0, -12345)
    args = [a, b, got] if batch == "stride" else [list(a), list(b), got]
    _run(d, isa, (feats, _where(isa, feats)), args, count)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("isa", isa_params(("avx2", "avx512")))
def test_u7_public_call_on_the_host(isa):
    """Through tppasm.brgemm at each level the host runs (whatever dot it takes there)."""
    if not native(isa):
        pytest.skip(f"the public call runs {isa} kernels natively only")
    rng = np.random.default_rng(1)
    g = tpp.brgemm(61, 37, 131, "i8", a_bits=7, isa=isa)
    d = g.desc
    a, b = _blocks(rng, d, 2)
    c = np.full((61, 37), -12345, np.int32)
    g(np.ascontiguousarray(a), np.ascontiguousarray(b), c, count=2)
    np.testing.assert_array_equal(c, d.compute(list(a), list(b), np.zeros((61, 37), np.int64)).astype(np.int32))


def test_u7_dispatch():
    def text(isa, feats, a_bits):
        return generate_brgemm(Brgemm(m=6, n=16, k=64, dtype="i8", a_bits=a_bits), isa, feats).disassemble()
    for isa in ("avx2", "avx512"):
        u7 = text(isa, (), 7)
        assert "vpmaddubsw" in u7 and "vpsrlw" not in u7 and "vpsraw" not in u7     # no operand split
        assert "vpmaddubsw" not in text(isa, (), 8) and "vpsrlw" in text(isa, (), 8)
    assert "vpdpbusd" in text("avx2", ("avx_vnni",), 7) and "vpmaddubsw" not in text("avx2", ("avx_vnni",), 7)
    assert "vpdpbusd" in text("avx512", ("avx512_vnni",), 7)


@pytest.mark.parametrize("bad", [6, 9, 0, True, "7", 7.0, None])
def test_a_bits_is_checked(bad):
    with pytest.raises((ValueError, TypeError), match="a_bits"):
        tpp.brgemm(4, 4, 4, "i8", a_bits=bad)


@pytest.mark.parametrize("kw", [dict(dtype="f32"), dict(dtype="bf16"), dict(dtype="i8", signs="ss"),
                                dict(dtype="i8", signs="uu"), dict(dtype="i8", signs="su")])
def test_a_bits_7_needs_unsigned_a_and_signed_b(kw):
    with pytest.raises(ValueError, match="a_bits=7 is for dtype='i8', signs='us'"):
        tpp.brgemm(4, 4, 4, a_bits=7, **kw)


@pytest.mark.parametrize("isa, feats", _targets()[:2])
def test_a_broken_promise_spoils_exactly_the_unspecified_rows(isa, feats):
    """A row of 255s against B's -128s saturates vpmaddubsw's int16 pairs: that row differs from the
    exact sums, and it is the row ``unspecified`` names; the other rows stay exact."""
    d = Brgemm(m=3, n=16, k=8, dtype="i8", a_bits=7)
    a = np.full((1, 3, 8), 1, np.uint8)
    a[0, 1] = 255
    b = np.full((1, 2, 16, 4), -128, np.int8)
    got = np.full((3, 16), -12345, np.int32)
    _run(d, isa, (feats, _where(isa, feats)), [a, b, got], 1)
    want = d.compute(list(a), list(b), np.zeros((3, 16), np.int64)).astype(np.int32)
    wrong = (got != want).any(axis=1)
    assert wrong.tolist() == [False, True, False]
    assert d.unspecified(a, b, got)["c"].any(axis=1).tolist() == [False, True, False]
    assert Brgemm(m=3, n=16, k=8, dtype="i8").unspecified(a, b, got) == {}


@pytest.mark.parametrize("isa", [pytest.param("amx", id="amx_code"), pytest.param("sve", id="sve_code")])
def test_tile_and_sve_kernels_are_the_same_either_way(isa):
    """tdpbusd and SVE's dot products take any u8: the promise changes no instruction there."""
    from tppasm.kernel import Kernel
    shape = dict(m=32, n=32, k=64, dtype="i8")
    assert Kernel(Brgemm(**shape, a_bits=7), isa).disassemble() == Kernel(Brgemm(**shape), isa).disassemble()


@pytest.mark.parametrize("isa", isa_params(("avx2",)))
@settings(max_examples=15)
@given(data=st.data(), shape=st.sampled_from([(6, 16, 64), (5, 9, 7), (17, 33, 130)]))
def test_the_testing_strategies_keep_the_promise(isa, data, shape):
    """tppasm.testing draws A within its operand's max_value (127), so its check of a u7
    kernel compares every element (none unspecified) instead of skipping the rows it spoiled."""
    from tppasm.testing import assert_matches_reference
    from tppasm.testing.strategies import operands
    if not native(isa):
        pytest.skip("assert_matches_reference runs kernels natively")
    g = tpp.brgemm(*shape, "i8", a_bits=7, isa=isa)
    arrays = data.draw(operands(g))
    assert arrays[0].max() <= 127 and not g.desc.unspecified(*arrays)["c"].any()
    assert_matches_reference(g, *arrays)
