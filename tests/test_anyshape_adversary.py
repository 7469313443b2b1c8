"""An adversarial pass over the GEMM and MLP of any shape (``bench.gemm``, ``bench.mlp``, ``tppasm.layout``).

Every configuration ``gemm_configs`` / ``mlp_configs`` offers for awkward shapes (1, 2, primes, one off a
block, tall-skinny, short-wide; odd K for bf16, K % 4 != 0 for int8), at each native ISA level, against a
float64 reference with poisoned outputs; operands in every memory form; misfit operands refused with the fix
named; NaN and inf exactly where NumPy puts them; 2 threads bit for bit as 1; the tuner on an odd shape.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import bench.gemm as bg
import tppasm as tpp
from bench.common import pool_of
from bench.gemm import gemm_configs, gemm_maker
from bench.mlp import _chain, layer_maker, mlp_configs, mlp_maker, mlp_weights
from tests.support import kernel_level, native_levels

U32 = 2.0 ** -24            # fp32 unit roundoff
GEMM_SHAPES = [(1, 1, 1), (2, 2, 2), (7, 13, 31), (13, 257, 5), (63, 65, 129), (131, 7, 67), (1, 4096, 7),
               (4096, 1, 3), (97, 2, 13)]


def exact_operands(rng, M, N, K, dtype):
    """Operands whose products and sums every dtype holds exactly (int8: the full u8 x s8 range)."""
    if dtype == "i8":
        return bg.operands(rng, M, N, K, "i8")
    if dtype == "bf16":                       # small ints: bf16 holds them, fp32 sums them exactly
        return (rng.integers(-8, 9, (M, K)).astype(np.float32), rng.integers(-8, 9, (K, N)).astype(np.float32))
    return rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)


def poisoned_run(make, config, spec=None):
    """Build ``config``, fill C with NaN (int32: its minimum), run, and return the (M, N) result."""
    gemm, arrays, output = make(**config)
    C = arrays[2]
    C[...] = np.nan if C.dtype.kind == "f" else np.iinfo(C.dtype).min
    (gemm.with_spec(spec) if spec else gemm)(*arrays)
    return output()


def assert_gemm(got, a, b, dtype, what=""):
    """Every element against float64: exact for bf16 and int8 (exact inputs), fp32 within (K + 2) u |a| @ |b|."""
    M, K = a.shape
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert got.shape == ref.shape, what
    if dtype == "f32":
        bound = (K + 2) * U32 * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))) + 1e-30
        bad = ~(np.abs(got - ref) <= bound)          # NaN (an element never written) counts as wrong
        assert not bad.any(), f"{what}: {int(bad.sum())} wrong, first at {np.argwhere(bad)[0]}"
    else:
        np.testing.assert_array_equal(got.astype(np.float64), ref, err_msg=what)


# -- every configuration offered, at every native level --------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "bf16", "i8"])
@pytest.mark.parametrize("isa", native_levels())
def test_every_offered_gemm_config_is_right_or_refused(isa, dtype):
    rng = np.random.default_rng(7)
    with kernel_level(isa):
        for M, N, K in GEMM_SHAPES:
            a, b = exact_operands(rng, M, N, K, dtype)
            make = gemm_maker(a, b, dtype, pool_of(1))
            configs = gemm_configs(M, N, K, dtype)
            assert configs[0] == {"bm": 64, "bn": bg.n_block(), "bk": 64, "kstep": 8, "edges": True}
            for i, config in enumerate(configs):
                try:
                    got = poisoned_run(make, config)
                except ValueError as e:       # refused when built is fine, but never the fixed configuration
                    assert i, f"{isa} {dtype} {M}x{N}x{K}: the fixed configuration is refused: {e}"
                    continue
                assert_gemm(got, a, b, dtype, f"{isa} {dtype} {M}x{N}x{K} {config}")


@pytest.mark.parametrize("isa", native_levels())
def test_every_offered_mlp_config_is_right_and_keeps_padded_channels_zero(isa):
    with kernel_level(isa):
        for T, C in [(1, 1), (2, 3), (7, 13), (65, 31), (13, 67)]:
            x = np.random.default_rng(T * 100 + C).standard_normal((T, C)).astype(np.float32)
            params = mlp_weights(C, 3)
            ref = x.astype(np.float64)
            for w, bias in params:
                ref = np.maximum(ref @ w + bias, 0)
            for dtype in ("f32", "bf16"):
                nb = bg.n_block()                      # and sizes no config of these shapes offers
                for config in mlp_configs(T, C, dtype=dtype) + [{"bm": 5, "bc": nb // 2}, {"bm": 1, "bc": nb // 2 * 3}]:
                    chain = _chain(mlp_maker(x, params, dtype, pool_of(1))(**config))
                    for act in chain.acts[1:]:
                        act[...] = np.nan
                    chain()
                    what = f"{isa} {dtype} {T}x{C} {config}"
                    for act in chain.acts:                  # every element written; padded channels stay 0
                        full = tpp.unblock(act).astype(np.float32)
                        assert not np.isnan(full).any() and not full[:, C:].any(), what
                    err = np.abs(chain.output() - ref).max() / max(1.0, np.abs(ref).max())
                    assert err <= (1e-5 if dtype == "f32" else 5e-2), f"{what}: {err}"


# -- operands in every memory form, and misfits refused with the fix named --------------------------------

def _forms(x):
    """``x``'s values as a Fortran array, a transposed view, a strided view, a view 4 bytes off an
    aligned start (unaligned), a read-only array, int64 and float64 copies where exact."""
    buf = tpp.empty((x.size * x.itemsize + 4,), np.uint8)
    off = buf[4:].view(x.dtype).reshape(x.shape)
    off[...] = x
    wide = np.zeros((x.shape[0], 2 * x.shape[1]), x.dtype)
    wide[:, ::2] = x
    ro = x.copy()
    ro.flags.writeable = False
    with np.errstate(invalid="ignore"):              # NaN as int64: dropped below (not equal)
        wide_int = x.astype(np.int64)
    forms = {"fortran": np.asfortranarray(x), "transposed": np.ascontiguousarray(x.T).T, "strided": wide[:, ::2],
             "unaligned": off, "readonly": ro, "int64": wide_int, "float64": x.astype(np.float64)}
    return {k: v for k, v in forms.items() if v.dtype == x.dtype or np.array_equal(v, x)}


@pytest.mark.parametrize("dtype", ["f32", "bf16", "i8"])
def test_operands_in_any_memory_form_give_the_same_bits(dtype):
    M, N, K = 13, 7, 31
    a, b = exact_operands(np.random.default_rng(3), M, N, K, dtype)
    if dtype == "f32":
        a, b = np.round(a * 4), np.round(b * 4)      # int64 copies equal them
    config = {"bm": 8, "bn": 16, "bk": 8 if dtype != "f32" else 7, "kstep": 2}
    want = poisoned_run(gemm_maker(a, b, dtype, pool_of(1)), config)
    assert_gemm(want, a, b, dtype)
    for (name_a, fa), (name_b, fb) in zip(_forms(a).items(), _forms(b).items()):
        got = poisoned_run(gemm_maker(fa, fb, dtype, pool_of(1)), config)
        assert got.dtype == want.dtype and np.array_equal(got, want), (name_a, name_b)


@pytest.mark.parametrize("a_shape, b_shape", [((5, 7), (8, 3)), ((5, 7), (70, 3)), ((5, 7), (7,)), ((7,), (7, 3))])
def test_gemm_refuses_operands_that_do_not_multiply(a_shape, b_shape):
    """a (5, 7) @ b (8, 3) used to return a @ b[:7] (b's K blocks beyond A's never read): silently wrong."""
    a, b = np.ones(a_shape, np.float32), np.ones(b_shape, np.float32)
    with pytest.raises(ValueError, match=r"\(M, K\).*\(K, N\)"):
        gemm_maker(a, b, "f32", pool_of(1))


@pytest.mark.parametrize("which, values, fix", [
    ("a", [[-1, 2], [3, 4]], r"uint8 \(0\.\.255\)"), ("a", [[256, 0], [0, 0]], r"uint8 \(0\.\.255\)"),
    ("b", [[128, 0], [0, 0]], r"int8 \(-128\.\.127\)"), ("b", [[0.5, 0], [0, 0]], r"int8 \(-128\.\.127\)"),
    ("a", [[np.nan, 0], [0, 0]], r"uint8 \(0\.\.255\)")])
def test_int8_gemm_refuses_values_its_operands_cannot_hold(which, values, fix):
    """u8 A x s8 B: an int64 A holding -1 used to become 255 (astype wraps), 0.5 in B 0: silently wrong."""
    ok = {"a": np.array([[1, 2], [3, 4]]), "b": np.array([[1, -2], [3, 4]])}
    ok[which] = np.array(values)
    with pytest.raises(ValueError, match=f"{which} holds values that {fix} cannot hold"):
        gemm_maker(ok["a"], ok["b"], "i8", pool_of(1))
    assert_gemm(poisoned_run(gemm_maker(np.array([[255, 0]]), np.array([[-128], [127]]), "i8", pool_of(1)), {}),
                np.array([[255, 0]]), np.array([[-128], [127]]), "i8")


def test_gemm_refuses_complex_operands_unknown_dtypes_and_no_k_step():
    a = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match=r"complex.*a\.real"):
        gemm_maker(a + 1j, a.T, "f32", pool_of(1))
    with pytest.raises(ValueError, match="dtype='f16'; expected one of f32, bf16, i8"):
        gemm_maker(a, a.T, "f16", pool_of(1))
    make = gemm_maker(a, a.T, "f32", pool_of(1))
    for kstep in (0, -1, 1.5):
        with pytest.raises(ValueError, match=f"kstep={kstep!r}; expected a positive int"):
            make(kstep=kstep)
    for knob in ("bm", "bn", "bk"):                 # bn=0 used to mean the default block
        with pytest.raises(ValueError, match="b=0; expected an int >= 1"):
            make(**{knob: 0})


@pytest.mark.parametrize("M, N, K", [(0, 5, 3), (4, 0, 3), (4, 5, 0), (0, 0, 0)])
def test_empty_dimensions_give_numpys_result(M, N, K):
    """K = 0 used to raise 'max() arg is an empty sequence' (largest_divisor of no K blocks)."""
    a, b = np.ones((M, K), np.float32), np.ones((K, N), np.float32)
    for dtype in ("f32", "i8"):
        got = poisoned_run(gemm_maker(a, b, dtype, pool_of(1)), {"bm": 8, "bn": 16, "bk": 8})
        assert got.shape == (M, N) and not got.any()


# -- NaN and inf: where NumPy puts them and nowhere else ------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("isa", native_levels())
def test_nan_and_inf_land_where_numpy_puts_them(isa, dtype):
    """Non-finite values in the last valid K column and the first of a row (next to the K padding and a
    VNNI pair's odd half): the padding never turns them into NaN elsewhere (inf x 0), in edge blocks or not."""
    rng = np.random.default_rng(5)
    with kernel_level(isa):
        for M, N, K, bk in [(5, 3, 31, 31), (9, 17, 7, 7), (5, 3, 62, 31), (6, 5, 9, 3)]:
            for bad in (np.inf, -np.inf, np.nan):
                a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
                a[1, 0] = a[3, K - 1] = bad
                b[K - 1, 1] = bad
                cast = tpp.dtypes.dtype(dtype)
                with np.errstate(invalid="ignore"):
                    ref = a.astype(cast).astype(np.float64) @ b.astype(cast).astype(np.float64)
                for edges in (True, False):
                    for bm in (8, 2):
                        got = poisoned_run(gemm_maker(a, b, dtype, pool_of(1)),
                                           {"bm": bm, "bn": 16, "bk": bk, "kstep": 1, "edges": edges})
                        what = f"{isa} {dtype} {M}x{N}x{K} bk={bk} {bad} edges={edges} bm={bm}"
                        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=what)
                        np.testing.assert_array_equal(np.isinf(got) * np.sign(got), np.isinf(ref) * np.sign(ref),
                                                      err_msg=what)


