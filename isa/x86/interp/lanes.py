"""The generic vector-instruction builder: operand readers, opmasks, broadcast, fault suppression.

``vop(fn, tin, tout)`` turns a lane function ``fn(n, [imm,] *sources) -> lanes`` into a builder.
Sources are NumPy views typed ``tin`` (registers: their full width; memory: the operand size;
``{1toN}`` broadcast expanded to the vector length; a GPR source as one lane). ``n`` is the number
of ``tout`` lanes in the destination register. The builder then applies EVEX masking (merge or
zero, per ``tout`` lane), zeroes the destination above the written width (VEX/EVEX rule) or
writes only the enabled lanes of a memory destination. Memory sources of masked instructions read
only the enabled elements when the whole operand is not mapped (fault suppression), unless the
form suppresses no faults (:mod:`.suppress`).
"""

from __future__ import annotations

import iced_x86
import numpy as np
from iced_x86 import EncodingKind, OpKind, Register, RegisterExt

from .base import (IMM_KINDS, MemoryFault, addr_fn, gpr_reader, imm_of, mask_bits, pack_bits,
                          refuse, vec_index)
from .suppress import suppresses, wraps

MS = iced_x86.MemorySizeExt


def vl_bytes(ins) -> int:
    return 16 << ins.op_code().l


def mem_reader(m, ins, t, n_lanes_fn=None, aligned=False, full=False):
    """Reader of the memory operand as ``t`` lanes; with a mask, disabled elements are not read
    (where the form suppresses their faults: :mod:`.suppress`)."""
    a = addr_fn(m, ins)
    size = MS.size(ins.memory_size)
    rdv = m.rdv
    full = full or not suppresses(ins)
    if ins.is_broadcast:
        total = vl_bytes(ins)
        reps = total // size

        def rd(bits=None):
            if bits is not None and not full and not bits.any():
                return np.zeros(total, np.uint8).view(t)
            return np.frombuffer(rdv(a(), size).tobytes() * reps, np.uint8).view(t)
        return rd
    mapped, g, wrap = m.mapped, np.dtype(t).itemsize, wraps(ins)

    def rd(bits=None):
        addr = a()
        if aligned and addr % size:
            raise MemoryFault(addr, size, "misaligned aligned access")
        if bits is None or full or mapped(addr, size):
            return rdv(addr, size).view(t)
        return _masked_read(m, addr, size, bits, g, wrap).view(t)
    return rd


def _masked_read(m, addr, size, bits, g, wrap):
    """Read only the g-byte elements an enabled lane uses, others as zero: lane j uses element j
    (none past the operand: lanes a narrowing form zeroes), or j mod size/g for a broadcast."""
    out = np.zeros(size, np.uint8)
    per = size // g
    lanes = np.flatnonzero(bits)
    for j in np.unique(lanes % per) if wrap else lanes[lanes < per]:
        out[j * g:(j + 1) * g] = m.rdv(addr + j * g, g)
    return out


def reader(m, ins, i, t, aligned=False, full=False):
    """Reader closure ``rd(bits) -> lanes`` for operand i (vector register, GPR or memory)."""
    k = ins.op_kind(i)
    if k == OpKind.MEMORY:
        return mem_reader(m, ins, t, aligned=aligned, full=full)
    if k == OpKind.REGISTER:
        reg = ins.op_register(i)
        if RegisterExt.is_vector_register(reg):
            view = m.v[vec_index(reg), :RegisterExt.size(reg)].view(t)
            return lambda bits=None: view
        if RegisterExt.is_gpr(reg):
            rg = gpr_reader(m, reg)
            dt = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[RegisterExt.size(reg)]
            return lambda bits=None: np.array([rg()], dt).view(t)
    refuse(ins, f"operand {i} kind")


def _mask_source(m, ins):
    kr = ins.op_mask
    if kr == Register.NONE:
        return None
    return RegisterExt.number(kr)


