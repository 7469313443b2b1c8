"""Vector constants of a BRGEMM kernel, written to its stack frame once at entry (position
independent: no data section) and loaded or broadcast from there."""
from isa.x86 import bcst, dword, rsp

class ConstPool:
    """dword patterns replicated across a vector, kept in the kernel's stack frame (no data
    section: the code stays position independent). AVX2 stores the whole vector; AVX-512 reads one
    dword with an embedded broadcast."""

    def __init__(self, fn, v):
        self.fn, self.v, self.slots = fn, v, {}
        self.stores = []

    def add(self, key, dwords):
        if key not in self.slots:
            off = sum(len(d) * 4 for d in self.stores)
            self.slots[key] = off
            self.stores.append(dwords)
        return self.slots[key]

    def splat(self, value):
        """A memory operand holding ``value`` in every dword lane."""
        value &= 0xFFFFFFFF
        if self.v.avx512:
            return bcst(rsp + self.add(value, [value]))
        return [rsp + self.add(value, [value] * 8)]

    def load(self, a, reg, value):
        """reg = ``value`` in every dword lane."""
        value &= 0xFFFFFFFF
        off = self.add(value, [value] if self.v.avx512 else [value] * 8)
        if self.v.avx512:
            a.vpbroadcastd(reg, dword[rsp + off])
        else:
            a.vmovdqu(reg, [rsp + off])

    def emit(self, a):
        """The stores that fill the pool (run once at kernel entry); add nothing after this."""
        total = sum(len(d) * 4 for d in self.stores)
        if not total:
            return
        self.fn.stack(total)
        off = 0
        for dwords in self.stores:
            for d in dwords:
                a.mov(dword[rsp + off], d - (1 << 32) if d >= 1 << 31 else d)
                off += 4
