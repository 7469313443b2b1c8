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
