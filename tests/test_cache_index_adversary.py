"""The disk cache's index, format 3 (each entry packed in one string, unpacked as it is looked up),
against a hostile or careless environment: any packed string, entries of other JSON types, entries
that point elsewhere (another record, another segment, a path outside the store, a FIFO), an index
an older tppasm wrote, a writer replacing the index under a reader, and the exact round trip of
what the store writes. Each costs misses, never an exception, a hang or a read outside the store."""
import contextlib
import hashlib
import json
import math
import os
import signal
import struct
import sys
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.scripts import run, start
from tests.test_cache_adversary import _index, _store_with as store_with
from tppasm.cache import disk, files, trust
from tppasm.cache.files import MAX_BLOB, _is_count, _is_time, pack_entry, unpack_entry

FIELDS = ("seg", "i", "start", "size", "sha256", "used")
BLOBS = {"kernel/a": b"\x90\xc3", "kernel/b": b"\x90\x90\xc3", "kernel/c": b"\xcc" * 40 + b"\xc3"}


def _store_with(root, blobs=BLOBS):
    return store_with(root, blobs)


def _write_index(root, index):
    (root / "index.json").write_text(json.dumps(index))


@contextlib.contextmanager
def _within(seconds):
    """A TimeoutError instead of a hang (a blocking open of a FIFO, a read that never ends)."""
    def expired(*_):
        raise TimeoutError(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _as_old_clean_index_kept(entry):
    """Whether ``entry`` passes the checks the format-2 reader (``_clean_index``) made, and ``i``'s."""
    return (isinstance(entry, dict) and set(entry) == set(FIELDS) and isinstance(entry["seg"], str)
            and _is_count(entry["i"]) and _is_count(entry["start"]) and _is_count(entry["size"])
            and 0 < entry["size"] <= MAX_BLOB and isinstance(entry["sha256"], str) and _is_time(entry["used"]))


# -- 1. any packed string ----------------------------------------------------------------------

HOSTILE = ["", " ", "  ", "\t", "\n", "\x00", "-1", "+3", "-0", "0", "1", "٣", "٦٤", "1_0", "1__0", "_1", "1_",
           "nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e999", "-1e999", "1e308", "1e-320", "0x10", "0b1",
           "1.5", "1e3", "9" * 4299, "9" * 4301, "1" + "0" * 18, str(1 << 63), str((1 << 63) - 1), str(MAX_BLOB),
           str(MAX_BLOB + 1), "\ud800", "\u3000", "\u00a0" + "5", "\t5\n", "5\x00", "seg-0123456789abcdef",
           "../x", "/etc/passwd", "é", "𝟓", "true", "null", "[]", "{}"]
TOKENS = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=12),
                   st.integers(-(1 << 70), 1 << 70).map(str), st.floats().map(repr))
EDGES = st.sampled_from([-1, 0, 1, MAX_BLOB, MAX_BLOB + 1, (1 << 63) - 1, 1 << 63])
VALID = (st.builds(files.new_segment_name), st.one_of(st.integers(0, 1 << 40), EDGES).map(str),
         st.one_of(st.integers(0, 1 << 40), EDGES).map(str), st.one_of(st.integers(1, MAX_BLOB), EDGES).map(str),
         st.binary(min_size=32, max_size=32).map(bytes.hex), st.floats().map(repr))     # (nan, inf too)


