"""The x86 interpreter: differential tests against this CPU (GPR, AVX, AVX2, FMA) and NumPy
references for what the host cannot run (AVX-512 F/BW/BF16/VNNI, AMX), plus its refusals."""

from __future__ import annotations

import ctypes
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import iced_x86
from iced_x86 import Code as C
from iced_x86 import Instruction as Ins
from iced_x86 import MemoryOperand
from iced_x86 import Register as R

from isa.cpu import host
from isa.memory import ExecutableMemory
from isa.x86.interp import InvalidOpcode, Machine, MemoryFault, UnsupportedInstruction, reference
from isa.x86.interp.fp import fma32, to_bf16

FAST = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


NATIVE = all(host().has(f) for f in ("avx2", "fma", "bmi2"))  # lzcnt/tzcnt come with these
needs_native = pytest.mark.skipif(not NATIVE, reason="host lacks AVX2/FMA/BMI2: nothing to compare with")


# ---- assembling -------------------------------------------------------------------------------

class Imm(int):
    """An immediate operand for ``mk`` (plain ints are registers)."""


def mem(disp=0, base=R.RSI, index=R.NONE, scale=1, bcst=False):
    return MemoryOperand(base, index, scale, disp, 0 if disp == 0 else 1 if -128 <= disp < 128 else 8, bcst)


def mk(code, *ops, k=None, z=False):
    """An iced Instruction from a Code name and operands (Register ints, ``mem``, ``Imm``)."""
    parts, args = [], []
    for o in ops:
        if isinstance(o, MemoryOperand):
            parts.append("mem")
        elif isinstance(o, Imm):
            v = int(o) - (1 << 64) if o >= 1 << 63 else int(o)
            parts.append("i32" if -2 ** 31 <= v < 2 ** 31 else "u32" if 0 <= v < 2 ** 32 else "i64")
            o = v
        else:
            parts.append("reg")
        args.append(o)
    ins = getattr(Ins, "create_" + "_".join(parts) if parts else "create")(getattr(C, code), *args)
    if k is not None:
        ins.op_mask = k
    ins.zeroing_masking = z
    return ins


def assemble(instrs, ip=0x1000) -> bytes:
    enc = iced_x86.BlockEncoder(64)
    enc.add_many(instrs)
    return enc.encode(ip)


def label_loop(body, counter=R.RCX):
    """body; dec counter; jnz body (returns the instruction list with ips set for the branch)."""
    out = list(body)
    for i, ins in enumerate(out):
        ins.ip = 0x1000 + i
    dec = mk("DEC_RM64", counter)
    jnz = Ins.create_branch(C.JNE_REL32_64, 0x1000)
    return out + [dec, jnz]


# ---- native runner: the lead's W^X executable memory, called through ctypes ---------------------

class NativeCode:
    def __init__(self, code: bytes):
        self.mem = ExecutableMemory(code)
        self.fn = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p)(self.mem.address)


# ---- the state harness: registers and memory in one block, loaded and stored around a snippet ---

GPR_OFF, FLAG_OFF, YMM_OFF, DATA_OFF, INIT_FLAGS_OFF, STATE = 0, 128, 192, 768, 1264, 1280
GPRS = [R.RAX, R.RCX, R.RDX, R.RBX, R.RSP, R.RBP, R.RSI, R.RDI, R.R8, R.R9, R.R10, R.R11, R.R12,
        R.R13, R.R14, R.R15]
YMM = [getattr(R, f"YMM{i}") for i in range(16)]
XMM = [getattr(R, f"XMM{i}") for i in range(16)]
CF, ZF, SF, OF = 1, 2, 4, 8


def harness(snippet) -> bytes:
    """f(state): flags from a compare of two state words, ymm0-15 and the GPRs (but rsp) loaded
    from the state, rsi = the state's data area; then the snippet; then CF ZF SF OF, the GPRs (rsi
    relative to the state) and ymm0-15 stored back. Same bytes natively and in the interpreter."""
    pre = [mk("PUSH_R64", r) for r in (R.RBX, R.RBP, R.R12, R.R13, R.R14, R.R15, R.RDI)]
    pre += [mk("MOV_R64_RM64", R.RAX, mem(INIT_FLAGS_OFF, R.RDI)),   # random initial flags
            mk("MOV_R64_RM64", R.RDX, mem(INIT_FLAGS_OFF + 8, R.RDI)), mk("CMP_RM64_R64", R.RAX, R.RDX)]
    pre += [mk("VEX_VMOVDQU_YMM_YMMM256", YMM[i], mem(YMM_OFF + 32 * i, R.RDI)) for i in range(16)]
    pre += [mk("MOV_R64_RM64", r, mem(GPR_OFF + 8 * i, R.RDI)) for i, r in enumerate(GPRS)
            if r not in (R.RSP, R.RSI, R.RDI)]
    pre += [mk("LEA_R64_M", R.RSI, mem(DATA_OFF, R.RDI)), mk("MOV_R64_RM64", R.RDI, mem(56, R.RDI))]
    post = [mk("PUSH_R64", R.RDI), mk("MOV_R64_RM64", R.RDI, mem(8, R.RSP))]
    post += [mk(f"SET{c}_RM8", mem(FLAG_OFF + j, R.RDI)) for j, c in enumerate(("B", "E", "S", "O"))]
    post += [mk("SUB_R64_RM64", R.RSI, R.RDI)]
    post += [mk("MOV_RM64_R64", mem(GPR_OFF + 8 * i, R.RDI), r) for i, r in enumerate(GPRS)
             if r not in (R.RSP, R.RDI)]
    post += [mk("POP_R64", R.RAX), mk("MOV_RM64_R64", mem(56, R.RDI), R.RAX)]
    post += [mk("VEX_VMOVDQU_YMMM256_YMM", mem(YMM_OFF + 32 * i, R.RDI), YMM[i]) for i in range(16)]
    post += [mk("POP_R64", r) for r in (R.RDI, R.R15, R.R14, R.R13, R.R12, R.RBP, R.RBX)]
    post += [mk("VEX_VZEROUPPER"), mk("RETNQ")]
    return assemble(pre + list(snippet) + post)


class Case:
    def __init__(self, name, snippet, flags=0, approx=None):
        self.name, self.snippet, self.flags, self.approx = name, snippet, flags, approx
        self._code = self._native = self._m = None

    def code(self):
        if self._code is None:
            self._code = harness(self.snippet)
        return self._code

    def run_native(self, state):
        if self._native is None:
            self._native = NativeCode(self.code())
        buf = np.zeros(STATE + 64, np.uint8)
        off = (-buf.ctypes.data) % 64
        s = buf[off:off + STATE]
        s[:] = state
        self._native.fn(s.ctypes.data)
        return s.copy()

    def run_interp(self, state):
        if self._m is None:
            self._m = Machine()
            self._pa = self._m.map(np.zeros(STATE, np.uint8))
        self._m.write(self._pa, state)
        self._m.call(self.code(), [self._pa])
        return self._m.read(self._pa, like=state)


SPECIAL_F32 = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7FA00001,
               0xFF912345, 0x00000001, 0x807FFFFF, 0x00400000, 0x3F800000, 0xBF800000, 0x7F7FFFFF,
               0x4B000000, 0x3EFFFFFF, 0x3F000000, 0x3FC00000, 0xCF000000, 0x4F000000, 0x80000001]
SPECIAL_GPR = [0, 1, 2, 31, 32, 63, 64, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF,
               0x80000000, 0xFFFFFFFF, 0x7FFFFFFFFFFFFFFF, 0x8000000000000000, 2 ** 64 - 1]


