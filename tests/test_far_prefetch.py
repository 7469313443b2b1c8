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


@pytest.mark.parametrize("count", [3, 6, 8, 13])
def test_a_is_prefetched_only_for_a_next_chunk_of_the_same_call(monkeypatch, count):
    """The far prefetch of A reaches the next chunk of the call and never past the call's blocks
    plus one chunk; the last chunk prefetches B's blocks after the call's (a nest's next weight
    block) but no A (a nest over column blocks calls again on the same A). Run in the interpreter:
    the prefetched addresses, by operand and batch block."""
    import numpy as np
    from isa.x86.interp import Machine
    monkeypatch.setenv(far_prefetch.ENV, "1")
    gen = x86_brgemm.Gen(DESC, "avx2", x86_brgemm.target_features("avx2"))
    code = gen.build().code
    chunk, block = gen.chunk, DESC.m * DESC.k * 4
    assert gen.far_a == chunk * block and gen.far_b == chunk * block
    rng = np.random.default_rng(count)
    a, b = (rng.standard_normal((count + 2 * chunk, 64, 64)).astype(np.float32) for _ in range(2))  # room
    c = np.full((64, 64), np.nan, np.float32)
    m = Machine()
    pa, pb, pc = m.map(a), m.map(b), m.map(c)
    m.call(code, args=[pa, pb, pc, count])
    np.testing.assert_allclose(m.read(pc, like=c), np.einsum("bmk,bkn->mn", a[:count], b[:count]), rtol=1e-4, atol=1e-3)
    far = [op[3] for op in m.stats.tile_ops if op[0] == "prefetcht1"]
    a_blocks = {(addr - pa) // block for addr in far if 0 <= addr - pa < (count + chunk) * block}
    b_blocks = {(addr - pb) // block for addr in far if 0 <= addr - pb < (count + chunk) * block}
    last = (count - 1) // chunk * chunk                       # the last chunk's first block
    assert a_blocks == set(range(chunk, last + chunk)) if count > chunk else not a_blocks
    assert b_blocks == set(range(chunk, count + chunk))


def test_the_far_prefetch_of_b_walks_the_next_chunk_once_over_all_tiles(monkeypatch):
    """MiniLM's 32 x 16 x 384 GEMM (six row tiles, one block a call, chunks of 2): its far
    prefetches of B form one ascending walk through the block two on, every line of it, past it by
    at most a byte an iteration of rounding (not the same lines again from every row tile, nor all
    of them from the first). In the interpreter, with the result checked."""
    import numpy as np
    from isa.x86.interp import Machine
    monkeypatch.setenv(far_prefetch.ENV, "1")
    desc = Brgemm(m=32, n=16, k=384, lda=384, ldc=16)
    gen = x86_brgemm.Gen(desc, "avx2", x86_brgemm.target_features("avx2"))
    code = gen.build().code
    block = 384 * 16 * 4
    assert gen.chunk == 2 and gen.far_b == 2 * block and 0 < gen.spread < 128
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, 32, 384)).astype(np.float32)
    b = rng.standard_normal((4, 384, 16)).astype(np.float32)       # the call's block, then three more
    c = np.full((32, 16), np.nan, np.float32)
    m = Machine()
    pa, pb, pc = m.map(a), m.map(b), m.map(c)
    m.call(code, args=[pa, pb, pc, 1])
    np.testing.assert_allclose(m.read(pc, like=c), a[0] @ b[0], rtol=1e-4, atol=1e-3)
    walk = [op[3] - pb for op in m.stats.tile_ops if op[0] == "prefetcht1" and op[3] - pb >= block]
    lines = sorted({x // 64 for x in walk})
    assert walk == sorted(walk)
    assert lines[0] == 2 * block // 64 and lines[-1] - lines[0] + 1 == len(lines)   # from block 2, no gaps
    iterations = len(walk) // len(range(0, gen.spread, 64))                          # (prefetches each)
    assert 3 * block <= lines[-1] * 64 + 64 <= 3 * block + iterations + 128         # rounding: a byte an iteration
