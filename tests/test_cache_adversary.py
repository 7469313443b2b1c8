"""The disk cache against another user and an unlucky one: files another user wrote are never
loaded (nor a directory swapped for theirs mid-process); a user's own index.json and stats.json
are never replaced or deleted; deep records are refused and a deep index never wipes the cache;
a stuck lock costs one wait, said once; files of root's (a sudo run) are named with the fix; and
``cache info`` / ``cache clear`` tell the truth.

"Another user's" files: chown to uid 4242 when the tests run as root, else the ownership check
(``trust.is_mine``) is told which inodes are foreign."""
import fcntl
import json
import os
import sys
import warnings

import pytest

import tppasm.cache as tc
from tppasm.cache import disk, trust, upkeep
from tppasm.__main__ import main

OTHER = 4242


@pytest.fixture
def foreign(monkeypatch):
    """foreign(path, ...): make those files and trees another user's."""
    inodes = set()

    def mine(st):
        return st.st_ino not in inodes and st.st_uid == os.getuid()
    if os.getuid() != 0:
        monkeypatch.setattr(trust, "is_mine", mine)
        monkeypatch.setattr(upkeep, "is_mine", mine)

    def make(*paths):
        for path in paths:
            tree = [path] + [os.path.join(d, n) for d, ds, fs in os.walk(path) for n in ds + fs]
            for p in tree:
                if os.getuid() == 0:
                    os.lchown(p, OTHER, OTHER)
                else:
                    inodes.add(os.lstat(p).st_ino)
    return make


def _store_with(root, blobs):
    store = disk.DiskStore(root, 1 << 20)
    for key, blob in blobs.items():
        store.put(key, blob, {})
    assert store.flush()
    return store


def _index(root):
    return json.loads((root / "index.json").read_text())


# -- 1. files of another user's are never loaded --------------------------------------------

def test_an_index_of_another_users_is_never_loaded(tmp_path, foreign):
    _store_with(tmp_path, {"kernel/a": b"\x90\xc3"})
    foreign(tmp_path / "index.json")
    with pytest.warns(RuntimeWarning, match=r"index.json belongs to user id .*cache clear"):
        assert disk.DiskStore(tmp_path, 1 << 20).get("kernel/a") is None


def test_a_segment_of_another_users_is_never_loaded(tmp_path, foreign):
    store = _store_with(tmp_path, {"kernel/a": b"\x90\xc3"})
    foreign(tmp_path / store._entry("kernel/a")["seg"])
    with pytest.warns(RuntimeWarning, match=r"seg-[0-9a-f]+ belongs to user id .*TPPASM_CACHE_DIR"):
        assert disk.DiskStore(tmp_path, 1 << 20).get("kernel/a") is None


def test_a_directory_swapped_for_another_users_is_refused_where_it_is_used(tmp_path, foreign):
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.mkdir(mode=0o700)
    theirs.mkdir(mode=0o700)
    _store_with(theirs, {"kernel/a": b"\xcc\xc3"})              # their code under the key
    foreign(theirs)
    assert tc.check_directory(str(mine)) is None                # checked once, at the first kernel
    store = disk.DiskStore(mine, 1 << 20)
    os.rename(mine, tmp_path / "old")
    os.symlink(theirs, mine)
    with pytest.warns(RuntimeWarning, match="owned by user id"):
        assert store.get("kernel/a") is None


def test_the_chmod_advice_says_to_clear_what_others_wrote(tmp_path):
    os.chmod(tmp_path, 0o777)
    said = tc.check_directory(str(tmp_path))
    assert "chmod 700" in said and "cache clear" in said


# -- 2. a user's index.json and stats.json are theirs -----------------------------------------

def test_a_users_index_and_stats_are_never_replaced_or_deleted(tmp_path):
    (tmp_path / "index.json").write_text('{"name": "my-site"}')
    (tmp_path / "stats.json").write_text('{"visits": 123}')
    (tmp_path / "model.bin").write_bytes(bytes(100_000))
    store = disk.DiskStore(tmp_path, 1 << 20)
    store.put("kernel/a", b"\x90\xc3", {})
    with pytest.warns(RuntimeWarning, match="index.json is not the kernel cache's"):
        assert store.flush() is False
    info = disk.DiskStore(tmp_path, 1 << 20).info()
    assert info["disk_bytes"] < 1000 and any("not the kernel cache's" in p for p in info["problems"])
    assert disk.DiskStore(tmp_path, 1 << 20).clear() == 0
    assert (tmp_path / "index.json").read_text() == '{"name": "my-site"}'
    assert (tmp_path / "stats.json").read_text() == '{"visits": 123}'
    assert (tmp_path / "model.bin").stat().st_size == 100_000


def test_an_index_of_an_older_format_is_replaced(tmp_path):
    (tmp_path / "index.json").write_text('{"format": 1, "entries": {}, "segments": {}}')
    _store_with(tmp_path, {"kernel/a": b"\x90\xc3"})
    assert _index(tmp_path)["format"] == disk.FORMAT


# -- 3. deep records --------------------------------------------------------------------------

def _nested(depth):
    value = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_records_nested_too_deep_are_refused_naming_the_limit(tmp_path):
    with tc.using(tmp_path):
        assert tc.remember("mine", "flat", _nested(disk.MAX_RECORD_DEPTH))
        for depth in (disk.MAX_RECORD_DEPTH + 1, 5000):
            with pytest.raises(TypeError, match="MAX_RECORD_DEPTH"):
                tc.remember("mine", "deep", _nested(depth))