# -- threads ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "bf16", "i8"])
def test_two_threads_give_one_threads_bits(dtype):
    """The K loop is serial in every spec: each C block sums in one order, whatever the threads."""
    M, N, K = 131, 67, 97
    a, b = bg.operands(np.random.default_rng(11), M, N, K, dtype)
    config = {"bm": 16, "bn": 16, "bk": 16, "kstep": 2}
    one = poisoned_run(gemm_maker(a, b, dtype, pool_of(1)), config)
    bg._check(one, bg.reference(a, b, dtype), dtype, "1 thread")
    for spec in ("aBC", "BCa", "cBab", "bcaBCb", "aCB", "aB{R:2}C{C:1}", "bC{R:2}aB{C:1}cb"):
        gemm, arrays, output = gemm_maker(a, b, dtype, pool_of(2), spec=spec)(**config)
        for _ in range(2):
            arrays[2][...] = np.nan if dtype != "i8" else -1     # each call writes C, never adds to it
            gemm(*arrays)
            assert np.array_equal(one, output()), spec


def test_two_thread_mlp_gives_one_threads_bits():
    T, C = 67, 45
    x = np.random.default_rng(2).standard_normal((T, C)).astype(np.float32)
    params = mlp_weights(C, 2)
    outs = []
    for threads in (1, 2):
        chain = _chain(mlp_maker(x, params, "f32", pool_of(threads), spec="BCa")(bm=16, bc=16))
        chain()
        outs.append(chain.output())
    assert np.array_equal(*outs)


