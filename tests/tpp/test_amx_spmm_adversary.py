"""An adversarial pass over the AMX block-sparse x dense kernel (``tppasm.block_spmm(..., isa="amx")``:
:class:`tppasm.x86.spmm.AmxSpmmGen` for bf16 blocks of at most 32 x 32 with n a multiple of 16, the
AVX-512 code for the other shapes at the AMX level), run in isa.x86.interp.

Every operand is its own interpreter region cut to its exact extent (rowptr 8 bytes, colidx and
values exactly ``count`` blocks, B and C from their first to their last element; starts drawn off
alignment), so a byte read or written outside an operand faults, as against a guard page natively.
B's gaps (ldb past n) hold bf16 NaN; C starts as a NaN pattern (every element must be written with
beta=0) and its gaps must keep it bit for bit; the colidx entries outside the block row are out of
range (reading one poisons C). Values are integers in [-8, 8], so every fp32 sum is exact and C
must equal the float64 reference exactly; the inputs must be unchanged after the call."""
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import tppasm
from isa.cpu import host
from isa.x86.interp import Machine
from tppasm.brgemm import Brgemm
from tppasm.dtypes import dtype as to_dtype
from tppasm.operand import OperandError
from tppasm.spmm import BlockSpmm
from tppasm.x86.amx_config import tileconfig_function, tilerelease_function
from tppasm.x86.spmm import AmxSpmmGen, generate
from tests.support import assert_same_non_finite, interp_available
from tests.tpp.test_amx_adversary import POISON, _grid, _place, exact, untouched

pytestmark = pytest.mark.skipif(not interp_available(), reason="no x86 interpreter")

BF16 = to_dtype("bf16")
C_BITS = POISON["f32"][0]                  # C's poison: a NaN payload no kernel makes
B_PAD = np.uint16(0x7FC1)                  # bf16 NaN between B's rows
GARBAGE = np.int32([-1, 2 ** 31 - 1, -2 ** 31])     # colidx entries outside the row: never read


# -- operands and the call ----------------------------------------------------------------------

