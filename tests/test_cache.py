"""The disk cache: a second process loads instead of generating; every blob verified; a safe
directory; concurrent and killed writers; the size cap; the tuner's records; the CLI. (What is
stored, and the in-process cache: test_cache_code.py.)"""
import json
import os
import stat
import struct
import warnings

import numpy as np
import pytest

import tppasm.cache as tc
from tests.scripts import run, start
from tppasm import backends, kernel as tk
from tppasm.cache import disk, kernels
from tppasm.cache.files import pack_entry, unpack_entry
from tppasm.eltwise import Unary

# kernels of several kinds; the script checks each against NumPy on NaN-poisoned outputs
KERNELS = r"""
import json, os, sys
import numpy as np, tppasm as tpp
rng = np.random.default_rng(0)
made = []
def check(k, ins, out, ref):
    out[...] = np.nan
    k(*ins, out)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    made.append(k)
for n in range(3, 3 + N):
    x = rng.standard_normal((3, n)).astype(np.float32)
    check(tpp.relu(3, n), [x], np.empty_like(x), np.maximum(x, 0))
    check(tpp.binary("add", 3, n), [x, x], np.empty_like(x), 2 * x)
a, b = rng.standard_normal((2, 5, 7)).astype(np.float32), rng.standard_normal((2, 7, 6)).astype(np.float32)
g = tpp.brgemm(m=5, n=6, k=7)
c = np.full((5, 6), np.nan, np.float32); g(a, b, c, count=2); made.append(g)
np.testing.assert_allclose(c, np.einsum("bmk,bkn->mn", a, b), rtol=1e-5, atol=1e-5)
print(json.dumps({"from_disk": sum(k.from_disk for k in made), "kernels": len(made)}))
"""


def _kernels(tmp_path, n=3, **env):
    out = run(f"N = {n}\n" + KERNELS, {"TPPASM_CACHE_DIR": str(tmp_path), **env})
    return json.loads(out.splitlines()[-1])


def _fill(root, descs):
    """Store the code of ``descs`` (host ISA) in the cache at ``root``, from this process."""
    with tc.using(root):
        for desc in descs:
            tk.Kernel(desc, tk.host().isa, code_cache=tc.kernel_code())


def _fill_like_kernels(root, n):
    from tppasm.brgemm import Brgemm
    from tppasm.eltwise import Binary
    _fill(root, [d for k in range(3, 3 + n) for d in (Unary("relu", 3, k), Binary("add", 3, k))]
          + [Brgemm(5, 6, 7)])


@pytest.fixture
def cache_dir(tmp_path):
    """This process uses a fresh cache in ``tmp_path`` (and its own again afterwards)."""
    with tc.using(tmp_path):
        yield tmp_path


def _data_files(root):
    return sorted(p for p in root.glob("seg-*/data.ninja"))


# -- across processes ------------------------------------------------------------------------

def test_a_process_whose_kernels_all_come_from_disk_imports_no_generator(tmp_path):
    """The BRGEMM's cache key reads the code options (TPPASM_FAR_PREFETCH); their modules register
    them, where all of the family's generators were imported for it (~13 ms of such a process)."""
    script = "N = 2\n" + KERNELS + ("print(json.dumps(sorted(m for m in sys.modules "
                                     "if m.startswith(('tppasm.x86.', 'tppasm.sve.')))))")
    run(script, {"TPPASM_CACHE_DIR": str(tmp_path)})
    out = run(script, {"TPPASM_CACHE_DIR": str(tmp_path)}).splitlines()
    assert json.loads(out[-2]) == {"from_disk": 5, "kernels": 5}
    light = ("entry", "far_prefetch", "switch", "raw")      # entry stubs, the option's module, the SVE code class
    generators = [m for m in json.loads(out[-1]) if m.rsplit(".", 1)[1] not in light]
    assert not generators, generators


def test_second_process_loads_every_kernel(tmp_path):
    first = _kernels(tmp_path)
    assert first == {"from_disk": 0, "kernels": 7}
    assert stat.S_IMODE(os.stat(tmp_path).st_mode) == 0o700
    index = os.stat(tmp_path / "index.json")
    assert _kernels(tmp_path) == {"from_disk": 7, "kernels": 7}
    again = os.stat(tmp_path / "index.json")                # a process that only loads leaves the index
    assert (again.st_ino, again.st_mtime_ns) == (index.st_ino, index.st_mtime_ns)
    assert json.loads((tmp_path / "stats.json").read_text())["hits"] >= 7


