"""Whole-directory chores of the disk store (:mod:`.disk`): which names in its directory are its
own (:func:`own_names`: ``cache info`` counts their bytes, ``cache clear`` deletes them and nothing
else), what keeps the cache from working there (:func:`directory_problems`), and what ``clear``
could not delete, with the fix (:func:`undeleted_message`).

>>> import tempfile
>>> d = tempfile.mkdtemp(); open(os.path.join(d, "index.json"), "w").write('{"site": "mine"}')
16
>>> fd = os.open(d, os.O_RDONLY); own_names(fd, d), len(directory_problems(fd, d, [], "ok", {"site": "mine"}))
([], 1)
>>> os.close(fd)
"""
import os
import shlex
import shutil
import stat

from .files import OWN_FILES, is_leftover, is_segment, tree_bytes
from .trust import (ForeignFile, NotTheStores, is_mine, is_store_index, is_store_stats, may_replace, owner_text,
                    read_json)

MAX_JSON_BYTES = 64 << 20           # the largest index.json / stats.json read to tell whose it is


def own_names(root, path):
    """The names in the directory ``root`` (a descriptor; ``path`` for messages) that are the
    store's: segments and leftovers by the forms of their names, ``index.json`` and ``stats.json``
    by their content (:mod:`.trust`). Not ``lock``, which clear keeps."""
    own = []
    for name in os.listdir(root):
        if is_segment(name) or is_leftover(name):
            own.append(name)
        elif name in OWN_FILES:
            is_ours = is_store_index if name == "index.json" else is_store_stats
            value, _, state = read_json(name, root, path, MAX_JSON_BYTES, lambda e: None)
            if state != "absent" and may_replace(value, state, is_ours, root):
                own.append(name)
    return own


def directory_problems(root, path, names, state, value):
    """What keeps the cache in ``root`` (a descriptor; ``path``) from working, each with its fix:
    an index.json that cannot be read or is not the store's (read as ``state``, ``value``), and
    files among ``names`` (and ``lock``) of other users'."""
    problems = []
    if state == "unreadable":
        problems.append(f"{path}/index.json cannot be read (nested too deeply, or no permission)")
    elif not may_replace(value, state, is_store_index, root):
        problems.append(str(NotTheStores(path, "index.json")))
    foreign = {}
    for name in list(names) + ["lock"]:
        try:
            st = os.stat(name, dir_fd=root, follow_symlinks=False)
        except OSError:
            continue
        if not is_mine(st):
            foreign.setdefault(st.st_uid, []).append(name)
    for uid, found in foreign.items():
        listed = ", ".join(sorted(found)[:3]) + (", ..." if len(found) > 3 else "")
        text = str(ForeignFile(f"{len(found)} of its files ({listed})", uid))
        problems.append(text.replace(" belongs to ", " belong to ", 1))
    return problems


def drop_foreign_lock(root):
    """Delete ``lock`` in the directory ``root`` if it is another user's (an empty file holds
    nothing, and the directory is this user's), so that clear can take its own."""
    try:
        st = os.stat("lock", dir_fd=root, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode) and st.st_size == 0 and not is_mine(st):
            os.remove("lock", dir_fd=root)
    except OSError:
        pass


def delete_own(root, path):
    """Delete the store's files in ``root`` (a descriptor; ``path``): (bytes freed, [(path, OSError)]
    of what stayed)."""
    freed, failed = 0, []
    for name in own_names(root, path):
        where = os.path.join(path, name)
        size = tree_bytes(where)
        try:
            if stat.S_ISDIR(os.lstat(where).st_mode):
                shutil.rmtree(where)
            else:
                os.remove(where)
        except FileNotFoundError:
            pass
        except OSError as e:
            failed.append((where, e))
        freed += size - tree_bytes(where)
    return freed, failed


def undeleted_message(path, failed):
    """What clear could not delete in ``path`` (``failed``: [(path, OSError)]), and the fix:
    ``sudo rm -rf`` for files of another user's (root's, after a sudo run)."""
    foreign = {}
    for where, _ in failed:
        try:
            st = os.lstat(where)
        except OSError:
            continue
        if not is_mine(st):
            foreign.setdefault(st.st_uid, []).append(shlex.quote(where))
    text = f"could not delete {len(failed)} of the cache's files in {path} ({failed[0][1]})"
    if not foreign:
        return text + "; fix the directory's permissions, or delete it by hand"
    uid, paths = next(iter(foreign.items()))
    return (f"{text}; {len(paths)} of them belong to {owner_text(uid)}: delete them as that user, e.g. "
            f"`sudo rm -rf {' '.join(paths[:4])}{' ...' if len(paths) > 4 else ''}`")