def _b_layout(d):
    """B's shape and element strides: VNNI2 (kb*bk/2, n, 2) with rows 2*ldb apart."""
    return (d.kb * d.bk // 2, d.n, 2), (2 * d.ldb, 2, 1)


def _placed(shape, strides, fill, dtype):
    """A flat buffer of exactly the extent of ``shape``/``strides`` filled with ``fill`` bits, the
    mask of the view's elements, and the view."""
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    flat = np.full(extent, fill).view(dtype)
    mask = np.zeros(extent, bool)
    mask[_grid(shape, strides).reshape(-1)] = True
    view = np.lib.stride_tricks.as_strided(flat, shape, [s * flat.itemsize for s in strides])
    return flat, mask, view


def operands(d, rng, start, cols, extra=0, specials=False):
    """rowptr, colidx, values, B (flat), C (flat) and count for one block row holding ``cols``
    from entry ``start`` on, ``extra`` more stored blocks after it; plus B's and C's views, C's mask."""
    count = max(1, start + len(cols) + extra)
    rowptr = np.array([start, start + len(cols)], np.int32)
    colidx = rng.choice(GARBAGE, count).astype(np.int32)
    colidx[start:start + len(cols)] = cols
    values = _ints(rng, (count, d.bm, d.bk), specials).astype(BF16)
    bshape, bstrides = _b_layout(d)
    b, _, bview = _placed(bshape, bstrides, B_PAD, BF16)
    bview[...] = _ints(rng, bshape, specials)
    c, cmask, cview = _placed((d.bm, d.n), (d.ldc, 1), C_BITS, np.float32)
    if d.beta:
        cview[...] = _ints(rng, cview.shape, specials, 64)
    return (rowptr, colidx, values, b, c), count, bview, cview, cmask


def _ints(rng, shape, specials=False, top=8):
    x = rng.integers(-top, top + 1, shape).astype(np.float32)
    if specials:
        hit = rng.random(shape) < 0.03
        x[hit] = rng.choice(np.float32([np.nan, np.inf, -np.inf, -0.0]), int(hit.sum()))
    return x


def call(d, arrays, count, machine=None, hooks=(), offsets=(0, 4, 2, 6, 4)):
    """The AMX-level raw kernel of ``d`` in the interpreter, each array its own region at ``offsets``
    bytes past a page; the hooks' code runs first. Returns (C's flat buffer after, the machine) and
    checks that no input changed."""
    m = machine or Machine()
    addrs = [m.map(x, off) for x, off in zip(arrays, offsets)]
    for hook in hooks:
        m.call(hook.code)
    m.call(generate(d, "amx").code, args=addrs + [count])
    for x, addr in zip(arrays[:4], addrs):
        assert (m.read(addr, like=x).view(np.uint8) == x.view(np.uint8)).all(), "the kernel wrote an input"
    return m.read(addrs[4], like=arrays[4]), m


def check(d, rng, start, cols, extra=0, machine=None, hooks=()):
    """One block row against the float64 reference: exact, every element written, C's gaps kept."""
    arrays, count, bview, cview, cmask = operands(d, rng, start, cols, extra)
    want = cview.copy()
    d.reference(arrays[0], arrays[1], arrays[2], bview, want, count=count)
    after, m = call(d, arrays, count, machine, hooks)
    got = np.lib.stride_tricks.as_strided(after, cview.shape, cview.strides)
    exact(d, got, want, after, arrays[4], cmask)
    return m


def _desc(bm, bk, n, kb, beta=0, ldb=0, ldc=0):
    d = BlockSpmm(bm=bm, bk=bk, n=n, kb=kb, ldb=ldb, ldc=ldc, dtype="bf16", beta=beta)
    d.validate()
    return d


# -- shapes -----------------------------------------------------------------------------------------

def test_every_block_size_up_to_32():
    """bm 1..32 (one tile row, 16 + every remainder of 16 in the second) x every even bk 2..32
    (every A tile width, B tiles of 1..16 VNNI rows), n of 1 to 5 tiles (column groups of 3 / 2 and
    their remainders), beta 0/1, strides past n, rows with repeated and last block columns."""
    rng = np.random.default_rng(1)
    for bm in range(1, 33):
        for bk in range(2, 33, 2):
            kb = 1 + (bm + bk) % 4
            n = 16 * (1 + (bm * 3 + bk // 2) % 5)
            d = _desc(bm, bk, n, kb, beta=(bm + bk // 2) % 2, ldb=n + (bk % 3) * 8, ldc=n + bm % 3)
            assert AmxSpmmGen.fits(d)
            cols = [kb - 1, 0, kb - 1][:1 + (bm + bk) % 3]
            check(d, rng, start=bm % 2, cols=cols, extra=bk % 3)


@pytest.mark.parametrize("bm,bk,ns", [(17, 6, range(1, 81)), (1, 2, range(1, 81)),
                                     (32, 32, (1, 15, 16, 17, 32, 33, 47, 48, 64, 79, 80))])
def test_every_n_from_1_to_80(bm, bk, ns):
    """n = 1..80: multiples of 16 on tiles, every other remainder of 16 on the AVX-512 code (masked
    tails) that the AMX level falls back to; both against the exact regions."""
    rng = np.random.default_rng(bm * 100 + bk)
    for n in ns:
        d = _desc(bm, bk, n, 3, beta=n % 2, ldc=n + n % 3)
        check(d, rng, start=n % 2, cols=[2, 0, 2, 1][:1 + n % 4], extra=1)


def test_tiles_exactly_where_they_fit():
    """bf16, n % 16 == 0, bm <= 32, bk <= 32: tdpbf16ps; one more row, column pair or column (or f32):
    the AVX-512 code, which runs right in the interpreter too."""
    rng = np.random.default_rng(2)
    for bm, bk, n, tiles in ((32, 32, 80, True), (33, 32, 80, False), (32, 34, 48, False), (16, 16, 17, False),
                             (16, 16, 15, False), (1, 2, 16, True)):
        d = _desc(bm, bk, n, 2, beta=1)
        assert AmxSpmmGen.fits(d) is tiles
        text = generate(d, "amx").disassemble()
        assert ("tdpbf16ps" in text) is tiles and ("ldtilecfg" in text) is tiles
        check(d, rng, start=1, cols=[1, 0], extra=1)
    f32 = BlockSpmm(bm=16, bk=16, n=32, kb=2)
    assert not AmxSpmmGen.fits(f32) and "tdpbf16ps" not in generate(f32, "amx").disassemble()


STRUCTURES = {       # (start, cols as a function of kb, extra blocks after the row)
    "empty row first": (0, lambda kb: [], 2),
    "empty row between": (3, lambda kb: [], 3),
    "all blocks": (0, lambda kb: list(range(kb)), 0),
    "all blocks reversed": (2, lambda kb: list(range(kb))[::-1], 1),
    "one column repeated": (1, lambda kb: [kb // 2] * 5, 0),
    "the last column": (0, lambda kb: [kb - 1], 0),
    "the last block stored": (4, lambda kb: [kb - 1, 0, kb - 1], 0),
}


@pytest.mark.parametrize("name", list(STRUCTURES))
@pytest.mark.parametrize("bm,bk,n", [(16, 32, 48), (32, 8, 80), (5, 2, 32)])
def test_block_row_structures_for_kb_1_to_8(name, bm, bk, n):
    start, cols, extra = STRUCTURES[name]
    rng = np.random.default_rng(len(name) + bm)
    for kb in range(1, 9):
        for beta in (0, 1):
            check(_desc(bm, bk, n, kb, beta=beta), rng, start, cols(kb), extra)


@pytest.mark.parametrize("ldb_pad,ldc_pad", [(1, 0), (0, 3), (16, 16), (512, None), (None, 1024), (1024, 512)])
@pytest.mark.parametrize("bm,bk,n", [(32, 32, 48), (20, 8, 80), (16, 2, 16)])
def test_leading_dimensions_past_n(ldb_pad, ldc_pad, bm, bk, n):
    """ldb / ldc a little past n, and rows exactly 2 KiB or 4 KiB apart (a pad of None: ldb = 512,
    B's VNNI rows 2 KiB apart; ldc = 1024, C's rows 4 KiB apart)."""
    rng = np.random.default_rng(bm + bk + n)
    ldb = 512 if ldb_pad is None else n + ldb_pad
    ldc = 1024 if ldc_pad is None else n + ldc_pad
    for beta in (0, 1):
        check(_desc(bm, bk, n, 3, beta=beta, ldb=ldb, ldc=ldc), rng, 1, [2, 0, 2], 1)


def test_huge_leading_dimensions_rows_at_their_real_addresses():
    """ldb and ldc as large as the descriptor takes (B and C just under 2 GiB): each row of B and C
    its own region at its real address, so a wrong stride or a 32-bit displacement that wrapped faults."""
    rng = np.random.default_rng(3)
    for bm, bk, n, kb, ldb, ldc, beta in (
            (32, 32, 48, 2, (1 << 31) // (2 * 32 * 4) - 16, (1 << 31) // (32 * 4) - 1, 1),
            (17, 2, 80, 8, (1 << 31) // (8 * 2 * 4) - 1, (1 << 31) // (17 * 4) - 3, 0),
            (32, 16, 32, 1, (1 << 31) // (16 * 4) - 1, 1 << 22, 1)):
        d = _desc(bm, bk, n, kb, beta=beta, ldb=ldb, ldc=ldc)
        with pytest.raises(ValueError, match="under 2 GiB"):
            _desc(bm, bk, n, kb, ldb=ldb + 64, ldc=ldc + 64)
        m = Machine()
        cols = [kb - 1, 0, kb - 1][:kb + 1]
        values = rng.integers(-8, 9, (len(cols), bm, bk)).astype(BF16)
        b = rng.integers(-8, 9, (kb * bk // 2, n, 2)).astype(BF16)
        c0 = rng.integers(-64, 65, (bm, n)).astype(np.float32) if beta else np.full((bm, n), C_BITS).view(np.float32)
        base_b, base_c = 1 << 40, 1 << 44
        for g in range(len(b)):
            _place(m, base_b + g * ldb * 4, b[g])
        for r in range(bm):
            _place(m, base_c + r * ldc * 4, c0[r])
        rowptr, colidx = np.array([0, len(cols)], np.int32), np.array(cols, np.int32)
        want = c0.copy()
        d.reference(rowptr, colidx, values, b, want)
        m.call(generate(d, "amx").code, args=[m.map(rowptr), m.map(colidx), m.map(values), base_b, base_c, len(cols)])
        got = np.stack([m.read(base_c + r * ldc * 4, like=c0[r]) for r in range(bm)])
        assert np.array_equal(got, want), f"{d}: {int((got != want).sum())} elements differ"


# -- values: NaN / inf propagate, drawn cases ----------------------------------------------------------

@st.composite
def cases(draw):
    bm, bk = draw(st.integers(1, 32)), 2 * draw(st.integers(1, 16))
    n = draw(st.one_of(st.integers(1, 5).map(lambda t: 16 * t), st.integers(1, 80)))
    kb = draw(st.integers(1, 8))
    ldb = n + draw(st.sampled_from([0, 0, 1, 16, 512 - n % 512]))
    ldc = n + draw(st.sampled_from([0, 0, 5, 16, 1024 - n % 1024]))
    d = _desc(bm, bk, n, kb, beta=draw(st.integers(0, 1)), ldb=ldb, ldc=ldc)
    cols = draw(st.lists(st.integers(0, kb - 1), max_size=6))
    return d, draw(st.integers(0, 3)), cols, draw(st.integers(0, 2))


@settings(max_examples=25, deadline=None)
@given(case=cases(), specials=st.booleans(), seed=st.integers(0, 2 ** 16))
@example(case=(BlockSpmm(bm=31, bk=30, n=80, kb=8, ldb=512, ldc=1024, dtype="bf16", beta=1), 3, [7, 7, 0, 7], 2),
         specials=True, seed=0)
def test_drawn_rows_with_nan_and_inf(case, specials, seed):
    """NaN and inf in A, B and C (beta=1) land where the float64 reference has them; the finite
    elements stay exact."""
    d, start, cols, extra = case
    rng = np.random.default_rng(seed)
    arrays, count, bview, cview, cmask = operands(d, rng, start, cols, extra, specials)
    want = cview.copy()
    with np.errstate(all="ignore"):
        d.reference(arrays[0], arrays[1], arrays[2], bview, want, count=count)
    after, _ = call(d, arrays, count)
    got = np.lib.stride_tricks.as_strided(after, cview.shape, cview.strides)
    untouched(after, arrays[4], cmask)
    assert not (got.view(np.uint32) == C_BITS).any(), "an element of C was not written"
    assert_same_non_finite(got, want, str(d))
    fin = np.isfinite(want)
    assert np.array_equal(got[fin], want[fin])


def test_no_stored_blocks_at_all():
    """The raw kernel on an empty matrix (count=0, colidx and values empty regions: the public call
    refuses count=0): C = 0 with beta=0, C as it was with beta=1, nothing read from the blocks."""
    for d in (_desc(32, 32, 80, 2), _desc(7, 4, 32, 1, beta=1, ldc=40)):
        ops, _, _, cview, cmask = operands(d, np.random.default_rng(6), 0, [])
        arrays = (np.zeros(2, np.int32), np.zeros(0, np.int32), np.zeros(0, BF16), np.zeros(0, BF16), ops[4])
        c = np.lib.stride_tricks.as_strided(arrays[4], cview.shape, cview.strides)
        want = c.copy() if d.beta else np.zeros(cview.shape, np.float32)
        after, _ = call(d, arrays, 0)
        exact(d, np.lib.stride_tricks.as_strided(after, cview.shape, cview.strides), want, after, arrays[4], cmask)
    with pytest.raises(OperandError, match="count=0"):
        tppasm.block_spmm(16, 16, 16, 1, "bf16", isa="amx")(np.zeros(2, np.int32), np.zeros(0, np.int32),
                                                           np.zeros((0, 16, 16), BF16), np.zeros((8, 16, 2), BF16))


def test_denormals_in_c_are_flushed_where_a_block_is_multiplied():
    """beta=1: tdpbf16ps treats its accumulator's denormals as zero (DAZ, as vdpbf16ps does: the
    AVX-512 code at n=17 agrees), so a denormal C element becomes 0 in a row with a stored block and
    stays as it was in a row without one; the reference keeps it (the module docstring says only
    that products may flush)."""
    tiny = np.float32(1e-40)
    for n in (16, 17):
        d = _desc(2, 2, n, 1, beta=1)
        for blocks, want in ((0, tiny), (1, 0.0)):
            c = np.full((2, n), tiny, np.float32)
            arrays = (np.array([0, blocks], np.int32), np.zeros(1, np.int32), np.zeros((1, 2, 2), BF16),
                      np.zeros((1, n, 2), BF16), c.reshape(-1))
            after, _ = call(d, arrays, 1)
            assert (after == want).all()


# -- the tile state ------------------------------------------------------------------------------------

def test_configures_itself_after_any_tile_state_and_keeps_its_configuration():
    """After another kernel's config (a BRGEMM's, the other spmm shape's), after a release, and
    twice in a row on one machine: right every time, its own configuration loaded on return (as a
    ``tile_setup=True`` BRGEMM leaves it), and loaded only when another one was (``sttilecfg`` and a
    compare decide)."""
    m = Machine()
    one, two = _desc(5, 6, 48, 3, beta=1), _desc(32, 32, 80, 2)
    rng = np.random.default_rng(4)
    loads = lambda: sum(op[0] == "ldtilecfg" for op in m.stats.tile_ops)       # noqa: E731
    previous = None
    for hooks, hook_loads in [((tileconfig_function(Brgemm(m=16, n=16, k=32, dtype="bf16", tile_setup=False)),), 1),
                              ((tileconfig_function(Brgemm(m=40, n=33, k=8, dtype="i8", tile_setup=False)),), 1),
                              ((tilerelease_function(),), 0), ((), 0)]:
        for d in (one, two, two, one, one):
            before = loads() + hook_loads
            check(d, rng, 1, [1, 0, 1], 1, machine=m, hooks=hooks)
            cfg = AmxSpmmGen(d).config()
            assert m.tilecfg == (list(cfg[48:56]), [int.from_bytes(cfg[16 + 2 * t:18 + 2 * t], "little")
                                                    for t in range(8)]), "the kernel left another configuration"
            reloaded = loads() - before
            assert reloaded == (0 if d is previous and not hooks else 1), (d, hooks)
            previous = d


def test_bad_indices_poison_c_in_any_tile_state():
    """The raw kernel's index check runs before its tile configuration: a bad row poisons C with NaN
    whatever config is loaded (and leaves that config as it was)."""
    for d in (_desc(20, 4, 32, 3), _desc(3, 32, 80, 3, beta=1)):
        other = tileconfig_function(Brgemm(m=16, n=16, k=32, dtype="bf16", tile_setup=False))
        for hooks in ((), (other,)):
            arrays, count, _, cview, cmask = operands(d, np.random.default_rng(5), 0, [0, 2])
            arrays[1][1] = 3                            # colidx past kb
            after, m = call(d, arrays, count, hooks=hooks)
            got = np.lib.stride_tricks.as_strided(after, cview.shape, cview.strides)
            untouched(after, arrays[4], cmask)
            assert (got.view(np.uint32) == 0x7FC00000).all()
            assert (m.tilecfg is None) is (not hooks)


# -- refusals ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw,error,fix", [
    (dict(bk=3), ValueError, r"bk=3; expected an even int for dtype='bf16'"),
    (dict(bk=0), ValueError, r"bk=0; expected an int from 1"),
    (dict(bm=0), ValueError, r"bm=0; expected an int from 1"),
    (dict(n=0), ValueError, r"n=0; expected an int from 1"),
    (dict(kb=0), ValueError, r"kb=0; expected an int from 1"),
    (dict(bm=2.0), ValueError, r"bm=2.0; expected an int"),
    (dict(dtype="i8"), ValueError, r"dtype='i8'; expected 'f32' or 'bf16'"),
    (dict(dtype="f16"), TypeError, r"dtype='f16' is not a tppasm dtype"),
    (dict(beta=2), ValueError, r"beta=2; expected 0 or 1"),
    (dict(beta=0.5), ValueError, r"beta=0.5; expected .*0 or 1"),
    (dict(ldb=15), ValueError, r"ldb=15; expected an int >= n=16"),
    (dict(ldc=1), ValueError, r"ldc=1; expected an int >= n=16"),
    (dict(ldb=1 << 24), ValueError, r"ldb=16777216; expected a value that keeps B and C under 2 GiB"),
    (dict(ldc=1 << 25), ValueError, r"ldc=33554432; expected a value that keeps B and C under 2 GiB"),
    (dict(c_dtype="bf16"), TypeError, r"takes no c_dtype=: c is always f32.*tppasm.copy"),
    (dict(tile_setup=False), TypeError, r"unexpected keyword argument 'tile_setup'; it takes bm, bk"),
    (dict(isa="amx-bf16"), ValueError, r"isa='amx-bf16': expected one of 'avx2', 'avx512', 'amx'"),
])
def test_refusals_name_the_fix(kw, error, fix):
    args = dict(bm=16, bk=16, n=16, kb=2, dtype="bf16", isa="amx")
    args.update(kw)
    with pytest.raises(error, match=fix):
        tppasm.block_spmm(**args)


def test_operands_are_refused_before_the_isa_check():
    """Wrong operands are named first (a bf16 C, a B not in VNNI2, f32 values, a narrow C); right
    ones then meet the host check, which points at the interpreter."""
    k = tppasm.block_spmm(bm=16, bk=16, n=32, kb=2, dtype="bf16", isa="amx")
    rp, ci = np.array([0, 1], np.int32), np.array([1], np.int32)
    values, b = np.ones((1, 16, 16), BF16), np.ones((16, 32, 2), BF16)
    c = np.zeros((16, 32), np.float32)
    for args, fix in (((rp, ci, values, b, c.astype(BF16)), r"c has dtype bfloat16, expected float32.*pass a float32"),
                      ((rp, ci, values, np.ones((32, 32), BF16), c), r"expected 3: \(16, 32, 2\).*vnni_pack\(B, 2\)"),
                      ((rp, ci, values, b[:8], c), r"b has shape \(8, 32, 2\), expected \(16, 32, 2\)"),
                      ((rp, ci, values.astype(np.float32), b, c), r"expected bfloat16.*astype\(ml_dtypes.bfloat16\)"),
                      ((rp, ci, values, b, c[:, :16]), r"c has shape \(16, 16\), expected \(16, 32\)")):
        with pytest.raises(OperandError, match=fix):
            k(*args)
    assert (c == 0).all()
    if "amx" not in host().levels:
        with pytest.raises(tppasm.kernel.ISAUnavailableError, match="interpreter"):
            k(rp, ci, values, b, c)
