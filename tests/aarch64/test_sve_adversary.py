"""An adversarial pass over the SVE kernels: what the per-kind tests (test_sve_descriptors.py,
test_sve_rows.py, test_sve_norm.py, test_sve_brgemm.py, ...) leave out.

- Reads outside an operand: the ordinary runners only see stray *writes* (guard bytes). Here every
  operand of every call lies flush against a page that the test program ``mprotect``s to PROT_NONE
  (after its last byte, or before its first), so one lane too many of a load (a predicate one
  vector too wide, an unpredicated ``ld1rq``/``ld1rd`` past k, a gather past m) kills qemu with
  SIGSEGV. Every kind and dtype, with n = 1 and tails of two vectors, k = 1 and odd k, m = 1, runs
  at VL 128, 512 and 2048; outputs are checked against the references (NaN poison included).
- Values against the x86 kernels on the same inputs: subnormals (no flush on either side), -0.0,
  the largest finite values, infinities and NaN, and exp / sigmoid / tanh / gelu at the edges of
  their ranges (exp's subnormal results included); fp32 -> bf16 rounding against ml_dtypes bit for
  bit (ties to even, NaN quieting, overflow to inf, subnormal bf16 results).
- Options the per-kind tests do not draw: quantize bits=7, BRGEMM with overlapping A rows
  (lda < k), a_bits=7, stream_c, a large batch (count = 67).
- Refusals: every descriptor the SVE backend cannot build raises TypeError / ValueError.
"""
import os
import subprocess
import tempfile

import ml_dtypes
import numpy as np
import pytest

import tppasm
from isa.aarch64 import Assembler, mem, x0, x1
from isa.aarch64.elf import DATA_BASE, PAGE, _align, write_elf
from isa.aarch64.emulate import Call, EmulationError, qemu_path
from isa.aarch64.native import run_calls
from isa.aarch64.registers import x
from tppasm.brgemm import Brgemm
from tppasm.eltwise import GRAD_OPS, UNARY_OPS, Binary, Reduce, Ternary, Transform, Unary
from tppasm.gemm_nt import GemmNT
from tppasm.glu import SwiGLU
from tppasm.kernel import Kernel
from tppasm.norm import LayerNorm, RMSNorm, Softmax
from tppasm.quant import Dequant, Quantize
from tppasm.rotary import Rotary
from tppasm.sve.brgemm import MmlaBrgemm
from tppasm.sve.math import ACCURACY
from tests.aarch64.marks import needs_qemu, needs_sve_runner, vl_params
from tests.aarch64.sve_cases import DescCase, close
from tests.support import native, run_raw, ulp_errors

SYS_MPROTECT, SYS_WRITE, SYS_EXIT = 226, 64, 93
PROT_NONE, PROT_RW = 0, 3


# -- a runner whose operands border unmapped pages ------------------------------------------------
def _fenced_image(calls, side):
    """The data image (page 0 a guard), each array flush against a guard page on ``side``; returns
    (image, guard page offsets, pointer offsets per call, (offset, array) of each output)."""
    image, guards, ptrs, outs = bytearray(PAGE), [0], [], []
    for c in calls:
        offs = []
        for arr in list(c.inputs) + list(c.outputs):
            raw = arr.tobytes()
            span = max(PAGE, _align(len(raw), PAGE))
            off = len(image) + (span - len(raw) if side == "after" else 0)
            image += bytes(span)
            image[off:off + len(raw)] = raw
            guards.append(len(image))
            image += bytes(PAGE)
            offs.append(off)
        outs += list(zip(offs[len(c.inputs):], c.outputs))
        ptrs.append([offs[i] for i in c.order] if c.order is not None else offs)
    return bytes(image), guards, ptrs, outs


def _syscall(a, number, *args):
    for reg, value in zip(x, args):
        a.mov_imm(reg, value)
    a.movz(x[8], number)
    a.svc(0)


