"""The ELF runner (qemu-aarch64) and the in-process unicorn runner at several SVE vector lengths."""
import numpy as np
import pytest

from isa.aarch64 import Assembler, mem, p0, post, x0, x1, x2, x3, x4, z0, z1
from isa.aarch64.elf import test_program as build_program
from isa.aarch64.emulate import Call, EmulationError, run_qemu, run_qemu_calls, run_unicorn
from tests.aarch64.marks import needs_qemu, needs_unicorn

VLS = [128, 256, 512]


def cnt_kernel():
    """x0 = out: out[0] = cntw, out[1] = cntb."""
    a = Assembler()
    a.cntw(x1)
    a.str(x1, mem(x0))
    a.cntb(x1)
    a.str(x1, mem(x0, 8))
    a.ret()
    return a.code()


def vadd_kernel():
    """x0 = a, x1 = b, x2 = out, x3 = n (fp32): out = a + b with a whilelo loop."""
    a = Assembler()
    loop, done = a.label("loop"), a.label("done")
    a.mov(x4, 0)
    a.whilelo(p0.s, x4, x3)
    a.b_none(done)
    a.bind(loop)
    a.ld1w(z0.s, p0.z, mem(x0, x4, lsl=2))
    a.ld1w(z1.s, p0.z, mem(x1, x4, lsl=2))
    a.fadd(z0.s, z0.s, z1.s)
    a.st1w(z0.s, p0, mem(x2, x4, lsl=2))
    a.incw(x4)
    a.whilelo(p0.s, x4, x3)
    a.b_first(loop)
    a.bind(done)
    a.ret()
    return a.code()


def sum_kernel():
    """x0 = int64 array, x1 = out, x2 = n: out[0] = sum, scalar loop with post-indexed loads."""
    a = Assembler()
    loop, done = a.label("loop"), a.label("done")
    a.mov(x3, 0)
    a.cbz(x2, done)
    a.bind(loop)
    a.ldr(x4, post(x0, 8))
    a.add(x3, x3, x4)
    a.subs(x2, x2, 1)
    a.b_ne(loop)
    a.bind(done)
    a.str(x3, mem(x1))
    a.ret()
    return a.code()


@needs_qemu
def test_qemu_vector_length_and_kernels_in_one_process():
    """One qemu process per VL runs cntw/cntb, a scalar loop and an SVE fp32 add with a tail."""
    rng = np.random.default_rng(0)
    for bits in VLS:
        cnt = np.zeros(2, np.int64)
        ints = rng.integers(-1000, 1000, 37)
        total = np.zeros(1, np.int64)
        n = bits // 32 * 3 + 5                                   # three full vectors and a tail
        a, b = rng.standard_normal((2, n)).astype(np.float32)
        out = np.full(n + 3, np.nan, np.float32)                 # the 3 extra lanes must stay NaN
        run_qemu_calls([Call(cnt_kernel(), [], [cnt]),
                        Call(sum_kernel(), [ints], [total], (len(ints),)),
                        Call(vadd_kernel(), [a, b], [out], (n,))], vl_bits=bits)
        assert list(cnt) == [bits // 32, bits // 8]
        assert total[0] == ints.sum()
        np.testing.assert_array_equal(out[:n], a + b)
        assert np.isnan(out[n:]).all()


@needs_qemu
def test_qemu_detects_stray_writes_and_crashes():
    a = Assembler()
    a.str(x1, mem(x0, 8))      # one element past a 1-element output
    a.ret()
    with pytest.raises(EmulationError, match="outside its outputs"):
        run_qemu(a.code(), [], [np.zeros(1, np.int64)])
    a = Assembler()
    a.mov_imm(x0, 0x1234)
    a.ldr(x1, mem(x0))         # unmapped address
    a.ret()
    with pytest.raises(EmulationError, match="exited"):
        run_qemu(a.code(), [], [])


@needs_unicorn
@pytest.mark.parametrize("bits", VLS)
def test_unicorn_vector_length_and_fp32_add(bits):
    cnt = np.zeros(2, np.int64)
    run_unicorn(cnt_kernel(), [], [cnt], vl_bits=bits)
    assert list(cnt) == [bits // 32, bits // 8]
    n = bits // 32 * 2 + 3
    a, b = np.random.default_rng(bits).standard_normal((2, n)).astype(np.float32)
    out = np.full(n, np.nan, np.float32)
    run_unicorn(vadd_kernel(), [a, b], [out], (n,), vl_bits=bits)
    np.testing.assert_array_equal(out, a + b)


@needs_unicorn
def test_unicorn_reports_missing_bf16_and_i8mm():
    """unicorn 2.1 is QEMU 5.0: SVE yes, BF16/I8MM no; the error names the instruction."""
    for emit in (lambda a: a.bfmmla(z0.s, z1.h, z1.h), lambda a: a.smmla(z0.s, z1.b, z1.b)):
        a = Assembler()
        emit(a)
        a.ret()
        with pytest.raises(EmulationError, match="mmla z0.s"):
            run_unicorn(a.code(), [], [])


@needs_unicorn
def test_unicorn_detects_stray_writes():
    a = Assembler()
    a.stur(x1, mem(x0, -8))
    a.ret()
    with pytest.raises(EmulationError, match="outside its outputs"):
        run_unicorn(a.code(), [], [np.zeros(1, np.int64)])


def test_elf_layout():
    a = Assembler()
    a.ret()
    elf = build_program([(a.code(), [1, 2])], b"\x01" * 8, (0, 8))
    assert elf[:4] == b"\x7fELF" and elf[18] == 183          # EM_AARCH64
    assert elf.endswith(b"\x01" * 8)


def test_vl_validation():
    with pytest.raises(ValueError):
        run_qemu(cnt_kernel(), [], [np.zeros(2, np.int64)], vl_bits=384)
