"""The A64 + SVE encoding table: one row per instruction form.

A row is ``mnemonic  base-opcode  sizes  operand tokens``. ``sizes`` lists the element sizes the row
expands to (``T`` in tokens is replaced by each; the size goes to bits 22-23 unless the column ends in
``!``, meaning an operand kind encodes it), or ``-`` for a single form. Operand tokens name operand
kinds (see :func:`kind`): ``Zd.T`` a vector in bits 0-4, ``Pg/M`` a merging governing predicate in
bits 10-12, ``=0`` "same register as operand 1", ``[x,u12*8]`` an unsigned scaled offset, and so on.
Every form is checked against capstone's disassembly by ``tests/aarch64/test_encodings.py``.

>>> f = FORMS["fmla"][0]
>>> f, hex(f.base)
(fmla Zd.H, Pg/M(p0-p7), Zn.H, Zm.H, '0x65600000')
"""
from __future__ import annotations

import re
import struct
from functools import lru_cache

from .operands import (ASR, LSL, LSR, Choice, Gpr, Imm, Kind, LabelKind, MemKind, Pr, ShiftKind, Tied,
                       Vr, ZIndexed, ZList, ZMemKind, Zr, imm_text)

SIZE_BITS = {"b": 0, "h": 1, "s": 2, "d": 3}
ESIZE = {"b": 8, "h": 16, "s": 32, "d": 64}
CONDS = dict(zip("eq ne hs lo mi pl vs vc hi ls ge lt gt le al".split(), range(15)))
PATTERNS = {"pow2": 0, **{f"vl{i}": i for i in range(1, 9)}, "vl16": 9, "vl32": 10, "vl64": 11,
            "vl128": 12, "vl256": 13, "mul4": 29, "mul3": 30, "all": 31}

