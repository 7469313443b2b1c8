"""AMX BRGEMM (bf16, int8) against the NumPy reference, without AMX hardware.

Every kernel is generated for "amx", decoded back by iced-x86 and executed by the interpreter
(isa.x86.interp, AMX semantics in isa/x86/interp/amx.py), natively where the host has AMX. Operands live
in poisoned buffers that end at their last element, so any read or write outside them faults
(MemoryFault) or shows up as NaN / a changed pad. Also: the emitted tile configs are valid
palette-1 configs, the no-setup variant runs under the loop nest's tileconfig()/tilerelease(),
and no tile load repeats within a batch step."""
import iced_x86
import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bench.amx_static import repeated_loads, run_case
from isa.cpu import host
from isa.x86.interp import SEMANTICS, InvalidOpcode, Machine
from tppasm.brgemm import Brgemm
from tppasm.tiles import tileconfig, tilerelease
from tppasm.kernel import Kernel, _generate
from tppasm.layout import vnni_pack
from tppasm.x86.amx import generate, plan
from tppasm.x86.amx_chunk import chunk_blocks

BF16 = ml_dtypes.bfloat16
NATIVE = "amx" in host().levels
ENV = "native AMX" if NATIVE else f"interpreter (host {host().best_isa}: no AMX)"
C_NP = {"f32": np.float32, "bf16": BF16, "i32": np.int32}
POISON = {"f32": np.float32(np.nan), "bf16": BF16(np.nan), "i32": np.int32(-0x5A5A5A5B)}


def test_where_it_runs():
    if not NATIVE:
        pytest.skip("native AMX run: host has no AMX tiles (amx_tile, amx_bf16); the same tests "
                    "run in the interpreter here")


class Env:
    """Addresses and calls: the interpreter's flat memory, or the real one on an AMX host."""

    def __init__(self):
        self.m = None if NATIVE else Machine()
        self.roots = []

    def ptr(self, arr):
        if self.m is None:
            return arr.ctypes.data
        root = arr
        while isinstance(root.base, np.ndarray):
            root = root.base
        off = arr.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        for r, addr in self.roots:
            if r is root:
                return addr + off
        addr = self.m.map(root)
        self.roots.append((root, addr))
        return addr + off

    def call(self, fn, args=()):
        if self.m is None:
            fn(*args)
        else:
            self.m.call(getattr(fn, "raw", fn).code, args=list(args))   # a Kernel or a JitFunction

    def sync(self):
        for root, addr in self.roots:
            if root.flags.writeable:
                root[...] = self.m.read(addr, like=root)


def _values(rng, shape, dtype):
    if dtype == "u8":
        return rng.integers(0, 256, shape).astype(np.uint8)
    if dtype == "s8":
        return rng.integers(-128, 128, shape).astype(np.int8)
    return rng.standard_normal(shape).astype(BF16)


def _padded(rng, shape, ld, dtype):
    """Blocks of ``shape`` (count, rows, cols, *inner) with rows ld apart; the pads hold a poison
    the result would show (NaN; 77 for int8)."""
    count, rows, cols, *inner = shape
    buf = _values(rng, (count, rows, ld, *inner), dtype)
    buf[:, :, cols:] = np.nan if dtype == "bf16" else 77
    return buf[:, :, :cols]


def _operands(rng, d, count):
    """(kernel pointers builder, reference arguments, C, C's full buffer)."""
    a_dt, b_dt = ("bf16", "bf16") if d.dtype == "bf16" else ({"u": "u8", "s": "s8"}[c] for c in d.signs)
    f = d.vnni
    spare = 2
    a = _padded(rng, (count + spare, d.m, d.k), d.lda, a_dt)
    b = _padded(rng, (count + spare, d.groups, d.n, f), d.ldb, b_dt)          # VNNI groups
    if d.k % f:                     # the last group's padding entries: the kernel must ignore them
        b[:, -1, :, d.k % f:] = np.nan if b_dt == "bf16" else 77
    cbuf = np.full((d.m, d.ldc), POISON[d.c_dtype], C_NP[d.c_dtype])
    c = cbuf[:, :d.n]
    if d.beta:
        c[...] = (rng.standard_normal(c.shape) * 3).astype(C_NP[d.c_dtype]) if d.c_dtype != "i32" \
            else rng.integers(-1000, 1000, c.shape)
    return a, b, c, cbuf


