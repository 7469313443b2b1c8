"""Every VNNI pack and unpack the API accepts (factors 2 and 4; elements of 1, 2, 4 and 8 bytes) is
vector code (tppasm.x86.vnni) at the avx2 and avx512 levels, tails included, natively and in the
interpreter: equal to NumPy, every output element written, nothing read or written outside the
operands (guard pages on either side), an unpack writing only the rows the last group holds, and
a pack followed by an unpack giving the input back."""
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
from tests.support import native, run_raw
from tests.tpp.test_transform_tails import _guarded, _operand, _scalar_moves

OPS = ("vnni2", "vnni4", "unvnni2", "unvnni4")
DTYPES = ("i8", "u8", "bf16", "f32", "i32", "i64")
ONE_PER_SIZE = ("i8", "bf16", "f32", "i64")
POISON = 111                     # no input value: inputs are drawn from [-99, 100) (u8: wrapped)
ISAS = ("avx2", "avx512")


def _native_isas():
    return [pytest.param(i, id=i) if native(i) else pytest.param(i, id=i, marks=pytest.mark.skip(
        reason=f"the host does not run {i} natively")) for i in ISAS]


def _factor(op):
    return int(op[-1])


def _tail_shapes(op, dt):
    """(m, n): every column tail below and above one chunk (32 bytes of a row), with whole groups
    and a partial last one, and with a partial group alone (m < f)."""
    f, cols = _factor(op), 32 // D(dt).itemsize
    return [(m, n) for m in (3 * f + f - 1, f - 1) for n in range(1, 2 * cols) if n % cols]


