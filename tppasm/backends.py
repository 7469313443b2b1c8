"""One registry of code generators, keyed by (ISA family, TPP kind).

A backend is a package of generator modules (``tppasm.x86``, ``tppasm.sve``); each generator
registers itself with ``@register(family, kind, ...)`` as ``fn(desc, isa) -> raw kernel``. The
kernel layer asks :func:`generate` and knows no backend by name: the first lookup of a family
imports every module of its package, so a new backend or TPP is one decorated function. The same
registry gives the version of the code a kernel was made by (:func:`source_version`), which
names a kernel in memory, on disk and in the tuner's results.

>>> generator("avx512", "brgemm") is generator("amx", "brgemm")      # one x86 family
True
>>> ("sve", "reduce") in registered()
True
"""
import hashlib
import importlib
import os
import pathlib
import pkgutil
import sys
import threading
import warnings

from . import forking

FAMILIES = {"avx2": "x86", "avx512": "x86", "amx": "x86", "sve": "sve"}
PACKAGES = {"x86": "tppasm.x86", "sve": "tppasm.sve"}
# sources whose change can change generated code besides the family's own package: the
# descriptors (tppasm/*.py) and the machine-code layer (isa/)
_SHARED_SOURCES = ("tppasm/*.py", "isa/**/*.py")

# environment variables that change an ISA's generated code, read when a kernel is generated
# (their values are part of the key of every kernel of the kinds they change: :func:`code_options`)
CODE_OPTIONS = {"amx": ("TPPASM_AMX_CHUNKS", "TPPASM_FAR_PREFETCH"), "avx512": ("TPPASM_FAR_PREFETCH",),
                "avx2": ("TPPASM_FAR_PREFETCH",)}
# the descriptor kinds whose code each option changes: an element-wise kernel's key does not wait
# for the AMX chunk verdict (timed once per process and cache), nor differ when two processes disagree
OPTION_KINDS = {"TPPASM_AMX_CHUNKS": ("brgemm",), "TPPASM_FAR_PREFETCH": ("brgemm",)}
# the module that registers each option's setting (:func:`register_option`): importing it alone,
# not the whole family, keeps a process whose kernels all come from the disk cache from importing
# every generator (~13 ms)
OPTION_MODULES = {"TPPASM_AMX_CHUNKS": "tppasm.x86.amx", "TPPASM_FAR_PREFETCH": "tppasm.x86.far_prefetch"}
_OPTION_VALUES = {}      # (isa, name) -> the setting in effect, where the family decides it (register_option)

_GENERATORS = {}
_LOADED = set()
_LOCK = threading.RLock()


_FORK_WAIT_S = 10.0
forking.guard(sys.modules[__name__], "_LOCK", threading.RLock)     # see tppasm.forking


def register(family, *kinds):
    """Decorator: make ``fn(desc, isa)`` the ``family`` generator of each of ``kinds``.

    >>> @register("x86", "doc_example_kind")
    ... def gen(desc, isa): return None
    >>> generator("avx2", "doc_example_kind") is gen
    True
    """
    if family not in PACKAGES:
        raise ValueError(f"unknown backend family {family!r}; known: {', '.join(PACKAGES)}")

    def wrap(fn):
        for kind in kinds:
            _GENERATORS[(family, kind)] = fn
        return fn
    return wrap


def family(isa):
    """The backend family of an ISA level (``"avx512"`` -> ``"x86"``), read as :func:`level` reads it
    (None: the host's); ValueError names the levels.

    >>> family("amx"), family(" AVX2")
    ('x86', 'x86')
    """
    try:
        return FAMILIES[isa]
    except (KeyError, TypeError):
        return FAMILIES[level(isa)]