def run_fenced(calls, vl_bits, side="after"):
    """Run ``calls`` (isa.aarch64.emulate.Call, array inputs only) in one qemu process with every
    operand flush against a PROT_NONE page on ``side`` ("after" or "before"); fills the outputs.
    EmulationError when the program faults (a read or write past an operand) or a byte outside
    the outputs changed."""
    data, guards, ptrs, outs = _fenced_image(calls, side)
    stub = Assembler()
    for g in guards:
        _syscall(stub, SYS_MPROTECT, DATA_BASE + g, PAGE, PROT_NONE)
    kernels = {}
    for c, pp in zip(calls, ptrs):
        for reg, value in zip(x, [DATA_BASE + p for p in pp] + [int(s) & (2 ** 64 - 1) for s in c.scalar_args]):
            stub.mov_imm(reg, value)
        if c.code not in kernels:
            kernels[c.code] = stub.label(f"kernel{len(kernels)}")
        stub.adr(x[16], kernels[c.code])
        stub.blr(x[16])
    _syscall(stub, SYS_MPROTECT, DATA_BASE, len(data), PROT_RW)
    _syscall(stub, SYS_WRITE, 1, DATA_BASE, len(data))
    _syscall(stub, SYS_EXIT, 0)
    blob, base = bytearray(), _align(stub.pc, 64)
    for code, label in kernels.items():
        label.offset = base + len(blob)
        blob += code.ljust(_align(len(code), 64), b"\0")
    text = stub.code().ljust(base, b"\0") + bytes(blob)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fenced.elf")
        with open(path, "wb") as f:
            f.write(write_elf(text, data))
        os.chmod(path, 0o755)
        cpu = f"max,sve{vl_bits}=on" + ("" if vl_bits <= 512 else f",sve-default-vector-length={vl_bits // 8}")
        proc = subprocess.run([qemu_path(), "-cpu", cpu, path], capture_output=True, timeout=120)
    if proc.returncode != 0 or len(proc.stdout) != len(data):
        why = proc.stderr.decode(errors="replace")[-300:]
        raise EmulationError(f"qemu-aarch64 exited with {proc.returncode}: {why}")
    mask = np.ones(len(data), bool)
    for off, arr in outs:
        mask[off:off + arr.nbytes] = False
    bad = np.flatnonzero((np.frombuffer(proc.stdout, np.uint8) != np.frombuffer(data, np.uint8)) & mask)
    if bad.size:
        raise EmulationError(f"kernel wrote outside its outputs: {bad.size} bytes, first at data offset {bad[0]}")
    for off, arr in outs:
        arr[...] = np.frombuffer(proc.stdout[off:off + arr.nbytes], arr.dtype).reshape(arr.shape)


def _copy_kernel(offset):
    a = Assembler()
    a.sub(x[3], x0, 8) if offset < 0 else a.add(x[3], x0, offset)
    a.ldr(x[2], mem(x[3]))
    a.str(x[2], mem(x1))
    a.ret()
    return a.code()


@needs_qemu
def test_the_fence_catches_a_read_one_element_past_or_before_an_operand():
    """The fence is live: 8 bytes past the end (side="after") and 8 before the start
    (side="before") fault; the same kernel reading inside the operand runs."""
    src, out = np.arange(3, dtype=np.int64), np.zeros(1, np.int64)
    run_fenced([Call(_copy_kernel(16), [src], [out])], 128)
    assert out[0] == 2
    with pytest.raises(EmulationError, match="exited with"):
        run_fenced([Call(_copy_kernel(24), [src], [out])], 128, "after")
    with pytest.raises(EmulationError, match="exited with"):
        run_fenced([Call(_copy_kernel(-8), [src], [out])], 128, "before")
    run_fenced([Call(_copy_kernel(-8), [src], [out])], 128, "after")       # inside the page before: mapped


