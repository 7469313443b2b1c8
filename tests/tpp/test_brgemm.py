"""BRGEMM against its NumPy reference: every dtype x ISA x inner-product variant, random shapes,
leading dimensions and batch strides, both betas, all three batch kinds, the epilogue; outputs
poisoned and every element checked; operands sized exactly so the interpreter faults on any read
past them. Plus the errors bad input raises."""
import dataclasses
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tppasm
from tppasm.brgemm import BatchedBrgemm, Brgemm, _view
from tppasm.kernel import get_kernel
from tppasm.dtypes import dtype as np_dtype
from tppasm.operand import OperandError
from tppasm.x86 import brgemm as x86_brgemm
from tppasm.x86 import prefetch as x86_prefetch
from tppasm.x86.brgemm import generate_brgemm, target_features
from tests.support import assert_same_non_finite, isa_params, native, sprinkle

EPS32 = 2.0 ** -23
TRANSCENDENTAL = ("gelu", "gelu_erf", "gelu_erf_fast", "sigmoid", "tanh")
# (isa, dtype, target features, where): features None = the target's own (the public call);
# AVX-512 runs both inner products of each dtype; "interp" runs the code in the interpreter even
# where the host could run it (any read past an operand faults there)
VARIANTS = [("avx2", "f32", None, "native"), ("avx2", "bf16", None, "native"), ("avx2", "i8", None, "native"),
            ("avx2", "f32", (), "interp"), ("avx2", "bf16", (), "interp"), ("avx2", "i8", (), "interp"),
            ("avx2", "i8", ("avx_vnni",), "interp"),
            ("avx512", "f32", None, "native"), ("avx512", "bf16", ("avx512_bf16",), "native"),
            ("avx512", "bf16", (), "native"), ("avx512", "i8", ("avx512_vnni",), "native"),
            ("avx512", "i8", (), "native")]


def _params():
    marks = {p.values[0]: p for p in isa_params()}
    out = []
    for isa, dt, feats, where in VARIANTS:
        base = marks["avx512" if where == "interp" else isa]
        name = f"{isa}-interp" if where == "interp" else base.id
        name += f"-{dt}" + ("" if feats is None else "-" + ("+".join(feats) or "noext"))
        out.append(pytest.param(isa, dt, (feats, where), id=name, marks=base.marks))
    return out


def _filled(rng, size, dt):
    if dt == "u8":
        return rng.integers(0, 256, size, dtype=np.uint8)
    if dt == "i8":
        return rng.integers(-128, 128, size, dtype=np.int8)
    return rng.standard_normal(size).astype(np_dtype(dt))


def _strided(rng, spec, count, stride):
    """``count`` blocks of ``spec`` ``stride`` elements apart in a buffer that ends at the last one."""
    extent = 1 + sum((d - 1) * s for d, s in zip(spec.shape, spec.strides))
    buf = _filled(rng, (count - 1) * stride + extent, spec.dtype)
    es = buf.itemsize
    return np.ndarray((count,) + spec.shape, buf.dtype, buffer=buf,       # .base is buf: the
                      strides=[stride * es] + [s * es for s in spec.strides])  # interpreter maps it


def _case(desc, count, rng, spare):
    """(public call arguments, A blocks, B blocks, C, C's padding view, bias)."""
    spec_a, spec_b = desc.block_specs()
    blocks = count + spare
    if desc.batch == "stride":
        a, b = _strided(rng, spec_a, blocks, desc.stride_a), _strided(rng, spec_b, blocks, desc.stride_b)
        a_blocks, b_blocks, args = list(a[:count]), list(b[:count]), [a, b]
    elif desc.batch == "offset":
        bufs, offs = [], []
        for spec in (spec_a, spec_b):
            extent = 1 + sum((d - 1) * s for d, s in zip(spec.shape, spec.strides))
            buf = _filled(rng, extent + int(rng.integers(0, 40)), spec.dtype)
            bufs.append(buf)
            offs.append(rng.integers(0, buf.size - extent + 1, blocks))
        offsets = np.stack(offs, axis=1).astype(np.int64)
        a_blocks = [_view(bufs[0], int(o), spec_a) for o in offsets[:count, 0]]
        b_blocks = [_view(bufs[1], int(o), spec_b) for o in offsets[:count, 1]]
        args = [bufs[0], bufs[1], None, offsets]
    else:
        a_blocks = [_strided(rng, spec_a, 1, 0)[0] for _ in range(blocks)]
        b_blocks = [_strided(rng, spec_b, 1, 0)[0] for _ in range(blocks)]
        args = [a_blocks, b_blocks]
        a_blocks, b_blocks = a_blocks[:count], b_blocks[:count]
    c_dt = np_dtype(desc.c_dtype)
    cbuf = np.full((desc.m, desc.ldc), -777 if c_dt.kind == "i" else np.nan, np.float32).astype(c_dt)
    c = cbuf[:, :desc.n]
    if desc.beta:
        c[...] = _filled(rng, c.shape, "i8" if c_dt.kind == "i" else desc.c_dtype).astype(c_dt)
    if desc.batch == "offset":
        args[2] = c
    else:
        args.append(c)
    bias = _filled(rng, desc.n, "f32") if desc.bias else None
    if bias is not None:
        args.append(bias)
    return args, a_blocks, b_blocks, c, cbuf[:, desc.n:], bias


