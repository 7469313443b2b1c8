"""A small x86-64 interpreter over iced-x86's decoded instructions, to run kernels this host cannot.

It executes AVX-512 (F/BW/VL/BF16/VNNI) and AMX machine code with the real semantics of each
modelled instruction and refuses everything else (``UnsupportedInstruction`` names the mnemonic,
the instruction text and its address). Memory is flat and sparse: only mapped arrays, the stack
and the loaded code exist, so any stray access raises ``MemoryFault``; masked-off lanes of masked
loads/stores are not accessed (fault suppression, as on hardware).

Example (``lea rax, [rdi + rsi]; ret``):

>>> import numpy as np
>>> m = Machine()
>>> m.call(bytes.fromhex("488d0437c3"), args=[40, 2])
42
>>> pa = m.map(np.arange(4, dtype=np.int32))
>>> m.call(bytes.fromhex("8b4708c3"), args=[pa])        # mov eax, [rdi + 8]; ret
2

The semantics tables (``SEMANTICS``) map an iced ``Mnemonic`` to a builder carrying its one-line
reference semantics in ``.ref``; ``reference()`` lists them.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

import iced_x86
import numpy as np

from .amx import AMX
from .avx512 import AVX512
from .base import (M64, MNEMONIC_NAME, InterpError, InvalidOpcode, MemoryFault,
                          UnsupportedInstruction, refuse, text_of)
from .gpr import GPR
from .vec import VEC

__all__ = ["Machine", "MemoryFault", "UnsupportedInstruction", "InvalidOpcode", "InterpError",
           "StepLimit", "AbiViolation", "SEMANTICS", "reference"]

SEMANTICS = {**GPR, **VEC, **AVX512, **AMX}

RETURN_SENTINEL = 0x0000_DEAD_0000_0000
_CODE_BASE = 0x0040_0000
_DATA_BASE = 0x1000_0000
_STACK_TOP = 0x7FFF_0000_0000
_STACK_SIZE = 1 << 18
_GAP = 1 << 12
_CALLEE_SAVED = (3, 5, 12, 13, 14, 15)  # rbx rbp r12-r15


class StepLimit(InterpError):
    """The program ran more than max_steps instructions."""


class AbiViolation(InterpError):
    """A System V callee-saved register or rsp was not restored by the called function."""


def reference() -> dict:
    """{mnemonic name: reference semantics} for every modelled mnemonic.

    >>> reference()["vaddps"]
    'dst[i] = a[i] + b[i] (fp32, RNE; x86 NaN rules)'
    """
    return {MNEMONIC_NAME[k]: v.ref for k, v in sorted(SEMANTICS.items(), key=lambda kv: MNEMONIC_NAME[kv[0]])}


@dataclass
class _Region:
    start: int
    end: int
    buf: bytearray
    arr: np.ndarray
    writable: bool = True
    name: str = ""


@dataclass
class Stats:
    """Execution statistics: ``counts`` per mnemonic name, ``tile_loads`` as (ip, mnemonic, address),
    and ``tile_ops``, the tile instructions and prefetches in execution order for cycle models:
    (mnemonic, tiles written, tiles read, address, stride, bytes per row, rows)."""

    ip_counts: Counter = field(default_factory=Counter)
    names: dict = field(default_factory=dict)
    tile_loads: list = field(default_factory=list)
    tile_ops: list = field(default_factory=list)
    steps: int = 0

    @property
    def counts(self) -> Counter:
        c = Counter()
        for ip, n in self.ip_counts.items():
            c[self.names[ip]] += n
        return c

    def reset(self) -> None:
        self.ip_counts.clear()
        self.tile_loads.clear()
        self.tile_ops.clear()
        self.steps = 0


class Machine:
    """Registers, flat sparse memory and a decode cache; ``call`` runs code with the System V ABI.

    >>> m = Machine()
    >>> m.call(bytes.fromhex("4889f8" "4801f0" "c3"), args=[3, 4])   # mov rax,rdi; add rax,rsi; ret
    7
    """

    def __init__(self):
        self.g = [0] * 16                       # rax rcx rdx rbx rsp rbp rsi rdi r8..r15, unsigned
        self.fl = [0, 0, 0, 0]                  # CF ZF SF OF
        self.v = np.zeros((32, 64), np.uint8)   # zmm0..31 as bytes; views by dtype per operand
        self.k = [0] * 8
        self.tiles = np.zeros((8, 16, 64), np.uint8)
        self.tilecfg = None                     # (rows[8], colsb[8]) once ldtilecfg ran
        self.tile_start_row = 0
        self.stats = Stats()
        self._regions: list[_Region] = []
        self._starts: list[int] = []
        self._last = None
        self._next_data = _DATA_BASE
        self._next_code = _CODE_BASE
        self._code_at: dict[bytes, int] = {}
        self._cache: dict[int, object] = {}
        self._texts: dict[int, str] = {}
        self._add(_STACK_TOP - _STACK_SIZE, bytearray(_STACK_SIZE), True, "stack")

    # ---- memory -----------------------------------------------------------------------------

    def _add(self, start: int, buf: bytearray, writable: bool, name: str) -> _Region:
        r = _Region(start, start + len(buf), buf, np.frombuffer(buf, np.uint8), writable, name)
        i = bisect.bisect(self._starts, start)
        self._starts.insert(i, start)
        self._regions.insert(i, r)
        return r

    def map(self, array, offset: int = 0) -> int:
        """Copy an array's bytes to a fresh page-aligned address (plus ``offset``); return it.

        >>> m = Machine(); a = np.ones(3, np.float32); pa = m.map(a)
        >>> bool((m.read(pa, like=a) == a).all())
        True
        """
        raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        start = self._next_data + offset
        self._add(start, bytearray(raw.tobytes()), True, "data")
        self._next_data = (start + max(len(raw), 1) + 2 * _GAP - 1) // _GAP * _GAP
        return start

    def read(self, address: int, like=None, nbytes: int | None = None):
        """The bytes now at ``address`` as a new array shaped like ``like`` (or raw ``nbytes``)."""
        if like is not None:
            like = np.asarray(like)
            return self.rdv(address, like.nbytes).copy().view(like.dtype).reshape(like.shape)
        return self.rdv(address, nbytes).copy()

    def write(self, address: int, array) -> None:
        """Overwrite mapped memory at ``address`` with the bytes of ``array``.

        >>> m = Machine(); pa = m.map(np.zeros(2, np.int32)); m.write(pa + 4, np.int32(7))
        >>> m.read(pa, like=np.zeros(2, np.int32)).tolist()
        [0, 7]
        """
        self.wrv(address, np.ascontiguousarray(array).view(np.uint8).reshape(-1))

    def load(self, code: bytes) -> int:
        """Place code (read-only, executable) at a fresh address and return it; same bytes, same address.

        >>> m = Machine(); f = m.load(bytes.fromhex("89f8c3"))    # mov eax, edi; ret
        >>> m.load(bytes.fromhex("89f8c3")) == f, m.call(f, [5])
        (True, 5)
        """
        code = bytes(code)
        at = self._code_at.get(code)
        if at is None:
            at = self._next_code
            self._add(at, bytearray(code), False, "code")
            self._next_code = (at + len(code) + 2 * _GAP - 1) // _GAP * _GAP
            self._code_at[code] = at
        return at

    def _region(self, addr: int, n: int) -> _Region:
        r = self._last
        if r is not None and r.start <= addr and addr + n <= r.end:
            return r
        i = bisect.bisect(self._starts, addr) - 1
        if i >= 0:
            r = self._regions[i]
            if addr + n <= r.end:
                self._last = r
                return r
        raise MemoryFault(addr, n)

    def mapped(self, addr: int, n: int) -> bool:
        try:
            self._region(addr, n)
            return True
        except MemoryFault:
            return False

    def rd(self, addr: int, n: int) -> int:
        r = self._region(addr, n)
        o = addr - r.start
        return int.from_bytes(r.buf[o:o + n], "little")

    def wr(self, addr: int, n: int, value: int) -> None:
        r = self._region(addr, n)
        if not r.writable:
            raise MemoryFault(addr, n, "write to code")
        o = addr - r.start
        r.buf[o:o + n] = (value & ((1 << (8 * n)) - 1)).to_bytes(n, "little")

    def rdv(self, addr: int, n: int) -> np.ndarray:
        """A read-only uint8 view of n mapped bytes (callers never keep it past the step)."""
        r = self._region(addr, n)
        o = addr - r.start
        return r.arr[o:o + n]

    def wrv(self, addr: int, data: np.ndarray) -> None:
        n = data.nbytes
        r = self._region(addr, n)
        if not r.writable:
            raise MemoryFault(addr, n, "write to code")
        o = addr - r.start
        r.arr[o:o + n] = data.view(np.uint8).reshape(-1)

    def push(self, value: int) -> None:
        self.g[4] = (self.g[4] - 8) & M64
        self.wr(self.g[4], 8, value)

    def pop(self) -> int:
        v = self.rd(self.g[4], 8)
        self.g[4] = (self.g[4] + 8) & M64
        return v

    # ---- decode and run ---------------------------------------------------------------------

    def decode(self, ip: int):
        """The iced Instruction at ip (faults if ip is not in loaded code)."""
        r = self._region(ip, 1)
        if r.name != "code":
            raise MemoryFault(ip, 1, "execute outside code")
        dec = iced_x86.Decoder(64, bytes(r.buf[ip - r.start:ip - r.start + 15]), ip=ip)
        ins = dec.decode()
        if ins.is_invalid or ip + ins.len > r.end:
            raise UnsupportedInstruction("(invalid)", "undecodable bytes", ip, r.buf[ip - r.start:][:15].hex())
        return ins

    def _compile(self, ip: int):
        ins = self.decode(ip)
        text = text_of(ins)
        self._texts[ip] = text
        self.stats.names[ip] = MNEMONIC_NAME.get(ins.mnemonic, "?")
        build = SEMANTICS.get(ins.mnemonic)
        if build is None:
            refuse(ins, "not modelled")
        if ins.has_lock_prefix or ins.has_rep_prefix or ins.has_repne_prefix:
            refuse(ins, "prefix not modelled")
        if ins.rounding_control != iced_x86.RoundingControl.NONE:
            refuse(ins, "embedded rounding not modelled")
        try:
            step = build(self, ins)
        except InterpError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            refuse(ins, f"operand form not modelled: {e!r}")
        self._cache[ip] = step
        return step

    def run(self, ip: int, max_steps: int = 10_000_000) -> None:
        """Interpret from ip until a ``ret`` pops the return sentinel."""
        cache, counts = self._cache, self.stats.ip_counts
        steps, cur = 0, ip
        old = np.seterr(all="ignore")  # fp lanes produce inf/NaN on purpose
        try:
            while cur != RETURN_SENTINEL:
                step = cache.get(cur)
                if step is None:
                    step = self._compile(cur)
                counts[cur] += 1
                cur, ip = step(), cur
                steps += 1
                if steps >= max_steps:
                    raise StepLimit(f"more than {max_steps} steps", cur, self._texts.get(cur, "?"))
        except InterpError as e:
            e.locate(cur, self._texts.get(cur, "?"))
            raise
        finally:
            np.seterr(**old)
            self.stats.steps += steps

    def call(self, code, args=(), max_steps: int = 10_000_000, check_abi: bool = True) -> int:
        """Call code (bytes, or an address from ``load``) with integer args per System V; return rax.

        Callee-saved registers are seeded with distinct values and checked afterwards when
        ``check_abi`` (AbiViolation otherwise).
        """
        entry = self.load(code) if isinstance(code, (bytes, bytearray, memoryview)) else int(code)
        g = self.g
        regs = (7, 6, 2, 1, 8, 9)
        for r, a in zip(regs, args):
            g[r] = int(a) & M64
        sp = _STACK_TOP - 256
        extra = [int(a) & M64 for a in args[6:]]
        sp -= 8 * len(extra)
        sp &= ~15
        for i, a in enumerate(extra):
            self.wr(sp + 8 * i, 8, a)
        g[4] = sp
        seeds = {r: 0x5EED_0000_0000_0000 | (r << 8) for r in _CALLEE_SAVED}
        for r, s in seeds.items():
            g[r] = s
        self.push(RETURN_SENTINEL)
        self.run(entry, max_steps)
        if check_abi:
            bad = [r for r, s in seeds.items() if g[r] != s]
            if bad or g[4] != sp:
                raise AbiViolation(f"callee-saved registers {bad} or rsp not restored")
        return g[0]
