"""The cost model: working sets, traffic per cache level and thread shares against hand counts."""
import numpy as np
import pytest

import tppasm as tpp
from isa.cpu import Cache
from loops import Loop, LoopKernel, kernel
from loops.cost import Machine, Model, _footprint, time_kernel
from tppasm.operand import OperandSpec

KB = 1024


def gemm_nest(mb=8, nb=8, kb=4, size=32):
    gemm = tpp.brgemm(m=size, n=size, k=size, beta=1)

    @kernel("aBC", Loop(0, kb), Loop(0, mb), Loop(0, nb))
    def mm(ik, im, jn, A, B, C):
        gemm(A[im, ik:ik + 1], B[jn, ik:ik + 1], C[im, jn], count=1)
    A = np.zeros((mb, kb, size, size), np.float32)
    B = np.zeros((nb, kb, size, size), np.float32)
    C = np.zeros((mb, nb, size, size), np.float32)
    return mm, (A, B, C)


def machine(l1=32 * KB, l2=1024 * KB, l3=32768 * KB, threads=1):
    return Machine((Cache(1, l1), Cache(2, l2), Cache(3, l3, shared=2)), (64e9, 32e9, 16e9), 100e9, threads)


def test_traffic_matches_a_hand_count():
    mm, arrays = gemm_nest()             # 4 KiB blocks; A, B 128 KiB each, C 256 KiB: all fit L2
    est = Model(mm, arrays, machine()).predict("aBC")
    # L1 (24 KiB usable): one jn sweep touches A 4 + B 8x4 + C 8x4 KiB > 24, one body 12 KiB fits:
    # per (ik, im) the sweep brings B and C (C read and written back) and A once: 4 + 32 + 2 * 32
    assert est.traffic == (4 * 8 * (4 + 32 + 64) * KB, 0.0, 0.0)
    # K innermost ('BCa'): per (im, jn) A and B 4 blocks each, C read and written once
    assert Model(mm, arrays, machine()).predict("BCa").traffic[0] == 64 * (16 + 16 + 8) * KB


def test_nothing_moves_when_everything_fits_and_compute_is_the_calls():
    mm, arrays = gemm_nest()
    est = Model(mm, arrays, machine(l1=4 << 20)).predict("aBC")
    calls = 4 * 8 * 8
    assert est.traffic == (0.0, 0.0, 0.0) and est.memory == 0
    assert est.compute == pytest.approx(calls * 2 * 32 ** 3 / 100e9)


def test_parallel_loops_share_the_iterations():
    mm, arrays = gemm_nest(mb=7)
    serial = Model(mm, arrays, machine(l1=4 << 20, threads=2)).predict("abc")
    parallel = Model(mm, arrays, machine(l1=4 << 20, threads=2)).predict("aBC")
    # 7 x 8 = 56 collapsed iterations on 2 threads: 28 each
    assert parallel.compute == pytest.approx(serial.compute * 28 / 56)
    grid = Model(mm, arrays, machine(l1=4 << 20, threads=2)).predict("aB{R:2}C{C:1}")
    assert grid.compute == pytest.approx(serial.compute * 4 / 7)          # rows split 4 + 3


def test_conditional_calls_count_by_how_often_they_run():
    zero = tpp.zero(8, 8)

    @kernel("ab", Loop(0, 10), Loop(0, 4))
    def k(i, j, X):
        if i == 0:
            zero(X[j])
    X = np.zeros((4, 8, 8), np.float32)
    est = Model(k, (X,), machine(), kernel_seconds=lambda kern, scalars: 1.0).predict("ab")
    assert est.compute == pytest.approx(40 * 0.1)


def test_footprint_of_strided_and_batched_operands():
    dense = OperandSpec("a", "f32", (4, 8), (8, 1))
    rows = OperandSpec("a", "f32", (4, 8), (32, 1))
    batched = OperandSpec("a", "f32", (4, 8), (256, 32, 1), batch=True)
    assert _footprint(dense, 1, 4) == (128, 128, 1)
    assert _footprint(rows, 1, 4) == (128, 32, 4)
    assert _footprint(batched, 3, 4) == (3 * 128, 32, 12)


def test_invalid_specs_raise_spec_errors():
    mm, arrays = gemm_nest()
    model = Model(mm, arrays, machine())
    with pytest.raises(ValueError, match="block"):
        model.predict("aBCb")                 # loop b has no block sizes declared


def test_time_kernel_times_one_hot_call():
    gemm = tpp.brgemm(m=16, n=16, k=16)
    seconds = time_kernel(gemm, (4,), LoopKernel)
    assert 0 < seconds < 1e-3
