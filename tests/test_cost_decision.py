"""Cost-aware verification in the one decision (sglang_hvd/decision.py): the tokens each step
mode is expected to emit (mode_rows), the mode picked by tokens per millisecond
(choose_mode, CostRule) and ``decide`` planning every row at a step's tier."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_hvd.cost_rule import CostRule, StepMode, choose_mode, mode_rows
from sglang_hvd.decision import DecisionRule, decide
from sglang_hvd.payoff import Payoff
from sglang_hvd.request_control import AUTO, CACHE, EAGLE3, OFF
from sglang_hvd.request_state import RequestState
from sglang_hvd.step_profile import DraftCost, ForwardCost, HostCost, StepProfile
from sglang_hvd.tiers import Tier, eagle3_cap, parse_tiers
from sglang_hvd.verify import Eagle3Curve, Eagle3Stream, RowPlan, VerifyModel, VerifyShape
from test_decision import ListGate, drafts

SHAPE = VerifyShape(4, 3, 16)  # the gate's shape: predictions at 15 nodes
TIERS = "off,1-3-4,4-3-16"


def cost_rule(verify, eagle3=(0.0, 0.0, 0.0, 0.0), host=(0.0, 0.0, 0.0), curve=Eagle3Curve(),
              tiers=TIERS) -> CostRule:
    """The one place this file builds a profile and a cost rule (a signature change is a one-line fix here).
    ``verify``: (fixed_ms, per_token_ms, knee_tokens, per_context_token_ms); ``eagle3``: DraftCost without
    its extend (0: these cases time the draft forwards alone)."""
    profile = StepProfile(name="t", kind="measured", target_model="target", draft_model="draft", hardware="test",
                          verify=ForwardCost(*verify), eagle3=DraftCost(*eagle3, extend_ms=0.0),
                          hvd_cpu=HostCost(*host))
    return CostRule(profile, curve, parse_tiers(tiers))


def states(b: int) -> list[RequestState]:
    return [RequestState([1, 2, 3]) for _ in range(b)]


def test_expensive_verify_and_low_payoffs_pick_no_speculation():
    # every query token costs 1 ms (knee 1): off emits 2 tokens in 2 ms, 1 a ms; 1-3-4 at most 2 + 2 * 0.75 (EAGLE3)
    # in 8 ms, and the cache drafts are predicted to accept 0.3 tokens each
    rule = cost_rule(verify=(0.0, 1.0, 1.0, 0.0))
    plan = decide(ListGate([0.3, 0.3]), drafts([5, 6, 7], [8, 9, 10]), states(2), SHAPE, DecisionRule(), step=rule)
    assert plan.tier == Tier() and plan.eagle3 is False and plan.expected_tokens == 2.0  # the bonus tokens
    assert plan.cache_lens.tolist() == [0, 0] and plan.eagle_nodes.tolist() == [0, 0]
    assert plan.cache_tokens.shape == (2, 0) and plan.predicted.tolist() == pytest.approx([0.3, 0.3])


def test_cheap_wide_verify_and_high_payoffs_pick_the_widest_tier_without_eagle3():
    # a verify costs 1 ms at any width, EAGLE3's draft 1 ms more; two 15-token drafts predicted whole (p = 1):
    # 4-3-16 without EAGLE3 emits 2 + 2 * 15 tokens in 1 ms
    rule = cost_rule(verify=(1.0, 0.0, 0.0, 0.0), eagle3=(1.0, 0.0, 0.0, 0.0))
    long = list(range(20, 35))
    mode, rows, expected, _ = choose_mode(rule, np.array([15.0, 15.0]), np.array([15, 15]), 0, 0.0, 15)
    assert mode == StepMode(Tier.parse("4-3-16"), eagle3=False) and mode.name == "4-3-16/cache"
    assert rows.tolist() == [True, True] and expected == pytest.approx(2 + 2 * 15)
    plan = decide(ListGate([15.0, 15.0]), drafts(long, long), states(2), SHAPE, DecisionRule(), step=rule)
    assert plan.tier == Tier.parse("4-3-16") and plan.eagle3 is False
    assert plan.expected_tokens == pytest.approx(32.0)  # what the step is expected to emit, beside what it does
    assert [plan.plan(i) for i in range(2)] == [RowPlan(15, 0), RowPlan(15, 0)]


class CurveGate(ListGate):
    """A ListGate that also gives each row's survival curve (gate.Gate.predict_curve)."""

    def __init__(self, values, survival):
        super().__init__(values)
        self.survival = np.array(survival, dtype=np.float32)

    def predict_curve(self, x):
        return self.predict(x), self.survival[: len(x)]