@st.composite
def packed_strings(draw):
    """Six valid fields, some replaced, dropped or added (hostile tokens) and joined by one space, or
    two, a tab, none; or any text."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.one_of(st.text(max_size=200), st.text(min_size=4000, max_size=5000, alphabet="0 9")))
    fields = [draw(v) for v in VALID]
    for _ in range(draw(st.integers(0, 3))):
        at, how = draw(st.integers(0, len(fields))), draw(st.sampled_from(["replace", "replace", "drop", "add"]))
        if how == "add" or at == len(fields):
            fields.insert(at, draw(TOKENS))
        elif how == "drop":
            del fields[at]
        else:
            fields[at] = draw(TOKENS)
    seps = [" "] * len(fields) if draw(st.booleans()) else \
        draw(st.lists(st.sampled_from([" "] * 6 + ["  ", "\t", ""]), min_size=len(fields), max_size=len(fields)))
    return "".join(f + s for f, s in zip(fields, seps))[:-1] if fields else ""


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(packed_strings())
def test_unpack_entry_never_raises_and_keeps_only_entries_the_old_checks_pass(text):
    entry = unpack_entry(text)
    if entry is not None:
        assert _as_old_clean_index_kept(entry)
        assert type(entry["used"]) is float and entry["seg"] and entry["sha256"]
        assert " " not in entry["seg"] + entry["sha256"]
        assert unpack_entry(pack_entry(entry)) == entry             # what a writer writes back reads the same


@pytest.mark.parametrize("field, token, kept", [
    ("size", "0", False), ("size", str(MAX_BLOB), True), ("size", str(MAX_BLOB + 1), False), ("size", "-5", False),
    ("start", str(1 << 63), False), ("start", str((1 << 63) - 1), True), ("i", "-1", False), ("used", "nan", False),
    ("used", "inf", False), ("used", "1e999", False), ("used", "-1e308", True), ("start", "9" * 4301, False),
    ("start", "٦٤", True), ("start", "6_4", True), ("start", "+64", True), ("start", "6 4", False),
    ("start", "64\x00", False), ("seg", "", False), ("sha256", "", False), ("used", "x", False)])
def test_unpack_entry_field_by_field(field, token, kept):
    fields = ["seg-0123456789abcdef", "3", "64", "10", "ab" * 32, "1.5"]
    fields[FIELDS.index(field)] = token
    entry = unpack_entry(" ".join(fields))
    assert (entry is not None) == kept
    if kept:
        assert _as_old_clean_index_kept(entry)


def test_a_lowered_int_digit_limit_costs_misses(tmp_path):
    """int() of more digits than ``sys.set_int_max_str_digits`` allows raises ValueError (640 at least,
    under the 4096 characters an entry may have): a miss, in unpacking and in a lookup."""
    store = _store_with(tmp_path)
    index = _index(tmp_path)
    fields = index["entries"]["kernel/a"].split(" ")
    fields[2] = "0" * 700 + fields[2]
    index["entries"]["kernel/a"] = " ".join(fields)
    _write_index(tmp_path, index)
    del store
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        assert unpack_entry(index["entries"]["kernel/a"]) is None
        assert disk.DiskStore(tmp_path, 1 << 20).get("kernel/a") is None
    finally:
        sys.set_int_max_str_digits(old)
    assert unpack_entry(index["entries"]["kernel/a"]) is not None          # the same value, at the usual limit


def test_unpack_entry_refuses_other_types_and_long_strings():
    good = "seg-0123456789abcdef 3 64 10 ab 1.5"
    assert unpack_entry(good) is not None and unpack_entry(good + " " * 4096) is None
    assert unpack_entry(" ".join(["seg-0123456789abcdef", "3", "6" * 4000, "10", "ab", "1.5"])) is None
    for value in (None, 3, 3.5, True, [good], {"text": good}, good.encode(), good.split(" ")):
        assert unpack_entry(value) is None


@pytest.fixture(scope="module")
def one_entry(tmp_path_factory):
    """(root, index, the packed entry of kernel/a): a flushed store, copied afresh per example."""
    root = tmp_path_factory.mktemp("one")
    _store_with(root)
    index = _index(root)
    return root, index, index["entries"]["kernel/a"]


def _same_number(text):
    """Spellings of the number ``text`` that int() and float() read as it (whitespace, signs, zeros,
    other scripts' digits, underscores)."""
    arabic = text.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
    return [f"+{text}", f"0{text}", f"\t{text}\n", f"\u3000{text}", arabic, text[:1] + "_" + text[1:] if
            text[1:2].isdigit() else text]


@st.composite
def mutated_entries(draw, packed):
    """The stored entry of kernel/a with a field or separator changed (or spelled otherwise), or any string."""
    if draw(st.integers(0, 5)) == 0:
        return draw(packed_strings())
    fields = packed.split(" ")
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, 5))
        same = _same_number(fields[at]) if at in (1, 2, 3, 5) else [fields[at]]
        fields[at] = draw(st.sampled_from(same) if draw(st.booleans()) else TOKENS)
    return draw(st.sampled_from([" "] * 4 + ["  ", "\t"])).join(fields)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_lookup_of_any_packed_string_is_a_miss_or_the_right_blob(one_entry, data):
    root, index, packed = one_entry
    text = data.draw(mutated_entries(packed))
    _write_index(root, {**index, "entries": {**index["entries"], "kernel/a": text}})
    store = disk.DiskStore(root, 1 << 20)
    found = store.get("kernel/a")
    same = unpack_entry(text)
    if same is not None and all(same[f] == unpack_entry(packed)[f] for f in ("seg", "start", "size", "sha256")):
        assert found == (BLOBS["kernel/a"], {})
    else:
        assert found is None
    assert store.get("kernel/b") == (BLOBS["kernel/b"], {})          # the others stay
    store._reset_process_state()                                    # (no flush: the next example's index stays)


