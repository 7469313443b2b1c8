"""Helpers for running tppasm descriptors' SVE kernels under qemu: operand buffers built from the
descriptor's OperandSpecs (NaN / sentinel poisoned, padding included), one Call per kernel, and the
expected buffers from ``desc.reference`` on views of copies."""
import numpy as np

from isa.aarch64.emulate import AddressTable, Call
from tppasm.dtypes import dtype as np_dtype
from tppasm.kernel import Kernel

POISON_INT = {1: 0x5A, 2: 0x5A5A, 4: 0x5A5A5A5A, 8: 0x5A5A5A5A5A5A5A5A}


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


def random_fill(rng, dt, size, scale=3.0):
    dt = np.dtype(dt)
    if dt.kind == "f" or dt.name == "bfloat16":
        return (rng.standard_normal(size) * scale).astype(np.float32).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(max(info.min, -100), min(info.max, 100) + 1, size).astype(dt)


class DescCase:
    """One descriptor run: buffers, the qemu Call, the expected buffers; ``fill(spec, view)`` may
    overwrite an input's elements (``view`` is a view of its buffer)."""

    def __init__(self, desc, seed=0, count=1, fill=None, scale=3.0):
        self.desc, self.count = desc, count
        self.kernel = Kernel(desc, "sve")
        rng = np.random.default_rng(seed)
        self.specs = desc.operands()
        self.bufs, self.views = [], []
        for spec in self.specs:
            dt = spec.np_dtype
            size = extent(spec, count)
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
            self.bufs.append(buf)
            self.views.append(view(buf, spec, count))
        self.expected = [b.copy() for b in self.bufs]
        ref_views = [view(b, s, count) for b, s in zip(self.expected, self.specs)]
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


__all__ = ["DescCase", "AddressTable", "view", "poison"]