def test_a_gates_own_survival_curve_prices_the_widths_where_it_has_one():
    # the case above: two 15-token drafts predicted whole pick 4-3-16 without EAGLE3 (32 tokens in 1 ms) by the
    # geometric model; the gate's own curve says only their first 2 tokens are sure and the rest never
    # accepted: every speculating tier then expects 2 + 2 * 2, and of equals the first mode (off, then 1-3-4
    # without EAGLE3 at 1 ms) wins: 1-3-4/cache, its 3-token chains
    rule = cost_rule(verify=(1.0, 0.0, 0.0, 0.0), eagle3=(1.0, 0.0, 0.0, 0.0))
    long = list(range(20, 35))
    survival = [[1.0, 1.0] + [0.0] * 13] * 2
    plan = decide(CurveGate([15.0, 15.0], survival), drafts(long, long), states(2), SHAPE, DecisionRule(), step=rule)
    assert plan.tier == Tier.parse("1-3-4") and plan.eagle3 is False
    assert plan.expected_tokens == pytest.approx(6.0) and plan.predicted.tolist() == [15.0, 15.0]
    assert [plan.plan(i) for i in range(2)] == [RowPlan(3, 0), RowPlan(3, 0)]
    # a curve of nan or the wrong rows is a bad scorer: raised (replay, training) or, serving, EAGLE3's fallback
    with pytest.raises(ValueError, match=r"survival curve of shape \(1, 15\)"):
        decide(CurveGate([15.0, 15.0], survival[:1]), drafts(long, long), states(2), SHAPE, DecisionRule(), step=rule)
    plan = decide(CurveGate([15.0, 15.0], [[np.nan] * 15] * 2), drafts(long, long), states(2), SHAPE,
                  DecisionRule(), step=rule, fallback=True)
    assert "non-finite" in str(plan.gate_error) and plan.tier == Tier(SHAPE)


def test_no_draft_and_an_eagle3_curve_of_one_token_pick_no_speculation():
    # 1 ms a forward plus 0.01 ms a query token: off 1.02 ms, 1-3-4 1.08, 4-3-16 1.32, and nothing emits more than
    # the bonus token
    verify, flat = (1.0, 0.01, 1.0, 0.0), Eagle3Curve(((1, 1.0),))
    plan = decide(ListGate([]), drafts([], []), states(2), SHAPE, DecisionRule(), step=cost_rule(verify, curve=flat))
    assert plan.tier == Tier() and plan.eagle3 is False
    # the same costs with the default curve: EAGLE3's chains pay, 2 * 1.75 tokens in 1.08 ms (3.24 a ms), more than
    # its 4-3-16 tree (2 * 2.1 in 1.32 ms: 3.18) and off (2 in 1.02 ms)
    plan = decide(ListGate([]), drafts([], []), states(2), SHAPE, DecisionRule(), step=cost_rule(verify))
    assert plan.tier == Tier.parse("1-3-4") and plan.eagle3 is True
    assert [plan.plan(i) for i in range(2)] == [RowPlan(0, 3), RowPlan(0, 3)]