# -- 2. entries of other JSON types -------------------------------------------------------------

def _nested(depth):
    value = "x"
    for _ in range(depth):
        value = [value]
    return value


def _other_types(packed):
    """Entries of every other JSON type, the stored entry ``packed`` of kernel/a inside some."""
    return {"dict": {}, "old_dict": unpack_entry(packed), "list": ["x"], "packed_list": [packed], "int": 3,
            "float": 1.5, "null": None, "true": True, "deep": _nested(200), "deep_dict": {"seg": {"seg": {}}},
            "bytes_text": packed.encode().hex(), "number_text": "3"}


def _with_other_types(root):
    """A flushed store whose index holds, beside kernel/a..c, an entry of each other JSON type."""
    _store_with(root)
    index = _index(root)
    for name, value in _other_types(index["entries"]["kernel/a"]).items():
        index["entries"][f"kernel/{name}"] = value
    _write_index(root, index)
    return index


def test_entries_of_other_json_types_are_misses_in_the_lazy_and_the_full_path(tmp_path):
    _with_other_types(tmp_path)
    store = disk.DiskStore(tmp_path, 1 << 20)
    for name in _other_types("x"):
        assert store.get(f"kernel/{name}") is None
    assert store.get("kernel/a") == (BLOBS["kernel/a"], {})
    info = disk.DiskStore(tmp_path, 1 << 20).info()
    assert info["entries"] == {"kernel": 3} and info["live_bytes"] > 0
    assert disk.DiskStore(tmp_path, 1 << 20).records() == []
    writer = disk.DiskStore(tmp_path, 1 << 20)
    writer.put("kernel/new", b"\x90\x90\x90\xc3", {})
    assert writer.flush()
    kept = _index(tmp_path)
    assert sorted(kept["entries"]) == ["kernel/a", "kernel/b", "kernel/c", "kernel/new"]
    assert all(unpack_entry(e) is not None for e in kept["entries"].values())
    fresh = disk.DiskStore(tmp_path, 1 << 20)
    assert {k: fresh.get(k) for k in BLOBS} == {k: (b, {}) for k, b in BLOBS.items()}


def test_the_cli_on_entries_of_other_json_types(tmp_path):
    _with_other_types(tmp_path)
    out = run("""
        import contextlib, io, json
        from tppasm.__main__ import main
        said = []
        for args in (["info", "--json"], ["list"], ["info"], ["clear", "--only", "tune"], ["clear"],
                     ["info", "--json"]):
            text = io.StringIO()
            with contextlib.redirect_stdout(text):
                status = main(["cache", *args])
            said.append([status, text.getvalue()])
        print(json.dumps(said))
    """, {"TPPASM_CACHE_DIR": str(tmp_path)}, timeout=60)
    said = json.loads(out.splitlines()[-1])
    assert [status for status, _ in said] == [0] * 6, said
    assert json.loads(said[0][1])["entries"] == {"kernel": 3} and json.loads(said[-1][1])["entries"] == {}
    assert "no records" in said[1][1] and "kernel 3" in said[2][1]
    assert not any(p.name.startswith("seg-") for p in tmp_path.iterdir())


# -- 3. entries that point elsewhere ------------------------------------------------------------

def _record(store, key):
    return store._read(store._entry(key))


