"""Verify tiers (sglang_hvd/tiers.py): names, parsing and the refusals."""

from __future__ import annotations

import pytest

from sglang_hvd.tiers import (
    STATIC_TIERS,
    Tier,
    eagle3_cap,
    eagle3_depth_cap,
    ladder,
    parse_tiers,
    steps_for,
)
from sglang_hvd.verify import MAX_TREE_NODES, VerifyShape, widest_nodes


def test_a_tier_parses_from_its_name_and_back():
    t = Tier.parse("4-3-16")
    assert t == Tier(VerifyShape(4, 3, 16)) and t.name == str(t) == "4-3-16"
    assert (t.speculates, t.tokens_per_row, t.draft_nodes) == (True, 16, 15)
    assert Tier.parse(" 1-3-4 ").shape == VerifyShape(1, 3, 4)
    assert [Tier.parse(n).name for n in STATIC_TIERS.split(",")] == STATIC_TIERS.split(",")


def test_off_is_a_plain_step():
    off = Tier.parse(" OFF ")
    assert off == Tier() and off.shape is None and off.name == "off"
    assert (off.speculates, off.tokens_per_row, off.draft_nodes) == (False, 1, 0)


@pytest.mark.parametrize("text, message", [
    ("4-3", "bad tier '4-3'; expected off or TOPK-STEPS-NODES, e.g. 4-3-16 or 1-3-4"),
    ("4-3-16-1", "bad tier '4-3-16-1'; expected off or TOPK-STEPS-NODES"),
    ("a-b-c", "bad tier 'a-b-c'; expected off or TOPK-STEPS-NODES"),
    ("", "bad tier ''; expected off or TOPK-STEPS-NODES"),
    ("on", "bad tier 'on'; expected off or TOPK-STEPS-NODES"),
    # a topk-1 row is a chain of steps + 1 tokens
    ("1-3-8", "tier '1-3-8': with topk 1 a verify row is a chain: nodes must be steps + 1 = 4, got 8"),
    ("4-1-16", "tier '4-1-16': nodes - 1 = 15 exceeds what EAGLE3 drafts at topk 4, 1 step "),
    ("0-1-2", "tier '0-1-2': verify shape needs topk >= 1, steps >= 1 and nodes >= 2"),
])
def test_a_bad_tier_is_refused_with_the_reason(text, message):
    with pytest.raises(ValueError) as e:
        Tier.parse(text)
    assert message in str(e.value)


def names(tiers) -> list[str]:
    return [t.name for t in tiers]


def test_parse_tiers_keeps_order_drops_repeats_and_can_add_off():
    assert names(parse_tiers("4-3-16, 1-3-4,4-3-16,")) == ["4-3-16", "1-3-4"]
    assert names(parse_tiers("1-3-4", with_off=True)) == ["off", "1-3-4"]
    assert names(parse_tiers("1-3-4,off", with_off=True)) == ["off", "1-3-4"]  # off once, in front
    assert names(parse_tiers("1-3-4,off")) == ["1-3-4", "off"]  # without with_off: as written
    for empty in ("", " , "):
        with pytest.raises(ValueError, match="name at least one tier, e.g. 1-3-4,4-3-16"):
            parse_tiers(empty)
    with pytest.raises(ValueError, match="tier '1-3-5': with topk 1"):
        parse_tiers("off,1-3-5")


def test_a_served_shape_s_ladder_halves_its_width_at_its_own_topk():
    names = lambda shape: [t.name for t in ladder(shape)]  # noqa: E731
    # at each step count below the served one, the widest tree it fills: 1 step 1 + 4 nodes (4-1-5),
    # 2 steps 1 + 4 + 16 capped at the served 16 (4-2-16: the served width in fewer steps)
    assert names(VerifyShape(4, 3, 16)) == ["off", "4-1-2", "4-1-4", "4-1-5", "4-2-8", "4-2-16", "4-3-16"]
    assert names(VerifyShape(1, 3, 4)) == ["off", "1-1-2", "1-3-4"]
    assert names(VerifyShape(1, 7, 8)) == ["off", "1-1-2", "1-3-4", "1-7-8"]
    assert names(VerifyShape(4, 3, 8)) == ["off", "4-1-2", "4-1-4", "4-1-5", "4-2-8", "4-3-8"]  # served: its steps
    assert names(VerifyShape(4, 2, 8)) == ["off", "4-1-2", "4-1-4", "4-1-5", "4-2-8"]
    assert names(VerifyShape(2, 3, 8)) == ["off", "2-1-2", "2-1-3", "2-2-4", "2-2-7", "2-3-8"]
    assert names(VerifyShape(4, 1, 4)) == ["off", "4-1-2", "4-1-4"]  # one step: nothing fewer
    # a topk-4 tree of 7 draft nodes needs 2 steps (4 + 16 >= 7), of 4: 1; a chain of 7: 7
    assert (steps_for(4, 8), steps_for(4, 5), steps_for(4, 4), steps_for(1, 8)) == (2, 1, 1, 7)
    assert (steps_for(4, 6), steps_for(4, 21), steps_for(4, 22), steps_for(2, 4)) == (2, 2, 3, 2)
    assert [widest_nodes(4, s) for s in (1, 2, 3)] == [5, 21, 37]
    assert [widest_nodes(1, s) for s in (1, 3)] == [2, 4]


def test_eagle3_is_valued_no_deeper_than_a_tier_drafts():
    # by steps 1, 2, 3: the widest halved tree of that many steps or fewer (4-1-4: 3 nodes, 4-2-8: 7, 4-3-16: 15)
    assert [eagle3_depth_cap(s, VerifyShape(4, 3, 16)) for s in (1, 2, 3)] == [3, 7, 15]
    assert [eagle3_depth_cap(s, VerifyShape(4, 5, 32)) for s in (1, 2, 3, 5)] == [3, 15, 15, 31]
    assert eagle3_depth_cap(2, VerifyShape(1, 3, 4)) == MAX_TREE_NODES  # a chain is as deep as its nodes
    assert eagle3_cap(Tier.parse("4-2-16"), VerifyShape(4, 3, 16)) == 7
    assert eagle3_cap(Tier(), VerifyShape(4, 3, 16)) == eagle3_cap(None, VerifyShape(4, 3, 16)) == MAX_TREE_NODES


def test_a_server_verifies_tiers_of_its_topk_no_wider_than_its_shape():
    from sglang_hvd.tiers import served_tiers, serving_problem

    served = VerifyShape(4, 3, 16)
    assert serving_problem(Tier(), served) is None
    assert serving_problem(Tier.parse("4-2-8"), served) is None
    assert "topk 1, but the server drafts at topk 4" in serving_problem(Tier.parse("1-3-4"), served)
    assert "wider than the served shape 4-3-16" in serving_problem(Tier.parse("4-4-20"), served)
    # the default: the ladder (off, the halved widths, the widest tree of each fewer step count); by width
    assert [t.name for t in served_tiers(None, served)] == ["off", "4-1-2", "4-1-4", "4-1-5", "4-2-8", "4-2-16",
                                                       "4-3-16"]
    assert [t.name for t in served_tiers("4-2-8,off", served)] == ["off", "4-2-8", "4-3-16"]
    with pytest.raises(ValueError, match="tier 1-1-2: topk 1"):
        served_tiers("off,1-1-2", served)
