"""isa.cpu.caches(): cache sizes read from sysfs, defaults where the OS does not say."""
from isa.cpu import DEFAULT_CACHES, Cache, caches


def _index(root, i, **files):
    d = root / f"index{i}"
    d.mkdir()
    for name, value in files.items():
        (d / name).write_text(value + "\n")


def test_reads_data_caches_and_skips_instruction_ones(tmp_path):
    common = {"coherency_line_size": "64"}
    _index(tmp_path, 0, level="1", type="Data", size="48K", shared_cpu_list="0,64", **common)
    _index(tmp_path, 1, level="1", type="Instruction", size="32K", shared_cpu_list="0", **common)
    _index(tmp_path, 2, level="2", type="Unified", size="2048K", shared_cpu_list="0", **common)
    _index(tmp_path, 3, level="3", type="Unified", size="105M", shared_cpu_list="0-55,112-167", **common)
    assert caches(str(tmp_path)) == (Cache(1, 48 << 10, 64, 2), Cache(2, 2 << 20, 64, 1),
                                     Cache(3, 105 << 20, 64, 112))


def test_missing_or_broken_levels_fall_back(tmp_path):
    _index(tmp_path, 0, level="1", type="Data", size="garbage", coherency_line_size="64", shared_cpu_list="0")
    _index(tmp_path, 1, level="2", type="Unified", size="512K", coherency_line_size="64", shared_cpu_list="0")
    got = caches(str(tmp_path))
    assert got[0] == DEFAULT_CACHES[0] and got[1] == Cache(2, 512 << 10) and got[2] == DEFAULT_CACHES[2]
    assert caches(str(tmp_path / "nowhere")) == DEFAULT_CACHES
