"""``isa.aarch64.native``: ``run_calls`` picks the native runner where the host runs SVE at exactly the
requested vector length, else qemu. The dispatch and the vector-length handling are checked here with
fakes (no SVE hardware needed), and the native runner's buffer and call plumbing with x86 stand-in
kernels on an x86-64 host; the AArch64 kernels then run for real through whichever runner this host
has, and through the native runner only on an SVE host."""
import types

import numpy as np
import pytest

from isa.aarch64 import Assembler, mem, native, x0, x1, x2, x3
from isa.aarch64.emulate import AddressTable, Call, EmulationError, _layout
from isa.aarch64.native import native_skip_reason, run_calls, run_native_calls, sve_runner_skip_reason
from isa.memory import PAGE
from tests.aarch64.marks import vl_params
from tests.aarch64.test_emulate import cnt_kernel, vadd_kernel

VLS = (128, 256, 512)
GET_VL, SET_VL, INHERIT = 51, 50, 1 << 17


@pytest.fixture
def machine(monkeypatch):
    """``machine(native_vls, qemu)`` makes run_calls see a host running SVE natively at ``native_vls``
    and having qemu or not; both runners are replaced by recorders, and the list of runs is returned."""
    runs = []
    monkeypatch.setattr(native, "run_native_calls", lambda calls, bits: runs.append(("native", bits)))
    monkeypatch.setattr(native, "run_qemu_calls", lambda calls, bits: runs.append(("qemu", bits)))

    def make(native_vls=(), qemu=True):
        monkeypatch.setattr(native, "native_skip_reason",
                            lambda bits: None if bits in native_vls else f"no native {bits}-bit vectors")
        monkeypatch.setattr(native, "qemu_skip_reason", lambda: None if qemu else "no qemu")
        return runs
    return make


def test_run_calls_uses_qemu_without_native_sve(machine):
    runs = machine(native_vls=(), qemu=True)
    for bits in VLS:
        run_calls([], bits)
        assert sve_runner_skip_reason(bits) is None
    assert runs == [("qemu", 128), ("qemu", 256), ("qemu", 512)]


def test_run_calls_prefers_native_at_the_lengths_the_host_sets(machine):
    runs = machine(native_vls=(256,), qemu=True)
    for bits in VLS:
        run_calls([], bits)
    assert runs == [("qemu", 128), ("native", 256), ("qemu", 512)]


def test_sve_host_without_qemu_skips_other_lengths(machine):
    runs = machine(native_vls=(128, 256), qemu=False)
    run_calls([], 256)
    assert runs == [("native", 256)]
    assert sve_runner_skip_reason(128) is None
    assert sve_runner_skip_reason(512) == "no qemu and no native 512-bit vectors"
    with pytest.raises(EmulationError, match="no qemu and no native 512-bit vectors"):
        run_calls([], 512)
    assert runs == [("native", 256)]


def test_skip_reason_names_what_is_missing_here(monkeypatch):
    import platform
    if platform.machine() in ("aarch64", "arm64"):
        pytest.skip("AArch64 host: the reason depends on its SVE lengths")
    reason = native_skip_reason(256)
    assert reason == f"the host is {platform.system()} {platform.machine()}, not an AArch64 Linux machine with SVE"
    with pytest.raises(EmulationError, match="not an AArch64 Linux machine"):
        run_native_calls([Call(cnt_kernel(), [], [np.zeros(2, np.int64)])], 256)
    monkeypatch.setattr(native, "qemu_skip_reason", lambda: "qemu-aarch64 not found (apt-get install qemu-user)")
    assert sve_runner_skip_reason(256) == f"qemu-aarch64 not found (apt-get install qemu-user) and {reason}"


def test_bad_vector_length_is_refused():
    for fn in (native_skip_reason, sve_runner_skip_reason, lambda bits: run_calls([], bits)):
        with pytest.raises(ValueError, match="vl_bits"):
            fn(384)


class FakePrctl:
    """Linux's PR_SVE_GET_VL / PR_SVE_SET_VL on hardware with 128- and 256-bit vectors: a request is
    clamped to the largest supported length not above it."""

    def __init__(self):
        self.vl, self.flags, self.log = 16, INHERIT, []

    def __call__(self, option, arg=0):
        if option == SET_VL:
            self.log.append(arg)
            self.vl = max((v for v in (16, 32) if v <= arg & 0xFFFF), default=16)
            self.flags = arg & INHERIT
        return self.vl | self.flags


@pytest.fixture
def fake_sve_host(monkeypatch):
    prctl = FakePrctl()
    monkeypatch.setattr(native, "_prctl", prctl)
    monkeypatch.setattr(native, "platform", types.SimpleNamespace(system=lambda: "Linux", machine=lambda: "aarch64"))
    monkeypatch.setattr(native, "host", lambda: types.SimpleNamespace(levels=["sve"]))
    return prctl


def test_vector_length_is_set_and_restored(fake_sve_host):
    with native._sve_vector_length(256):
        assert fake_sve_host.vl == 32
    assert (fake_sve_host.vl, fake_sve_host.flags) == (16, INHERIT)
    with pytest.raises(KeyError):
        with native._sve_vector_length(256):
            raise KeyError("a kernel failed")
    assert (fake_sve_host.vl, fake_sve_host.flags) == (16, INHERIT)
    with pytest.raises(EmulationError, match=r"cannot run 512-bit vectors: prctl\(PR_SVE_SET_VL, 64\) gave 256 bits"):
        with native._sve_vector_length(512):
            pytest.fail("ran at a clamped vector length")
    assert fake_sve_host.log == [32, 16 | INHERIT, 32, 16 | INHERIT, 64, 16 | INHERIT]


