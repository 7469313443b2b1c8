"""SSE/AVX/AVX2 (and their EVEX forms) vector semantics: one lane function per family.

Each table entry is ``vop(lane_fn, in_dtype, out_dtype, ref=...)``; ``ref`` is the reference
semantics in one line. Lane functions take ``n`` (destination lanes), then ``imm`` when the form
has one, then the sources in operand order (the destination first for accumulating forms).
"""

from __future__ import annotations

import numpy as np
from iced_x86 import Mnemonic as Mn
from iced_x86 import OpKind, Register, RegisterExt

from .base import MNEMONIC_NAME, pack_bits, gpr_writer, operand_rw, refuse, sem, vec_index, with_ref
from .fp import approx, cvt_f32_i32, f32, fbin, fma32, fsqrt, getexp, round_ps, roundscale, scalef
from .lanes import mem_reader, reader, vop

u8, i8, u16, i16, u32, i32, u64, i64 = (np.uint8, np.int8, np.uint16, np.int16, np.uint32,
                                        np.int32, np.uint64, np.int64)
ONES = {t: np.array(-1).astype(t) for t in (u8, u16, u32, u64)}


def _lanes128(x, per):
    """View as (128-bit lanes, elements per lane)."""
    return x.reshape(-1, per)


# ---- fp32 arithmetic --------------------------------------------------------------------------

def _fmax(n, a, b):
    return np.where(a > b, a, b)  # NaN or equal zeros -> second source, as the SDM says


def _fmin(n, a, b):
    return np.where(a < b, a, b)


def _scalar(op):
    """ss form: lane 0 = op(a0, b0), lanes 1-3 from the first source."""
    def f(n, a, b):
        r = a[:4].copy()
        r[:1] = op(1, a[:1], b[:1])
        return r
    return f


def _fma(order: str, neg_prod: bool, neg_add: bool, scalar: bool = False):
    """vf[n]madd/msub{132,213,231}: a*b+c with operands picked by the order digits.

    With several NaN inputs the result is the first in a, b, c order (multiplicands before the
    addend), un-negated and quieted: what this Zen 3 does; the SDM does not pin it down.
    """
    pick = {"132": lambda d, s2, s3: (d, s3, s2), "213": lambda d, s2, s3: (s2, d, s3),
            "231": lambda d, s2, s3: (s2, s3, d)}[order]

    def f(n, d, s2, s3):
        a, b, c = pick(d, s2, s3)
        if scalar:
            a, b, c = a[:1], b[:1], c[:1]
        r = fma32(-a if neg_prod else a, b, -c if neg_add else c, prio=(a, b, c))
        if scalar:
            out = d[:4].copy()
            out[:1] = r
            return out
        return r
    return f


# ---- integer ----------------------------------------------------------------------------------

def _shift_imm_or_xmm(kind: str, t):
    bits = np.dtype(t).itemsize * 8
    st = {8: i8, 16: i16, 32: i32, 64: i64}[bits]

    def apply(a, c):
        if kind == "sra":
            return (a.view(st) >> min(c, bits - 1)).view(t)
        if c >= bits:
            return np.zeros_like(a)
        return (a << t(c)) if kind == "sll" else (a >> t(c))

    def with_imm(n, imm, a):
        return apply(a, imm & 0xFF)

    def with_count(n, a, cnt):
        return apply(a, int(cnt.view(u64)[0]))
    return with_imm, with_count


def _shift_var(kind: str, t):
    bits = np.dtype(t).itemsize * 8
    st = {32: i32, 64: i64}[bits]

    def f(n, a, c):
        c = c.astype(u64)
        big = c >= bits
        cc = np.minimum(c, bits - 1).astype(t)
        if kind == "sra":
            return (a.view(st) >> cc.view(st)).view(t)
        r = (a << cc) if kind == "sll" else (a >> cc)
        return np.where(big, t(0), r)
    return f


def _sat(x, t):
    info = np.iinfo(t)
    return np.clip(x, info.min, info.max).astype(t)


