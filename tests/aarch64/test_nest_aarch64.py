"""AArch64 loop nests under qemu-aarch64: partitioning, order, barriers and DESIGN.md's GEMM.

One static ELF per spec: an entry stub fills the ctx's kernel table and barrier pointer with
``adr`` (the code is position independent), then calls ``nest(ctx, t, T)`` for t = 0..T-1 one
after the other; the threads' shares are disjoint, so sequential calls check the partitioning of
every spec without barriers (barriers go to a stub that counts them). Kernels: a recording kernel
(ticket, order, hits; as in tests/loops/test_nest.py), and SVE TPPs (``Kernel(desc, "sve")``).
"""
import inspect
import os
import subprocess
import tempfile
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import tppasm as tpp
from isa.aarch64 import Assembler, mem, x
from isa.aarch64.elf import DATA_BASE, SYS_EXIT, SYS_WRITE, write_elf
from isa.aarch64.emulate import qemu_path
from loops import Loop
from loops.decorator import _box
from loops.enumerate import enumerate_union
from loops.nest_plan import Layout
from loops.aarch64.nest import build_aarch64
from loops.spec import LETTERS, parse, serial_order
from loops.trace import thread, trace
from tppasm.kernel import Kernel

from .marks import needs_qemu

# the x86 nest tests' independent oracle of the spec semantics and their spec strategies
from tests.loops.test_nest import Record, loop_decls, oracle, specs  # noqa: E402

pytestmark = needs_qemu


def _record_kernel():
    a = Assembler()
    w9, w10 = x[9].__class__(9, 32), x[10].__class__(10, 32)
    a.ldr(w9, mem(x[0]))
    a.str(w9, mem(x[1]))
    a.add(w10, w9, 1)
    a.str(w10, mem(x[0]))
    a.ldr(w9, mem(x[2]))
    a.add(w9, w9, 1)
    a.str(w9, mem(x[2]))
    a.ret()
    k = Kernel.__new__(Kernel)
    k.desc, k.isa, k.runnable = Record(), "sve", False
    k.operands, k.scalars = tuple(k.desc.operands()), ()
    k.code, k._native, k._n, k._defaults = a.code(), False, 3, ()
    return k


REC = _record_kernel()


def _barrier_stub():
    a = Assembler()                      # barrier(state, tid): ++*state
    a.ldr(x[2], mem(x[0]))
    a.add(x[2], x[2], 1)
    a.str(x[2], mem(x[0]))
    a.ret()
    return a.code()


def _code_of(k):
    return k.code if hasattr(k, "code") else k.raw.code