def test_entries_pointed_into_other_records_and_segments_are_misses(tmp_path):
    store = _store_with(tmp_path)
    store.put("kernel/d", b"\x90" * 7 + b"\xc3", {})             # a second segment
    assert store.flush()
    index = _index(tmp_path)
    a, b, d = (unpack_entry(index["entries"][k]) for k in ("kernel/a", "kernel/b", "kernel/d"))
    assert a["seg"] == b["seg"] != d["seg"]
    rb = _record(store, "kernel/b")
    inside = rb[3:3 + a["size"]]                                 # a's size of bytes inside b's record
    hostile = {
        "b_start": {**a, "start": b["start"]},                                  # SHA-256 differs
        "b_whole": {**b},                                                       # b's record: b's key inside
        "b_inside": {**a, "start": b["start"] + 3, "sha256": hashlib.sha256(inside).hexdigest()},
        "other_segment": {**a, "seg": d["seg"]},
        "other_segment_d": {**d, "used": a["used"]},
        "past_the_end": {**a, "start": d["start"] + (1 << 20)},
        "overlapping_end": {**b, "size": b["size"] + 1},
    }
    for name, entry in hostile.items():
        index["entries"]["kernel/a"] = pack_entry(entry)
        _write_index(tmp_path, index)
        assert disk.DiskStore(tmp_path, 1 << 20).get("kernel/a") is None, name
    reader = disk.DiskStore(tmp_path, 1 << 20)
    assert reader.get("kernel/a") is None and reader.flush()
    assert "kernel/a" not in _index(tmp_path)["entries"]          # dropped at the flush
    assert reader.get("kernel/b") == (BLOBS["kernel/b"], {}) and reader.get("kernel/d") == (b"\x90" * 7 + b"\xc3", {})


def test_a_huge_size_under_a_memory_limit_is_a_miss(tmp_path):
    """An entry of MAX_BLOB bytes (1 GiB) pointing into a small segment, read by a process whose
    address space is limited (`ulimit -v`): the read's buffer cannot be had; a miss, not MemoryError."""
    store = _store_with(tmp_path)
    index = _index(tmp_path)
    index["entries"]["kernel/a"] = pack_entry({**unpack_entry(index["entries"]["kernel/a"]), "size": MAX_BLOB})
    _write_index(tmp_path, index)
    del store
    out = run(f"""
        import resource
        from tppasm.cache import disk
        store = disk.DiskStore({str(tmp_path)!r}, 1 << 20)
        store.get("kernel/b")                          # imports and buffers before the limit
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (used + (256 << 20), hard))
        print(store.get("kernel/a"), store.get("kernel/b"))
    """, timeout=60)
    assert out.splitlines()[-1] == f"None ({BLOBS['kernel/b']!r}, {{}})"


def test_a_huge_size_is_a_miss_without_allocating_it(tmp_path):
    """An entry of MAX_BLOB bytes (1 GiB) pointing into a small segment is a miss before any buffer
    of its size is allocated (os.pread allocates the whole size first)."""
    store = _store_with(tmp_path)
    index = _index(tmp_path)
    index["entries"]["kernel/a"] = pack_entry({**unpack_entry(index["entries"]["kernel/a"]), "size": MAX_BLOB})
    _write_index(tmp_path, index)
    reader = disk.DiskStore(tmp_path, 1 << 20)
    assert reader.get("kernel/b") == (BLOBS["kernel/b"], {})
    tracemalloc.start()
    try:
        assert reader.get("kernel/a") is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak


def test_a_record_whose_header_nests_too_deep_is_a_miss(tmp_path):
    """A segment written by hand (its SHA-256 in the index: same user, hostile) whose record's JSON
    header nests 100,000 deep: json.loads raises RecursionError, which must be a miss."""
    _store_with(tmp_path)
    seg = "seg-" + "ab" * 8
    (tmp_path / seg).mkdir(mode=0o700)
    head = b"[" * 100_000
    record = len(head).to_bytes(4, "little") + head + b"\xc3"
    (tmp_path / seg / "data.ninja").write_bytes(record)
    index = _index(tmp_path)
    index["entries"]["kernel/a"] = pack_entry({"seg": seg, "i": 0, "start": 0, "size": len(record),
                                               "sha256": hashlib.sha256(record).hexdigest(), "used": 1.0})
    _write_index(tmp_path, index)
    store = disk.DiskStore(tmp_path, 1 << 20)
    assert store.get("kernel/a") is None and store.get("kernel/b") == (BLOBS["kernel/b"], {})


@pytest.fixture
def opened(monkeypatch):
    """Every (path, dir_fd) os.open is called with while the fixture is active."""
    calls, real = [], os.open

    def spy(path, flags, mode=0o777, *, dir_fd=None):
        calls.append((os.fspath(path), dir_fd))
        return real(path, flags, mode, dir_fd=dir_fd)
    monkeypatch.setattr(os, "open", spy)
    return calls


