"""Verify policies: which draft a request verifies at one decode step.

Each policy sees a StepView (what the server knows before the verify) and returns one
of CACHE, EAGLE3, GREEDY. Replay compares them on the same traces:

  greedy       no speculation: one token per cycle
  eagle3_only  always the EAGLE3 draft
  cache_only   SuffixDecoding: the cache draft whenever there is one, else a plain step
  rule@c       the cache draft when its score >= c, else EAGLE3 (ArcticInference's rule)

The learned gate and the oracle plug in through the same interface (``needs_draft``
tells replay to draft at the positions a policy visits).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar, Protocol

from ..drafter.protocol import Draft

CACHE, EAGLE3, GREEDY = "cache", "eagle3", "greedy"


@dataclasses.dataclass(frozen=True, slots=True)
class StepView:
    """What a policy may know before one verify of one request."""

    req_id: str
    source: str
    pos: int  # output tokens generated so far
    num_prompt_tokens: int
    draft: Draft  # the cache draft at this position (empty if the policy needs none)
    oracle_accept_len: int
    """The draft's true accepted length. Only the oracle policy may read this."""


class Policy(Protocol):
    name: str
    needs_draft: ClassVar[bool]

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


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyOptions:
    """Settings the policy factories draw on."""

    rule_thresholds: tuple[float, ...] = (3.0,)
    eagle3_tokens_per_cycle: float = 1.75


# name -> factory(options) -> policies (a name may expand to several, e.g. one rule per
# threshold). Later policies register themselves here; nothing dispatches on names.
POLICY_FACTORIES: dict[str, Callable[[PolicyOptions], list[Policy]]] = {
    "greedy": lambda o: [Greedy()],
    "eagle3_only": lambda o: [Eagle3Only()],
    "cache_only": lambda o: [CacheOnly()],
    "rule": lambda o: [ScoreRule(t) for t in o.rule_thresholds],
    "oracle": lambda o: [Oracle(o.eagle3_tokens_per_cycle)],
}
BASELINES = ("greedy", "eagle3_only", "cache_only", "rule")


def make_policies(names: list[str], options: PolicyOptions) -> list[Policy]:
    unknown = [n for n in names if n not in POLICY_FACTORIES]
    if unknown:
        raise ValueError(f"unknown policy {unknown[0]!r}; choose from {', '.join(POLICY_FACTORIES)}")
    return [policy for name in names for policy in POLICY_FACTORIES[name](options)]
