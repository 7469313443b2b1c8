"""bench.amx_choices: the synthetic schedules behind the AMX blocking, and the ceiling over every
blocking that fits the 8 tiles (MODELLED figures; checked here for what they cover, not their speed)."""
import pytest

from bench.amx_choices import CANDIDATES, best, compare, every_blocking, trace


def test_every_blocking_is_each_schedule_that_fits_once():
    every = every_blocking()
    assert len(set(every)) == len(every)
    same = {(gm, gn, a, b, order if gm > 1 < gn else "rows") for gm, gn, a, b, order in CANDIDATES}
    assert same <= set(every)                    # with one row or column of C, both orders are one
    for gm, gn, abuf, bbuf, order in every:
        ops = trace(gm, gn, abuf, bbuf, order, steps=3)
        assert sum(op[0] == "tdp" for op in ops) == 3 * gm * gn
        assert {t for op in ops for t in op[1] + op[2]} <= set(range(8))
    with pytest.raises(ValueError, match="more than 8 tiles"):
        trace(2, 2, 2, 1, "rows")
    assert not any(gm * gn + gm * a + gn * b > 8 for gm, gn, a, b, _ in every)
    assert (3, 2, 1, 1, "rows") not in every and (1, 1, 1, 6, "rows") in every


def test_the_ceiling_is_no_lower_than_any_candidate():
    every = every_blocking()[::4] + [(2, 2, 1, 1, "rows")]
    rows = compare(every, steps=6)
    ceiling = {r["reading"]: r for r in best(rows)}
    assert set(ceiling) == {c for c in rows[0] if c not in ("blocking", "loads/tdp")}
    for row in rows:
        for reading, top in ceiling.items():
            assert row[reading] <= top["best"]
    for reading, top in ceiling.items():
        assert any(r["blocking"] == top["blocking"] and r[reading] == top["best"] for r in rows)