def make_state(seed: int, profile: str) -> np.ndarray:
    """A random register/memory block: raw bits, moderate floats or small ints, plus special
    values (NaN payloads, infinities, denormals, signed zeros, extreme integers) sprinkled in."""
    rng = np.random.default_rng(seed)
    buf = rng.integers(0, 256, STATE, dtype=np.uint8)
    if profile == "floats":
        v = rng.standard_normal(STATE // 4) * np.exp2(rng.integers(-8, 9, STATE // 4))
        buf.view(np.float32)[:] = v.astype(np.float32)
    elif profile == "ints":
        buf.view(np.int32)[:] = rng.integers(-300, 300, STATE // 4)
    n = int(rng.integers(0, 40))
    buf.view(np.uint32)[rng.integers(0, STATE // 4, n)] = rng.choice(SPECIAL_F32, n)
    g = buf.view(np.uint64)[:16]
    pick = rng.random(16) < 0.5
    g[pick] = rng.choice(np.array(SPECIAL_GPR, np.uint64), int(pick.sum()))
    return buf


PROFILES = ("bits", "floats", "ints", "floats")


@st.composite
def states(draw):
    """Cheap to draw (hypothesis only picks seeds); each example checks every profile."""
    seed = draw(st.integers(0, 2 ** 32 - 1))
    return [make_state(seed + i, p) for i, p in enumerate(PROFILES)]


def compare(case, state):
    want, got = case.run_native(state), case.run_interp(state)
    keep = np.ones(STATE, bool)
    for j, bit in enumerate((CF, ZF, SF, OF)):
        if not case.flags & bit:
            keep[FLAG_OFF + j] = False
    if case.approx is not None:
        reg, rel = case.approx
        sl = slice(YMM_OFF + 32 * reg, YMM_OFF + 32 * reg + 32)
        keep[sl] = False
        w, g = want[sl].view(np.float32).astype(np.float64), got[sl].view(np.float32).astype(np.float64)
        same = (w == g) | (np.isnan(w) & np.isnan(g))
        with np.errstate(invalid="ignore"):  # hardware within 1.5 rel, the model within 1 rel
            close = np.abs(g - w) <= 2.5 * rel * (1 + 2 ** -10) * np.abs(w)
        assert (same | close).all(), (w, g)
    bad = np.flatnonzero((want != got) & keep)
    assert bad.size == 0, f"{case.name}: first differing byte {bad[0]} " \
                          f"(native {want[bad[0]]:#x}, interp {got[bad[0]]:#x})\n{_where(bad[0])}"


def _where(off):
    if off < FLAG_OFF:
        return f"gpr {GPRS[off // 8]}"
    if off < YMM_OFF:
        return f"flag {'CF ZF SF OF'.split()[off - FLAG_OFF]}"
    if off < DATA_OFF:
        return f"ymm{(off - YMM_OFF) // 32} byte {(off - YMM_OFF) % 32}"
    return f"data byte {off - DATA_OFF}"


# ---- the differential cases -------------------------------------------------------------------

ALL = CF | ZF | SF | OF


def _gpr_cases():
    cs = []
    for op in ("ADD", "SUB", "CMP", "AND", "OR", "XOR", "TEST"):
        cs.append(Case(f"{op} r64,r64", [mk(f"{op}_RM64_R64", R.RAX, R.RBX)], ALL))
        cs.append(Case(f"{op} r32,r32", [mk(f"{op}_RM32_R32", R.R9D, R.EDX)], ALL))
        cs.append(Case(f"{op} r8,r8", [mk(f"{op}_RM8_R8", R.AH, R.BL)], ALL))
        cs.append(Case(f"{op} r16,m16", [mk(f"{op}_R16_RM16" if op != "TEST" else "TEST_RM16_R16",
                                            *((R.CX, mem(8)) if op != "TEST" else (mem(8), R.CX)))], ALL))
        cs.append(Case(f"{op} m32,imm", [mk(f"{op}_RM32_IMM32", mem(12), Imm(0x80000001))], ALL))
        if op != "TEST":
            cs.append(Case(f"{op} r64,imm8", [mk(f"{op}_RM64_IMM8", R.R10, Imm(0xFFFFFFFFFFFFFF80))], ALL))
    for op in ("INC", "DEC", "NEG", "NOT"):
        fl = 0 if op == "NOT" else ALL
        cs.append(Case(f"{op} r64", [mk(f"{op}_RM64", R.RBX)], fl))
        cs.append(Case(f"{op} r32", [mk(f"{op}_RM32", R.R11D)], fl))
        cs.append(Case(f"{op} m8", [mk(f"{op}_RM8", mem(3))], fl))
    cs.append(Case("IMUL r64,r64", [mk("IMUL_R64_RM64", R.RAX, R.RCX)], CF | OF))
    cs.append(Case("IMUL r32,m32,imm", [mk("IMUL_R32_RM32_IMM32", R.EDX, mem(4), Imm(0x7FFF1234))], CF | OF))
    cs.append(Case("IMUL r16,r16,imm8", [mk("IMUL_R16_RM16_IMM8", R.DX, R.BX, Imm(0xFFFFFFFFFFFFFFFD))], CF | OF))
    for op in ("SHL", "SHR", "SAR"):
        for cnt in (1, 7, 31, 33, 63):
            cs.append(Case(f"{op} r64,{cnt}", [mk(f"{op}_RM64_IMM8", R.RAX, Imm(cnt))], CF | ZF | SF | (OF if cnt == 1 else 0)))
        cs.append(Case(f"{op} r32,cl", [mk("AND_RM32_IMM8", R.ECX, Imm(31)), mk("OR_RM32_IMM8", R.ECX, Imm(1)),
                                        mk(f"{op}_RM32_CL", R.EBX, R.CL)], CF | ZF | SF))
        cs.append(Case(f"{op} r64,cl0", [mk("XOR_R32_RM32", R.ECX, R.ECX), mk(f"{op}_RM64_CL", R.RBX, R.CL)], ALL))
        cs.append(Case(f"{op}X", [mk(f"VEX_{op}X_R64_RM64_R64", R.R8, R.RBX, R.RCX),
                                  mk(f"VEX_{op}X_R32_RM32_R32", R.R9D, R.EDX, R.EAX)], 0))
    cs.append(Case("MOV r32 imm zero-extends", [mk("MOV_R32_IMM32", R.EAX, Imm(0x89ABCDEF)),
                                                 mk("MOV_R32_RM32", R.EBX, R.ECX)], 0))
    cs.append(Case("MOV r8/r16 keep upper", [mk("MOV_R8_IMM8", R.AH, Imm(0x5A)), mk("MOV_RM16_R16", R.BX, R.DX),
                                             mk("MOV_RM8_R8", R.R8L, R.CL)], 0))
    cs.append(Case("MOV mem", [mk("MOV_RM64_R64", mem(16), R.RAX), mk("MOV_R32_RM32", R.EBX, mem(20)),
                               mk("MOV_RM32_IMM32", mem(40), Imm(0xFFFFFFFF)), mk("MOV_R64_IMM64", R.R12, Imm(2 ** 63 + 5))], 0))
    cs.append(Case("MOVZX/MOVSX/MOVSXD", [mk("MOVZX_R32_RM8", R.EAX, R.BH), mk("MOVSX_R64_RM16", R.RBX, mem(6)),
                                          mk("MOVSXD_R64_RM32", R.RCX, R.EDX), mk("MOVSX_R32_RM8", R.R8D, mem(9)),
                                          mk("MOVZX_R64_RM16", R.R9, R.R10W)], 0))
    cs.append(Case("LEA", [mk("LEA_R64_M", R.RAX, MemoryOperand(R.RBX, R.RCX, 8, -100, 1)),
                           mk("LEA_R32_M", R.EDX, MemoryOperand(R.R8, R.R9, 2, 0x12345, 8))], 0))
    cs.append(Case("CDQE/CQO/CDQ", [mk("CDQE"), mk("MOV_R64_RM64", R.R8, R.RAX), mk("MOV_R64_RM64", R.RAX, R.RBX),
                                    mk("CQO"), mk("MOV_R64_RM64", R.R9, R.RDX), mk("MOV_R64_RM64", R.RAX, R.RCX), mk("CDQ")], 0))
    cs.append(Case("PUSH/POP", [mk("PUSH_R64", R.RAX), mk("PUSH_RM64", mem(0)), mk("POP_R64", R.RBX),
                                mk("POP_RM64", mem(24))], 0))
    cs.append(Case("POPCNT/TZCNT/LZCNT", [mk("POPCNT_R64_RM64", R.RAX, R.RBX)], ALL))
    cs.append(Case("TZCNT", [mk("TZCNT_R32_RM32", R.EAX, R.EBX)], CF | ZF))
    cs.append(Case("LZCNT", [mk("LZCNT_R64_RM64", R.RAX, mem(8))], CF | ZF))
    for cc in ("O", "NO", "B", "AE", "E", "NE", "BE", "A", "S", "NS", "L", "GE", "LE", "G"):
        cs.append(Case(f"SET{cc}/CMOV{cc} after cmp", [mk("CMP_RM64_R64", R.RAX, R.RBX), mk(f"SET{cc}_RM8", R.CL),
                                                      mk(f"CMOV{cc}_R32_RM32", R.EDX, R.R8D),
                                                      mk(f"CMOV{cc}_R64_RM64", R.R9, mem(0))], ALL))
        cs.append(Case(f"J{cc} after sub r8", [mk("SUB_RM8_R8", R.AL, R.BL)] + _jcc_snippet(cc), ALL))
    cs.append(Case("prefetch/nop", [mk("PREFETCHT0_M8", mem(0)), mk("PREFETCHW_M8", mem(64)), mk("NOPD")], ALL))
    return cs


def _jcc_snippet(cc):
    """jcc over 'mov ecx, 1' (targets built by index: BlockEncoder resolves ips)."""
    skip = mk("MOV_R32_IMM32", R.ECX, Imm(1))
    land = mk("NOPD")
    skip.ip, land.ip = 0x7000, 0x7010
    j = Ins.create_branch(getattr(C, f"J{cc}_REL32_64"), 0x7010)
    j.ip = 0x6FF0
    return [j, skip, land]


def _v(code, *ops, **kw):
    return mk("VEX_" + code, *ops, **kw)


Y0, Y1, Y2, Y3, Y4 = YMM[:5]
X0, X1, X2, X3 = XMM[:4]


def _vec_cases():
    cs = []
    for op in ("ADDPS", "SUBPS", "MULPS", "DIVPS", "MAXPS", "MINPS"):
        cs.append(Case(op, [_v(f"V{op}_YMM_YMM_YMMM256", Y0, Y1, Y2), _v(f"V{op}_YMM_YMM_YMMM256", Y3, Y4, mem(32)),
                            _v(f"V{op}_XMM_XMM_XMMM128", X2, X1, X0)]))
        s = op.replace("PS", "SS")
        cs.append(Case(s, [_v(f"V{s}_XMM_XMM_XMMM32", X0, X1, X2), _v(f"V{s}_XMM_XMM_XMMM32", X3, X1, mem(4))]))
    cs.append(Case("VSQRTPS/SS", [_v("VSQRTPS_YMM_YMMM256", Y0, Y1), _v("VSQRTSS_XMM_XMM_XMMM32", X2, X3, mem(0))]))
    cs.append(Case("VRCPPS", [_v("VRCPPS_YMM_YMMM256", Y0, Y1)], approx=(0, 2 ** -12)))
    cs.append(Case("VRSQRTPS", [_v("VRSQRTPS_YMM_YMMM256", Y0, mem(64))], approx=(0, 2 ** -12)))
    for kind in ("MADD", "MSUB", "NMADD", "NMSUB"):
        for order in ("132", "213", "231"):
            n = f"VF{kind}{order}"
            cs.append(Case(n + "PS", [_v(f"{n}PS_YMM_YMM_YMMM256", Y0, Y1, Y2), _v(f"{n}PS_YMM_YMM_YMMM256", Y3, Y4, mem(96)),
                                      _v(f"{n}PS_XMM_XMM_XMMM128", X1, X2, X0)]))
            cs.append(Case(n + "SS", [_v(f"{n}SS_XMM_XMM_XMMM32", X0, X1, X2), _v(f"{n}SS_XMM_XMM_XMMM32", X3, X1, mem(12))]))
    for op in ("VANDPS", "VANDNPS", "VORPS", "VXORPS", "VPAND", "VPANDN", "VPOR", "VPXOR", "VPADDB", "VPADDW",
               "VPADDD", "VPADDQ", "VPSUBB", "VPSUBW", "VPSUBD", "VPSUBQ", "VPMULLD", "VPMULLW", "VPMULUDQ",
               "VPMULDQ", "VPMAXSD", "VPMINSD", "VPMAXUD", "VPMINUD", "VPMAXSW", "VPMINSW", "VPMAXUB", "VPMINUB",
               "VPCMPEQB", "VPCMPEQW", "VPCMPEQD", "VPCMPEQQ", "VPCMPGTB", "VPCMPGTW", "VPCMPGTD", "VPCMPGTQ",
               "VPMADDWD", "VPMADDUBSW", "VPACKSSDW", "VPACKUSDW", "VPACKSSWB", "VPACKUSWB", "VPUNPCKLBW",
               "VPUNPCKHBW", "VPUNPCKLWD", "VPUNPCKHWD", "VPUNPCKLDQ", "VPUNPCKHDQ", "VPUNPCKLQDQ", "VPUNPCKHQDQ",
               "VUNPCKLPS", "VUNPCKHPS", "VPERMPS", "VPERMD", "VPSHUFB", "VPERMILPS", "VHADDPS", "VPSLLVD",
               "VPSRLVD", "VPSRAVD", "VPSLLVQ", "VPSRLVQ"):
        cs.append(Case(op, [_v(f"{op}_YMM_YMM_YMMM256", Y0, Y1, Y2), _v(f"{op}_YMM_YMM_YMMM256", Y3, Y4, mem(64)),
                            _v(f"{op}_XMM_XMM_XMMM128", X1, X2, X3)] if op not in ("VPERMPS", "VPERMD") else
                       [_v(f"{op}_YMM_YMM_YMMM256", Y0, Y1, Y2), _v(f"{op}_YMM_YMM_YMMM256", Y3, Y4, mem(64))]))
    cs.append(Case("VPABSD", [_v("VPABSD_YMM_YMMM256", Y0, Y1), _v("VPABSD_XMM_XMMM128", X2, mem(0))]))
    for op in ("VPSLLD", "VPSRLD", "VPSRAD", "VPSLLQ", "VPSRLQ", "VPSLLW", "VPSRLW", "VPSRAW"):
        for cnt in (0, 1, 13, 31, 32, 63, 64, 200):
            cs.append(Case(f"{op} {cnt}", [_v(f"{op}_YMM_YMM_IMM8", Y0, Y1, Imm(cnt)), _v(f"{op}_XMM_XMM_IMM8", X2, X3, Imm(cnt))]))
        cs.append(Case(f"{op} xmm", [_v(f"{op}_YMM_YMM_XMMM128", Y0, Y1, X2), _v(f"{op}_YMM_YMM_XMMM128", Y3, Y4, mem(0))]))
    for op in ("VPSLLDQ", "VPSRLDQ"):
        cs.append(Case(op, [_v(f"{op}_YMM_YMM_IMM8", Y0, Y1, Imm(3)), _v(f"{op}_YMM_YMM_IMM8", Y2, Y3, Imm(17))]))
    for p in range(32):
        cs.append(Case(f"VCMPPS {p}", [_v("VCMPPS_YMM_YMM_YMMM256_IMM8", Y0, Y1, Y2, Imm(p)),
                                       _v("VCMPPS_XMM_XMM_XMMM128_IMM8", X3, X1, mem(16), Imm(p))]))
    cs.append(Case("VBLENDV", [_v("VBLENDVPS_YMM_YMM_YMMM256_YMM", Y0, Y1, Y2, Y3),
                               _v("VPBLENDVB_YMM_YMM_YMMM256_YMM", Y4, Y1, mem(32), Y2)]))
    cs.append(Case("VBLEND imm", [_v("VBLENDPS_YMM_YMM_YMMM256_IMM8", Y0, Y1, Y2, Imm(0xA5)),
                                  _v("VPBLENDD_YMM_YMM_YMMM256_IMM8", Y3, Y1, mem(0), Imm(0x3C))]))
    cs.append(Case("moves", [_v("VMOVUPS_YMM_YMMM256", Y0, mem(4)), _v("VMOVAPS_YMMM256_YMM", mem(64), Y1),
                             _v("VMOVDQU_XMMM128_XMM", mem(100), X2), _v("VMOVDQA_YMM_YMMM256", Y3, mem(128)),
                             _v("VMOVAPS_XMM_XMMM128", XMM[4], XMM[5])]))
    cs.append(Case("vmovss/d/q", [_v("VMOVSS_XMM_M32", X0, mem(8)), _v("VMOVSS_XMM_XMM_XMM", X1, X2, X3),
                                  _v("VMOVSS_M32_XMM", mem(200), XMM[4]), _v("VMOVD_XMM_RM32", XMM[5], R.EAX),
                                  _v("VMOVD_RM32_XMM", R.EBX, XMM[6]), _v("VMOVQ_XMM_RM64", XMM[7], mem(16)),
                                  _v("VMOVQ_RM64_XMM", R.RCX, XMM[8]), _v("VMOVQ_XMM_XMMM64", XMM[9], XMM[10]),
                                  _v("VMOVD_RM32_XMM", mem(300), XMM[11])]))
    cs.append(Case("broadcasts", [_v("VBROADCASTSS_YMM_XMM", Y0, X1), _v("VBROADCASTSS_YMM_M32", Y2, mem(8)),
                                  _v("VPBROADCASTB_YMM_XMMM8", Y3, mem(3)), _v("VPBROADCASTW_XMM_XMMM16", XMM[4], XMM[5]),
                                  _v("VPBROADCASTD_YMM_XMMM32", YMM[6], XMM[7]), _v("VPBROADCASTQ_YMM_XMMM64", YMM[8], mem(40)),
                                  _v("VBROADCASTF128_YMM_M128", YMM[9], mem(48)), _v("VBROADCASTI128_YMM_M128", YMM[10], mem(16))]))
    for s in ("BW", "BD", "BQ", "WD", "WQ", "DQ"):
        for z in ("ZX", "SX"):
            src = {"BW": "XMMM128", "BD": "XMMM64", "BQ": "XMMM32", "WD": "XMMM128", "WQ": "XMMM64", "DQ": "XMMM128"}[s]
            cs.append(Case(f"VPMOV{z}{s}", [_v(f"VPMOV{z}{s}_YMM_{src}", Y0, X1), _v(f"VPMOV{z}{s}_YMM_{src}", Y2, mem(5))]))
    cs.append(Case("permutes", [_v("VPERMQ_YMM_YMMM256_IMM8", Y0, Y1, Imm(0x1B)), _v("VPERMPD_YMM_YMMM256_IMM8", Y2, mem(0), Imm(0x4E)),
                                _v("VPERM2F128_YMM_YMM_YMMM256_IMM8", Y3, Y1, Y2, Imm(0x31)),
                                _v("VPERM2I128_YMM_YMM_YMMM256_IMM8", YMM[4], Y1, mem(32), Imm(0x8A)),
                                _v("VINSERTF128_YMM_YMM_XMMM128_IMM8", YMM[5], Y1, X2, Imm(1)),
                                _v("VINSERTI128_YMM_YMM_XMMM128_IMM8", YMM[6], Y1, mem(64), Imm(0)),
                                _v("VEXTRACTF128_XMMM128_YMM_IMM8", XMM[7], YMM[8], Imm(1)),
                                _v("VEXTRACTI128_XMMM128_YMM_IMM8", mem(128), YMM[9], Imm(1)),
                                _v("VSHUFPS_YMM_YMM_YMMM256_IMM8", YMM[10], Y1, Y2, Imm(0x9C)),
                                _v("VPSHUFD_YMM_YMMM256_IMM8", YMM[11], mem(0), Imm(0x27)),
                                _v("VPERMILPS_YMM_YMMM256_IMM8", YMM[12], Y1, Imm(0xE1)),
                                _v("VMOVSHDUP_YMM_YMMM256", YMM[13], Y2), _v("VMOVSLDUP_YMM_YMMM256", YMM[14], mem(32))]))
    cs.append(Case("conversions", [_v("VCVTPS2DQ_YMM_YMMM256", Y0, Y1), _v("VCVTTPS2DQ_YMM_YMMM256", Y2, mem(32)),
                                   _v("VCVTDQ2PS_YMM_YMMM256", Y3, YMM[4])]))
    for imm in (0, 1, 2, 3, 4, 8, 9, 10, 11, 12):
        cs.append(Case(f"VROUNDPS {imm}", [_v("VROUNDPS_YMM_YMMM256_IMM8", Y0, Y1, Imm(imm))]))
    cs.append(Case("vmaskmov", [_v("VMASKMOVPS_YMM_YMM_M256", Y0, Y1, mem(32)), _v("VMASKMOVPS_M256_YMM_YMM", mem(128), Y2, Y3),
                                _v("VPMASKMOVD_XMM_XMM_M128", XMM[4], XMM[5], mem(0)),
                                _v("VPMASKMOVQ_M256_YMM_YMM", mem(256), YMM[6], YMM[7])]))
    cs.append(Case("vmovmsk/vptest", [_v("VMOVMSKPS_R32_YMM", R.EAX, Y1), _v("VPMOVMSKB_R32_YMM", R.EBX, Y2),
                                      _v("VPTEST_YMM_YMMM256", Y3, Y4)], CF | ZF | SF | OF))
    cs.append(Case("vzeroupper", [_v("VZEROUPPER")]))
    cs.append(Case("vpinsr/vpextr", [_v("VPINSRW_XMM_XMM_R32M16_IMM8", X0, X1, R.EAX, Imm(5)),
                                     _v("VPINSRW_XMM_XMM_R32M16_IMM8", X2, X1, mem(6), Imm(11)),
                                     _v("VPINSRB_XMM_XMM_R32M8_IMM8", X3, X1, R.ECX, Imm(13)),
                                     _v("VPINSRD_XMM_XMM_RM32_IMM8", XMM[4], X1, mem(8), Imm(2)),
                                     _v("VPINSRQ_XMM_XMM_RM64_IMM8", XMM[5], X1, R.RDX, Imm(1)),
                                     _v("VPEXTRW_R32_XMM_IMM8", R.EBX, XMM[6], Imm(3)),
                                     _v("VPEXTRW_R32M16_XMM_IMM8", mem(40), XMM[7], Imm(7)),
                                     _v("VPEXTRB_R32M8_XMM_IMM8", R.R8D, XMM[8], Imm(15)),
                                     _v("VPEXTRD_RM32_XMM_IMM8", mem(44), XMM[9], Imm(2)),
                                     _v("VPEXTRQ_RM64_XMM_IMM8", R.R9, XMM[10], Imm(1))]))
    return cs


CASES = _gpr_cases() + _vec_cases()


@needs_native
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=states())
def test_differential(case, batch):
    for state in batch:
        compare(case, state)


# ---- fma32 against exact rationals (the model behind every FMA, vdpbf16ps and tdpbf16ps) ---------

def _round_f32(x: Fraction) -> np.float32:
    """Correctly rounded (RNE) float32 of an exact rational (finite range only)."""
    r = np.float32(float(x))
    best = None
    with np.errstate(over="ignore"):
        cands = (np.nextafter(r, np.float32(-np.inf)), r, np.nextafter(r, np.float32(np.inf)))
    for c in cands:
        if not np.isfinite(c):
            continue
        d = abs(Fraction(float(c)) - x)
        key = (d, int(np.array(c).view(np.uint32)) & 1)
        if best is None or key < best[0]:
            best = (key, c)
    return best[1]


finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(a=finite32, b=finite32, c=finite32)
def test_fma32_is_correctly_rounded(a, b, c):
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if abs(exact) > Fraction(float(np.finfo(np.float32).max)):
        return
    got = fma32(np.array([a], np.float32), np.array([b], np.float32), np.array([c], np.float32))[0]
    assert got == _round_f32(exact) or (got == 0 and exact == 0)


def test_fma32_double_rounding_case():
    a = b = np.array([1 + 2 ** -12], np.float32)    # a*b = 1 + 2^-11 + 2^-24: a float32 midpoint
    c = np.array([2 ** -100], np.float32)            # nudges it up: one rounding must go up
    assert fma32(a, b, c)[0] == np.nextafter(np.float32(1 + 2 ** -11), np.float32(2))


# ---- AVX-512 programs checked against NumPy -----------------------------------------------------

Z = [getattr(R, f"ZMM{i}") for i in range(32)]
K = [getattr(R, f"K{i}") for i in range(8)]


def _e(code, *ops, **kw):
    return mk("EVEX_" + code, *ops, **kw)


def run(prog, *arrays, args=()):
    m = Machine()
    ptrs = [m.map(a) for a in arrays]
    m.call(assemble(prog + [mk("RETNQ")]), list(ptrs) + list(args))
    return m, ptrs


def _bits(x):
    return np.asarray(x).view(np.uint32)


f32s = st.lists(st.floats(width=32, allow_nan=False, min_value=-1e6, max_value=1e6), min_size=16, max_size=16)


@FAST
@given(a=f32s, b=f32s, c=f32s)
def test_evex_fma_broadcast_and_masks(a, b, c):
    A, B, Cc = (np.array(x, np.float32) for x in (a, b, c))
    out = np.zeros((3, 16), np.float32)
    prog = [_e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[1], mem(0, R.RDI)), _e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[2], mem(0, R.RSI)),
            _e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[17], mem(0, R.RDX)), _e("VMOVAPS_ZMM_K1Z_ZMMM512", Z[18], Z[17]),
            _e("VFMADD231PS_ZMM_K1Z_ZMM_ZMMM512B32_ER", Z[17], Z[1], Z[2]),
            _e("VFMADD231PS_ZMM_K1Z_ZMM_ZMMM512B32_ER", Z[18], Z[1], mem(8, R.RSI, bcst=True)),
            mk("MOV_R32_IMM32", R.EAX, Imm(0x0F0F)), mk("VEX_KMOVW_KR_R32", K[3], R.EAX),
            _e("VADDPS_ZMM_K1Z_ZMM_ZMMM512B32_ER", Z[19], Z[1], Z[2], k=K[3], z=True),
            _e("VMOVUPS_ZMMM512_K1Z_ZMM", mem(0, R.RCX), Z[17]), _e("VMOVUPS_ZMMM512_K1Z_ZMM", mem(64, R.RCX), Z[18]),
            _e("VMOVUPS_ZMMM512_K1Z_ZMM", mem(128, R.RCX), Z[19])]
    m, (pa, pb, pc, po) = run(prog, A, B, Cc, out)
    got = m.read(po, like=out)
    assert (_bits(got[0]) == _bits(fma32(A, B, Cc))).all()
    assert (_bits(got[1]) == _bits(fma32(A, np.full(16, B[2]), Cc))).all()
    want = np.where(np.arange(16) % 8 < 4, A + B, 0).astype(np.float32)
    assert (_bits(got[2]) == _bits(want)).all()


