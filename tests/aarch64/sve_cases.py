"""Helpers for running tppasm descriptors' SVE kernels (``isa.aarch64.native.run_calls``: natively
or under qemu): operand buffers built from the descriptor's OperandSpecs (NaN / sentinel poisoned,
padding included), one Call per kernel, and the expected buffers from ``desc.reference`` on views
of copies."""
import functools

import numpy as np
from hypothesis import seed

from isa.aarch64.emulate import AddressTable, Call
from tppasm.kernel import Kernel

POISON_INT = {1: 0x5A, 2: 0x5A5A, 4: 0x5A5A5A5A, 8: 0x5A5A5A5A5A5A5A5A}


# hypothesis draws other examples for each pytest param (its seed digest includes the node id); a
# fixed seed draws the same shapes at every VL, so each kernel is generated once (sve_kernel)
same_examples_at_every_vl = seed(0)


@functools.lru_cache(maxsize=1024)
def sve_kernel(desc):
    """``Kernel(desc, "sve")``, generated once for all the VLs it runs at."""
    return Kernel(desc, "sve")


def poison(dt):
    dt = np.dtype(dt)
    if dt.kind == "f" or dt.name == "bfloat16":
        return np.nan
    return POISON_INT[dt.itemsize] if dt.kind == "u" else -POISON_INT[dt.itemsize]


def extent(spec, count):
    return 1 + sum((d - 1) * s for d, s in zip(spec.full_shape(count), spec.strides))


def view(buf, spec, count):
    es = buf.itemsize
    return np.lib.stride_tricks.as_strided(buf, spec.full_shape(count), [s * es for s in spec.strides])


def close(got, want, rtol, atol):
    """Flat indices where ``got`` is not within ``atol + rtol |want|`` of ``want``; NaN matches NaN
    and an infinite ``want`` only the same infinity (as ``np.isclose``: inf <= inf is no match)."""
    g, w = got.astype(np.float64), want.astype(np.float64)
    both_nan = np.isnan(g) & np.isnan(w)
    with np.errstate(invalid="ignore"):
        near = np.where(np.isfinite(w), np.abs(g - w) <= atol + rtol * np.abs(w), g == w)
    return np.flatnonzero(~both_nan & ~near)


def random_fill(rng, dt, size, scale=3.0):
    dt = np.dtype(dt)
    if dt.kind == "f" or dt.name == "bfloat16":
        return (rng.standard_normal(size) * scale).astype(np.float32).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(max(info.min, -100), min(info.max, 100) + 1, size).astype(dt)


class DescCase:
    """One descriptor run: buffers, the Call, the expected buffers; ``fill(spec, view)`` may
    overwrite an input's elements (``view`` is a view of its buffer). ``flat`` maps operand names to
    a number of blocks: that operand is passed as a flat buffer of that many blocks (BRGEMM offsets)."""

    def __init__(self, desc, seed=0, count=1, fill=None, scale=3.0, flat=None):
        self.desc, self.count = desc, count
        self.kernel = sve_kernel(desc)
        rng = np.random.default_rng(seed)
        self.specs = desc.operands()
        self.bufs, self.views = [], []
        for spec in self.specs:
            dt = spec.np_dtype
            size = extent(spec, count) * (flat or {}).get(spec.name, 1)
            if spec.writable:
                buf = np.full(size, poison(dt)).astype(dt) if np.dtype(dt).kind in "fV" or dt.name == "bfloat16" \
                    else np.full(size, poison(dt), dt)
                if getattr(desc, "beta", 0) or desc.kind == "ternary":
                    vw = view(buf, spec, count)
                    vw[...] = random_fill(rng, dt, vw.shape)
            else:
                buf = np.full(size, poison(dt)).astype(dt) if dt.kind == "f" or dt.name == "bfloat16" \
                    else np.full(size, poison(dt), dt)
                vw = view(buf, spec, count)
                vw[...] = random_fill(rng, dt, vw.shape, scale)
                if fill is not None:
                    fill(spec, vw, rng)
            if flat and spec.name in flat:
                buf[...] = random_fill(rng, dt, buf.shape, scale)
            self.bufs.append(buf)
        self.expected = [b.copy() for b in self.bufs]
        ref_views = [b if flat and s.name in flat else view(b, s, count) for b, s in zip(self.expected, self.specs)]
        scalars = {desc.count_scalar: count} if desc.count_scalar else {}
        desc.reference(*ref_views, **scalars)

    def call(self):
        ins = [i for i, s in enumerate(self.specs) if not s.writable]
        outs = [i for i, s in enumerate(self.specs) if s.writable]
        order = [0] * len(self.specs)
        for pos, i in enumerate(ins + outs):
            order[i] = pos
        self._outs = outs
        self._call = Call(self.kernel.raw.code, [self.bufs[i] for i in ins], [self.bufs[i].copy() for i in outs],
                          (self.count,) if self.desc.count_scalar else (), tuple(order))
        return self._call

    def results(self):
        """(got, expected) flat buffers of each writable operand."""
        return [(got, self.expected[i]) for got, i in zip(self._call.outputs, self._outs)]


