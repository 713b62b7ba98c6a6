"""cost_rule.choose_mode computes every mode at once; mode_rows is the one-mode reference.
They must agree on every batch (hypothesis draws the batches). Where the extension is built,
choose_mode runs natively; its numpy path (_choose_mode_numpy) must then agree with it to
the last bit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_hvd.cost_rule import CostRule, _choose_mode_numpy, choose_mode, expected_tokens, mode_rows
from sglang_hvd.drafter.native_drafter import _native
from sglang_hvd.payoff import Payoff
from sglang_hvd.step_profile import load_profile
from sglang_hvd.tiers import parse_tiers
from sglang_hvd.verify import Eagle3Curve

COST = CostRule(load_profile("qwen3-8b-h200"), Eagle3Curve(),
                parse_tiers("off,1-1-2,1-3-4,4-1-2,4-1-4,4-2-8,4-3-16"))

rows = st.lists(st.tuples(st.integers(0, 40), st.floats(0, 16), st.sampled_from([0, 0, 1, 2, 3])),
                min_size=1, max_size=70)


@settings(max_examples=80, deadline=None)
@given(rows, st.integers(0, 6), st.floats(0, 2e5), st.booleans())
def test_all_modes_at_once_equal_each_mode_alone(batch, reserve, context, controlled):
    lens = np.array([r[0] for r in batch], dtype=np.int32)
    pred = np.where(lens > 0, [r[1] for r in batch], np.nan)
    # per-request controls (request_control.py: auto, off, cache, eagle3), or none
    control = np.array([r[2] for r in batch], dtype=np.int8) if controlled else None
    payoff = Payoff(pred, lens, 15)
    every = expected_tokens(COST, payoff, lens, reserve, control)
    one_by_one = [mode_rows(m, payoff, lens, reserve, COST.eagle3_tokens[i], control)[1]
                  for i, m in enumerate(COST.modes)]
    np.testing.assert_allclose(every, one_by_one, rtol=1e-12)
    mode, chosen_rows, expected, chosen_reserve = choose_mode(COST, pred, lens, reserve, context, 15, control)
    rate = [t / COST.profile.step_ms(m.tier, len(lens), context, m.eagle3) for m, t in zip(COST.modes, one_by_one)]
    assert mode == COST.modes[int(np.argmax(rate))]
    at = COST.modes.index(mode)
    np.testing.assert_allclose(expected, one_by_one[at], rtol=1e-12)
    rows_alone, _, reserve_alone = mode_rows(mode, payoff, lens, reserve, COST.eagle3_tokens[at])
    np.testing.assert_array_equal(chosen_rows, rows_alone)
    np.testing.assert_array_equal(chosen_reserve, reserve_alone)


def test_modes_in_order_with_kinds():
    # cheapest first: by tokens per row, then no EAGLE3 draft before one, then fewer steps (ties go to the cheaper
    # shape)
    assert [m.name for m in COST.modes] == [
        "off", "1-1-2/cache", "4-1-2/cache", "1-1-2", "4-1-2", "4-1-4/cache", "1-3-4/cache", "4-1-4", "1-3-4",
        "4-2-8/cache", "4-2-8", "4-3-16/cache", "4-3-16"]
    assert COST.kinds.tolist() == [0, 1, 1, 2, 3, 1, 1, 3, 2, 1, 3, 1, 3]
    assert COST.nodes.tolist() == [0, 1, 1, 1, 1, 3, 3, 3, 3, 7, 7, 15, 15]
    backwards = CostRule(COST.profile, Eagle3Curve(), parse_tiers("4-3-16,1-3-4,off"))
    assert [m.name for m in backwards.modes] == ["off", "1-3-4/cache", "1-3-4", "4-3-16/cache", "4-3-16"]
    # without EAGLE3's draft, one topk's tiers of one width are one step: the fewer steps stand for both
    same = CostRule(COST.profile, Eagle3Curve(), parse_tiers("off,4-3-16,4-2-16"))
    assert [m.name for m in same.modes] == ["off", "4-2-16/cache", "4-2-16", "4-3-16"]


def test_step_times_kept_per_batch_follow_the_profile_and_a_refit():
    def one_by_one(rule, b, c):
        return [rule.profile.step_ms(m.tier, b, c, m.eagle3, extend=rule.extend) for m in rule.modes]

    # at no context + per context token, the same sum in another order: equal to ~1e-12 of a step
    for b, c in ((1, 0.0), (8, 12_345.5), (64, 3e5), (8, 7.0)):  # batch 8 twice: the second from the kept arrays
        np.testing.assert_allclose(COST.step_ms(b, c), one_by_one(COST, b, c), rtol=1e-10)
    # a refit profile (the server replaces the rule): its own times, none kept from the old profile's
    refit = dataclasses.replace(COST, profile=load_profile("qwen3-8b-h100"))
    np.testing.assert_allclose(refit.step_ms(8, 7.0), one_by_one(refit, 8, 7.0), rtol=1e-10)
    assert not np.allclose(refit.step_ms(8, 7.0), COST.step_ms(8, 7.0))


LADDERS = ("off,4-1-2,4-1-4,4-1-5,4-2-8,4-2-16,4-3-16", "off,1-1-2,1-3-4,1-7-8", "4-3-16", "off,1-3-4,4-3-16,8-4-32")


@pytest.mark.parametrize("ladder", LADDERS)
def test_the_native_pick_equals_the_numpy_reference_to_the_bit(ladder):
    """drafter/native/choose_mode.hpp against _choose_mode_numpy on random batches with
    every input the decision passes: no drafts, infinite and negative predictions, a
    survival curve (float32 as onnxruntime returns it, float64, monotone or not, narrower
    or wider than the widest tier), per-request controls, reserves, batches over 128 rows
    (numpy's pairwise sum splits them): the same mode, rows, reserves and expected tokens."""
    if _native is None:
        pytest.skip("the native extension is not built")
    cost = CostRule(load_profile("qwen3-8b-h200"), Eagle3Curve(), parse_tiers(ladder))
    rng = np.random.default_rng(len(ladder))
    picked = set()
    for trial in range(300):
        b = int(rng.choice([1, 3, 8, 9, 17, 64, 130, 300]))
        lens = rng.integers(0, 40, b).astype(np.int32)
        if trial % 5 == 0:
            lens[:] = 0
        pred = np.where(lens > 0, rng.uniform(-1, 20, b), np.nan)
        if trial % 7 == 0:
            pred[rng.random(b) < 0.3] = np.inf
        survival = None
        if trial % 2:
            survival = rng.uniform(0, 1, (b, int(rng.choice([1, 5, 15, 40])))).astype(
                np.float32 if trial % 4 == 1 else np.float64)
            if trial % 8 == 1:
                survival = np.sort(survival, axis=1)[:, ::-1].copy()
        control = rng.integers(0, 4, b).astype(np.int8) if trial % 3 == 0 else None
        args = (cost, pred, lens, int(rng.integers(0, 5)), float(rng.uniform(0, 5e5)), int(rng.choice([3, 15])),
                control, survival)
        mode, rows_, expected, reserve = choose_mode(*args)
        want = _choose_mode_numpy(*args)
        assert (mode, expected) == (want[0], want[2]), trial
        assert rows_.dtype == bool and rows_.tolist() == want[1].tolist(), trial
        if isinstance(want[3], np.ndarray):
            assert reserve.dtype == np.int32 and reserve.tolist() == want[3].tolist(), trial
        else:
            assert reserve == want[3], trial
        picked.add(mode.name)
    assert len(picked) >= min(3, len(cost.modes)), picked  # the batches reach several modes, not one


def test_the_native_pick_refuses_mismatched_shapes():
    if _native is None:
        pytest.skip("the native extension is not built")
    lens = np.array([3, 0], dtype=np.int32)
    with pytest.raises(ValueError, match="mismatched shapes"):
        _native.choose_mode(np.zeros(3), lens, None, 15, np.zeros((64, 1025)), None, 0, COST.nodes, COST.kinds,
                            COST.floor, COST.step_ms(2, 0.0), COST.tree_modes, COST.tree_beside)