def test_cache_off_writes_nothing(tmp_path):
    root = tmp_path / "never"
    assert _kernels(root, n=1, TPPASM_CACHE="0")["from_disk"] == 0
    assert not root.exists()


@pytest.mark.parametrize("damage", ["flip", "truncate", "segment gone", "index garbage"])
def test_damaged_cache_is_regenerated_never_run(tmp_path, damage):
    """A blob whose bytes changed, a truncated segment, a missing segment or an unreadable index:
    the kernels are generated again (and correct), and the next process loads them from disk."""
    _fill_like_kernels(tmp_path, 1)
    assert _data_files(tmp_path)
    data = _data_files(tmp_path)
    if damage == "flip":
        for path in data:
            raw = bytearray(path.read_bytes())
            raw[len(raw) // 2] ^= 0x40
            path.write_bytes(bytes(raw))
    elif damage == "truncate":
        for path in data:
            os.truncate(path, path.stat().st_size // 2)
    elif damage == "segment gone":
        for path in data:
            for f in path.parent.iterdir():
                f.unlink() if f.is_file() else None
    else:
        (tmp_path / "index.json").write_text("{not json")
    assert _kernels(tmp_path, n=1)["from_disk"] < 3
    assert _kernels(tmp_path, n=1) == {"from_disk": 3, "kernels": 3}


def test_an_entry_pointed_at_another_keys_record_is_a_miss_never_run(tmp_path):
    """Each entry of the index given the next one's segment, offset and SHA-256: every blob still
    verifies, but holds another kernel's (or stub's) code; the key inside the record tells."""
    _fill_like_kernels(tmp_path, 1)
    path = tmp_path / "index.json"
    index = json.loads(path.read_text())
    keys = sorted(index["entries"])
    values = [index["entries"][k] for k in keys]
    index["entries"] = dict(zip(keys, values[1:] + values[:1]))
    path.write_text(json.dumps(index))
    assert _kernels(tmp_path, n=1)["from_disk"] == 0          # each kernel checked against NumPy
    assert _kernels(tmp_path, n=1) == {"from_disk": 3, "kernels": 3}


def test_special_files_in_the_directory_cost_misses_never_a_hang(tmp_path):
    """A FIFO (no writer: an open for reading would wait forever) or a link to /dev/zero (a read
    that never ends) in place of the segments, the index or the counts."""
    _fill_like_kernels(tmp_path, 1)
    for path in _data_files(tmp_path):
        path.unlink()
        os.mkfifo(path)
    (tmp_path / "stats.json").unlink()
    os.symlink("/dev/zero", tmp_path / "stats.json")
    script = f"N = 1\n" + KERNELS
    assert json.loads(run(script, {"TPPASM_CACHE_DIR": str(tmp_path)}, timeout=60).splitlines()[-1])["from_disk"] == 0
    (tmp_path / "index.json").unlink()
    os.mkfifo(tmp_path / "index.json")
    assert json.loads(run(script, {"TPPASM_CACHE_DIR": str(tmp_path)}, timeout=60).splitlines()[-1])["from_disk"] == 0
    assert _kernels(tmp_path, n=1) == {"from_disk": 3, "kernels": 3}


def test_index_fields_of_other_types_are_dropped_like_absent_entries(tmp_path):
    _fill_like_kernels(tmp_path, 1)
    path = tmp_path / "index.json"
    index = json.loads(path.read_text())
    (k1, e1), (k2, e2), (k3, e3) = list(index["entries"].items())[:3]
    index["entries"].update({k1: [e1], k2: pack_entry({**unpack_entry(e2), "size": 1 << 40}),
                             k3: e3.rsplit(" ", 1)[0] + " x"})
    index["records"] = {"tune/a": ["x"], "tune/b": "text", "tune/c": {"record": {"spec": "aBC"}, "used": "x"},
                        "tune/d": {"record": {"spec": "aBC"}, "used": 1.0, "size": 20}}
    index["segments"]["seg-bogus"] = "x"
    path.write_text(json.dumps(index))
    (tmp_path / "stats.json").write_text('{"hits": "x", "misses": [1]}')
    store = disk.DiskStore(tmp_path, 1 << 20)
    assert [store.get(k) for k in (k1, k2, k3)] == [None] * 3
    assert store.records() == [("tune/d", {"spec": "aBC"})]
    store.put("kernel/new", b"\xc3", {})
    assert store.flush() and store.get("kernel/new") == (b"\xc3", {})
    kept = json.loads(path.read_text())
    assert "kernel/new" in kept["entries"] and not {k1, k2, k3} & set(kept["entries"])
    assert list(kept["records"]) == ["tune/d"] and "seg-bogus" not in kept["segments"]
    assert store.info()["entries"]["tune"] == 1


def test_lookups_unpack_only_the_entries_they_look_up_and_a_packed_entry_only(tmp_path):
    """A reader leaves the index's entries packed and unpacks (and checks) those it looks up; an entry
    in another form (an object of the right fields, as format 2 wrote them) is damage there too."""
    store = disk.DiskStore(tmp_path, 1 << 20)
    for i in range(3):
        store.put(f"kernel/{i}", bytes([0x90] * i + [0xC3]), {})
    assert store.flush()
    path = tmp_path / "index.json"
    index = json.loads(path.read_text())
    assert all(type(e) is str for e in index["entries"].values())
    index["entries"]["kernel/2"] = unpack_entry(index["entries"]["kernel/2"])
    path.write_text(json.dumps(index))
    fresh = disk.DiskStore(tmp_path, 1 << 20)
    assert fresh.get("kernel/0") == (b"\xc3", {})
    assert [type(fresh._index["entries"][k]) for k in ("kernel/0", "kernel/1")] == [dict, str]
    assert fresh.get("kernel/2") is None and fresh.get("kernel/1") == (b"\x90\xc3", {})


@pytest.mark.parametrize("field, value", [("used", 10 ** 400), ("used", -(10 ** 400)), ("start", 1 << 70),
                                          ("size", 1 << 64), ("seg", "seg-abc\u0000x"), ("seg", "seg-\u0000")])
def test_index_numbers_past_64_bits_and_nul_bytes_cost_misses(tmp_path, field, value):
    """JSON integers have no bound and names may hold NUL: fields that would overflow a float or a
    file offset, or a segment name the OS refuses, make their entry a miss in a process that
    builds kernels and in the CLI's cache commands, never an exception."""
    _fill_like_kernels(tmp_path, 1)
    path = tmp_path / "index.json"
    index = json.loads(path.read_text())
    at = ("seg", "i", "start", "size", "sha256", "used").index(field)        # a packed entry's fields
    for key, packed in index["entries"].items():
        fields = packed.split(" ")
        fields[at] = str(value)
        index["entries"][key] = " ".join(fields)
    path.write_text(json.dumps(index))
    assert _kernels(tmp_path, n=1)["from_disk"] == 0
    for command in ("info", "list", "clear"):
        run(f"from tppasm.__main__ import main; main(['cache', {command!r}])", {"TPPASM_CACHE_DIR": str(tmp_path)},
            timeout=60)


def test_blob_with_wrong_hash_is_discarded(cache_dir):
    store = tc.store()
    store.put("kernel/x", b"\xc3" * 10, {"type": "x86"})
    store.flush()
    entry = store._entry("kernel/x")
    path = cache_dir / entry["seg"] / "data.ninja"
    path.write_bytes(b"\xcc" * 10)
    fresh = disk.DiskStore(cache_dir, 1 << 20)
    assert fresh.get("kernel/x") is None and fresh.stats["discarded"] == 1
    fresh.flush()
    assert "kernel/x" not in json.loads((cache_dir / "index.json").read_text())["entries"]


@pytest.mark.parametrize("meta", [
    {"type": "from the future"},
    {"type": "x86", "name": "k", "argtypes": ["ptr", "bogus"], "restype": None},        # no such C type
    {"type": "x86", "name": "k", "argtypes": [["ptr"]], "restype": None},               # (unhashable)
    {"type": "x86", "name": "k", "argtypes": "ptr", "restype": None},                   # a string, not a list
    {"type": "x86", "name": "k", "argtypes": ["ptr"] * 9, "restype": None},             # past the prologue's 8
    {"type": "x86", "name": "k", "argtypes": ["ptr"], "restype": "int"},
    {"type": "x86", "name": "k", "argtypes": ["ptr"], "restype": ["i32"]}])
def test_entry_with_unusable_metadata_is_replaced(cache_dir, meta):
    """Metadata no generator writes (a C type that does not exist, more arguments than a kernel
    takes) is a miss: the kernel is generated again, never run under that signature."""
    code = tc.kernel_code()
    desc = Unary("relu", 2, 9)
    key = code.raw_key(desc, "avx2")
    code.store.put(key, b"\xc3", meta)
    code.store.flush()
    raw, from_disk = code.raw(desc, "avx2", backends.generate)
    assert not from_disk and raw.code != b"\xc3"
    code.store.flush()
    again, from_disk = kernels.KernelCode(disk.DiskStore(cache_dir, 1 << 20)).raw(desc, "avx2", None)
    assert from_disk and again.code == raw.code


def test_unsafe_directory_is_refused_with_the_fix(tmp_path, monkeypatch):
    os.chmod(tmp_path, 0o775)
    with pytest.warns(RuntimeWarning, match="chmod 700"):
        with tc.using(tmp_path) as store:
            assert store is None and tc.kernel_code() is None
            assert "writable by group" in tc.info()["why"]
    os.chmod(tmp_path, 0o700)
    monkeypatch.setattr(disk.os, "getuid", lambda: os.stat(tmp_path).st_uid + 1)
    assert "owned by user id" in disk.check_directory(str(tmp_path))


def test_environment_errors_name_the_fix(tmp_path, monkeypatch):
    for name, value in (("TPPASM_CACHE", "maybe"), ("TPPASM_CACHE_MB", "-3"), ("TPPASM_CACHE_MB", "lots"),
                        ("TPPASM_CACHE_MB", "1e-9")):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=name):
            with tc.using(tmp_path):
                tc.store()
        monkeypatch.delenv(name)
    (tmp_path / "file").write_text("")
    assert disk.check_directory(str(tmp_path / "file")).startswith("is not a directory")


# -- concurrency and killed writers ----------------------------------------------------------

def test_four_processes_fill_the_same_cache(tmp_path):
    """Four processes generate the same 50 kernels at once (flushing every few kernels); then every
    entry is readable and verified, and a fifth process loads all 50."""
    script = r"""
        import tppasm as tpp, tppasm.cache.disk as d
        d.FLUSH_BLOBS = 7
        for n in range(1, 51):
            tpp.unary("copy", 2, n)
        print("done")
    """
    env = {"TPPASM_CACHE_DIR": str(tmp_path)}
    procs = [start(script, env) for _ in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and "done" in out, err
    index = json.loads((tmp_path / "index.json").read_text())
    store = disk.DiskStore(tmp_path, 1 << 30)
    assert all(store.get(key) is not None for key in index["entries"])
    assert store.stats["discarded"] == 0
    assert len([k for k in index["entries"] if k.startswith("kernel/")]) == 50
    out = run("""
        import tppasm as tpp
        print(sum(tpp.unary("copy", 2, n).from_disk for n in range(1, 51)))
    """, env)
    assert out.split()[-1] == "50"


@pytest.mark.parametrize("where", ["segment written", "segment renamed", "index written"])
def test_writer_killed_mid_flush_leaves_a_usable_cache(tmp_path, where):
    """SIGKILL inside a flush (after the blobs are written, after their segment is renamed into
    place, after the new index is written but before it replaces the old): the next process
    loads what was committed before, regenerates the rest, and cleans up what the killed one left."""
    env = {"TPPASM_CACHE_DIR": str(tmp_path)}
    _fill(tmp_path, [Unary("relu", 2, n) for n in range(1, 6)])
    name, when = {"segment written": ("rename", "True"),          # the blobs' directory, before its rename
                  "segment renamed": ("open", "'index.json.tmp' in str(a[0])"),
                  "index written": ("replace", "True")}[where]     # the new index, before it replaces the old
    killer = start(f"""
        import os, signal, tppasm as tpp, tppasm.cache.disk as d
        for n in range(6, 11):
            tpp.unary("relu", 2, n)
        real = d.os.{name}
        def die(*a, **k):
            if {when}:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*a, **k)
        d.os.{name} = die
        tpp.cache.flush()
        print("not killed")
    """, env)
    out, _ = killer.communicate(timeout=120)
    assert killer.returncode == -9 and "not killed" not in out
    out = run("""
        import tppasm as tpp
        print(sum(tpp.unary("relu", 2, n).from_disk for n in range(1, 11)))
        tpp.cache.flush()
    """, env)
    assert out.split()[-1] == "5"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(("tmp-", "index.json.tmp"))]
    assert leftovers == []
    assert _count_segments(tmp_path) == len(json.loads((tmp_path / "index.json").read_text())["segments"])


def test_lock_held_elsewhere_delays_writing_without_losing_it(tmp_path, monkeypatch):
    import fcntl
    monkeypatch.setattr(disk, "LOCK_TIMEOUT_S", 0.2)
    store = disk.DiskStore(tmp_path, 1 << 20)
    store.put("kernel/a", b"\x90\xc3", {})
    fd = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)                       # another writer, stuck
    try:
        with pytest.warns(RuntimeWarning, match="is held by another process"):
            store.flush()
        assert "kernel/a" in store._pending and not (tmp_path / "index.json").exists()
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    store._retry_at = 0
    store.flush()
    assert disk.DiskStore(tmp_path, 1 << 20).get("kernel/a")[0] == b"\x90\xc3"


