"""The tails of the transpose and VNNI-pack transforms (the last n % 8 columns and m % 8 rows of a
transpose of 2- or 4-byte elements, n % 16 and m % 16 of 1-byte ones, n % 4 (AVX2) or n % 8 and
m % 8 of 8-byte ones, the last n % (32 / itemsize) columns and the m % f rows of a pack) are vector
code (masked or overlapping blocks), not an element-at-a-time copy through general registers, and
still read and write nothing outside the operands (guard pages on either side)."""
import ctypes
import mmap

import iced_x86 as ix
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tppasm.dtypes import dtype as D
from tppasm.eltwise import Transform
from tppasm.kernel import get_kernel
from tppasm.x86.transform import generate_transform
from tests.support import isa_params, native, run_raw

# (op, dtype, block): the vectorized transforms and the columns one block or chunk holds (8-byte
# transposes: 4 on AVX2, 8 on AVX-512; 8 covers the tails of both)
VECTORIZED = [("transpose", "f32", 8), ("transpose", "bf16", 8), ("vnni2", "bf16", 16), ("vnni4", "i8", 32),
              ("transpose", "i8", 16), ("transpose", "u8", 16), ("transpose", "i64", 8)]
# the rows of a transpose block where they are not 8
_BLOCK_ROWS = {"i8": 16, "u8": 16}
_GPRS = {ix.Register.RAX + i for i in range(ix.Register.R15 - ix.Register.RAX + 1)}


def _tail_shapes(op, block, dt):
    """(m, n) shapes with every column tail and a row tail, above and below one block."""
    rows = _BLOCK_ROWS.get(dt, 8) if op == "transpose" else 4
    return [(m, n) for m in (rows * 8 + rows - 1, rows - 1) for n in range(1, 2 * block) if n % block]


def _scalar_moves(code):
    """Instructions moving data between memory (other than the stack) and a general register."""
    found = []
    for ins in ix.Decoder(64, code):
        kinds = [ins.op_kind(i) for i in range(ins.op_count)]
        if ix.OpKind.MEMORY not in kinds or ins.memory_base == ix.Register.RSP:
            continue
        if ins.mnemonic == ix.Mnemonic.LEA:
            continue
        regs = {ins.op_register(i) for i in range(ins.op_count) if kinds[i] == ix.OpKind.REGISTER}
        full = {ix.RegisterExt.full_register(r) for r in regs}
        if not regs or full & _GPRS:
            found.append(ix.Formatter(ix.FormatterSyntax.INTEL).format(ins))
    return found


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("op,dt,block", VECTORIZED)
def test_tails_are_vector_moves(isa, op, dt, block):
    """Every memory access of the code is a vector one, and the code does not grow with the tail:
    the element-at-a-time loops took 2-19x the time of the next whole width. (Up to four block
    variants: the whole blocks, the column tail, the row tail and the corner; AVX2 stores a
    partial row in up to five pieces.)"""
    whole = len(generate_transform(Transform(op, 64, 2 * block, dtype=dt), isa).code)
    for m, n in _tail_shapes(op, block, dt):
        code = generate_transform(Transform(op, m, n, dtype=dt), isa).code
        assert not _scalar_moves(code), f"{op} {dt} {m}x{n} on {isa}: {_scalar_moves(code)[:3]}"
        size = len(code)
        assert size <= 8 * whole, f"{op} {dt} {m}x{n} on {isa}: {size} bytes of code, {whole} without tails"


@pytest.mark.parametrize("op,dt,block", VECTORIZED)
def test_amx_level_uses_the_avx512_code(op, dt, block):
    for m, n in _tail_shapes(op, block, dt)[::5]:
        d = Transform(op, m, n, dtype=dt)
        assert generate_transform(d, "amx").code == generate_transform(d, "avx512").code


_MAPS = []


