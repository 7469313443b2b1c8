"""tppasm.fc_calls: fc's kernel calls recorded once and replayed on other operands, and
fc_parallel.panel_shares, the threads' shares of a product's panels (whole, or a panel's rows cut)."""
import functools
import multiprocessing

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isa.pool import Pool, get_pool
from tppasm import fc, fc_calls, unary
from tppasm.dtypes import dtype as D
from tppasm.fc_parallel import UNEVEN, panel_shares

from tests.tpp.test_fc import check_layer, close, nan, panels_from, split_rows


def share_work(share):
    return sum((c1 - c0) * (hi - lo) for c0, c1, lo, hi in share)


@given(m=st.integers(1, 700), width=st.sampled_from([16, 64]), rows=st.integers(1, 400), parts=st.integers(1, 6))
def test_panel_shares_cover_every_row_of_every_panel_once(m, width, rows, parts):
    panels = [(c, min(m, c + width)) for c in range(0, m, width)]
    shares = panel_shares(panels, rows, parts)
    assert 1 <= len(shares) <= parts and all(shares)
    pieces = {}
    for share in shares:
        for c0, c1, lo, hi in share:
            assert (c0, c1) in panels and 0 <= lo < hi <= rows
            pieces.setdefault((c0, c1), []).append((lo, hi))
    for panel in panels:
        runs = sorted(pieces.pop(panel))
        assert runs[0][0] == 0 and runs[-1][1] == rows and all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
    assert not pieces
    # no worse than whole panels in runs of about equal columns; within UNEVEN of equal shares where rows allow
    whole = max(share_work(s) for s in panel_shares(panels, rows, parts, grain=rows + 1))
    most = max(map(share_work, shares))
    assert most <= whole
    if rows >= 64 and len(panels) >= parts:
        assert most <= m * rows / parts * (1 + UNEVEN) + 16 * width


def test_an_odd_count_of_panels_is_shared_evenly():
    """5 panels of 300 columns on 2 threads: the middle panel's rows cut, not 3 panels against 2."""
    shares = panel_shares([(c, min(300, c + 64)) for c in range(0, 300, 64)], 700, 2)
    assert [share_work(s) for s in shares] == [64 * 700 * 2 + 64 * 240, 64 * 460 + 64 * 700 + 44 * 700]
    assert shares[0][-1] == (128, 192, 0, 240) and shares[1][0] == (128, 192, 240, 700)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(17, 200), m=st.sampled_from([80, 150, 200, 300]), k=st.sampled_from([24, 64, 100, 192]),
       dt=st.sampled_from(fc.DTYPES), act=st.sampled_from([None, "relu"]), threads=st.sampled_from([2, 3]),
       seed=st.integers(0, 2 ** 16))
def test_shares_with_cut_panels_match_numpy(n, m, k, dt, act, threads, seed):
    """Products of an odd number of panels (every weight in panels of 64) on 2 and 3 threads, the
    forward's and the backward's (dx, dw), twice: recorded, then replayed on new operands."""
    with split_rows(), panels_from(0):
        for again in range(2):
            check_layer(n, m, k, dt, act, bias=True, threads=threads, seed=seed + again, scale=k ** -0.5)


def gemm_case(rows, m, k, seed):
    rng = np.random.default_rng(seed)
    a, w = rng.standard_normal((rows, k), np.float32), rng.standard_normal((m, k), np.float32)
    return a, w, a.astype(np.float64) @ w.astype(np.float64).T


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows, m, k, panel", [(100, 300, 64, 64), (300, 40, 256, None), (9, 130, 33, 16)])
def test_calls_are_recorded_once_and_replayed_on_new_operands(monkeypatch, threads, rows, m, k, panel):
    recorded = []
    record = fc_calls.Replay.record.__func__
    monkeypatch.setattr(fc_calls.Replay, "record",
                        classmethod(lambda cls, *args, **kw: recorded.append(1) or record(cls, *args, **kw)))
    g = fc.PanelGemm(rows, m, k, threads=threads, panel=panel, min_flops=1)
    for seed in range(3):
        a, w, want = gemm_case(rows, m, k, seed)
        c = nan((rows, m), "f32")
        g(a, w, c)
        close(c, want, np.abs(a) @ np.abs(w).T, "f32")
    if len(g.panels) > 1 or len(g.runs) > 1 or len(g.runs[0]) > 1:      # (one call of all rows: no replay)
        assert len(recorded) == 1 and len(g.replays.by_layouts) == 1
    # another layout (a bias, or w packed) is recorded apart, and the first is still replayed right
    a, w, want = gemm_case(rows, m, k, 7)
    bias = np.arange(m, dtype=np.float32)
    g2 = fc.PanelGemm(rows, m, k, threads=threads, panel=panel, min_flops=1, bias=True)
    c = nan((rows, m), "f32")
    g2(a, w, c, bias)
    close(c, want + bias, np.abs(a) @ np.abs(w).T + bias, "f32")


def test_operands_in_one_another_are_not_recorded_but_still_run():
    """x as its own weight: a call's pointer lies in two operands, so the calls run as built."""
    x = np.random.default_rng(0).standard_normal((300, 300)).astype(np.float32)
    with panels_from(0):
        for _ in range(2):
            y = fc.forward(x, x, threads=2)[0]
            close(y, x.astype(np.float64) @ x.T, np.abs(x) @ np.abs(x).T, "f32")
    assert fc_calls.Replay.record([[functools.partial(unary("relu", 1, 4), x[None, 0, :4], x[None, 0, :4])]],
                                  (x, x)) is None


def test_a_replay_refuses_a_pool_of_fewer_threads():
    k = unary("relu", 1, 4)
    x, y = np.arange(-2.0, 2.0, dtype=np.float32), np.full(4, np.nan, np.float32)
    shares = [[functools.partial(k, x[None], y[None])], []]
    replay = fc_calls.Replay.record(shares, (x, y)) if get_pool().nthreads >= 2 else None
    if replay is not None:
        replay.lists = get_pool().nthreads + 1
        assert replay.run((x, y)) is False and np.isnan(y).all()


def test_run_table_refuses_lists_beyond_the_pool_and_a_closed_pool():
    pool = Pool(1)
    with pytest.raises(ValueError, match="lists=2"):
        pool.run_table(1 << 20, 2)
    pool.close()
    with pytest.raises(ValueError, match="closed"):
        pool.run_table(1 << 20, 1)


def _forward_in_child(x, w):
    return fc.forward(x, w, threads=2)[0]


def test_a_forked_child_replays_what_its_parent_recorded():
    x, w = np.ones((64, 700), np.float32), np.ones((300, 700), np.float32)
    with panels_from(0):
        fc.forward(x, w, threads=2)                         # recorded here
        with multiprocessing.get_context("fork").Pool(1) as pool:
            y = pool.apply_async(_forward_in_child, (x * 2, w)).get(timeout=60)
    assert (y == 1400).all()


def test_bf16_shares_match_numpy():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((130, 96)).astype(D("bf16"))
    w = rng.standard_normal((150, 96)).astype(D("bf16"))
    with split_rows(), panels_from(0):
        for _ in range(2):
            y = fc.forward(x, w, threads=2, out=nan((130, 150), "bf16"))[0]
            x64, w64 = x.astype(np.float64), w.astype(np.float64)
            close(y, x64 @ w64.T, np.abs(x64) @ np.abs(w64).T, "bf16")
