"""An adversarial pass over the x86 interpreter's model of memory and machine state, against this CPU.

- Every VEX/EVEX form with a memory operand runs with that operand against a PROT_NONE page (ending
  0 or 1 bytes inside the mapping, straddling it, or starting right after the page below), masked with
  prefix masks, all-zero masks and random ones: natively in a forked child (a fault kills only it) and
  in the interpreter on a region holding just the accessible bytes. The outcomes must agree: the same
  fault or no fault, then every register bit and every byte of the region.
- AVX2 ``vmaskmovps``/``vpmaskmovd/q`` loads and stores at a guard page, with lane masks.
- The FTZ of ``vdpbf16ps`` (tiny after rounding to 24 bits) and the SDM's ``tdpbf16ps`` pseudo-code
  (two FMA chains, DAZ/FTZ/RNE, then dst + (even + odd)) in exact rationals; tile shapes, zeroing,
  store extents and #UD/#GP conditions.
- Address arithmetic that wraps, 32-bit writes zero-extending, ``cmov`` from memory, and refusals.

Needs AVX-512 F/BW/VL (BF16 for its test) for the native parts and skips them elsewhere.
"""

from __future__ import annotations

import ctypes
import faulthandler
import mmap
import os
import random
import zlib
from fractions import Fraction

import numpy as np
import pytest

import iced_x86
from iced_x86 import Code as C
from iced_x86 import MemoryOperand, MemorySizeExt, OpCodeInfo, OpKind, RegisterExt
from iced_x86 import Register as R

from isa.cpu import host
from isa.x86.interp import InvalidOpcode, Machine, MemoryFault, UnsupportedInstruction
from tests.x86 import test_interp_evex as E
from tests.x86.test_interp import CF, OF, SF, ZF, Case, Imm, NativeCode, assemble, compare, make_state, mem, mk
from tests.x86.test_interp import tilecfg

needs_avx512 = E.needs_avx512
PAGE = mmap.PAGESIZE
RSI_OFF = 2168                    # a free qword of the evex state block (after the GPRs): rsi's value
_SET_RSI = E._encode([mk("MOV_R64_RM64", R.RSI, E._m(RSI_OFF))])
_LEA_RSI = E._encode([mk("LEA_R64_M", R.RSI, E._m(E.DATA_OFF + E.MID))])
assert E._PROLOGUE.endswith(_LEA_RSI)
PROLOGUE = E._PROLOGUE[:-len(_LEA_RSI)] + _SET_RSI


# ---- a window of pages between two PROT_NONE pages, shared with forked children ---------------------

class Fenced:
    """``pages`` accessible pages between two inaccessible ones (``win``), and the state block; both
    in shared mappings, so what a forked child writes there is seen here."""

    def __init__(self, pages: int = 2):
        self.buf = mmap.mmap(-1, (pages + 2) * PAGE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.buf))
        libc = ctypes.CDLL(None)
        for p in (0, pages + 1):
            assert libc.mprotect(ctypes.c_void_p(base + p * PAGE), PAGE, 0) == 0
        self.lo, self.n = base + PAGE, pages * PAGE
        self.win = np.frombuffer(self.buf, np.uint8, count=self.n, offset=PAGE)
        self.sbuf = mmap.mmap(-1, E.STATE)
        self.state = np.frombuffer(self.sbuf, np.uint8)

    def native(self, code: bytes, state: np.ndarray, win: np.ndarray):
        """(state, window) after ``code`` ran on them natively, or None when it faulted."""
        self.state[:] = state
        self.win[:] = win
        fn = NativeCode(code)
        pid = os.fork()
        if pid == 0:                                   # the child: run, and leave without cleanup
            faulthandler.disable()                     # (a fault here is an outcome, not a crash report)
            try:
                fn.fn(self.state.ctypes.data)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            assert os.WTERMSIG(status) in (11, 7), status          # SIGSEGV, SIGBUS
            return None
        assert os.WEXITSTATUS(status) == 0
        return self.state.copy(), self.win.copy()


def interp(code: bytes, state: np.ndarray, win: np.ndarray, rsi_off: int):
    """(state, window) after ``code`` ran in a Machine whose only data region is ``win`` (rsi =
    its start + rsi_off), or the MemoryFault it raised."""
    m = Machine()
    base = m.map(win)
    m.v[:] = state[E.ZMM_OFF:E.K_OFF].reshape(32, 64)
    m.k[:] = [int(x) for x in state[E.K_OFF:E.GPR_OFF].view(np.uint64)]
    for num, val in zip(E.GPR_NUM, state[E.GPR_OFF:E.FLAG_OFF].view(np.uint64)):
        m.g[num] = int(val)
    try:
        m.call(code + b"\xc3", [0, base + rsi_off] + [m.g[n] for n in (2, 1, 8, 9)], max_steps=10,
               check_abi=False)
    except MemoryFault as e:
        return e
    out = state.copy()
    out[E.ZMM_OFF:E.K_OFF] = m.v.reshape(-1)
    out[E.K_OFF:E.GPR_OFF] = np.array(m.k, np.uint64).view(np.uint8)
    out[E.GPR_OFF:E.GPR_OFF + 8 * len(E.GPRS)] = np.array([m.g[n] for n in E.GPR_NUM], np.uint64).view(np.uint8)
    out[E.FLAG_OFF:E.FLAG_OFF + 4] = m.fl
    return out, m.read(base, nbytes=len(win))