def test_write_failure_warns_once_and_kernels_still_come(cache_dir, monkeypatch):
    def full(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(disk.DiskStore, "_write_json", full)
    store = tc.store()
    store.put("kernel/a", b"\xc3", {})
    with pytest.warns(RuntimeWarning, match="No space left"):
        assert store.flush() is False
    assert store.failure is not None
    assert tc.remember("tune", "k", {"spec": "aBC"}) is False
    k = tk.Kernel(Unary("relu", 2, 13), tk.host().isa, code_cache=tc.kernel_code())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store.flush()
    x = -np.ones((2, 13), np.float32)
    k(x, x)
    assert not x.any()


def _count_segments(root):
    return len([p for p in root.iterdir() if p.name.startswith("seg-")])


# -- size cap, records, CLI ------------------------------------------------------------------

def test_size_cap_evicts_least_recently_used(tmp_path):
    store = disk.DiskStore(tmp_path, cap_bytes=10_000)
    for i in range(8):
        store.put(f"kernel/{i}", bytes([i]) * 1000, {})
    store.flush()
    assert store.get("kernel/0") is not None             # 0 becomes the most recently used
    store._touched["kernel/0"] += 2 * disk.TOUCH_S     # used again, later than the others
    store.flush()
    for i in range(8, 12):
        store.put(f"kernel/{i}", bytes([i]) * 1000, {})
    store.flush()
    kept = sorted(int(k.split("/")[1]) for k in store._index["entries"])
    assert sum(1000 for _ in kept) <= 8000 and 0 in kept and 11 in kept and 1 not in kept
    assert all(store.get(f"kernel/{i}")[0] == bytes([i]) * 1000 for i in kept)
    on_disk = sum(p.stat().st_size for p in _data_files(tmp_path))
    assert on_disk <= 2 * 10_000                           # evicted bytes are reclaimed by compaction


def test_segments_are_ragged_mmaps_of_the_stored_blobs(tmp_path):
    from mmap_ninja.ragged import RaggedMmap
    store = disk.DiskStore(tmp_path, cap_bytes=1 << 20)
    blobs = {f"kernel/{i}": os.urandom(10 + 7 * i) for i in range(5)}
    for key, blob in blobs.items():
        store.put(key, blob, {})
    store.flush()
    for key in list(store._index["entries"]):
        entry = store._entry(key)
        seg = RaggedMmap(tmp_path / entry["seg"])
        assert seg.starts[entry["i"]] == entry["start"]
        assert disk._unpack(bytes(seg[entry["i"]]), key) == (blobs[key], {})


def test_many_flushes_keep_few_segments(tmp_path):
    store = disk.DiskStore(tmp_path, cap_bytes=1 << 30)
    for i in range(40):
        store.put(f"kernel/{i}", struct.pack("<I", i) * 50, {"i": i})
        store.flush()
    assert _count_segments(tmp_path) <= disk.MAX_SEGMENTS + 1
    fresh = disk.DiskStore(tmp_path, cap_bytes=1 << 30)
    assert all(fresh.get(f"kernel/{i}") == (struct.pack("<I", i) * 50, {"i": i}) for i in range(40))


def test_records_for_the_tuner(cache_dir):
    assert tc.remember("tune", "gemm 64", {"spec": "aBC", "us": [1.5, 2]})
    out = run("""
        import tppasm.cache as tc
        print(tc.recall("tune", "gemm 64"), tc.recall("tune", "other"))
    """, {"TPPASM_CACHE_DIR": str(cache_dir)})
    assert out.strip() == "{'spec': 'aBC', 'us': [1.5, 2]} None"
    with pytest.raises(ValueError, match="namespace"):
        tc.remember("kernel", "k", {})
    with pytest.raises(TypeError, match="JSON|dicts, lists"):
        tc.remember("tune", "k", {"f": object()})
    with pytest.raises(TypeError, match="string"):
        tc.recall("tune", 3)


def test_cli_info_and_clear(tmp_path):
    _fill_like_kernels(tmp_path, 1)
    env = {"TPPASM_CACHE_DIR": str(tmp_path)}
    info = run("from tppasm.__main__ import main; main(['cache', 'info', '--json'])", env)
    data = json.loads(info)
    assert data["enabled"] and data["entries"]["kernel"] == 3 and data["stats"]["stores"] >= 3
    text = run("from tppasm.__main__ import main; main(['cache', 'clear'])", env)
    assert "cleared" in text
    assert json.loads(run("from tppasm.__main__ import main; main(['cache', 'info', '--json'])",
                          env))["entries"] == {}


def test_cli_says_when_the_cache_cannot_be_cleared(tmp_path, monkeypatch, capsys):
    from tppasm.__main__ import main
    _fill_like_kernels(tmp_path, 1)

    def refused(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)
    monkeypatch.setattr(disk.shutil, "rmtree", refused)
    with tc.using(tmp_path):
        assert main(["cache", "clear"]) == 1
    err = capsys.readouterr().err
    assert "could not delete 1 of the cache's files" in err and "permissions" in err


def test_forgetting_one_namespace_keeps_the_kernels_and_other_records(tmp_path):
    _fill_like_kernels(tmp_path, 1)
    env = {"TPPASM_CACHE_DIR": str(tmp_path)}
    run("""
        import tppasm.cache as tc
        tc.remember("tune", "a", {"spec": "aBC"}); tc.remember("tune", "b", {"spec": "Ab"})
        tc.remember("amx", "v", {"chunks": True})
    """, env)
    text = run("from tppasm.__main__ import main; main(['cache', 'clear', '--only', 'tune'])", env)
    assert text.strip() == "forgot 2 tune records"
    left = json.loads(run("from tppasm.__main__ import main; main(['cache', 'info', '--json'])", env))["entries"]
    assert left["kernel"] == 3 and left["amx"] == 1 and "tune" not in left
    out = run("""
        import tppasm.cache as tc
        print(tc.recall("tune", "a"), tc.recall("amx", "v"), tc.forget("tune"))
    """, env)
    assert out.strip() == "None {'chunks': True} 0"
    with pytest.raises(ValueError, match="namespace"):
        tc.forget("kernel")


def test_cli_lists_the_records(tmp_path):
    env = {"TPPASM_CACHE_DIR": str(tmp_path)}
    assert run("from tppasm.__main__ import main; main(['cache', 'list'])", env).strip() == "no records"
    run("""
        import tppasm.cache as tc
        tc.remember("tune", "a", {"kernel": "gemm", "key": ["gemm", "f32", 64, 1], "spec": "aBC",
                                  "knobs": {"bm": 32}, "seconds": 0.0012, "runs": 2, "tuning_seconds": 30.4})
        tc.remember("amx", "v", {"chunks": True})
    """, env)
    text = run("from tppasm.__main__ import main; main(['cache', 'list'])", env)
    assert "tune   gemm f32 64 1 -> aBC bm=32: 1.200 ms, 2 run(s), 30 s of tuning" in text
    assert 'amx    {"chunks": true}' in text
    only = run("from tppasm.__main__ import main; main(['cache', 'list', '--only', 'amx'])", env)
    assert only.strip() == 'amx    {"chunks": true}'
    as_json = run("from tppasm.__main__ import main; main(['cache', 'list', '--only', 'amx', '--json'])", env)
    assert json.loads(as_json) == [{"namespace": "amx", "record": {"chunks": True}}]
    run("import tppasm.cache as tc; tc.remember('tune', 'odd', {'spec': 'aBC', 'knobs': [1], 'seconds': 'x'})", env)
    assert 'tune   {"spec": "aBC", "knobs": [1], "seconds": "x"}' in run(
        "from tppasm.__main__ import main; main(['cache', 'list'])", env)
    assert tc.records("nothing") == []
