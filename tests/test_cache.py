"""The kernel caches: on disk (a second process loads instead of generating; every blob verified;
safe directory; concurrent and killed writers; size cap; tuner records; CLI) and in process
(bounded, least recently used, kernels still referenced stay valid)."""
import gc
import json
import os
import stat
import struct
import tempfile
import types
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tppasm as tpp
import tppasm.cache as tc
from isa.memory import mapped
from isa.x86 import Function, rax
from tests.golden import descriptors
from tests.scripts import run, start
from tppasm import backends, kernel as tk
from tppasm.cache import disk, kernels, position, stubs
from tppasm.eltwise import Unary
from tppasm.x86.entry import Addresses, Vectorcall, build_entry

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


def test_blob_with_wrong_hash_is_discarded(cache_dir):
    store = tc.store()
    store.put("kernel/x", b"\xc3" * 10, {"type": "x86"})
    store.flush()
    entry = store._index["entries"]["kernel/x"]
    path = cache_dir / entry["seg"] / "data.ninja"
    path.write_bytes(b"\xcc" * 10)
    fresh = disk.DiskStore(cache_dir, 1 << 20)
    assert fresh.get("kernel/x") is None and fresh.stats["discarded"] == 1
    fresh.flush()
    assert "kernel/x" not in json.loads((cache_dir / "index.json").read_text())["entries"]


def test_entry_with_unusable_metadata_is_replaced(cache_dir):
    code = tc.kernel_code()
    desc = Unary("relu", 2, 9)
    key = code.raw_key(desc, "avx2")
    code.store.put(key, b"\xc3", {"type": "from the future"})
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
    for name, value in (("TPPASM_CACHE", "maybe"), ("TPPASM_CACHE_MB", "-3"), ("TPPASM_CACHE_MB", "lots")):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=name):
            with tc.using(tmp_path):
                tc.store()
        monkeypatch.delenv(name)


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
        store.flush()
    assert store.failure is not None
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
    for key, entry in store._index["entries"].items():
        seg = RaggedMmap(tmp_path / entry["seg"])
        assert seg.starts[entry["i"]] == entry["start"]
        assert disk._unpack(bytes(seg[entry["i"]])) == (blobs[key], {})


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


# -- what is stored --------------------------------------------------------------------------

def test_every_generator_emits_position_independent_code():
    """The audit passes every golden descriptor on every ISA (x86 and SVE), the AMX tile
    configuration and SVE's MMLA BRGEMM: every registered generator, so every kernel is cached."""
    from tppasm.brgemm import Brgemm, TileConfig, TileRelease
    from tppasm.sve.brgemm import MmlaBrgemm
    extra = {"amx": [TileConfig(Brgemm(32, 32, 32, dtype="bf16", tile_setup=False)), TileRelease()],
             "sve": [MmlaBrgemm(m=5, n=7, k=9, dtype="bf16"), MmlaBrgemm(m=8, n=8, k=16, dtype="i8")]}
    kinds = set()
    for isa in ("avx2", "avx512", "amx", "sve"):
        for desc in descriptors() + extra.get(isa, []):
            code = backends.generate(desc, isa).code
            assert position.audit(code, backends.family(isa)) is None, (isa, desc)
            kinds.add((backends.family(isa), desc.kind))
    generators = {k for k in backends.registered()                 # not those a docstring example adds
                  if backends._GENERATORS[k].__module__.startswith(("tppasm.x86.", "tppasm.sve."))}
    assert kinds == generators


def _x86(emit):
    fn = Function("f", ["ptr"])
    emit(fn.asm, fn.args[0])
    return fn.finalize().code


@pytest.mark.parametrize("code, why", [
    (lambda: _x86(lambda a, p: a.mov(rax, 0x7F00_1234_5678)), "absolute address"),
    (lambda: _x86(lambda a, p: a.call(rax)), "indirect"),
    (lambda: _x86(lambda a, p: a.mov(rax, [0x1000])), "absolute memory"),
    (lambda: b"\xe8\x00\x10\x00\x00\xc3", "outside the blob"),          # call +0x1000
    (lambda: b"\x48\x8b\x05\x00\x10\x00\x00\xc3", "RIP-relative"),      # mov rax, [rip+0x1000]
    (lambda: b"\x0f\x0b\xff\xff", "undecodable"),
], ids=["imm64", "call-reg", "moffs", "call-out", "rip-out", "junk"])
def test_audit_refuses_code_tied_to_an_address(code, why):
    assert why in position.audit(code(), "x86")


@pytest.mark.parametrize("words, why", [
    ([0x90000000, 0xD65F03C0], "adrp"),                 # adrp x0, 0
    ([0x94000100, 0xD65F03C0], "outside"),              # bl +0x400
    ([0xD61F0000], "br"),                               # br x0
    ([0x58000400, 0xD65F03C0], "outside"),              # ldr x0, +0x80 (literal)
    ([0xD503201F], "past its end"),                     # nop, then nothing
])
def test_audit_refuses_aarch64_code_tied_to_an_address(words, why):
    assert why in position.audit(struct.pack(f"<{len(words)}I", *words), "sve")