def _run(desc, isa, variant, args, count):
    """Through the public call where the host runs the target, else the raw kernel natively or in
    the interpreter."""
    features, where = variant
    host_runs = native(isa) and where == "native" and set(features or ()) <= target_features(isa)
    if host_runs and features is None:
        kernel = get_kernel(desc, isa)
        (kernel if desc.batch == "stride" else BatchedBrgemm(kernel))(*args, count=count)
        return
    code = generate_brgemm(desc, isa, features or ())
    if host_runs:
        arrays = [np.array([x.ctypes.data for x in a], np.int64) if isinstance(a, list) else a for a in args]
        code(*(a.ctypes.data for a in arrays), count)
        return
    _interpret(code.code, args, count)


def _interpret(code, args, count):
    """Run raw ``code`` in the interpreter on ``args`` (arrays, or lists of blocks for pointer
    arrays): each array's whole buffer is mapped, results are copied back."""
    from isa.x86.interp import Machine
    m, mapped = Machine(), []

    def address(arr):
        root = arr
        while isinstance(root.base, np.ndarray):
            root = root.base
        for r, addr in mapped:
            if r is root:
                break
        else:
            addr = m.map(root)
            mapped.append((root, addr))
        return addr + arr.ctypes.data - root.ctypes.data

    values = []
    for a in args:
        if isinstance(a, list):
            a = np.array([address(blk) for blk in a], np.int64)
        values.append(address(a))
    m.call(code, args=values + [count])
    for root, addr in mapped:
        if root.flags.writeable:
            root[...] = m.read(addr, like=root)


def _check(desc, got, pad, a_blocks, b_blocks, c0, bias):
    exact = desc.dtype == "i8"
    wide = np.int64 if exact else np.float64
    want = desc.compute(a_blocks, b_blocks, c0.astype(wide), bias)
    if desc.c_dtype == "i32":
        assert (pad == -777).all(), "the kernel wrote past n"
        np.testing.assert_array_equal(got, want.astype(np.int32))
        return
    assert np.isnan(pad.astype(np.float32)).all(), "the kernel wrote past n"
    # fp32 accumulation in another order: |error| <= (terms) * eps32 * sum of |terms|
    mag = sum(np.abs(ai.astype(wide)) @ np.abs(_plain(desc, bi).astype(wide)) for ai, bi in zip(a_blocks, b_blocks))
    mag = mag + (np.abs(c0.astype(wide)) if desc.beta else 0) + (np.abs(bias) if bias is not None else 0)
    tol = (desc.k * len(a_blocks) + 3) * EPS32 * mag + 1e-30
    if desc.act in TRANSCENDENTAL:   # slopes <= 1.13; emitters within 6 ulp (x86.math)
        tol = 1.2 * tol + 8 * EPS32 * np.abs(want) + 1e-37
    if desc.act == "gelu_erf_fast":  # absolute: 2^-22 max(1, |x|), and |x| <= mag
        tol = tol + 2.0 ** -22 * np.maximum(1.0, mag)
    if desc.c_dtype == "bf16":
        tol = tol + 2.0 ** -8 * np.abs(want)
    err = np.abs(got.astype(np.float64) - want)
    assert np.isfinite(got.astype(np.float32)).all(), "non-finite output (poison or unwritten lanes)"
    assert (err <= tol).all(), f"max error {err.max()} at {np.unravel_index(np.argmax(err - tol), err.shape)}"


def _round_trip(desc, isa, variant, count, seed, spare=0):
    """Operands for ``desc`` (``spare`` blocks past the batch), the kernel run on them, every
    element of C checked against the reference."""
    args, a_blocks, b_blocks, c, pad, bias = _case(desc, count, np.random.default_rng(seed), spare)
    c0 = c.copy()
    _run(desc, isa, variant, args, count)
    _check(desc, c, pad, a_blocks, b_blocks, c0, bias)