def test_segment_names_that_lead_outside_the_store_are_never_opened(tmp_path, opened):
    """``seg`` fields naming a directory outside that holds the very record of the key (its SHA-256
    matches: only the name check stands), a link to it under a segment's name, and FIFOs."""
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    store = _store_with(root)
    good = unpack_entry(_index(root)["entries"]["kernel/a"])
    record = _record(store, "kernel/a")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "data.ninja").write_bytes(bytes(good["start"]) + record)
    names = {"up": "../outside", "absolute": str(outside), "etc": "/etc/passwd", "dot": ".", "dotdot": "..",
             "trailing": good["seg"] + "/", "newline": good["seg"] + "\n", "upper": good["seg"].upper()}
    links = {"link": "seg-" + "1" * 16, "data_link": "seg-" + "2" * 16, "fifo": "seg-" + "3" * 16,
             "data_fifo": "seg-" + "4" * 16}
    os.symlink(outside, root / links["link"])
    (root / links["data_link"]).mkdir(mode=0o700)
    os.symlink(outside / "data.ninja", root / links["data_link"] / "data.ninja")
    os.mkfifo(root / links["fifo"])
    (root / links["data_fifo"]).mkdir(mode=0o700)
    os.mkfifo(root / links["data_fifo"] / "data.ninja")
    index = _index(root)
    for name, seg in {**names, **links}.items():
        index["entries"][f"kernel/{name}"] = pack_entry({**good, "seg": seg})
    _write_index(root, index)
    opened.clear()
    reader = disk.DiskStore(root, 1 << 20)
    with _within(20):
        for name in {**names, **links}:
            assert reader.get(f"kernel/{name}") is None, name
        assert reader.get("kernel/a") == (BLOBS["kernel/a"], {})
    mine = ("index.json", "stats.json", "lock", "data.ninja")
    for path, dir_fd in opened:             # the directory, then names in it (and in a segment) only
        assert (path == str(root) and dir_fd is None) or (dir_fd is not None and (
            files.is_segment(path) or path in mine)), (path, dir_fd)
    opened.clear()
    with _within(20):
        assert reader.flush()
    for path, dir_fd in opened:             # and the flush: its own files, segment-named trees it deletes
        seg = os.path.relpath(path, root).split(os.sep)[0] if dir_fd is None else path
        assert path == str(root) or files.is_segment(seg) or path in mine or files.is_leftover(path), (path, dir_fd)
    assert not {f"kernel/{n}" for n in {**names, **links}} & set(_index(root)["entries"])   # dropped at the flush
    assert (outside / "data.ninja").read_bytes()[good["start"]:] == record          # (a link is deleted, not followed)
    assert disk.DiskStore(root, 1 << 20).get("kernel/a") == (BLOBS["kernel/a"], {})


# -- 4. an index an older tppasm wrote ---------------------------------------------------------

def test_a_format_2_index_reads_as_empty_and_the_next_flush_replaces_it(tmp_path):
    store = _store_with(tmp_path)
    index = _index(tmp_path)
    old_seg = unpack_entry(index["entries"]["kernel/a"])["seg"]
    old = {"format": 2, "entries": {k: unpack_entry(e) for k, e in index["entries"].items()},   # format 2's objects
           "records": {"tune/x": {"record": {"spec": "aBC"}, "used": 1.0, "size": 15}},
           "segments": index["segments"]}
    _write_index(tmp_path, old)
    (tmp_path / "seg-photos").mkdir()
    (tmp_path / "seg-photos" / "data.ninja").write_bytes(b"mine")
    (tmp_path / "notes.txt").write_text("mine")
    del store
    fresh = disk.DiskStore(tmp_path, 1 << 20)
    assert [fresh.get(k) for k in BLOBS] == [None] * 3 and fresh.records() == []
    assert (tmp_path / old_seg / "data.ninja").exists()             # nothing deleted by a reader
    fresh.put("kernel/new", b"\x90\xc3", {})
    assert fresh.flush()
    now = _index(tmp_path)
    assert now["format"] == files.FORMAT == 3 and list(now["entries"]) == ["kernel/new"]
    assert type(now["entries"]["kernel/new"]) is str and now["records"] == {}
    assert not (tmp_path / old_seg).exists()                         # no entry uses it: collected under the lock
    assert (tmp_path / "seg-photos" / "data.ninja").read_bytes() == b"mine" and (tmp_path / "notes.txt").exists()
    assert disk.DiskStore(tmp_path, 1 << 20).get("kernel/new") == (b"\x90\xc3", {})