# -- every kind against its reference, operands at the edge of mapped memory ------------------------
def _battery():
    """(descriptor, count) pairs: every kind and dtype with n = 1 and tails past two vectors of
    every VL, m = 1, k = 1 and odd k, unpadded leading dimensions (the operand ends where its
    last row ends, so the fence is right after the last element)."""
    d = []
    for n in (1, 5, 33, 67):
        d += [(Unary("copy", 1, n, out_dtype="bf16"), 1), (Unary("exp", 2, n, dtype="bf16"), 1),
              (Unary("relu", 3, n, bitmask=True), 1), (Unary("relu_bwd", 2, n, bitmask=True, dtype="bf16"), 1),
              (Unary("gelu_bwd", 1, n), 1), (Unary("zero", 2, n, out_dtype="bf16"), 1),
              (Binary("div", 2, n, dtype="bf16", bcast_a="col", bcast_b="row"), 1),
              (Binary("add", 1, n, bcast_b="scalar", post="sigmoid"), 1),
              (Ternary("muladd", 2, n, dtype="bf16", bcast_a="row"), 1),
              (Reduce("add", 3, n, over="cols", dtype="bf16"), 1), (Reduce("max", 2, n, over="rows"), 1),
              (Reduce("sumsq", 1, n, over="rows", out_dtype="bf16"), 1),
              (Transform("transpose", 3, n, dtype="bf16"), 1), (Transform("transpose", n, 3, dtype="i8"), 1),
              (Transform("transpose", 2, n, dtype="i64"), 1), (Transform("vnni2", 3, n, dtype="bf16"), 1),
              (Transform("vnni4", 5, n, dtype="i8"), 1), (Transform("unvnni2", 3, n, dtype="bf16"), 1),
              (Transform("unvnni4", 7, n, dtype="u8"), 1), (Transform("vnni4", 3, n, dtype="f32"), 1),
              (Transform("unvnni2", 3, n, dtype="i64"), 1),
              (Softmax(2, n, mask="full", dtype="bf16"), 1), (Softmax(1, n, mask="row", out_dtype="bf16"), 1),
              (LayerNorm(2, n, dtype="bf16"), 1), (RMSNorm(1, n, out_dtype="bf16"), 1),
              (SwiGLU(2, n, dtype="bf16"), 1), (Quantize(2, n, dtype="bf16"), 1), (Quantize(1, n, bits=7), 1),
              (Dequant(2, n, out_dtype="bf16", beta=1), 1),
              (GemmNT(2, n, 3, dtype="bf16", c_dtype="bf16"), 1), (GemmNT(1, 3, n), 1)]
        for k in (1, 3, 5):
            d += [(Brgemm(m=3, n=n, k=k, beta=1, bias=True, act="gelu"), 2),
                  (Brgemm(m=1, n=n, k=k, dtype="bf16", c_dtype="bf16", act="tanh"), 3),
                  (Brgemm(m=2, n=n, k=k, dtype="i8", act="relu"), 2),
                  (Brgemm(m=2, n=n, k=k, dtype="i8", signs="ss", beta=1), 1),
                  (MmlaBrgemm(m=3, n=n, k=k, dtype="bf16", beta=1), 2),
                  (MmlaBrgemm(m=1, n=n, k=k + 6, dtype="i8", signs="uu"), 1)]
    d += [(Rotary(1, 8, 8), 1), (Rotary(2, 34, 34, dtype="bf16"), 1), (Rotary(1, 12, 4, out_dtype="bf16"), 1)]
    return d


def _check_against_reference(case, what):
    """Integers bit for bit, floats within a loose bound (a misplaced lane or an unwritten one is
    far off or NaN; accuracy is the per-kind tests' business), NaN poison byte for byte."""
    for got, want in case.results():
        if got.dtype.kind in "iu":
            bad = np.flatnonzero(got != want)
        else:
            w = want.astype(np.float64)
            scale = np.abs(w[np.isfinite(w)]).max(initial=1.0)
            bad = close(got, want, 2e-2, 2e-2 * scale)
        assert not bad.size, (f"{what}: {case.desc}: {bad.size} elements differ, first at flat {bad[0]}: "
                              f"got {got[bad[0]]!r}, expected {want[bad[0]]!r}")


def _cases():
    cases = []
    for i, (desc, count) in enumerate(_battery()):
        fill = None
        if isinstance(desc, MmlaBrgemm):
            g = desc.mmla_group

            def fill(spec, v, rng, k=desc.k, g=g):
                if spec.name == "b":
                    v[..., -1, :, k % g or g:] = 0
        cases.append(DescCase(desc, seed=i, count=count, fill=fill, scale=1.0))
    return cases


@needs_qemu
@pytest.mark.parametrize("bits,side", [(128, "after"), (512, "after"), (2048, "after"), (256, "before")])
def test_no_kernel_reads_outside_its_operands(bits, side):
    cases = _cases()
    run_fenced([c.call() for c in cases], bits, side)
    for c in cases:
        _check_against_reference(c, f"VL {bits}")


# -- values: the same inputs through the x86 and the SVE kernels ---------------------------------
FLT_MAX = float(np.finfo(np.float32).max)
EDGES = np.float32([0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40, 1.1754942e-38, -1.1754944e-38, FLT_MAX, -FLT_MAX,
                    np.inf, -np.inf, np.nan, 0.55, -0.5499999, 1.0, 9.99, -10.01, 14.1, -14.1, -14.2, 20.0,
                    1e19, -1e19, 1e-20, 88.72, 88.73, 88.8, 89.0, -87.3, -87.4, -100.0, -103.9, -104.0, -110.0,
                    *np.linspace(-104.0, -86.0, 37), *np.linspace(86.0, 89.0, 13)])