def _plain(desc, b):
    if desc.vnni == 1:
        return b
    return np.swapaxes(b, -1, -2).reshape(desc.groups * desc.vnni, desc.n)[:desc.k]


@st.composite
def descriptors(draw, dtype, small):
    top = 24 if small else 70
    m, n = draw(st.integers(1, top)), draw(st.integers(1, top))
    k = draw(st.integers(1, top))
    lda, ldb, ldc = (x + draw(st.sampled_from([0, 0, 1, 5, 16])) for x in (k, n, n))
    batch = draw(st.sampled_from(["stride", "stride", "offset", "address"]))
    strided = batch == "stride"                # offsets and addresses find blocks without strides
    stride_a = m * lda + draw(st.sampled_from([0, 0, 3, 64])) if strided else 0
    stride_b = k * ldb + draw(st.sampled_from([0, 0, 4])) if strided else 0
    beta = draw(st.integers(0, 1))
    c_dtype = draw(st.sampled_from(["f32", "bf16"])) if dtype == "bf16" else ""
    bias = dtype != "i8" and draw(st.booleans())
    act = draw(st.sampled_from([None, "relu"] + ([] if dtype == "i8" else ["gelu", "gelu_erf", "sigmoid", "tanh"])))
    return Brgemm(m=m, n=n, k=k, lda=lda, ldb=ldb, ldc=ldc, stride_a=stride_a, stride_b=stride_b,
                  beta=beta, dtype=dtype, c_dtype=c_dtype, batch=batch, bias=bias, act=act)


@pytest.mark.parametrize("isa, dtype, features", _params())
@given(data=st.data())
def test_brgemm_matches_reference(isa, dtype, features, data):
    small = not native(isa) or features[1] == "interp"
    desc = data.draw(descriptors(dtype, small))
    desc.validate()
    count = data.draw(st.integers(1, 3 if small else 4))
    spare = data.draw(st.integers(0, 1))
    _round_trip(desc, isa, features, count, data.draw(st.integers(0, 2 ** 32 - 1)), spare)


@pytest.mark.parametrize("isa, dtype, features", _params())
@settings(max_examples=12)
@given(data=st.data())
def test_brgemm_in_batch_chunks(isa, dtype, features, data):
    """Batch chunks of 1 or 2 blocks (what large counts of large blocks get): the tiles take one
    chunk at a time, C carries the partial sums, beta and the epilogue apply once; the next
    chunk's prefetches (on for every block here) change nothing."""
    feats, where = features
    small = not native(isa) or where == "interp"
    desc = data.draw(descriptors(dtype, small))
    count = data.draw(st.integers(2, 5))
    per_chunk = data.draw(st.integers(1, 2))
    with pytest.MonkeyPatch.context() as mp:      # fresh code (not the kernel cache), chunked
        mp.setattr(x86_brgemm.Gen, "chunk_size", lambda self: 0 if self.bf16_out else per_chunk)
        mp.setattr(x86_prefetch, "FAR_BLOCK_BYTES", 0)
        _round_trip(desc, isa, (tuple(target_features(isa)) if feats is None else feats, where), count,
                    data.draw(st.integers(0, 2 ** 32 - 1)))


@pytest.mark.parametrize("isa, dtype, features", _params())
@settings(max_examples=10)
@given(data=st.data())
def test_brgemm_streaming_a(isa, dtype, features, data):
    """Tall A against a narrow B (one column block of tiles, an A block 4x the B block or more):
    no batch chunks, and each k loop prefetches the next row tile's A lines, past the last tile
    too (prefetches never fault: the interpreter runs them against the operands' edges)."""
    feats, where = features
    small = not native(isa) or where == "interp"
    n = data.draw(st.integers(1, 8 if small else 16))
    m = data.draw(st.integers(max(4 * n, 17), 40 if small else 120))      # > the 16 rows of a tile
    k = data.draw(st.integers(33 if dtype == "f32" else 65, 80 if small else 160))
    batch = data.draw(st.sampled_from(["stride", "offset", "address"]))
    desc = Brgemm(m=m, n=n, k=k, dtype=dtype, batch=batch, beta=data.draw(st.integers(0, 1)),
                  c_dtype=data.draw(st.sampled_from(["f32", "bf16"])) if dtype == "bf16" else "")
    variant = (tuple(target_features(isa)) if feats is None else feats, where)
    assert x86_brgemm.Gen(desc, isa, variant[0]).streams_a(), desc
    count = data.draw(st.integers(1, 3 if small else 5))
    _round_trip(desc, isa, variant, count, data.draw(st.integers(0, 2 ** 32 - 1)))