def _guarded(count, dt, at_end):
    """``count`` elements directly before (``at_end``) or after an inaccessible page."""
    nbytes = count * D(dt).itemsize
    pages = -(-nbytes // mmap.PAGESIZE) + 2
    buf = mmap.mmap(-1, pages * mmap.PAGESIZE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None)
    for page in (0, pages - 1):
        assert libc.mprotect(ctypes.c_void_p(base + page * mmap.PAGESIZE), mmap.PAGESIZE, 0) == 0
    start = (pages - 1) * mmap.PAGESIZE - nbytes if at_end else mmap.PAGESIZE
    return np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=start).view(D(dt))


def _operand(flat, shape, ld):
    """The (rows, cols) view of ``flat`` with rows ``ld`` elements apart, or ``flat`` reshaped.
    (Its base is ``flat``, so the interpreter maps all of ``flat``: as_strided's view has a base
    that is no ndarray, and run_raw would map the view's elements packed.)"""
    if len(shape) == 3:
        return flat.reshape(shape)
    return np.ndarray(shape, flat.dtype, buffer=flat, strides=(ld * flat.itemsize, flat.itemsize))


def _check_inside_guard_pages(isa, case, m, n, pads, x_at_end, seed, interp=False):
    """Poisoned outputs equal the reference, nothing between the output's rows changes, and the
    operands lie against inaccessible pages (before one, after the other): an access outside
    either faults (in the interpreter, which ``interp`` asks for: outside the mapped arrays)."""
    op, dt, _ = case
    ldi, ldo = n + pads[0], (m + pads[1]) if op == "transpose" else 0
    desc = Transform(op, m, n, ldi, ldo, dt)
    k = get_kernel(desc, isa)
    out_spec = desc.operands()[1]
    out_count = (n - 1) * ldo + m if op == "transpose" else int(np.prod(out_spec.shape))
    rng = np.random.default_rng(seed)
    if native(isa) and not interp:
        xf, of = _guarded((m - 1) * ldi + n, dt, x_at_end), _guarded(out_count, dt, not x_at_end)
    else:
        xf, of = np.empty((m - 1) * ldi + n, D(dt)), np.empty(out_count, D(dt))
    xf[...] = rng.integers(-100, 100, xf.size).astype(D(dt))
    of[...] = np.array(-77).astype(D(dt))
    x, out = _operand(xf, (m, n), ldi), _operand(of, out_spec.shape, ldo)
    want = [x.copy(), out.copy()]
    k.reference(*want)
    run_raw(k, (x, out), isa=isa, interpret=interp)
    np.testing.assert_array_equal(out, want[1], err_msg=f"{op} {dt} {m}x{n} ldi={ldi} ldo={ldo} on {isa}")
    if op == "transpose":
        gaps = np.ones(of.shape, bool)
        _operand(gaps, out.shape, ldo)[...] = False
        assert (of[gaps] == np.array(-77).astype(D(dt))).all(), "the padding between output rows changed"