def _run(d, count, seed, setup=None, chunk=None):
    """Run the kernel for ``d`` (``chunk``: see ``generate``) on random operands; returns
    (C, reference C, C buffer, env, blocks)."""
    rng = np.random.default_rng(seed)
    a, b, c, cbuf = _operands(rng, d, count)
    bias = rng.standard_normal(d.n).astype(np.float32) if d.bias else None
    env = Env()
    fn = generate(d, chunk)
    order = rng.permutation(count + 2)[:count]            # offset / address: shuffled blocks
    if d.batch == "stride":
        a_blk, b_blk = list(a[:count]), list(b[:count])
        ptrs = [env.ptr(a), env.ptr(b), env.ptr(c)]
    elif d.batch == "offset":
        a_blk, b_blk = [a[i] for i in order], [b[i] for i in order]
        pa, pb = env.ptr(a), env.ptr(b)
        es = a.itemsize
        offs = np.array([[(env.ptr(x) - pa) // es, (env.ptr(y) - pb) // es]
                         for x, y in zip(a_blk, b_blk)], np.int64)
        ptrs = [pa, pb, env.ptr(c), env.ptr(offs)]
    else:
        a_blk, b_blk = [a[i] for i in order], [b[i] for i in order]
        ap = np.array([env.ptr(x) for x in a_blk], np.int64)
        bp = np.array([env.ptr(y) for y in b_blk], np.int64)
        ptrs = [env.ptr(ap), env.ptr(bp), env.ptr(c)]
    if d.bias:
        ptrs.append(env.ptr(bias))
    ref = d.compute(a_blk, b_blk, c.copy(), bias)
    if setup:
        env.call(setup[0])
    env.call(fn, ptrs + [count])
    if setup:
        env.call(setup[1])
    if env.m is not None:
        env.sync()
    return c, ref, cbuf, env, (a_blk, b_blk, a, b)


def _check(d, c, ref, cbuf, a_blk, b_blk, count):
    pad = cbuf[:, d.n:]
    if d.c_dtype == "i32":
        np.testing.assert_array_equal(c, ref)
        assert (pad == POISON["i32"]).all()
        return
    assert np.isnan(pad.astype(np.float32)).all(), "the kernel wrote C's padding"
    wide = [np.abs(x.astype(np.float64)) for x in a_blk]
    bb = [np.abs(np.swapaxes(y.astype(np.float64), -1, -2).reshape(-1, d.n)[:d.k]) for y in b_blk]
    bound = sum(x @ y for x, y in zip(wide, bb))
    if d.beta:
        bound = bound + np.abs(ref.astype(np.float64))
    tol = 2.0 ** -23 * (d.k * count + 8) * (bound + 1.0)
    if d.act is not None:
        tol = 1.25 * tol + 2.0 ** -20 * np.abs(ref.astype(np.float64))
    if d.c_dtype == "bf16":
        tol = tol + 2.0 ** -7 * np.abs(ref.astype(np.float64))
    got, want = c.astype(np.float64), ref.astype(np.float64)
    assert not np.isnan(got).any(), "NaN in C: a poisoned pad was read or an element not written"
    bad = np.abs(got - want) > tol
    assert not bad.any(), f"{bad.sum()} elements off, worst {np.abs(got - want).max()}"


shapes = dict(m=st.integers(1, 40), n=st.integers(1, 40), count=st.integers(1, 3),
              batch=st.sampled_from(["stride", "offset", "address"]), beta=st.sampled_from([0, 1]),
              pads=st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(0, 5)),
              setup=st.booleans())