@pytest.mark.parametrize("isa, dtype, features", _params())
@settings(max_examples=12)
@given(data=st.data())
def test_brgemm_streaming_c(isa, dtype, features, data):
    """``stream_c=True``: non-temporal stores of C where its tile is aligned (checked at run time),
    plain ones elsewhere, after the last batch chunk only; the same results whatever C's alignment
    (the interpreter faults on a misaligned non-temporal store)."""
    feats, where = features
    small = not native(isa) or where == "interp"
    drawn = data.draw(descriptors(dtype, small))
    vec = 16 if isa == "avx512" else 8                       # fp32 lanes of a vector
    ldc = data.draw(st.sampled_from([drawn.ldc, -(-drawn.n // vec) * vec, -(-drawn.n // vec) * vec + 2 * vec]))
    desc = Brgemm(**{**{f: getattr(drawn, f) for f in ("m", "n", "k", "lda", "ldb", "stride_a", "stride_b", "beta",
                                                       "dtype", "c_dtype", "batch", "bias", "act")},
                     "ldc": ldc, "stream_c": True})
    variant = (tuple(target_features(isa)) if feats is None else feats, where)
    per_chunk = data.draw(st.sampled_from([0, 1, 2]))              # 0: the kernel's own chunks
    count = data.draw(st.integers(1, 4))
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    args, a_blocks, b_blocks, c, pad, bias = _case(desc, count, rng, 0)
    off = data.draw(st.sampled_from([0, 0, 1, 8]))                # elements past a 64-byte boundary
    full = tppasm.empty((off + desc.m * ldc,), c.dtype)[off:].reshape(desc.m, ldc)
    full[...] = c.base                                             # C and its poisoned padding
    args = [full[:, :desc.n] if x is c else x for x in args]
    c0 = c.copy()
    with pytest.MonkeyPatch.context() as mp:
        if per_chunk:
            mp.setattr(x86_brgemm.Gen, "chunk_size", lambda self: 0 if self.bf16_out else per_chunk)
        text = generate_brgemm(desc, isa, variant[0]).disassemble()
        es = np_dtype(desc.c_dtype).itemsize
        aligned = ldc * es % (vec * (2 if desc.c_dtype == "bf16" else 4)) == 0
        full_vectors = desc.n >= vec                                # tails store under a mask
        assert ("vmovnt" in text) == (aligned and full_vectors and desc.act not in TRANSCENDENTAL), desc
        _run(desc, isa, variant, args, count)
    _check(desc, full[:, :desc.n], full[:, desc.n:], a_blocks, b_blocks, c0, bias)


def _paced(desc, isa, features):
    """(disassembly, the pace chain's register name, its ``vpaddd r, r, r`` count)."""
    gen = x86_brgemm.Gen(desc, isa, features)
    text = str(gen.build().disassemble())
    reg = str(gen.pace_reg)
    return text, reg, text.count(f"vpaddd {reg},{reg},{reg}")


@pytest.mark.parametrize("isa, dtype, features", _params())
@settings(max_examples=8)
@given(data=st.data())
def test_brgemm_paced(isa, dtype, features, data):
    """``pace=P``: P ``vpaddd r, r, r`` per k group on a register of the pace's own, and the same
    results as any kernel."""
    feats, where = features
    small = not native(isa) or where == "interp"
    pace = data.draw(st.sampled_from([1, 8, 64]))
    desc = dataclasses.replace(data.draw(descriptors(dtype, small)), pace=pace)
    variant = (tuple(target_features(isa)) if feats is None else feats, where)
    _, _, length = _paced(desc, isa, variant[0])
    assert length and length % pace == 0, desc
    _round_trip(desc, isa, variant, data.draw(st.integers(1, 3)), data.draw(st.integers(0, 2 ** 32 - 1)))


@pytest.mark.parametrize("dtype", ["f32", "bf16", "i8"])
@pytest.mark.parametrize("m", [1, 2, 4])
def test_pace_chain_register_is_its_own(dtype, m):
    """In a GEMV's kernel (no epilogue, whose temporaries may reuse the register after the k loops)
    the chain's register appears in no other instruction, and ``pace=0`` emits no chain."""
    desc = Brgemm(m=m, n=64, k=512, dtype=dtype, pace=8)
    text, reg, length = _paced(desc, "avx512", target_features("avx512"))
    assert length % 8 == 0 and len(re.findall(rf"\b[xyz]mm{reg[3:]}\b", text)) == 3 * length
    plain = x86_brgemm.Gen(dataclasses.replace(desc, pace=0), "avx512", target_features("avx512"))
    assert f"vpaddd {reg},{reg},{reg}" not in str(plain.build().disassemble())


@pytest.mark.parametrize("isa, dtype", [pytest.param(isa, dt, id=f"{isa}_code-{dt}")     # code only: no ISA run
                                        for isa, dt in [("amx", "bf16"), ("amx", "i8"), ("sve", "f32"),
                                                        ("sve", "bf16"), ("sve", "i8")]])
def test_pace_is_ignored_where_documented(isa, dtype):
    """AMX tile kernels and SVE kernels ignore ``pace``: the same code with it as without."""
    from tppasm.backends import generator
    desc = Brgemm(m=4, n=16, k=64, dtype=dtype)
    gen = generator(isa, "brgemm")
    assert gen(desc, isa).code == gen(dataclasses.replace(desc, pace=8), isa).code


def test_streaming_a_rule():
    """Which kernels stream A (no chunks, next-tile A prefetches): a flat 1x1 convolution's
    448 x 64 x 64 in every dtype; not square blocks, several column blocks, GEMVs or B blocks
    whose batch outgrows L2."""
    def streams(**kw):
        gen = x86_brgemm.Gen(Brgemm(**kw), "avx512", target_features("avx512"))
        return gen.streams_a(), gen.chunk_size()
    for dtype in ("f32", "bf16", "i8"):
        k = {"f32": 64, "bf16": 64, "i8": 128}[dtype]
        assert streams(m=448, n=64, k=k, dtype=dtype) == (True, 0)
        assert not streams(m=64, n=64, k=k, dtype=dtype)[0]
        assert not streams(m=4, n=64, k=2048, dtype=dtype)[0]
    assert not streams(m=448, n=128, k=64)[0]          # two column blocks: A rows read twice
    assert not streams(m=4096, n=64, k=512)[0]         # 16 B blocks of 128 KiB
    text = generate_brgemm(Brgemm(m=448, n=64, k=64), "avx512").disassemble()
    ahead = re.findall(r"prefetcht1 \[\w+\+0?([0-9A-F]+)h\]", text)
    assert [int(x, 16) for x in ahead[:6]] == [(6 + i) * 256 for i in range(6)], ahead   # rows 6..11 of 256 B


@pytest.mark.parametrize("isa, dtype, features", _params())
@pytest.mark.parametrize("groups", [1, 2, 3, 5])
def test_looped_k_with_few_groups(isa, dtype, features, groups):
    """The looped k path with fewer groups than one unrolled iteration (what long groups of large
    tiles get): the peeled first group, the loop and the remainder run every group exactly once."""
    feats, where = features
    f = {"f32": 1, "bf16": 2, "i8": 4}[dtype]
    desc = Brgemm(m=7, n=20, k=groups * f + (1 if f > 1 else 0), dtype=dtype, batch="address")
    with pytest.MonkeyPatch.context() as mp:      # fresh code, never fully unrolled, unroll 2
        mp.setattr(x86_brgemm, "UNROLL_INSTRUCTIONS", 1)
        _round_trip(desc, isa, (tuple(target_features(isa)) if feats is None else feats, where), 2, groups)


@pytest.mark.parametrize("isa, dtype, features", [p for p in _params() if p.values[1] != "f32"])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 7])
def test_vnni_k_tail_ignores_padding(isa, dtype, features, k):
    """k not a multiple of the VNNI factor: B's padding lanes may hold anything, even inf/NaN."""
    rng = np.random.default_rng(k)
    desc = Brgemm(m=3, n=11, k=k, dtype=dtype, lda=k + 1)
    args, a_blocks, b_blocks, c, pad, bias = _case(desc, 2, rng, 0)
    f = desc.vnni
    for blk in b_blocks:
        if k % f:
            blk[-1, :, k % f:] = np.inf if dtype == "bf16" else -128
    c0 = c.copy()
    _run(desc, isa, features, args, 2)
    _check(desc, c, pad, a_blocks, b_blocks, c0, bias)


@pytest.mark.parametrize("isa, dtype, features", _params())
@pytest.mark.parametrize("shape", [(1, 1, 4), (6, 16, 8), (14, 33, 4), (23, 17, 12)])
def test_brgemm_fixed_shapes(isa, dtype, features, shape):
    """Edge shapes: 1, exact vector widths, tails, and the largest register blocks."""
    m, n, k = shape
    rng = np.random.default_rng(m * 100 + n)
    for beta in (0, 1):
        desc = Brgemm(m=m, n=n, k=k, dtype=dtype, beta=beta, ldc=n + 3)
        args, a_blocks, b_blocks, c, pad, bias = _case(desc, 2, rng, 0)
        c0 = c.copy()
        _run(desc, isa, features, args, 2)
        _check(desc, c, pad, a_blocks, b_blocks, c0, bias)


@pytest.mark.parametrize("isa, dtype, features", [p for p in _params() if p.values[1] != "i8"])
@pytest.mark.parametrize("shape", [(1, 37, 8), (7, 64, 6), (13, 70, 5)])
def test_interleaved_activation_epilogue(isa, dtype, features, shape):
    """Transcendental epilogues interleave up to 4 vectors of a row (one opmask each): rows of one
    and of several tiles, full vectors and a tail, f32 and bf16 C, with and without bias."""
    m, n, k = shape
    rng = np.random.default_rng(m * 100 + n)
    for i, act in enumerate(("gelu_erf", "tanh", "gelu_erf_fast")):
        c_dtype = ("f32", "bf16")[i % 2] if dtype == "bf16" else ""
        desc = Brgemm(m=m, n=n, k=k, dtype=dtype, c_dtype=c_dtype, ldc=n + 2, bias=i == 0, act=act)
        args, a_blocks, b_blocks, c, pad, bias = _case(desc, 2, rng, 0)
        _run(desc, isa, features, args, 2)
        _check(desc, c, pad, a_blocks, b_blocks, c.copy(), bias)


def test_gelu_erf_fast_tables_in_registers_for_large_tiles():
    """An AVX-512 tile reads gelu_erf_fast's coefficient tables from registers loaded once per
    tile (vpermps of registers only); AVX2's 16 registers leave too few for two chains beside
    the tables, so its tiles read them from the stack."""
    def permutes(m, n, isa):
        text = generate_brgemm(Brgemm(m=m, n=n, k=8, bias=True, act="gelu_erf_fast"), isa).disassemble()
        return [line for line in text.splitlines() if "vpermps" in line]
    big = permutes(32, 64, "avx512")
    assert big and all("[" not in line for line in big), big[:3]
    for m, n in ((1, 1), (32, 64)):
        assert all("[" not in line for line in permutes(m, n, "avx512"))
        small = permutes(m, n, "avx2")
        assert small and all("[" in line for line in small), small[:3]


def test_inner_product_dispatch():
    code = {}
    for dtype, feats in (("bf16", {"avx512_bf16"}), ("bf16", set()), ("i8", {"avx512_vnni"}), ("i8", set())):
        desc = Brgemm(m=4, n=16, k=4, dtype=dtype)
        code[dtype, bool(feats)] = generate_brgemm(desc, "avx512", feats).disassemble()
    assert "vdpbf16ps" in code["bf16", True] and "vdpbf16ps" not in code["bf16", False]
    assert "vpdpbusd" in code["i8", True] and "vpmaddwd" in code["i8", False]
    assert "vpdpbusd" not in generate_brgemm(Brgemm(m=4, n=16, k=4, dtype="i8"), "avx2", set()).disassemble()
    assert isinstance(target_features("avx2"), frozenset)


@pytest.mark.parametrize("isa, dtype, features", [p for p in _params() if p.values[1] == "bf16"])
def test_bf16_output_rounds_to_nearest_even_and_keeps_nan(isa, dtype, features):
    # 1 + 2**-8 is a tie between bf16 1.0 and 1.0078125: even -> 1.0; 1 + 3*2**-8 -> 1.015625
    a = np.array([[[1.0, 0.0]], [[0.0, 0.0]]], np.float32).astype(np_dtype("bf16"))
    b = tppasm.vnni_pack(np.array([[[1.0, 1.0, np.inf]], [[0.0, 0.0, 0.0]]], np.float32).repeat(2, 1)
                         .astype(np_dtype("bf16")), 2)
    desc = Brgemm(m=1, n=3, k=2, dtype="bf16", c_dtype="bf16", beta=1, bias=True)
    c = np.zeros((1, 3), np_dtype("bf16"))
    bias = np.array([2.0 ** -8, 3 * 2.0 ** -8, np.nan], np.float32)
    _run(desc, isa, features, [a, b, c, bias], 1)
    assert c[0, 0] == 1.0 and c[0, 1] == np.float32(1.015625) and np.isnan(c[0, 2].astype(np.float32))


def test_public_api_and_cache():
    g = tppasm.brgemm(m=3, n=5, k=2)
    assert g is tppasm.brgemm(m=3, n=5, k=2)
    assert "vfmadd231ps" in g.disassemble()
    a = np.ones((2, 3, 2), np.float32)
    b = np.ones((2, 2, 5), np.float32)
    c = np.empty((3, 5), np.float32)
    g(a, b, c, count=1)
    assert (c == 2).all()
    g(a, b, c)                                  # count inferred: a and b hold 2 blocks
    assert (c == 4).all()
    c2 = c.copy()
    g.reference(a, b, c2, count=2)
    assert (c2 == c).all()


def test_next_chunk_prefetch_only_for_large_strided_blocks(monkeypatch):
    """Blocks of 16 KiB and more in a strided batch prefetch the next chunk into L2 (where the far
    prefetch is on: tests/test_far_prefetch.py); small blocks (L1-resident) and pointer batches (no
    known distance) do not."""
    monkeypatch.setenv("TPPASM_FAR_PREFETCH", "1")
    def far(**kw):
        return "prefetcht1" in generate_brgemm(Brgemm(**kw), "avx512").disassemble()
    assert far(m=64, n=64, k=64, stride_a=4096, stride_b=4096)
    assert far(m=64, n=64, k=64, dtype="bf16", stride_a=4096, stride_b=4096)
    assert not far(m=32, n=32, k=32, stride_a=1024, stride_b=1024)
    assert not far(m=64, n=64, k=64, batch="address")


def test_few_row_kernels_stream_b_without_software_prefetch(monkeypatch):
    """Up to STREAM_ROWS rows (a GEMV: each B line read once) the kernel leaves B to the hardware
    prefetcher; from the next row count on, it prefetches B lines into L1 and (with the far prefetch
    on) the next chunk into L2."""
    from tppasm.x86.prefetch import STREAM_ROWS
    monkeypatch.setenv("TPPASM_FAR_PREFETCH", "1")

    def prefetches(m, dtype):
        text = generate_brgemm(Brgemm(m=m, n=64, k=2048, dtype=dtype), "avx512").disassemble()
        return text.count("prefetcht0"), text.count("prefetcht1")
    for dtype in ("f32", "bf16", "i8"):
        assert prefetches(STREAM_ROWS, dtype) == (0, 0)
        near, far = prefetches(STREAM_ROWS + 1, dtype)
        assert near > 0 and far > 0, (dtype, near, far)


@pytest.mark.parametrize("isa", isa_params())
@settings(max_examples=20, deadline=None)
@given(m=st.integers(1, 20), n=st.integers(1, 40), k=st.integers(1, 24), count=st.integers(1, 3),
       act=st.sampled_from([None, "relu", "gelu", "gelu_erf", "gelu_erf_fast", "sigmoid", "tanh"]), bias=st.booleans(),
       dtype=st.sampled_from(["f32", "bf16"]), seed=st.integers(0, 2 ** 16))
def test_non_finite_operands_follow_the_reference(isa, m, n, k, count, act, bias, dtype, seed):
    """NaN and infinities in A: C holds NaN / inf exactly where the reference's does, through the
    bias and every activation (relu keeps a NaN; GELU at -inf is -0)."""
    desc = Brgemm(m=m, n=n, k=k, dtype=dtype, c_dtype="f32", bias=bias, act=act, stride_a=m * k, stride_b=k * n)
    rng = np.random.default_rng(seed)
    args, a_blocks, b_blocks, c, _, bias_row = _case(desc, count, rng, 0)
    sprinkle(rng, args[0], 0.05)
    want = np.zeros_like(c)
    with np.errstate(all="ignore"):
        desc.reference(args[0], args[1], want, *([bias_row] if bias else []), count=count)
    _run(desc, isa, (None, "native"), args, count)
    assert_same_non_finite(c, want, f"{desc}")


def test_fused_activations_are_emitted():
    for act, name in (("gelu", "vfmadd"), ("gelu_erf", "vdivps"), ("gelu_erf_fast", "vpermps"), ("sigmoid", "vdivps"),
                      ("tanh", "vfmadd")):
        assert name in generate_brgemm(Brgemm(m=2, n=9, k=2, act=act, bias=True), "avx2").disassemble()


# -- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, words", [
    (dict(m=0, n=4, k=4), "m=0"), (dict(m=4, n=4, k=4, dtype="f16"), "dtype"),
    (dict(m=4, n=4, k=4, lda=-1), "lda=-1"), (dict(m=4, n=4, k=4, ldc=2), "ldc=2"),
    (dict(m=4, n=4, k=4, beta=2), "beta"), (dict(m=4, n=4, k=4, beta=0.5), "beta"),
    (dict(m=4, n=4, k=4, batch="list"), "batch"), (dict(m=4, n=4, k=4, act="swish"), "act"),
    (dict(m=4, n=4, k=4, c_dtype="bf16"), "c_dtype"), (dict(m=4, n=4, k=4, dtype="i8", bias=True), "bias"),
    (dict(m=4, n=4, k=4, stride_a=-1), "stride_a"), (dict(m=4, n=4, k=4, pace=-1), "pace=-1"),
    (dict(m=4, n=4, k=4, pace=65), "pace=65"), (dict(m=4, n=4, k=4, pace=2.0), "pace=2.0"),
    (dict(m=4, n=4, k=4, pace=True), "pace=True"),
    (dict(m=4, n=10**30, k=4), "n=1000"), (dict(m=4, n=4, k=4, ldb=2**64), "ldb"),
    (dict(m=4, n=4, k=4, batch="offset", stride_a=1000), "left out with batch='offset'"),
    (dict(m=4, n=4, k=4, batch="address", stride_b=7), "found by addresses"),
])
def test_bad_descriptor(kwargs, words):
    with pytest.raises(ValueError, match=words):
        tppasm.brgemm(**kwargs)