@pytest.mark.parametrize("isa", isa_params(("avx2", "avx512")))
@given(case=st.sampled_from(VECTORIZED), m=st.integers(1, 40), n=st.integers(1, 70),
       pads=st.tuples(st.integers(0, 5), st.integers(0, 5)), x_at_end=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_tails_match_numpy_inside_guard_pages(isa, case, m, n, pads, x_at_end, seed):
    _check_inside_guard_pages(isa, case, m, n, pads, x_at_end, seed)


@pytest.mark.parametrize("isa", isa_params(("avx2", "avx512")))
@pytest.mark.parametrize("case", VECTORIZED, ids=lambda c: "-".join(map(str, c)))
def test_every_tail_shape_matches_numpy(isa, case):
    """Every column tail (and a row tail) of :func:`_tail_shapes`, not a sample: each tail width
    takes its own load/store path (AVX2: an 8-byte rest is a plain load, others a masked one), and
    25 drawn shapes missed some (a 2-dword rest loaded through a mask never built went unnoticed)."""
    for i, (m, n) in enumerate(_tail_shapes(case[0], case[2], case[1])):
        _check_inside_guard_pages(isa, case, m, n, (i % 3, i % 2), i % 2 == 0, i)


# the transposes of tppasm.x86.transpose_bytes: AVX2 ends a dimension of at least one block with a
# whole block moved back (it overlaps the one before), AVX-512 with masked loads and stores
_WIDE = [c for c in VECTORIZED if c[0] == "transpose" and D(c[1]).itemsize in (1, 8)]


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@settings(max_examples=40, deadline=None)
@given(case=st.sampled_from(_WIDE), m=st.integers(1, 40), n=st.integers(1, 40),
       pads=st.tuples(st.integers(0, 17), st.integers(0, 17)), seed=st.integers(0, 2 ** 16))
def test_wide_transposes_match_numpy_in_the_interpreter(isa, case, m, n, pads, seed):
    """The same kernels in isa.x86.interp, where AVX2-only hosts test the AVX-512 code."""
    _check_inside_guard_pages(isa, case, m, n, pads, False, seed, interp=True)


@pytest.mark.parametrize("isa", isa_params(("avx2", "avx512")))
@pytest.mark.parametrize("case", _WIDE, ids=lambda c: "-".join(map(str, c)))
def test_every_wide_row_tail_matches_numpy(isa, case):
    """Every row count up to two blocks and over (each partial row count is its own store path: AVX2
    stores bytes in 8-, 4-, 2- and 1-byte pieces, qwords in 16- and 8-byte ones), at a column tail."""
    rows = _BLOCK_ROWS.get(case[1], 8)
    for m in range(1, 2 * rows + 2):
        for n in (case[2] - 1, case[2] + 3):
            _check_inside_guard_pages(isa, case, m, n, (m % 3, m % 2), m % 2 == 0, m)


@pytest.mark.parametrize("dt", ["i8", "i64"])
def test_avx2_edges_of_a_whole_block_or_more_are_whole_blocks(dt):
    """AVX2 has no masked byte or qword store but a microcoded one (slow on AMD): a dimension
    holding at least one block ends in a whole block moved back, so neither partial loads (masks,
    inserts) nor piecewise stores appear, and only a shape under one block has them."""
    whole = 16 if dt == "i8" else 32                # bytes of a block's row or column in memory

    def partial(m, n):
        """The accesses of the operands narrower than a block's row, and the masked ones."""
        code = generate_transform(Transform("transpose", m, n, dtype=dt), "avx2").code
        return [ix.Formatter(ix.FormatterSyntax.INTEL).format(i) for i in ix.Decoder(64, code)
                if any(i.op_kind(k) == ix.OpKind.MEMORY for k in range(i.op_count))
                and i.memory_base != ix.Register.RSP and i.mnemonic != ix.Mnemonic.LEA
                and (ix.MemorySizeExt.size(i.memory_size) < whole or "maskmov" in ix.Formatter(
                    ix.FormatterSyntax.INTEL).format(i))]
    rows, cols = _BLOCK_ROWS.get(dt, 8), 16 if dt == "i8" else 4
    assert not partial(rows + 1, cols + 1) and not partial(3 * rows - 1, 5 * cols - 1)
    assert partial(rows - 1, cols + 1) and partial(rows + 1, cols - 1)


# output rows a multiple of 4 KiB apart: the whole 8 x 8 blocks of 4-byte elements (8-byte ones on AVX-512)
# take columns 4-7 from the rows 256 bytes back (transform._lag); (dtype, m, n, ldi, ldo) around it
_LAGGING = [("f32", 72, 8, 8, 1024), ("f32", 73, 9, 9, 1024), ("f32", 100, 12, 13, 2048), ("f32", 137, 17, 17, 1024),
            ("f32", 136, 16, 16, 1024), ("i64", 40, 8, 8, 512), ("i64", 41, 13, 15, 1024), ("i64", 75, 16, 16, 512)]


@pytest.mark.parametrize("isa", isa_params(("avx2", "avx512")))
@pytest.mark.parametrize("dt,m,n,ldi,ldo", _LAGGING)
def test_lagging_blocks_match_numpy(isa, dt, m, n, ldi, ldo):
    """The blocks of the first rows' columns 0-3, the lagging ones, those of the last lagging rows'
    columns 4-7 and the rest cover every element once or with the same value, inside guard pages."""
    from tppasm.x86.transform import _lag
    assert _lag(m, n, ldi, ldo, D(dt).itemsize)
    case = ("transpose", dt, 8)
    for seed, x_at_end in enumerate((True, False)):
        _check_inside_guard_pages(isa, case, m, n, (ldi - n, ldo - m), x_at_end, seed)
    _check_inside_guard_pages(isa, case, m, n, (ldi - n, ldo - m), False, 2, interp=True)


def test_only_aliased_output_rows_lag():
    """Output rows one L1 set apart lag; 4 KiB + 64 bytes apart, too few rows or columns do not;
    8-byte rows whose loads would share a set as well do not (whole-line stores gain less)."""
    from tppasm.x86.transform import LAG_BYTES, _lag
    assert _lag(1024, 8, 8, 1024, 4) == LAG_BYTES // 4 and _lag(1024, 1024, 1024, 1024, 4) == LAG_BYTES // 4
    assert _lag(1024, 8, 8, 1040, 4) == 0 and _lag(1024, 7, 7, 1024, 4) == 0 and _lag(71, 8, 8, 1024, 4) == 0
    assert _lag(1024, 8, 8, 1024, 8) == LAG_BYTES // 8 and _lag(1024, 1024, 1024, 1024, 8) == 0
    assert _lag(1024, 8, 8, 2048, 2) == 0 and _lag(4096, 16, 16, 4096, 1) == 0
    blends = [i for i in ix.Decoder(64, generate_transform(Transform("transpose", 1024, 8, dtype="f32"), "avx2").code)
              if i.mnemonic == ix.Mnemonic.VBLENDPS]
    assert len(blends) == 8


_ALL_SHUFFLES = ("unpck", "shuf", "perm")


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("dt,block", [("i8", 16), ("i64", 8)])
def test_narrow_wide_blocks_shuffle_only_what_they_store(isa, dt, block):
    """A block one row high stores its elements without the network; a block one column wide computes
    only the shuffles that column needs (bytes: 7 unpacks and the vpermq of 24 + 8; qwords on AVX2:
    4 unpacks and 2 lane permutes of 16, on AVX-512 4 unpacks and 3 of the 16 vshufi64x2 of 24)."""
    def shuffles(m, n):
        code = generate_transform(Transform("transpose", m, n, dtype=dt), isa).code
        return sum(any(s in ix.Formatter(ix.FormatterSyntax.INTEL).format(i) for s in _ALL_SHUFFLES)
                   for i in ix.Decoder(64, code))
    cols = 4 if dt == "i64" and isa == "avx2" else block
    assert shuffles(1, 3) == 0 and shuffles(1, cols) == 0
    assert shuffles(block, 1) == {"i8": 8, "i64": 6 if isa == "avx2" else 7}[dt]
    assert shuffles(block, cols) == {"i8": 32, "i64": 16 if isa == "avx2" else 24}[dt]


# rows 2**27 + 1 f32 elements (512 MiB) apart: under 2 GiB, but 8 of them (a block's step, or row
# 7's displacement) are not; the element-wise copy before the vector tails accepted such strides
_BIG_LD = 2 ** 27 + 1


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("op,m,n,ldi,ldo,dt", [
    ("transpose", 2, 3, _BIG_LD, 0, "f32"), ("transpose", 7, 3, _BIG_LD, 0, "f32"),
    ("transpose", 3, 9, 0, _BIG_LD, "f32"), ("transpose", 2, 3, 2 * _BIG_LD, 0, "bf16"),
    ("vnni2", 2, 5, 4 * _BIG_LD, 0, "bf16"), ("vnni4", 5, 33, 4 * _BIG_LD, 0, "i8"),
    ("transpose", 7, 3, 4 * _BIG_LD, 0, "i8"), ("transpose", 3, 17, 0, 4 * _BIG_LD, "u8"),
    ("transpose", 7, 3, 2 ** 26 + 1, 0, "i64"), ("transpose", 3, 7, 0, 2 ** 26 + 1, "i64")])
def test_few_rows_accept_a_stride_under_2gib(isa, op, m, n, ldi, ldo, dt):
    """Blocks a loop visits once take no pointer step, and rows past 2 GiB of displacement are
    reached by stepping a pointer: the kernel builds."""
    assert generate_transform(Transform(op, m, n, ldi, ldo, dt), isa).code


@pytest.mark.parametrize("isa", [i for i in ("avx2", "avx512") if native(i)])
@pytest.mark.parametrize("dt", ["f32", "i8", "i64"])
def test_few_rows_with_a_stride_under_2gib_run(isa, dt):
    """7 rows 512 MiB apart in a sparse mapping (only the touched pages become resident)."""
    m, n, es = 7, 3, D(dt).itemsize
    ld = 4 * _BIG_LD // es
    buf = mmap.mmap(-1, ((m - 1) * ld + n) * es,
                    flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000))
    x = np.ndarray((m, n), D(dt), buffer=buf, strides=(ld * es, es))
    x[...] = np.arange(m * n).reshape(m, n)
    out = np.full((n, m), -1, D(dt))
    k = get_kernel(Transform("transpose", m, n, ld, 0, dt), isa)
    run_raw(k, (x, out), isa=isa)
    np.testing.assert_array_equal(out, x.T)
    del x
    buf.close()


