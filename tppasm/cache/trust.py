"""Whose files the disk store (:mod:`.disk`) trusts, and which files of its directory are its own.

Trust: the directory must be this user's and writable by no one else. That is checked on the
descriptor each slow-path operation (reading the index, opening a segment, a flush, a clear)
opens the directory by, so a directory swapped for a link to someone else's is refused where it
is used, not just at a process's first kernel. Each file and segment directory is opened
without following links and used only if this user owns it, checked with ``fstat`` on the opened
descriptor (no window between the check and the use). A file of another user's (planted while the
directory was open to others, or left by a ``sudo`` run) is never read: its kernels are misses,
and a warning names the fix. The fast path (a kernel found in the index already read, in a
segment already open) checks nothing: what it reads was checked when it was opened.

Ownership of names: ``index.json`` and ``stats.json`` are the store's only when their content says
so (:func:`is_store_index`, :func:`is_store_stats`), or, damaged, when the directory holds a
segment of the store's; a user's file of either name is never replaced or deleted: the store
stops writing there instead, with a warning saying what to do.

>>> import tempfile
>>> d = tempfile.mkdtemp(); fd = open_directory(d); os.close(fd)       # safe: no exception
>>> os.chmod(d, 0o777); open_directory(d)
Traceback (most recent call last):
...
tppasm.cache.trust.UnsafeDirectory: ... is writable by group or others (mode 777); run chmod 700 ...
"""
import errno
import fcntl
import json
import os
import stat
import tempfile
import time

from .files import is_segment

STATS = ("hits", "misses", "stores", "evicted", "discarded")
_FIX = ("run `python -m tppasm cache clear` to delete them (it names any it cannot), or set TPPASM_CACHE_DIR to a "
        "new directory")


def owner_text(uid):
    """Who ``uid`` is, for messages: "user id N (name)", and for root, that a sudo run may have left it."""
    if uid == 0:
        return "user id 0 (root: left by a sudo run?)"
    try:
        import pwd
        return f"user id {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError, OverflowError):
        return f"user id {uid}"


def is_mine(st):
    """Whether the file of stat result ``st`` belongs to this process's user."""
    return st.st_uid == os.getuid()


class _Said(OSError):
    """An OSError whose text is its message alone (no "[Errno N]": the message names the fix)."""

    def __str__(self):
        return str(self.strerror)

    def __reduce__(self):
        # pickle (a worker's error, re-raised in the parent) would call cls(errno, message), which the
        # subclasses with their own arguments refuse: rebuild without __init__, then restore the fields
        return _rebuilt, (type(self), self.errno, self.strerror), self.__dict__


def _rebuilt(cls, number, message):
    """A :class:`_Said` error of class ``cls``, its fields still to be restored (pickle).

    >>> import pickle
    >>> e = pickle.loads(pickle.dumps(NotTheStores("/d", "index.json")))
    >>> type(e).__name__, e.errno == errno.EEXIST, str(e).startswith("/d/index.json is not")
    ('NotTheStores', True, True)
    """
    error = cls.__new__(cls, number, message)        # (OSError parses the pair in __new__ or in __init__,
    OSError.__init__(error, number, message)        # by whether the class has its own __init__)
    return error


class UnsafeDirectory(_Said):
    """The cache directory is missing, not a directory, another user's, or writable by others."""


class ProcessLimit(_Said):
    """A file of the cache cannot be opened or written for want of something the process (not the
    file) lacks: descriptors (EMFILE, ENFILE), memory (ENOMEM), file size (EFBIG); the message names it."""


# what the process lacks, by errno, and the fix (also for the same errors raised by writes)
LIMIT_FIXES = {errno.EMFILE: "raise this process's open-file limit (`ulimit -n`), or close files it holds",
               errno.ENFILE: "the system's open-file table is full (fs.file-max): close files",
               errno.ENOMEM: "free memory (or raise `ulimit -v`)",
               errno.EFBIG: "raise this process's file-size limit (`ulimit -f`)"}