@settings(max_examples=80)
@given(groups=st.integers(1, 32), c_dtype=st.sampled_from(["f32", "bf16"]), bias=st.booleans(),
       act=st.sampled_from([None, "relu", "relu", "gelu", "gelu_erf", "gelu_erf_fast", "sigmoid", "tanh"]),
       ktail=st.integers(0, 1), **shapes)
@example(groups=24, c_dtype="bf16", bias=True, act="gelu_erf_fast", ktail=0, m=33, n=40, count=2, batch="stride",
         beta=0, pads=(0, 0, 0), setup=True)                       # its tables in the constants' registers
@example(groups=17, c_dtype="f32", bias=False, act=None, ktail=0, m=40, n=40, count=2, batch="stride",
         beta=1, pads=(0, 0, 0), setup=True)                       # k tail step, all region kinds
@example(groups=27, c_dtype="bf16", bias=True, act="relu", ktail=0, m=33, n=17, count=3, batch="offset",
         beta=1, pads=(3, 1, 2), setup=False)
@example(groups=90, c_dtype="bf16", bias=True, act="relu", ktail=1, m=80, n=70, count=2, batch="offset",
         beta=1, pads=(1, 1, 1), setup=False)                      # k loop, row / column loops, odd k
@example(groups=83, c_dtype="f32", bias=False, act=None, ktail=0, m=64, n=64, count=2, batch="stride",
         beta=0, pads=(0, 0, 0), setup=True)                       # k loop + tail, direct stores
@example(groups=32, c_dtype="f32", bias=False, act=None, ktail=1, m=32, n=32, count=3, batch="address",
         beta=0, pads=(0, 0, 0), setup=True)                       # k = 63: padded inside, A ends at k
@example(groups=1, c_dtype="f32", bias=False, act=None, ktail=1, m=5, n=3, count=2, batch="stride",
         beta=1, pads=(0, 0, 0), setup=True)                       # k = 1
@example(groups=83, c_dtype="bf16", bias=False, act="relu", ktail=1, m=20, n=36, count=2, batch="address",
         beta=1, pads=(1, 0, 2), setup=True)                       # k loop + a padded tail step
def test_bf16(m, n, groups, ktail, count, batch, beta, c_dtype, bias, act, pads, setup):
    k = 2 * groups - ktail
    d = Brgemm(m=m, n=n, k=k, lda=k + pads[0], ldb=n + pads[1], ldc=n + pads[2],
               beta=beta, dtype="bf16", c_dtype=c_dtype, batch=batch, bias=bias, act=act,
               tile_setup=setup)
    d.validate()
    hooks = None if setup else (tileconfig(d), tilerelease())
    c, ref, cbuf, env, (a_blk, b_blk, *_) = _run(d, count, seed=m * 1000 + n * 10 + groups, setup=hooks)
    _check(d, c, ref, cbuf, a_blk, b_blk, count)
    if env.m is not None:       # a kernel leaves its last config loaded; a nest's fini releases
        assert env.m.tilecfg == (_cfg_tuple(plan(d).regions()[-1][2]) if setup else None)


@settings(max_examples=50)
@given(groups=st.integers(1, 16), act=st.sampled_from([None, "relu"]), ktail=st.integers(0, 3), **shapes)
@example(groups=83, act="relu", ktail=0, m=72, n=80, count=2, batch="address", beta=1, pads=(2, 0, 1), setup=False)
@example(groups=35, act=None, ktail=3, m=40, n=24, count=2, batch="address", beta=1, pads=(1, 2, 3), setup=True)
@example(groups=17, act="relu", ktail=1, m=9, n=40, count=2, batch="stride", beta=0, pads=(0, 0, 0), setup=False)
@example(groups=32, act=None, ktail=2, m=32, n=32, count=2, batch="offset", beta=0, pads=(0, 0, 0), setup=True)
@example(groups=83, act=None, ktail=2, m=17, n=48, count=3, batch="stride", beta=1, pads=(0, 1, 0), setup=True)
def test_int8(m, n, groups, ktail, count, batch, beta, act, pads, setup):
    k = 4 * groups - ktail
    d = Brgemm(m=m, n=n, k=k, lda=k + pads[0], ldb=n + pads[1], ldc=n + pads[2],
               beta=beta, dtype="i8", batch=batch, act=act, tile_setup=setup)
    d.validate()
    hooks = None if setup else (tileconfig(d), tilerelease())
    c, ref, cbuf, env, (a_blk, b_blk, *_) = _run(d, count, seed=m * 1000 + n * 10 + groups, setup=hooks)
    _check(d, c, ref, cbuf, a_blk, b_blk, count)