TABLE = """
# ---- A64 integer arithmetic and logic
add      91000000 -   Xd|SP Xn|SP #u12 sh12
add      11000000 -   Wd|SP Wn|SP #u12 sh12
sub      d1000000 -   Xd|SP Xn|SP #u12 sh12
sub      51000000 -   Wd|SP Wn|SP #u12 sh12
adds     b1000000 -   Xd Xn|SP #u12 sh12
subs     f1000000 -   Xd Xn|SP #u12 sh12
cmp      f100001f -   Xn|SP #u12 sh12
cmp      7100001f -   Wn|SP #u12 sh12
add      8b000000 -   Xd Xn Xm shift64
add      0b000000 -   Wd Wn Wm shift32
sub      cb000000 -   Xd Xn Xm shift64
sub      4b000000 -   Wd Wn Wm shift32
adds     ab000000 -   Xd Xn Xm shift64
subs     eb000000 -   Xd Xn Xm shift64
cmp      eb00001f -   Xn Xm shift64
cmp      6b00001f -   Wn Wm shift32
and      8a000000 -   Xd Xn Xm shift64
orr      aa000000 -   Xd Xn Xm shift64
eor      ca000000 -   Xd Xn Xm shift64
ands     ea000000 -   Xd Xn Xm shift64
tst      ea00001f -   Xn Xm shift64
and      92000000 -   Xd|SP Xn #bitmask64
orr      b2000000 -   Xd|SP Xn #bitmask64
eor      d2000000 -   Xd|SP Xn #bitmask64
ands     f2000000 -   Xd Xn #bitmask64
tst      f200001f -   Xn #bitmask64
and      12000000 -   Wd|SP Wn #bitmask32
orr      32000000 -   Wd|SP Wn #bitmask32
mov      aa0003e0 -   Xd Xm
mov      2a0003e0 -   Wd Wm
mov      91000000 -   Xd|SP Xn|SP
mov      d2800000 -   Xd #u16
mov      52800000 -   Wd #u16
movz     d2800000 -   Xd #u16 hw64
movz     52800000 -   Wd #u16 hw32
movk     f2800000 -   Xd #u16 hw64
movk     72800000 -   Wd #u16 hw32
movn     92800000 -   Xd #u16 hw64
madd     9b000000 -   Xd Xn Xm Xa
msub     9b008000 -   Xd Xn Xm Xa
mul      9b007c00 -   Xd Xn Xm
mul      1b007c00 -   Wd Wn Wm
udiv     9ac00800 -   Xd Xn Xm
sdiv     9ac00c00 -   Xd Xn Xm
lsl      9ac02000 -   Xd Xn Xm
lsr      9ac02400 -   Xd Xn Xm
asr      9ac02800 -   Xd Xn Xm
lsl      d3400000 -   Xd Xn #lsl64
lsr      d340fc00 -   Xd Xn #lsr64
asr      9340fc00 -   Xd Xn #lsr64
csel     9a800000 -   Xd Xn Xm cond
adr      10000000 -   Xd label21
# ---- A64 loads and stores
ldr      f9400000 -   Xt [x,u12*8]
ldr      f8400c00 -   Xt [x,s9]!
ldr      f8400400 -   Xt [x],s9
ldr      f8606800 -   Xt [x,x{lsl3}]
ldr      b9400000 -   Wt [x,u12*4]
ldr      b8606800 -   Wt [x,x{lsl2}]
ldr      fd400000 -   Dt [x,u12*8]
ldr      fc400c00 -   Dt [x,s9]!
ldr      fc400400 -   Dt [x],s9
ldr      b8400400 -   Wt [x],s9
ldrb     39400000 -   Wt [x,u12*1]
ldrb     38400400 -   Wt [x],s9
ldrh     79400000 -   Wt [x,u12*2]
ldrh     78400400 -   Wt [x],s9
ldur     f8400000 -   Xt [x,s9]
str      f9000000 -   Xt [x,u12*8]
str      f8000c00 -   Xt [x,s9]!
str      f8000400 -   Xt [x],s9
str      f8206800 -   Xt [x,x{lsl3}]
str      b9000000 -   Wt [x,u12*4]
str      b8206800 -   Wt [x,x{lsl2}]
str      fd000000 -   Dt [x,u12*8]
str      fc000c00 -   Dt [x,s9]!
str      fc000400 -   Dt [x],s9
str      bd000000 -   St [x,u12*4]
str      7d000000 -   Ht [x,u12*2]
str      b8000400 -   Wt [x],s9
strb     39000000 -   Wt [x,u12*1]
strb     38000400 -   Wt [x],s9
strh     79000000 -   Wt [x,u12*2]
strh     78000400 -   Wt [x],s9
stur     f8000000 -   Xt [x,s9]
ldp      a9400000 -   Xt Xt2 [x,s7*8]
ldp      a9c00000 -   Xt Xt2 [x,s7*8]!
ldp      a8c00000 -   Xt Xt2 [x],s7*8
stp      a9000000 -   Xt Xt2 [x,s7*8]
stp      a9800000 -   Xt Xt2 [x,s7*8]!
stp      a8800000 -   Xt Xt2 [x],s7*8
ldp      6d400000 -   Dt Dt2 [x,s7*8]
ldp      6dc00000 -   Dt Dt2 [x,s7*8]!
ldp      6cc00000 -   Dt Dt2 [x],s7*8
stp      6d000000 -   Dt Dt2 [x,s7*8]
stp      6d800000 -   Dt Dt2 [x,s7*8]!
stp      6c800000 -   Dt Dt2 [x],s7*8
# LSE atomics (ARMv8.1): Xs in bits 16-20 is added to [Xn|SP]; Xt receives the old value
ldaddal  f8e00000 -   Xm Xt [x]
ldaddal  b8e00000 -   Wm Wt [x]
swpal    f8e08000 -   Xm Xt [x]
swpal    b8e08000 -   Wm Wt [x]
# load-acquire / store-release (a release store followed by an acquire load stays in order)
ldar     c8dffc00 -   Xt [x]
ldar     88dffc00 -   Wt [x]
stlr     c89ffc00 -   Xt [x]
stlr     889ffc00 -   Wt [x]
# ---- A64 branches and system
b        14000000 -   label26
bl       94000000 -   label26
b.{cond} 54000000 -   label19
cbz      b4000000 -   Xt label19
cbnz     b5000000 -   Xt label19
cbz      34000000 -   Wt label19
cbnz     35000000 -   Wt label19
ret      d65f0000 -   Xn=x30
br       d61f0000 -   Xn
blr      d63f0000 -   Xn
svc      d4000001 -   #svc
nop      d503201f -
yield    d503203f -
mrs      d53b4400 -   Xt fpcr
msr      d51b4400 -   fpcr Xt
# ---- SVE predicates, counts, vector length
ptrue    2518e000 bhsd  Pd.T pattern
ptrues   2519e000 bhsd  Pd.T pattern
pfalse   2518e400 -     Pd.b
whilelo  25201c00 bhsd  Pd.T Xn Xm16
punpklo  05304000 -     Pd.h Pn.b
eor      25004200 -     Pd.b Pg4/Z Pn.b Pm.b
punpkhi  05314000 -     Pd.h Pn.b
uzp1     05204800 bhsd  Pd.T Pn.T Pm.T
whilelo  25200c00 bhsd  Pd.T Wn Wm16
whilelt  25201400 bhsd  Pd.T Xn Xm16
cntb     0420e000 -     Xd pattern mul
cnth     0460e000 -     Xd pattern mul
cntw     04a0e000 -     Xd pattern mul
cntd     04e0e000 -     Xd pattern mul
incb     0430e000 -     Xd pattern mul
inch     0470e000 -     Xd pattern mul
incw     04b0e000 -     Xd pattern mul
incd     04f0e000 -     Xd pattern mul
decb     0430e400 -     Xd pattern mul
decw     04b0e400 -     Xd pattern mul
addvl    04205000 -     Xd|SP Xn16|SP #s6
addpl    04605000 -     Xd|SP Xn16|SP #s6
rdvl     04bf5000 -     Xd #s6
# ---- SVE loads and stores
ld1w     a540a000 -     {Zt.s} Pg/Z [x,s4vl]
ld1w     a5404000 -     {Zt.s} Pg/Z [x,x,lsl2]
ld1h     a4a0a000 -     {Zt.h} Pg/Z [x,s4vl]
ld1h     a4a04000 -     {Zt.h} Pg/Z [x,x,lsl1]
ld1h     a4c0a000 -     {Zt.s} Pg/Z [x,s4vl]
ld1h     a4c04000 -     {Zt.s} Pg/Z [x,x,lsl1]
ld1b     a400a000 -     {Zt.b} Pg/Z [x,s4vl]
ld1b     a4004000 -     {Zt.b} Pg/Z [x,x]
ld1rw    8540c000 -     {Zt.s} Pg/Z [x,u6*4]
ld1rh    84c0a000 -     {Zt.h} Pg/Z [x,u6*2]
ld1rh    84c0c000 -     {Zt.s} Pg/Z [x,u6*2]
ld1rb    84408000 -     {Zt.b} Pg/Z [x,u6*1]
ld1rd    85c0e000 -     {Zt.d} Pg/Z [x,u6*8]
ld1rqw   a5002000 -     {Zt.s} Pg/Z [x,s4*16]
ld1rqh   a4802000 -     {Zt.h} Pg/Z [x,s4*16]
ld1rqh   a4800000 -     {Zt.h} Pg/Z [x,x,lsl1]
ld1rqb   a4002000 -     {Zt.b} Pg/Z [x,s4*16]
ld1w     85004000 -     {Zt.s} Pg/Z [x,zs,uxtw]
ld1h     84804000 -     {Zt.s} Pg/Z [x,zs,uxtw]
ld1b     84004000 -     {Zt.s} Pg/Z [x,zs,uxtw]
ld1d     c5c0c000 -     {Zt.d} Pg/Z [x,zd]
ld1d     a5e0a000 -     {Zt.d} Pg/Z [x,s4vl]
ld1d     a5e04000 -     {Zt.d} Pg/Z [x,x,lsl3]
st1d     e5e0e000 -     {Zt.d} Pg [x,s4vl]
st1d     e5e04000 -     {Zt.d} Pg [x,x,lsl3]
st1b     e440e000 -     {Zt.s} Pg [x,s4vl]
st1b     e4404000 -     {Zt.s} Pg [x,x]
st1w     e540e000 -     {Zt.s} Pg [x,s4vl]
st1w     e5404000 -     {Zt.s} Pg [x,x,lsl2]
st1h     e4a0e000 -     {Zt.h} Pg [x,s4vl]
st1h     e4a04000 -     {Zt.h} Pg [x,x,lsl1]
st1h     e4c0e000 -     {Zt.s} Pg [x,s4vl]
st1h     e4c04000 -     {Zt.s} Pg [x,x,lsl1]
st1b     e400e000 -     {Zt.b} Pg [x,s4vl]
st1b     e4004000 -     {Zt.b} Pg [x,x]
ldr      85804000 -     Zt [x,s9vl]
str      e5804000 -     Zt [x,s9vl]
ldr      85800000 -     Pt [x,s9vl]
str      e5800000 -     Pt [x,s9vl]
# ---- SVE floating point
fmla     65200000 hsd   Zd.T Pg/M Zn.T Zm.T
fmls     65202000 hsd   Zd.T Pg/M Zn.T Zm.T
fmad     65208000 hsd   Zd.T Pg/M Zn.T Zm.T
fmsb     6520a000 hsd   Zd.T Pg/M Zn.T Zm.T
fmla     64200000 h!    Zd.h Zn.h Zm.h[]
fmla     64a00000 s!    Zd.s Zn.s Zm.s[]
fmla     64e00000 d!    Zd.d Zn.d Zm.d[]
fadd     65000000 hsd   Zd.T Zn.T Zm.T
fsub     65000400 hsd   Zd.T Zn.T Zm.T
fmul     65000800 hsd   Zd.T Zn.T Zm.T
frecps   65001800 hsd   Zd.T Zn.T Zm.T
frsqrts  65001c00 hsd   Zd.T Zn.T Zm.T
fadd     65008000 hsd   Zd.T Pg/M =0 Zm5.T
fsub     65018000 hsd   Zd.T Pg/M =0 Zm5.T
fmul     65028000 hsd   Zd.T Pg/M =0 Zm5.T
fsubr    65038000 hsd   Zd.T Pg/M =0 Zm5.T
fmaxnm   65048000 hsd   Zd.T Pg/M =0 Zm5.T
fminnm   65058000 hsd   Zd.T Pg/M =0 Zm5.T
fmax     65068000 hsd   Zd.T Pg/M =0 Zm5.T
fmin     65078000 hsd   Zd.T Pg/M =0 Zm5.T
fabd     65088000 hsd   Zd.T Pg/M =0 Zm5.T
fscale   65098000 hsd   Zd.T Pg/M =0 Zm5.T
fdivr    650c8000 hsd   Zd.T Pg/M =0 Zm5.T
fdiv     650d8000 hsd   Zd.T Pg/M =0 Zm5.T
fadd     65188000 hsd   Zd.T Pg/M =0 #0.5|1.0
fsub     65198000 hsd   Zd.T Pg/M =0 #0.5|1.0
fmul     651a8000 hsd   Zd.T Pg/M =0 #0.5|2.0
fmax     651e8000 hsd   Zd.T Pg/M =0 #0.0|1.0
fmin     651f8000 hsd   Zd.T Pg/M =0 #0.0|1.0
frecpe   650e3000 hsd   Zd.T Zn.T
frsqrte  650f3000 hsd   Zd.T Zn.T
fexpa    0420b800 hsd   Zd.T Zn.T
faddv    65002000 hsd   Vd.T Pg Zn.T
fmaxv    65062000 hsd   Vd.T Pg Zn.T
fminv    65072000 hsd   Vd.T Pg Zn.T
frintn   6500a000 hsd   Zd.T Pg/M Zn.T
frintp   6501a000 hsd   Zd.T Pg/M Zn.T
frintm   6502a000 hsd   Zd.T Pg/M Zn.T
frintz   6503a000 hsd   Zd.T Pg/M Zn.T
fsqrt    650da000 hsd   Zd.T Pg/M Zn.T
fneg     041da000 hsd   Zd.T Pg/M Zn.T
fabs     041ca000 hsd   Zd.T Pg/M Zn.T
fcvtzs   659ca000 -     Zd.s Pg/M Zn.s
fcvtzu   659da000 -     Zd.s Pg/M Zn.s
scvtf    6594a000 -     Zd.s Pg/M Zn.s
ucvtf    6595a000 -     Zd.s Pg/M Zn.s
fdup     2539c000 hsd   Zd.T #fimm8
fcmge    65004000 hsd   Pd.T Pg/Z Zn.T Zm.T
fcmgt    65004010 hsd   Pd.T Pg/Z Zn.T Zm.T
fcmeq    65006000 hsd   Pd.T Pg/Z Zn.T Zm.T
fcmne    65006010 hsd   Pd.T Pg/Z Zn.T Zm.T
fcmuo    6500c000 hsd   Pd.T Pg/Z Zn.T Zm.T
fcmge    65102000 hsd   Pd.T Pg/Z Zn.T #0.0
fcmgt    65102010 hsd   Pd.T Pg/Z Zn.T #0.0
fcmlt    65112000 hsd   Pd.T Pg/Z Zn.T #0.0
fcmle    65112010 hsd   Pd.T Pg/Z Zn.T #0.0
# ---- SVE bf16 and int8 matrix / dot products
bfcvt    658aa000 -     Zd.h Pg/M Zn.s
bfdot    64608000 -     Zd.s Zn.h Zm.h
bfdot    64604000 -     Zd.s Zn.h Zm.h[2]
bfmmla   6460e400 -     Zd.s Zn.h Zm.h
bfmlalb  64e08000 -     Zd.s Zn.h Zm.h
bfmlalt  64e08400 -     Zd.s Zn.h Zm.h
sdot     44800000 -     Zd.s Zn.b Zm.b
udot     44800400 -     Zd.s Zn.b Zm.b
usdot    44807800 -     Zd.s Zn.b Zm.b
sdot     44a00000 -     Zd.s Zn.b Zm.b[2]
udot     44a00400 -     Zd.s Zn.b Zm.b[2]
usdot    44a01800 -     Zd.s Zn.b Zm.b[2]
sudot    44a01c00 -     Zd.s Zn.b Zm.b[2]
smmla    45009800 -     Zd.s Zn.b Zm.b
usmmla   45809800 -     Zd.s Zn.b Zm.b
ummla    45c09800 -     Zd.s Zn.b Zm.b
# ---- SVE integer, moves, permutes, compares
dup      2538c000 bhsd  Zd.T #dup
index    04204c00 bhs   Zd.T Wn Wm
index    04e04c00 -     Zd.d Xn Xm
dup      05203800 bhs   Zd.T Wn|SP
dup      05e03800 -     Zd.d Xn|SP
dup      05242000 -     Zd.s Zn.s[dup]
dup      05282000 -     Zd.d Zn.d[dup]
movprfx  0420bc00 -     Zd Zn
movprfx  04102000 bhsd  Zd.T Pg/Z Zn.T
movprfx  04112000 bhsd  Zd.T Pg/M Zn.T
sel      0520c000 bhsd  Zd.T Pg4 Zn.T Zm.T
add      04200000 bhsd  Zd.T Zn.T Zm.T
sub      04200400 bhsd  Zd.T Zn.T Zm.T
mul      04100000 bhsd  Zd.T Pg/M =0 Zm5.T
and      04203000 -     Zd.d Zn.d Zm.d
orr      04603000 -     Zd.d Zn.d Zm.d
eor      04a03000 -     Zd.d Zn.d Zm.d
bic      04e03000 -     Zd.d Zn.d Zm.d
and      041a0000 bhsd  Zd.T Pg/M =0 Zm5.T
orr      04180000 bhsd  Zd.T Pg/M =0 Zm5.T
eor      04190000 bhsd  Zd.T Pg/M =0 Zm5.T
lsl      04209c00 bhsd! Zd.T Zn.T #lslz.T
lsr      04209400 bhsd! Zd.T Zn.T #lsrz.T
asr      04209000 bhsd! Zd.T Zn.T #lsrz.T
lsl      04138000 bhsd  Zd.T Pg/M =0 Zm5.T
lsr      04118000 bhsd  Zd.T Pg/M =0 Zm5.T
zip1     05206000 bhsd  Zd.T Zn.T Zm.T
zip2     05206400 bhsd  Zd.T Zn.T Zm.T
uzp1     05206800 bhsd  Zd.T Zn.T Zm.T
uzp2     05206c00 bhsd  Zd.T Zn.T Zm.T
trn1     05207000 bhsd  Zd.T Zn.T Zm.T
trn2     05207400 bhsd  Zd.T Zn.T Zm.T
cmphs    24000000 bhsd  Pd.T Pg/Z Zn.T Zm.T
cmphi    24000010 bhsd  Pd.T Pg/Z Zn.T Zm.T
cmpge    24008000 bhsd  Pd.T Pg/Z Zn.T Zm.T
cmpgt    24008010 bhsd  Pd.T Pg/Z Zn.T Zm.T
cmpeq    2400a000 bhsd  Pd.T Pg/Z Zn.T Zm.T
cmpne    2400a010 bhsd  Pd.T Pg/Z Zn.T Zm.T
cmpeq    25008000 bhsd  Pd.T Pg/Z Zn.T #s5
cmpne    25008010 bhsd  Pd.T Pg/Z Zn.T #s5
"""