def writer(m, ins, tout, merge_from=None, aligned=False):
    """``wr(res, bits)``: store lanes into op0 with masking and upper-zeroing rules."""
    zeroing = ins.zeroing_masking
    k0 = ins.op_kind(0)
    if k0 == OpKind.MEMORY:
        if zeroing:
            refuse(ins, "zeroing-masking on a store")
        a = addr_fn(m, ins)
        wrv, whole = m.wrv, not suppresses(ins)
        msize = MS.size(ins.memory_size)

        def wr(res, bits):
            addr = a()
            if aligned and addr % msize:
                raise MemoryFault(addr, msize, "misaligned aligned access")
            if whole and bits is not None:      # all of it must be writable (no fault suppression)
                m.wrv(addr, m.rdv(addr, msize).copy())
            if bits is None:
                wrv(addr, res)
                return
            g = res.itemsize
            raw = res.view(np.uint8)
            for j in np.flatnonzero(bits[:len(res)]):
                wrv(addr + j * g, raw[j * g:(j + 1) * g])
        return wr
    reg = ins.op0_register
    if RegisterExt.is_k(reg):
        k, d = m.k, RegisterExt.number(reg)

        def wr(res, bits):
            if bits is not None:
                res = res & bits[:len(res)]
            k[d] = pack_bits(res)
        return wr
    if not RegisterExt.is_vector_register(reg):
        refuse(ins, "destination kind")
    row = m.v[vec_index(reg)]
    legacy = ins.encoding == EncodingKind.LEGACY
    if legacy:
        refuse(ins, "legacy SSE encoding (only VEX/EVEX modelled)")
    width = RegisterExt.size(reg)
    old_view = row[:width].view(tout)
    full_lanes = width // np.dtype(tout).itemsize
    upper = row[width:]

    def wr(res, bits):
        if bits is None and len(res) == full_lanes:  # the common case: one copy, no temporaries
            old_view[...] = res
            if width < 64:
                upper[...] = 0
            return
        if res.dtype != tout or not res.flags.c_contiguous:
            res = np.ascontiguousarray(res).astype(tout, copy=False)
        nb = res.nbytes
        if bits is not None:
            bits = bits[:len(res)]
            if zeroing:
                res = np.where(bits, res, 0).astype(tout)
            else:
                old = merge_from() if merge_from is not None else old_view[:len(res)]
                res = np.where(bits, res, old).astype(tout)
        row[:nb] = res.view(np.uint8)
        if nb < 64:
            row[nb:] = 0
    return wr


def vop(fn, tin, tout=None, *, acc=False, imm=False, aligned=False, full_mem=False,
        scalar=False, kdst=False, merge_src=None, ref=""):
    """Builder for a lane function. acc: op0 is also the first source. merge_src: operand whose
    lanes masked-off lanes take instead of the destination's (blend-by-mask)."""
    tout = tout or tin

    def build(m, ins):
        nk = ins.op_count
        kind_list = [ins.op_kind(i) for i in range(nk)]
        has_imm = kind_list[-1] in IMM_KINDS
        if has_imm != imm:
            refuse(ins, "operand form")
        last = nk - 1 if imm else nk
        srcs = ([0] if acc else []) + list(range(1, last))
        reads = [reader(m, ins, i, tin, aligned=aligned, full=full_mem) for i in srcs]
        immv = imm_of(ins, nk - 1) if imm else None
        kidx = _mask_source(m, ins)
        if kidx is not None and scalar:
            refuse(ins, "masked scalar form")
        merge = None
        if merge_src is not None and kidx is not None:
            mview = reader(m, ins, merge_src, tout)
            merge = lambda: mview()  # noqa: E731
        wr = writer(m, ins, tout, merge_from=merge, aligned=aligned)
        if kind_list[0] == OpKind.REGISTER:
            r0 = ins.op0_register
            dwidth = 64 // 8 if RegisterExt.is_k(r0) else RegisterExt.size(r0)
        else:
            dwidth = MS.size(ins.memory_size)
        n = vl_bytes(ins) // np.dtype(tin).itemsize if kdst else dwidth // np.dtype(tout).itemsize
        full = (1 << n) - 1
        kregs, nxt = m.k, ins.next_ip
        bits_for = mask_bits
        if kidx is None and not imm and 1 <= len(reads) <= 3:
            return _unmasked_step(fn, n, reads, wr, nxt)

        def step():
            bits = None
            if kidx is not None:
                kv = kregs[kidx] & full
                if kv != full:
                    bits = bits_for(kv, n)
            vals = [r(bits) for r in reads]
            res = fn(n, immv, *vals) if imm else fn(n, *vals)
            wr(res, bits)
            return nxt
        return step

    build.ref = ref
    return build


def _unmasked_step(fn, n, reads, wr, nxt):
    """The hot path (no opmask, no immediate) without per-step list building."""
    if len(reads) == 1:
        (r0,) = reads

        def step():
            wr(fn(n, r0()), None)
            return nxt
    elif len(reads) == 2:
        r0, r1 = reads

        def step():
            wr(fn(n, r0(), r1()), None)
            return nxt
    else:
        r0, r1, r2 = reads

        def step():
            wr(fn(n, r0(), r1(), r2()), None)
            return nxt
    return step
