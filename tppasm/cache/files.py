"""What the disk store (:mod:`.disk`) writes, and how it reads it back defensively: the records
inside segments, the index's field types, and the names of its files.

Only names of the exact forms below are the store's (``seg-`` and 16 hex digits; ``tmp-seg-``
and 16 hex digits; ``index.json`` / ``stats.json`` and ``.tmp-<pid>-<8 hex digits>``), so the
store never deletes a file of the user's that happens to sit in its directory.

>>> is_segment(new_segment_name()), is_segment("seg-photos")
(True, False)
>>> is_leftover(temporary_name("index.json")), is_leftover("index.json.tmp-mine"), is_leftover("tmp-notes")
(True, False, False)
"""
import errno
import hashlib
import json
import math
import os
import re
import resource
import shutil
import stat
import uuid
import warnings

FORMAT = 3                          # 2: records carry their key; 3: entries packed in one string each
MAX_BLOB = 1 << 30                  # larger sizes in an index entry are damage
_INT64 = 1 << 63                    # JSON integers have no bound; past this, offsets or floats overflow
SEGMENT_SLACK = 256 << 10          # a segment's small files and block rounding, and room for the index
_SEGMENT = re.compile(r"seg-[0-9a-f]{16}")
_LEFTOVER = re.compile(r"tmp-seg-[0-9a-f]{16}|(index|stats)\.json\.tmp-[0-9]+-[0-9a-f]{8}")
OWN_FILES = ("index.json", "stats.json")     # the store's only if their content says so (:mod:`.trust`)
MAX_RECORD_DEPTH = 32               # records nest at most this deep: the index parses at any call depth


def new_segment_name():
    """A fresh segment directory name, ``seg-`` and 16 hex digits."""
    return f"seg-{uuid.uuid4().hex[:16]}"


def temporary_name(name):
    """The name ``name`` is written under before it is renamed into place (``tmp-seg-...`` for a
    segment, ``<name>.tmp-<pid>-<8 hex digits>`` for a file)."""
    return "tmp-" + name if is_segment(name) else f"{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def is_segment(name):
    """Whether ``name`` has the form of a segment this store writes."""
    return isinstance(name, str) and _SEGMENT.fullmatch(name) is not None


def is_leftover(name):
    """Whether ``name`` has the form of a temporary file or directory this store writes."""
    return _LEFTOVER.fullmatch(name) is not None


def delete(path):
    """Delete the file or directory tree ``path``, ignoring errors (a leftover another cleanup took)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        _remove(path)


def check_free_space(root, records):
    """OSError (ENOSPC) unless the file system of ``root`` has room for a segment of ``records``
    (bytes objects): mmap-ninja writes through a mapping of a sparse file, and a full disk then
    kills the process with SIGBUS instead of failing the write. (Another writer may take the space
    between this check and the write: this narrows the window, it cannot close it.)"""
    data = sum(len(r) for r in records)
    check_file_size(max(data, 16 * len(records)), "a segment's largest file")      # (data, else its offsets)
    need = data + 40 * len(records) + SEGMENT_SLACK
    st = os.statvfs(root)
    free = st.f_bavail * st.f_frsize
    if free < need:
        raise OSError(errno.ENOSPC, f"No space left on device: {free} bytes free in {root}, a segment needs {need}")


def check_file_size(nbytes, what):
    """OSError (EFBIG) unless a file of ``nbytes`` fits this process's file-size limit (``ulimit -f``):
    a write past it raises SIGXFSZ, which kills a process that does not ignore it (CPython ignores
    it at startup; a program that embeds Python, or restores the default, does not).

    >>> check_file_size(1 << 20, "index.json")      # (no exception: fits, or no limit)
    """
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if soft != resource.RLIM_INFINITY and nbytes > soft:
        raise OSError(errno.EFBIG, f"File too large: {what} needs {nbytes} bytes, over this process's file-size "
                                   f"limit (`ulimit -f`: {soft} bytes)")


def close_all(fds):
    """Close the descriptors in the dict ``fds`` (name -> descriptor or None), emptying it: the segments
    of a store that was dropped."""
    for name in list(fds):
        fd = fds.pop(name, None)
        if fd is not None:
            os.close(fd)


def ragged_mmap():
    """mmap-ninja's RaggedMmap, imported on first use (about 50 ms: only processes that store pay it).
    It imports joblib, which warns at import where /dev/shm is missing or read-only (AWS Lambda,
    sandboxes) that it "will operate in serial mode": tppasm never uses joblib, so that is silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r".*joblib will operate in serial mode", UserWarning)
        from mmap_ninja.ragged import RaggedMmap
    return RaggedMmap


def segment_entries(name, items, starts, ends, now):
    """Index entries of ``items`` [(key, record)] written in segment ``name`` at ``starts``/``ends``."""
    entries = {}
    for i, (key, record) in enumerate(items):
        if ends[i] - starts[i] != len(record):
            raise ValueError(f"segment {name}: record {i} has {ends[i] - starts[i]} bytes, not {len(record)}")
        entries[key] = {"seg": name, "i": i, "start": starts[i], "size": len(record),
                        "sha256": hashlib.sha256(record).hexdigest(), "used": now}
    return entries


def _pack(key, blob, meta):
    """The stored record of ``blob`` and its JSON-able ``meta`` under ``key``."""
    text = json.dumps({"key": key, "meta": meta}, separators=(",", ":")).encode()
    return len(text).to_bytes(4, "little") + text + bytes(blob)