class InPlaceCase(DescCase):
    """A DescCase whose single output is also its input ``alias`` (same buffer, same pointer):
    the expected output is the reference run on a copy of that input."""

    def __init__(self, desc, alias, seed=0, fill=None):
        super().__init__(desc, seed=seed, fill=fill)
        self.alias = next(i for i, s in enumerate(self.specs) if s.name == alias)
        self.out = next(i for i, s in enumerate(self.specs) if s.writable)
        self.expected[self.out] = self.bufs[self.alias].copy()
        views = [view(b, s, 1) for b, s in zip(self.bufs, self.specs)]
        views[self.out] = view(self.expected[self.out], self.specs[self.out], 1)
        desc.reference(*views)

    def call(self):
        ins = [i for i in range(len(self.specs)) if i not in (self.alias, self.out)]
        order = tuple(len(ins) if i in (self.alias, self.out) else ins.index(i) for i in range(len(self.specs)))
        self._call = Call(self.kernel.raw.code, [self.bufs[i] for i in ins], [self.bufs[self.alias].copy()], (), order)
        return self._call

    def results(self):
        return [(self._call.outputs[0], self.expected[self.out])]


class AddressCase:
    """A ``batch="address"`` BRGEMM: the A and B blocks live in two buffers (count blocks each, in a
    shuffled order) and the kernel gets AddressTables of their addresses."""

    def __init__(self, desc, seed=0, count=1, scale=1.0):
        self.desc, self.count = desc, count
        self.kernel = sve_kernel(desc)
        rng = np.random.default_rng(seed)
        a_spec, b_spec = desc.block_specs()
        self.blocks, tables = [], []
        for spec in (a_spec, b_spec):
            ext = extent(spec, 1)
            buf = random_fill(rng, spec.np_dtype, ext * count, scale)
            perm = rng.permutation(count)
            tables.append(AddressTable(buf, [int(i) * ext * buf.itemsize for i in perm]))
            self.blocks.append([view(buf[int(i) * ext:], spec, 1) for i in perm])
        rest = desc.operands()[2:]
        self.c = np.full(extent(rest[0], 1), poison(rest[0].np_dtype)).astype(rest[0].np_dtype)
        if desc.beta:
            view(self.c, rest[0], 1)[...] = random_fill(rng, rest[0].np_dtype, (desc.m, desc.n))
        self.bias = random_fill(rng, np.float32, desc.n) if desc.bias else None
        self.tables = tables
        self.want = self.c.copy()
        args = [self.bias] if desc.bias else []
        desc.reference(self.blocks[0], self.blocks[1], view(self.want, rest[0], 1), *args, count=count)

    def call(self):
        ins = self.tables + ([self.bias] if self.bias is not None else [])
        order = (0, 1, len(ins)) + ((2,) if self.bias is not None else ())
        self._call = Call(self.kernel.raw.code, ins, [self.c.copy()], (self.count,), order)
        return self._call

    def results(self):
        return [(self._call.outputs[0], self.want)]


__all__ = ["DescCase", "InPlaceCase", "AddressCase", "close", "AddressTable", "view", "poison", "same_examples_at_every_vl", "sve_kernel"]