CONFIG_SHAPES = [(m, n, k, dt) for m in (1, 15, 16, 17, 32, 33, 40, 48, 64, 100)
                 for n in (1, 16, 20, 33, 64) for k, dt in ((2, "bf16"), (34, "bf16"), (64, "bf16"),
                                                              (70, "bf16"), (128, "i8"), (68, "i8"))]


@pytest.mark.parametrize("m,n,k,dt", CONFIG_SHAPES[::7] + [(40, 40, 34, "bf16"), (33, 33, 68, "i8")])
def test_tile_configs_are_valid_and_cover_the_kernel(m, n, k, dt):
    d = Brgemm(m=m, n=n, k=k, dtype=dt)
    p = plan(d)
    assert p.ntiles <= 8
    for rspan, cspan, cfg in p.regions():
        assert len(cfg) == 64 and cfg[0] == 1 and not any(cfg[1:16])
        colsb = [int.from_bytes(cfg[16 + 2 * t:18 + 2 * t], "little") for t in range(16)]
        rows = list(cfg[48:64])
        assert not any(colsb[8:]) and not any(rows[8:])
        for t in range(8):
            assert rows[t] <= 16 and colsb[t] <= 64 and colsb[t] % 4 == 0
            assert (rows[t] == 0) == (colsb[t] == 0)
        assert sum(map(bool, rows)) == p.ntiles
    covered = sum(sum(r.sizes) * r.count for r in p.rows), sum(sum(c.sizes) * c.count for c in p.cols)
    assert covered == (m, n)
    assert (p.steps * p.step + p.tail) * d.vnni == k


@pytest.mark.parametrize("dt,extra", [("bf16", dict(c_dtype="bf16", beta=1, bias=True, act="gelu")),
                                      ("i8", dict(beta=1, batch="offset", act="relu"))])
def test_every_instruction_decodes_and_is_modelled(dt, extra):
    d = Brgemm(m=40, n=33, k=136, dtype=dt, **extra)
    code = generate(d).code
    dec = iced_x86.Decoder(64, code)
    names = set()
    for ins in dec:
        assert not ins.is_invalid
        assert ins.mnemonic in SEMANTICS, f"unmodelled {ins}"
        names.add(ins.mnemonic)
    assert iced_x86.Mnemonic.LDTILECFG in names and iced_x86.Mnemonic.STTILECFG in names
    assert iced_x86.Mnemonic.TILERELEASE not in names


def test_no_setup_kernel_needs_the_nest_config():
    d = Brgemm(m=40, n=20, k=64, dtype="bf16", tile_setup=False)      # two regions: switches inside
    text = generate(d).disassemble()
    assert "tilerelease" not in text
    if NATIVE:
        pytest.skip("the unconfigured call would SIGILL natively")
    with pytest.raises(InvalidOpcode):
        _run(d, 2, seed=1)
    _, _, _, env, _ = _run(d, 2, seed=1, setup=(tileconfig(d), Noop()))
    assert env.m.tilecfg is not None and env.m.tilecfg == _cfg_tuple(plan(d).regions()[0][2])
    single = Brgemm(m=32, n=32, k=32, dtype="i8", tile_setup=False)
    assert "ldtilecfg" not in generate(single).disassemble()