def _fimm8_table() -> dict:
    """All values of the 8-bit floating immediate (sign, 3-bit exponent, 4-bit fraction)."""
    out = {}
    for imm8 in range(256):
        a, b, cd, efgh = imm8 >> 7, (imm8 >> 6) & 1, (imm8 >> 4) & 3, imm8 & 15
        exp = ((b ^ 1) << 7) | ((0x1F if b else 0) << 2) | cd
        bits = (a << 31) | (exp << 23) | (efgh << 19)
        out[struct.unpack("<f", struct.pack("<I", bits))[0]] = imm8
    return out


def encode_bitmask(value: int, bits: int = 64) -> int | None:
    """N:immr:imms (bits 22, 21-16, 15-10) of a logical immediate, or None when ``value`` is not a
    rotated run of ones replicated over 2-64 bit elements.

    >>> hex(encode_bitmask(0xFF)), hex(encode_bitmask(0x5555555555555555)), encode_bitmask(0)
    ('0x401c00', '0xf000', None)
    """
    if not 0 < value < (1 << bits) - 1:
        return None
    for e in (2, 4, 8, 16, 32, 64):
        if e > bits:
            break
        elem = value & ((1 << e) - 1)
        if any((value >> s) & ((1 << e) - 1) != elem for s in range(e, bits, e)):
            continue
        ones = bin(elem).count("1")
        run = (1 << ones) - 1
        for r in range(e):
            if ((run >> r) | (run << (e - r))) & ((1 << e) - 1) == elem:
                imms = ((0x3F << (e.bit_length())) & 0x3F) | (ones - 1)
                return (int(e == 64) << 22) | (r << 16) | (imms << 10)
        return None
    return None