def write_fix(e):
    """How a warning about the write error ``e`` begins the fix it names (then "TPPASM_CACHE=0 ...").

    >>> write_fix(OSError(errno.EFBIG, "File too large")), write_fix(OSError(errno.EROFS, "Read-only"))
    ("Raise this process's file-size limit (`ulimit -f`), or set", 'Fix the directory, or set')
    """
    if isinstance(e, _Said):
        return "Set"                        # its message names the fix
    fix = LIMIT_FIXES.get(getattr(e, "errno", None))
    return f"{fix[0].upper()}{fix[1:]}, or set" if fix else "Fix the directory, or set"


def process_limit(e, path):
    """``e`` (an OSError opening ``path``) as a :class:`ProcessLimit` naming the fix, if the process
    lacks descriptors or memory; else None (the error belongs to the file).

    >>> str(process_limit(OSError(errno.EMFILE, "Too many open files"), "/d/index.json"))
    "Too many open files (/d/index.json): raise this process's open-file limit (`ulimit -n`), or close files it holds"
    """
    if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
        return None
    return ProcessLimit(e.errno, f"{e.strerror} ({path}): {LIMIT_FIXES[e.errno]}")


class ForeignFile(_Said):
    """A file in the cache directory that belongs to another user: never read."""

    def __init__(self, path, uid):
        super().__init__(errno.EPERM, f"{path} belongs to {owner_text(uid)}, not to you (user id {os.getuid()}); "
                                      f"files another user wrote are never loaded: {_FIX}")
        self.path, self.uid = path, uid


class NotTheStores(_Said):
    """A file under one of the store's names that is not the store's (a user's ``index.json``)."""

    def __init__(self, root, name):
        super().__init__(errno.EEXIST, f"{os.path.join(root, name)} is not the kernel cache's (a file of yours?); the "
                                       "cache replaces and deletes only its own files, so it writes nothing here. "
                                       "Set TPPASM_CACHE_DIR to a directory of its own, or move that file away")


def directory_problem(st, path):
    """What is wrong with directory ``path`` (its stat result ``st``) as a place for code, and the
    fix; None if nothing."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory; set TPPASM_CACHE_DIR to a directory"
    if not is_mine(st):
        return (f"is owned by {owner_text(st.st_uid)}, not by you ({os.getuid()}); set TPPASM_CACHE_DIR to a "
                "directory of your own")
    if st.st_mode & 0o022:
        return (f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); run chmod 700 {path}, then "
                "`python -m tppasm cache clear` (another user may have written files there), or set "
                "TPPASM_CACHE_DIR to a private directory")
    return None


def check_directory(path):
    """Create ``path`` (mode 0700) if missing; None if it is safe to keep code in, else what is
    wrong with it and how to fix it (a phrase that follows the path).

    >>> d = tempfile.mkdtemp(); check_directory(os.path.join(d, "cache")) is None
    True
    >>> os.chmod(d, 0o777); "writable by group or others" in check_directory(d)
    True
    """
    try:
        try:
            make_directory(path, 0o700)
        except FileExistsError:
            pass                        # not a directory: said below
        st = os.stat(path)
    except OSError as e:
        return f"cannot be created or read ({e.strerror}); set TPPASM_CACHE_DIR to a directory you can write"
    return directory_problem(st, path)


def make_directory(path, mode):
    """Create directory ``path`` (``mode``) and its missing parents (0777), each with rwx for its owner
    whatever the umask (``umask 277`` would leave 0500: no lock could be written in it);
    FileExistsError if ``path`` exists.

    >>> d = os.path.join(tempfile.mkdtemp(), "a", "b"); old = os.umask(0o277); make_directory(d, 0o700)
    >>> _ = os.umask(old); oct(stat.S_IMODE(os.stat(d).st_mode)), oct(stat.S_IMODE(os.stat(os.path.dirname(d)).st_mode))
    ('0o700', '0o700')
    """
    try:
        os.mkdir(path, mode)
    except FileNotFoundError:
        parent = os.path.dirname(path)
        if not parent or parent == path:
            raise
        try:
            make_directory(parent, 0o777)
        except FileExistsError:
            pass                        # made meanwhile by another process
        os.mkdir(path, mode)
    st = os.stat(path, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o700 != 0o700:
        os.chmod(path, stat.S_IMODE(st.st_mode) | 0o700)


def why_not_creatable(path):
    """None if directory ``path`` could be created (tried on a temporary sibling, removed again),
    else why not: ``cache info`` says so instead of "not created yet".

    >>> why_not_creatable(os.path.join(tempfile.mkdtemp(), "a", "b")) is None
    True
    >>> why_not_creatable("/proc/self/tppasm-cache") is not None
    True
    """
    parent = os.path.dirname(path)
    while parent and not os.path.lexists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    try:
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".tppasm-probe-"))
    except OSError as e:
        return (f"cannot be created: making a directory in {parent} fails ({e.strerror}); set TPPASM_CACHE_DIR "
                "to a directory you can write")
    return None


def open_directory(path):
    """A descriptor of directory ``path``, checked on that descriptor to be safe (UnsafeDirectory
    naming the fix if not)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (OSError, ValueError) as e:
        lacking = isinstance(e, OSError) and process_limit(e, path)
        if lacking:
            raise lacking from None
        raise UnsafeDirectory(getattr(e, "errno", None) or errno.EINVAL,
                              f"{path} cannot be opened ({getattr(e, 'strerror', None) or e})") from None
    try:
        problem = directory_problem(os.fstat(fd), path)
    except OSError as e:
        problem = f"cannot be read ({e.strerror})"
    if problem is not None:
        os.close(fd)
        raise UnsafeDirectory(errno.EPERM, f"{path} {problem}")
    return fd


