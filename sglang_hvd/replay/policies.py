"""Verify policies: the row plan (verify.RowPlan) a request verifies at one decode step.

Each policy sees a StepView (what the server knows before the verify, plus the label
only the oracle may read) and returns a RowPlan at the verify shape. Replay compares
them on the same traces:

  greedy       no speculation: one token per cycle
  eagle3_only  always EAGLE3's row (its N-1 nodes)
  cache_only   SuffixDecoding: the cache chain whenever there is a draft, else a plain step
  rule@c       the cache chain when the draft's score >= c, else EAGLE3 (ArcticInference's rule)
  hvd          the learned gate through the serving decision (decision.decide): EAGLE3's
               row, a cache chain or a two-branch row
  hvd_online   hvd with online calibration (calibration.py), cold at the first request:
               each judged draft's label reaches the calibration once the walk has
               passed it (the output after its accepted run), as it reaches a server's
  oracle       the choose-one oracle: the cache chain exactly when its true yield
               (accepted + 1) beats EAGLE3's expected tokens at the shape
  cache_tree   cache_only with the row tree (drafter/row_tree.py: the chain, then
               siblings from the tree draft, N-1 nodes) at topk > 1
  tree_oracle  the choose-one oracle over the row tree: it exactly when its true yield
               beats EAGLE3's

Baselines verify one source per row, as their designers ship them; only hvd shares a
row between the cache draft and EAGLE3.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import ClassVar, Protocol

import numpy as np

from ..calibration import CalibrationInput, OnlineCalibration
from ..decision import DecisionRule, decide
from ..drafter.batch import DraftBatch, RowTreeBatch
from ..drafter.protocol import Draft
from ..drafter.row_tree import EMPTY_ROW, RowTree
from ..request_state import RequestState
from ..scorer import ServedScorer
from ..verify import RowPlan, VerifyShape


@dataclasses.dataclass(frozen=True, slots=True)
class StepView:
    """What a policy may know before one verify of one request."""

    req_id: str
    source: str
    pos: int  # output tokens generated so far
    shape: VerifyShape
    draft: Draft  # the cache draft at this position (empty if the policy needs none)
    state: RequestState | None  # the request's decision state under this policy (needs_state)
    oracle_accept_len: int
    """The draft's true accepted length, capped at the row (N-1). Only the oracle may read it."""
    row: RowTree = EMPTY_ROW
    """The row tree of N-1 nodes (``needs_rows`` policies at topk > 1; else empty)."""
    oracle_path: tuple[int, ...] = ()
    """Row-tree nodes the output passes through (a chain's: its first accepted nodes). Only oracles read it."""


class Policy(Protocol):
    name: str
    needs_draft: ClassVar[bool]  # replay drafts where this policy stands
    needs_state: ClassVar[bool]  # replay keeps a RequestState for it
    needs_rows: bool  # replay builds row trees where it stands (topk > 1)
    batch_key: object  # None, or a key: policies sharing one plan together (``plan_batch``)

    def plan(self, view: StepView) -> RowPlan: ...


class _Single:
    """A policy that plans one view at a time and reads no state or row tree."""

    needs_state = False
    needs_rows = False
    batch_key = None


def eagle3_row(shape: VerifyShape) -> RowPlan:
    return RowPlan(0, shape.draft_nodes)


def cache_chain(view: StepView) -> RowPlan:
    return RowPlan(min(len(view.draft.tokens), view.shape.draft_nodes), 0)


GREEDY_ROW = RowPlan(0, 0)


class GreedyPolicy(_Single):
    name = "greedy"
    needs_draft = False

    def plan(self, view: StepView) -> RowPlan:
        return GREEDY_ROW


class Eagle3OnlyPolicy(_Single):
    name = "eagle3_only"
    needs_draft = False

    def plan(self, view: StepView) -> RowPlan:
        return eagle3_row(view.shape)


class CacheOnlyPolicy(_Single):
    name = "cache_only"
    needs_draft = True

    def plan(self, view: StepView) -> RowPlan:
        return cache_chain(view) if view.draft.tokens else GREEDY_ROW


class RulePolicy(_Single):
    """Cache chain when the draft's score >= threshold, else EAGLE3's row."""

    needs_draft = True

    def __init__(self, threshold: float):
        self.threshold = threshold
        self.name = f"rule@{threshold:g}"

    def plan(self, view: StepView) -> RowPlan:
        if view.draft.tokens and view.draft.score >= self.threshold:
            return cache_chain(view)
        return eagle3_row(view.shape)


class OraclePolicy(_Single):
    """Cache chain exactly when its true yield (accept_len + 1) beats EAGLE3's expectation."""

    name = "oracle"
    needs_draft = True

    def __init__(self, eagle3_tokens: float):
        self.eagle3_tokens = eagle3_tokens

    def plan(self, view: StepView) -> RowPlan:
        if view.draft.tokens and view.oracle_accept_len + 1 > self.eagle3_tokens:
            return cache_chain(view)
        return eagle3_row(view.shape)


def row_of(view: StepView) -> RowPlan:
    """The whole row tree as the cache branch (the chain when there is no tree)."""
    return RowPlan(len(view.row), 0) if view.row.tokens else cache_chain(view)


class CacheTreePolicy(_Single):
    name = "cache_tree"
    needs_draft = True
    needs_rows = True

    def plan(self, view: StepView) -> RowPlan:
        return row_of(view) if view.draft.tokens else GREEDY_ROW


