"""The host's verdict on AMX batch chunks (tppasm.x86.amx_probe): the setting, the timing rule,
the disk record a later process reuses, and the probe kernels themselves."""
import types

import numpy as np
import pytest

from isa.cpu import identity
from tppasm import cache
from tppasm.brgemm import Brgemm
from tppasm.x86 import amx, amx_probe


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """No setting, no verdict yet, an empty disk cache; the host made to run AMX natively."""
    monkeypatch.delenv(amx_probe.ENV, raising=False)
    amx_probe.reset()
    monkeypatch.setattr(amx_probe, "host", lambda: types.SimpleNamespace(levels=["avx2", "avx512", "amx"],
                                                                          vendor="GenuineIntel"))
    with cache.using(str(tmp_path)):
        yield
    amx_probe.reset()


def fake_timer(unchunked, chunked, calls):
    def time_kernel(chunked_kernel):
        calls.append(chunked_kernel)
        return chunked if chunked_kernel else unchunked
    return lambda build: time_kernel


@pytest.mark.parametrize("value, want", [("1", True), ("0", False), (" AUTO ", "auto"), ("", "auto")])
def test_setting(monkeypatch, value, want):
    monkeypatch.setenv(amx_probe.ENV, value)
    assert amx_probe.setting() == (want if want == "auto" else str(int(want)))


def test_a_bad_setting_names_the_choices(monkeypatch):
    monkeypatch.setenv(amx_probe.ENV, "yes")
    with pytest.raises(ValueError, match="expected 1 .* 0 .* or auto"):
        amx_probe.setting()


def test_interpreted_amx_keeps_chunks_off_without_timing(monkeypatch):
    monkeypatch.delenv(amx_probe.ENV, raising=False)
    amx_probe.reset()
    monkeypatch.setattr(amx_probe, "host", lambda: types.SimpleNamespace(levels=["avx2"], vendor="x"))
    assert amx_probe.verdict(lambda chunked: pytest.fail("no AMX here: nothing to time")) is False


@pytest.mark.parametrize("unchunked, chunked, want", [(1.3, 1.0, True), (1.02, 1.0, False), (1.0, 1.2, False)])
def test_verdict_is_timed_once_then_recalled(fresh, monkeypatch, unchunked, chunked, want):
    calls = []
    monkeypatch.setattr(amx_probe, "_native_timer", fake_timer(unchunked, chunked, calls))
    assert amx_probe.verdict(None) is want
    assert len(calls) == 2 * amx_probe.ROUNDS and calls[:2] == [False, True]       # interleaved
    assert amx_probe.verdict(None) is want and len(calls) == 2 * amx_probe.ROUNDS  # this process: kept
    amx_probe.reset()                                                            # a later process:
    assert amx_probe.verdict(None) is want and len(calls) == 2 * amx_probe.ROUNDS  # the disk record


def test_the_setting_overrides_the_verdict(fresh, monkeypatch):
    monkeypatch.setattr(amx_probe, "_native_timer", fake_timer(2.0, 1.0, []))
    assert amx_probe.verdict(None) is True
    monkeypatch.setenv(amx_probe.ENV, "0")
    assert amx_probe.verdict(None) is False and amx.chunks_on() is False


def test_a_damaged_record_is_timed_again(fresh, monkeypatch):
    calls = []
    monkeypatch.setattr(amx_probe, "_native_timer", fake_timer(2.0, 1.0, calls))
    key = f"{identity()} {sorted(amx_probe.PROBE.items())} margin={amx_probe.MARGIN}"
    cache.remember("amx", key, {"chunks": "yes"})
    assert amx_probe.verdict(None) is True and calls


def test_the_probe_kernels_differ_only_in_chunks():
    chunked, whole = amx._probe_kernel(True).disassemble(), amx._probe_kernel(False).disassemble()
    assert "tdpbf16ps" in chunked and "prefetcht0" in whole and "prefetcht0" not in chunked


def test_the_native_timer_calls_the_kernels():
    """The timer's calls, on a kernel of the probe's signature this host runs (AVX-512 or AVX2
    code: the same operands and count as the AMX probe kernels)."""
    from tppasm import backends
    from isa.cpu import host
    p = amx_probe.PROBE
    raw = backends.generate(Brgemm(p["m"], p["n"], p["k"], dtype="bf16"), host().isa)
    time_kernel = amx_probe._native_timer(lambda chunked: raw)
    seconds = time_kernel(True)
    assert 0 < seconds < 5
    r = amx_probe.decide(lambda chunked: 1.0)
    assert r == {"chunks": False, "speedup": 1.0}
