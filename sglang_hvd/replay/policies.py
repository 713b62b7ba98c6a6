"""Verify policies: which draft a request verifies at one decode step.

Each policy sees a StepView (what the server knows before the verify) and returns one
of CACHE, EAGLE3, GREEDY. Replay compares them on the same traces:

  greedy       no speculation: one token per cycle
  eagle3_only  always the EAGLE3 draft
  cache_only   SuffixDecoding: the cache draft whenever there is one, else a plain step
  rule@c       the cache draft when its score >= c, else EAGLE3 (ArcticInference's rule)
  hvd          the learned gate: the cache draft when predicted accept_len > threshold
  oracle       the cache draft exactly when its true accept_len + 1 beats EAGLE3's mean

The learned gate and the oracle plug in through the same interface (``needs_draft``
tells replay to draft at the positions a policy visits).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import ClassVar, Protocol

from ..drafter.protocol import Draft
from ..features import FeatureInput, RequestHistory

CACHE, EAGLE3, GREEDY = "cache", "eagle3", "greedy"


@dataclasses.dataclass(frozen=True, slots=True)
class StepView:
    """What a policy may know before one verify of one request."""

    req_id: str
    source: str
    pos: int  # output tokens generated so far
    num_prompt_tokens: int
    draft: Draft  # the cache draft at this position (empty if the policy needs none)
    tail: Sequence[int]  # the last few context tokens (features.TAIL_TOKENS)
    history: RequestHistory  # this request's earlier drafts under this policy (before this one)
    oracle_accept_len: int
    """The draft's true accepted length. Only the oracle policy may read this."""


class Policy(Protocol):
    name: str
    needs_draft: ClassVar[bool]  # replay drafts where this policy stands
    # (optional) needs_history: ClassVar[bool]: replay keeps a RequestHistory for it


    def decide(self, view: StepView) -> str: ...


class Greedy:
    name = "greedy"
    needs_draft = False

    def decide(self, view: StepView) -> str:
        return GREEDY


class Eagle3Only:
    name = "eagle3_only"
    needs_draft = False

    def decide(self, view: StepView) -> str:
        return EAGLE3


class CacheOnly:
    name = "cache_only"
    needs_draft = True

    def decide(self, view: StepView) -> str:
        return CACHE if view.draft.tokens else GREEDY


class ScoreRule:
    """Cache draft when its score >= threshold, else EAGLE3."""

    needs_draft = True

    def __init__(self, threshold: float):
        self.threshold = threshold
        self.name = f"rule@{threshold:g}"

    def decide(self, view: StepView) -> str:
        return CACHE if view.draft.tokens and view.draft.score >= self.threshold else EAGLE3


class Oracle:
    """Cache draft exactly when its true yield (accept_len + 1) beats EAGLE3's expectation."""

    name = "oracle"
    needs_draft = True

    def __init__(self, eagle3_tokens_per_cycle: float):
        self.eagle3_tokens_per_cycle = eagle3_tokens_per_cycle

    def decide(self, view: StepView) -> str:
        return CACHE if view.oracle_accept_len + 1 > self.eagle3_tokens_per_cycle else EAGLE3


class GatePolicy:
    """HVD: the cache draft when the gate predicts accept_len > threshold, else EAGLE3.

    Keeps ``(source, predicted, true accept_len)`` of every draft it judged, for the
    gate's precision/recall report.
    """

    needs_draft = True
    needs_history = True

    def __init__(self, gate, threshold: float | None = None, name: str = "hvd"):
        self.gate = gate
        self.threshold = gate.threshold if threshold is None else threshold
        self.name = name
        self.judged: list[tuple[str, float, int]] = []

    def decide(self, view: StepView) -> str:
        if not view.draft.tokens:
            return EAGLE3
        row = FeatureInput(view.draft, view.pos, view.num_prompt_tokens, view.tail, view.history.scalars())
        predicted = float(self.gate.predict(self.gate.extractor([row]))[0])
        self.judged.append((view.source, predicted, view.oracle_accept_len))
        return CACHE if predicted > self.threshold else EAGLE3


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyOptions:
    """Settings the policy factories draw on."""

    rule_thresholds: tuple[float, ...] = (3.0,)
    eagle3_tokens_per_cycle: float = 1.75
    gate: object | None = None  # a sglang_hvd.gate.Gate, for the hvd policy
    gate_thresholds: tuple[float, ...] = ()  # extra hvd@T policies (threshold sweeps)


def _gate_policies(o: PolicyOptions) -> list[Policy]:
    if o.gate is None:
        raise ValueError("the hvd policy needs a gate (--gate GATE_DIR)")
    return [GatePolicy(o.gate)] + [GatePolicy(o.gate, t, name=f"hvd@{t:g}") for t in o.gate_thresholds]


# name -> factory(options) -> policies (a name may expand to several, e.g. one rule per
# threshold). Later policies register themselves here; nothing dispatches on names.
POLICY_FACTORIES: dict[str, Callable[[PolicyOptions], list[Policy]]] = {
    "greedy": lambda o: [Greedy()],
    "eagle3_only": lambda o: [Eagle3Only()],
    "cache_only": lambda o: [CacheOnly()],
    "rule": lambda o: [ScoreRule(t) for t in o.rule_thresholds],
    "oracle": lambda o: [Oracle(o.eagle3_tokens_per_cycle)],
    "hvd": _gate_policies,
}
BASELINES = ("greedy", "eagle3_only", "cache_only", "rule")


def make_policies(names: list[str], options: PolicyOptions) -> list[Policy]:
    unknown = [n for n in names if n not in POLICY_FACTORIES]
    if unknown:
        raise ValueError(f"unknown policy {unknown[0]!r}; choose from {', '.join(POLICY_FACTORIES)}")
    return [policy for name in names for policy in POLICY_FACTORIES[name](options)]