def test_mode_rows_by_hand_for_each_kind_of_mode():
    # row 0: 3 tokens predicted whole (p = 1); row 1: no draft; row 2: 1 token predicted 0.5 (p = 0.5)
    lens = np.array([3, 0, 1])
    payoff = Payoff(np.array([3.0, np.nan, 0.5]), lens, 15)
    rule = cost_rule(verify=(1.0, 0.0, 0.0, 0.0))
    chain, tree = Tier.parse("1-3-4"), Tier.parse("4-3-16")

    def run(mode):  # the rule's curve by nodes at the mode's tier: the default curve here (no tier is shallower)
        rows, tokens, _ = mode_rows(mode, payoff, lens, 3, rule.eagle3_tokens[rule.modes.index(mode)])
        return rows.tolist(), tokens

    assert run(StepMode(Tier(), eagle3=False)) == ([False, False, False], 3.0)  # a bonus token a row
    # no EAGLE3: every drafted row verifies its draft, 3 + (3 + 0 + 0.5)
    assert run(StepMode(chain, eagle3=False)) == ([True, False, True], pytest.approx(6.5))
    assert run(StepMode(tree, eagle3=False)) == ([True, False, True], pytest.approx(6.5))
    # topk 1: a row holds its cache chain or EAGLE3's (0.75 tokens past the bonus at 3 nodes);
    # row 2's 0.5 loses to it: 3 + 3 + 0.75 + 0.75
    assert run(StepMode(chain)) == ([True, False, False], pytest.approx(7.5))
    # a tree tier weighs each drafted row's cache branch against EAGLE3's whole tree, whatever the gate's threshold
    # said; reserve 3 leaves 12 cache nodes: row 0 takes its 3 (p = 1: EAGLE3's 12 beside it never count), row 1
    # EAGLE3's 15 nodes (2.1 - 1); row 2's 1 token (0.5) and, when that misses (0.5), EAGLE3's 14 nodes beside it
    # (2.08125 - 1) make 1.040625, less than EAGLE3's 15 alone (1.1): 3 + 3 + 1.1 + 1.1
    assert run(StepMode(tree)) == ([True, False, False], pytest.approx(8.2))


def test_a_tree_row_gives_eagle3_the_nodes_its_cache_draft_would_waste():
    # one 15-token draft whose tokens are each accepted with p = 0.5 (predicted E_15(0.5)), at 4-3-16 (15 nodes):
    # the whole draft is worth 1 - 0.5^15 (~1.0) tokens beyond the bonus, less than EAGLE3's tree alone (1.1), but
    # its first c tokens beside EAGLE3's 15 - c nodes are worth (1 - 0.5^c) + 0.5 * (curve(15 - c) - 1), the most at
    # c = 6: 0.984375 + 0.5 * (1.9875 - 1) = 1.478125 (c = 5: 1.471875, c = 7: 1.4765625)
    lens, pred = np.array([15]), np.array([1 - 0.5 ** 15])
    rule = cost_rule(verify=(1.0, 0.0, 0.0, 0.0), tiers="4-3-16")
    tree = StepMode(Tier.parse("4-3-16"))
    payoff = Payoff(pred, lens, 15)  # p = 0.5 to the payoff table's grid (1e-5)
    rows, tokens, reserve = mode_rows(tree, payoff, lens, 0, rule.eagle3_tokens[rule.modes.index(tree)])
    assert rows.tolist() == [True] and tokens == pytest.approx(2.478125, abs=1e-4) and reserve.tolist() == [9]
    # the step plans the row so: 6 cache nodes (no row tree grows in them), 9 EAGLE3 nodes; the same row without the
    # cost rule (the gate's threshold, 0.5) takes the whole draft
    plan = decide(ListGate(pred.tolist()), drafts(list(range(20, 35))), states(1), SHAPE, DecisionRule(), step=rule)
    assert plan.tier == Tier.parse("4-3-16") and plan.eagle3 is True and plan.plan(0) == RowPlan(6, 9)
    assert plan.expected_tokens == pytest.approx(2.478125, abs=1e-4)
    plain = decide(ListGate(pred.tolist()), drafts(list(range(20, 35))), states(1), SHAPE, DecisionRule(threshold=0.5))
    assert plain.plan(0) == RowPlan(15, 0)