def _pack(tin, tout):
    """vpack*: per 128-bit lane, saturate a's then b's elements."""
    per = 16 // np.dtype(tin).itemsize

    def f(n, a, b):
        la, lb = _lanes128(a.astype(i64), per), _lanes128(b.astype(i64), per)
        return _sat(np.concatenate([la, lb], axis=1), tout).reshape(-1)
    return f


def _unpack(high: bool, t):
    per = 16 // np.dtype(t).itemsize
    h = per // 2

    def f(n, a, b):
        la, lb = _lanes128(a, per), _lanes128(b, per)
        sl = slice(h, per) if high else slice(0, h)
        return np.stack([la[:, sl], lb[:, sl]], axis=2).reshape(-1)
    return f


def _maddwd(n, a, b):
    p = a.astype(i64) * b.astype(i64)
    return (p[0::2] + p[1::2]).astype(i32)


def _maddubsw(n, a, b):
    p = a.view(u8).astype(i32) * b.view(i8).astype(i32)
    return _sat(p[0::2] + p[1::2], i16)


def _extend(t):
    def f(n, a):
        return a[:n].astype(t)
    return f


# ---- permutes and moves -----------------------------------------------------------------------

def _ident(n, a):
    return a


def _permvar(n, idx, table):
    return table[idx.astype(i64) & (len(table) - 1)]


def _permq_imm(n, imm, a):
    q = a.reshape(-1, 4)
    sel = [(imm >> (2 * j)) & 3 for j in range(4)]
    return q[:, sel].reshape(-1)


def _perm2x128(n, imm, a, b):
    halves = np.concatenate([a.reshape(2, -1), b.reshape(2, -1)])
    out = [np.zeros_like(halves[0]) if (imm >> (4 * j + 3)) & 1 else halves[(imm >> (4 * j)) & 3]
           for j in range(2)]
    return np.concatenate(out)


