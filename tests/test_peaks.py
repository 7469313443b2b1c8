"""bench.peaks: which unit defines each dtype's peak, on this host and on others, and its errors
(the loops' speed is measured by the benches, never asserted here)."""
import pytest

from bench import peaks
from isa.cpu import host


@pytest.mark.parametrize("isa,dtype,want", [
    ("avx2", "f32", ("FMA",)), ("avx2", "bf16", ("FMA",)),
    ("avx512", "bf16", ("BF16-dot", "FMA")), ("avx512", "i8", ("VNNI", "u7", "madd")),
    ("amx", "bf16", ("AMX", "BF16-dot", "FMA")), ("amx", "i8", ("AMX", "VNNI", "u7", "madd")),
    ("amx", "f32", ("FMA",))])
def test_units_of_a_full_featured_target(isa, dtype, want):
    if isa == "avx512" and isa in host().levels and not (host().has("avx512_bf16") and host().has("avx512_vnni")):
        pytest.skip("this AVX-512 host lacks BF16/VNNI: its own features decide")
    assert peaks.units(dtype, isa) == want


def test_the_kernel_unit_is_one_the_host_has():
    for dtype in ("f32", "bf16", "i8"):
        assert peaks.kernel_unit(dtype) in peaks.units(dtype)
        assert peaks.best_unit(dtype) == peaks.units(dtype)[0]
    assert peaks.kernel_unit("i8", a_bits=7) in peaks.units("i8")


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_u7_kernels_take_the_u7_unit_without_vnni(isa, monkeypatch):
    """A 7-bit-A BRGEMM of a target without a VNNI dot is timed against the vpmaddubsw loop, the
    8-bit one against vpmaddwd's; with VNNI both against vpdpbusd."""
    monkeypatch.setattr(peaks, "_features", lambda isa: frozenset())
    assert (peaks.kernel_unit("i8", isa, a_bits=7), peaks.kernel_unit("i8", isa)) == ("u7", "madd")
    monkeypatch.setattr(peaks, "_features", lambda isa: frozenset({"avx_vnni", "avx512_vnni"}))
    assert (peaks.kernel_unit("i8", isa, a_bits=7), peaks.kernel_unit("i8", isa)) == ("VNNI", "VNNI")


def test_the_u7_loop_does_its_work():
    """The u7 loop's instructions, in the interpreter: 3 per accumulator per copy, work 8 x lanes each."""
    from isa.x86.interp import Machine
    fn, per = peaks._vector_loop("u7", "avx2", 2)
    m = Machine()
    m.call(fn.code, args=[2])
    counts = m.stats.counts
    assert counts["vpmaddubsw"] == counts["vpmaddwd"] == counts["vpaddd"] == 2 * per // 64


def test_errors_name_the_legal_values():
    with pytest.raises(ValueError, match="expected 'f32', 'bf16' or 'i8'"):
        peaks.units("f16")
    with pytest.raises(ValueError, match="expected one of FMA"):
        peaks.peak_loop("f32", "TPU")
    missing = next(u for u in peaks.UNITS if u not in peaks.units("bf16"))
    with pytest.raises(ValueError, match="pass unit=None"):
        peaks.peak_loop("bf16", missing)
