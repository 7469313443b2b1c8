"""EVEX-only semantics: AVX-512 F/BW/VL moves and permutes, BF16, VNNI, and the opmask registers.

The bf16 model follows the SDM pseudo-code: ``vcvtneps2bf16`` is convert_fp32_to_bfloat16
(denormals to signed zero, RNE, NaN quieted); ``vdpbf16ps`` does, per fp32 lane, two fused
multiply-adds in sequence (odd bf16 pair first, then even) with DAZ on inputs, FTZ on the result
and RNE, each exactly rounded once (see ``fp.fma32``).
"""

from __future__ import annotations

import numpy as np
from iced_x86 import Mnemonic as Mn
from iced_x86 import OpKind, RegisterExt

from .base import IMM_KINDS, MNEMONIC_NAME, imm_of, operand_rw, with_ref
from .fp import f32, fma32, from_bf16, to_bf16
from .lanes import vop
from .vec import _ident, _sat

u8, i8, u16, i16, u32, i32, u64, i64 = (np.uint8, np.int8, np.uint16, np.int16, np.uint32,
                                        np.int32, np.uint64, np.int64)


def _ternlog(n, imm, a, b, c):
    """Bit i of the result = imm[(a_i << 2) | (b_i << 1) | c_i]."""
    r = np.zeros_like(a)
    for j in range(8):
        if (imm >> j) & 1:
            r |= (a if j & 4 else ~a) & (b if j & 2 else ~b) & (c if j & 1 else ~c)
    return r


def _permt2(n, d, idx, t2):
    both = np.concatenate([d, t2])
    return both[idx.astype(i64) & (2 * len(d) - 1)]


def _permi2(n, idx, t1, t2):
    both = np.concatenate([t1, t2])
    return both[idx.astype(i64) & (2 * len(t1) - 1)]


def _blendm(n, a, b):
    return b  # masked-off lanes come from a (merge_src=1), or zero with {z}


def _vpcmp(signed_t):
    def f(n, imm, a, b):
        p = imm & 7
        return {0: a == b, 1: a < b, 2: a <= b, 3: np.zeros(len(a), bool), 4: a != b, 5: a >= b,
                6: a > b, 7: np.ones(len(a), bool)}[p]
    return f


def _shuf128(n, imm, a, b):
    blk = 16 // a.itemsize
    qa, qb = a.reshape(-1, blk), b.reshape(-1, blk)
    if len(qa) == 4:
        sel = [qa[imm & 3], qa[(imm >> 2) & 3], qb[(imm >> 4) & 3], qb[(imm >> 6) & 3]]
    else:
        sel = [qa[imm & 1], qb[(imm >> 1) & 1]]
    return np.concatenate(sel)


def _valign(n, imm, a, b):
    both = np.concatenate([b, a])
    s = imm & (len(a) - 1)
    return both[s:s + len(a)]


def _down(tout, saturate: bool):
    def f(n, a):
        return _sat(a.astype(i64), tout) if saturate else a.astype(tout)
    return f


def _cvtneps2bf16(n, a):
    return to_bf16(a)


def _cvtne2ps2bf16(n, a, b):
    return np.concatenate([to_bf16(b), to_bf16(a)])


def _dpbf16(n, d, a, b):
    a16, b16 = a.view(u16), b.view(u16)
    acc = d.view(f32)
    odd = fma32(from_bf16(a16[1::2]), from_bf16(b16[1::2]), acc, daz_ftz=True)
    return fma32(from_bf16(a16[0::2]), from_bf16(b16[0::2]), odd, daz_ftz=True).view(u32)


def _dp(ta, tb, group, saturate):
    """vpdpbusd(s) / vpdpwssd(s): acc + sum of `group` products per dword (wrap or saturate)."""
    def f(n, d, a, b):
        p = a.view(ta).astype(i64) * b.view(tb).astype(i64)
        s = d.view(i32).astype(i64) + p.reshape(-1, group).sum(axis=1)
        return (_sat(s, i32) if saturate else s.astype(i32)).view(u32)
    return f


# ---- opmask registers -------------------------------------------------------------------------

def _kwidth(ins) -> int:
    return {"b": 8, "w": 16, "d": 32, "q": 64}[MNEMONIC_NAME[ins.mnemonic][-1]]