def test_masked_tail_load_store_do_not_fault_or_write():
    src = np.arange(5, dtype=np.float32) + 1          # 20 bytes: a 64-byte load would run off the end
    dst = np.full(7, -1, np.float32)
    prog = [mk("MOV_R32_IMM32", R.EAX, Imm(0b11111)), mk("VEX_KMOVW_KR_R32", K[1], R.EAX),
            _e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[0], mem(0, R.RDI), k=K[1], z=True),
            _e("VADDPS_ZMM_K1Z_ZMM_ZMMM512B32_ER", Z[0], Z[0], Z[0]),
            _e("VMOVUPS_ZMMM512_K1Z_ZMM", mem(0, R.RSI), Z[0], k=K[1])]
    m, (ps, pd) = run(prog, src, dst)
    got = m.read(pd, like=dst)
    assert (got[:5] == 2 * src).all() and (got[5:] == -1).all()
    with pytest.raises(MemoryFault) as e:  # the same load unmasked faults, naming address and instruction
        run([_e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[0], mem(0, R.RDI))], src)
    assert "vmovups" in str(e.value) and e.value.address >= 0x1000_0000


def test_merge_masking_keeps_destination_lanes_and_disp8_compression():
    a = np.arange(32, dtype=np.float32)
    ins = _e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[5], mem(64, R.RDI), k=K[2])
    assert len(assemble([ins])) == 7                  # EVEX + disp8*64 = 1 byte of displacement
    prog = [_e("VBROADCASTSS_ZMM_K1Z_XMMM32", Z[5], mem(0, R.RDI)),
            mk("MOV_R32_IMM32", R.EAX, Imm(0xAAAA)), mk("VEX_KMOVW_KR_R32", K[2], R.EAX), ins,
            _e("VMOVUPS_ZMMM512_K1Z_ZMM", mem(0, R.RDI), Z[5])]
    m, (pa,) = run(prog, a)
    got = m.read(pa, like=a)
    want = np.where(np.arange(16) % 2, a[16:], a[0])
    assert (got[:16] == want).all()


