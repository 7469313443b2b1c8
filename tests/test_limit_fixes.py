"""Limits of time and memory: ``assert_matches_reference`` keeps no hypothesis deadline of its own
and checks a kernel with a huge leading dimension without touching its padding, and the bench
suites refuse sizes whose arrays exceed the machine's memory (read with ``os.sysconf``, patched
here: no test allocates more than a few MiB)."""
import time
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import settings, strategies as st
from hypothesis.errors import DeadlineExceeded

import bench.gemm
import bench.linear
import bench.mlp
import bench.options
import tppasm as tpp
import tppasm.testing as testing
from tppasm.testing import Guarded, assert_matches_reference, poison_bits
from tests.test_bench_cli import refused


@pytest.fixture
def profile_deadline():
    """``use(ms)``: load a profile like the active one with hypothesis' deadline set to ``ms``."""
    previous = settings.get_current_profile_name()

    def use(ms):
        settings.register_profile("limit-deadline", parent=settings.get_profile(previous), max_examples=2,
                                  deadline=timedelta(milliseconds=ms))
        settings.load_profile("limit-deadline")
    yield use
    settings.load_profile(previous)


_ONE_CASE = st.just((np.array([[-1.0, 2.0, -3.0]], np.float32),))   # nothing to shrink: a short failure


@pytest.fixture
def slow_check(monkeypatch):
    """``slow(seconds)``: each example's check takes ``seconds`` longer (a large kernel's check)."""
    def slow(seconds):
        check = testing.check

        def slowed(*args, **kwargs):
            time.sleep(seconds)
            return check(*args, **kwargs)
        monkeypatch.setattr(testing, "check", slowed)
    return slow


def test_a_slow_check_is_no_deadline_failure(profile_deadline, slow_check):
    profile_deadline(200)                      # hypothesis' default, which failed brgemm(512, 512, 512)
    slow_check(0.3)
    assert_matches_reference(tpp.relu(1, 3), _ONE_CASE)


def test_a_deadline_the_profile_chose_is_kept(profile_deadline, slow_check):
    profile_deadline(20)
    slow_check(0.05)
    with pytest.raises(DeadlineExceeded):
        assert_matches_reference(tpp.relu(1, 3), _ONE_CASE)


def _rows_apart(ld):
    """A (2, 4) fp32 view whose rows are ``ld`` elements apart (virtual: its padding is never touched)."""
    return np.zeros((2, ld), np.float32)[:, :4]


def test_a_huge_leading_dimension_poisons_windows_around_the_rows_only():
    x = _rows_apart(10 ** 7)
    copy = Guarded(x, poison_bits(np.float32, 0))
    assert sum(stop - start for start, stop in copy.windows) < 1 << 16     # guards of 64 KiB and rows
    assert np.array_equal(copy.view, x) and not len(copy.outside_changed())
    past_row_0 = (copy.view.ctypes.data - copy.buffer.ctypes.data) // 4 + 4
    copy.buffer[past_row_0] = 1.0
    assert list(copy.outside_changed()) == [past_row_0]


def test_a_small_padding_is_poisoned_whole():
    copy = Guarded(_rows_apart(1000), poison_bits(np.float32, 0))
    assert copy.windows == [(0, len(copy.buffer))]


class _PastRow0:
    """A relu that then writes one element past its output's first row (a planted bug)."""

    def __init__(self, k):
        self.k = k

    def __getattr__(self, name):
        return getattr(self.k, name)

    def __call__(self, x, out):
        self.k(x, out)
        np.lib.stride_tricks.as_strided(out, (1, 5), out.strides)[0, 4] = 7.0


def test_a_huge_leading_dimension_is_checked_quickly_and_still_guarded():
    k = tpp.unary("relu", 2, 4, ldx=10 ** 7, ldo=10 ** 7)
    started = time.perf_counter()
    assert_matches_reference(k, max_examples=3)
    assert time.perf_counter() - started < 4           # a bound on a hang (it took 65 s), no speed claim
    with pytest.raises(AssertionError, match="out: 1 element was written outside the operand"):
        assert_matches_reference(_PastRow0(k), max_examples=3)


def test_physical_memory_is_read_from_sysconf(monkeypatch):
    values = {"SC_PHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(bench.options.os, "sysconf", values.__getitem__)
    assert bench.options.physical_memory() == 4096000


@pytest.fixture
def one_gib(monkeypatch):
    monkeypatch.setattr(bench.options, "physical_memory", lambda: 1 << 30)


@pytest.mark.parametrize("parse, argv, words", [
    (bench.gemm.parse, ["--sizes", "512,8192"], "argument --sizes: 8192x8192x8192: the arrays need about 1.5 GiB, "
                                                "more than this machine's 1.0 GiB of memory; choose less"),
    (bench.gemm.parse, ["--sizes", "16384x16384x1"], "argument --sizes: 16384x16384x1: the arrays need about 3.0 GiB"),
    (bench.mlp.parse, ["--rows", "8192", "--channels", "8192"],
     "argument --rows/--channels: 8192 rows, 8192 channels, 4 layers: the arrays need about 2.4 GiB"),
    (bench.mlp.parse, ["--channels", "8192"], "argument --channels: 1024 rows, 8192 channels, 4 layers"),
    (bench.linear.parse, ["--shapes", "1x16x16", "--sweep-mib", "2048"],
     "argument --sweep-mib: 2048: the arrays need about 2.0 GiB, more than this machine's 1.0 GiB"),
    (bench.linear.parse, ["--shapes", "16384x16384x1"], "argument --shapes: 16384x16384x1: the arrays need about 1.0"),
])
def test_bench_options_beyond_memory_arerefused(one_gib, capsys, parse, argv, words):
    assert words in refused(capsys, parse, argv)


@pytest.mark.parametrize("parse, argv", [
    (bench.gemm.parse, ["--sizes", "4096"]),
    (bench.mlp.parse, ["--rows", "4096", "--channels", "4096"]),
    (bench.linear.parse, ["--shapes", "1x16x16", "--sweep-mib", "512"]),
])
def test_bench_options_within_memory_are_accepted(one_gib, parse, argv):
    parse(argv)
