"""Decision sweeps: the gate at many (threshold, EAGLE3 reserve, cache siblings) rules and the score rule
at many constants, replayed together in one serving-mode pass, scored by modelled
decode time.

Used by ``hvd train`` (calibrating the gate's decision rule and choosing the rule's
constant on validation conversations) and ``hvd eval --plot`` (the curve on evaluation
traces).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ..cost import CostModel
from ..decision import DecisionRule
from ..drafter import create_drafter
from ..trace import TraceRecord
from ..verify import VerifyModel, VerifyShape
from .metrics import HIGH_PAYOFF_ACCEPT_LEN
from .policies import CacheOnlyPolicy, Eagle3OnlyPolicy, GatePolicy, GreedyPolicy, OraclePolicy, RulePolicy
from .simulate import ReplayResult, simulate

DEFAULT_GATE_THRESHOLDS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
DEFAULT_RULE_THRESHOLDS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)


def default_reserves(shape: VerifyShape) -> tuple[int, ...]:
    """EAGLE3 reserves calibration tries: none, one node, EAGLE3's chain depth (topk > 1)."""
    return tuple(sorted({0, 1, shape.steps})) if shape.allows_branches else (0,)


def default_cache_siblings(shape: VerifyShape) -> int:
    """Tree-draft nodes a cache row may add to its chain: 4 at topk > 1 (on held-out dev
    tasks 2 to 6 gain alike, README), none at topk 1 (rows are chains there)."""
    return 4 if shape.allows_branches else 0


def gate_metrics(judged: Sequence[tuple[str, float, int]], source: str | None = None) -> dict[str, float]:
    """Precision/recall of predicting a high-payoff draft (accept_len >= 6), and MAE."""
    rows = [(p, y) for s, p, y in judged if source is None or s == source]
    if not rows:
        return {"precision_at_6": 0.0, "recall_at_6": 0.0, "mae": 0.0, "judged": 0}
    pred = np.array([p for p, _ in rows])
    true = np.array([y for _, y in rows])
    hit_pred, hit_true = pred >= HIGH_PAYOFF_ACCEPT_LEN, true >= HIGH_PAYOFF_ACCEPT_LEN
    tp = int((hit_pred & hit_true).sum())
    return {
        "precision_at_6": tp / max(int(hit_pred.sum()), 1),
        "recall_at_6": tp / max(int(hit_true.sum()), 1),
        "mae": float(np.abs(pred - true).mean()),
        "judged": len(rows),
    }


@dataclasses.dataclass(slots=True)
class Sweep:
    result: ReplayResult
    gate_curve: list[dict]  # one entry per decision rule (threshold, eagle_reserve, cache_siblings)
    rule_curve: list[dict]  # one entry per rule constant
    best: DecisionRule
    best_rule_threshold: float
    baselines: dict[str, dict]  # greedy, eagle3_only, cache_only, oracle: cycles and time

    def to_json(self) -> dict:
        return {"gate": self.gate_curve, "rule": self.rule_curve, "best": self.best.to_json(),
                "best_rule_threshold": self.best_rule_threshold, "baselines": self.baselines}


def sweep(records: Sequence[TraceRecord], gate, drafter_name: str, model: VerifyModel, costs: CostModel,
          gate_thresholds: Sequence[float] = DEFAULT_GATE_THRESHOLDS,
          rule_thresholds: Sequence[float] = DEFAULT_RULE_THRESHOLDS,
          reserves: Sequence[int] | None = None, siblings: Sequence[int] | None = None) -> Sweep:
    reserves = default_reserves(model.shape) if reserves is None else tuple(reserves)
    siblings = (gate.rule.cache_siblings,) if siblings is None else tuple(siblings)
    decisions = [DecisionRule(t, r, s) for s in siblings for r in reserves for t in gate_thresholds]
    gates = [GatePolicy(gate, d, name=f"hvd@{d.threshold:g}/{d.eagle_reserve}/{d.cache_siblings}") for d in decisions]
    rules = [RulePolicy(c) for c in rule_thresholds]
    base = [GreedyPolicy(), Eagle3OnlyPolicy(), CacheOnlyPolicy(), OraclePolicy(model.eagle3_tokens)]
    result = simulate(records, create_drafter(drafter_name, gate.drafter_config), base + rules + gates, model)
    total = result.overall

    def entry(policy, **extra):
        t = total.policy(policy.name)
        j = t.to_json()
        return {**extra, "cycles_per_1k": j["cycles_per_1k"], "time_per_1k": costs.time_per_1k(t),
                "cache_pick_rate": j["cache_pick_rate"], "two_branch_rate": j["two_branch_rate"]}

    gate_curve = [entry(g, **d.to_json(), **gate_metrics(g.judged)) for g, d in zip(gates, decisions)]
    rule_curve = [entry(r, threshold=c) for r, c in zip(rules, rule_thresholds)]
    best_gate = min(gate_curve, key=lambda e: e["time_per_1k"]) if gate_curve else None
    best = (DecisionRule(best_gate["threshold"], best_gate["eagle_reserve"], best_gate["cache_siblings"])
            if best_gate else gate.rule)
    best_rule = min(rule_curve, key=lambda e: e["time_per_1k"]) if rule_curve else {"threshold": 3.0}
    baselines = {p.name: entry(p) for p in base}
    return Sweep(result, gate_curve, rule_curve, best, float(best_rule["threshold"]), baselines)
