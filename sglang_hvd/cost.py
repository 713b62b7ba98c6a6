"""Modelled decode time: verify cycles weighted by what each kind of step costs (gate.json
keeps the costs a gate was calibrated with).

Units: one plain target forward = 1.0. Defaults count cycles (every verify costs the
same), the measure HVD's own figures report. A deployment that measured its step times
sets them: e.g. an EAGLE3 step that pays its draft model (``eagle3``), a cache verify
whose cost grows with draft width (``cache_per_token``).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol


class StepCounts(Protocol):
    """What a tally counts (replay.metrics.PolicyTally)."""

    cycles: int
    tokens: int
    cache_steps: int
    eagle3_steps: int
    cache_draft_tokens: int


@dataclasses.dataclass(frozen=True, slots=True)
class CostModel:
    greedy: float = dataclasses.field(
        default=1.0, metadata={"help": "cost of a plain decode step (one target forward)"})
    eagle3: float = dataclasses.field(default=1.0, metadata={"help": "cost of an EAGLE3 draft + verify step"})
    cache: float = dataclasses.field(default=1.0, metadata={"help": "cost of a cache-draft verify step"})
    cache_per_token: float = dataclasses.field(default=0.0, metadata={
        "help": "extra cost per cache draft token verified (wider verify)"})

    def __post_init__(self):
        if min(self.greedy, self.eagle3, self.cache) <= 0 or self.cache_per_token < 0:
            raise ValueError("step costs must be > 0 and cache_per_token >= 0")

    def time_per_1k(self, t: StepCounts) -> float:
        """Modelled decode time per 1,000 output tokens."""
        greedy_steps = t.cycles - t.cache_steps - t.eagle3_steps
        total = (greedy_steps * self.greedy + t.eagle3_steps * self.eagle3 + t.cache_steps * self.cache
                 + t.cache_draft_tokens * self.cache_per_token)
        return 1000.0 * total / max(t.tokens, 1)