def level(isa):
    """The ISA level ``isa`` names, spelled as ``TPPASM_ISA`` accepts it (any case, spaces around);
    None is the host's level. ValueError names the levels.

    >>> level(" AVX2 "), level(None) == __import__("isa.cpu").cpu.host().isa
    ('avx2', True)
    """
    if isa is None:
        from isa.cpu import host
        return host().isa
    name = isa.strip().lower() if isinstance(isa, str) else None
    if name not in FAMILIES:
        from isa.cpu import host
        raise ValueError(f"isa={isa!r}: expected one of {', '.join(map(repr, FAMILIES))} (this host runs "
                         f"{', '.join(host().levels) or 'none'} natively), or None for the host's level "
                         f"({host().isa})")
    return name


def _load(fam):
    """Import every module of ``fam``'s package once (each registers its generators)."""
    if fam in _LOADED:
        return
    with _LOCK:
        if fam in _LOADED:
            return
        package = importlib.import_module(PACKAGES[fam])
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{info.name}")
        _LOADED.add(fam)


def generator(isa, kind):
    """The registered generator of ``kind`` for ``isa``'s family (NotImplementedError if none)."""
    fam = family(isa)
    fn = _GENERATORS.get((fam, kind))
    if fn is None:
        _load(fam)
        fn = _GENERATORS.get((fam, kind))
    if fn is None:
        have = sorted(k for f, k in registered() if f == fam)
        raise NotImplementedError(f"no {fam} generator for {kind!r} (it has: {', '.join(have)})")
    return fn


def generate(desc, isa):
    """The raw kernel of ``desc`` on ``isa`` from the registered generator."""
    desc.validate()
    return generator(isa, desc.kind)(desc, isa)


def registered():
    """Every (family, kind) pair, all backends loaded."""
    for fam in PACKAGES:
        _load(fam)
    return sorted(_GENERATORS)


_VERSIONS = {}


def register_option(isa, name, value):
    """Make ``value()`` (text) the setting of option ``name`` of :data:`CODE_OPTIONS` that
    ``isa``'s code is generated with, where it is more than the environment variable's text
    (``TPPASM_AMX_CHUNKS`` unset: what the host decided; ``TPPASM_FAR_PREFETCH`` unset: its vendor's default).

    >>> register_option("doc_isa", "DOC_OPTION", lambda: "1"); _OPTION_VALUES.pop(("doc_isa", "DOC_OPTION"))()
    '1'
    """
    _OPTION_VALUES[(isa, name)] = value


def code_options(isa, kind=None):
    """The settings of :data:`CODE_OPTIONS` in effect for ``isa``, as text for a cache key: those
    that change kernels of descriptor ``kind`` (:data:`OPTION_KINDS`), or with None all of them (a
    nest's key: its kernels are of any kind).

    >>> code_options("sve"), code_options("avx2") in ("TPPASM_FAR_PREFETCH=1", "TPPASM_FAR_PREFETCH=0")
    ('', True)
    >>> code_options("amx", "unary")
    ''
    """
    names = [n for n in CODE_OPTIONS.get(isa, ()) if kind is None or kind in OPTION_KINDS.get(n, (kind,))]
    for name in names:
        if (isa, name) not in _OPTION_VALUES:
            importlib.import_module(OPTION_MODULES[name])      # it registers what decides the setting
    return ";".join(f"{name}={_OPTION_VALUES.get((isa, name), lambda n=name: os.environ.get(n, ''))()}"
                    for name in names)


def _sources(root, pattern):
    """(relative path, (size, mtime ns)) of the modules ``pattern`` ("dir/*.py" or "dir/**/*.py")
    names under ``root``: ``.py`` files, and ``.pyc`` files beside them (an install without sources,
    ``compileall -b``); os.scandir (pathlib's glob cost a warm process 1 ms). OSError where a folder
    cannot be listed (a frozen app's package folders do not exist)."""
    stack, recursive = [pattern.split("/*")[0]], "/**/" in pattern
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(root, rel)) as entries:
            for e in entries:
                if e.is_dir() and recursive and e.name != "__pycache__":
                    stack.append(f"{rel}/{e.name}")
                elif e.name.endswith((".py", ".pyc")) and e.is_file():
                    st = e.stat()
                    yield f"{rel}/{e.name}", (st.st_size, st.st_mtime_ns)