ints = st.integers(0, 2 ** 32 - 1)


@FAST
@given(seed=ints)
def test_vnni_and_bf16_against_numpy(seed):
    rng = np.random.default_rng(seed)
    a8 = rng.integers(0, 256, 64, dtype=np.uint8)
    b8 = rng.integers(-128, 128, 64, dtype=np.int8)
    acc = rng.integers(-2 ** 31, 2 ** 31, 16, dtype=np.int64).astype(np.int32)
    fa = (rng.standard_normal(32) * 4).astype(np.float32)
    fb = (rng.standard_normal(32) * 4).astype(np.float32)
    facc = rng.standard_normal(16).astype(np.float32)
    out = np.zeros(16 * 5, np.uint32)
    prog = [_e("VMOVDQU32_ZMM_K1Z_ZMMM512", Z[0], mem(0, R.RDI)), _e("VMOVDQU32_ZMM_K1Z_ZMMM512", Z[1], mem(0, R.RSI)),
            _e("VMOVDQU32_ZMM_K1Z_ZMMM512", Z[2], mem(0, R.RDX)),
            _e("VPDPBUSD_ZMM_K1Z_ZMM_ZMMM512B32", Z[2], Z[0], Z[1]),
            _e("VMOVDQU32_ZMMM512_K1Z_ZMM", mem(0, R.R9), Z[2]),
            _e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[3], mem(0, R.RCX)), _e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[4], mem(64, R.RCX)),
            _e("VCVTNE2PS2BF16_ZMM_K1Z_ZMM_ZMMM512B32", Z[5], Z[4], Z[3]),
            _e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[6], mem(0, R.R8)), _e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[7], mem(64, R.R8)),
            _e("VCVTNE2PS2BF16_ZMM_K1Z_ZMM_ZMMM512B32", Z[8], Z[7], Z[6]),
            _e("VMOVUPS_ZMMM512_K1Z_ZMM", mem(64, R.R9), Z[5]),
            _e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[9], mem(128, R.RCX)),
            _e("VDPBF16PS_ZMM_K1Z_ZMM_ZMMM512B32", Z[9], Z[5], Z[8]),
            _e("VMOVUPS_ZMMM512_K1Z_ZMM", mem(128, R.R9), Z[9]),
            _e("VCVTNEPS2BF16_YMM_K1Z_ZMMM512B32", YMM[10], Z[3]),
            _e("VMOVUPS_ZMMM512_K1Z_ZMM", mem(192, R.R9), Z[10])]
    fbuf = np.concatenate([fa, facc])
    m, (pa, pb, pc, pf, pg, po) = run(prog, a8, b8, acc, fbuf, fb, out)
    got = m.read(po, like=out)
    want = (acc.astype(np.int64) + (a8.astype(np.int64) * b8).reshape(16, 4).sum(1)).astype(np.int32)
    assert (got[:16].view(np.int32) == want).all()
    import ml_dtypes
    bfa = fa.astype(ml_dtypes.bfloat16)           # normal values: SDM rounding == RNE
    assert (got[16:32].view(np.uint16) == bfa.view(np.uint16)).all()
    bfb = fb.astype(ml_dtypes.bfloat16)
    pa_, pb_ = bfa.astype(np.float64).reshape(16, 2), bfb.astype(np.float64).reshape(16, 2)
    exact = facc.astype(np.float64) + (pa_ * pb_).sum(1)
    dp = got[32:48].view(np.float32).astype(np.float64)
    assert np.all(np.abs(dp - exact) <= 2 ** -22 * (np.abs(facc) + np.abs(pa_ * pb_).sum(1)) + 1e-30)
    assert (got[48:56].view(np.uint16) == bfa[:16].view(np.uint16)).all()
    assert (got[56:] == 0).all()


