"""The host CPU: architecture, features read from the hardware, and the ISA level tppasm targets.

On x86-64 the features come from CPUID and XGETBV, executed by our own JIT'd code, and count only
when the OS saves the state they need (XCR0). AMX additionally needs the per-process permission
``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``, requested once here. On AArch64 they come
from ``getauxval(AT_HWCAP/AT_HWCAP2)`` and ``prctl(PR_SVE_GET_VL)``.

``TPPASM_ISA=avx2|avx512|amx|sve`` forces a level no higher than the host's.

>>> h = host()
>>> h.isa in ("avx2", "avx512", "amx", "sve")
True
"""
import ctypes
import functools
import os
import platform
from dataclasses import dataclass, field

X86_LEVELS = ("avx2", "avx512", "amx")          # lowest first
ARM_LEVELS = ("sve",)

# (leaf, subleaf, register, bit) -> feature name
_CPUID_BITS = {
    "sse4_2": (1, 0, "ecx", 20), "fma": (1, 0, "ecx", 12), "osxsave": (1, 0, "ecx", 27),
    "avx": (1, 0, "ecx", 28), "f16c": (1, 0, "ecx", 29),
    "avx2": (7, 0, "ebx", 5), "bmi2": (7, 0, "ebx", 8), "avx512f": (7, 0, "ebx", 16),
    "avx512dq": (7, 0, "ebx", 17), "avx512cd": (7, 0, "ebx", 28), "avx512bw": (7, 0, "ebx", 30),
    "avx512vl": (7, 0, "ebx", 31), "avx512_vbmi": (7, 0, "ecx", 1), "avx512_vnni": (7, 0, "ecx", 11),
    "avx512_fp16": (7, 0, "edx", 23), "amx_bf16": (7, 0, "edx", 22), "amx_tile": (7, 0, "edx", 24),
    "amx_int8": (7, 0, "edx", 25), "avx_vnni": (7, 1, "eax", 4), "avx512_bf16": (7, 1, "eax", 5),
}
_XCR0_AVX = 0b110                 # SSE + AVX state
_XCR0_AVX512 = 0b11100110         # + opmask, ZMM_Hi256, Hi16_ZMM
_XCR0_AMX = 0b11 << 17            # XTILECFG + XTILEDATA
_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_arch_prctl = 0x1023, 18, 158

# AArch64 hwcaps (linux/arch/arm64/include/uapi/asm/hwcap.h)
_HWCAP = {"asimd": 1 << 1, "sve": 1 << 22}
_HWCAP2 = {"sve2": 1 << 1, "svei8mm": 1 << 9, "svebf16": 1 << 12, "i8mm": 1 << 13, "bf16": 1 << 14}
_AT_HWCAP, _AT_HWCAP2, _PR_SVE_GET_VL = 16, 26, 51


@dataclass
class Host:
    """What the machine offers: ``features`` usable now, ``isa`` the level chosen, ``notes`` why not.

    >>> from isa.cpu import Host
    >>> h = Host("x86_64", "AuthenticAMD", {"avx2": True}, isa="avx2", best_isa="avx2", levels=["avx2"])
    >>> h.has("avx2"), h.has("amx_tile"), h.as_dict()["levels"]
    (True, False, ['avx2'])
    """

    arch: str
    vendor: str
    features: dict = field(default_factory=dict)
    isa: str = ""
    best_isa: str = ""
    levels: list = field(default_factory=list)
    sve_vector_bits: int = 0
    notes: dict = field(default_factory=dict)

    def has(self, name):
        return bool(self.features.get(name))

    def as_dict(self):
        return {"arch": self.arch, "vendor": self.vendor, "isa": self.isa, "best_isa": self.best_isa,
                "levels": list(self.levels), "features": self.features, "sve_vector_bits": self.sve_vector_bits,
                "notes": self.notes, "verification": verification(self)}


def verification(h):
    """How each ISA level's code is exercised on host ``h``: ``native`` (runs on this CPU; the test
    suite runs its TPP, loop and demo tests at each), ``interpreter`` (x86 code the host lacks runs in
    ``isa.x86.interp``), ``emulator`` (SVE code under qemu-aarch64 / unicorn), and what the emulators
    need (``runners``: a reason per missing one, None when present).

    >>> v = verification(host()); sorted(v["native"] + v["interpreter"] + v["emulator"])
    ['amx', 'avx2', 'avx512', 'sve']
    """
    from .aarch64.emulate import qemu_path, qemu_skip_reason, unicorn_skip_reason
    interp = [lv for lv in X86_LEVELS if lv not in h.levels]
    emulated = [lv for lv in ARM_LEVELS if lv not in h.levels]
    missing = qemu_skip_reason()
    qemu = qemu_path() if missing is None else None
    if missing is not None:
        missing = missing.removeprefix("qemu-aarch64 ")
    runners = {"qemu-aarch64": missing, "unicorn": unicorn_skip_reason()}
    return {"native": list(h.levels), "interpreter": interp, "emulator": emulated, "qemu": qemu,
            "runners": runners}