def test_code_that_is_not_position_independent_is_not_stored(cache_dir):
    code = tc.kernel_code()
    bad = Function("bad", ["ptr"])
    bad.asm.mov(rax, 0x7F00_1234_5678)
    raw = bad.finalize()
    desc = Unary("relu", 2, 2)
    with pytest.warns(RuntimeWarning, match="not position independent"):
        got, from_disk = code.raw(desc, "avx2", lambda d, i: raw)
    assert got is raw and not from_disk and not code.store._pending


def test_key_covers_every_field_and_the_features(monkeypatch):
    code = kernels.KernelCode(None)
    base = Unary("relu", 4, 8)
    keys = {code.raw_key(base, "avx2")}
    for change in (dict(m=5), dict(n=9), dict(ldi=9), dict(ldo=10), dict(dtype="bf16"), dict(out_dtype="bf16"),
                   dict(op="tanh")):
        keys.add(code.raw_key(Unary(**{**vars(base), **change}), "avx2"))
    keys.add(code.raw_key(base, "avx512"))
    real = kernels.host()
    fewer = dict(real.features, avx512f=not real.features.get("avx512f"))
    monkeypatch.setattr(kernels, "host", lambda: types.SimpleNamespace(levels=real.levels, features=fewer))
    keys.add(code.raw_key(base, "avx2"))
    monkeypatch.setattr(kernels, "host", lambda: types.SimpleNamespace(levels=(), features=real.features))
    keys.add(code.raw_key(base, "avx2"))
    assert len(keys) == 11


def test_descriptor_without_faithful_text_is_not_stored():
    class Opaque:
        pass
    assert kernels.describe((1, "a", None, 2.5)) == "(1, 'a', None, 2.5,)"
    assert kernels.describe((1, Opaque())) is None


class _FarAddresses(Addresses):
    """Addresses above 4 GiB whatever the host (a non-PIE Python has some below)."""

    def _far(self, *what):
        return 0x7F00_0000_0000 + (hash(what) & 0xFFFF_FFF0)

    def raw(self): return self._far("raw")
    def ndarray(self): return self._far("ndarray")
    def dtype(self, i): return self._far("dtype", i)
    def int(self): return self._far("int")
    def keyword(self, j): return self._far("keyword", j)
    def none(self): return self._far("none")
    def capi(self, name): return self._far("capi", name)
    def divert(self): return self._far("divert")
    def fallback(self): return self._far("fallback")


@pytest.mark.parametrize("form", stubs.FORMS)
def test_stub_template_patched_equals_the_stub_built_directly(form):
    for desc in descriptors():
        if not desc.checked_call:
            continue
        ops, scalars = tuple(desc.operands()), tuple(desc.scalars)
        call = None if form == "entry" else Vectorcall(None, 0, release_gil=form == "call-nogil")
        t = stubs.template(desc.kind, ops, scalars, desc.count_scalar, form)
        addresses = _FarAddresses(ops, scalars, 0, call)
        direct = build_entry(desc.kind, ops, scalars, 0, desc.count_scalar, call=call, addresses=addresses)
        assert stubs.instantiate(t, addresses).code == direct.code, desc
        back = stubs.Template.from_meta(t.code, json.loads(json.dumps(t.as_meta())))
        assert back == t


def test_malformed_template_metadata_is_refused():
    desc = Unary("relu", 2, 3)
    t = stubs.template(desc.kind, tuple(desc.operands()), (), None, "entry")
    meta = t.as_meta()
    meta["relocations"][0][0] += 1                       # not a mov r64, imm64 slot any more
    with pytest.raises(ValueError, match="slot"):
        stubs.Template.from_meta(t.code, meta)
    meta = t.as_meta()
    meta["relocations"][0][1] = ["__class__"]
    with pytest.raises(ValueError):
        stubs.Template.from_meta(t.code, meta)


# -- the in-process cache --------------------------------------------------------------------

@pytest.fixture
def small_limit():
    tk.set_kernel_cache_limit(4)
    yield
    tk.set_kernel_cache_limit(tk.DEFAULT_LIMIT)


def test_in_process_cache_is_bounded_and_frees_code(small_limit):
    gc.collect()
    before = mapped()
    for n in range(1000, 1040):
        tpp.unary("copy", 1, n)
    gc.collect()
    assert len(tk._CACHE) == 4
    assert mapped()[0] - before[0] <= 2 * 4 + 2          # raw + stub per held kernel (+ slack)


def test_evicted_kernels_still_held_stay_valid(small_limit):
    from loops import Loop, kernel
    held = tpp.unary("relu", 2, 777)
    zero = tpp.zero(2, 3)

    @kernel("A", Loop(0, 4))
    def clear(i, X):
        zero(X[i])
    X = np.ones((4, 2, 3), np.float32)
    clear(X)
    for n in range(2000, 2010):
        tpp.unary("copy", 1, n)
    tpp.cache_clear()
    gc.collect()
    assert tpp.unary("relu", 2, 777) is held            # referenced: found again, not rebuilt
    x = np.array([[-1, 2] * 388 + [3], [4, -5] * 388 + [-6]], np.float32)
    y = np.full_like(x, np.nan)
    held(x, y)
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    X[...] = 1
    clear(X)                                            # the nest still calls its (evicted) zero kernel
    assert not X.any()