def test_an_index_too_deep_for_the_call_depth_is_left_as_it_is(tmp_path):
    _store_with(tmp_path, {"kernel/a": b"\x90\xc3"})
    index = _index(tmp_path)
    index["records"]["old/x"] = {"record": _nested(300), "used": 1.0, "size": 600}   # as an older version wrote
    (tmp_path / "index.json").write_text(json.dumps(index, separators=(",", ":")))
    before = (tmp_path / "index.json").read_bytes()
    store = disk.DiskStore(tmp_path, 1 << 20)
    store.put("kernel/b", b"\x90\x90\xc3", {})
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(_frames()) + 150)               # a caller deep in a framework's stack
    try:
        with pytest.warns(RuntimeWarning, match="index.json cannot be read here"):
            assert store.flush() is False
    finally:
        sys.setrecursionlimit(limit)
    assert (tmp_path / "index.json").read_bytes() == before     # every other entry kept
    fresh = disk.DiskStore(tmp_path, 1 << 20)                   # at an ordinary depth: read, the deep record dropped
    assert fresh.get("kernel/a") == (b"\x90\xc3", {}) and fresh.records("old") == []


def _frames():
    frame, frames = sys._getframe(), []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames


# -- 4. a stuck lock --------------------------------------------------------------------------

@pytest.fixture
def held_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(disk, "LOCK_TIMEOUT_S", 0.05)
    fd = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield fd
    os.close(fd)


def test_a_stuck_lock_costs_one_wait_said_once_then_none(tmp_path, held_lock, monkeypatch):
    waits = []
    real_sleep = trust.time.sleep
    monkeypatch.setattr(trust.time, "sleep", lambda s: (waits.append(s), real_sleep(s)))
    store = disk.DiskStore(tmp_path, 1 << 20)
    store.put("kernel/a", b"\x90\xc3", {})
    with pytest.warns(RuntimeWarning, match=r"lock is held by another process .*fuser"):
        assert store.flush() is False
    assert waits
    waits.clear()
    store._retry_at = 0.0                                       # the retry time came
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert store.flush() is False
    assert waits == [] and "kernel/a" in store._pending        # one try, no waiting, nothing lost
    with pytest.raises(OSError, match=r"cannot clear .* held by another process"):
        store.clear()
    with pytest.warns(RuntimeWarning, match="1 kernels and records this process made were not written"):
        disk._flush_at_exit()
    fcntl.flock(held_lock, fcntl.LOCK_UN)
    store._retry_at = 0.0
    assert store.flush() and disk.DiskStore(tmp_path, 1 << 20).get("kernel/a") is not None


# -- 5. files of root's, after a sudo run -----------------------------------------------------

def test_files_of_another_user_are_named_with_the_fix(tmp_path, foreign):
    store = _store_with(tmp_path, {"kernel/a": b"\x90\xc3"})
    seg = store._entry("kernel/a")["seg"]
    foreign(tmp_path / "lock", tmp_path / seg)
    fresh = disk.DiskStore(tmp_path, 1 << 20)
    fresh.put("kernel/b", b"\x90\x90\xc3", {})
    with pytest.warns(RuntimeWarning, match=r"lock belongs to user id .*cache clear"):
        assert fresh.flush() is False
    problems = disk.DiskStore(tmp_path, 1 << 20).info()["problems"]
    assert any("2 of its files" in p and "belong to user id" in p for p in problems)
    assert "sudo" in trust.owner_text(0)
    message = upkeep.undeleted_message(str(tmp_path), [(str(tmp_path / seg), PermissionError(13, "denied"))])
    assert f"sudo rm -rf {tmp_path / seg}" in message


# -- 6. what cache info and cache clear say ---------------------------------------------------

def test_cache_clear_with_the_cache_off_clears_it_and_counts_only_its_files(tmp_path, monkeypatch, capsys):
    _store_with(tmp_path, {"kernel/a": b"\x90\xc3"})
    (tmp_path / "model.bin").write_bytes(bytes(3 << 20))
    monkeypatch.setenv("TPPASM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TPPASM_CACHE", "0")
    tc.reset()
    try:
        assert main(["cache", "clear"]) == 0
    finally:
        tc.reset()
    out = capsys.readouterr().out
    assert "cleared" in out and "TPPASM_CACHE=0" in out and "MiB" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lock", "model.bin"]


@pytest.mark.parametrize("where", ["under a file", "in /proc"])
def test_cache_info_says_why_a_directory_cannot_be_created(tmp_path, monkeypatch, capsys, where):
    (tmp_path / "afile").write_text("")
    path = tmp_path / "afile" / "cache" if where == "under a file" else "/proc/self/tppasm-cache"
    monkeypatch.setenv("TPPASM_CACHE_DIR", str(path))
    monkeypatch.setenv("TPPASM_CACHE", "1")
    tc.reset()
    try:
        assert main(["cache", "info"]) == 0
    finally:
        tc.reset()
    out = capsys.readouterr().out
    assert "cannot be created" in out and "not created yet" not in out


def test_a_directory_named_like_the_stats_file_is_kept_and_kernels_still_reach_the_disk(tmp_path):
    (tmp_path / "stats.json").mkdir()
    (tmp_path / "stats.json" / "mine.txt").write_text("mine")
    store = disk.DiskStore(tmp_path, 1 << 20)
    store.put("kernel/a", b"\x90\xc3", {})
    with pytest.warns(RuntimeWarning, match="stats.json is not the kernel cache's"):
        assert store.flush()
    store.clear()
    assert (tmp_path / "stats.json" / "mine.txt").read_text() == "mine"