LOOSE = {"gelu_erf_fast": None}          # its contract is looser than gelu_erf's: not compared with x86


def _x86_output(desc, ins, like):
    out = np.full_like(like, 7.0)
    run_raw(Kernel(desc, "avx512"), list(ins) + [out])
    return out


def _agree(op, x, sve, x86):
    """Bit for bit, or both within the op's ACCURACY of float64 (ulps of the reference)."""
    same = (sve.view(np.uint32) == x86.view(np.uint32)) | (np.isnan(sve) & np.isnan(x86))
    name = {"gelu": "gelu_tanh", "gelu_bwd": "gelu_tanh_grad", "gelu_erf_bwd": "gelu_erf_grad"}.get(op, op)
    if same.all():
        return
    bound = ACCURACY.get(name, 0)
    with np.errstate(all="ignore"):
        err = ulp_errors(op, x[~same], sve[~same])
    worst = int(np.nanargmax(err)) if err.size else 0
    assert np.isfinite(x86[~same]).all() and (err <= bound).all(), \
        (f"{op}: SVE and x86 differ at x={x[~same][:4]}: sve {sve[~same][:4]}, x86 {x86[~same][:4]} "
         f"(SVE {err[worst]:.1f} ulp from float64 at x={x[~same][worst]!r}, stated {bound})")


@needs_sve_runner(256)
@pytest.mark.skipif(not native("avx512"), reason="compares with the AVX-512 kernels run natively")
def test_unary_edges_agree_with_x86():
    """Every unary op and gradient on subnormals, -0.0, FLT_MAX, infinities, NaN and the ends of
    exp's range (its subnormal results included): the SVE results are the x86 ones bit for bit,
    or both within the op's stated ulps (reciprocal / rsqrt estimates differ)."""
    xs = EDGES[None]
    ops = [o for o in (*UNARY_OPS, *sorted(GRAD_OPS)) if o not in ("zero", *LOOSE)]
    calls, ins = [], []
    for op in ops:
        ins.append([np.full_like(xs, 1.5), xs] if op in GRAD_OPS else [xs])
        calls.append(Call(Kernel(Unary(op, 1, xs.size), "sve").raw.code, ins[-1], [np.full_like(xs, 7.0)]))
    run_calls(calls, vl_bits=256)
    for op, i, c in zip(ops, ins, calls):
        _agree(op, EDGES, c.outputs[0][0], _x86_output(Unary(op, 1, xs.size), i, xs)[0])


@needs_sve_runner(512)
@pytest.mark.skipif(not native("avx512"), reason="compares with the AVX-512 kernels run natively")
def test_binary_reduce_norm_edges_agree_with_x86():
    """Binary and ternary ops on every pair of edge values (subnormal products and quotients, FLT_MAX
    overflow, inf - inf, 0 * inf) bit for bit; reductions of subnormals and near-FLT_MAX values, and
    softmax / RMSNorm rows of extreme or subnormal values within 1e-5 of the x86 results."""
    rng = np.random.default_rng(5)
    a = np.repeat(EDGES, EDGES.size)[None]
    b = np.tile(EDGES, EDGES.size)[None]
    n = a.shape[1]
    c0 = np.float32(rng.standard_normal((1, n)))
    huge = np.float32([[3e38, 3e38, -1e-45, 1e-40] * 5, [1e-40] * 20])
    logits = np.float32([[FLT_MAX, 0.0, -FLT_MAX, 1e-40] * 5, [-1e30, -1e30, 1e-45, -3.0] * 5])
    gamma = np.ones(20, np.float32)
    runs = [(Binary(op, 1, n), [a, b], np.zeros((1, n), np.float32)) for op in ("add", "sub", "mul", "div")]
    runs += [(Ternary("muladd", 1, n), [a, b], c0)]
    runs += [(Reduce(op, 2, 20, over=over), [huge], np.zeros(2 if over == "cols" else 20, np.float32))
             for op in ("add", "sumsq", "max") for over in ("rows", "cols")]
    runs += [(Softmax(2, 20), [logits], np.zeros((2, 20), np.float32)),
             (RMSNorm(2, 20), [logits * np.float32(1e-20), gamma], np.zeros((2, 20), np.float32)),
             (RMSNorm(2, 20), [np.full((2, 20), 1e-40, np.float32), gamma], np.zeros((2, 20), np.float32))]
    calls = [Call(Kernel(d, "sve").raw.code, ins, [out.copy()]) for d, ins, out in runs]
    run_calls(calls, vl_bits=512)
    for (d, ins, out), c in zip(runs, calls):
        got, want = c.outputs[0], out.copy()
        run_raw(Kernel(d, "avx512"), ins + [want])
        if d.kind in ("binary", "ternary"):
            bad = np.flatnonzero(~((got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))))
        else:
            bad = close(got, want, 1e-5, 0.0)
        assert not bad.size, (f"{d}: at flat {bad[:4]}: a={a.ravel()[bad[:2]]} b={b.ravel()[bad[:2]]}: SVE "
                              f"{got.ravel()[bad[:4]]}, x86 {want.ravel()[bad[:4]]}")