def test_bf16_conversion_special_values():
    x = np.array([np.nan, -np.inf, 1e-40, -1e-40, 3.0, 1.00390625, 1.01171875, 3.4e38], np.float32)
    x[0] = np.frombuffer(np.uint32(0x7F800001).tobytes(), np.float32)[0]  # signalling NaN
    got = to_bf16(x)
    assert got[0] == 0x7FC0 and got[1] == 0xFF80 and got[2] == 0 and got[3] == 0x8000
    assert got[4] == 0x4040 and got[5] == 0x3F80 and got[6] == 0x3F82 and got[7] == 0x7F80


def test_vdpbf16ps_order_daz_and_exact_small_ints():
    acc = np.array([1.0, 2 ** 24, -0.0, 5.0] * 4, np.float32)
    a = np.array([1, 2, 1, 1, 0, 0, 2 ** -130, 3] * 4, np.float32)   # 2^-130 is a bf16 denormal: DAZ
    b = np.array([3, 4, 1, 1, 0, 0, 1, 1] * 4, np.float32)
    import ml_dtypes
    ab = a.astype(ml_dtypes.bfloat16).view(np.uint16)
    bb = b.astype(ml_dtypes.bfloat16).view(np.uint16)
    prog = [_e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[0], mem(0, R.RDI)), _e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[1], mem(0, R.RSI)),
            _e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[2], mem(0, R.RDX)), _e("VDPBF16PS_ZMM_K1Z_ZMM_ZMMM512B32", Z[2], Z[0], Z[1]),
            _e("VMOVUPS_ZMMM512_K1Z_ZMM", mem(0, R.RDX), Z[2])]
    m, (pa, pb, pc) = run(prog, ab, bb, acc)
    got = m.read(pc, like=acc)
    # lane1: 2^24 + 1*1 (odd first: rounds away) + 1*1 -> 2^24 under the SDM's sequential order
    assert got[0] == 1 + 3 + 8 and got[1] == 2 ** 24 and got[2] == 0 and got[3] == 8.0