@pytest.mark.parametrize("fmt", [2, "3", None, [3], 4])
def test_an_index_of_another_format_is_empty_and_replaced(tmp_path, fmt):
    _store_with(tmp_path)
    index = _index(tmp_path)
    index["format"] = fmt
    _write_index(tmp_path, index)
    store = disk.DiskStore(tmp_path, 1 << 20)
    assert store.get("kernel/a") is None and store.info()["entries"] == {}
    store.put("kernel/new", b"\x90\xc3", {})
    assert store.flush() and _index(tmp_path)["format"] == 3 and list(_index(tmp_path)["entries"]) == ["kernel/new"]


# -- 5. a writer replacing the index under a reader --------------------------------------------

WRITER = r"""
import hashlib, os, sys, time
from tppasm.cache import disk
disk.MAX_SEGMENTS = 2                              # compaction at nearly every flush
store = disk.DiskStore(ROOT, 16 << 10)             # eviction too
blob = lambda k: hashlib.sha256(k.encode()).digest() * (1 + len(k) % 40) + b"\xc3"
end, n = time.monotonic() + SECONDS, 0
while time.monotonic() < end:
    for _ in range(3):
        key = f"kernel/{n % KEYS}"
        store.put(key, blob(key), {"n": len(key)})
        n += 1
    assert store.flush()
print("flushes", n // 3)
"""

READER = r"""
import hashlib, json, os, random, time
from tppasm.cache import disk, files, trust
disk.TOUCH_S = -1.0                               # every touch stale: this reader's flushes rewrite the index too
blob = lambda k: hashlib.sha256(k.encode()).digest() * (1 + len(k) % 40) + b"\xc3"
rng, seen, hits, misses, flushes = random.Random(0), set(), 0, 0, 0
store = disk.DiskStore(ROOT, 16 << 10)
end = time.monotonic() + SECONDS
while time.monotonic() < end:
    if rng.random() < 0.05:
        store = disk.DiskStore(ROOT, 16 << 10)      # a first lookup: the lazy read
    if rng.random() < 0.02:
        flushes += store.flush()
    key = f"kernel/{rng.randrange(KEYS)}"
    found = store.get(key)
    assert found in (None, (blob(key), {"n": len(key)})), (key, found)
    hits, misses = hits + (found is not None), misses + (found is None)
    fd = trust.open_directory(ROOT)
    try:
        value, ident, state = trust.read_json("index.json", fd, ROOT, disk.MAX_INDEX_BYTES, print)
    finally:
        os.close(fd)
    if state != "absent":
        assert state == "ok" and value["format"] == files.FORMAT, state
        assert all(type(e) is str for e in value["entries"].values())
        seen.add(ident)
print(json.dumps({"hits": hits, "misses": misses, "indexes": len(seen), "flushes": flushes}))
"""


def test_a_reader_sees_the_old_or_the_new_index_while_another_process_flushes(tmp_path):
    env = {"TPPASM_CACHE_DIR": str(tmp_path)}
    head = f"ROOT, SECONDS, KEYS = {str(tmp_path)!r}, 3.0, 40\n"
    writer = start(head + WRITER, env)
    out = json.loads(run(head + READER, env, timeout=60).splitlines()[-1])
    w_out, w_err = writer.communicate(timeout=60)
    assert writer.returncode == 0, w_err
    assert out["hits"] > 20 and out["indexes"] > 5 and out["flushes"] > 0, (out, w_out)


def test_an_index_created_between_its_open_and_the_look_at_its_name_is_read(tmp_path, monkeypatch):
    """The first index of a store appears between a reader's open (no such file) and its look at
    what the name is (a regular file): read, not "unreadable" (under load the reader of the test
    above met this about once in 15 runs)."""
    (tmp_path / "index.json").write_text('{"format": %d, "entries": {}}' % files.FORMAT)
    real, calls = trust.open_own, []

    def late(*args, **kw):
        calls.append(args[0])
        return None if len(calls) == 1 else real(*args, **kw)   # the first open ran before the file was there
    monkeypatch.setattr(trust, "open_own", late)
    fd = trust.open_directory(str(tmp_path))
    try:
        value, _, state = trust.read_json("index.json", fd, str(tmp_path), 1 << 20, print)
    finally:
        os.close(fd)
    assert (state, value) == ("ok", {"format": files.FORMAT, "entries": {}}) and len(calls) == 2