@needs_sve_runner(512)
def test_bf16_rounding_is_ml_dtypes_bit_for_bit():
    """fp32 -> bf16 (``bfcvt``) in a copy and a reduction's store: round to nearest even
    on random bit patterns, exact ties, one below and above them, FLT_MAX (rounds to inf),
    subnormals (kept, not flushed), signalling NaNs (quieted, sign kept) as ml_dtypes does."""
    rng = np.random.default_rng(1)
    hi = rng.integers(0, 2 ** 16, 1536, dtype=np.uint64).astype(np.uint32) << 16
    low = rng.choice(np.uint32([0x8000, 0x7FFF, 0x8001, 0x0001, 0xFFFF, 0x0000]), hi.size)
    bits = np.concatenate([rng.integers(0, 2 ** 32, 512, dtype=np.uint64).astype(np.uint32), hi | low,
                           np.float32([FLT_MAX, -FLT_MAX, 1e-45, 1e-40, -1e-40, 1.1754942e-38]).view(np.uint32),
                           np.uint32([0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x00008000])])
    xs = bits.view(np.float32)[None]
    n = xs.shape[1]
    with np.errstate(invalid="ignore"):
        want = xs[0].astype(ml_dtypes.bfloat16)
    copy = Call(Kernel(Unary("copy", 1, n, out_dtype="bf16"), "sve").raw.code, [xs],
                [np.zeros((1, n), ml_dtypes.bfloat16)])
    # a sum over the rows of one row is the value itself
    red = Call(Kernel(Reduce("add", 1, n, over="rows", out_dtype="bf16"), "sve").raw.code, [xs],
               [np.zeros(n, ml_dtypes.bfloat16)])
    run_calls([copy, red], vl_bits=512)
    for got in (copy.outputs[0][0], red.outputs[0]):
        g, w = got.view(np.uint16), want.view(np.uint16)
        nan = np.isnan(xs[0])
        if got is red.outputs[0]:               # a sum starts at +0: 0 + -0 = +0 (as on x86)
            w = np.where(bits == 0x80000000, 0, w)
        bad = np.flatnonzero((g != w) & ~nan)
        assert not bad.size, [(hex(bits[i]), hex(g[i]), hex(w[i])) for i in bad[:4]]
        assert ((g[nan] & 0x7FC0) == 0x7FC0).all() and ((g[nan] ^ (bits[nan] >> 16)) & 0x8000 == 0).all()