def open_own(name, dir_fd, root, directory=False):
    """A read-only descriptor of ``name`` in the directory ``dir_fd`` (``root``, for messages) if it
    is a regular file (``directory``: a directory) of this user's; None if it is absent or something
    else (a link, FIFO or device could hang a read or lead elsewhere); ForeignFile if another
    user's; ProcessLimit if the process is out of descriptors or memory (the file may be fine)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | (os.O_DIRECTORY if directory else 0)
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except PermissionError:
        _refuse_if_foreign(name, dir_fd, root)
        return None
    except (OSError, ValueError) as e:      # (ValueError: a NUL byte in the name)
        lacking = isinstance(e, OSError) and process_limit(e, os.path.join(root, name))
        if lacking:
            raise lacking from None
        return None
    try:
        st = os.fstat(fd)
        if (stat.S_ISDIR if directory else stat.S_ISREG)(st.st_mode):
            if is_mine(st):
                return fd
            raise ForeignFile(os.path.join(root, name), st.st_uid)
    except OSError as e:
        os.close(fd)
        if isinstance(e, ForeignFile):
            raise
        return None
    os.close(fd)
    return None


def open_segment(path, name):
    """The descriptor of segment ``name``'s data.ninja in the directory ``path``, checked now: a
    directory and a file of this user's; None if absent or something else; UnsafeDirectory or
    ForeignFile naming the fix."""
    root, seg = open_directory(path), None
    try:
        seg = open_own(name, root, path, directory=True)
        return None if seg is None else open_own("data.ninja", seg, os.path.join(path, name))
    finally:
        os.close(root)
        if seg is not None:
            os.close(seg)


def _refuse_if_foreign(name, dir_fd, root):
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return
    if not is_mine(st):
        raise ForeignFile(os.path.join(root, name), st.st_uid)


def read_json(name, dir_fd, root, limit, on_foreign):
    """(value, identity, state) of the JSON file ``name``: state "ok" (this user's, parsed),
    "absent", "foreign" (another user's: value parsed only to tell whose format it is, never to
    be trusted), "directory", "damaged" (a link, FIFO or device, over ``limit`` bytes, not JSON) or "unreadable"
    (it may be fine: too deeply nested for this call depth, or no permission); value None unless
    parsed, and for "unreadable" True if its first bytes are those the store writes.
    ``on_foreign(ForeignFile)`` is called for a file of another user's; ProcessLimit (the process is
    out of descriptors or memory) goes to the caller."""
    try:
        fd = open_own(name, dir_fd, root)
        missing = None if fd is not None else _missing_state(name, dir_fd)
        if missing == "unreadable":             # a regular file now: it may have been created since the open
            fd = open_own(name, dir_fd, root)
    except ForeignFile as e:
        on_foreign(e)
        fd, state = _open_any(name, dir_fd), "foreign"
    else:
        state = "ok"
        if fd is None:
            return None, None, missing
    if fd is None:
        return None, None, state
    try:
        st = os.fstat(fd)
        if st.st_size > limit:
            return None, None, "damaged" if state == "ok" else state
        data = os.read(fd, st.st_size + 1)     # (not limit + 1: os.read reserves what it is asked for)
        ident = (st.st_ino, st.st_mtime_ns, st.st_size)
        try:
            return json.loads(data), ident, state
        except (RecursionError, MemoryError):
            if state != "ok":
                return None, ident, state
            return data.startswith((b'{"format":', b'{"hits":')), ident, "unreadable"
        except ValueError:
            return None, ident, "damaged" if state == "ok" else state
    except OSError:
        return None, None, "unreadable" if state == "ok" else state
    finally:
        os.close(fd)


def _open_any(name, dir_fd):
    try:
        return os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except (OSError, ValueError):
        return None


def _missing_state(name, dir_fd):
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return "absent"
    except OSError:
        return "unreadable"
    if stat.S_ISDIR(st.st_mode):
        return "directory"              # never the store's: it writes files under these names
    return "unreadable" if stat.S_ISREG(st.st_mode) else "damaged"   # (else a link, FIFO or device)


def is_store_index(value):
    """Whether ``value`` (parsed JSON) is an index the store wrote (any format version)."""
    return isinstance(value, dict) and "format" in value and isinstance(value.get("entries"), dict)


def is_store_stats(value):
    """Whether ``value`` (parsed JSON) is a stats file the store wrote."""
    return isinstance(value, dict) and bool(value) and set(value) <= set(STATS)


def may_replace(value, state, is_ours, dir_fd):
    """Whether the store may replace or delete a file read as (``value``, ``state``) by
    :func:`read_json`; ``is_ours`` tells the store's content from a user's. A damaged file is
    the store's only where the directory holds a segment of the store's."""
    if state in ("absent", "directory"):
        return state == "absent"
    if state == "unreadable":
        return value is True
    if value is not None and is_ours(value):
        return True
    if value is not None and state in ("ok", "foreign"):
        return False                    # JSON, but someone else's
    return any(is_segment(n) for n in os.listdir(dir_fd))


class LockTimeout(_Said):
    """Another process held the cache lock for the whole timeout."""


class FileLock:
    """An exclusive flock(2) on the file ``lock`` in the directory ``dir_fd`` (``root``), polled for
    at most ``timeout`` seconds (0: one try; a stopped holder must not hang every other process);
    explicitly unlocked, since a forked child may share the file. A ``lock`` of another user's
    is ForeignFile: using it would let that user stall every writer."""

    def __init__(self, dir_fd, root, timeout):
        self.dir_fd, self.root, self.timeout = dir_fd, root, timeout

    def __enter__(self):
        try:
            self.fd = os.open("lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.dir_fd)
        except PermissionError:
            _refuse_if_foreign("lock", self.dir_fd, self.root)
            raise
        st = os.fstat(self.fd)
        if not is_mine(st):
            os.close(self.fd)
            raise ForeignFile(os.path.join(self.root, "lock"), st.st_uid)
        deadline, pause = time.monotonic() + self.timeout, 0.001
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as e:
                busy = e.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
                if not busy or time.monotonic() >= deadline:
                    os.close(self.fd)
                    if busy:
                        raise LockTimeout(e.errno, self.held_message()) from None
                    raise
            time.sleep(pause)
            pause = min(2 * pause, 0.05)

    def held_message(self):
        path = os.path.join(self.root, "lock")
        return (f"{path} is held by another process (one writing the cache, or one stopped: in a debugger, "
                f"suspended with Ctrl-Z, hung on a network file system); `fuser -v {path}` names it: let it "
                "finish, or end it")

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