def test_a_kernel_configures_only_when_another_config_is_loaded():
    if NATIVE:
        pytest.skip("counts executed instructions: interpreter only")
    one, other = Brgemm(m=32, n=32, k=64, dtype="bf16"), Brgemm(m=16, n=16, k=64, dtype="i8")
    two_regions = Brgemm(m=40, n=20, k=64, dtype="bf16")
    env = Env()
    calls = []
    for d in (one, one, other, one, two_regions, two_regions):
        rng = np.random.default_rng(0)
        a, b, c, _ = _operands(rng, d, 1)
        env.m.stats.reset()
        env.call(generate(d), [env.ptr(a), env.ptr(b), env.ptr(c), 1])
        calls.append(env.m.stats.counts["ldtilecfg"])
        assert env.m.stats.counts["sttilecfg"] == 1 and env.m.stats.counts["tilerelease"] == 0
    # the first call configures, the second finds its config; another kernel's config forces a
    # load; a kernel of two regions switches inside and leaves its second loaded
    assert calls == [1, 0, 1, 1, 2, 2]


class Noop:
    code = bytes.fromhex("c3")


def _cfg_tuple(cfg):
    return (list(cfg[48:56]), [int.from_bytes(cfg[16 + 2 * t:18 + 2 * t], "little") for t in range(8)])


@pytest.mark.parametrize("case,chunk", [((64, 64, 64, 4, "bf16", 0, "f32"), 0), ((64, 64, 64, 5, "bf16", 0, "f32"), None),
                                        ((40, 24, 70, 3, "bf16", 1, "bf16"), None),
                                        ((17, 33, 136, 3, "i8", 1, "i32"), None)])
def test_tile_loads_not_repeated_within_a_batch_step(case, chunk):
    """Each macro block loads each A / B tile of a batch block once (in batch chunks the next
    macro block loads the same panel again, from L1: not counted as a repeat there)."""
    m, n, k, count, dt, beta, c_dtype = case
    d = Brgemm(m=m, n=n, k=k, dtype=dt)
    p = plan(d)
    stats, blocks, _ = run_case(*case, chunk=chunk)
    if not (chunk_blocks(d, p) if chunk is None else chunk):
        assert repeated_loads(stats.tile_ops, blocks) == []
    mr = sum(r.count for r in p.rows)
    mc = sum(c.count for c in p.cols)
    per_step = (p.steps + (1 if p.tail else 0))
    a_loads = sum(len(r.sizes) * r.count for r in p.rows) * mc * per_step * count
    b_loads = sum(len(c.sizes) * c.count for c in p.cols) * mr * per_step * count
    ab = sum(1 for _, _, addr in stats.tile_loads if any(s <= addr < s + z * c for s, z, c in blocks.values()))
    assert ab == a_loads + b_loads


def test_dispatch():
    bf = Brgemm(m=16, n=16, k=32, dtype="bf16")
    assert "tdpbf16ps" in _generate(bf, "amx").disassemble()
    assert "tdpbusd" in Kernel(Brgemm(m=16, n=16, k=64, dtype="i8"), "amx").disassemble()
    f32 = _generate(Brgemm(m=16, n=16, k=16), "amx").disassemble()
    assert "tdp" not in f32 and "zmm" in f32
    assert "tdp" not in _generate(bf, "avx512").disassemble()
    with pytest.raises(ValueError, match="tile_setup"):
        Brgemm(m=1, n=1, k=2, dtype="bf16", tile_setup=2).validate()