@FAST
@given(seed=ints)
def test_permutes_ternlog_blend_compare(seed):
    rng = np.random.default_rng(seed)
    t1, t2 = rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    idx = rng.integers(0, 2 ** 31, 16).astype(np.int32)
    w = rng.integers(0, 2 ** 16, 32).astype(np.uint16)
    widx = rng.integers(0, 2 ** 16, 32).astype(np.uint16)
    imm = int(rng.integers(0, 256))
    out = np.zeros(16 * 6, np.uint32)
    prog = [_e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[0], mem(0, R.RDI)), _e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[1], mem(0, R.RSI)),
            _e("VMOVDQU32_ZMM_K1Z_ZMMM512", Z[2], mem(0, R.RDX)),
            _e("VMOVAPS_ZMM_K1Z_ZMMM512", Z[3], Z[0]), _e("VPERMT2PS_ZMM_K1Z_ZMM_ZMMM512B32", Z[3], Z[2], Z[1]),
            _e("VMOVAPS_ZMM_K1Z_ZMMM512", Z[4], Z[2]), _e("VPERMI2PS_ZMM_K1Z_ZMM_ZMMM512B32", Z[4], Z[0], Z[1]),
            _e("VMOVDQU16_ZMM_K1Z_ZMMM512", Z[5], mem(0, R.RCX)), _e("VMOVDQU16_ZMM_K1Z_ZMMM512", Z[6], mem(0, R.R8)),
            _e("VPERMW_ZMM_K1Z_ZMM_ZMMM512", Z[7], Z[6], Z[5]),
            _e("VMOVAPS_ZMM_K1Z_ZMMM512", Z[8], Z[0]), _e("VPTERNLOGD_ZMM_K1Z_ZMM_ZMMM512B32_IMM8", Z[8], Z[1], Z[2], Imm(imm)),
            _e("VCMPPS_KR_K1_ZMM_ZMMM512B32_IMM8_SAE", K[1], Z[0], Z[1], Imm(1)),
            _e("VBLENDMPS_ZMM_K1Z_ZMM_ZMMM512B32", Z[9], Z[0], Z[1], k=K[1]),
            _e("VPCMPD_KR_K1_ZMM_ZMMM512B32_IMM8", K[2], Z[2], mem(0, R.RDI, bcst=True), Imm(6)),
            mk("VEX_KMOVW_R32_KR", R.EAX, K[2]), mk("MOV_RM32_R32", mem(380, R.R9), R.EAX)]
    for j, z in enumerate((3, 4, 7, 8, 9)):
        prog.append(_e("VMOVUPS_ZMMM512_K1Z_ZMM", mem(64 * j, R.R9), Z[z]))
    m, (p0, p1, p2, p3, p4, po) = run(prog, t1, t2, idx, w, widx, out)
    got = m.read(po, like=out)
    both = np.concatenate([t1, t2])
    assert (got[:16] == both.view(np.uint32)[idx & 31]).all()
    assert (got[16:32] == both.view(np.uint32)[idx & 31]).all()
    assert (got[32:48].view(np.uint16) == w[widx & 31]).all()
    a, b, c = t1.view(np.uint32), t2.view(np.uint32), idx.view(np.uint32)
    tern = np.zeros(16, np.uint32)
    for bit in range(32):
        sel = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
        tern |= ((imm >> sel.astype(np.int64)) & 1).astype(np.uint32) << bit
    assert (got[48:64] == tern).all()
    assert (got[64:80] == np.where(t1 < t2, t2, t1).view(np.uint32)).all()
    assert got[95] == sum(1 << i for i in range(16) if idx[i] > t1.view(np.int32)[0])


def test_kmask_loop_and_vpmov_down_convert():
    """A counted loop with kortestw/jcc; vpmovdb with a masked store."""
    x = np.arange(16, dtype=np.int32) * 17 - 100
    out = np.full(16, 0xEE, np.uint8)
    body = [_e("VPADDD_ZMM_K1Z_ZMM_ZMMM512B32", Z[0], Z[0], mem(0, R.RDI, bcst=True))]
    prog = [_e("VPXORD_ZMM_K1Z_ZMM_ZMMM512B32", Z[0], Z[0], Z[0]), mk("MOV_R32_IMM32", R.ECX, Imm(3))]
    prog += label_loop(body)
    prog += [mk("VEX_KXNORW_KR_KR_KR", K[1], K[0], K[0]), mk("VEX_KSHIFTRW_KR_KR_IMM8", K[1], K[1], Imm(6)),
             mk("VEX_KORTESTW_KR_KR", K[1], K[1]),
             _e("VPADDD_ZMM_K1Z_ZMM_ZMMM512B32", Z[1], Z[0], mem(0, R.RDI)),
             _e("VPMOVDB_XMMM128_K1Z_ZMM", mem(0, R.RSI), Z[1], k=K[1])]
    m, (px, po) = run(prog, x, out)
    got = m.read(po, like=out)
    want = (x + 3 * x[0]).astype(np.uint8)
    assert (got[:10] == want[:10]).all() and (got[10:] == 0xEE).all()
    assert m.fl[1] == 0 and m.fl[0] == 0  # kortest: not zero, not all ones


def test_evex_misc_against_numpy():
    """vrcp14ps/vrsqrt14ps within 2^-14, vscalefps, vgetexpps, vrndscaleps, zmm16-31, and a VEX
    write zeroing bits 256-511; vpmovzxbd masked at the end of an array (byte-granular)."""
    x = np.array([1.5, -3.25, 1e-3, 7e5, 0.1, 2.0, -0.75, 1e-40] * 2, np.float32)
    y = np.array([2.0, -1.0, 3.7, -2.5, 0.0, 10.0, 1.0, 4.0] * 2, np.float32)
    b = np.arange(1, 6, dtype=np.uint8)                                   # 5 bytes only
    out = np.zeros(16 * 7, np.float32)
    prog = [_e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[20], mem(0, R.RDI)), _e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[21], mem(0, R.RSI)),
            _e("VRCP14PS_ZMM_K1Z_ZMMM512B32", Z[22], Z[20]), _e("VRSQRT14PS_ZMM_K1Z_ZMMM512B32", Z[23], Z[21]),
            _e("VSCALEFPS_ZMM_K1Z_ZMM_ZMMM512B32_ER", Z[24], Z[20], Z[21]), _e("VGETEXPPS_ZMM_K1Z_ZMMM512B32_SAE", Z[25], Z[20]),
            _e("VRNDSCALEPS_ZMM_K1Z_ZMMM512B32_IMM8_SAE", Z[26], Z[20], Imm(0x11)),
            mk("MOV_R32_IMM32", R.EAX, Imm(0x1F)), mk("VEX_KMOVW_KR_R32", K[4], R.EAX),
            _e("VPMOVZXBD_ZMM_K1Z_XMMM128", Z[27], mem(0, R.RDX), k=K[4], z=True),
            _e("VMOVAPS_ZMM_K1Z_ZMMM512", Z[5], Z[20]), mk("VEX_VADDPS_YMM_YMM_YMMM256", R.YMM5, R.YMM5, R.YMM5)]
    for j, z in enumerate((22, 23, 24, 25, 26, 27, 5)):
        prog.append(_e("VMOVUPS_ZMMM512_K1Z_ZMM", mem(64 * j, R.RCX), Z[z]))
    m, ptrs = run(prog, x, y, b, out)
    got = m.read(ptrs[3], like=out).reshape(7, 16)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    fin = np.arange(16) % 8 != 7                      # 1/1e-40 overflows to inf
    assert np.all(np.abs(got[0][fin] - 1 / x64[fin]) <= 2 ** -14 * np.abs(1 / x64[fin])) and got[0][7] == np.inf
    pos = y64 > 0
    assert np.all(np.abs(got[1][pos] - y64[pos] ** -0.5) <= 2 ** -14 * y64[pos] ** -0.5)
    assert np.isnan(got[1][y64 < 0]).all() and got[1][4] == np.inf
    assert (got[2] == (x64 * np.exp2(np.floor(y64))).astype(np.float32)).all()
    assert (got[3][:7] == np.floor(np.log2(np.abs(x64[:7])))).all() and got[3][7] == -133
    assert (got[4] == (np.floor(x64 * 2) / 2).astype(np.float32)).all()
    assert (got[5].view(np.int32)[:5] == b).all() and (got[5].view(np.int32)[5:] == 0).all()
    assert (got[6][:8] == 2 * x[:8]).all() and (got[6][8:] == 0).all()


