"""bench conv's remembered layer choices (bench.conv_remembered): stored and loaded back under a key
that changes with everything the choice depends on, ignored when outside the knob space or damaged,
and timed in the next run's final round only when its result matches a fresh finalist's."""
from dataclasses import asdict

import numpy as np
import pytest

import bench.conv as bconv
from bench import conv_remembered
from bench.conv_nest import Blocking, Conv, ConvNest
from loops import remembered
from tppasm import cache
from tppasm.conv_layout import block_activations, block_weights, conv2d_reference

SHAPE = Conv(n=2, c=8, k=64, h=6, w=6, r=3, s=3, pad=1)
KNOBS = bconv.blockings(SHAPE, "f32")
SPECS = bconv.spec_candidates(SHAPE, 1)


def operands(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((SHAPE.n, SHAPE.c, SHAPE.h, SHAPE.w)).astype(np.float32),
            rng.standard_normal((SHAPE.k, SHAPE.c, SHAPE.r, SHAPE.s)).astype(np.float32))


def built(blocking, spec, seed=0):
    x, w = operands(seed)
    nest = ConvNest(SHAPE, "f32", blocking, spec=spec)
    views = nest.views(block_activations(x, blocking.bc, SHAPE.pad), block_weights(w, blocking.bc, blocking.bk,
                                                                                    fold=blocking.fold),
                       nest.output())
    return nest, views, spec


def test_a_choice_is_stored_and_loaded_back():
    key = conv_remembered.layer_key(SHAPE, "f32", 1, KNOBS, SPECS) + "\nstored"
    choice = conv_remembered.Choice(KNOBS[3], SPECS[1], 0.004, 2, 12.5)
    assert conv_remembered.store(key, ["conv", "test", "N=2", "f32", 1], choice)
    assert conv_remembered.load(key, KNOBS, SPECS) == choice
    assert conv_remembered.load(key, KNOBS[:3], SPECS) is None               # blocking outside the knobs
    assert conv_remembered.load(key, KNOBS, SPECS[2:]) is None               # spec outside the specs
    listed = [r for ns, r in cache.records("tune") if r.get("key") == ["conv", "test", "N=2", "f32", 1]]
    assert listed and listed[0]["spec"] == SPECS[1]


@pytest.mark.parametrize("damage", [{"knobs": {"bc": 8, "colour": 1}}, {"knobs": "bc=8"}, {"seconds": "fast"},
                                    {"runs": None}, {"spec": 7}])
def test_a_damaged_record_is_ignored(damage):
    key = conv_remembered.layer_key(SHAPE, "f32", 1, KNOBS, SPECS) + f"\ndamaged {damage}"
    record = {"key": ["conv"], "spec": SPECS[0], "knobs": asdict(KNOBS[0]), "seconds": 0.1, "runs": 1,
              "tuning_seconds": 1.0}
    assert remembered.store(key + "\nintact", record) and conv_remembered.load(key + "\nintact", KNOBS, SPECS)
    record.update(damage)
    remembered.store(key, record)
    assert conv_remembered.load(key, KNOBS, SPECS) is None


def test_the_key_changes_with_what_the_choice_depends_on():
    base = conv_remembered.layer_key(SHAPE, "f32", 1, KNOBS, SPECS)
    assert base == conv_remembered.layer_key(SHAPE, "f32", 1, list(KNOBS), list(SPECS))
    others = [conv_remembered.layer_key(Conv(n=1, c=8, k=64, h=6, w=6, r=3, s=3, pad=1), "f32", 1, KNOBS, SPECS),
              conv_remembered.layer_key(SHAPE, "bf16", 1, KNOBS, SPECS),
              conv_remembered.layer_key(SHAPE, "f32", 2, KNOBS, SPECS),
              conv_remembered.layer_key(SHAPE, "f32", 1, KNOBS[1:], SPECS),
              conv_remembered.layer_key(SHAPE, "f32", 1, KNOBS, SPECS[1:])]
    assert len({base, *others}) == 6


def test_same_result_tells_outputs_apart():
    a = built(KNOBS[0], "Acdebfg")
    assert bconv.same_result(a, built(KNOBS[-1], "Acfgbde"), "f32")
    assert not bconv.same_result(a, built(KNOBS[0], "Acdebfg", seed=1), "f32")


def test_a_prior_choice_runs_in_the_final_round_and_the_pick_is_right(monkeypatch):
    sizes = []
    real = bconv.fastest

    def counting(fns, *args, **kw):
        sizes.append(len(fns))
        return real(fns, *args, **kw)
    monkeypatch.setattr(bconv, "fastest", counting)
    x, w = operands()
    prior = conv_remembered.Choice(Blocking(bc=8, bk=32, batch="c"), "Acfgbde", 1.0, 1, 1.0)
    assert prior.blocking not in bconv.blockings(SHAPE, "f32", quick=True)
    nest, spec, views = bconv.tune_layer(SHAPE, "f32", x, w, None, 1, quick=True, prior=prior)
    bconv.tune_layer(SHAPE, "f32", x, w, None, 1, quick=True)
    assert sizes == [2, 1]                          # the quick search's finalist, and the prior beside it
    got = bconv.result(nest, views)
    ref = conv2d_reference(x, w, SHAPE.stride, SHAPE.pad)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_update_counts_runs_and_tells_kept_from_new():
    key = conv_remembered.layer_key(SHAPE, "f32", 1, KNOBS, SPECS) + "\nupdated"
    assert conv_remembered.update(key, ["conv"], None, KNOBS[0], SPECS[0], 0.002, 3.0) == ("first", 1)
    prior = conv_remembered.load(key, KNOBS, SPECS)
    assert conv_remembered.update(key, ["conv"], prior, KNOBS[0], SPECS[0], 0.002, 2.0) == ("kept", 2)
    prior = conv_remembered.load(key, KNOBS, SPECS)
    assert conv_remembered.update(key, ["conv"], prior, KNOBS[1], SPECS[0], 0.001, 1.0) == ("new", 3)
    assert conv_remembered.load(key, KNOBS, SPECS) == conv_remembered.Choice(KNOBS[1], SPECS[0], 0.001, 3, 6.0)