def test_mode_rows_price_the_rows_per_request_controls():
    # the rows of test_mode_rows_by_hand_for_each_kind_of_mode, asking off, cache and eagle3 in turn
    lens = np.array([3, 0, 1])
    payoff = Payoff(np.array([3.0, np.nan, 0.5]), lens, 15)
    rule = cost_rule(verify=(1.0, 0.0, 0.0, 0.0))
    control = np.array([OFF, CACHE, EAGLE3], dtype=np.int8)
    chain, tree = Tier.parse("1-3-4"), Tier.parse("4-3-16")

    def tokens(mode):
        return mode_rows(mode, payoff, lens, 3, rule.eagle3_tokens[rule.modes.index(mode)], control)[1]

    assert tokens(StepMode(Tier(), eagle3=False)) == 3.0
    # off: 1; cache without a draft: 1; eagle3 without EAGLE3's draft: 1
    assert tokens(StepMode(chain, eagle3=False)) == pytest.approx(3.0)
    # eagle3 at 1-3-4: 1.75; at 4-3-16: 2.1
    assert tokens(StepMode(chain)) == pytest.approx(3.75)
    assert tokens(StepMode(tree)) == pytest.approx(4.1)
    # a whole batch asking off takes the off tier, whatever its drafts promise (every mode emits 2 tokens)
    rule = cost_rule(verify=(1.0, 0.0, 0.0, 0.0), eagle3=(1.0, 0.0, 0.0, 0.0))
    off = np.array([OFF, OFF], dtype=np.int8)
    mode, _, _, _ = choose_mode(rule, np.array([15.0, 15.0]), np.array([15, 15]), 0, 0.0, 15, off)
    assert mode == StepMode(Tier(), eagle3=False)
    long = list(range(20, 35))
    plan = decide(ListGate([15.0, 15.0]), drafts(long, long), states(2), SHAPE, DecisionRule(), step=rule, control=off)
    assert plan.tier == Tier() and plan.cache_lens.tolist() == [0, 0] and plan.eagle_nodes.tolist() == [0, 0]
    # one auto row beside an off one: the widest tier without EAGLE3 again (test above), the off row plain
    mixed = np.array([AUTO, OFF], dtype=np.int8)
    plan = decide(ListGate([15.0, 15.0]), drafts(long, long), states(2), SHAPE, DecisionRule(), step=rule,
                  control=mixed)
    assert plan.tier == Tier.parse("4-3-16") and [plan.plan(i) for i in range(2)] == [RowPlan(15, 0), RowPlan(0, 0)]


def test_a_tier_drafting_its_width_in_fewer_steps_values_eagle3_at_its_depth():
    # 4-2-16 beside the served 4-3-16: its 2-step tree is valued as 4-2-8's 7 nodes (1.95 tokens), 4-3-16's
    # 15 nodes at 2.1, 4-2-8 itself at 1.95; a chain tier keeps its nodes
    rule = cost_rule(verify=(1.0, 0.0, 0.0, 0.0), tiers="off,1-3-4,4-2-8,4-2-16,4-3-16")
    at = {m.name: rule.eagle3_tokens[i] for i, m in enumerate(rule.modes)}
    assert (at["4-2-16"][15], at["4-3-16"][15], at["4-2-8"][7], at["1-3-4"][3]) == (1.95, 2.1, 1.95, 1.75)
    assert at["4-2-16"][5] == at["4-3-16"][5] == pytest.approx(1.85)  # under the cap: the curve (3:1.75, 7:1.95)
    # an EAGLE3 row alone: 4-2-16 yields 1 + 0.95, less than 4-3-16's 1 + 1.1 at the same width
    lens, payoff = np.array([0]), Payoff(np.array([np.nan]), np.array([0]), 15)
    rows = lambda name: mode_rows(StepMode(Tier.parse(name)), payoff, lens, 0, at[name])[1]  # noqa: E731
    assert (rows("4-2-16"), rows("4-3-16")) == (pytest.approx(1.95), pytest.approx(2.1))
    # a 3 ms verify, and one draft forward against two (1 ms each): 4-2-16 wins, 1.95 tokens in 4 ms against 2.1
    # in 5 (and 1 in 3 without EAGLE3's draft)
    rule = cost_rule(verify=(3.0, 0.0, 0.0, 0.0), eagle3=(0.0, 1.0, 0.0, 0.0), tiers="off,4-2-16,4-3-16")
    mode, _, _, _ = choose_mode(rule, np.array([np.nan]), lens, 0, 0.0, 15)
    assert mode.name == "4-2-16"
    # replay draws an EAGLE3 row of a 4-2-16 step at the same 7 nodes
    model = VerifyModel(SHAPE)
    assert model.out_len(RowPlan(0, 15), 0, Eagle3Stream(), eagle3_cap(Tier.parse("4-2-16"), SHAPE)) == 1
    stream = Eagle3Stream()
    assert sum(model.out_len(RowPlan(0, 15), 0, stream, 7) for _ in range(20)) == 39  # 20 x 1.95