def _kreader(m, ins, i, width):
    k = ins.op_kind(i)
    if k == OpKind.REGISTER and RegisterExt.is_k(ins.op_register(i)):
        kr, j = m.k, RegisterExt.number(ins.op_register(i))
        mask = (1 << width) - 1
        return lambda: kr[j] & mask
    if k in IMM_KINDS:
        v = imm_of(ins, i)
        return lambda: v
    rd, _ = operand_rw(m, ins, i, width // 8 if k == OpKind.MEMORY else None)
    return rd


def _kop(fn, ref):
    """k-register logic: dst = fn(sources) & width mask (bits above the width cleared)."""
    def build(m, ins):
        w = _kwidth(ins)
        mask = (1 << w) - 1
        srcs = [_kreader(m, ins, i, w) for i in range(1, ins.op_count)]
        kr, d, nxt = m.k, RegisterExt.number(ins.op0_register), ins.next_ip

        def step():
            kr[d] = fn(w, *[s() for s in srcs]) & mask
            return nxt
        return step
    return with_ref(build, ref)


def _kmov(m, ins):
    w = _kwidth(ins)
    src = _kreader(m, ins, 1, w)
    if ins.op_kind(0) == OpKind.REGISTER and RegisterExt.is_k(ins.op0_register):
        kr, d, mask = m.k, RegisterExt.number(ins.op0_register), (1 << w) - 1
        nxt = ins.next_ip

        def step():
            kr[d] = src() & mask
            return nxt
        return step
    _, wr = operand_rw(m, ins, 0, w // 8 if ins.op_kind(0) == OpKind.MEMORY else None)
    nxt = ins.next_ip

    def step():
        wr(src())
        return nxt
    return step


def _ktest(kind):
    def build(m, ins):
        w = _kwidth(ins)
        a, b = _kreader(m, ins, 0, w), _kreader(m, ins, 1, w)
        full, f, nxt = (1 << w) - 1, m.fl, ins.next_ip

        def step():
            x, y = a(), b()
            if kind == "or":
                f[1], f[0] = (x | y) == 0, (x | y) == full
            else:
                f[1], f[0] = (x & y) == 0, (~x & y & full) == 0
            f[2] = f[3] = 0
            return nxt
        return step
    return build


def _table():
    t = {}

    def add(mn, b, ref=None):
        t[mn] = with_ref(b, ref) if ref is not None else b

    for name, ty, al in (("VMOVDQU8", u8, 0), ("VMOVDQU16", u16, 0), ("VMOVDQU32", u32, 0),
                         ("VMOVDQU64", u64, 0), ("VMOVDQA32", u32, 1), ("VMOVDQA64", u64, 1)):
        add(getattr(Mn, name), vop(_ident, ty, aligned=bool(al), ref="dst = src, masked per element"))
    add(Mn.VPTERNLOGD, vop(_ternlog, u32, acc=True, imm=True, ref="bit = imm[(dst<<2)|(b<<1)|c]"))
    add(Mn.VPTERNLOGQ, vop(_ternlog, u64, acc=True, imm=True, ref="bit = imm[(dst<<2)|(b<<1)|c]"))
    for s, ty in (("PS", u32), ("D", u32), ("Q", u64), ("PD", u64), ("W", u16)):
        add(getattr(Mn, f"VPERMT2{s}"), vop(_permt2, ty, acc=True, full_mem=True,
                                            ref="dst[i] = (dst ++ c)[idx[i] mod 2n]"))
        add(getattr(Mn, f"VPERMI2{s}"), vop(_permi2, ty, acc=True, full_mem=True,
                                            ref="dst[i] = (b ++ c)[dst[i] mod 2n]"))
    for name, ty in (("VBLENDMPS", u32), ("VPBLENDMD", u32), ("VPBLENDMQ", u64), ("VPBLENDMW", u16),
                     ("VPBLENDMB", u8), ("VBLENDMPD", u64)):
        add(getattr(Mn, name), vop(_blendm, ty, merge_src=1, ref="dst[i] = k[i] ? c[i] : b[i] (or 0 with {z})"))
    for s, st, ut in (("B", i8, u8), ("W", i16, u16), ("D", i32, u32), ("Q", i64, u64)):
        add(getattr(Mn, f"VPCMP{s}"), vop(_vpcmp(st), st, u8, imm=True, kdst=True, ref="k = a <pred imm> b signed"))
        add(getattr(Mn, f"VPCMPU{s}"), vop(_vpcmp(ut), ut, u8, imm=True, kdst=True, ref="k = a <pred imm> b unsigned"))
        add(getattr(Mn, f"VPTESTM{s}"), vop(lambda n, a, b: (a & b) != 0, ut, u8, kdst=True, ref="k = (a & b) != 0"))
        add(getattr(Mn, f"VPTESTNM{s}"), vop(lambda n, a, b: (a & b) == 0, ut, u8, kdst=True, ref="k = (a & b) == 0"))
        add(getattr(Mn, f"VPMOV{s}2M"), vop(lambda n, a: a < 0, st, u8, kdst=True, ref="k = sign bits"))
    for name, tin, tout, sat in (("VPMOVDW", u32, u16, 0), ("VPMOVDB", u32, u8, 0), ("VPMOVWB", u16, u8, 0),
                                 ("VPMOVQD", u64, u32, 0), ("VPMOVQW", u64, u16, 0), ("VPMOVQB", u64, u8, 0),
                                 ("VPMOVSDW", i32, i16, 1), ("VPMOVSDB", i32, i8, 1), ("VPMOVSWB", i16, i8, 1),
                                 ("VPMOVUSDW", u32, u16, 1), ("VPMOVUSDB", u32, u8, 1), ("VPMOVUSWB", u16, u8, 1)):
        add(getattr(Mn, name), vop(_down(tout, bool(sat)), tin, tout, full_mem=True,
                                   ref="dst[i] = " + ("saturate" if sat else "truncate") + "(a[i])"))
    for name, ty in (("VSHUFF32X4", u32), ("VSHUFI32X4", u32), ("VSHUFF64X2", u64), ("VSHUFI64X2", u64)):
        add(getattr(Mn, name), vop(_shuf128, ty, imm=True, ref="128-bit blocks: a[imm], a[imm], b[imm], b[imm]"))
    add(Mn.VALIGND, vop(_valign, u32, imm=True, full_mem=True, ref="dst = (c ++ b)[imm : imm + n]"))
    add(Mn.VALIGNQ, vop(_valign, u64, imm=True, full_mem=True, ref="dst = (c ++ b)[imm : imm + n]"))
    add(Mn.VCVTNEPS2BF16, vop(_cvtneps2bf16, f32, u16, ref="dst.bf16[i] = cvt(a[i]) (SDM: DAZ, RNE, NaN quieted)"))
    add(Mn.VCVTNE2PS2BF16, vop(_cvtne2ps2bf16, f32, u16, ref="dst.bf16 = cvt(c) ++ cvt(b)"))
    add(Mn.VDPBF16PS, vop(_dpbf16, u32, acc=True,
                          ref="dst[i] = fma(a.bf[2i], b.bf[2i], fma(a.bf[2i+1], b.bf[2i+1], dst[i])) DAZ/FTZ/RNE"))
    add(Mn.VPDPBUSD, vop(_dp(u8, i8, 4, False), u32, acc=True, ref="dst.d += sum4(u8 a * s8 b) (wraps)"))
    add(Mn.VPDPBUSDS, vop(_dp(u8, i8, 4, True), u32, acc=True, ref="dst.d = sat32(dst + sum4(u8 a * s8 b))"))
    add(Mn.VPDPWSSD, vop(_dp(i16, i16, 2, False), u32, acc=True, ref="dst.d += sum2(s16 a * s16 b) (wraps)"))
    add(Mn.VPDPWSSDS, vop(_dp(i16, i16, 2, True), u32, acc=True, ref="dst.d = sat32(dst + sum2(s16 a * s16 b))"))
    for w in "BWDQ":
        add(getattr(Mn, f"KMOV{w}"), _kmov, "k/GPR/m = k/GPR/m (k writes clear bits above the width)")
        add(getattr(Mn, f"KAND{w}"), _kop(lambda w, a, b: a & b, "k = a & b"))
        add(getattr(Mn, f"KANDN{w}"), _kop(lambda w, a, b: ~a & b, "k = ~a & b"))
        add(getattr(Mn, f"KOR{w}"), _kop(lambda w, a, b: a | b, "k = a | b"))
        add(getattr(Mn, f"KXOR{w}"), _kop(lambda w, a, b: a ^ b, "k = a ^ b"))
        add(getattr(Mn, f"KXNOR{w}"), _kop(lambda w, a, b: ~(a ^ b), "k = ~(a ^ b)"))
        add(getattr(Mn, f"KNOT{w}"), _kop(lambda w, a: ~a, "k = ~a"))
        add(getattr(Mn, f"KADD{w}"), _kop(lambda w, a, b: a + b, "k = a + b"))
        add(getattr(Mn, f"KSHIFTL{w}"), _kop(lambda w, a, c: a << (c & 0xFF) if (c & 0xFF) < w else 0, "k = a << imm"))
        add(getattr(Mn, f"KSHIFTR{w}"), _kop(lambda w, a, c: a >> (c & 0xFF) if (c & 0xFF) < w else 0, "k = a >> imm"))
        add(getattr(Mn, f"KORTEST{w}"), _ktest("or"), "ZF = (a|b) == 0; CF = (a|b) == all ones")
        add(getattr(Mn, f"KTEST{w}"), _ktest("and"), "ZF = (a&b) == 0; CF = (~a&b) == 0")
    add(Mn.KUNPCKBW, _kop(lambda w, a, b: ((a & 0xFF) << 8) | (b & 0xFF), "k = a[7:0] << 8 | b[7:0]"))
    add(Mn.KUNPCKWD, _kop(lambda w, a, b: ((a & 0xFFFF) << 16) | (b & 0xFFFF), "k = a[15:0] << 16 | b[15:0]"))
    add(Mn.KUNPCKDQ, _kop(lambda w, a, b: ((a & 0xFFFFFFFF) << 32) | (b & 0xFFFFFFFF), "k = a.lo << 32 | b.lo"))
    return t


AVX512 = _table()