_FENCE = Fenced()


def _offset(ins, state) -> int:
    """The memory operand's address minus rsi."""
    return E._operand_bytes(ins, state)[-1][0] - (E.DATA_OFF + E.MID)


def place(ins, state, at: int) -> int:
    """Set rsi in ``state`` so that the memory operand starts at window offset ``at``; rsi's offset."""
    rsi_off = at - _offset(ins, state)
    state[RSI_OFF:RSI_OFF + 8] = np.array([(_FENCE.lo + rsi_off) % 2 ** 64], np.uint64).view(np.uint8)
    return rsi_off


def set_k(state, kreg, value: int) -> None:
    n = RegisterExt.number(kreg)
    state[E.K_OFF + 8 * n:E.K_OFF + 8 * n + 8] = np.array([value], np.uint64).view(np.uint8)


def check_both(ins, state, win, rsi_off, label) -> bool:
    """Run ins both ways; assert the same fault outcome, then the same state and window. True: faulted.
    Aligned moves are the one known difference: misaligned, they fault here even when no lane is
    enabled, where Zen 4 does not (the stricter rule is kept)."""
    code = E._encode([ins])
    want = _FENCE.native(PROLOGUE + code + E._EPILOGUE, state, win)
    got = interp(code, state, win, rsi_off)
    if isinstance(got, MemoryFault) and want is not None and got.why == "misaligned aligned access" \
            and ins.op_mask != R.NONE:
        k = int(state[E.K_OFF + 8 * RegisterExt.number(ins.op_mask):].view(np.uint64)[0])
        assert k & ((1 << MemorySizeExt.element_count(ins.memory_size)) - 1) == 0, label
        return True
    assert (want is None) == isinstance(got, MemoryFault), \
        f"{label}: native {'faults' if want is None else 'runs'}, the interpreter " + \
        (f"raised {got}" if isinstance(got, MemoryFault) else "runs")
    if want is None:
        return True
    E.compare(ins, want[0], got[0], label)
    bad = np.flatnonzero(want[1] != got[1])
    assert bad.size == 0, f"{label}: window byte {bad[0]} (of {bad.size}) differs: " \
                          f"native {want[1][bad[0]]:#x}, interp {got[1][bad[0]]:#x}"
    return False


def _memory_draw(name, r):
    for _ in range(50):
        ins = E.draw(name, r)
        if any(ins.op_kind(i) == OpKind.MEMORY for i in range(ins.op_count)):
            return ins
    return None


def _has_memory(code_name: str) -> bool:
    info = OpCodeInfo(getattr(C, code_name))
    return any("MEM" in E._KIND[info.op_kind(i)] for i in range(info.op_count))


MEM_FORMS = {mn: [n for n in names if _has_memory(n)] for mn, names in {**E.VEX_FORMS, **E.EVEX_FORMS}.items()}
MEM_FORMS = {mn: names for mn, names in sorted(MEM_FORMS.items()) if names}