def _insert(block: int):
    def f(n, imm, a, b):
        r = a.copy()
        w = block // a.itemsize
        j = imm & (len(a) // w - 1)
        r[j * w:(j + 1) * w] = b[:w]
        return r
    return f


def _extract(block: int):
    def f(n, imm, a):
        w = block // a.itemsize
        j = imm & (len(a) // w - 1)
        return a[j * w:(j + 1) * w]
    return f


def _shufps(n, imm, a, b):
    la, lb = a.reshape(-1, 4), b.reshape(-1, 4)
    s = [imm & 3, (imm >> 2) & 3, (imm >> 4) & 3, (imm >> 6) & 3]
    return np.concatenate([la[:, s[:2]], lb[:, s[2:]]], axis=1).reshape(-1)


def _pshufd(n, imm, a):
    la = a.reshape(-1, 4)
    return la[:, [(imm >> (2 * j)) & 3 for j in range(4)]].reshape(-1)


def _permilps_var(n, a, c):
    la = a.reshape(-1, 4)
    idx = (c.view(u32).reshape(-1, 4) & 3).astype(i64)
    return np.take_along_axis(la, idx, axis=1).reshape(-1)


def _pshufb(n, a, c):
    la = a.reshape(-1, 16)
    cc = c.reshape(-1, 16)
    r = np.take_along_axis(la, (cc & 15).astype(i64), axis=1)
    return np.where(cc & 0x80, u8(0), r).reshape(-1)


def _byteshift(left: bool):
    def f(n, imm, a):
        la = a.reshape(-1, 16)
        s = min(imm, 16)
        r = np.zeros_like(la)
        if left:
            r[:, s:] = la[:, :16 - s]
        else:
            r[:, :16 - s] = la[:, s:]
        return r.reshape(-1)
    return f


def _broadcast(n, a):
    return np.full(n, a[0], a.dtype)


def _broadcast_block(n, a):
    return np.tile(a, n // len(a))


def _blendv(n, a, b, msk):
    """vblendvps/vpblendvb: lane from b where the mask lane's sign bit is set."""
    sign = msk.view({1: i8, 4: i32}[msk.itemsize]) < 0
    return np.where(sign, b, a)


def _blend_imm(n, imm, a, b):
    sel = np.array([(imm >> (j % 8)) & 1 for j in range(len(a))], bool)
    return np.where(sel, b, a)


def _movdup(odd: bool):
    def f(n, a):
        return np.repeat(a[1::2] if odd else a[0::2], 2)
    return f


def _hadd(n, a, b):
    la, lb = a.reshape(-1, 4), b.reshape(-1, 4)
    ra = fbin(np.add)(0, la[:, 0::2].reshape(-1), la[:, 1::2].reshape(-1)).reshape(-1, 2)
    rb = fbin(np.add)(0, lb[:, 0::2].reshape(-1), lb[:, 1::2].reshape(-1)).reshape(-1, 2)
    return np.concatenate([ra, rb], axis=1).reshape(-1)


def _cmpps_fn(n, imm, a, b):
    """vcmpps predicate imm[4:0]: (relation, value when unordered); signalling = quiet here."""
    p = imm & 31
    rel = p & 7
    unord = np.isnan(a) | np.isnan(b)
    base = {0: a == b, 1: a < b, 2: a <= b, 3: unord, 4: a != b, 5: ~(a < b), 6: ~(a <= b),
            7: ~unord}[rel]
    if rel in (0, 1, 2):
        r = base & ~unord
    elif rel in (4, 5, 6):
        r = base | unord
    else:
        r = base
    if p & 8:  # EQ_UQ, NGE, NGT, FALSE, NEQ_OQ, GE, GT, TRUE
        r = {0: (a == b) | unord, 1: ~(a >= b) | unord, 2: ~(a > b) | unord, 3: np.zeros_like(unord),
             4: (a != b) & ~unord, 5: (a >= b) & ~unord, 6: (a > b) & ~unord,
             7: np.ones_like(unord)}[rel]
    return r


def _to_vector_mask(boolfn, t):
    """Make a bool-returning lane fn return all-ones lanes (VEX compares)."""
    def f(n, *args):
        r = boolfn(n, *args)
        return np.where(r, ONES[t], t(0)).astype(t)
    return f


class _Either:
    """Builder choosing between a k-destination (EVEX) and a vector-destination (VEX) form."""

    def __init__(self, kform, vform, ref):
        self.kform, self.vform, self.ref = kform, vform, ref

    def __call__(self, m, ins):
        if ins.op_kind(0) == OpKind.REGISTER and RegisterExt.is_k(ins.op0_register):
            return self.kform(m, ins)
        return self.vform(m, ins)


def _cmp(boolfn, t, ref, imm=False):
    return _Either(vop(boolfn, t, u8, imm=imm, kdst=True),
                   vop(_to_vector_mask(boolfn, {1: u8, 2: u16, 4: u32, 8: u64}[np.dtype(t).itemsize]),
                       t, {1: u8, 2: u16, 4: u32, 8: u64}[np.dtype(t).itemsize], imm=imm), ref)


class _ImmOrVar:
    """Shift/permute families whose last operand is either an immediate or a register/memory."""

    def __init__(self, with_imm, with_var, ref):
        self.with_imm, self.with_var, self.ref = with_imm, with_var, ref

    def __call__(self, m, ins):
        last = ins.op_kind(ins.op_count - 1)
        return (self.with_var if last in (OpKind.REGISTER, OpKind.MEMORY) else self.with_imm)(m, ins)


def _shift_family(kind, t, ref):
    wi, wc = _shift_imm_or_xmm(kind, t)
    return _ImmOrVar(vop(wi, t, imm=True), vop(wc, t), ref)


# ---- special builders -------------------------------------------------------------------------

@sem("vmovss/vmovsd: load zero-extends; reg form merges lane 0 into src1; store writes lane 0")
def _movs(m, ins):
    t = u32 if ins.mnemonic == Mn.VMOVSS else u64
    if ins.op_mask != Register.NONE:
        refuse(ins, "masked vmovss")
    if ins.op_count == 3:
        return vop(lambda n, a, b: np.concatenate([b[:1], a[1:16 // a.itemsize]]), t)(m, ins)
    if ins.op_kind(0) == OpKind.MEMORY:
        return vop(lambda n, a: a[:1], t)(m, ins)
    return vop(lambda n, a: np.concatenate([a, np.zeros(16 // a.itemsize - 1, a.dtype)]), t)(m, ins)


@sem("vmovd/vmovq: GPR or m32/m64 <-> low lane of xmm, upper zeroed")
def _movdq(m, ins):
    size = 4 if ins.mnemonic == Mn.VMOVD else 8
    t = u32 if size == 4 else u64
    k0 = ins.op_kind(0)
    if k0 == OpKind.REGISTER and RegisterExt.is_vector_register(ins.op0_register):
        return vop(lambda n, a: np.concatenate([a[:1], np.zeros(16 // size - 1, t)]), t)(m, ins)
    src = m.v[vec_index(ins.op1_register)].view(t)
    _, wr = operand_rw(m, ins, 0, size)
    nxt = ins.next_ip

    def step():
        wr(int(src[0]))
        return nxt
    return step


def _pinsr(n, imm, a, b):
    """vpinsr[bwdq]: a's xmm with element imm replaced by the low element of b (GPR or memory)."""
    r = a[:16 // a.itemsize].copy()
    r[imm & (len(r) - 1)] = b[0]
    return r


_PEXTR = {Mn.VPEXTRB: u8, Mn.VPEXTRW: u16, Mn.VPEXTRD: u32, Mn.VPEXTRQ: u64}


@sem("vpextr[bwdq]: GPR (zero-extended) or memory = xmm element imm")
def _pextr(m, ins):
    t = _PEXTR[ins.mnemonic]
    size = np.dtype(t).itemsize
    src = m.v[vec_index(ins.op1_register), :16].view(t)
    j = ins.immediate(2) & (16 // size - 1)
    _, wr = operand_rw(m, ins, 0, size if ins.op_kind(0) == OpKind.MEMORY else None)
    nxt = ins.next_ip

    def step():
        wr(int(src[j]))
        return nxt
    return step


@sem("vmovmskps/vpmovmskb: GPR = sign bits of the lanes")
def _movmsk(m, ins):
    t = i32 if ins.mnemonic == Mn.VMOVMSKPS else i8
    src = m.v[vec_index(ins.op1_register), :RegisterExt.size(ins.op1_register)].view(t)
    wr = gpr_writer(m, ins.op0_register)
    nxt = ins.next_ip

    def step():
        wr(pack_bits(src < 0))
        return nxt
    return step


@sem("vptest: ZF = (a & b) == 0, CF = (~a & b) == 0")
def _ptest(m, ins):
    ra, rb = reader(m, ins, 0, u64), reader(m, ins, 1, u64)
    f, nxt = m.fl, ins.next_ip

    def step():
        a, b = ra(), rb()
        f[1], f[0] = not (a & b).any(), not (~a & b).any()
        f[2] = f[3] = 0
        return nxt
    return step


@sem("vmaskmovps/vpmaskmovd/q: lanes with the mask sign bit set move; others not accessed, loads zero them")
def _maskmov(m, ins):
    t = u64 if ins.mnemonic == Mn.VPMASKMOVQ else u32
    st = i64 if t is u64 else i32
    if ins.op_kind(0) == OpKind.MEMORY:  # store: [mem], mask, src
        mk, src = reader(m, ins, 1, st), reader(m, ins, 2, t)
        from .lanes import writer
        wr = writer(m, ins, t)
        nxt = ins.next_ip

        def step():
            wr(src(), mk() < 0)
            return nxt
        return step
    mk = reader(m, ins, 1, st)
    rd = mem_reader(m, ins, t)
    dst = m.v[vec_index(ins.op0_register)]
    nxt = ins.next_ip

    def step():
        bits = mk() < 0
        v = np.where(bits, rd(bits), t(0)).astype(t)
        dst[:v.nbytes] = v.view(u8)
        dst[v.nbytes:] = 0
        return nxt
    return step


@sem("vzeroupper: zero bits 128 and up of zmm0-15; vzeroall: zero zmm0-15")
def _vzero(m, ins):
    v, nxt = m.v, ins.next_ip
    upper = ins.mnemonic == Mn.VZEROUPPER

    def step():
        v[:16, 16 if upper else 0:] = 0
        return nxt
    return step


def _vop_fma(order, np_, na, scalar=False):
    sign = ("-" if np_ else "") + "a*b" + (" - c" if na else " + c")
    return vop(_fma(order, np_, na, scalar), f32, acc=True, scalar=scalar,
               ref=f"{order}: dst = {sign} (one rounding; NaN priority a, b, c)")


def _table():
    t = {}
    F = f32

    def add(mn, b, ref=None):
        if ref is not None:
            b = with_ref(b, ref)
        t[mn] = b

    for name, op, sym in (("ADD", np.add, "+"), ("SUB", np.subtract, "-"), ("MUL", np.multiply, "*"),
                          ("DIV", np.divide, "/")):
        add(getattr(Mn, f"V{name}PS"), vop(fbin(op), F, ref=f"dst[i] = a[i] {sym} b[i] (fp32, RNE; x86 NaN rules)"))
        add(getattr(Mn, f"V{name}SS"), vop(_scalar(fbin(op)), F, scalar=True, ref=f"dst[0] = a[0] {sym} b[0]; dst[1:4] = a[1:4]"))
    add(Mn.VMAXPS, vop(_fmax, F, ref="dst[i] = a[i] > b[i] ? a[i] : b[i] (NaN/zeros -> b)"))
    add(Mn.VMINPS, vop(_fmin, F, ref="dst[i] = a[i] < b[i] ? a[i] : b[i] (NaN/zeros -> b)"))
    add(Mn.VMAXSS, vop(_scalar(_fmax), F, scalar=True, ref="scalar vmaxps on lane 0"))
    add(Mn.VMINSS, vop(_scalar(_fmin), F, scalar=True, ref="scalar vminps on lane 0"))
    add(Mn.VSQRTPS, vop(fsqrt, F, ref="dst[i] = sqrt(a[i]) (RNE; negative -> default NaN)"))
    add(Mn.VSQRTSS, vop(lambda n, a, b: np.concatenate([fsqrt(1, b[:1]), a[1:4]]), F, scalar=True,
                        ref="dst[0] = sqrt(b[0]); dst[1:4] = a[1:4]"))
    add(Mn.VRCPPS, vop(approx("rcp", 12, True), F, ref="dst = 1/a rounded to 12 bits (|rel err| <= 2^-12; DAZ/FTZ)"))
    add(Mn.VRSQRTPS, vop(approx("rsqrt", 12, True), F, ref="dst = 1/sqrt(a) rounded to 12 bits (DAZ/FTZ)"))
    add(Mn.VRCP14PS, vop(approx("rcp", 14, False), F, ref="dst = 1/a rounded to 14 bits (|rel err| <= 2^-14)"))
    add(Mn.VRSQRT14PS, vop(approx("rsqrt", 14, False), F, ref="dst = 1/sqrt(a) rounded to 14 bits"))
    add(Mn.VSCALEFPS, vop(scalef, F, ref="dst = a * 2^floor(b)"))
    add(Mn.VGETEXPPS, vop(getexp, F, ref="dst = floor(log2(|a|))"))
    add(Mn.VROUNDPS, vop(round_ps, F, imm=True, ref="dst = round(a) per imm[1:0] (imm[2]: MXCSR; imm[7:4] ignored)"))
    add(Mn.VRNDSCALEPS, vop(roundscale, F, imm=True, ref="dst = round(a * 2^M) / 2^M, M = imm[7:4]"))
    add(Mn.VHADDPS, vop(_hadd, F, ref="per 128-bit lane: [a0+a1, a2+a3, b0+b1, b2+b3]"))
    for kind, np_, na in (("MADD", 0, 0), ("MSUB", 0, 1), ("NMADD", 1, 0), ("NMSUB", 1, 1)):
        for order in ("132", "213", "231"):
            add(getattr(Mn, f"VF{kind}{order}PS"), _vop_fma(order, np_, na))
            add(getattr(Mn, f"VF{kind}{order}SS"), _vop_fma(order, np_, na, scalar=True))
    for name, op in (("AND", np.bitwise_and), ("OR", np.bitwise_or), ("XOR", np.bitwise_xor),
                     ("ANDN", lambda a, b: ~a & b)):
        ref = f"dst = {'~a & b' if name == 'ANDN' else 'a ' + name.lower() + ' b'} (bitwise)"
        lf = (lambda op: lambda n, a, b: op(a, b))(op)
        add(getattr(Mn, f"V{name}PS"), vop(lf, u32, ref=ref))
        add(getattr(Mn, f"V{name}PD"), vop(lf, u64, ref=ref))
        add(getattr(Mn, f"VP{name}"), vop(lf, u64, ref=ref))
        add(getattr(Mn, f"VP{name}D"), vop(lf, u32, ref=ref))
        add(getattr(Mn, f"VP{name}Q"), vop(lf, u64, ref=ref))
    for suffix, ty in (("B", u8), ("W", u16), ("D", u32), ("Q", u64)):
        add(getattr(Mn, f"VPADD{suffix}"), vop(lambda n, a, b: a + b, ty, ref="dst = a + b (wraps)"))
        add(getattr(Mn, f"VPSUB{suffix}"), vop(lambda n, a, b: a - b, ty, ref="dst = a - b (wraps)"))
        sty = {u8: i8, u16: i16, u32: i32, u64: i64}[ty]
        add(getattr(Mn, f"VPCMPEQ{suffix}"), _cmp(lambda n, a, b: a == b, ty, "dst = a == b (all-ones lanes or k bits)"))
        add(getattr(Mn, f"VPCMPGT{suffix}"), _cmp(lambda n, a, b: a > b, sty, "dst = a > b signed"))
    add(Mn.VPMULLD, vop(lambda n, a, b: a * b, u32, ref="dst = low32(a * b)"))
    add(Mn.VPMULLW, vop(lambda n, a, b: a * b, u16, ref="dst = low16(a * b)"))
    add(Mn.VPMULUDQ, vop(lambda n, a, b: (a & 0xFFFFFFFF) * (b & 0xFFFFFFFF), u64, ref="dst.q = a.lo32 * b.lo32 unsigned"))
    add(Mn.VPMULDQ, vop(lambda n, a, b: (a.view(i32)[0::2].astype(i64) * b.view(i32)[0::2]), u64,
                        ref="dst.q = a.lo32 * b.lo32 signed"))
    for name, fn, ty in (("VPMAXSD", np.maximum, i32), ("VPMINSD", np.minimum, i32),
                         ("VPMAXUD", np.maximum, u32), ("VPMINUD", np.minimum, u32),
                         ("VPMAXSW", np.maximum, i16), ("VPMINSW", np.minimum, i16),
                         ("VPMAXUB", np.maximum, u8), ("VPMINUB", np.minimum, u8)):
        add(getattr(Mn, name), vop((lambda fn: lambda n, a, b: fn(a, b))(fn), ty, ref=f"dst = {fn.__name__}(a, b)"))
    add(Mn.VPABSD, vop(lambda n, a: np.abs(a).view(i32), i32, ref="dst = |a| (INT_MIN stays)"))
    for kind in ("sll", "srl", "sra"):
        for suffix, ty in (("W", u16), ("D", u32), ("Q", u64)):
            add(getattr(Mn, f"VP{kind.upper()}{suffix}"),
                _shift_family(kind, ty, f"dst = a {kind} count (imm or xmm[63:0]; >= width: 0 or sign)"))
        for suffix, ty in (("VD", u32), ("VQ", u64)):
            add(getattr(Mn, f"VP{kind.upper()}{suffix}"), vop(_shift_var(kind, ty), ty, ref=f"dst[i] = a[i] {kind} b[i]"))
    add(Mn.VPSLLDQ, vop(_byteshift(True), u8, imm=True, ref="per 128-bit lane: bytes << imm"))
    add(Mn.VPSRLDQ, vop(_byteshift(False), u8, imm=True, ref="per 128-bit lane: bytes >> imm"))
    add(Mn.VCMPPS, _cmp(_cmpps_fn, F, "dst = predicate imm[4:0](a, b)", imm=True))
    add(Mn.VPMADDWD, vop(_maddwd, i16, i32, ref="dst.d = a.w[2i]*b.w[2i] + a.w[2i+1]*b.w[2i+1]"))
    add(Mn.VPMADDUBSW, vop(_maddubsw, u8, i16, ref="dst.w = sat16(u8 a * s8 b, pairs)"))
    for name, tin, tout in (("VPACKSSDW", i32, i16), ("VPACKUSDW", i32, u16), ("VPACKSSWB", i16, i8),
                            ("VPACKUSWB", i16, u8)):
        add(getattr(Mn, name), vop(_pack(tin, tout), tin, tout, ref="per 128-bit lane: sat(a), sat(b)"))
    for name, ty in (("BW", u8), ("WD", u16), ("DQ", u32), ("QDQ", u64)):
        add(getattr(Mn, f"VPUNPCKL{name}"), vop(_unpack(False, ty), ty, ref="per 128-bit lane: interleave low halves"))
        add(getattr(Mn, f"VPUNPCKH{name}"), vop(_unpack(True, ty), ty, ref="per 128-bit lane: interleave high halves"))
    add(Mn.VUNPCKLPS, vop(_unpack(False, u32), u32, ref="interleave low fp32 per lane"))
    add(Mn.VUNPCKHPS, vop(_unpack(True, u32), u32, ref="interleave high fp32 per lane"))
    add(Mn.VUNPCKLPD, vop(_unpack(False, u64), u64, ref="interleave low fp64 per lane"))
    add(Mn.VUNPCKHPD, vop(_unpack(True, u64), u64, ref="interleave high fp64 per lane"))
    for s, ty in (("BW", (u8, u16, i8, i16)), ("BD", (u8, u32, i8, i32)), ("BQ", (u8, u64, i8, i64)),
                  ("WD", (u16, u32, i16, i32)), ("WQ", (u16, u64, i16, i64)), ("DQ", (u32, u64, i32, i64))):
        add(getattr(Mn, f"VPMOVZX{s}"), vop(_extend(ty[1]), ty[0], ty[1], ref="dst[i] = zero-extend(a[i])"))
        add(getattr(Mn, f"VPMOVSX{s}"), vop(_extend(ty[3]), ty[2], ty[3], ref="dst[i] = sign-extend(a[i])"))
    add(Mn.VCVTPS2DQ, vop(cvt_f32_i32(False), F, i32, ref="dst = int32(rint(a)); NaN/overflow -> 0x80000000"))
    add(Mn.VCVTTPS2DQ, vop(cvt_f32_i32(True), F, i32, ref="dst = int32(trunc(a)); NaN/overflow -> 0x80000000"))
    add(Mn.VCVTDQ2PS, vop(lambda n, a: a.astype(F), i32, F, ref="dst = float(a) (RNE)"))
    add(Mn.VCVTUDQ2PS, vop(lambda n, a: a.astype(F), u32, F, ref="dst = float(unsigned a) (RNE)"))
    for name, ty, al in (("VMOVUPS", u32, 0), ("VMOVAPS", u32, 1), ("VMOVUPD", u64, 0), ("VMOVAPD", u64, 1),
                         ("VMOVDQU", u8, 0), ("VMOVDQA", u8, 1), ("VMOVNTPS", u32, 1), ("VMOVNTDQ", u8, 1),
                         ("VMOVNTDQA", u8, 1)):
        add(getattr(Mn, name), vop(_ident, ty, aligned=bool(al),
                                   ref="dst = src" + (" (#GP unless aligned to the operand size)" if al else "")))
    add(Mn.VMOVSS, _movs)
    add(Mn.VMOVSD, _movs)
    add(Mn.VMOVD, _movdq)
    add(Mn.VMOVQ, _movdq)
    add(Mn.VMOVSHDUP, vop(_movdup(True), u32, ref="dst = a[1,1,3,3,...]"))
    add(Mn.VMOVSLDUP, vop(_movdup(False), u32, ref="dst = a[0,0,2,2,...]"))
    add(Mn.VMOVMSKPS, _movmsk)
    add(Mn.VPMOVMSKB, _movmsk)
    add(Mn.VPTEST, _ptest)
    for mn, ty in _PEXTR.items():
        add(mn, _pextr)
        add(getattr(Mn, MNEMONIC_NAME[mn].upper().replace("EXTR", "INSR")),
            vop(_pinsr, ty, imm=True, ref="dst = a with element imm = low element of b; upper zeroed"))
    add(Mn.VMASKMOVPS, _maskmov)
    add(Mn.VPMASKMOVD, _maskmov)
    add(Mn.VPMASKMOVQ, _maskmov)
    add(Mn.VZEROUPPER, _vzero)
    add(Mn.VZEROALL, _vzero)
    for name, ty in (("VBROADCASTSS", u32), ("VBROADCASTSD", u64), ("VPBROADCASTB", u8),
                     ("VPBROADCASTW", u16), ("VPBROADCASTD", u32), ("VPBROADCASTQ", u64)):
        add(getattr(Mn, name), vop(_broadcast, ty, ref="dst[i] = src[0] (xmm, memory or GPR)"))
    for name, ty in (("VBROADCASTF128", u32), ("VBROADCASTI128", u32), ("VBROADCASTF32X4", u32),
                     ("VBROADCASTI32X4", u32), ("VBROADCASTF64X4", u64), ("VBROADCASTI64X4", u64),
                     ("VBROADCASTF32X8", u32), ("VBROADCASTI32X8", u32), ("VBROADCASTF64X2", u64),
                     ("VBROADCASTI64X2", u64)):
        add(getattr(Mn, name), vop(_broadcast_block, ty, ref="dst = src block repeated"))
    add(Mn.VPERMPS, vop(_permvar, u32, ref="dst[i] = b[a[i] mod n] (a: indices)"))
    add(Mn.VPERMD, vop(_permvar, u32, ref="dst[i] = b[a[i] mod n]"))
    add(Mn.VPERMW, vop(_permvar, u16, ref="dst[i] = b[a[i] mod n]"))
    add(Mn.VPERMQ, _ImmOrVar(vop(_permq_imm, u64, imm=True), vop(_permvar, u64),
                             "dst.q[i] = a.q[imm[2i+1:2i]] per 256 bits, or b[a[i] mod n]"))
    add(Mn.VPERMPD, t[Mn.VPERMQ])
    add(Mn.VPERM2F128, vop(_perm2x128, u32, imm=True, ref="each 128-bit half = one of a.lo a.hi b.lo b.hi or 0"))
    add(Mn.VPERM2I128, t[Mn.VPERM2F128])
    for name, block, ty in (("VINSERTF128", 16, u32), ("VINSERTI128", 16, u32), ("VINSERTF32X4", 16, u32),
                            ("VINSERTI32X4", 16, u32), ("VINSERTF64X4", 32, u64), ("VINSERTI64X4", 32, u64),
                            ("VINSERTF64X2", 16, u64), ("VINSERTI64X2", 16, u64), ("VINSERTF32X8", 32, u32),
                            ("VINSERTI32X8", 32, u32)):
        add(getattr(Mn, name), vop(_insert(block), ty, imm=True, ref=f"dst = a with {8 * block}-bit block imm = b"))
        ext = name.replace("INSERT", "EXTRACT")
        add(getattr(Mn, ext), vop(_extract(block), ty, imm=True, ref=f"dst = {8 * block}-bit block imm of a"))
    add(Mn.VSHUFPS, vop(_shufps, u32, imm=True, ref="per lane: a[imm0], a[imm1], b[imm2], b[imm3]"))
    add(Mn.VPSHUFD, vop(_pshufd, u32, imm=True, ref="per lane: a[imm fields]"))
    add(Mn.VPERMILPS, _ImmOrVar(vop(_pshufd, u32, imm=True), vop(_permilps_var, u32),
                                "per lane: a[imm fields] or a[b[i] & 3]"))
    add(Mn.VPSHUFB, vop(_pshufb, u8, ref="per lane: b[i] & 0x80 ? 0 : a[b[i] & 15]"))
    add(Mn.VBLENDVPS, vop(_blendv, u32, ref="dst[i] = sign(m[i]) ? b[i] : a[i]"))
    add(Mn.VPBLENDVB, vop(_blendv, u8, ref="dst.b[i] = sign(m.b[i]) ? b[i] : a[i]"))
    add(Mn.VBLENDPS, vop(_blend_imm, u32, imm=True, ref="dst[i] = imm[i % 8] ? b[i] : a[i]"))
    add(Mn.VPBLENDD, vop(_blend_imm, u32, imm=True, ref="dst[i] = imm[i % 8] ? b[i] : a[i]"))
    return t


VEC = _table()