def test_mlp_refuses_weights_that_do_not_chain():
    """x (3, 7) with a (5, 5) weight used to give x[:, :5] @ w padded, a (7, 9) one 7 columns of 9: silently."""
    x = np.ones((3, 7), np.float32)
    for w, bias in [(np.ones((5, 5)), np.zeros(7)), (np.ones((7, 9)), np.zeros(7)), (np.ones((7, 7)), np.zeros(5))]:
        with pytest.raises(ValueError, match=r"\(7, 7\).*\(7,\)"):
            mlp_maker(x, [(w.astype(np.float32), bias.astype(np.float32))], "f32", pool_of(1))(bm=4, bc=16)
    build = mlp_maker(x, [(np.ones((7, 7), np.float32), np.zeros(7, np.float32))], "f32", pool_of(1))
    for knobs in ({"bm": 0}, {"bc": 0}):         # bc=0 used to mean the default block
        with pytest.raises(ValueError, match="b=0; expected an int >= 1"):
            build(**knobs)


def test_the_benchs_own_checks_fail_on_nan():
    """bench gemm / mlp check their result before timing it; a NaN result made the error NaN, and NaN > tol is False."""
    import bench.mlp as bm
    with pytest.raises(AssertionError, match="relative error nan"):
        bg._check(np.array([[1.0, np.nan]], np.float32), np.ones((1, 2)), "f32", "x")
    x, params = np.ones((1, 2), np.float32), [(np.eye(2, dtype=np.float32), np.zeros(2, np.float32))]
    with pytest.raises(AssertionError, match="relative error nan"):
        bm._check(np.array([[1.0, np.nan]], np.float32), x, params, "f32")


