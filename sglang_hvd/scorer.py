"""The scorer: what turns a batch's features into the values the decision compares with its threshold.

decision.decide runs drafts -> features -> scorer -> plans: it builds the features with the
scorer's ``extractor`` (row trees first when ``reads_trees``), asks ``predict`` once per
batch, and compares each value with the rule's threshold. A scorer never calls back into
the decision. Two implement it:

  gate.Gate    the trained MLP in ONNX over the gate features (features.FeatureExtractor):
               the predicted accept_len of each cache draft; a gate that learned a payoff
               curve also offers ``predict_curve`` (the value and each draft's survival
               by width, from one run), which a cost rule prices widths by (payoff.py)
  ScoreRule    ArcticInference's rule served by HVD over one feature, the draft's score
               (ScoreFeature: the sum of its token probabilities, exact in float64, as
               replay's rule reads it); no onnxruntime call

Both are served the same way (``ServedScorer``): the gate.json they come from (``spec``),
the rule they decide with, the digest /server_info reports.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from .drafter.protocol import DrafterConfig
from .gate_spec import GateError

if TYPE_CHECKING:
    from .decision import DecisionRule
    from .drafter.batch import DraftBatch, RowTreeBatch
    from .gate import Gate
    from .gate_spec import GateSpec
    from .request_state import StateBatch
    from .verify import VerifyModel


class FeatureSource(Protocol):
    """Builds a scorer's input ``[B, F]`` from a batch (features.FeatureExtractor, ScoreFeature)."""

    def features(self, drafts: DraftBatch, states: StateBatch, trees: RowTreeBatch | None = None) -> np.ndarray: ...


@runtime_checkable
class Scorer(Protocol):
    """``predict(extractor.features(...) [B, F]) -> [B]`` values compared with a DecisionRule's threshold."""

    @property
    def extractor(self) -> FeatureSource: ...

    @property
    def reads_trees(self) -> bool:
        """Whether its features describe the rows' row trees (the decision grows them first)."""
        ...

    def predict(self, features: np.ndarray) -> np.ndarray: ...

    def predict_curve(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``predict``'s values and, from the same run, each row's payoff curve ``[B, W]``
        (payoff.py; None from a scorer that learned none: the decision prices widths by the
        geometric model). What decision.decide asks."""
        ...


class WithoutCurve:
    """A scorer that learned no payoff curve: ``predict_curve`` is ``predict``'s values and None."""

    curve_width = 0

    def predict_curve(self, features: np.ndarray) -> tuple[np.ndarray, None]:
        return self.predict(features), None


@runtime_checkable
class ServedScorer(Scorer, Protocol):
    """A scorer a server runs: with the gate it comes from and the rule it serves."""

    spec: GateSpec
    rule: DecisionRule
    digest: str  # a hash of the gate's content (gate.gate_digest)
    curve_width: int  # widths of its payoff curve (0: none; /server_info payoff_model)
    gate_dir: str

    @property
    def decision(self) -> str:
        """How rows are chosen, as /server_info and the start-up log say it."""
        ...

    @property
    def drafter_config(self) -> DrafterConfig: ...

    @property
    def verify_model(self) -> VerifyModel: ...


class ScoreRule(WithoutCurve):
    """The score rule in the gate's place: a row verifies its cache draft when the draft's
    score is at least ``min_score``; the rows are built as the gate's would be (its verify
    shape, drafter settings and EAGLE3 reserve). ``min_score`` None: the gate's calibrated
    ``rule_threshold`` (the best constant of the chain-only rule on validation).

    decision.decide compares ``predict`` (the scores) with ``rule.threshold``, the largest
    float below ``min_score`` (score > it <=> score >= min_score), exactly as it compares a
    gate's predictions.

    Worked example: min_score 3.0; drafts of scores 3.0, 2.5 and none -> a cache row, the
    EAGLE3 row, the EAGLE3 row.
    """

    reads_trees = False  # the chain's score alone

    def __init__(self, gate: Gate, min_score: float | None = None):
        if min_score is None:
            min_score = gate.spec.rule_threshold
            if min_score is None:
                raise GateError(
                    f"{gate.gate_dir}: gate.json has no calibrated rule_threshold; give the score explicitly")
        if not math.isfinite(min_score):
            raise GateError(f"the score rule needs a finite minimum score, got {min_score}")
        self.gate_dir = gate.gate_dir
        self.spec = gate.spec
        self.extractor = ScoreFeature()
        self.min_score = float(min_score)
        self.rule = dataclasses.replace(gate.rule, threshold=math.nextafter(self.min_score, -math.inf))
        self.digest = gate.digest  # the settings it serves with are the gate's

    @property
    def decision(self) -> str:
        return f"score >= {self.min_score:g}"

    @property
    def drafter_config(self) -> DrafterConfig:
        return self.spec.drafter

    @property
    def verify_model(self) -> VerifyModel:
        return self.spec.verify

    def predict(self, features: np.ndarray) -> np.ndarray:
        return features[:, 0]


class ScoreFeature:
    """The score rule's one feature ``[B, 1]`` float64: each draft's score (0: no draft)."""

    def features(self, drafts: DraftBatch, states: StateBatch, trees: RowTreeBatch | None = None) -> np.ndarray:
        return drafts.score[:, None].astype(np.float64)