def nest_image(spec_text, loops, body, arrays, nthreads, init=None, fini=None):
    """Trace ``body`` (and the ``init``/``fini`` hooks) on ``arrays`` and build the AArch64 nest.

    Returns ``nest`` (code), ``blobs`` and ``slots`` (kernel codes and the ctx slots of their
    addresses), ``image`` (the data segment: the ctx at offset 0, then the arrays at ``offsets``)
    and ``nthreads`` (1 for a serial spec, as the decorator runs those on one thread).
    """
    spec = parse(spec_text, len(loops))
    if spec.mode == "serial":
        nthreads = 1
    resolved = spec.resolve(loops)
    params = list(inspect.signature(body).parameters)
    names = params[len(loops):]
    box = _box(SimpleNamespace(resolved=resolved), spec, nthreads)
    tree = trace(body, params[:len(loops)], arrays, names).simplify(box)
    hooks = [trace(fn or (lambda *a: None), [], arrays, names).simplify(box) for fn in (init, fini)]
    kernels = list({id(c.kernel): c.kernel for t in [tree] + hooks for c in t.all_calls()}.values())
    lay = Layout(len(arrays), len(kernels), len(loops))
    nest = build_aarch64(spec, resolved, tree, *hooks, lay, [a.itemsize for a in arrays], kernels)

    ctx = np.frombuffer(bytes(lay.template(resolved, [0] * len(kernels))), np.int64).copy()
    image, offsets = bytearray(ctx.nbytes + 64), []
    for a in arrays:
        off = (len(image) + 63) // 64 * 64
        image += bytes(off - len(image)) + np.ascontiguousarray(a).tobytes()
        offsets.append(off)
        ctx[lay.array(len(offsets) - 1) // 8] = DATA_BASE + off
    image[:ctx.nbytes] = ctx.tobytes()
    return SimpleNamespace(nest=nest, blobs=[_code_of(k) for k in kernels], image=image, offsets=offsets,
                           slots=[lay.kernel(i) for i in range(len(kernels))], nthreads=nthreads)


def store_addresses(stub, labels, slots):
    """Emit: the address of each label goes to its slot of the data segment (DATA_BASE + slot)."""
    for label, slot in zip(labels, slots):
        stub.adr(x[9], label)
        stub.mov_imm(x[10], DATA_BASE + slot)
        stub.str(x[9], mem(x[10]))


def write_and_exit(stub, length, exit_nr=SYS_EXIT):
    """Emit: write the first ``length`` bytes of the data segment to stdout, then exit(0)."""
    for reg, value in ((x[0], 1), (x[1], DATA_BASE), (x[2], length), (x[8], SYS_WRITE)):
        stub.mov_imm(reg, value)
    stub.svc(0)
    stub.mov_imm(x[0], 0)
    stub.mov_imm(x[8], exit_nr)
    stub.svc(0)


def link(stub, labels, blobs):
    """The stub's code, then each blob 64-byte aligned at its label."""
    text = bytearray()
    base = (stub.pc + 63) // 64 * 64
    for label, blob in zip(labels, blobs):
        label.offset = base + len(text)
        text += blob + bytes(-len(blob) % 64)
    return stub.code().ljust(base, b"\0") + bytes(text)


def run_elf(text, image, vl_bits=256):
    """Run code ``text`` with data ``image`` under qemu; its stdout (the exit status must be 0)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "nest.elf")
        with open(path, "wb") as f:
            f.write(write_elf(text, bytes(image)))
        os.chmod(path, 0o755)
        proc = subprocess.run([qemu_path(), "-cpu", f"max,sve{vl_bits}=on", path], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    return proc.stdout


def read_arrays(out, arrays, offsets):
    for a, off in zip(arrays, offsets):
        a[...] = np.frombuffer(out[off:off + a.nbytes], a.dtype).reshape(a.shape)


def run_nest(spec_text, loops, body, arrays, nthreads, vl_bits=256, init=None, fini=None):
    """Build the nest (:func:`nest_image`) and run threads 0..T-1 in turn under qemu.

    Fills ``arrays`` in place; returns the number of barrier calls.
    """
    img = nest_image(spec_text, loops, body, arrays, nthreads, init, fini)
    image, counter = img.image, len(img.image)        # barrier count: one int64 after the arrays
    image += bytes(8)
    image[Layout.BARRIER_STATE:Layout.BARRIER_STATE + 8] = (DATA_BASE + counter).to_bytes(8, "little")
    stub = Assembler()
    blobs = [img.nest, _barrier_stub()] + img.blobs
    labels = [stub.label() for _ in blobs]
    store_addresses(stub, labels[1:], [Layout.BARRIER_FN] + img.slots)
    for t in range(img.nthreads):
        stub.mov_imm(x[0], DATA_BASE)
        stub.mov_imm(x[1], t)
        stub.mov_imm(x[2], img.nthreads)
        stub.adr(x[16], labels[0])
        stub.blr(x[16])
    write_and_exit(stub, len(image))
    out = run_elf(link(stub, labels, blobs), image, vl_bits)
    read_arrays(out, arrays, img.offsets)
    return int(np.frombuffer(out[counter:counter + 8], np.int64)[0])


def recording_body(nloops, shared_counter):
    def body(*args):
        idx, (cnt, order, hits) = args[:nloops], args[nloops:]
        t = thread()
        REC_CALL(cnt[0 if shared_counter else t.tid], order[idx], hits[(t.tid,) + tuple(idx)])
    REC_CALL = REC
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
              for n in [f"i{c}" for c in LETTERS[:nloops]] + ["CNT", "O", "H"]]
    body.__signature__ = inspect.Signature(params)
    return body


def run_recorded(spec_text, loops, nthreads, shared_counter=True, runner=run_nest):
    eff = parse(spec_text, len(loops)).resolve(loops)      # baked bounds may reach further
    ends = [max(lp.end, lp.start + 1) for lp in eff]
    cnt = np.zeros((nthreads, 1, 1), np.int32)
    order = np.full(tuple(ends) + (1, 1), -1, np.int32)
    hits = np.zeros((nthreads,) + tuple(ends) + (1, 1), np.int32)
    barriers = runner(spec_text, loops, recording_body(len(loops), shared_counter), [cnt, order, hits], nthreads)
    return order[..., 0, 0], hits[..., 0, 0], barriers


def expected_owners(spec_text, loops, nthreads):
    """[(index, owner or None)] in serial order, from tests/loops/test_nest.py's oracle."""
    spec = parse(spec_text, len(loops))
    levels = [(lv.letter, lv.occurrence, lv.parallel, lv.axis, lv.teams) for lv in spec.levels]
    return oracle(levels, spec.resolve(loops), nthreads, spec.mode, spec.grid, spec.schedule, spec.run)


CASES = [  # spec, loops, threads, barrier calls per thread
    ("aba", [Loop(0, 5, blocks=[2]), Loop(1, 4)], 1, 0),
    ("Ab", [Loop(0, 7), Loop(2, 9, 3)], 3, 0),
    ("ABa", [Loop(0, 5, blocks=[2]), Loop(0, 3)], 2, 0),
    ("aBCb@schedule(static,2)", [Loop(0, 3), Loop(0, 7, blocks=[3]), Loop(1, 6, 2)], 3, 0),
    ("abB@schedule(dynamic,2)", [Loop(0, 5), Loop(0, 7, blocks=[3])], 2, 0),
    ("A{R:2}B{C:2}", [Loop(0, 7), Loop(0, 5)], 5, 0),
    ("bA{C:2}aB{R:1}", [Loop(0, 9, blocks=[4]), Loop(0, 4, blocks=[3])], 2, 0),
    ("c[1,7,2,()]BA|", [Loop(0, 3), Loop(0, 4), Loop(0, 2)], 3, 3),
    ("cAB|@schedule(static,3)", [Loop(0, 5), Loop(0, 4), Loop(0, 2)], 2, 2),
]


@pytest.mark.parametrize("spec_text,loops,nthreads,barriers_each", CASES, ids=[c[0] for c in CASES])
def test_each_iteration_once_on_its_thread_in_order(spec_text, loops, nthreads, barriers_each):
    check_recorded(spec_text, loops, nthreads, barriers_each)


GEMM_LOOPS = [Loop(0, 4), Loop(0, 6, blocks=[4, 2]), Loop(0, 5, blocks=[3, 2])]
ALL = enumerate_union([("a", False), ("b", True), ("c", True)], {"b": 2, "c": 2})


@pytest.mark.parametrize("spec_text", ALL[::97])
def test_enumerated_specs_sample(spec_text):
    check_recorded(spec_text, GEMM_LOOPS, 3)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(data=st.data())
def test_random_specs(data):
    loops = data.draw(loop_decls())
    nthreads = data.draw(st.sampled_from([1, 2, 3]))
    text = data.draw(specs(loops, nthreads))[0]
    check_recorded(text, loops, nthreads)


def check_recorded(spec_text, loops, nthreads, barriers_each=None, runner=run_nest):
    """Each iteration once, on the thread the oracle says, each thread's share in serial order.

    Threads that run at the same time (``runner`` other than :func:`run_nest`) count tickets on
    their own counters: the recording kernel's read-modify-write is not atomic.
    """
    order, hits, barriers = run_recorded(spec_text, loops, nthreads, runner is run_nest, runner)
    expect = expected_owners(spec_text, loops, nthreads)
    want = np.zeros_like(hits)
    for idx, owner in expect:
        want[(owner or 0,) + idx] += 1
    if any(owner is None for _, owner in expect):          # dynamic: any thread, once in total
        assert (hits.sum(0) == want.sum(0)).all()
    else:
        assert (hits == want).all()
    position = {idx: p for p, (idx, _) in enumerate(expect)}
    for t in range(nthreads):                              # each thread runs its share in serial order
        seq = sorted((idx for idx in position if hits[(t,) + idx]), key=lambda idx: order[idx])
        assert [position[i] for i in seq] == sorted(position[i] for i in seq)
    if barriers_each is not None:
        assert barriers == nthreads * barriers_each


def test_init_fini_once_per_working_thread():
    def body(i, CNT, O, H, IO, IH, FO, FH):
        REC(CNT[0], O[i], H[thread().tid, i])

    def init(CNT, O, H, IO, IH, FO, FH):
        REC(CNT[0], IO[thread().tid], IH[thread().tid])

    def fini(CNT, O, H, IO, IH, FO, FH):
        REC(CNT[0], FO[thread().tid], FH[thread().tid])
    T = 3
    arrays = [np.zeros((1, 1, 1), np.int32), np.full((5, 1, 1), -1, np.int32), np.zeros((T, 5, 1, 1), np.int32)]
    arrays += [np.full((T, 1, 1), -1, np.int32), np.zeros((T, 1, 1), np.int32)]
    arrays += [np.full((T, 1, 1), -1, np.int32), np.zeros((T, 1, 1), np.int32)]
    run_nest("A{R:2}", [Loop(0, 5)], body, arrays, T, init=init, fini=fini)
    cnt, order, hits, io, ih, fo, fh = (a[..., 0, 0] for a in arrays)
    assert ih.tolist() == fh.tolist() == [1, 1, 0]           # thread 2 is outside the 2-row grid: idle
    assert (hits.sum(0) == 1).all() and hits[0, :3].all() and hits[1, 3:].all()
    for t in range(2):
        mine = order[hits[t] == 1]
        assert io[t] < mine.min() and mine.max() < fo[t]


def test_serial_spec_runs_in_spec_order():
    loops = [Loop(0, 5, blocks=[2]), Loop(1, 4), Loop(0, 3, 2)]
    order, hits, _ = run_recorded("acba", loops, 1)
    seq = list(serial_order(parse("acba", 3), loops))
    assert sorted(seq, key=lambda idx: order[idx]) == seq and hits.sum() == len(seq)


def test_if_condition_and_affine_offsets():
    relu = tpp.unary("relu", 2, 4, ldx=8, ldo=8, isa="sve")
    copy = tpp.unary("copy", 2, 4, ldx=8, ldo=8, isa="sve")

    def body(i, j, X, Y):
        if i + j < 3 and j != 1:
            relu(X[2 * i:2 * i + 2, 4 * j:4 * j + 4], Y[i, :, 4 * j:4 * j + 4])
        else:
            copy(X[2 * i:2 * i + 2, 4 * j:4 * j + 4], Y[i, :, 4 * j:4 * j + 4])
    X = np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32)
    Y = np.full((4, 2, 8), np.nan, np.float32)
    run_nest("BA", [Loop(0, 4), Loop(0, 2)], body, [X, Y], 3)
    for i in range(4):
        for j in range(2):
            blk = X[2 * i:2 * i + 2, 4 * j:4 * j + 4]
            want = np.maximum(blk, 0) if i + j < 3 and j != 1 else blk
            np.testing.assert_array_equal(Y[i, :, 4 * j:4 * j + 4], want)