# -- the tuner on an odd shape ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "bf16", "i8"])
def test_a_tiny_tuning_budget_finds_a_right_config_for_an_odd_shape(dtype, monkeypatch):
    monkeypatch.setattr(bg, "FRESH", True)           # nothing read or written on disk
    M, N, K = 67, 13, 31
    a, b = exact_operands(np.random.default_rng(13), M, N, K, dtype)
    make = gemm_maker(a, b, dtype, pool_of(2))
    found = bg.tuned(make, gemm_configs(M, N, K, dtype, quick=True), 2, ("gemm-adv", dtype, M, N, K, 2), False)
    found()
    assert_gemm(found.output(), a, b, dtype, "tuned")
    assert_gemm(poisoned_run(make, found.record["knobs"], found.record["spec"]), a, b, dtype, str(found.record))


def test_a_tiny_tuning_budget_finds_a_right_mlp_for_an_odd_shape(monkeypatch):
    monkeypatch.setattr(bg, "FRESH", True)
    T, C = 37, 29
    x = np.random.default_rng(17).standard_normal((T, C)).astype(np.float32)
    params = mlp_weights(C, 2)
    found = bg.tuned(layer_maker(x, params, "f32", pool_of(2)), mlp_configs(T, C, True), 2, ("mlp-adv", T, C), False)
    layer, acts, weights, biases, output = mlp_maker(x, params, "f32", pool_of(2))(**found.record["knobs"])
    for act in acts[1:]:
        act[...] = np.nan
    _chain((layer.with_spec(found.record["spec"]), acts, weights, biases, output))()
    ref = x.astype(np.float64)
    for w, bias in params:
        ref = np.maximum(ref @ w + bias, 0)
    np.testing.assert_allclose(output(), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


# -- layout helpers ---------------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(rows=st.integers(0, 13), cols=st.integers(0, 13), bm=st.integers(1, 6), bk=st.integers(1, 6),
       outer=st.sampled_from("mn"), dtype=st.sampled_from(["f32", "bf16", "i8", "f64"]),
       form=st.sampled_from(["fortran", "transposed", "strided", "unaligned", "readonly", "plain"]),
       nan=st.booleans())
