"""SGLang's adaptive EAGLE3 rule as a replay planner (sglang_hvd/replay/adaptive.py), on literal
sequences of accepted draft tokens. The rule: per batch-size slot an EMA (alpha 0.2) of the
accepted tokens, first revisited after 10 warm-up batches and then every 5 (batches 15, 20, ...)."""

from __future__ import annotations

from sglang_hvd.replay.adaptive import AdaptiveEagle3Planner, AdaptiveSlot

CHAIN1, CHAIN3, CHAIN7 = "1-1-2", "1-3-4", "1-7-8"  # topk 1, steps S, S + 1 nodes


def planner(slots=None, initial_steps: int = 3) -> AdaptiveEagle3Planner:
    return AdaptiveEagle3Planner(initial_steps=initial_steps, slots=slots)


def tiers_planned(p: AdaptiveEagle3Planner, accepts_per_batch) -> list[str]:
    """The tier each batch is planned at, feeding the batch's accepted counts after it."""
    out = []
    for accepts in accepts_per_batch:
        rids = [f"r{i}" for i in range(len(accepts))]
        out.append(p.plan(rids).tier.name)
        p.verified(rids, accepts)
    return out


def test_nothing_moves_in_warm_up_then_a_low_ema_steps_down_and_a_high_one_up():
    # batch 1 starts at 3 steps, EMA 2; all rejected: the EMA is 2 * 0.8^10 = 0.21 after 10 batches, below the
    # 0.25 to step down to 1 (1 - 0.5 - 0.25 hysteresis), but the first revisit is after batch 15 (EMA 0.07)
    assert tiers_planned(planner(), [[0]] * 20) == [CHAIN3] * 15 + [CHAIN1] * 5
    # then 7 accepted a batch: the EMA is 4.73 at the next revisit (batch 20), above 0.5, 2.5 and 4.5: up to 7 steps
    # at once, and not before batch 20 although it passed 2.5 at batch 17
    assert tiers_planned(planner(), [[0]] * 15 + [[7]] * 7) == [CHAIN3] * 15 + [CHAIN1] * 5 + [CHAIN7] * 2


def test_hysteresis_keeps_the_step_count():
    # accepted 0, 0, 1 a batch: the EMA at batch 15 is 1/3 + (2 - 1/3) * 0.8^15 = 0.392
    batches = [[0, 0, 1]] * 16
    assert tiers_planned(planner(), batches)[-1] == CHAIN3  # the default slot steps down at <= 0.25 only
    no_hysteresis = {1: AdaptiveSlot((1, 3, 5, 7))}
    assert tiers_planned(planner(no_hysteresis), batches)[-1] == CHAIN1  # at <= 0.5 it does
    # up: from 1 step (EMA 0) with 1 accepted a batch the EMA is 1 - 0.8^15 = 0.965 at batch 15: above 0.5, but not
    # above 0.5 + an up hysteresis of 0.5
    ones = [[1]] * 16
    assert tiers_planned(planner({1: AdaptiveSlot((1, 3))}, initial_steps=1), ones)[-1] == CHAIN3
    assert tiers_planned(planner({1: AdaptiveSlot((1, 3), up_hysteresis=0.5)}, initial_steps=1), ones)[-1] == CHAIN1


def test_a_slot_at_zero_steps_probes_the_next_candidate():
    # no speculation from the start (EMA -1, not fed while off); batch 15 probes 1 step with the EMA reset to 0;
    # nothing accepted: batch 20 goes back to 0 (EMA 0 <= 0.5), batch 25 probes again
    p = planner({1: AdaptiveSlot((0, 1, 3))}, initial_steps=0)
    assert tiers_planned(p, [[0]] * 26) == ["off"] * 15 + [CHAIN1] * 5 + ["off"] * 5 + [CHAIN1]
    assert p.modes == {"off": 20, CHAIN1: 6}


def test_a_batch_routes_to_the_largest_slot_at_or_below_its_size():
    p = planner()  # slots 1: {1, 3, 5, 7}, 8: {0, 1, 3}, 32: {0, 1} (3 is not a candidate: the middle one, 1), 64: {0}
    assert [tiers_planned(p, [[0] * b])[0] for b in (1, 5, 8, 31, 40, 64, 100)] == [
        CHAIN3, CHAIN3, CHAIN3, CHAIN3, CHAIN1, "off", "off"]
    # slot 1 has seen 2 batches (of 1 and 5 rows), slot 8 2 (of 8 and 31): after 12 more rejected batches of 5 rows,
    # the 15th steps slot 1 down (its batches of 1 row too); slot 8 keeps its 3 steps
    tiers_planned(p, [[0] * 5] * 12)
    assert tiers_planned(p, [[0] * 5, [0], [0] * 8]) == [CHAIN3, CHAIN1, CHAIN3]