def _bitmask_sampler(bits: int):
    def draw_value(draw):
        e = 1 << draw(1, bits.bit_length() - 1)
        ones, r = draw(1, e - 1), draw(0, e - 1)
        run = (1 << ones) - 1
        elem = ((run >> r) | (run << (e - r))) & ((1 << e) - 1)
        return sum(elem << s for s in range(0, bits, e))
    return draw_value


def _dup_enc(t: str):
    def enc(v):
        if -128 <= v <= 127:
            return (v & 0xFF) << 5
        if t != "b" and v % 256 == 0 and -32768 <= v <= 32512:
            return (1 << 13) | (((v >> 8) & 0xFF) << 5)
        return None
    return enc


def _dup_sample(t: str):
    hi = 127 if t == "b" else 32512

    def draw_value(draw):
        v = draw(-128, 127)
        return v * 256 if t != "b" and draw(0, 1) else v
    return -128 if t == "b" else -32768, hi, draw_value


class _SampledImm(Imm):
    """An immediate whose valid set is sparse; ``sampler(draw)`` builds valid values."""

    def __init__(self, *a, sampler, **kw):
        super().__init__(*a, **kw)
        self.sampler = sampler

    def sample(self, draw, ops):
        return self.sampler(draw)


POS = {"d": 0, "n": 5, "m": 16, "a": 10, "t": 0, "t2": 10}
_FLOAT_CHOICES = {"#0.5|1.0": (0.5, 1.0), "#0.5|2.0": (0.5, 2.0), "#0.0|1.0": (0.0, 1.0)}
_FIXED = {
    "#u12": lambda: Imm([(10, 12)], 0, 4095),
    "sh12": lambda: Choice(22, {LSL(0): 0, LSL(12): 1}, "{lsl #12}", default=LSL(0)),
    "#u16": lambda: Imm([(5, 16)], 0, 0xFFFF),
    "#svc": lambda: Imm([(5, 16)], 0, 0xFFFF),
    "hw64": lambda: Choice(21, {LSL(s): s // 16 for s in (0, 16, 32, 48)}, "{lsl #0|16|32|48}", default=LSL(0)),
    "hw32": lambda: Choice(21, {LSL(0): 0, LSL(16): 1}, "{lsl #0|16}", default=LSL(0)),
    "shift64": lambda: ShiftKind(["lsl", "lsr", "asr"], 64),
    "shift32": lambda: ShiftKind(["lsl", "lsr", "asr"], 32),
    "#lsl64": lambda: Imm([], 0, 63, enc=lambda v: (((-v) % 64) << 16) | ((63 - v) << 10)),
    "#lsr64": lambda: Imm([], 0, 63, enc=lambda v: v << 16),
    "cond": lambda: Choice(12, {c: n for c, n in CONDS.items() if c != "al"}, "cond"),
    "label26": lambda: LabelKind([(0, 26)]),
    "label19": lambda: LabelKind([(5, 19)]),
    "label21": lambda: LabelKind([(5, 19), (29, 2)], scale=1),
    "pattern": lambda: Choice(5, PATTERNS, "pattern", default="all"),
    "mul": lambda: Imm([(16, 4)], 1, 16, bias=1, fmt=lambda v: "mul " + imm_text(v), name="mul", default=1),
    "#s6": lambda: Imm([(5, 6)], -32, 31),
    "#s5": lambda: Imm([(16, 5)], -16, 15),
    "#fimm8": lambda: Choice(5, _fimm8_table(), "#fimm8", fmt=lambda v: f"#{v:.8f}"),
    "#0.0": lambda: Choice(0, {0.0: 0}, "#0.0", fmt=lambda v: "#0.0"),
    "fpcr": lambda: Choice(0, {"fpcr": 0}, "fpcr"),      # the system register FPCR (FZ, RMode)
    "[x,u12*8]": lambda: MemKind(scale=8, bits=12, signed=False, fields=[(10, 12)]),
    "[x,u12*4]": lambda: MemKind(scale=4, bits=12, signed=False, fields=[(10, 12)]),
    "[x,u12*2]": lambda: MemKind(scale=2, bits=12, signed=False, fields=[(10, 12)]),
    "[x,u12*1]": lambda: MemKind(scale=1, bits=12, signed=False, fields=[(10, 12)]),
    "[x,s9]": lambda: MemKind(bits=9, fields=[(12, 9)]),
    "[x,s9]!": lambda: MemKind(bits=9, fields=[(12, 9)], mode="pre"),
    "[x],s9": lambda: MemKind(bits=9, fields=[(12, 9)], mode="post"),
    "[x,s7*8]": lambda: MemKind(scale=8, bits=7, fields=[(15, 7)]),
    "[x,s7*8]!": lambda: MemKind(scale=8, bits=7, fields=[(15, 7)], mode="pre"),
    "[x],s7*8": lambda: MemKind(scale=8, bits=7, fields=[(15, 7)], mode="post"),
    "[x,x{lsl3}]": lambda: MemKind(shifts={0: 0, 3: 1 << 12}),
    "[x,x{lsl2}]": lambda: MemKind(shifts={0: 0, 2: 1 << 12}),
    "[x,s4vl]": lambda: MemKind(bits=4, fields=[(16, 4)], mul_vl=True),
    "[x,s9vl]": lambda: MemKind(bits=9, fields=[(16, 6), (10, 3)], mul_vl=True),
    "[x,s4*16]": lambda: MemKind(scale=16, bits=4, fields=[(16, 4)]),
    "[x,x,lsl2]": lambda: MemKind(shifts={2: 0}, zr_index=False),
    "[x,x,lsl3]": lambda: MemKind(shifts={3: 0}, zr_index=False),
    "[x,zs,uxtw]": lambda: ZMemKind("s"),
    "[x,zd]": lambda: ZMemKind("d"),
    "[x,x,lsl1]": lambda: MemKind(shifts={1: 0}, zr_index=False),
    "[x,x]": lambda: MemKind(shifts={0: 0}, zr_index=False),
    "[x]": lambda: _base_only(),
}
_INDEXED = {"h": (3, [(22, 1), (19, 2)]), "s": (3, [(19, 2)]), "d": (4, [(20, 1)])}


@lru_cache(maxsize=None)
def kind(token: str, t: str | None = None) -> Kind:
    """The operand kind named by a table token, for element size ``t``.

    >>> kind("Zm.T", "s").name, kind("Pg/M").name, kind("[x,u12*8]").name
    ('Zm.S', 'Pg/M(p0-p7)', '[Xn|SP, #0..32760 step 8]')
    """
    if t:
        token = token.replace(".T", "." + t)
    if token in _FIXED:
        return _FIXED[token]()
    if token in _FLOAT_CHOICES:
        a, b = _FLOAT_CHOICES[token]
        return Choice(5, {a: 0, b: 1}, token, fmt=lambda v: f"{v:.1f}")
    if m := re.fullmatch(r"([XW])(d|n|m|a|t2|t)(\d*)(\|SP)?(?:=x30)?", token):
        default = None
        if token.endswith("=x30"):
            from .registers import lr
            default = lr
        lo = int(m[3]) if m[3] else POS[m[2]]
        return Gpr(lo, 64 if m[1] == "X" else 32, sp=bool(m[4]), role=m[2], default=default)
    if m := re.fullmatch(r"([DSH])(t2|t)", token):
        return Vr(POS[m[2]], m[1].lower(), m[2])
    if m := re.fullmatch(r"\{Zt\.(\w)\}", token):
        return ZList(0, m[1])
    if m := re.fullmatch(r"Zn\.(\w)\[dup\]", token):
        return ZIndexed(m[1], 5, {"s": [(22, 2), (19, 2)], "d": [(22, 2), (20, 1)]}[m[1]], reg_lo=5)
    if m := re.fullmatch(r"Z(\w)\.(\w)\[(2?)\]", token):
        width, fields = (3, [(19, 2)]) if m[3] else _INDEXED[m[2]]
        return ZIndexed(m[2], width, fields)
    if m := re.fullmatch(r"Z([dnmt])(\d*)(?:\.(\w))?", token):
        return Zr(int(m[2]) if m[2] else POS[m[1]], m[3], role=m[1])
    if m := re.fullmatch(r"P([dnm])\.(\w)", token):
        return Pr(POS[m[1]], 4, size=m[2])
    if token == "Pt":
        return Pr(0, 4)
    if m := re.fullmatch(r"Vd\.(\w)", token):
        return Vr(0, m[1], "d")
    if m := re.fullmatch(r"Pg(4)?(?:/([MZ]))?", token):
        return Pr(10, 4 if m[1] else 3, qual=m[2].lower() if m[2] else None)
    if m := re.fullmatch(r"\[x,u6\*(\d)\]", token):
        return MemKind(scale=int(m[1]), bits=6, signed=False, fields=[(16, 6)])
    if m := re.fullmatch(r"=(\d)", token):
        return Tied(int(m[1]))
    if m := re.fullmatch(r"#(lsl|lsr)z\.(\w)", token):
        es = ESIZE[m[2]]
        if m[1] == "lsl":
            return Imm([], 0, es - 1, enc=lambda v: _put_tsz(es + v))
        return Imm([], 1, es, enc=lambda v: _put_tsz(2 * es - v))
    raise KeyError(f"unknown operand token {token!r}")


def _base_only() -> MemKind:
    k = MemKind(signed=False)          # no offset field: the immediate range is just 0
    k.name = "[Xn|SP]"
    return k


def _put_tsz(v: int) -> int:
    return ((v >> 5) << 22) | ((v & 31) << 16)


class Form:
    """One instruction form: mnemonic, operand kinds, fixed bits."""

    def __init__(self, mnemonic: str, base: int, kinds: tuple[Kind, ...]):
        self.mnemonic, self.base, self.kinds = mnemonic, base, kinds
        self.nrequired = sum(1 for k in kinds if k.default is None)

    def fill(self, ops: tuple) -> tuple | None:
        """Operands with trailing defaults filled in, or None when the count cannot fit."""
        if not self.nrequired <= len(ops) <= len(self.kinds):
            return None
        return tuple(ops) + tuple(k.default for k in self.kinds[len(ops):])

    def match(self, ops: tuple) -> bool:
        return all(k.match(op, ops) for k, op in zip(self.kinds, ops))

    def encode(self, ops: tuple) -> int:
        word = self.base
        for k, op in zip(self.kinds, ops):
            word |= k.encode(op, ops)
        return word

    def text(self, ops: tuple, pc: int = 0) -> str:
        """The instruction as capstone prints it; trailing operands equal to their default are left out."""
        n = len(ops)
        while n and self.kinds[n - 1].default is not None and ops[n - 1] == self.kinds[n - 1].default:
            n -= 1
        parts = [k.text(op, pc) for k, op in zip(self.kinds[:n], ops[:n])]
        return f"{self.mnemonic} {', '.join(parts)}".rstrip()

    def signature(self) -> str:
        return f"{self.mnemonic} " + ", ".join(k.name for k in self.kinds)

    __repr__ = signature


def _dup_kind(t: str) -> Kind:
    lo, hi, sampler = _dup_sample(t)
    return _SampledImm([], lo, hi, enc=_dup_enc(t), sampler=sampler, name="#imm8{, lsl #8}")


def _bitmask_kind(bits: int) -> Kind:
    return _SampledImm([], 1, (1 << bits) - 2, enc=lambda v: encode_bitmask(v, bits),
                       sampler=_bitmask_sampler(bits), name="#bitmask")


_SPECIAL = {"#dup": _dup_kind, "#bitmask64": lambda t: _bitmask_kind(64), "#bitmask32": lambda t: _bitmask_kind(32)}


def parse_table(text: str) -> list[Form]:
    """Expand the table rows into forms (one per element size and per condition code)."""
    forms = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        mnemonic, base, sizes, *tokens = line.split()
        base = int(base, 16)
        size_in_kind = sizes.endswith("!")
        for t in ([None] if sizes == "-" else sizes.rstrip("!")):
            word = base | (SIZE_BITS[t] << 22 if t and not size_in_kind else 0)
            kinds = tuple(_SPECIAL[tok](t) if tok in _SPECIAL else kind(tok, t) for tok in tokens)
            if "{cond}" in mnemonic:
                for c, n in CONDS.items():
                    forms.append(Form(mnemonic.replace("{cond}", c), word | n, kinds))
            else:
                forms.append(Form(mnemonic, word, kinds))
    return forms


ALL_FORMS: list[Form] = parse_table(TABLE)
FORMS: dict[str, list[Form]] = {}
for _f in ALL_FORMS:
    FORMS.setdefault(_f.mnemonic, []).append(_f)
del _f