def test_block_round_trips_any_form_and_pads_with_true_zeros(rows, cols, bm, bk, outer, dtype, form, nan):
    dt = np.float64 if dtype == "f64" else tpp.dtypes.dtype(dtype)
    x = np.random.default_rng(rows * 31 + cols).standard_normal((rows, cols)).astype(dt)
    if nan and dtype != "i8":
        x[...] = np.nan                                   # the padding must still be zeros, not x's values
    x = _forms(x).get(form, x) if x.size else x
    mb, kb = tpp.nblocks(rows, bm), tpp.nblocks(cols, bk)
    xb = tpp.block(x, bm, bk, outer=outer, pad=True)
    assert xb.shape == ((mb, kb) if outer == "m" else (kb, mb)) + (bm, bk) and xb.dtype == x.dtype
    assert xb.flags.c_contiguous and xb.flags.writeable and xb.ctypes.data % 64 == 0
    full = tpp.unblock(xb, outer=outer)
    assert not full[rows:].astype(np.float64).any() and not full[:, cols:].astype(np.float64).any()
    back = tpp.unblock(xb, outer=outer, shape=(rows, cols))
    assert back.shape == (rows, cols)
    assert np.ascontiguousarray(back).tobytes() == np.ascontiguousarray(x).tobytes()
    if rows % bm == 0 and cols % bk == 0:                  # pad=False agrees where the blocks divide
        assert tpp.block(x, bm, bk, outer=outer).tobytes() == xb.tobytes()


@pytest.mark.parametrize("bm, bk, words", [
    (0, 2, "bm=0 must be a positive int"), (-3, 2, "bm=-3 must be a positive int"),
    (5, 0, "bk=0 must be a positive int"), (5, -1, "bk=-1 must be a positive int"),
    (5, 2.0, "bk=2.0 must be a positive int"), (4, 7, "bm=4 does not divide 5; pass a divisor of 5, or pad=True"),
    (5, 2, "bk=2 does not divide 7; pass a divisor of 7, or pad=True")])
def test_block_refusals_name_the_fix(bm, bk, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(".", r"\.")):
        tpp.block(np.ones((5, 7), np.float32), bm, bk)
