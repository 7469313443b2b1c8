"""The x86 BRGEMM's prefetch of the next batch chunk into L2 (tppasm.x86.far_prefetch): on AMD,
off elsewhere, ``TPPASM_FAR_PREFETCH`` overriding; the setting reaches the code and its cache key."""
import types

import pytest

from tppasm import backends
from tppasm.brgemm import Brgemm
from tppasm.cache import disk, kernels
from tppasm.x86 import brgemm as x86_brgemm
from tppasm.x86 import far_prefetch

DESC = Brgemm(m=64, n=64, k=64, dtype="f32")         # 32 KiB of A and B a block: a far prefetch's size


def far_prefetches(isa="avx512"):
    gen = x86_brgemm.Gen(DESC, isa, x86_brgemm.target_features(isa))
    text = gen.build().disassemble()
    return (gen.far_a, gen.far_b), text.count("prefetcht1")


@pytest.mark.parametrize("value, want", [("1", "1"), ("0", "0"), (" Auto ", "auto"), ("", "auto")])
def test_setting(monkeypatch, value, want):
    monkeypatch.setenv(far_prefetch.ENV, value)
    assert far_prefetch.setting() == want


def test_a_bad_setting_names_the_choices(monkeypatch):
    monkeypatch.setenv(far_prefetch.ENV, "yes")
    with pytest.raises(ValueError, match="TPPASM_FAR_PREFETCH='yes': expected 1 .* 0 .* or auto"):
        far_prefetch.enabled()


@pytest.mark.parametrize("vendor, on", [("AuthenticAMD", True), ("GenuineIntel", False), ("HygonGenuine", False)])
def test_by_default_only_amd_prefetches(monkeypatch, vendor, on):
    monkeypatch.delenv(far_prefetch.ENV, raising=False)
    monkeypatch.setattr(far_prefetch, "host", lambda: types.SimpleNamespace(vendor=vendor))
    assert far_prefetch.enabled() is on and far_prefetch.option_text() == str(int(on))


def test_the_setting_reaches_the_code(monkeypatch):
    monkeypatch.setenv(far_prefetch.ENV, "1")
    distances, with_far = far_prefetches()
    assert min(distances) > 0 and with_far > 0
    monkeypatch.setenv(far_prefetch.ENV, "0")
    distances, without = far_prefetches()
    assert distances == (0, 0) and without < with_far


@pytest.mark.parametrize("isa", ["avx2", "avx512", "amx"])
def test_the_setting_is_part_of_the_kernel_cache_key(monkeypatch, tmp_path, isa):
    code, keys = kernels.KernelCode(disk.DiskStore(str(tmp_path), 1 << 20)), set()
    for value in ("1", "0"):
        monkeypatch.setenv(far_prefetch.ENV, value)
        assert f"{far_prefetch.ENV}={value}" in backends.code_options(isa)
        keys.add(code.raw_key(DESC, isa))
    assert len(keys) == 2


def test_only_brgemm_keys_carry_the_brgemm_options(monkeypatch, tmp_path):
    """An element-wise kernel's key neither changes with these options nor asks for the AMX chunk
    verdict (timed per process where AMX runs: two processes that disagreed missed each other's
    relu kernels in one cache); a BRGEMM's does."""
    from tppasm.eltwise import Unary
    from tppasm.x86 import amx_probe
    code = kernels.KernelCode(disk.DiskStore(str(tmp_path), 1 << 20))
    relu, keys = Unary("relu", 2, 8), {}
    for chunks in ("0", "1"):
        for far in ("0", "1"):
            monkeypatch.setenv("TPPASM_AMX_CHUNKS", chunks)
            monkeypatch.setenv(far_prefetch.ENV, far)
            keys[chunks, far] = (code.raw_key(relu, "amx"), code.raw_key(DESC, "amx"), code.raw_key(DESC, "avx512"))
    assert len({k[0] for k in keys.values()}) == 1 and len({k[1] for k in keys.values()}) == 4
    assert len({k[2] for k in keys.values()}) == 2
    monkeypatch.delenv("TPPASM_AMX_CHUNKS")
    monkeypatch.setattr(amx_probe, "_stored_or_timed", lambda build: pytest.fail("no BRGEMM here: nothing to time"))
    amx_probe.reset()
    try:
        assert code.raw_key(relu, "amx") == keys["0", "0"][0]
    finally:
        amx_probe.reset()