def test_limit_errors_name_the_fix():
    for bad in (-1, "8", 2.5, True):
        with pytest.raises(ValueError, match="int >= 0"):
            tpp.set_kernel_cache_limit(bad)
    out = run("""
        try:
            import tppasm
        except ValueError as e:
            print(e)
    """, {"TPPASM_KERNEL_CACHE": "many"})
    assert "TPPASM_KERNEL_CACHE='many'" in out


def test_cached_kernel_results_match_generated(cache_dir):
    """In this process: generated, then loaded from disk by a fresh store; same code, same results."""
    desc = Unary("gelu", 3, 21)
    first = tk.Kernel(desc, tk.host().isa, code_cache=tc.kernel_code())
    tc.flush()
    again = tk.Kernel(desc, tk.host().isa, code_cache=kernels.KernelCode(disk.DiskStore(cache_dir, 1 << 20)))
    assert again.from_disk and again.raw.code == first.raw.code
    x = np.linspace(-3, 3, 63, dtype=np.float32).reshape(3, 21)
    y1, y2 = np.full_like(x, np.nan), np.full_like(x, np.nan)
    first(x, y1)
    again(x, y2)
    np.testing.assert_array_equal(y1, y2)


def _operands(kernel, rng, count):
    """Arrays for ``kernel``'s operands as strided views of buffers: inputs random, outputs NaN."""
    bases, views = [], []
    for spec in kernel.operands:
        shape, es = spec.full_shape(count), spec.np_dtype.itemsize
        span = 1 + sum((d - 1) * st for d, st in zip(shape, spec.strides))
        base = (np.full(span, np.nan, np.float32) if spec.writable else
                rng.uniform(-2, 2, span).astype(np.float32)).astype(spec.np_dtype)
        bases.append(base)
        views.append(np.lib.stride_tricks.as_strided(base, shape, [st * es for st in spec.strides]))
    return bases, views


@given(kind=st.sampled_from(["unary", "binary", "brgemm"]), m=st.integers(1, 9), n=st.integers(1, 40),
       k=st.integers(1, 12), pad=st.integers(0, 3), dtype=st.sampled_from(["f32", "bf16"]),
       act=st.sampled_from([None, "relu", "tanh"]), seed=st.integers(0, 2 ** 16))
def test_loaded_kernel_is_the_generated_one(kind, m, n, k, pad, dtype, act, seed):
    """Over kinds, shapes, leading dimensions and dtypes: a fresh store loads the bytes the generator
    made, and the loaded kernel writes every output element exactly as the generated one."""
    from tppasm.brgemm import Brgemm
    from tppasm.eltwise import Binary
    desc = {"unary": lambda: Unary(act or "relu", m, n, ldi=n + pad, dtype=dtype),
            "binary": lambda: Binary("max" if act else "add", m, n, lda=n + pad, dtype=dtype),
            "brgemm": lambda: Brgemm(m, n, 2 * k, ldc=n + pad, dtype=dtype, act=act)}[kind]()
    isa = tk.host().isa
    with tempfile.TemporaryDirectory() as root:
        store = disk.DiskStore(root, 1 << 20)
        made = tk.Kernel(desc, isa, code_cache=kernels.KernelCode(store))
        store.flush()
        loaded = tk.Kernel(desc, isa, code_cache=kernels.KernelCode(disk.DiskStore(root, 1 << 20)))
    assert loaded.from_disk and not made.from_disk and loaded.raw.code == made.raw.code
    count = {"count": 2} if desc.scalars else {}
    outs = []
    for kern in (made, loaded):
        bases, views = _operands(kern, np.random.default_rng(seed), 2)
        kern(*views, **count)
        written = [v for v, spec in zip(views, kern.operands) if spec.writable]
        assert not any(np.isnan(w.astype(np.float32)).any() for w in written)
        outs.append([b.astype(np.float32) for b in bases])
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("isa", ["sve", "avx512", "amx"])
def test_code_for_other_isas_round_trips(tmp_path, isa):
    """SVE (run on AArch64 hosts or emulated) and AVX-512 / AMX code (interpreted where the host lacks
    them) come back byte for byte, in the raw-code object their generator makes."""
    from tppasm.brgemm import Brgemm
    desc = Brgemm(8, 8, 16, dtype="bf16") if isa == "amx" else Unary("gelu", 3, 19)
    store = disk.DiskStore(tmp_path, 1 << 20)
    made, _ = kernels.KernelCode(store).raw(desc, isa, backends.generate)
    store.flush()
    loaded, from_disk = kernels.KernelCode(disk.DiskStore(tmp_path, 1 << 20)).raw(desc, isa, None)
    assert from_disk and type(loaded) is type(made) and loaded.code == made.code and loaded.name == made.name


def test_warnings_are_not_raised_on_a_healthy_cache(cache_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tpp.unary("tanh", 2, 11)
        tc.flush()