def _archive(root):
    """The zip file ``root`` lies inside (a wheel or zipapp on sys.path), or None for a directory.

    >>> _archive(pathlib.Path(__file__).resolve().parent) is None
    True
    """
    path = root
    while not path.exists():
        if path.parent == path:
            return None
        path = path.parent
    return path if path.is_file() else None


def source_version(isa):
    """SHA-256 (hex, 16 digits) of the path, size and modification time (ns) of every source that
    can change ``isa``'s generated code: the family's package, the descriptors and the ``isa``
    layer. Computed once per process; from the files' metadata, as Python's own bytecode cache
    decides staleness (reading and hashing their contents cost a warm process 3 ms).

    >>> len(source_version("avx2")) == 16 and source_version("avx2") == source_version("amx")
    True
    """
    return tree_version((PACKAGES[family(isa)].replace(".", "/") + "/**/*.py", *_SHARED_SOURCES))


def tree_version(patterns):
    """SHA-256 (hex, 16 digits) of the path, size and modification time (ns) of every module file
    (``.py``, or ``.pyc`` without sources) that ``patterns`` ("dir/*.py" or "dir/**/*.py", relative
    to the repository root) name; of the archive or frozen executable the code is imported from
    instead; once per process for each tuple of patterns. Where none of these can be found (a
    pattern with no file), a number drawn for this process, which no other process's key matches:
    the disk cache then writes nothing more, with one warning (:func:`_unversioned`).

    >>> tree_version(("loops/**/*.py",)) == tree_version(("loops/**/*.py",)) != tree_version(("isa/*.py",))
    True
    """
    patterns = tuple(patterns)
    version = _VERSIONS.get(patterns)
    if version is None:
        version = _VERSIONS[patterns] = _version(patterns)
    if version in _UNVERSIONED:
        _unversioned(_UNVERSIONED[version])          # (again: a store made since, e.g. after cache.reset())
    return version


def _version(patterns):
    root = pathlib.Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    archive = _archive(root)
    if archive is None:
        files, why = _module_files(root, patterns)
        if files:
            for name, st in files:
                h.update(f"{name}\0{st[0]}\0{st[1]}\0".encode())
            return h.hexdigest()[:16]
        if not getattr(sys, "frozen", False):
            version = os.urandom(8).hex()
            _UNVERSIONED[version] = why
            return version
        archive = pathlib.Path(sys.executable)      # a frozen app (PyInstaller): the modules are inside it
    st = archive.stat()                  # imported from a zip, or frozen: the archive's own metadata
    h.update(f"{archive}\0{'|'.join(patterns)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:16]


def _module_files(root, patterns):
    """(the sorted files of :func:`_sources` for ``patterns``, None), or ([], why not) where a
    pattern names no file or a folder cannot be listed."""
    files = set()
    for pattern in patterns:
        try:
            found = set(_sources(root, pattern))
        except OSError as e:
            return [], f"{e.filename} cannot be listed ({e.strerror})"
        if not found:
            return [], f"no .py or .pyc file of {pattern} under {root}"
        files |= found
    return sorted(files), None


_UNVERSIONED = {}        # version -> why the code's files could not be found
_WARNED = []


def _unversioned(why):
    """Make the disk cache write nothing more in this process: this copy of the code cannot be told
    from another version's, so a kernel stored now could be loaded by a process running other code
    (its reads miss: the key is this process's own). One warning, when the cache is on."""
    from .cache import disk
    if disk.stop_writing(RuntimeError(f"the code's version cannot be known: {why}")) and not _WARNED:
        _WARNED.append(why)
        warnings.warn(f"tppasm: not using the kernel cache: {why}, so this copy of tppasm's code cannot be told from "
                      "another version's (kernels are generated as usual; install tppasm with its .py or .pyc files, "
                      "or set TPPASM_CACHE=0 to turn the cache off)", RuntimeWarning, stacklevel=4)