def test_bad_operands():
    g = tppasm.brgemm(m=4, n=8, k=4)
    a, b, c = np.ones((2, 4, 4), np.float32), np.ones((2, 4, 8), np.float32), np.empty((4, 8), np.float32)
    with pytest.raises(OperandError, match="shape"):
        g(a[:, :3], b, c)
    with pytest.raises(OperandError, match="float32"):
        g(a.astype(np.float64), b, c)
    with pytest.raises(OperandError, match="strides"):
        g(np.ones((2, 4, 8), np.float32)[:, :, ::2], b, c)
    with pytest.raises(OperandError, match=r"expected \(16, 4, 1\)"):
        g(np.ones((2, 4, 6), np.float32)[:, :, :4], b, c)
    wide = np.ones((2, 4, 6), np.float32)[:, :, :4]
    tppasm.brgemm(m=4, n=8, k=4, lda=6, stride_a=24)(wide, b, c)  # the kernel for that layout
    assert (c == 8).all()
    with pytest.raises(OperandError, match="count=3"):
        g(a, b, c, count=3)
    with pytest.raises(OperandError, match="read-only"):
        c.flags.writeable = False
        g(a, b, c)


def test_bad_offsets_and_addresses():
    g = tppasm.brgemm(m=2, n=8, k=4, batch="offset")
    a, b, c = np.ones(8 + 5, np.float32), np.ones(32, np.float32), np.empty((2, 8), np.float32)
    g(a, b, c, np.array([[5, 0]], np.int64))
    assert (c == 4).all()
    for offs, words in (([[6, 0]], "offset 6 for operand a.*0..5"), ([[0, 1]], "offset 1 for operand b"),
                        ([[-1, 0]], "offset -1")):
        with pytest.raises(OperandError, match=words):
            g(a, b, c, np.array(offs, np.int64))
    with pytest.raises(OperandError, match="count=2"):
        g(a, b, c, np.zeros((1, 2), np.int64), count=2)
    with pytest.raises(OperandError, match="int64"):
        g(a, b, c, np.zeros((1, 2), np.int32))
    for missing in ((), (None,)):                    # the offsets left out: say where they go
        with pytest.raises(OperandError, match=r"batch='offset' takes the block offsets after C: gemm\(A, B, C, offsets"):
            g(a, b, c, *missing)
    with pytest.raises(OperandError, match="C-contiguous"):
        g(np.ones(26, np.float32)[::2], b, c, np.zeros((1, 2), np.int64))
    h = tppasm.brgemm(m=2, n=8, k=4, batch="address")
    blocks_a, blocks_b = [np.ones((2, 4), np.float32)] * 2, [np.ones((4, 8), np.float32)] * 2
    h(blocks_a, blocks_b, c, count=2)
    assert (c == 8).all()
    with pytest.raises(OperandError, match="holds 2 blocks; count=3 needs at least 3"):
        h(blocks_a, blocks_b, c, count=3)
    with pytest.raises(OperandError, match="shape"):
        h([np.ones((2, 5), np.float32)], blocks_b, c, count=1)
