"""Verify tiers (sglang_hvd/tiers.py): names, parsing and the refusals."""

from __future__ import annotations

import pytest

from sglang_hvd.tiers import DEFAULT_TIERS, Tier, parse_tiers
from sglang_hvd.verify import VerifyShape


def test_a_tier_parses_from_its_name_and_back():
    t = Tier.parse("4-3-16")
    assert t == Tier(VerifyShape(4, 3, 16)) and t.name == str(t) == "4-3-16"
    assert (t.speculates, t.tokens_per_row, t.draft_nodes) == (True, 16, 15)
    assert Tier.parse(" 1-3-4 ").shape == VerifyShape(1, 3, 4)
    assert [Tier.parse(n).name for n in DEFAULT_TIERS.split(",")] == DEFAULT_TIERS.split(",")


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
    ("4-1-16", "tier '4-1-16': nodes - 1 = 15 exceeds what EAGLE3 drafts at topk 4, 1 steps"),
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
