"""AArch64 register objects: general (x/w, sp, zr), SVE vectors (z) and predicates (p), SIMD&FP (v/d).

Element-size views are attributes: ``z3.s`` is z3 viewed as 32-bit lanes, ``z3.s[1]`` an indexed lane
(for indexed multiply forms), ``p0.m`` / ``p0.z`` a governing predicate with merging / zeroing, ``p1.s``
a predicate viewed as 32-bit lanes.

>>> from isa.aarch64.registers import x0, w0, sp, z3, p0
>>> str(x0), str(w0), str(sp), str(z3.s), str(z3.s[1]), str(p0.m), str(p0.s)
('x0', 'w0', 'sp', 'z3.s', 'z3.s[1]', 'p0/m', 'p0.s')
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GPR", "ZReg", "ZLane", "PReg", "VReg", "x", "w", "z", "p", "v", "d",
           "sp", "xzr", "wzr", "wsp", "fp", "lr", "ELEMENT_BITS"]

ELEMENT_BITS = {"b": 8, "h": 16, "s": 32, "d": 64, "q": 128}


@dataclass(frozen=True)
class GPR:
    """General purpose register: ``num`` 0-30, or 31 meaning sp (``is_sp``) or the zero register."""
    num: int
    bits: int = 64
    is_sp: bool = False

    @property
    def is_zr(self) -> bool:
        return self.num == 31 and not self.is_sp

    @property
    def x(self) -> "GPR":
        return GPR(self.num, 64, self.is_sp)

    @property
    def w(self) -> "GPR":
        return GPR(self.num, 32, self.is_sp)

    def __str__(self) -> str:
        if self.is_sp:
            return "sp" if self.bits == 64 else "wsp"
        if self.num == 31:
            return "xzr" if self.bits == 64 else "wzr"
        return f"{'x' if self.bits == 64 else 'w'}{self.num}"

    __repr__ = __str__


@dataclass(frozen=True)
class ZLane:
    """An indexed SVE vector lane operand, ``z2.s[1]`` (used by indexed fmla/dot forms)."""
    reg: "ZReg"
    index: int

    def __str__(self) -> str:
        return f"{self.reg}[{self.index}]"

    __repr__ = __str__


@dataclass(frozen=True)
class ZReg:
    """SVE vector register; ``size`` is None (no suffix) or one of b/h/s/d/q."""
    num: int
    size: str | None = None

    b = property(lambda self: ZReg(self.num, "b"))
    h = property(lambda self: ZReg(self.num, "h"))
    s = property(lambda self: ZReg(self.num, "s"))
    d = property(lambda self: ZReg(self.num, "d"))
    q = property(lambda self: ZReg(self.num, "q"))

    def __getitem__(self, index: int) -> ZLane:
        if self.size is None:
            raise TypeError(f"index a sized view, e.g. z{self.num}.s[{index}]")
        return ZLane(self, int(index))

    def __str__(self) -> str:
        return f"z{self.num}" + (f".{self.size}" if self.size else "")

    __repr__ = __str__


@dataclass(frozen=True)
class PReg:
    """SVE predicate register; ``qual`` is 'm' or 'z' for a governing predicate, ``size`` a lane view."""
    num: int
    size: str | None = None
    qual: str | None = None

    m = property(lambda self: PReg(self.num, None, "m"))
    z = property(lambda self: PReg(self.num, None, "z"))
    b = property(lambda self: PReg(self.num, "b"))
    h = property(lambda self: PReg(self.num, "h"))
    s = property(lambda self: PReg(self.num, "s"))
    d = property(lambda self: PReg(self.num, "d"))

    @property
    def plain(self) -> "PReg":
        return PReg(self.num)

    def __str__(self) -> str:
        if self.qual:
            return f"p{self.num}/{self.qual}"
        return f"p{self.num}" + (f".{self.size}" if self.size else "")

    __repr__ = __str__


@dataclass(frozen=True)
class VReg:
    """SIMD&FP register; ``width`` is None for v<n> or 'd'/'s'/'h'/'q' for a scalar view (d8 ...)."""
    num: int
    width: str | None = None

    d = property(lambda self: VReg(self.num, "d"))
    s = property(lambda self: VReg(self.num, "s"))
    h = property(lambda self: VReg(self.num, "h"))
    q = property(lambda self: VReg(self.num, "q"))

    @property
    def zreg(self) -> ZReg:
        return ZReg(self.num)

    def __str__(self) -> str:
        return f"{self.width or 'v'}{self.num}"

    __repr__ = __str__


x = [GPR(i) for i in range(31)]
w = [GPR(i, 32) for i in range(31)]
z = [ZReg(i) for i in range(32)]
p = [PReg(i) for i in range(16)]
v = [VReg(i) for i in range(32)]
d = [VReg(i, "d") for i in range(32)]
sp, wsp = GPR(31, 64, True), GPR(31, 32, True)
xzr, wzr = GPR(31, 64), GPR(31, 32)
fp, lr = x[29], x[30]

for _i in range(32):
    if _i < 31:
        globals()[f"x{_i}"], globals()[f"w{_i}"] = x[_i], w[_i]
        __all__ += [f"x{_i}", f"w{_i}"]
    globals()[f"z{_i}"], globals()[f"v{_i}"], globals()[f"d{_i}"] = z[_i], v[_i], d[_i]
    __all__ += [f"z{_i}", f"v{_i}", f"d{_i}"]
    if _i < 16:
        globals()[f"p{_i}"] = p[_i]
        __all__ += [f"p{_i}"]
del _i