# -- options the per-kind tests do not draw --------------------------------------------------------
@pytest.mark.parametrize("bits", vl_params((128, 512)))
def test_brgemm_options_and_a_large_batch(bits):
    """Overlapping A rows (lda < k, as a convolution's im2row view), a_bits=7 (A <= 127), stream_c,
    prefetch off and a batch of 67 blocks; quantize bits=7 on rows with ties."""
    def small_a(spec, v, rng):
        if spec.name == "a":
            v[...] = rng.integers(0, 128, v.shape)
    cases = [DescCase(Brgemm(m=5, n=19, k=9, lda=3, dtype=dt, c_dtype=cdt, beta=1), seed=i, count=2, scale=1.0)
             for i, (dt, cdt) in enumerate([("f32", "f32"), ("bf16", "bf16"), ("i8", "i32")])]
    cases += [DescCase(Brgemm(m=3, n=21, k=7, dtype="i8", a_bits=7), seed=4, count=3, fill=small_a),
              DescCase(Brgemm(m=4, n=17, k=6, stream_c=True, prefetch=False, pace=8, act="relu", bias=True), seed=5,
                       scale=1.0),
              DescCase(Brgemm(m=2, n=9, k=3, dtype="bf16", beta=1, act="sigmoid"), seed=6, count=67, scale=0.3),
              DescCase(Brgemm(m=2, n=9, k=5, dtype="i8", signs="uu", beta=1), seed=7, count=67)]

    def ties(spec, v, rng):
        if spec.name == "x":
            v[...] = (rng.integers(-30, 30, v.shape) + 0.5).astype(np.float32)
            v[:, 0] = 63.0
    cases += [DescCase(Quantize(3, 37, bits=7, dtype=dt), seed=8, fill=ties) for dt in ("f32", "bf16")]
    run_calls([c.call() for c in cases], vl_bits=bits)
    for c in cases:
        for got, want in c.results():
            if c.desc.kind == "quantize" or got.dtype.kind in "iu":
                bad = np.flatnonzero(got.view(np.uint8) != want.view(np.uint8))
            else:
                rtol = 1e-2 if c.desc.c_dtype == "bf16" or c.desc.dtype == "bf16" else 1e-5
                bad = close(got, want, rtol, rtol * max(1, c.desc.k * c.count))
            assert not bad.size, f"VL {bits}: {c.desc}: {bad.size} differ, e.g. {got[bad[0]]!r} vs {want[bad[0]]!r}"


# -- refusals ----------------------------------------------------------------------------------------
DTS = ("f32", "bf16", "i8", "u8", "i32", "i64")


def _every_descriptor():
    for op in (*UNARY_OPS, *GRAD_OPS):
        for dt in DTS:
            yield lambda op=op, dt=dt: Unary(op, 2, 5, dtype=dt, out_dtype="f32")
            yield lambda op=op, dt=dt: Unary(op, 2, 5, dtype="f32", out_dtype=dt)
    for dt in DTS:
        yield lambda dt=dt: Binary("add", 2, 5, dtype=dt)
        yield lambda dt=dt: Ternary("muladd", 2, 5, dtype=dt)
        yield lambda dt=dt: Reduce("max", 2, 5, dtype=dt)
        for op in ("transpose", "vnni2", "vnni4", "unvnni2", "unvnni4"):
            yield lambda dt=dt, op=op: Transform(op, 3, 5, dtype=dt)
        for make in (Softmax, LayerNorm, RMSNorm, SwiGLU, Quantize):
            yield lambda dt=dt, make=make: make(2, 5, dtype=dt)
        yield lambda dt=dt: Rotary(2, 8, 4, dtype=dt)
        yield lambda dt=dt: Dequant(2, 5, out_dtype=dt)
        yield lambda dt=dt: GemmNT(2, 3, 4, dtype=dt)
        yield lambda dt=dt: tppasm.brgemm(m=2, n=3, k=5, dtype=dt, isa="sve")   # (Kernel(Brgemm(dtype="u8")): KeyError)
        yield lambda dt=dt: MmlaBrgemm(m=2, n=3, k=5, dtype=dt)
    for signs in ("us", "ss", "su", "uu"):
        yield lambda s=signs: tppasm.brgemm(m=2, n=3, k=5, dtype="i8", signs=s, isa="sve")
        yield lambda s=signs: MmlaBrgemm(m=2, n=3, k=5, dtype="i8", signs=s)
    yield lambda: MmlaBrgemm(m=2, n=3, k=5, dtype="bf16", act="relu")
    yield lambda: MmlaBrgemm(m=2, n=3, k=5, dtype="bf16", c_dtype="bf16")
    yield lambda: Binary("add", 2, 5, post="relu_bwd")


def test_what_sve_cannot_build_is_a_type_or_value_error():
    """Every descriptor (each kind x dtype, the int8 signs, MmlaBrgemm's limits) either builds an
    SVE kernel or is refused with TypeError / ValueError (never KeyError, AssertionError, ...);
    the one SVE-only refusal (signs='su') names the fix."""
    built = refused = 0
    for make in _every_descriptor():
        try:
            made = make()
            if not hasattr(made, "desc"):                      # a descriptor, not a public entry's kernel
                Kernel(made, "sve")
            built += 1
        except (TypeError, ValueError) as e:
            refused += 1
            if "signs='su'" in str(e) and "sve" in str(e):
                assert "swap the roles of A and B" in str(e)
    assert built > 50 and refused > 100
