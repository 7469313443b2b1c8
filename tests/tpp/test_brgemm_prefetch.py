"""``prefetch=False`` BRGEMMs: no software prefetch in their code, the same results as any kernel
(x86 levels natively and in the interpreter, AMX in the interpreter or natively), the SVE kernels
unchanged, and a clear error for anything but a bool."""
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tppasm
from tppasm.backends import generator
from tppasm.brgemm import Brgemm
from tppasm.x86 import amx
from tppasm.x86 import brgemm as x86_brgemm
from tppasm.x86.brgemm import target_features
from tests.tpp.test_amx import _check, _run as _run_amx
from tests.tpp.test_brgemm import _params, _round_trip, descriptors


def _x86_text(desc, isa, features):
    return str(x86_brgemm.Gen(desc, isa, features).build().disassemble())


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("dtype", ["f32", "bf16", "i8"])
def test_x86_kernels_prefetch_unless_told_not_to(isa, dtype, monkeypatch):
    """A 64 x 64 x 128 block prefetches B ahead and, with the far prefetch on, the next chunk;
    with prefetch=False the code holds no prefetch at all."""
    monkeypatch.setenv("TPPASM_FAR_PREFETCH", "1")
    desc = Brgemm(m=64, n=64, k=128, dtype=dtype)
    feats = target_features(isa)
    assert "prefetcht0" in _x86_text(desc, isa, feats) and "prefetcht1" in _x86_text(desc, isa, feats)
    assert "prefetch" not in _x86_text(dataclasses.replace(desc, prefetch=False), isa, feats)


@pytest.mark.parametrize("isa, dtype, features", _params())
@settings(max_examples=6)
@given(data=st.data())
def test_x86_results_without_prefetches(isa, dtype, features, data):
    """Every element of C against the reference, as for any kernel (the round trip of test_brgemm)."""
    feats, where = features
    desc = dataclasses.replace(data.draw(descriptors(dtype, where == "interp")), prefetch=False)
    variant = (tuple(target_features(isa)) if feats is None else feats, where)
    assert "prefetch" not in _x86_text(desc, isa, variant[0])
    _round_trip(desc, isa, variant, data.draw(st.integers(1, 3)), data.draw(st.integers(0, 2 ** 32 - 1)))


@pytest.mark.parametrize("dtype, c_dtype", [("bf16", "f32"), ("bf16", "bf16"), ("i8", "i32")])
@pytest.mark.parametrize("m, n, k, count", [(64, 64, 64, 3), (40, 24, 70, 2)])
def test_amx_kernels_without_prefetches(dtype, c_dtype, m, n, k, count, monkeypatch):
    """The AMX kernel prefetches the next batch block, and with prefetch=False does not; its
    results are checked element by element either way."""
    monkeypatch.setenv("TPPASM_AMX_CHUNKS", "0")          # chunked kernels prefetch nothing anyway
    desc = Brgemm(m=m, n=n, k=k, dtype=dtype, c_dtype=c_dtype)
    assert "prefetcht0" in amx.generate(desc).disassemble()
    quiet = dataclasses.replace(desc, prefetch=False)
    assert "prefetch" not in amx.generate(quiet).disassemble()
    for d in (desc, quiet):
        c, ref, cbuf, _, (a_blk, b_blk, _, _) = _run_amx(d, count, seed=m * n + k)
        _check(d, c, ref, cbuf, a_blk, b_blk, count)


def test_sve_kernels_are_the_same_either_way():
    """The SVE kernels issue no software prefetch: prefetch=False builds the same kernel."""
    desc = Brgemm(m=8, n=16, k=32)
    gen = generator("sve", "brgemm")
    assert gen(desc, "sve").code == gen(dataclasses.replace(desc, prefetch=False), "sve").code
    assert tppasm.brgemm(8, 16, 32, prefetch=False, isa="sve") is tppasm.brgemm(8, 16, 32, isa="sve")


@pytest.mark.parametrize("bad", ["no", None, 2, 0.5])
def test_prefetch_takes_a_bool(bad):
    with pytest.raises(ValueError, match=r"prefetch=.*expected True or False"):
        tppasm.brgemm(8, 8, 8, prefetch=bad)