def test_native_skip_reason_probes_the_length(fake_sve_host, monkeypatch):
    probe = native.native_skip_reason.__wrapped__          # uncached: the fakes change per test
    assert probe(128) is None and probe(256) is None
    assert "gave 256 bits" in probe(512)
    assert fake_sve_host.vl == 16
    monkeypatch.setattr(native, "host", lambda: types.SimpleNamespace(levels=[]))
    assert probe(256) == "this AArch64 host has no SVE"


def gather_kernel():
    """x0 = out (3 int64), x1 = a table of 2 addresses, x2 = a scalar: out = [*t[0], *t[1], scalar]."""
    a = Assembler()
    for i in range(2):
        a.ldr(x3, mem(x1, 8 * i))
        a.ldr(x3, mem(x3))
        a.str(x3, mem(x0, 8 * i))
    a.str(x2, mem(x0, 16))
    a.ret()
    return a.code()


def gather_call(code):
    """A call of a gather kernel through an address table, permuted pointers and a negative scalar;
    returns it and the values its output must hold."""
    values = np.arange(-2, 3, dtype=np.int64) * 11
    return Call(code, [AddressTable(values, [8 * 3, 0])], [np.zeros(3, np.int64)], (-5,), order=(1, 0)), \
        [values[3], values[0], -5]


def check_runner(runner, bits, stray_code):
    """What the ELF program passes, through ``runner``: the VL, a vector loop with a tail, an
    address table into the data buffer, permuted pointers, a negative scalar, a stray write."""
    rng = np.random.default_rng(bits)
    cnt = np.zeros(2, np.int64)
    n = bits // 32 * 2 + 3
    a, b = rng.standard_normal((2, n)).astype(np.float32)
    out = np.full(n + 3, np.nan, np.float32)
    gather, want = gather_call(gather_kernel())
    runner([Call(cnt_kernel(), [], [cnt]), Call(vadd_kernel(), [a, b], [out], (n,)), gather], bits)
    assert cnt.tolist() == [bits // 32, bits // 8]
    np.testing.assert_array_equal(out[:n], a + b)
    assert np.isnan(out[n:]).all()
    assert gather.outputs[0].tolist() == want
    with pytest.raises(EmulationError, match="outside its outputs"):
        runner([Call(stray_code, [], [np.zeros(1, np.int64)])], bits)


def stray_kernel():
    a = Assembler()
    a.str(x1, mem(x0, 8))          # one element past a 1-element output, into the guard bytes
    a.ret()
    return a.code()


@pytest.mark.parametrize("bits", vl_params(VLS))
def test_run_calls_here(bits):
    check_runner(run_calls, bits, stray_kernel())


@pytest.mark.parametrize("bits", vl_params(VLS, native_skip_reason))
def test_native_runner_on_sve_host(bits):
    before = native._prctl(GET_VL)
    check_runner(run_native_calls, bits, stray_kernel())
    assert native._prctl(GET_VL) == before


def test_native_runner_plumbing_with_x86_code(monkeypatch):
    """run_native_calls minus the SVE parts, on an x86-64 host with x86 kernels of the same signatures:
    the buffer is page aligned with qemu's offsets, address tables point into it, pointers are
    permuted and scalars passed as the ELF program does, each distinct kernel is mapped once, and a
    stray write is caught."""
    import platform
    from contextlib import nullcontext
    from isa.x86 import Assembler as X86, rax, rdi, rdx, rsi
    if platform.machine() not in ("x86_64", "amd64"):
        pytest.skip("needs an x86-64 host to run the x86 stand-in kernels")
    vls, mapped = [], []
    monkeypatch.setattr(native, "native_skip_reason", lambda bits: None)
    monkeypatch.setattr(native, "_sve_vector_length", lambda bits: vls.append(bits) or nullcontext())
    real_map = native.ExecutableMemory
    monkeypatch.setattr(native, "ExecutableMemory", lambda code: mapped.append(code) or real_map(code))
    where = X86()
    where.mov([rdi], rdi)           # out[0] = its own address
    where.ret()
    gather = X86()
    for i in range(2):
        gather.mov(rax, [rsi + 8 * i])
        gather.mov(rax, [rax])
        gather.mov([rdi + 8 * i], rax)
    gather.mov([rdi + 16], rdx)
    gather.ret()
    first, want = gather_call(gather.encode())
    second, _ = gather_call(gather.encode())
    address = np.zeros(1, np.int64)
    run_native_calls([Call(where.encode(), [], [address]), first, second], 512)
    assert vls == [512] and len(mapped) == 2
    assert address[0] % PAGE == _layout([Call(b"", [], [address])], 0)[1][0][0]
    assert first.outputs[0].tolist() == want == second.outputs[0].tolist()
    stray = X86()
    stray.mov([rdi + 8], rsi)
    stray.ret()
    with pytest.raises(EmulationError, match="outside its outputs"):
        run_native_calls([Call(stray.encode(), [], [np.zeros(1, np.int64)])], 128)
