"""System V functions built with the assembler run natively: integer loops and branches, AVX2
and AVX-512 vector kernels against NumPy, and the CPUID path agrees with /proc/cpuinfo."""
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

from isa.cpu import host
from isa.x86 import Function, cl, eax, k1, ptr, rax, rcx, rdx, rsp, vec
from tests.support import interp_available


def _gcd():
    fn = Function("gcd", ["i64", "i64"], returns="i64")
    x, y = fn.args
    a = fn.asm
    top, done = a.label(), a.label()
    a.bind(top)
    a.test(y, y)
    a.jz(done)
    a.mov(rax, x)
    a.cqo()
    a.idiv(y)
    a.mov(x, y)
    a.mov(y, rdx)
    a.jmp(top)
    a.bind(done)
    a.mov(rax, x)
    return fn.finalize()


GCD = _gcd()


@given(st.integers(0, 2**62), st.integers(0, 2**62))
def test_integer_loop_with_branches(x, y):
    import math
    assert GCD(x, y) == math.gcd(x, y)


def test_eight_integer_arguments_and_callee_saved_registers():
    from isa.x86 import rbx, r12, r15
    fn = Function("poly", ["i64"] * 8, returns="i64")
    a = fn.asm
    a.xor(eax, eax)
    for i, r in enumerate(fn.args):
        a.imul(rbx, r, i + 1)
        a.mov(r12, rbx)
        a.mov(r15, r12)
        a.add(rax, r15)
    f = fn.finalize()
    assert f(*range(1, 9)) == sum((i + 1) * (i + 1) for i in range(8))
    text = f.disassemble()
    assert "push rbx" in text and "push r12" in text and "pop r15" in text


def _axpy(width):
    """y[i] = a*x[i] + y[i] for i < n (n a multiple of the lane count), fp32."""
    fn = Function(f"axpy{width}", ["ptr", "ptr", "i64", "f32"])
    x, y, n, alpha = fn.args
    a = fn.asm
    va, vx = vec(width, 2), vec(width, 1)
    lanes = width // 32
    a.vbroadcastss(va, alpha)
    top = a.label()
    a.bind(top)
    a.vmovups(vx, [x])
    a.vfmadd213ps(vx, va, [y])
    a.vmovups([y], vx)
    a.add(x, width // 8)
    a.add(y, width // 8)
    a.sub(n, lanes)
    a.jnz(top)
    return fn


@pytest.mark.skipif(not host().has("avx2"), reason="host has no AVX2")
@given(st.integers(1, 64), st.floats(-4, 4, width=32))
def test_avx2_vector_kernel_against_numpy(blocks, alpha):
    f = _axpy(256).finalize()
    rng = np.random.default_rng(blocks)
    x = rng.standard_normal(8 * blocks, dtype=np.float32)
    y = rng.standard_normal(8 * blocks, dtype=np.float32)
    want = (np.float32(alpha) * x + y).astype(np.float32)
    f(x.ctypes.data, y.ctypes.data, x.size, alpha)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


def _masked_add512():
    """out[:n] = x[:n] + 1 with an opmask tail (AVX-512), n <= 16."""
    fn = Function("addone512", ["ptr", "ptr", "i64"])
    x, out, n = fn.args
    a = fn.asm
    a.mov(rcx, n)
    a.mov(eax, 1)
    a.shl(eax, cl)
    a.dec(eax)
    a.kmovw(k1, eax)
    a.vmovups(vec(512, 0).mask(k1, zero=True), [x])
    a.mov(eax, 0x3F800000)
    a.vpbroadcastd(vec(512, 1), eax)
    a.vaddps(vec(512, 0), vec(512, 0), vec(512, 1))
    a.vmovups(ptr(out).mask(k1), vec(512, 0))
    return fn.finalize()


@pytest.mark.skipif(not (host().has("avx512f") or interp_available()),
                    reason="host has no AVX-512 and the x86 interpreter is unavailable")
@pytest.mark.parametrize("n", [1, 7, 16])
def test_avx512_vector_kernel_against_numpy(n):
    f = _masked_add512()
    x = np.arange(n, dtype=np.float32)
    out = np.full(n, np.nan, np.float32)
    if host().has("avx512f"):
        f(x.ctypes.data, out.ctypes.data, n)
    else:
        from isa.x86.interp import Machine
        m = Machine()
        px, po = m.map(x), m.map(out)
        m.call(f.code, args=[px, po, n])
        out = m.read(po, like=out)
    np.testing.assert_array_equal(out, x + 1)


def _proc_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(host().arch != "x86_64", reason="x86 CPUID")
def test_cpuid_agrees_with_proc_cpuinfo():
    flags = _proc_flags()
    names = {"avx2": "avx2", "fma": "fma", "avx512f": "avx512f", "avx512bw": "avx512bw",
             "avx512vl": "avx512vl", "avx512_bf16": "avx512_bf16", "avx512_vnni": "avx512_vnni",
             "amx_tile": "amx_tile", "amx_bf16": "amx_bf16", "amx_int8": "amx_int8", "f16c": "f16c"}
    feats = host().features
    for ours, linux in names.items():
        # the kernel hides features the OS does not support, as we do
        if linux in flags:
            assert feats[ours] or ours.startswith("amx"), ours
        else:
            assert not feats[ours], ours
    assert host().vendor in ("GenuineIntel", "AuthenticAMD")


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code, **env):
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path, **env}, cwd=ROOT)