def test_nan_lanes_of_scalef_getexp_and_vroundps_upper_imm_bits():
    """As hardware does (checked against Zen 4): a NaN scale of vscalefps gives that NaN, quieted,
    and vgetexpps of a NaN its NaN, quieted, even where no other lane is NaN or inf; vroundps ignores
    imm[7:4] (only vrndscaleps scales by them). A differential fuzzer found all three."""
    nan_bits = np.array([0x7FC00000, 0xFF912345] + [0x3F800000] * 14, np.uint32)
    x = np.full(16, 3.0, np.float32)
    r = np.array([1.75, -0.75, 2.3, 0.5, 1.5, 2.5, -1.25, 3.75] * 2, np.float32)
    out = np.zeros(16 * 3, np.float32)
    prog = [_e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[1], mem(0, R.RDI)), _e("VMOVUPS_ZMM_K1Z_ZMMM512", Z[2], mem(0, R.RSI)),
            _e("VSCALEFPS_ZMM_K1Z_ZMM_ZMMM512B32_ER", Z[3], Z[2], Z[1]),
            _e("VGETEXPPS_ZMM_K1Z_ZMMM512B32_SAE", Z[4], Z[1]),
            mk("VEX_VMOVUPS_YMM_YMMM256", R.YMM5, mem(0, R.RDX)),
            mk("VEX_VROUNDPS_YMM_YMMM256_IMM8", R.YMM6, R.YMM5, Imm(0x11)),
            _e("VMOVUPS_ZMMM512_K1Z_ZMM", mem(0, R.RCX), Z[3]), _e("VMOVUPS_ZMMM512_K1Z_ZMM", mem(64, R.RCX), Z[4]),
            _e("VMOVUPS_ZMMM512_K1Z_ZMM", mem(128, R.RCX), Z[6])]
    m, ptrs = run(prog, nan_bits.view(np.float32), x, r, out)
    got = m.read(ptrs[3], like=out).reshape(3, 16)
    quiet = [0x7FC00000, 0xFFD12345]
    assert list(_bits(got[0][:2])) == quiet and (got[0][2:] == 6.0).all()      # 3 * 2^1
    assert list(_bits(got[1][:2])) == quiet and (got[1][2:] == 0.0).all()      # log2(1) = 0
    assert (got[2][:8] == np.floor(r[:8])).all()