BM = BN = BK = 8
MB, NB, KB, KSTEP = 3, 3, 4, 2
GEMM_SPECS = enumerate_union([("a", False), ("b", True), ("c", True)], {"b": 1, "c": 1})


@pytest.mark.parametrize("spec_text,vl_bits", [(s, (128, 256, 512)[i % 3]) for i, s in
                                              enumerate(GEMM_SPECS[::max(1, len(GEMM_SPECS) // 6)][:6])])
def test_design_gemm_matches_numpy(spec_text, vl_bits):
    brgemm = tpp.brgemm(m=BM, n=BN, k=BK, dtype="f32", beta=1, isa="sve")
    zero = tpp.zero(BM, BN, "f32", isa="sve")

    def gemm(ik, im, jn, A, B, C):
        if ik == 0:
            zero(C[im, jn])
        brgemm(A[im, ik:ik + KSTEP], B[jn, ik:ik + KSTEP], C[im, jn], count=KSTEP)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((MB * BM, KB * BK)).astype(np.float32)
    b = rng.standard_normal((KB * BK, NB * BN)).astype(np.float32)
    A, B = tpp.block(a, BM, BK), np.ascontiguousarray(tpp.block(b, BK, BN, outer="n"))
    C = np.full((MB, NB, BM, BN), np.nan, np.float32)
    loops = [Loop(0, KB, KSTEP, parallel=False), Loop(0, MB, blocks=[2]), Loop(0, NB, blocks=[2])]
    run_nest(spec_text, loops, gemm, [np.ascontiguousarray(A), B, C], 2, vl_bits)
    np.testing.assert_allclose(tpp.unblock(C), a @ b, rtol=1e-4, atol=1e-3, err_msg=spec_text)