def test_forced_isa_levels():
    best = host().best_isa
    r = _run("from isa.cpu import host; print(host().isa)", TPPASM_ISA="avx2")
    assert r.stdout.strip() == "avx2", r.stderr
    if best != "amx":
        r = _run("from isa.cpu import host; host()", TPPASM_ISA="amx")
        assert r.returncode != 0 and "asks for more than this host has" in r.stderr
    r = _run("from isa.cpu import host; host()", TPPASM_ISA="sse9")
    assert r.returncode != 0 and "not a level" in r.stderr


def test_info_command_json():
    import json
    r = _run("import tppasm.__main__ as m; m.main(['info', '--json'])")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["isa"] == host().isa and "avx2" in data["features"]


@pytest.mark.parametrize("value", [127, 128, 255, 65535, 65536, -128, -129, -32768, -(1 << 31)])
def test_push_of_an_immediate_pushes_eight_bytes(value):
    """push 128 once encoded as the 2-byte data16 push imm16 and left rsp 6 bytes off (a crash)."""
    fn = Function("push", [], returns="i64")
    fn.asm.push(value)
    fn.asm.pop(rax)
    assert fn.finalize()() == value


def test_a_label_bound_in_another_assembler_is_refused():
    from isa.x86 import Label
    done = Label("done")
    first = Function("first", [], returns="i64")
    first.asm.jmp(done)
    first.asm.bind(done)
    first.finalize()
    second = Function("second", [], returns="i64")
    second.asm.jmp(done)
    with pytest.raises(ValueError, match="bound in another assembler.*make a label of this one"):
        second.finalize()


def test_the_ctypes_callable_keeps_the_code_mapped():
    import gc

    def make():
        fn = Function("seven", [], returns="i64")
        fn.asm.mov(rax, 7)
        return fn.finalize().cfunc
    cfunc = make()
    gc.collect()
    assert cfunc() == 7


def test_calls_with_other_argument_counts_or_unfitting_ints_are_refused():
    with pytest.raises(TypeError, match=r"gcd\(\) takes 2 arguments \(i64, i64\), got 3"):
        GCD(12, 8, 4)
    with pytest.raises(ValueError, match="argument 0 = 18446744073709551628 does not fit i64"):
        GCD((1 << 64) + 12, 8)
    with pytest.raises(ValueError, match=r"Function.stack\(-100\): expected an int from 0"):
        Function("f", []).stack(-100)


def test_executable_memory_takes_bytes_only():
    from isa.memory import ExecutableMemory
    with pytest.raises(TypeError, match="takes the code as bytes, got str: pass bytes"):
        ExecutableMemory("ret")
    assert ExecutableMemory(bytearray(b"\xc3")).size >= 1


def test_numpy_integers_are_immediates():
    fn = Function("sixteen", [], returns="i64")
    fn.asm.mov(rax, np.int64(8))
    fn.asm.add(rax, np.int32(8))
    assert fn.finalize()() == 16


def test_finalize_twice_says_so():
    fn = Function("twice", [], returns="i64")
    fn.asm.mov(rax, 1)
    assert fn.finalize()() == 1
    with pytest.raises(ValueError, match="finalize\\(\\) was called already"):
        fn.finalize()



@pytest.mark.parametrize("nbytes", [4000, 4096 - 8, 8192, 16 * 4096, 40 * 4096 + 24])
def test_a_frame_past_a_page_touches_every_page_on_the_way_down(nbytes):
    """A stack probe: a thread short of stack faults on its guard page (4 KiB) instead of the body
    writing below it into whatever is mapped there (another thread's stack)."""
    fn = Function("frame", ["i64"], returns="i64")
    fn.stack(nbytes)
    fn.asm.mov(ptr(rsp), fn.args[0])                 # the frame's lowest bytes
    fn.asm.mov(rax, ptr(rsp))
    jit = fn.finalize()
    text = jit.disassemble()
    frame = (nbytes + 15) // 16 * 16 + 8
    probes = text.count("or qword ptr [rsp],0")
    if frame <= 4096:
        assert probes == 0, text
    elif frame // 4096 <= 16:
        assert probes == frame // 4096, text
    else:
        assert probes == 1 and "jne" in text, text      # one probe in a loop over the pages
    assert jit(1234) == 1234
