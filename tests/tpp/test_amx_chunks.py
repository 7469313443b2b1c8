"""AMX BRGEMM in batch chunks (tppasm.x86.amx_chunk) against the NumPy reference, in the interpreter.

Chunks are forced small (``generate(desc, chunk)``) so that small shapes run several of them: counts
below, at and above a chunk, a partial last chunk; C in C (fp32 / int32, no epilogue: beta honoured
by the first chunk only) or in the stack scratch (bf16 C, bias, activations); k tails; leading
dimensions; every batch kind; int8 signs. C is poisoned (NaN) where beta=0, and its padding must
stay untouched (``_check``)."""
import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tppasm.brgemm import Brgemm
from tppasm.tiles import tileconfig, tilerelease
from tppasm.x86.amx import chunks_on, generate, plan
from tppasm.x86.amx_chunk import chunk_blocks, visits

from tests.support import native
from tests.tpp.test_amx import _cfg_tuple, _check, _run

common = dict(m=st.integers(17, 64), n=st.integers(1, 64), chunk=st.integers(1, 3), count=st.integers(1, 7),
              batch=st.sampled_from(["stride", "offset", "address"]), beta=st.sampled_from([0, 1]),
              pads=st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)), setup=st.booleans())


def _go(d, chunk, count, setup):
    d.validate()
    hooks = None if setup else (tileconfig(d), tilerelease())
    c, ref, cbuf, env, (a_blk, b_blk, *_) = _run(d, count, seed=d.m * 1000 + d.n * 10 + count, setup=hooks,
                                                  chunk=chunk)
    _check(d, c, ref, cbuf, a_blk, b_blk, count)
    if env.m is not None and setup:     # the last macro block's config stays loaded
        assert env.m.tilecfg == _cfg_tuple(visits(plan(d))[-1].cfg)


@settings(max_examples=30, deadline=None)
@given(groups=st.integers(1, 20), ktail=st.integers(0, 1), c_dtype=st.sampled_from(["f32", "bf16"]),
       bias=st.booleans(), act=st.sampled_from([None, None, "relu", "gelu"]), **common)
@example(groups=32, ktail=0, c_dtype="f32", bias=False, act=None, m=64, n=64, chunk=2, count=5, batch="stride",
         beta=0, pads=(0, 0, 0), setup=True)                 # the bench shape: C in C, a partial last chunk
@example(groups=16, ktail=1, c_dtype="bf16", bias=True, act="relu", m=48, n=40, chunk=2, count=4,
         batch="offset", beta=1, pads=(1, 2, 3), setup=False)   # scratch, odd k, tails: several configs
@example(groups=9, ktail=0, c_dtype="f32", bias=False, act="gelu", m=64, n=33, chunk=3, count=2,
         batch="address", beta=0, pads=(0, 1, 0), setup=True)   # count below a chunk
@example(groups=8, ktail=0, c_dtype="bf16", bias=True, act=None, m=64, n=64, chunk=1, count=4,
         batch="stride", beta=1, pads=(0, 0, 0), setup=True)     # partial sums piped through the scratch
@example(groups=8, ktail=1, c_dtype="f32", bias=True, act="relu", m=64, n=50, chunk=1, count=3,
         batch="stride", beta=1, pads=(1, 1, 1), setup=True)     # the first chunk pipes C's loads
@example(groups=83, ktail=1, c_dtype="f32", bias=False, act=None, m=64, n=40, chunk=1, count=3,
         batch="offset", beta=0, pads=(0, 0, 0), setup=True)     # the runtime k loop, a tail step, odd k
def test_bf16_chunks(m, n, groups, ktail, chunk, count, batch, beta, c_dtype, bias, act, pads, setup):
    k = 2 * groups - ktail
    _go(Brgemm(m=m, n=n, k=k, lda=k + pads[0], ldb=n + pads[1], ldc=n + pads[2], beta=beta, dtype="bf16",
               c_dtype=c_dtype, batch=batch, bias=bias, act=act, tile_setup=setup), chunk, count, setup)


@settings(max_examples=20, deadline=None)
@given(groups=st.integers(1, 20), ktail=st.integers(0, 3), act=st.sampled_from([None, "relu"]),
       signs=st.sampled_from(["us", "ss", "su", "uu"]), **common)
@example(groups=32, ktail=2, act=None, signs="ss", m=64, n=64, chunk=1, count=3, batch="stride", beta=0,
         pads=(0, 0, 0), setup=True)                         # k = 126, C in C over three chunks
@example(groups=5, ktail=1, act="relu", signs="su", m=40, n=64, chunk=2, count=3, batch="offset", beta=1,
         pads=(2, 0, 1), setup=True)                         # int32 scratch, a partial last chunk
def test_int8_chunks(m, n, groups, ktail, act, signs, chunk, count, batch, beta, pads, setup):
    k = 4 * groups - ktail
    _go(Brgemm(m=m, n=n, k=k, lda=k + pads[0], ldb=n + pads[1], ldc=n + pads[2], beta=beta, dtype="i8",
               signs=signs, batch=batch, act=act, tile_setup=setup), chunk, count, setup)


def test_default_chunks_run_where_the_batch_outgrows_l1(monkeypatch):
    d = Brgemm(m=64, n=64, k=64, dtype="bf16", c_dtype="bf16", beta=1, bias=True, act="relu")
    g = chunk_blocks(d, plan(d))
    monkeypatch.delenv("TPPASM_AMX_CHUNKS", raising=False)
    if not native("amx"):
        assert generate(d).code == generate(d, 0).code                # interpreted AMX: off unless set
    monkeypatch.setenv("TPPASM_AMX_CHUNKS", "0")
    assert generate(d).code == generate(d, 0).code
    monkeypatch.setenv("TPPASM_AMX_CHUNKS", "1")
    assert g >= 1 and "prefetch" not in generate(d).disassemble()
    _go(d, None, 2 * g + 1, True)                            # three chunks, the last one partial
    assert chunk_blocks(Brgemm(m=64, n=64, k=512, dtype="bf16"), plan(d)) == 0     # a block over the chunk


def test_the_chunk_setting_is_part_of_the_cache_key(monkeypatch, tmp_path):
    from tppasm.cache import disk, kernels
    code, d = kernels.KernelCode(disk.DiskStore(str(tmp_path), 1 << 20)), Brgemm(m=64, n=64, k=64, dtype="bf16")
    monkeypatch.setenv("TPPASM_AMX_CHUNKS", "0")
    off = code.raw_key(d, "amx"), code.raw_key(d, "avx512")
    monkeypatch.setenv("TPPASM_AMX_CHUNKS", "1")
    on = code.raw_key(d, "amx")
    assert on != off[0] and code.raw_key(d, "avx512") == off[1]    # AMX code only
    monkeypatch.delenv("TPPASM_AMX_CHUNKS")
    assert code.raw_key(d, "amx") == (on if chunks_on() else off[0])     # the setting in effect, not its text
