"""The tails of the transpose and VNNI-pack transforms (the last n % 8 columns and m % 8 rows of a
transpose, the last n % (32 / itemsize) columns and the m % f rows of a pack) are vector code
(masked or overlapping blocks), not an element-at-a-time copy through general registers, and
still read and write nothing outside the operands (guard pages on either side)."""
import ctypes
import mmap

import iced_x86 as ix
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tppasm.dtypes import dtype as D
from tppasm.eltwise import Transform
from tppasm.kernel import get_kernel
from tppasm.x86.transform import generate_transform
from tests.support import isa_params, native, run_raw

# (op, dtype, block): the vectorized transforms and the columns one block or chunk holds
VECTORIZED = [("transpose", "f32", 8), ("transpose", "bf16", 8), ("vnni2", "bf16", 16), ("vnni4", "i8", 32)]
_GPRS = {ix.Register.RAX + i for i in range(ix.Register.R15 - ix.Register.RAX + 1)}


def _tail_shapes(op, block):
    """(m, n) shapes with every column tail and a row tail, above and below one block."""
    rows = 8 if op == "transpose" else 4
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
    for m, n in _tail_shapes(op, block):
        code = generate_transform(Transform(op, m, n, dtype=dt), isa).code
        assert not _scalar_moves(code), f"{op} {dt} {m}x{n} on {isa}: {_scalar_moves(code)[:3]}"
        size = len(code)
        assert size <= 8 * whole, f"{op} {dt} {m}x{n} on {isa}: {size} bytes of code, {whole} without tails"


@pytest.mark.parametrize("op,dt,block", VECTORIZED)
def test_amx_level_uses_the_avx512_code(op, dt, block):
    for m, n in _tail_shapes(op, block)[::5]:
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


def _check_inside_guard_pages(isa, case, m, n, pads, x_at_end, seed):
    """Poisoned outputs equal the reference, nothing between the output's rows changes, and the
    operands lie against inaccessible pages (before one, after the other): an access outside
    either faults (in the interpreter: outside the mapped arrays)."""
    op, dt, _ = case
    ldi, ldo = n + pads[0], (m + pads[1]) if op == "transpose" else 0
    desc = Transform(op, m, n, ldi, ldo, dt)
    k = get_kernel(desc, isa)
    out_spec = desc.operands()[1]
    out_count = (n - 1) * ldo + m if op == "transpose" else int(np.prod(out_spec.shape))
    rng = np.random.default_rng(seed)
    if native(isa):
        xf, of = _guarded((m - 1) * ldi + n, dt, x_at_end), _guarded(out_count, dt, not x_at_end)
    else:
        xf, of = np.empty((m - 1) * ldi + n, D(dt)), np.empty(out_count, D(dt))
    xf[...] = rng.integers(-100, 100, xf.size).astype(D(dt))
    of[...] = np.array(-77).astype(D(dt))
    x, out = _operand(xf, (m, n), ldi), _operand(of, out_spec.shape, ldo)
    want = [x.copy(), out.copy()]
    k.reference(*want)
    run_raw(k, (x, out), isa=isa)
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
    for i, (m, n) in enumerate(_tail_shapes(case[0], case[2])):
        _check_inside_guard_pages(isa, case, m, n, (i % 3, i % 2), i % 2 == 0, i)


# rows 2**27 + 1 f32 elements (512 MiB) apart: under 2 GiB, but 8 of them (a block's step, or row
# 7's displacement) are not; the element-wise copy before the vector tails accepted such strides
_BIG_LD = 2 ** 27 + 1


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("op,m,n,ldi,ldo,dt", [
    ("transpose", 2, 3, _BIG_LD, 0, "f32"), ("transpose", 7, 3, _BIG_LD, 0, "f32"),
    ("transpose", 3, 9, 0, _BIG_LD, "f32"), ("transpose", 2, 3, 2 * _BIG_LD, 0, "bf16"),
    ("vnni2", 2, 5, 4 * _BIG_LD, 0, "bf16"), ("vnni4", 5, 33, 4 * _BIG_LD, 0, "i8")])
def test_few_rows_accept_a_stride_under_2gib(isa, op, m, n, ldi, ldo, dt):
    """Blocks a loop visits once take no pointer step, and rows past 2 GiB of displacement are
    reached by stepping a pointer: the kernel builds."""
    assert generate_transform(Transform(op, m, n, ldi, ldo, dt), isa).code


@pytest.mark.parametrize("isa", [i for i in ("avx2", "avx512") if native(i)])
def test_few_rows_with_a_stride_under_2gib_run(isa):
    """7 rows 512 MiB apart in a sparse mapping (only the touched pages become resident)."""
    m, n = 7, 3
    buf = mmap.mmap(-1, ((m - 1) * _BIG_LD + n) * 4,
                    flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000))
    x = np.ndarray((m, n), np.float32, buffer=buf, strides=(_BIG_LD * 4, 4))
    x[...] = np.arange(m * n).reshape(m, n)
    out = np.full((n, m), -1, np.float32)
    k = get_kernel(Transform("transpose", m, n, _BIG_LD, 0, "f32"), isa)
    run_raw(k, (x, out), isa=isa)
    np.testing.assert_array_equal(out, x.T)
    del x
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
    for m, n in _tail_shapes(op, block):
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
