"""hvd_exact: cost-aware HVD priced by each cache chain's true accepted length, the
reference a better gate is measured against (fleet replay by load, ``hvd eval
--concurrency C --policies hvd,hvd_exact``).

The serving stepper and its decision run unchanged; only the scorer differs. Before
each step the planner hands the scorer what every row's recording holds next; the
scorer's value for a row is the number of leading tokens of its cache chain that the
recording repeats (the accept_len a perfect gate would predict, at the whole draft),
and the cost rule prices it as known (``CostRule(exact=True)``: c checked tokens
accept min(c, that length); payoff.Payoff.exact). What it does not know: the row
tree's siblings (valued at nothing, as the rule values them for the gate) and EAGLE3's
outcome (its curve, as for the gate). So it is no bound: where row trees carry much
of the cache rows' yield (wide tree tiers, low load) the gate can beat it.

Worked example: a row whose 5-token chain matches the next 3 recorded tokens scores 3;
at a 3-node tier its chain is worth 3 tokens beyond the bonus, at 1 node 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..cost_rule import CostRule
from ..decision import BatchPlan, DecisionRule
from ..drafter.batch import DraftBatch, RowTreeBatch
from ..drafter.protocol import Drafter
from ..request_state import StateBatch
from ..scorer import WithoutCurve
from ..serving.stepper import HVDStepper
from ..verify import MAX_TREE_NODES, VerifyShape


class TruthScorer(WithoutCurve):
    """A scorer (scorer.Scorer) whose value per row is the true accepted length of its cache
    chain: ``rows`` (set before each batch) holds what each row's recording emits next."""

    reads_trees = False

    def __init__(self):
        self.rows: list[np.ndarray] = []

    @property
    def extractor(self) -> TruthScorer:
        return self

    def features(self, drafts: DraftBatch, states: StateBatch, trees: RowTreeBatch | None = None) -> np.ndarray:
        if len(self.rows) != len(drafts):
            raise ValueError(f"the truth holds {len(self.rows)} rows for a batch of {len(drafts)}")
        out = np.zeros((len(drafts), 1), dtype=np.float32)
        for i, (length, truth) in enumerate(zip(drafts.lengths.tolist(), self.rows)):
            n = min(length, len(truth))
            miss = np.flatnonzero(drafts.tokens[i, :n] != truth[:n])
            out[i, 0] = miss[0] if len(miss) else n
        return out

    def predict(self, features: np.ndarray) -> np.ndarray:
        return features[:, 0]


class ExactStepper(HVDStepper):
    """The serving stepper with a TruthScorer: ``outputs`` maps each request id to the
    output its recording holds, read past what the request has emitted at each step."""

    def __init__(self, drafter: Drafter, outputs: Mapping[str, np.ndarray], shape: VerifyShape, rule: DecisionRule,
                 cost: CostRule):
        if not cost.exact:
            raise ValueError("ExactStepper prices true accepted lengths: give it a CostRule(exact=True)")
        self.truth = TruthScorer()
        super().__init__(drafter, self.truth, shape, rule=rule, step=cost)  # the scorer decide asks
        self._outputs = outputs

    def plan(self, rids: Sequence[str]) -> BatchPlan:
        self.truth.rows = [self._outputs[r][len(self._reqs[r].output):][:MAX_TREE_NODES] for r in rids]
        return super().plan(rids)