@pytest.mark.parametrize("isa", [i for i in ("avx2", "avx512") if native(i)])
@pytest.mark.parametrize("op,m,n,dt,big", [
    ("transpose", 20, 3, "f32", "x"), ("transpose", 20, 3, "i64", "x"), ("transpose", 35, 3, "i8", "x"),
    ("transpose", 3, 20, "i64", "out"), ("transpose", 3, 35, "i8", "out"), ("vnni2", 20, 5, "bf16", "x"),
    ("unvnni4", 20, 5, "i8", "out")])
def test_many_rows_with_a_stride_under_2gib_run(isa, op, m, n, dt, big):
    """Several blocks of rows 512 MiB apart: the loops step their pointers by more than 32 bits
    (through a register), in a sparse mapping."""
    es, f = D(dt).itemsize, {"vnni2": 2, "unvnni4": 4}.get(op, 1)
    ld = 4 * _BIG_LD // es
    shape = {"transpose": (n, m), "vnni2": (-(-m // 2), n, 2), "unvnni4": (m, n)}[op]
    src_shape = (m, n) if op != "unvnni4" else (-(-m // 4), n, 4)
    rows, cols = (src_shape[0], int(np.prod(src_shape[1:]))) if big == "x" else (shape[0], int(np.prod(shape[1:])))
    buf = mmap.mmap(-1, ((rows - 1) * ld + cols) * es,
                    flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000))
    wide = np.ndarray((rows, cols), D(dt), buffer=buf, strides=(ld * es, es))
    rng = np.random.default_rng(0)
    if big == "x":
        wide[...] = rng.integers(-100, 100, (rows, cols)).astype(D(dt))
        x, out = wide.reshape(src_shape), np.full(shape, -1, D(dt))
    else:
        x = rng.integers(-100, 100, src_shape).astype(D(dt))
        wide[...] = -1
        out = wide
    desc = Transform(op, m, n, ld if big == "x" else 0, ld if big == "out" else 0, dt)
    run_raw(get_kernel(desc, isa), (x, out), isa=isa)
    got = np.asarray(out).reshape(shape)
    if op == "transpose":
        want = x.T
    elif op == "vnni2":
        want = np.concatenate([x, np.zeros((m % 2, n), x.dtype)]).reshape(-1, 2, n).transpose(0, 2, 1)
    else:
        want = x.transpose(0, 2, 1).reshape(-1, n)[:m]
    np.testing.assert_array_equal(got, want)
    del x, out, wide
    buf.close()


# The AVX2 pieces of a short row or column (vpinsrb/vpextrb and vmovd/vmovq pieces at +1..+24, an
# 8-byte column's second 4 rows at +32) reach past the displacement of a block's last row: strides under
# 2 GiB (143 MiB for i8) whose last row starts just under 2^31 bytes from the block were refused until
# transform._strided counted that reach (ROW_REACH)
_JUST_UNDER_2GIB = [("transpose", 9, 16, 0, 143165576, "i8"), ("transpose", 2, 2, 2 ** 31 - 1, 0, "u8"),
                    ("transpose", 5, 4, 0, 89478484, "i64"), ("transpose", 8, 4, 0, 89478485, "i64"),
                    ("transpose", 7, 8, 0, 76695844, "f32")]


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("op,m,n,ldi,ldo,dt", _JUST_UNDER_2GIB)
def test_a_block_whose_last_row_ends_past_2gib_builds_and_runs(isa, op, m, n, ldi, ldo, dt):
    """A block's last row (or column) starts under 2^31 bytes from the block but its partial piece
    ends past it; natively, the kernel is also run in a sparse mapping."""
    desc = Transform(op, m, n, ldi, ldo, dt)
    assert generate_transform(desc, isa).code
    if not native(isa):
        return
    es, big = D(dt).itemsize, "x" if ldi else "out"
    rows, cols, ld = (m, n, ldi) if big == "x" else (n, m, ldo)
    buf = mmap.mmap(-1, ((rows - 1) * ld + cols) * es,
                    flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000))
    wide = np.ndarray((rows, cols), D(dt), buffer=buf, strides=(ld * es, es))
    x = np.random.default_rng(m * n).integers(-100, 100, (m, n)).astype(D(dt))
    if big == "x":
        wide[...], out = x, np.full((n, m), 111, D(dt))       # (no input value)
        x = wide
    else:
        wide[...], out = 111, wide
    run_raw(get_kernel(desc, isa), (x, out), isa=isa)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x).T)
    del x, out, wide
    buf.close()


def _stack_stores(code):
    """(size in bytes, text) of each store to the stack."""
    found = []
    for ins in ix.Decoder(64, code):
        if ins.op0_kind == ix.OpKind.MEMORY and ins.memory_base == ix.Register.RSP:
            text = ix.Formatter(ix.FormatterSyntax.INTEL).format(ins)
            found.append((ix.MemorySizeExt.size(ins.memory_size), text))
    return found


@pytest.mark.parametrize("op,dt,block", VECTORIZED)
def test_avx2_load_masks_are_stored_whole(op, dt, block):
    """Each AVX2 load mask goes to the stack in one 32-byte store: eight dword stores read back by
    one 32-byte load cannot be forwarded (a 1x1 transpose took 11.5 ns, before the tails 2.2)."""
    for m, n in _tail_shapes(op, block, dt):
        stores = _stack_stores(generate_transform(Transform(op, m, n, dtype=dt), "avx2").code)
        assert all(size == 32 for size, _ in stores), f"{op} {dt} {m}x{n}: {stores[:3]}"


_SHUFFLES = ("unpck", "shufps", "perm2")


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_narrow_transpose_blocks_shuffle_only_what_they_store(isa, dt):
    """A block one row high stores its elements without the 8x8 network; a block one column wide
    computes only the 7 of the 24 shuffles that column needs."""
    def shuffles(m, n):
        code = generate_transform(Transform("transpose", m, n, dtype=dt), isa).code
        return sum(any(s in ix.Formatter(ix.FormatterSyntax.INTEL).format(i) for s in _SHUFFLES)
                   for i in ix.Decoder(64, code))
    assert shuffles(1, 5) == 0 and shuffles(1, 8) == 0
    assert shuffles(8, 1) == 7
    assert shuffles(8, 8) == 24