@FAST
@given(seed=ints)
def test_evex_lane_moves_against_numpy(seed):
    """vpbroadcastd from a GPR, vextractf32x4, vinsertf64x4, vshuff32x4, vpmovdw, vpdpwssd,
    vpunpckldq and vpshufb in EVEX form, with zeroing masks from kmovw loaded from memory."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 2 ** 32, 16, dtype=np.uint32)
    b = rng.integers(0, 2 ** 32, 16, dtype=np.uint32)
    kmask = np.array([rng.integers(0, 2 ** 16)], np.uint16)
    imm, r32 = int(rng.integers(0, 256)), int(rng.integers(0, 2 ** 32))
    out = np.zeros(16 * 8, np.uint32)
    prog = [_e("VMOVDQU32_ZMM_K1Z_ZMMM512", Z[0], mem(0, R.RDI)), _e("VMOVDQU32_ZMM_K1Z_ZMMM512", Z[1], mem(0, R.RSI)),
            mk("VEX_KMOVW_KR_KM16", K[5], mem(0, R.RDX)), mk("MOV_R32_IMM32", R.R11D, Imm(r32)),
            _e("VPBROADCASTD_ZMM_K1Z_R32", Z[2], R.R11D, k=K[5], z=True),
            _e("VEXTRACTF32X4_XMMM128_K1Z_ZMM_IMM8", R.XMM3, Z[0], Imm(imm & 3)),
            _e("VINSERTF64X4_ZMM_K1Z_ZMM_YMMM256_IMM8", Z[4], Z[0], R.YMM1, Imm(imm & 1)),
            _e("VSHUFF32X4_ZMM_K1Z_ZMM_ZMMM512B32_IMM8", Z[5], Z[0], Z[1], Imm(imm)),
            _e("VPMOVDW_YMMM256_K1Z_ZMM", R.YMM6, Z[0]),
            _e("VMOVDQA32_ZMM_K1Z_ZMMM512", Z[7], Z[1]), _e("VPDPWSSD_ZMM_K1Z_ZMM_ZMMM512B32", Z[7], Z[0], Z[1], k=K[5]),
            _e("VPUNPCKLDQ_ZMM_K1Z_ZMM_ZMMM512B32", Z[8], Z[0], Z[1]),
            _e("VPSHUFB_ZMM_K1Z_ZMM_ZMMM512", Z[9], Z[0], Z[1])]
    for j, z in enumerate((2, 3, 4, 5, 6, 7, 8, 9)):
        prog.append(_e("VMOVDQU32_ZMMM512_K1Z_ZMM", mem(64 * j, R.RCX), Z[z]))
    m, ptrs = run(prog, a, b, kmask, out)
    got = m.read(ptrs[3], like=out).reshape(8, 16)
    bits = (int(kmask[0]) >> np.arange(16)) & 1 == 1
    assert (got[0] == np.where(bits, r32, 0)).all()
    blk = a.reshape(4, 4)
    assert (got[1][:4] == blk[imm & 3]).all() and (got[1][4:] == 0).all()
    ins = a.copy()
    ins[8 * (imm & 1):8 * (imm & 1) + 8] = b[:8]
    assert (got[2] == ins).all()
    bb = b.reshape(4, 4)
    assert (got[3] == np.concatenate([blk[imm & 3], blk[(imm >> 2) & 3], bb[(imm >> 4) & 3], bb[imm >> 6]])).all()
    assert (got[4].view(np.uint16)[:16] == a.astype(np.uint16)).all() and (got[4][8:] == 0).all()
    dp = (a.view(np.int16).astype(np.int64) * b.view(np.int16)).reshape(16, 2).sum(1) + b.view(np.int32)
    assert (got[5] == np.where(bits, dp.astype(np.int32).view(np.uint32), b)).all()
    assert (got[6].reshape(4, 4) == np.stack([blk[:, 0], bb[:, 0], blk[:, 1], bb[:, 1]], 1)).all()
    ab, sb = a.view(np.uint8).reshape(4, 16), b.view(np.uint8).reshape(4, 16)
    shuf = np.where(sb & 0x80, 0, np.take_along_axis(ab, (sb & 15).astype(np.int64), 1))
    assert (got[7].view(np.uint8) == shuf.reshape(-1)).all()


def test_module_doctests():
    import doctest
    import isa.x86.interp
    import isa.x86.interp.fp
    for mod in (isa.x86.interp.machine, isa.x86.interp.fp):
        assert doctest.testmod(mod).failed == 0


def test_refuses_embedded_rounding():
    ins = _e("VADDPS_ZMM_K1Z_ZMM_ZMMM512B32_ER", Z[0], Z[1], Z[2])
    ins.rounding_control = iced_x86.RoundingControl.ROUND_DOWN
    with pytest.raises(UnsupportedInstruction, match="rounding"):
        run([ins])


# ---- AMX ----------------------------------------------------------------------------------------

def tilecfg(shapes, palette=1):
    cfg = np.zeros(64, np.uint8)
    cfg[0] = palette
    for t, (rows, colsb) in shapes.items():
        cfg[16 + 2 * t:18 + 2 * t] = np.array([colsb], np.uint16).view(np.uint8)
        cfg[48 + t] = rows
    return cfg


def amx_program(op, M, K4, N):
    """C(MxN) += A(M x 4*K4 bytes) . B(K4 x 4N bytes) with ldtilecfg, loads, dot, store, release."""
    return [mk("VEX_LDTILECFG_M512", mem(0, R.RDI)),
            mk("MOV_R32_IMM32", R.EAX, Imm(4 * K4)), mk("MOV_R32_IMM32", R.R10D, Imm(4 * N)),
            mk("VEX_TILELOADD_TMM_SIBMEM", R.TMM1, MemoryOperand(R.RSI, R.RAX, 1, 0, 0)),
            mk("VEX_TILELOADDT1_TMM_SIBMEM", R.TMM2, MemoryOperand(R.RDX, R.R10, 1, 0, 0)),
            mk("VEX_TILELOADD_TMM_SIBMEM", R.TMM0, MemoryOperand(R.RCX, R.R10, 1, 0, 0)),
            mk(f"VEX_{op}_TMM_TMM_TMM", R.TMM0, R.TMM1, R.TMM2),
            mk("VEX_TILESTORED_SIBMEM_TMM", MemoryOperand(R.RCX, R.R10, 1, 0, 0), R.TMM0),
            mk("VEX_TILERELEASE")]


shapes = st.tuples(st.integers(1, 16), st.integers(1, 16), st.integers(1, 16))


@FAST
@given(shape=shapes, seed=ints)
def test_tdpbf16ps_against_numpy(shape, seed):
    import ml_dtypes
    M, K2, N = shape                       # A: M x 2*K2 bf16, B (VNNI2): K2 x N pairs
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, 2 * K2)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((2 * K2, N)).astype(ml_dtypes.bfloat16)
    bv = b.reshape(K2, 2, N).transpose(0, 2, 1).copy()      # VNNI2: B[k2][n][pair]
    c = rng.standard_normal((M, N)).astype(np.float32)
    cfg = tilecfg({0: (M, 4 * N), 1: (M, 4 * K2), 2: (K2, 4 * N)})
    m, (pc_, pa, pb, pcc) = run(amx_program("TDPBF16PS", M, K2, N), cfg, a, bv, c)
    got = m.read(pcc, like=c).astype(np.float64)
    af, bf = a.astype(np.float64), b.astype(np.float64)
    exact = c + af @ bf
    bound = 2.0 ** -21 * (np.abs(c) + np.abs(af) @ np.abs(bf)) * (K2 + 2)
    assert np.all(np.abs(got - exact) <= bound + 1e-30)
    assert [(n, a_) for _, n, a_ in m.stats.tile_loads] == [("tileloadd", pa), ("tileloaddt1", pb), ("tileloadd", pcc)]
    assert m.stats.counts["tdpbf16ps"] == 1


def test_tdpbf16ps_exact_on_small_integers():
    import ml_dtypes
    a = np.arange(16 * 32).reshape(16, 32) % 7 - 3
    b = np.arange(32 * 16).reshape(32, 16) % 5 - 2
    c = np.ones((16, 16), np.float32)
    bv = b.astype(ml_dtypes.bfloat16).reshape(16, 2, 16).transpose(0, 2, 1).copy()
    cfg = tilecfg({0: (16, 64), 1: (16, 64), 2: (16, 64)})
    m, ptrs = run(amx_program("TDPBF16PS", 16, 16, 16), cfg, a.astype(ml_dtypes.bfloat16), bv, c)
    assert (m.read(ptrs[3], like=c) == 1 + a @ b).all()


@pytest.mark.parametrize("op,sa,sb", [("TDPBUSD", 0, 1), ("TDPBSUD", 1, 0), ("TDPBSSD", 1, 1), ("TDPBUUD", 0, 0)])
@FAST
@given(shape=shapes, seed=ints)
def test_tdpb_int8_against_numpy(op, sa, sb, shape, seed):
    M, K4, N = shape
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (M, 4 * K4), dtype=np.uint8)
    b = rng.integers(0, 256, (4 * K4, N), dtype=np.uint8)
    bv = b.reshape(K4, 4, N).transpose(0, 2, 1).copy()       # VNNI4
    c = rng.integers(-2 ** 31, 2 ** 31, (M, N), dtype=np.int64).astype(np.int32)
    cfg = tilecfg({0: (M, 4 * N), 1: (M, 4 * K4), 2: (K4, 4 * N)})
    m, ptrs = run(amx_program(op, M, K4, N), cfg, a, bv, c)
    av = a.view(np.int8) if sa else a
    bw = b.view(np.int8) if sb else b
    want = (c.astype(np.int64) + av.astype(np.int64) @ bw.astype(np.int64)).astype(np.int32)
    assert (m.read(ptrs[3], like=c) == want).all()


def test_amx_faults():
    a = np.zeros((16, 64), np.uint8)
    bad_shape = tilecfg({0: (4, 64), 1: (4, 64), 2: (8, 64)})        # a.colsb/4 = 16 != b.rows = 8
    with pytest.raises(InvalidOpcode, match="shape"):
        run(amx_program("TDPBUSD", 4, 16, 16), bad_shape, a, a, a)
    with pytest.raises(InvalidOpcode, match="#GP"):
        run(amx_program("TDPBUSD", 4, 4, 4), tilecfg({0: (17, 64)}), a, a, a)
    with pytest.raises(InvalidOpcode, match="#GP"):
        run(amx_program("TDPBUSD", 4, 4, 4), tilecfg({0: (4, 16)}, palette=2), a, a, a)
    with pytest.raises(InvalidOpcode, match="not configured"):
        run([mk("VEX_TILEZERO_TMM", R.TMM3)])
    with pytest.raises(MemoryFault):  # a tile row past the end of B
        run(amx_program("TDPBUSD", 16, 16, 16), tilecfg({0: (16, 64), 1: (16, 64), 2: (16, 64)}),
            a, a[:15], a)


# ---- refusals and faults ----------------------------------------------------------------------

def test_refuses_unmodelled_instructions_with_their_text():
    with pytest.raises(UnsupportedInstruction) as e:
        run([mk("CPUID")])
    assert "cpuid" in str(e.value) and e.value.ip == 0x40_0000
    with pytest.raises(UnsupportedInstruction, match="addps xmm0,xmm1"):
        run([mk("ADDPS_XMM_XMMM128", R.XMM0, R.XMM1)])
    with pytest.raises(UnsupportedInstruction, match="jp"):
        run([Ins.create_branch(C.JP_REL32_64, 0x1000)])


def test_memory_fault_names_address_and_instruction():
    a = np.zeros(4, np.int64)
    with pytest.raises(MemoryFault) as e:
        run([mk("MOV_R64_RM64", R.RAX, mem(32, R.RDI))], a)
    assert e.value.address == 0x1000_0000 + 32 and "mov rax,[rdi+20h]" in str(e.value)
    run([mk("PREFETCHT0_M8", mem(1 << 20, R.RDI)), mk("PREFETCHW_M8", mem(0, R.RAX))], a)  # never fault
    with pytest.raises(MemoryFault, match="misaligned"):
        run([_e("VMOVAPS_ZMM_K1Z_ZMMM512", Z[0], mem(4, R.RDI))], np.zeros(64, np.float32))


def test_call_into_loaded_code_and_stack_args():
    m = Machine()
    callee = m.load(assemble([mk("LEA_R64_M", R.RAX, MemoryOperand(R.RDI, R.RSI, 1, 0, 0)), mk("RETNQ")]))
    caller = assemble([mk("PUSH_R64", R.RBX), mk("MOV_R64_RM64", R.RBX, mem(16, R.RSP)),   # 7th arg
                       mk("CALL_RM64", R.R9), mk("ADD_R64_RM64", R.RAX, R.RBX), mk("POP_R64", R.RBX), mk("RETNQ")])
    assert m.call(caller, [40, 2, 0, 0, 0, callee, 100]) == 142


def test_step_limit_and_abi_check():
    from isa.x86.interp import AbiViolation, StepLimit
    spin = Ins.create_branch(C.JMP_REL32_64, 0x1000)
    spin.ip = 0x1000
    with pytest.raises(StepLimit):
        Machine().call(assemble([spin]), max_steps=1000)
    with pytest.raises(AbiViolation):
        run([mk("XOR_R32_RM32", R.EBX, R.EBX)])
    m = Machine()
    assert m.call(assemble([mk("XOR_R32_RM32", R.EBX, R.EBX), mk("RETNQ")]), check_abi=False) == 0


def test_reference_semantics_listed():
    ref = reference()
    for name in ("vfmadd231ps", "vdpbf16ps", "tdpbf16ps", "tileloadd", "vpdpbusd", "kmovw", "jne", "vpermt2ps"):
        assert name in ref and ref[name]