def test_conv_rows_table_models_the_conv_nests_brgemms():
    """``amx-static --conv``: one row per (layer, bk, rows) of ``bench.conv.row_spans``, the BRGEMM m
    of ``bench.conv_nest`` (rows through the padded width) and modelled percentages in (0, 100]."""
    from bench.amx_static import conv_rows
    from bench.conv import layer
    from bench.conv_nest import Blocking, ConvNest
    rep = conv_rows(layers=("res5b_branch2b",), bk=(32,))
    assert [(r["rows"], r["BRGEMM m"], r["useful rows"]) for r in rep.rows] == [(1, 7, 7), (7, 61, 49)]
    nest = ConvNest(layer("res5b_branch2b", 1), "bf16", Blocking(bc=64, bk=32, rows=7))
    assert nest.m == 61
    assert all(0 < r[k] <= 100 for r in rep.rows for k in ("% in-order", "% ooo", "% renamed"))
    strided = conv_rows(layers=("res5a_branch1",), bk=(64,), count=2)        # gathered pixels: no waste
    assert [(r["rows"], r["BRGEMM m"], r["useful rows"]) for r in strided.rows] == [(1, 7, 7), (7, 49, 49)]
    assert strided.rows[1]["% renamed"] > strided.rows[0]["% renamed"]


def test_lines_crowding_an_l1_set_are_not_prefetched():
    """A's rows 4 KiB apart (lda 2048 in bf16) put a tile's rows in one 12-way L1 set: the kernel
    prefetches B's lines only; with the rows padded to 4160 bytes, A's too, as ``prefetch="all"``
    does at 4 KiB (tests/test_amx_variants.py checks they compute the BRGEMM)."""
    from tppasm.x86.amx_pipe import crowded
    count = {lda: generate(Brgemm(m=64, n=64, k=2048, lda=lda, dtype="bf16")).disassemble().count("prefetcht0")
             for lda in (2048, 2080)}
    assert 0 < count[2048] < count[2080]
    every = generate(Brgemm(m=64, n=64, k=2048, lda=2048, dtype="bf16"), prefetch="all")   # amx-variants' old kernel
    assert every.disassemble().count("prefetcht0") == count[2080]
    assert crowded([r * 2048 for r in range(32)]) and not crowded([r * 1024 for r in range(32)])


def test_crowding_rows_model_the_prefill_projection_both_ways():
    """``amx-static --crowding``: rows 4 KiB apart get B's prefetches only, padded rows both; each
    kernel gets a modelled percentage with either L1 in (0, 100]."""
    from bench.amx_static import crowding_rows
    rows = crowding_rows(k=128).rows
    assert [(r["lda"], r["kernel"]) for r in rows] == [(2048, "as generated"), (2048, "no prefetch"),
                                                       (2080, "as generated"), (2080, "no prefetch")]
    assert 0 < rows[0]["prefetches"] < rows[2]["prefetches"] and rows[1]["prefetches"] == 0
    for r in rows:
        for cell in (r["fully associative L1"], r["12-way L1"]):
            assert all(0 < float(x) <= 100 for x in cell.split(" / "))


@pytest.mark.parametrize("m, n, streamed",
                         [(128, 32, "a"), (32, 128, "b"), (64, 64, "a"), (64, 96, "b"), (32, 32, None)])
def test_the_operand_no_later_macro_block_reads_is_loaded_with_the_t1_hint(m, n, streamed):
    """Macro blocks run row by row: with at least as many macro rows as columns B's panels are
    read again and A's tiles are loaded with ``tileloaddt1`` (not kept in L1), else the other way
    round; one macro block hints nothing, nor do chunks or ``stream=False``. The hint changes no
    result (the interpreter runs it as ``tileloadd``; the hypothesis tests compare with NumPy)."""
    stats, blocks, _ = run_case(m, n, 64, 2, "bf16", 0, "f32", chunk=0)
    kinds = {}
    for name, _, _, addr, *_ in stats.tile_ops:
        for operand, (start, size, count) in blocks.items():
            if name.startswith("tileload") and start <= addr < start + size * count:
                kinds.setdefault(operand, set()).add(name)
    want = {op: {"tileloaddt1" if op == streamed else "tileloadd"} for op in "ab"}
    assert kinds == want
    d = Brgemm(m=m, n=n, k=64, dtype="bf16")
    assert "tileloaddt1" not in generate(d, stream=False).disassemble()
    assert "tileloaddt1" not in generate(d, chunk=1).disassemble()