@needs_avx512
@pytest.mark.parametrize("mnemonic", sorted(MEM_FORMS))
def test_memory_operands_at_a_guard_page(mnemonic):
    """Each form: the operand straddling the end of the mapping (all lanes masked off, where the form
    takes a mask), then draws at the end or the start with 0 or 1 bytes inside or across it."""
    ran = 0
    for name in MEM_FORMS[mnemonic]:
        info = OpCodeInfo(getattr(C, name))
        for d in range(3):
            seed = zlib.crc32(f"guard:{name}:{d}".encode())
            r = random.Random(seed)
            ins = _memory_draw(name, r)
            if ins is None:
                continue
            if d == 0 and info.can_use_op_mask_register:
                ins.op_mask = R.K1
            elif d == 1 and info.can_use_op_mask_register and ins.op_mask == R.NONE:
                ins.op_mask = E.KREG[r.randrange(1, 8)]
            state = E.make_state(seed, "floats")
            win = np.random.default_rng(seed).integers(0, 256, _FENCE.n, dtype=np.uint8)
            size = MemorySizeExt.size(ins.memory_size)
            if d == 0:
                cut, end = max(1, size // 2), True
            else:
                cut, end = r.choice([0, 1, size - 1, r.randrange(size)]) % size, r.random() < 0.6
            at = _FENCE.n - size + cut if end else -cut
            rsi_off = place(ins, state, at)
            kv = None
            if ins.op_mask != R.NONE:
                lanes = r.randrange(65)
                kv = 0 if d == 0 else r.choice([(1 << lanes) - 1, (2 ** 64 - 1) ^ ((1 << lanes) - 1),
                                                 r.getrandbits(64), 0])
                set_k(state, ins.op_mask, kv)
            label = f"{ins} ({name}, draw {d}, operand at window {at:+d}, k={kv if kv is None else hex(kv)})"
            try:
                check_both(ins, state, win, rsi_off, label)
            except UnsupportedInstruction:             # masked scalar forms: refused, so unmasked
                ins = E._plain(ins)
                check_both(ins, state, win, place(ins, state, at), label + " unmasked")
            ran += 1
    assert ran > 0


def _zero_masked_outcome(code_name: str, bcst: bool):
    """(native faulted, interp faulted) for ins{k1 = 0} with its memory operand across the guard."""
    r = random.Random(7)
    for _ in range(300):
        ins = _memory_draw(code_name, r)
        if ins is not None and ins.is_broadcast == bcst and ins.memory_index == R.NONE:
            break
    ins.op_mask = R.K1
    state = E.make_state(5, "floats")
    set_k(state, R.K1, 0)
    size = MemorySizeExt.size(ins.memory_size)
    rsi_off = place(ins, state, _FENCE.n - size + max(1, size // 2))
    code = E._encode([ins])
    win = np.zeros(_FENCE.n, np.uint8)
    return _FENCE.native(PROLOGUE + code + E._EPILOGUE, state, win) is None, \
        isinstance(interp(code, state, win, rsi_off), MemoryFault)


# The interpreter suppressed the faults of masked-off elements for every masked EVEX form; the SDM's
# E4NF/E6NF forms (here: shuffles, permutes, unpacks, packs, inserts, extracts, vpmaddwd, vcvtne2ps2bf16,
# shifts by a memory count) access the whole operand, and this CPU faults on them with k = 0; and the
# {1toN} path skipped the read of vpermt2ps & co. whose whole-operand flag it ignored. A kernel with
# such a tail passed in the interpreter and crashed natively.
@needs_avx512
@pytest.mark.parametrize("code_name,bcst", [("EVEX_VSHUFPS_ZMM_K1Z_ZMM_ZMMM512B32_IMM8", False),
                                            ("EVEX_VPUNPCKLDQ_ZMM_K1Z_ZMM_ZMMM512B32", False),
                                            ("EVEX_VPERMT2PS_ZMM_K1Z_ZMM_ZMMM512B32", True),
                                            ("EVEX_VPERMD_ZMM_K1Z_ZMM_ZMMM512B32", False),
                                            ("EVEX_VINSERTF32X4_ZMM_K1Z_ZMM_XMMM128_IMM8", False),
                                            ("EVEX_VEXTRACTF32X4_XMMM128_K1Z_ZMM_IMM8", False),
                                            ("EVEX_VPSRLD_ZMM_K1Z_ZMM_XMMM128", False),
                                            ("EVEX_VPACKUSDW_ZMM_K1Z_ZMM_ZMMM512B32", False),
                                            ("EVEX_VCVTNE2PS2BF16_ZMM_K1Z_ZMM_ZMMM512B32", False)])
def test_forms_without_fault_suppression_fault_with_no_lane_enabled(code_name, bcst):
    assert _zero_masked_outcome(code_name, bcst) == (True, True)


# The interpreter read a memory broadcast's whole element whenever a mask was given (it found no lane
# granularity), so vpbroadcastd zmm{k}, [m32] with k = 0 at an unmapped address faulted; this CPU does
# not. Loads and converts keep suppressing.
@needs_avx512
@pytest.mark.parametrize("code_name", ["EVEX_VPBROADCASTD_ZMM_K1Z_XMMM32", "EVEX_VPBROADCASTW_YMM_K1Z_XMMM16",
                                       "EVEX_VBROADCASTSS_ZMM_K1Z_XMMM32", "EVEX_VPBROADCASTB_XMM_K1Z_XMMM8",
                                       "EVEX_VMOVUPS_ZMM_K1Z_ZMMM512", "EVEX_VPMOVZXBD_ZMM_K1Z_XMMM128",
                                       "EVEX_VCVTNEPS2BF16_YMM_K1Z_ZMMM512B32", "EVEX_VMOVDQU16_ZMMM512_K1Z_ZMM"])
def test_suppressing_forms_do_not_fault_with_no_lane_enabled(code_name):
    assert _zero_masked_outcome(code_name, False) == (False, False)


def _lane_case(code_name, kv, mapped_bytes):
    """ins{k1}{z} with its memory operand's first ``mapped_bytes`` bytes before the guard page."""
    ins = mk(code_name, getattr(R, code_name.split("_")[2] + "3"), MemoryOperand(R.RSI), k=R.K1, z=True)
    state = E.make_state(11, "floats", specials=False)
    set_k(state, R.K1, kv)
    size = MemorySizeExt.size(ins.memory_size)
    rsi_off = place(ins, state, _FENCE.n - mapped_bytes)
    win = np.random.default_rng(3).integers(0, 256, _FENCE.n, dtype=np.uint8)
    return check_both(ins, state, win, rsi_off, f"{ins} k={kv:#x}, {mapped_bytes} of {size} bytes mapped")


# The masked read took lane j to be bytes [j*g, (j+1)*g) with g = operand bytes / lanes: for a block
# broadcast (vbroadcastf32x4 zmm{k}: 16 lanes, 16 bytes) lane j read byte j, and for vcvtneps2bf16
# xmm{k}, m128 (8 bf16 lanes, 4 floats) two bytes of a float: the lanes got wrong values, silently,
# whenever the operand ran past the end of its region.
@needs_avx512
@pytest.mark.parametrize("code_name,kv,mapped", [("EVEX_VBROADCASTF32X4_ZMM_K1Z_M128", 0x1111, 4),
                                                 ("EVEX_VBROADCASTF32X4_ZMM_K1Z_M128", 0x3333, 8),
                                                 ("EVEX_VBROADCASTI64X2_ZMM_K1Z_M128", 0x55, 8),
                                                 ("EVEX_VBROADCASTF32X8_ZMM_K1Z_M256", 0x0F0F, 16),
                                                 ("EVEX_VCVTNEPS2BF16_XMM_K1Z_XMMM128B32", 0x3, 8),
                                                 ("EVEX_VCVTNEPS2BF16_XMM_K1Z_XMMM128B32", 0x7, 12),
                                                 ("EVEX_VPMOVZXWD_ZMM_K1Z_YMMM256", 0xFF, 16)])
def test_masked_lanes_read_their_own_elements_before_a_guard_page(code_name, kv, mapped):
    assert not _lane_case(code_name, kv, mapped)


# ---- AVX2 vmaskmov at a guard page ---------------------------------------------------------------------

_MASKMOV = ["VEX_VMASKMOVPS_YMM_YMM_M256", "VEX_VMASKMOVPS_XMM_XMM_M128", "VEX_VPMASKMOVD_YMM_YMM_M256",
            "VEX_VPMASKMOVQ_YMM_YMM_M256", "VEX_VMASKMOVPS_M256_YMM_YMM", "VEX_VPMASKMOVD_M128_XMM_XMM",
            "VEX_VPMASKMOVQ_M256_YMM_YMM"]


@needs_avx512
@pytest.mark.parametrize("code_name", _MASKMOV)
def test_vmaskmov_at_a_guard_page(code_name):
    """Lanes whose mask sign bit is clear are not accessed (no fault, no write, loaded as 0): prefix,
    suffix and random lane masks, the operand across the end or the start of the mapping."""
    store = code_name.split("_")[2].startswith("M")
    parts = code_name.split("_")
    width = 32 if "256" in code_name else 16
    reg = "YMM" if width == 32 else "XMM"
    regs = [getattr(R, f"{reg}{i}") for i in (1, 2)]
    ops = [MemoryOperand(R.RSI), regs[0], regs[1]] if store else [regs[0], regs[1], MemoryOperand(R.RSI)]
    ins = mk(code_name, *ops)
    esize = 8 if parts[1].endswith(("Q", "PD")) else 4
    lanes = width // esize
    mask_reg = 2 if not store else 1
    r = random.Random(code_name)
    faults = 0
    for d in range(24):
        state = E.make_state(zlib.crc32(f"{code_name}{d}".encode()), "floats")
        choice = r.randrange(4)
        keep = r.randrange(lanes + 1)
        on = [j < keep for j in range(lanes)] if choice == 0 else [j >= keep for j in range(lanes)] \
            if choice == 1 else [r.random() < 0.5 for _ in range(lanes)] if choice == 2 else [False] * lanes
        words = np.array([(r.getrandbits(esize * 8 - 1) | ((1 << (esize * 8 - 1)) if o else 0)) for o in on],
                         np.uint64 if esize == 8 else np.uint32)
        at = E.ZMM_OFF + 64 * mask_reg
        state[at:at + width] = words.view(np.uint8)
        cut = r.randrange(width)
        end = r.random() < 0.6
        rsi_off = place(ins, state, _FENCE.n - width + cut if end else -cut)
        win = np.random.default_rng(d).integers(0, 256, _FENCE.n, dtype=np.uint8)
        faults += check_both(ins, state, win, rsi_off, f"{ins} lanes {on} end={end} cut={cut}")
    assert 0 < faults < 24


# ---- vdpbf16ps FTZ and vpdpbusd / vpmaddubsw saturation against this CPU ------------------------------

def _bf(x) -> int:
    return int(np.array([x], np.float32).view(np.uint32)[0] >> 16)


def _run_xmm(code_name, x0, x1, x2, dtype):
    ins = mk(code_name, R.XMM0, R.XMM1, R.XMM2)
    code = E._encode([ins])
    state = E.make_state(0, "floats", specials=False)
    for reg, x in enumerate((x0, x1, x2)):
        raw = np.asarray(x, dtype).view(np.uint8)
        state[64 * reg:64 * reg + raw.size] = raw
    want = E.run_native(NativeCode(E._PROLOGUE + code + E._EPILOGUE), state)
    got = E.Interpreted().run(code, state)
    return want[:16].view(np.uint32), got[:16].view(np.uint32)


# fp.fma32 flushed (FTZ) what it had rounded on the float32 denormal grid; x86 flushes what is tiny after
# rounding to 24 bits with an unbounded exponent. 2^-126 - 3*2^-152 rounds to 2^-126 on the denormal grid
# (kept), but to 2^-126 - 2^-150 in 24 bits (tiny: 0 on this CPU). Same for the AMX model.
@needs_avx512
@pytest.mark.skipif(not host().has("avx512_bf16"), reason="host lacks AVX512-BF16")
def test_vdpbf16ps_flushes_what_is_tiny_after_rounding():
    t = 2.0 ** -126
    acc = np.array([t, t, -t, t], np.float32)                       # acc + a.odd * b.odd (+ 0 * 0)
    a = [(1.5 * 2 ** -76), (1.5 * 2 ** -76), (-1.5 * 2 ** -76), 2.0 ** -76]
    b = [-2.0 ** -75, -2.0 ** -76, 2.0 ** -75, -2.0 ** -74]
    pack = lambda v: np.array([_bf(x) << 16 for x in v], np.uint32)   # noqa: E731  (even bf16 = 0)
    want, got = _run_xmm("EVEX_VDPBF16PS_XMM_K1Z_XMM_XMMM128B32", acc, pack(a), pack(b), None)
    assert list(want) == [0, 0x800000, 0x80800000, 0], [hex(x) for x in want]
    assert list(got) == list(want), [hex(x) for x in got]


@needs_avx512
@pytest.mark.parametrize("code_name", ["EVEX_VPDPBUSDS_XMM_K1Z_XMM_XMMM128B32", "EVEX_VPDPBUSD_XMM_K1Z_XMM_XMMM128B32",
                                       "VEX_VPMADDUBSW_XMM_XMM_XMMM128", "EVEX_VPDPWSSDS_XMM_K1Z_XMM_XMMM128B32"])
def test_integer_dot_products_at_their_limits(code_name):
    """Accumulators at INT32_MAX/MIN and byte/word products at their extremes: saturate or wrap."""
    if OpCodeInfo(getattr(C, code_name)).encoding == iced_x86.EncodingKind.EVEX and not host().has("avx512_vnni"):
        pytest.skip("host lacks AVX512-VNNI")
    acc = np.array([2 ** 31 - 1, -2 ** 31, 2 ** 31 - 100, -2 ** 31 + 100], np.int32)
    a = np.array([0xFF, 0xFF, 0xFF, 0xFF, 0x80, 0x80, 0x80, 0x80, 0xFF, 0x7F, 0x01, 0x00, 0xFF, 0xFF, 0, 0], np.uint8)
    b = np.array([0x7F, 0x7F, 0x7F, 0x7F, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x7F, 0x7F, 0x80, 0x80, 0, 0], np.uint8)
    want, got = _run_xmm(code_name, acc, a, b, None)
    assert list(got) == list(want), ([hex(x) for x in want], [hex(x) for x in got])


# ---- GPR state: wrapping address arithmetic, 32-bit writes, cmov from memory -----------------------------

def _gpr_cases():
    cs = [Case("lea near 2^31/2^32/2^64", [mk("LEA_R64_M", R.RAX, MemoryOperand(R.RBX, R.NONE, 1, 0x7FFFFFFF, 8)),
                                           mk("LEA_R64_M", R.RCX, MemoryOperand(R.RBX, R.NONE, 1, -0x80000000, 8)),
                                           mk("LEA_R32_M", R.EDX, MemoryOperand(R.RBX, R.R8, 8, 0x7FFFFFF0, 8)),
                                           mk("LEA_R64_M", R.R9, MemoryOperand(R.R10, R.R11, 8, -0x80000000, 8)),
                                           mk("LEA_R32_M", R.R12D, MemoryOperand(R.R13, R.NONE, 1, -1, 1))])]
    for rbx, disp in ((0x7FFFFFF0, 32 - 0x7FFFFFF0), (0x80000000, 32 - 0x80000000), (2 ** 64 - 16, 48),
                      (2 ** 64 - 2 ** 31, 2 ** 31 - 16), (2 ** 61, 0)):      # [rsi + 32], [rsi - 16] by wrapping
        scale = 8 if rbx == 2 ** 61 else 1                                   # 2^61 * 8 wraps to 0
        cs.append(Case(f"mov r32, [rsi + rbx*{scale} + {disp:#x}], rbx = {rbx:#x}",
                       [mk("MOV_R64_IMM64", R.RBX, Imm(rbx)),
                        mk("MOV_R32_RM32", R.EAX, MemoryOperand(R.RSI, R.RBX, scale, disp, 8)),
                        mk("MOV_RM32_R32", MemoryOperand(R.RSI, R.RBX, scale, disp + 8, 8), R.EAX)]))
    cs.append(Case("32-bit ops zero the upper half", [mk("ADD_RM32_IMM32", R.EAX, Imm(0x7FFFFFFF)),
                                                      mk("XOR_RM32_R32", R.EBX, R.ECX), mk("INC_RM32", R.EDX),
                                                      mk("NEG_RM32", R.R8D), mk("SHL_RM32_IMM8", R.R9D, Imm(31)),
                                                      mk("IMUL_R32_RM32", R.R10D, R.R11D),
                                                      mk("MOVSXD_R64_RM32", R.R12, R.R13D)], CF | OF))
    cs.append(Case("dec/jnz counts down from 3", [mk("MOV_R32_IMM32", R.ECX, Imm(3)), mk("XOR_R32_RM32", R.EAX, R.EAX)]
                   + _loop([mk("ADD_R64_RM64", R.RAX, R.RCX)], R.RCX), CF | ZF | SF | OF))
    return cs


def _loop(body, counter):
    top = list(body)
    for i, ins in enumerate(top):
        ins.ip = 0x9000 + i
    jnz = iced_x86.Instruction.create_branch(C.JNE_REL32_64, 0x9000)
    return top + [mk("DEC_RM64", counter), jnz]


@pytest.mark.skipif(not host().has("avx2"), reason="needs a native x86 host")
@pytest.mark.parametrize("case", _gpr_cases(), ids=lambda c: c.name)
def test_gpr_state_edges(case):
    for seed in range(6):
        compare(case, make_state(seed, ("bits", "ints")[seed % 2]))


# cmov with a memory source loads it whatever the condition (the SDM: "the source operand may be read
# regardless"); the interpreter read it only when the condition held, so a cmov from a stale pointer that
# crashes natively passed when interpreted.
@needs_avx512
@pytest.mark.parametrize("cc", ["CMOVE", "CMOVNE"])
def test_cmov_reads_its_memory_source_whatever_the_condition(cc):
    prog = [mk("XOR_R32_RM32", R.EAX, R.EAX), mk(f"{cc}_R32_RM32", R.ECX, MemoryOperand(R.RSI))]
    code = E._encode(prog)
    state = E.make_state(3, "ints")
    rsi_off = _FENCE.n - 2
    state[RSI_OFF:RSI_OFF + 8] = np.array([_FENCE.lo + rsi_off], np.uint64).view(np.uint8)
    win = np.zeros(_FENCE.n, np.uint8)
    native = _FENCE.native(PROLOGUE + code + E._EPILOGUE, state, win)
    assert native is None and isinstance(interp(code, state, win, rsi_off), MemoryFault)


# ---- refusals -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ins", [mk("LDMXCSR_M32", mem(0, R.RDI)), mk("VEX_VLDMXCSR_M32", mem(0, R.RDI)),
                                 mk("VEX_VSTMXCSR_M32", mem(0, R.RDI)), mk("ADDPS_XMM_XMMM128", R.XMM0, R.XMM1),
                                 mk("EVEX_VPCOMPRESSD_ZMMM512_K1Z_ZMM", mem(0, R.RDI), R.ZMM1, k=R.K1),
                                 mk("EVEX_VPEXPANDD_ZMM_K1Z_ZMMM512", R.ZMM0, mem(0, R.RDI), k=R.K1),
                                 mk("VEX_VGATHERDPS_XMM_VM32X_XMM", R.XMM0, MemoryOperand(R.RDI, R.XMM1, 4), R.XMM2),
                                 mk("XCHG_RM64_R64", R.RAX, R.RBX), mk("BSF_R64_RM64", R.RAX, R.RBX),
                                 mk("SETP_RM8", R.AL), mk("CPUID")],
                         ids=lambda i: str(i))
def test_unknown_instructions_are_refused_before_they_run(ins):
    """Refused with the mnemonic, at its address, before any state changes: never a silent no-op."""
    m = Machine()
    pa = m.map(np.arange(64, dtype=np.uint32))
    prog = [mk("MOV_R32_IMM32", R.EDX, Imm(7)), ins, mk("MOV_R32_IMM32", R.EDX, Imm(9)), mk("RETNQ")]
    code = assemble(prog, ip=0)
    m.v[:] = 0x5A
    with pytest.raises(UnsupportedInstruction) as e:
        m.call(code, [pa], check_abi=False)
    name = iced_x86.Formatter(iced_x86.FormatterSyntax.INTEL).format_mnemonic(
        iced_x86.Decoder(64, code[5:]).decode())
    assert e.value.mnemonic == name.split()[-1] and e.value.ip == m.load(code) + 5
    assert m.g[2] == 7 and (m.v == 0x5A).all() and (m.read(pa, nbytes=256).view(np.uint32) == np.arange(64)).all()


def test_suppress_doctests():
    import doctest
    import isa.x86.interp.suppress
    assert doctest.testmod(isa.x86.interp.suppress).failed == 0


def test_embedded_rounding_and_masked_scalar_forms_are_refused():
    for ins in (mk("EVEX_VFMADD231PS_ZMM_K1Z_ZMM_ZMMM512B32_ER", R.ZMM0, R.ZMM1, R.ZMM2),
                mk("EVEX_VCVTPS2DQ_ZMM_K1Z_ZMMM512B32_ER", R.ZMM0, R.ZMM1)):
        ins.rounding_control = iced_x86.RoundingControl.ROUND_UP
        with pytest.raises(UnsupportedInstruction, match="rounding"):
            Machine().call(assemble([ins, mk("RETNQ")]), check_abi=False)
    with pytest.raises(UnsupportedInstruction, match="masked scalar"):
        Machine().call(assemble([mk("EVEX_VADDSS_XMM_K1Z_XMM_XMMM32_ER", R.XMM0, R.XMM1, R.XMM2, k=R.K1),
                                 mk("RETNQ")]), check_abi=False)


# ---- AMX against the SDM's pseudo-code ----------------------------------------------------------------

_TINY = Fraction(2) ** -126
_EDGE = _TINY - Fraction(2) ** -151


def _f32(x: Fraction) -> np.float32:
    """RNE to float32 with FTZ as x86 does it: tiny after rounding to 24 bits (unbounded exponent) -> 0."""
    if x == 0:
        return np.float32(0.0)
    if abs(x) < _EDGE:
        return np.float32(-0.0 if x < 0 else 0.0)
    from tests.x86.test_interp import _round_f32
    return _round_f32(x)


def _daz(v: np.float32) -> Fraction:
    return Fraction(0) if abs(float(v)) < 2.0 ** -126 else Fraction(float(v))


def sdm_tdpbf16ps(C, A, B):
    """The SDM's TDPBF16PS: per row m and column n two fp32 sums (even and odd bf16 of each pair) from 0,
    one FMA each per k (DAZ, FTZ, RNE), then tmp = even + odd and dst = dst + tmp (DAZ, FTZ, RNE).
    A (M x K x 2), B (K x N x 2): float32 bf16 values; C (M x N) float32. Finite inputs only."""
    M, K, _ = A.shape
    N = B.shape[1]
    out = np.empty((M, N), np.float32)
    for m in range(M):
        for n in range(N):
            t = [np.float32(0), np.float32(0)]
            for k in range(K):
                for p in (0, 1):
                    t[p] = _f32(_daz(t[p]) + _daz(A[m, k, p]) * _daz(B[k, n, p]))
            tmp = _f32(_daz(t[0]) + _daz(t[1]))
            out[m, n] = _f32(_daz(C[m, n]) + _daz(tmp))
    return out


def _bf16_values(rng, shape):
    e = rng.integers(-133, -118, shape)               # near the bottom of the range: FTZ and DAZ matter
    e = np.where(rng.random(shape) < 0.5, rng.integers(-6, 6, shape), e)
    v = (rng.integers(128, 256, shape) / 128.0 * np.exp2(e)) * rng.choice([-1, 1], shape)
    return (v.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _amx_run(cfg, A16, Bv16, Cf, op="TDPBF16PS"):
    from tests.x86.test_interp import amx_program, run
    M, K2, N = A16.shape[0], A16.shape[1] // 2, Cf.shape[1]
    m, (pc, pa, pb, po) = run(amx_program(op, M, K2, N), cfg, A16, Bv16, Cf)
    return m, m.read(po, like=Cf)


@pytest.mark.parametrize("seed", range(4))
def test_tdpbf16ps_is_the_sdm_pseudo_code_bit_for_bit(seed):
    """Small and tiny values (denormal bf16 inputs, sums near 2^-126) so that DAZ, FTZ after rounding,
    and the even/odd split all show in the bits."""
    rng = np.random.default_rng(seed)
    M, K2, N = 3 + seed, 5, 4
    A16, B16 = _bf16_values(rng, (M, 2 * K2)), _bf16_values(rng, (2 * K2, N))
    A16[0, 3], B16[3, :] = 0x0001, _bf(2.0 ** 100)        # a denormal bf16 input: read as 0, not 2^-33
    A16[1, :] = 0                                          # row 1, column 0: the even chain is
    A16[1, 0], B16[0, 0] = _bf(2.0 ** -63), _bf(2.0 ** -63)           # 2^-126, then
    A16[1, 2], B16[2, 0] = _bf(1.5 * 2 ** -76), _bf(-2.0 ** -75)      # 2^-126 - 3*2^-152: tiny, so 0
    Cf = (rng.standard_normal((M, N)) * np.exp2(rng.integers(-128, -110, (M, N)))).astype(np.float32)
    Cf[0, 1], Cf[1, 0] = np.float32(2.0 ** -127), 0        # a denormal accumulator: read as 0
    Bv = B16.reshape(K2, 2, N).transpose(0, 2, 1).copy()
    cfg = tilecfg({0: (M, 4 * N), 1: (M, 4 * K2), 2: (K2, 4 * N)})
    _, got = _amx_run(cfg, A16, Bv, Cf)
    f = lambda h: (h.astype(np.uint32) << 16).view(np.float32)    # noqa: E731
    want = sdm_tdpbf16ps(Cf, f(A16).reshape(M, K2, 2), f(Bv))
    diff = np.flatnonzero(want.view(np.uint32) != got.view(np.uint32))
    assert diff.size == 0, (diff, want.reshape(-1)[diff[:3]], got.reshape(-1)[diff[:3]])


def test_tile_rows_and_bytes_past_the_shape_are_zero_and_stores_write_only_the_shape():
    """tileloadd zeroes rows >= rows and bytes >= colsb (write_row_and_zero, zero_upper_rows); tilestored
    writes colsb bytes of each of rows rows at the stride, nothing between or after."""
    src = np.arange(16 * 64, dtype=np.uint32).astype(np.uint8).reshape(16, 64) | 1
    out = np.full((8, 96), 0xEE, np.uint8)
    prog = [mk("VEX_LDTILECFG_M512", mem(0, R.RDI)), mk("MOV_R32_IMM32", R.EAX, Imm(64)),
            mk("VEX_TILELOADD_TMM_SIBMEM", R.TMM3, MemoryOperand(R.RSI, R.RAX, 1, 0, 0)),
            mk("MOV_R32_IMM32", R.EAX, Imm(96)),
            mk("VEX_TILESTORED_SIBMEM_TMM", MemoryOperand(R.RDX, R.RAX, 1, 8, 1), R.TMM3)]
    from tests.x86.test_interp import run
    m, (pcfg, ps, po) = run(prog, tilecfg({3: (5, 20)}), src, out)
    t = m.tiles[3]
    assert (t[:5, :20] == src[:5, :20]).all() and not t[:5, 20:].any() and not t[5:].any()
    got = m.read(po, like=out)
    want = np.full_like(out, 0xEE)
    want[:5, 8:28] = src[:5, :20]
    assert (got == want).all()
    assert m.tile_start_row == 0


def test_tile_faults_and_configuration_checks():
    """#UD for an unconfigured tile (rows 0) and for dot products with shared or mis-shaped tiles; #GP
    for palette 2, reserved bytes, colsb > 64; palette 0 releases; a load faulting past its region's end
    keeps start_row at the faulting row (restartable), as the SDM's tileloadd does."""
    from tests.x86.test_interp import run
    a = np.zeros((16, 64), np.uint8)
    dot = [mk("VEX_LDTILECFG_M512", mem(0, R.RDI)), mk("VEX_TDPBF16PS_TMM_TMM_TMM", R.TMM0, R.TMM1, R.TMM1)]
    with pytest.raises((InvalidOpcode, UnsupportedInstruction), match="distinct|undecodable"):
        run(dot, tilecfg({0: (4, 64), 1: (4, 64)}))           # (iced decodes shared tiles as invalid: #UD)
    with pytest.raises(InvalidOpcode, match="not configured"):
        run([dot[0], mk("VEX_TDPBF16PS_TMM_TMM_TMM", R.TMM0, R.TMM1, R.TMM5)], tilecfg({0: (4, 64), 1: (4, 64)}))
    with pytest.raises(InvalidOpcode, match="shape"):
        run([dot[0], mk("VEX_TDPBF16PS_TMM_TMM_TMM", R.TMM0, R.TMM1, R.TMM2)],
            tilecfg({0: (4, 64), 1: (4, 64), 2: (16, 32)}))
    reserved = tilecfg({0: (4, 64)})
    reserved[5] = 1
    for cfg in (tilecfg({0: (4, 64)}, palette=2), reserved, tilecfg({0: (4, 66)})):
        with pytest.raises(InvalidOpcode, match="#GP"):
            run([dot[0]], cfg)
    m, _ = run([dot[0], mk("VEX_LDTILECFG_M512", mem(64, R.RDI))], np.concatenate([tilecfg({0: (4, 64)}),
                                                                                 np.zeros(64, np.uint8)]))
    assert m.tilecfg is None
    load = [dot[0], mk("MOV_R32_IMM32", R.EAX, Imm(64)),
            mk("VEX_TILELOADD_TMM_SIBMEM", R.TMM0, MemoryOperand(R.RSI, R.RAX, 1, 0, 0))]
    m = Machine()
    pc, pa = m.map(tilecfg({0: (8, 64)})), m.map(a[:6])
    with pytest.raises(MemoryFault):
        m.call(assemble(load + [mk("RETNQ")]), [pc, pa])
    assert m.tile_start_row == 6 and (m.tiles[0, :6] == 0).all()


@pytest.mark.parametrize("op", ["tilezero", "tdpbf16ps"])
def test_tilezero_and_dot_products_reset_start_row(op):
    """The SDM ends tilezero and every tdp* with zero_tilecfg_start(): the start_row a restarted load
    would find (here loaded by ldtilecfg) is 0 after them."""
    from tests.x86.test_interp import run
    ins = (mk("VEX_TILEZERO_TMM", R.TMM0) if op == "tilezero" else
           mk("VEX_TDPBF16PS_TMM_TMM_TMM", R.TMM0, R.TMM1, R.TMM2))
    cfg = tilecfg({0: (4, 64), 1: (4, 64), 2: (16, 64)})
    cfg[1] = 3
    m, _ = run([mk("VEX_LDTILECFG_M512", mem(0, R.RDI)), ins], cfg)
    assert m.tile_start_row == 0