def _cpuid_function():
    from .x86 import Function, eax, ebx, ecx, edx, gpr, r8
    fn = Function("cpuid", ["u32", "u32", "ptr"])
    leaf, sub, out = fn.args
    a = fn.asm
    a.mov(r8, out)
    a.mov(eax, gpr(leaf.num, 32))
    a.mov(ecx, gpr(sub.num, 32))
    a.cpuid()
    for i, r in enumerate((eax, ebx, ecx, edx)):
        a.mov([r8 + 4 * i], r)
    return fn.finalize()


def _xgetbv_function():
    from .x86 import Function, ecx, rax, rdx
    fn = Function("xgetbv0", [], returns="u64")
    a = fn.asm
    a.xor(ecx, ecx)
    a.xgetbv()
    a.shl(rdx, 32)
    a.or_(rax, rdx)
    return fn.finalize()


def _x86_host():
    cpuid = _cpuid_function()
    out = (ctypes.c_uint32 * 4)()

    def regs(leaf, sub=0):
        cpuid(leaf, sub, ctypes.addressof(out))
        return dict(zip(("eax", "ebx", "ecx", "edx"), out))

    leaf0 = regs(0)
    vendor = b"".join(leaf0[r].to_bytes(4, "little") for r in ("ebx", "edx", "ecx")).decode()
    cache = {}
    raw = {}
    for name, (leaf, sub, reg, bit) in _CPUID_BITS.items():
        if leaf > leaf0["eax"]:
            raw[name] = False
            continue
        if (leaf, sub) not in cache:
            cache[leaf, sub] = regs(leaf, sub)
        raw[name] = bool(cache[leaf, sub][reg] >> bit & 1)
    xcr0 = _xgetbv_function()() if raw["osxsave"] else 0
    notes = {}
    os_avx = xcr0 & _XCR0_AVX == _XCR0_AVX
    os_avx512 = xcr0 & _XCR0_AVX512 == _XCR0_AVX512
    features = {}
    for name, ok in raw.items():
        if name.startswith("avx512"):
            ok = ok and os_avx512
        elif name in ("avx", "avx2", "fma", "f16c", "avx_vnni"):
            ok = ok and os_avx
        features[name] = ok
    if raw["avx512f"] and not os_avx512:
        notes["avx512"] = f"the CPU has AVX-512 but the OS does not save its state (XCR0={xcr0:#x})"
    amx = raw["amx_tile"]
    if amx:
        if xcr0 & _XCR0_AMX != _XCR0_AMX:
            amx, notes["amx"] = False, f"the OS does not enable AMX tile state (XCR0={xcr0:#x})"
        else:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.syscall(_SYS_arch_prctl, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) != 0:
                err = ctypes.get_errno()
                amx, notes["amx"] = False, f"arch_prctl(ARCH_REQ_XCOMP_PERM) was refused: {os.strerror(err)}"
    for name in ("amx_tile", "amx_bf16", "amx_int8"):
        features[name] = features[name] and amx
    host = Host("x86_64", vendor, features, notes=notes)
    levels = []
    if features["avx2"] and features["fma"]:
        levels.append("avx2")
        if all(features[f] for f in ("avx512f", "avx512bw", "avx512vl")):
            levels.append("avx512")
            if features["amx_tile"] and features["amx_bf16"]:
                levels.append("amx")
    host.best_isa = levels[-1] if levels else "none"
    host.levels = levels
    return host


def _aarch64_host():
    libc = ctypes.CDLL(None)
    libc.getauxval.restype = ctypes.c_ulong
    hw, hw2 = libc.getauxval(_AT_HWCAP), libc.getauxval(_AT_HWCAP2)
    features = {n: bool(hw & b) for n, b in _HWCAP.items()}
    features.update({n: bool(hw2 & b) for n, b in _HWCAP2.items()})
    host = Host("aarch64", "arm", features)
    if features["sve"]:
        host.sve_vector_bits = (libc.prctl(_PR_SVE_GET_VL, 0, 0, 0, 0) & 0xFFFF) * 8
    host.levels = ["sve"] if features["sve"] else []
    host.best_isa = "sve" if features["sve"] else "none"
    return host


