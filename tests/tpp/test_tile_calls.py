"""``tile_setup=False`` AMX BRGEMMs outside a configured nest: a Python call configures the tiles
(:mod:`tppasm.tile_calls`), and a nest whose init does not load the configuration its body's kernels
expect is refused when it is built (:mod:`loops.tile_state`). Before, a Python call died of SIGILL on
an AMX core (no configuration) or summed on another kernel's tile shapes."""
import copy
import pickle

import numpy as np
import pytest

import tppasm as tpp
from isa.cpu import host
from loops import Loop, kernel
from loops.bind import traced_trees
from tests.support import run_raw
from tppasm.kernel import ISAUnavailableError, Kernel
from tppasm.tile_calls import SelfConfiguring

BF16 = tpp.dtypes.dtype("bf16")
AMX = host().isa == "amx"


def _operands(m, n, k, rng):
    a = rng.integers(-3, 4, (1, m, k)).astype(BF16)
    b = rng.integers(-3, 4, (k, n)).astype(BF16)
    return a, b, tpp.vnni_pack(b, 2)[None], np.full((m, n), np.nan, np.float32)


def test_a_python_call_runs_the_kernel_that_configures_itself():
    g = tpp.brgemm(16, 16, 32, dtype="bf16", tile_setup=False, isa="amx")
    assert isinstance(g, SelfConfiguring) and g.kernel.desc.tile_setup is False and g.desc is g.kernel.desc
    a, b, bv, c = _operands(16, 16, 32, np.random.default_rng(0))
    if AMX:
        g(a, bv, c)
        np.testing.assert_array_equal(c, a[0].astype(np.float32) @ b.astype(np.float32))
    else:
        with pytest.raises(ISAUnavailableError):
            g(a, bv, c)
    python = g.__dict__["python_kernel"]     # (made by the call above)
    assert isinstance(python, Kernel) and python.desc == g.desc.__class__(**{**vars(g.desc), "tile_setup": True})
    # that kernel, run with no configuration loaded (a fresh interpreter), configures itself and sums right
    c[:] = np.nan
    run_raw(python, (a, bv, c), (1,), interpret=True)
    np.testing.assert_array_equal(c, a[0].astype(np.float32) @ b.astype(np.float32))


def test_the_wrapper_is_the_kernel_for_everything_else():
    g = tpp.brgemm(16, 16, 32, dtype="bf16", tile_setup=False, isa="amx")
    assert g is tpp.brgemm(16, 16, 32, dtype="bf16", tile_setup=False, isa="amx")
    assert copy.copy(g) is g and pickle.loads(pickle.dumps(g)) is g
    assert g.raw is g.kernel.raw and g.isa == "amx" and repr(g) == repr(g.kernel)
    assert tpp.tileconfig(g).desc.gemm == g.desc


@pytest.mark.parametrize("make", [
    lambda: tpp.brgemm(16, 16, 32, dtype="bf16", isa="amx"),                      # configures itself already
    lambda: tpp.brgemm(16, 16, 32, tile_setup=False, isa="amx"),                  # fp32: AVX-512 code, no tiles
    lambda: tpp.brgemm(16, 16, 32, dtype="bf16", tile_setup=False, isa="avx512"),
])
def test_kernels_without_that_contract_stay_plain(make):
    assert isinstance(make(), Kernel) and not isinstance(make(), SelfConfiguring)


def test_an_offset_batch_called_from_python_configures_itself():
    g = tpp.brgemm(16, 16, 32, dtype="i8", tile_setup=False, isa="amx", batch="offset")
    assert g.kernel.desc.tile_setup is True and g.kernel.desc.batch == "offset"


def _nest(gemm, init=None, others=()):
    @kernel("aB", Loop(0, 2, parallel=False), Loop(0, 2))
    def mm(ik, im, A, B, C):
        gemm(A[im, ik:], B[ik:], C[im], count=1)
        for other in others:                 # a 16x16x16 BRGEMM on the first half of the same blocks
            other(A[im, ik:, :, :16], B[ik:, :8], C[im], count=1)
    if init is not None:
        @mm.init
        def setup(A, B, C):
            init()
    return mm


def _nest_operands():
    A = np.zeros((2, 2, 16, 32), BF16)
    return A, np.zeros((2, 16, 16, 2), BF16), np.zeros((2, 16, 16), np.float32)


def test_a_nest_whose_init_loads_the_configuration_is_built_on_the_kernel_itself():
    g = tpp.brgemm(16, 16, 32, dtype="bf16", tile_setup=False, isa="amx")
    mm = _nest(g, tpp.tileconfig(g))
    body, init, _ = traced_trees(mm, _nest_operands())
    assert [c.kernel for c in body.all_calls()] == [g.kernel]          # not the one Python calls run
    assert [c.kernel.desc.kind for c in init.all_calls()] == ["amx_tileconfig"]
    if AMX:
        mm(*_nest_operands())
    else:
        with pytest.raises(ISAUnavailableError):
            mm(*_nest_operands())


@pytest.mark.parametrize("case, message", [
    ("no init", "this nest's init loads none; add an init hook that calls tppasm.tileconfig"),
    ("other shapes", r"expects other tile shapes than the configuration the nest's init loads \(tppasm.tileconfig "
                     r"of the 16x16x16 BRGEMM\)"),
    ("a self-configuring kernel beside it", "a tile_setup=True AMX BRGEMM loads its own tile configuration"),
])
def test_a_nest_that_would_run_on_the_wrong_tiles_is_refused(case, message):
    g = tpp.brgemm(16, 16, 32, dtype="bf16", tile_setup=False, isa="amx")
    mm = {"no init": lambda: _nest(g),
          "other shapes": lambda: _nest(g, tpp.tileconfig(tpp.brgemm(16, 16, 16, dtype="bf16", tile_setup=False,
                                                                      isa="amx"))),
          "a self-configuring kernel beside it": lambda: _nest(g, tpp.tileconfig(g), others=(
              tpp.brgemm(16, 16, 16, dtype="bf16", isa="amx", lda=32, beta=1),)),
          }[case]()
    with pytest.raises(TypeError, match=message):
        mm(*_nest_operands())


def test_a_block_spmm_on_tiles_beside_a_no_setup_brgemm_is_refused():
    """The AMX block_spmm leaves its own tile configuration loaded: the nest's next BRGEMM would run on
    its tile shapes."""
    g = tpp.brgemm(16, 16, 32, dtype="bf16", tile_setup=False, isa="amx")
    spmm = tpp.block_spmm(bm=16, bk=16, n=16, kb=2, dtype="bf16", isa="amx")
    rowptr, colidx, values = tpp.spmm.bcsr(np.ones((16, 32), np.float32), 16, 16, dtype="bf16")

    @kernel("a", Loop(0, 2))
    def both(i, A, B, C, R, I, V, D, E):
        g(A[i, 0:], B[0:], C[i], count=1)
        spmm(R, I, V, D, E, count=2)

    @both.init
    def setup(*arrays):
        tpp.tileconfig(g)()
    A, B, C = _nest_operands()
    E = np.zeros((16, 16), np.float32)
    with pytest.raises(TypeError, match="runs on AMX tiles and loads its own tile configuration"):
        both(A, B, C, rowptr, colidx, values, tpp.vnni_pack(np.zeros((32, 16), BF16), 2), E)