def test_a_step_mode_plans_every_row_at_its_tier():
    rule = DecisionRule(threshold=1.0, eagle_reserve=1)

    def plan(mode):  # row 1 has no draft, row 2 is predicted below the threshold
        return decide(ListGate([4.0, 0.0, 0.5]), drafts([10, 11, 12, 13, 14], [], [20, 21]), states(3), SHAPE, rule,
                      step=mode)

    p = plan(StepMode(Tier.parse("1-3-4")))  # chains: row 0 its first 3 cache tokens, the others EAGLE3's 3 nodes
    assert (p.tier.name, p.eagle3) == ("1-3-4", True)
    assert [p.plan(i) for i in range(3)] == [RowPlan(3, 0), RowPlan(0, 3), RowPlan(0, 3)]
    assert p.cache_tokens[0].tolist() == [10, 11, 12] and p.cache_parents[0].tolist() == [-1, 0, 1]
    p = plan(StepMode(Tier.parse("1-3-4"), eagle3=False))  # no EAGLE3: every draft is verified, row 1 a plain step
    assert (p.tier.name, p.eagle3) == ("1-3-4", False)
    assert [p.plan(i) for i in range(3)] == [RowPlan(3, 0), RowPlan(0, 0), RowPlan(2, 0)]
    assert p.cache_tokens[2].tolist() == [20, 21, -1]
    p = plan(StepMode(Tier.parse("4-1-4")))  # a tree of 3 nodes: reserve 1 keeps one EAGLE3 node beside the cache
    assert (p.tier.name, p.eagle3) == ("4-1-4", True)
    assert [p.plan(i) for i in range(3)] == [RowPlan(2, 1), RowPlan(0, 3), RowPlan(0, 3)]
    p = plan(StepMode(Tier()))
    assert (p.tier.name, p.eagle3) == ("off", False) and p.cache_tokens.shape == (3, 0)
    assert [p.plan(i) for i in range(3)] == [RowPlan(0, 0)] * 3
    assert p.predicted[[0, 2]].tolist() == pytest.approx([4.0, 0.5]) and np.isnan(p.predicted[1])
    # every row takes its cache chain: no row verifies EAGLE3 nodes, so the step skips EAGLE3's draft forwards
    p = decide(ListGate([4.0, 4.0]), drafts([1, 2, 3], [4, 5, 6]), states(2), SHAPE, rule,
               step=StepMode(Tier.parse("1-3-4")))
    assert [p.plan(i) for i in range(2)] == [RowPlan(3, 0), RowPlan(3, 0)] and p.eagle3 is False


def test_a_cost_rule_decides_for_one_batch_and_needs_a_tier():
    rule = cost_rule(verify=(1.0, 0.0, 0.0, 0.0))
    assert [m.name for m in rule.modes] == ["off", "1-3-4/cache", "1-3-4", "4-3-16/cache", "4-3-16"]
    for step in (rule, StepMode(Tier.parse("1-3-4"))):
        with pytest.raises(ValueError, match="a step mode or cost rule decides for one batch: pass one DecisionRule"):
            decide(ListGate([4.0, 4.0]), drafts([1, 2], [3]), states(2), SHAPE, [DecisionRule(), DecisionRule()],
                   step=step)
    with pytest.raises(ValueError, match="a cost rule needs at least one tier"):
        CostRule(rule.profile, Eagle3Curve(), ())