def _flat_counts(desc):
    """Elements of x's and out's buffers (a rows operand ends at its last row's last element)."""
    packed = -(-desc.m // desc.factor) * desc.n * desc.factor
    if desc.op.startswith("un"):
        return packed, (desc.m - 1) * desc.ldo + desc.n
    return (desc.m - 1) * desc.ldi + desc.n, packed


def _check(isa, op, dt, m, n, pad, x_at_end, seed, interpret=False):
    """Run ``op`` on poisoned operands against inaccessible pages (before one, after the other;
    in the interpreter: outside the mapped buffers) and compare with the NumPy reference; the
    padding between an unpack's output rows stays poisoned. For an unpack the rows past k of
    the packed input hold values that must not come out."""
    unpack, ld = op.startswith("un"), n + pad
    desc = Transform(op, m, n, 0 if unpack else ld, ld if unpack else 0, dt)
    k = get_kernel(desc, isa)
    xspec, ospec = desc.operands()
    xcount, ocount = _flat_counts(desc)
    if not interpret:
        xf, of = _guarded(xcount, dt, x_at_end), _guarded(ocount, dt, not x_at_end)
    else:
        xf, of = np.empty(xcount, D(dt)), np.empty(ocount, D(dt))
    xf[...] = np.random.default_rng(seed).integers(-99, 100, xcount).astype(D(dt))
    of[...] = np.array(POISON).astype(D(dt))
    x, out = _operand(xf, xspec.shape, ld), _operand(of, ospec.shape, ld)
    want = [x.copy(), out.copy()]
    k.reference(*want)
    run_raw(k, (x, out), isa=isa, interpret=interpret)
    np.testing.assert_array_equal(out, want[1], err_msg=f"{op} {dt} {m}x{n} ld={ld} on {isa}")
    if unpack:
        gaps = np.ones(of.shape, bool)
        _operand(gaps, out.shape, ld)[...] = False
        assert (of[gaps] == np.array(POISON).astype(D(dt))).all(), "the padding between output rows changed"


def _runs():
    """(isa, interp) params: each level natively where the host runs it, and in isa.x86.interp."""
    out = [pytest.param(i, True, id=f"{i}-interp") for i in ISAS]
    return [pytest.param(i, False, id=i) for i in ISAS if native(i)] + out


def _need_interpreter(interp):
    if interp:
        pytest.importorskip("isa.x86.interp")


@pytest.mark.parametrize("isa,interp", _runs())
@given(op=st.sampled_from(OPS), dt=st.sampled_from(DTYPES), m=st.integers(1, 21), n=st.integers(1, 75),
       pad=st.integers(0, 5), x_at_end=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_matches_numpy_inside_guard_pages(isa, interp, op, dt, m, n, pad, x_at_end, seed):
    _need_interpreter(interp)
    _check(isa, op, dt, m, n, pad, x_at_end, seed, interpret=interp)


@pytest.mark.parametrize("isa", _native_isas())
@pytest.mark.parametrize("dt", ONE_PER_SIZE)
@pytest.mark.parametrize("op", OPS)
def test_every_tail_width_matches_numpy(isa, op, dt):
    """Every column tail of :func:`_tail_shapes`, not a sample: each width takes its own masks
    (a partial packed register, AVX2's piecewise stores and plain or masked loads)."""
    for i, (m, n) in enumerate(_tail_shapes(op, dt)):
        _check(isa, op, dt, m, n, i % 3, i % 2 == 0, i)


@pytest.mark.parametrize("isa", [pytest.param(i, id=f"{i}-interp") for i in ISAS])
@pytest.mark.parametrize("f", [2, 4])
def test_every_tail_width_in_the_interpreter(isa, f):
    """The interpreter at both levels (an AVX2-only host tests the AVX-512 code so): every width
    below one chunk of each element size, with a partial last group."""
    _need_interpreter(True)
    for es, dt in zip((1, 2, 4, 8), ONE_PER_SIZE):
        for op in (f"vnni{f}", f"unvnni{f}"):
            for n in range(1, 32 // es + 1):
                _check(isa, op, dt, f + 1, n, n % 2, n % 2 == 0, n, interpret=True)


@pytest.mark.parametrize("isa,interp", _runs())
@given(f=st.sampled_from([2, 4]), dt=st.sampled_from(DTYPES), m=st.integers(1, 21), n=st.integers(1, 75),
       pads=st.tuples(st.integers(0, 4), st.integers(0, 4)), seed=st.integers(0, 2 ** 16))
def test_pack_then_unpack_is_identity(isa, interp, f, dt, m, n, pads, seed):
    """unvnni(vnni(x)) == x, and the pack's rows past k are zeros."""
    _need_interpreter(interp)
    _round_trip(isa, f, dt, m, n, pads, seed, interp)


def _round_trip(isa, f, dt, m, n, pads, seed, interpret):
    pack = get_kernel(Transform(f"vnni{f}", m, n, n + pads[0], 0, dt), isa)
    unpack = get_kernel(Transform(f"unvnni{f}", m, n, 0, n + pads[1], dt), isa)
    xbuf = np.random.default_rng(seed).integers(-99, 100, (m, n + pads[0])).astype(D(dt))
    packed = np.full((-(-m // f), n, f), POISON, np.int64).astype(D(dt))
    back = np.full((m, n + pads[1]), POISON, np.int64).astype(D(dt))
    run_raw(pack, (xbuf[:, :n], packed), isa=isa, interpret=interpret)
    run_raw(unpack, (packed, back[:, :n]), isa=isa, interpret=interpret)
    np.testing.assert_array_equal(back[:, :n], xbuf[:, :n])
    assert (back[:, n:] == np.array(POISON).astype(D(dt))).all()
    assert (packed[-1, :, m - (len(packed) - 1) * f:] == 0).all()


_FEATURE_NAMES = {v: k for k, v in vars(ix.CpuidFeature).items() if isinstance(v, int)}


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dt", ONE_PER_SIZE)
@pytest.mark.parametrize("op", OPS)
def test_code_is_vector_moves_of_the_level(isa, op, dt):
    """Every memory access is a vector one (the element-at-a-time loops took 7-17x a memcpy), the
    code does not grow with the tail, and it uses no feature past the level: no EVEX at avx2, no
    AVX512_VBMI (absent on Skylake-X and Cascade Lake) at avx512."""
    f, cols = _factor(op), 32 // D(dt).itemsize
    whole = len(generate_transform(Transform(op, 8 * f, 2 * cols, dtype=dt), isa).code)
    for m, n in _tail_shapes(op, dt):
        code = generate_transform(Transform(op, m, n, dtype=dt), isa).code
        assert not _scalar_moves(code), f"{op} {dt} {m}x{n} on {isa}: {_scalar_moves(code)[:3]}"
        assert len(code) <= 6 * whole, f"{op} {dt} {m}x{n} on {isa}: {len(code)} bytes, {whole} without tails"
        names = {_FEATURE_NAMES[c] for ins in ix.Decoder(64, code) for c in ins.cpuid_features()}
        past = {n for n in names if n.startswith("AVX512")} if isa == "avx2" else names & {"AVX512_VBMI"}
        assert not past, f"{op} {dt} {m}x{n} on {isa} needs {sorted(past)}"


@pytest.mark.parametrize("dt", ONE_PER_SIZE)
@pytest.mark.parametrize("op", OPS)
def test_amx_level_uses_the_avx512_code(op, dt):
    for m, n in _tail_shapes(op, dt)[::7]:
        d = Transform(op, m, n, dtype=dt)
        assert generate_transform(d, "amx").code == generate_transform(d, "avx512").code


# rows 2**30 + 8 bytes apart: under 2 GiB, but f of them (a group's step, or row f-1's displacement) are not
_BIG_ROW = 2 ** 30 + 8


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("op,m,n,dt", [("vnni2", 2, 5, "i8"), ("vnni4", 5, 9, "bf16"), ("vnni4", 3, 3, "i64"),
                                       ("unvnni2", 2, 5, "i8"), ("unvnni4", 5, 9, "bf16"),
                                       ("unvnni4", 7, 3, "i64"), ("unvnni2", 3, 33, "f32")])
def test_few_groups_accept_a_stride_under_2gib(isa, op, m, n, dt):
    """Blocks a loop visits once take no pointer step, and rows past 2 GiB of displacement are
    reached by stepping a pointer: the kernel builds (the element-wise copy accepted such strides)."""
    ld = _BIG_ROW // D(dt).itemsize
    unpack = op.startswith("un")
    assert generate_transform(Transform(op, m, n, 0 if unpack else ld, ld if unpack else 0, dt), isa).code


@pytest.mark.parametrize("isa", _native_isas())
def test_unpack_rows_with_a_stride_under_2gib_run(isa):
    """An unpack's 7 output rows 1 GiB apart in a sparse mapping (only the touched pages become
    resident), the last group holding 3 of 4 rows."""
    m, n, ld = 7, 3, _BIG_ROW // 2
    buf = mmap.mmap(-1, ((m - 1) * ld + n) * 2,
                    flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000))
    out = np.ndarray((m, n), D("bf16"), buffer=buf, strides=(ld * 2, 2))
    packed = np.arange(2 * n * 4).reshape(2, n, 4).astype(D("bf16"))
    packed[1, :, 3] = 0
    run_raw(get_kernel(Transform("unvnni4", m, n, 0, ld, "bf16"), isa), (packed, out), isa=isa)
    np.testing.assert_array_equal(out, packed.transpose(0, 2, 1).reshape(-1, n)[:m])
    del out
    buf.close()


# The AVX2 pieces of a partial row (vmovd/vmovq/vpextr* at +4..+24 of it) reach past its displacement:
# strides of about 1 GiB whose last row starts just under 2^31 bytes away were refused until
# transform._strided counted that reach (ROW_REACH)
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("op,m,n,ld,dt", [("unvnni4", 3, 31, 1073741809, "i8"), ("vnni4", 3, 15, 536870906, "bf16"),
                                          ("unvnni4", 3, 3, 134217727, "i64"), ("unvnni4", 3, 7, 268435453, "f32")])
def test_a_partial_row_ending_past_2gib_builds_and_runs(isa, op, m, n, ld, dt):
    """The last row of a group starts under 2^31 bytes from the first but its partial piece ends
    past it; natively, the kernel also runs on the rows in a sparse mapping."""
    unpack = op.startswith("un")
    desc = Transform(op, m, n, 0 if unpack else ld, ld if unpack else 0, dt)
    assert generate_transform(desc, isa).code
    if not native(isa):
        return
    buf = mmap.mmap(-1, ((m - 1) * ld + n) * D(dt).itemsize,
                    flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000))
    rows = np.ndarray((m, n), D(dt), buffer=buf, strides=(ld * D(dt).itemsize, D(dt).itemsize))
    f, rng = _factor(op), np.random.default_rng(m * n)
    if unpack:
        x = rng.integers(-99, 100, (-(-m // f), n, f)).astype(D(dt))
        rows[...], out = np.array(POISON).astype(D(dt)), rows
        want = x.transpose(0, 2, 1).reshape(-1, n)[:m]
    else:
        rows[...] = rng.integers(-99, 100, (m, n)).astype(D(dt))
        x, out = rows, np.full((-(-m // f), n, f), POISON, np.int64).astype(D(dt))
        want = np.concatenate([rows, np.zeros((-m % f, n), rows.dtype)]).reshape(-1, f, n).transpose(0, 2, 1)
    run_raw(get_kernel(desc, isa), (x, out), isa=isa)
    np.testing.assert_array_equal(np.asarray(out), want)
    del x, out, rows
    buf.close()