def _unpack(record, key):
    """(blob, meta) of a record :func:`_pack` made for ``key``; None if it is not one (or another key's)."""
    if record is None or len(record) < 4:
        return None
    n = int.from_bytes(record[:4], "little")
    try:
        head = json.loads(record[4:4 + n])
    except (ValueError, RecursionError, MemoryError):     # (a hostile header: nested deep)
        return None
    blob = record[4 + n:]
    if not (blob and n <= len(record) - 4 and isinstance(head, dict) and head.get("key") == key and "meta" in head):
        return None
    return blob, head["meta"]


def within_depth(value, limit=None):
    """Whether ``value`` (JSON-able) nests at most ``limit`` (default :data:`MAX_RECORD_DEPTH`)
    containers deep; checked without recursion, so any depth is answered.

    >>> within_depth({"a": [1, [2]]}, 3), within_depth({"a": [1, [2]]}, 2)
    (True, False)
    """
    limit = MAX_RECORD_DEPTH if limit is None else limit
    work = [(value, 1)]
    while work:
        v, depth = work.pop()
        if isinstance(v, (dict, list, tuple)):
            if depth > limit:
                return False
            work.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return True


def _is_count(v):
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _INT64      # (a file offset or size)


def _is_time(v):
    return math.isfinite(v) if isinstance(v, float) else \
        isinstance(v, int) and not isinstance(v, bool) and -_INT64 < v < _INT64     # (isfinite overflows on ints)


def pack_entry(entry):
    """An index entry as index.json keeps it: one string of its fields (a dict of six keys each took
    JSON's decoder most of the ~40 ms of reading a full index; strings take a fifth of it).

    >>> pack_entry({"seg": "seg-0123456789abcdef", "i": 3, "start": 64, "size": 10, "sha256": "ab", "used": 1.5})
    'seg-0123456789abcdef 3 64 10 ab 1.5'
    """
    return f"{entry['seg']} {entry['i']} {entry['start']} {entry['size']} {entry['sha256']} {float(entry['used'])!r}"


def unpack_entry(text):
    """The entry :func:`pack_entry` packed, its fields of the types this module writes; None for
    anything else (damage: dropped like an absent entry).

    >>> unpack_entry("seg-0123456789abcdef 3 64 10 ab 1.5")["size"], unpack_entry("seg-x 3 64 0 ab 1.5")
    (10, None)
    """
    fields = text.split(" ") if type(text) is str and len(text) < 4096 else ()
    if len(fields) != 6:
        return None
    seg, i, start, size, sha, used = fields
    try:
        entry = {"seg": seg, "i": int(i), "start": int(start), "size": int(size), "sha256": sha, "used": float(used)}
    except ValueError:
        return None
    ok = (_is_count(entry["i"]) and _is_count(entry["start"]) and 0 < entry["size"] <= MAX_BLOB and seg and sha
          and _is_time(entry["used"]))
    return entry if ok else None


def packed_index(index):
    """``index`` as index.json keeps it (its entries packed: :func:`pack_entry`).

    >>> packed_index({"entries": {"kernel/k": {"seg": "s", "i": 0, "start": 0, "size": 1, "sha256": "h", "used": 2}}})
    {'entries': {'kernel/k': 's 0 0 1 h 2.0'}}
    """
    return {**index, "entries": {k: pack_entry(e) for k, e in index["entries"].items()}}


def _clean_index(index, lazy=False):
    """``index`` (as read from index.json) keeping only entries, records and segments whose fields
    have the types this module writes (the rest: damage, dropped like absent entries), its entries
    unpacked; ``lazy``: entries left packed, for a reader that unpacks the few it looks up."""
    entries, records, segments = index["entries"], index["records"], index["segments"]
    if lazy:
        index["entries"] = {k: t for k, t in entries.items() if type(t) is str}
    else:
        index["entries"] = {k: e for k, e in ((k, unpack_entry(t)) for k, t in entries.items()) if e is not None}
    index["records"] = {k: r for k, r in records.items()
                        if isinstance(r, dict) and "record" in r and _is_count(r.get("size", 0))
                        and _is_time(r.get("used", 0)) and within_depth(r["record"])}
    index["segments"] = {k: g for k, g in segments.items()
                         if isinstance(g, dict) and _is_count(g.get("bytes", 0)) and _is_count(g.get("blobs", 0))}
    return index


def replace_json(root, name, value):
    """Replace ``name`` in the directory ``root`` (a descriptor) with ``value`` as JSON, atomically: a
    temporary file, then ``os.replace``. (``json.dumps``, the C encoder: ``json.dump`` recurses deeper.)

    >>> import tempfile
    >>> d = tempfile.mkdtemp(); fd = os.open(d, os.O_RDONLY); replace_json(fd, "x.json", [1]); os.close(fd)
    >>> open(os.path.join(d, "x.json")).read()
    '[1]'
    """
    text = json.dumps(value, separators=(",", ":")).encode()
    check_file_size(len(text), name)
    tmp = temporary_name(name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=root)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text)
        os.replace(tmp, name, src_dir_fd=root, dst_dir_fd=root)
    except BaseException:
        try:
            os.remove(tmp, dir_fd=root)
        except OSError:
            pass
        raise


def _empty_index():
    return {"format": FORMAT, "entries": {}, "records": {}, "segments": {}}


def _remove(path):
    try:
        os.remove(path)
    except OSError:
        pass


def tree_bytes(path):
    """Bytes of the file or directory tree ``path`` (links not followed; 0 if absent)."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size
    total = 0
    for d, _, names in os.walk(path):
        for f in names:
            try:
                total += os.lstat(os.path.join(d, f)).st_size
            except OSError:
                pass
    return total
