"""A loop kernel keeps a bounded number of compiled nests (one per array signature) and of spec
variants, most recent first: a long-running process that meets ever new shapes, strides or specs
once grew by ~24 KiB of memory and 12 KiB of code a nest, without end."""
import gc
import weakref

import numpy as np
import pytest

import tppasm
from isa.memory import mapped
from loops import Loop, decorator, kernel


@pytest.fixture
def small_bounds(monkeypatch):
    monkeypatch.setattr(decorator, "NESTS", 4)
    monkeypatch.setattr(decorator, "VARIANTS", 3)


def _relu_rows():
    relu = tppasm.relu(2, 8)

    @kernel("A", Loop(0, 2))
    def k(i, X, Y):
        relu(X[i], Y[i])
    return k


def test_nests_of_new_signatures_replace_the_least_recent(small_bounds):
    k = _relu_rows()
    x = -np.arange(2 * 2 * 8, dtype=np.float32).reshape(2, 2, 8) + 5
    k(x, np.empty_like(x))
    gc.collect()
    code = mapped()[1]
    for extra in range(1, 30):                    # a new signature each call: more leading rows
        big = np.concatenate([x, np.zeros((extra, 2, 8), np.float32)])
        out = np.full_like(big, np.nan)
        k(big, out)
        assert np.array_equal(out[:2], np.maximum(x, 0))
        assert len(k._bound) <= 4
    gc.collect()
    assert mapped()[1] <= code + 4 * 64 * 1024     # the code of at most 4 more nests
    out = np.empty_like(x)
    k(x, out)                                      # the first signature, dropped long ago: compiled again
    assert np.array_equal(out, np.maximum(x, 0))


def test_spec_variants_are_bounded_and_dropped_ones_are_collected(small_bounds):
    k = _relu_rows()
    x = np.ones((2, 2, 8), np.float32)
    first = weakref.ref(k.with_spec("A@schedule(dynamic,1)"))
    for chunk in range(2, 12):
        out = np.zeros_like(x)
        k.with_spec(f"A@schedule(dynamic,{chunk})")(x, out)
        assert (out == 1).all() and len(k._variants) <= 3
    gc.collect()
    assert first() is None               # not kept by the family of variants that share hooks
    assert k.with_spec("A@schedule(dynamic,11)") is k.with_spec("A@schedule(dynamic,11)")    # recent: cached


def test_a_hook_still_reaches_every_live_variant(small_bounds):
    k = _relu_rows()
    x, seen = np.ones((2, 2, 8), np.float32), []
    v = k.with_spec("A@schedule(dynamic,1)")
    v(x, np.empty_like(x))

    @k.init
    def count(X, Y):
        seen.append(1)
    v(x, np.empty_like(x))                # its compiled nest was dropped: the hook runs
    assert seen