def test_entries_looked_up_after_the_index_was_swapped(tmp_path, monkeypatch):
    """A reader has unpacked kernel/a and kernel/b and touched them; another process replaces the
    index (a's entry now damaged, b's packed again, c new). The reader's lookup of c swaps its index;
    its flush's stale check then unpacks b anew and skips a; b's last use is written, a stays gone."""
    store = _store_with(tmp_path, {"kernel/a": BLOBS["kernel/a"], "kernel/b": BLOBS["kernel/b"]})
    del store
    reader = disk.DiskStore(tmp_path, 1 << 20)
    assert reader.get("kernel/a") and reader.get("kernel/b")
    assert [type(reader._index["entries"][k]) for k in ("kernel/a", "kernel/b")] == [dict, dict]
    other = _store_with(tmp_path, {"kernel/c": BLOBS["kernel/c"]})
    index = _index(tmp_path)
    index["entries"]["kernel/a"] = {"seg": [], "used": "x"}
    _write_index(tmp_path, index)
    del other
    assert reader.get("kernel/c") == (BLOBS["kernel/c"], {})             # _entry after _refresh swapped it
    assert "kernel/a" not in reader._index["entries"] and type(reader._index["entries"]["kernel/b"]) is str
    reader._touched["kernel/b"] = reader._touched["kernel/a"] = 4e9       # stale, against any written use
    monkeypatch.setattr(disk, "TOUCH_S", 600.0)
    assert reader.flush()
    kept = {k: unpack_entry(e) for k, e in _index(tmp_path)["entries"].items()}
    assert sorted(kept) == ["kernel/b", "kernel/c"] and kept["kernel/b"]["used"] == 4e9
    assert reader._entry("kernel/a") is None and reader._entry("kernel/b")["used"] == 4e9
    assert disk.DiskStore(tmp_path, 1 << 20).get("kernel/a") is None


# -- 6. round trip -----------------------------------------------------------------------------

USED = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([0, 0.0, -0.0, 5e-324, 1e308]))


@settings(max_examples=300, deadline=None)
@given(st.builds(dict, seg=st.builds(files.new_segment_name), i=st.integers(0, (1 << 63) - 1),
                 start=st.integers(0, (1 << 63) - 1), size=st.integers(1, MAX_BLOB),
                 sha256=st.binary(min_size=32, max_size=32).map(bytes.hex), used=USED))
def test_unpack_of_pack_is_the_entry_with_used_exact(entry):
    back = unpack_entry(pack_entry(entry))
    assert back == entry and type(back["used"]) is float
    assert struct.pack("<d", back["used"]) == struct.pack("<d", float(entry["used"]))     # bit for bit (-0.0 too)


def test_every_entry_the_store_writes_round_trips(tmp_path, monkeypatch):
    """Every index a flush writes (new segments, last uses, eviction, compaction, forget) reads back
    as the entries the writer held, ``used`` bit for bit."""
    written, real = [], files.packed_index

    def checked(index):
        out = real(index)
        for key, entry in index["entries"].items():
            back = unpack_entry(out["entries"][key])
            assert back == entry and math.copysign(1, back["used"]) == math.copysign(1, entry["used"]), key
            assert struct.pack("<d", back["used"]) == struct.pack("<d", float(entry["used"]))
        written.append(len(index["entries"]))
        return out
    monkeypatch.setattr(disk, "packed_index", checked)
    monkeypatch.setattr(disk, "MAX_SEGMENTS", 2)
    store = disk.DiskStore(tmp_path, 24 << 10)
    for round_ in range(8):
        for j in range(6):
            store.put(f"kernel/{round_}-{j}", bytes([0x90] * (100 * j + round_)) + b"\xc3", {"r": round_})
        assert store.flush()
        store._touched[f"kernel/{round_}-0"] = time.time() + 1000 + round_ / 3    # a last use to write (stale)
    store.put_record("tune/x", {"spec": "aBC"})
    assert store.forget("tune") == 1
    assert len(written) >= 9 and max(written) > 0