class TreeOraclePolicy(_Single):
    """The row tree exactly when its true yield (accepted + 1) beats EAGLE3's expectation."""

    name = "tree_oracle"
    needs_draft = True
    needs_rows = True

    def __init__(self, eagle3_tokens: float):
        self.eagle3_tokens = eagle3_tokens

    def plan(self, view: StepView) -> RowPlan:
        if view.draft.tokens and len(view.oracle_path) + 1 > self.eagle3_tokens:
            return row_of(view)
        return eagle3_row(view.shape)


class GatePolicy:
    """HVD: the serving decision (decision.decide). Replay batches every GatePolicy of one
    gate standing in a request (``batch_key``, ``plan_batch``): one gate call for all of
    their rows, each row with its policy's rule. With a ``calibration`` (``hvd_online``) the
    policy decides with calibrated payoffs and plans alone.

    Keeps ``(source, predicted, true accept_len)`` of every draft it judged, for the
    gate's precision/recall report.
    """

    needs_draft = True
    needs_state = True

    def __init__(self, gate: ServedScorer, rule: DecisionRule, name: str = "hvd",
                 calibration: OnlineCalibration | None = None):
        self.gate = gate
        self.rule = rule
        self.name = name
        self.judged: list[tuple[str, float, int]] = []
        self.calibration = calibration
        # judged drafts whose label the walk has not yet passed: (req_id, pos, label, predicted, bucket)
        self._labels: collections.deque[tuple[str, int, int, float, int]] = collections.deque()

    @property
    def needs_rows(self) -> bool:
        return self.rule.cache_siblings > 0

    @property
    def batch_key(self):
        return ("gate", id(self.gate), id(self.calibration) if self.calibration is not None else None)

    def _observe_passed(self, view: StepView) -> None:
        """Labels the walk has passed by ``view`` (a later position, or another request) into the calibration."""
        labels = self._labels
        while labels and (labels[0][0] != view.req_id or labels[0][1] + labels[0][2] < view.pos):
            _, _, label, predicted, bucket = labels.popleft()
            self.calibration.observe(bucket, predicted, label)

    def plan(self, view: StepView) -> RowPlan:
        return self.plan_batch([self], [view])[0]

    @staticmethod
    def plan_batch(policies: Sequence[GatePolicy], views: Sequence[StepView]) -> list[RowPlan]:
        drafts = DraftBatch.of([v.draft for v in views])
        shape = views[0].shape
        cal = policies[0].calibration  # one calibration for the batch (batch_key)
        calibrated = None
        if cal is not None:
            for policy, view in zip(policies, views):
                policy._observe_passed(view)
            calibrated = CalibrationInput(cal, np.array([cal.bucket(v.source) for v in views], np.int64))
        plans = decide(policies[0].gate, drafts, [v.state for v in views], shape, [p.rule for p in policies],
                       trees=lambda rows: RowTreeBatch.of([views[i].row for i in rows], shape.draft_nodes),
                       calibration=calibrated)
        for k, (policy, view) in enumerate(zip(policies, views)):
            if view.draft.tokens:
                predicted = float(plans.predicted[k])
                policy.judged.append((view.source, predicted, view.oracle_accept_len))
                if cal is not None and math.isfinite(predicted):
                    # the row tree's payoff where the policy reads trees, as training labels it
                    label = len(view.oracle_path) if view.row.tokens else view.oracle_accept_len
                    policy._labels.append((view.req_id, view.pos, label, predicted, int(calibrated.buckets[k])))
        return [plans.plan(k) for k in range(len(views))]


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyOptions:
    """Settings the policy factories draw on."""

    rule_thresholds: tuple[float, ...] = (3.0,)
    eagle3_tokens: float = 1.75  # expected tokens of EAGLE3's row (the oracle's bar)
    gate: ServedScorer | None = None  # a gate.Gate (or scorer.ScoreRule), for the hvd policy
    decision: DecisionRule | None = None  # None: the gate's own
    draft_nodes: int = 0  # the verify shape's N-1 (0: the gate's), the most hvd_online's calibration serves


def _gate_policies(o: PolicyOptions) -> list[Policy]:
    if o.gate is None:
        raise ValueError("the hvd policy needs a gate: pass --gate GATE_DIR (a folder written by `hvd train`)")
    return [GatePolicy(o.gate, o.decision or o.gate.rule)]


def _online_policies(o: PolicyOptions) -> list[Policy]:
    gate = _gate_policies(o)[0]
    cap = o.draft_nodes or o.gate.verify_model.shape.draft_nodes
    return [GatePolicy(gate.gate, gate.rule, name="hvd_online", calibration=OnlineCalibration(cap))]


# name -> factory(options) -> policies (a name may expand to several, e.g. one rule per
# threshold). Later policies register themselves here; nothing dispatches on names.
POLICY_FACTORIES: dict[str, Callable[[PolicyOptions], list[Policy]]] = {
    "greedy": lambda o: [GreedyPolicy()],
    "eagle3_only": lambda o: [Eagle3OnlyPolicy()],
    "cache_only": lambda o: [CacheOnlyPolicy()],
    "rule": lambda o: [RulePolicy(t) for t in o.rule_thresholds],
    "oracle": lambda o: [OraclePolicy(o.eagle3_tokens)],
    "cache_tree": lambda o: [CacheTreePolicy()],
    "tree_oracle": lambda o: [TreeOraclePolicy(o.eagle3_tokens)],
    "hvd": _gate_policies,
    "hvd_online": _online_policies,
}
BASELINES = ("greedy", "eagle3_only", "cache_only", "rule")


def make_policies(names: list[str], options: PolicyOptions) -> list[Policy]:
    unknown = [n for n in names if n not in POLICY_FACTORIES]
    if unknown:
        raise ValueError(f"unknown policy {unknown[0]!r}; choose from {', '.join(POLICY_FACTORIES)}")
    return [policy for name in names for policy in POLICY_FACTORIES[name](options)]