@functools.lru_cache(maxsize=None)
def host() -> Host:
    """The host, probed once per process; ``isa`` honours ``TPPASM_ISA``.

    >>> from isa.cpu import host
    >>> h = host()
    >>> h is host(), h.arch in ("x86_64", "amd64", "aarch64", "arm64"), h.isa in h.levels
    (True, True, True)
    >>> h.isa in ("avx2", "avx512", "amx", "sve")
    True
    """
    arch = platform.machine().lower()
    if arch in ("x86_64", "amd64"):
        h = _x86_host()
        known = X86_LEVELS
    elif arch in ("aarch64", "arm64"):
        h = _aarch64_host()
        known = ARM_LEVELS
    else:
        raise RuntimeError(f"tppasm generates code for x86-64 and AArch64, not {arch}")
    h.isa = select_isa(h, os.environ.get("TPPASM_ISA", ""), known)
    return h


def identity():
    """The CPU's vendor, model name, family, model, stepping and microcode revision (from
    /proc/cpuinfo), else its vendor: what a decision measured on one CPU is remembered under.

    >>> bool(identity())
    True
    """
    fields = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break                                  # the first processor is enough
                name, _, value = line.partition(":")
                fields[name.strip()] = value.strip()
    except OSError:
        pass
    return " ".join(fields.get(k, "") for k in ("vendor_id", "model name", "cpu family", "model", "stepping",
                                                "microcode")).strip() or host().vendor


def select_isa(h, forced, known):
    """The ISA level to use for host ``h``: its best, or ``forced`` (one of ``known``) when it has it.

    >>> from isa.cpu import Host, select_isa
    >>> h = Host("x86_64", "GenuineIntel", best_isa="avx512", levels=["avx2", "avx512"])
    >>> select_isa(h, "", ["avx2", "avx512", "amx"]), select_isa(h, " AVX2 ", ["avx2", "avx512", "amx"])
    ('avx512', 'avx2')
    >>> select_isa(h, "amx", ["avx2", "avx512", "amx"])
    Traceback (most recent call last):
    ...
    ValueError: TPPASM_ISA='amx' asks for more than this host has: its levels are avx2, avx512
    """
    forced = forced.strip().lower()
    if not forced:                          # unset or blank, like every other variable
        return h.best_isa
    if forced not in known:
        raise ValueError(f"TPPASM_ISA={forced!r} is not a level for {h.arch}; use one of {', '.join(known)}")
    if forced not in h.levels:
        raise ValueError(f"TPPASM_ISA={forced!r} asks for more than this host has: its levels are "
                         f"{', '.join(h.levels) or 'none'}" + "".join(f"; {v}" for v in h.notes.values()))
    return forced


@dataclass(frozen=True)
class Cache:
    """One data (or unified) cache level as the OS reports it: ``size`` and ``line`` in bytes,
    ``shared`` = how many logical CPUs share one instance (1: private to a core's thread).

    >>> from isa.cpu import Cache
    >>> l2 = Cache(level=2, size=1 << 20)
    >>> l2.size // l2.line, l2.shared
    (16384, 1)
    """

    level: int
    size: int
    line: int = 64
    shared: int = 1


# Used when the OS does not say (no sysfs, a container hiding it): a typical server core.
DEFAULT_CACHES = (Cache(1, 32 << 10), Cache(2, 1 << 20), Cache(3, 32 << 20, shared=8))
_SYS_CACHE = "/sys/devices/system/cpu/cpu0/cache"


def caches(root=_SYS_CACHE):
    """The data cache levels of CPU 0, innermost first, read from ``root`` (Linux sysfs); instruction
    caches are left out. Falls back to :data:`DEFAULT_CACHES` for any level the OS does not report.

    >>> levels = caches()
    >>> [c.level for c in levels], all(c.size > 0 and c.line > 0 for c in levels)
    ([1, 2, 3], True)
    """
    return _read_caches(root)


@functools.lru_cache(maxsize=8)
def _read_caches(root):
    found = {}
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        entries = []
    for entry in entries:
        if not entry.startswith("index"):
            continue
        try:
            info = {}
            for name in ("level", "type", "size", "coherency_line_size", "shared_cpu_list"):
                with open(os.path.join(root, entry, name)) as f:
                    info[name] = f.read().strip()
            if info["type"] == "Instruction":
                continue
            level = int(info["level"])
            found[level] = Cache(level, _size(info["size"]), int(info["coherency_line_size"] or 64),
                                 _cpu_count(info["shared_cpu_list"]))
        except (OSError, ValueError):
            continue
    return tuple(found.get(c.level, c) for c in DEFAULT_CACHES) + tuple(
        found[level] for level in sorted(found) if level > len(DEFAULT_CACHES))


def _size(text):
    """'32K' -> 32768; '1024K', '32M', '4096' (bytes) too.

    >>> _size("32K"), _size("32M"), _size("512")
    (32768, 33554432, 512)
    """
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def _cpu_count(text):
    """'0-1,4' -> 3 CPUs.

    >>> _cpu_count("0-1,4"), _cpu_count("7")
    (3, 1)
    """
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n
