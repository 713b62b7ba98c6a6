"""Per-policy decode metrics, accumulated per source and overall.

cycles_per_1k       verify cycles per 1,000 output tokens (lower is better; greedy = 1000)
tokens_per_verify   output tokens per verify cycle (= 1000 / cycles_per_1k)
cache_pick_rate     share of cycles whose row held a cache branch (chain or two-branch)
two_branch_rate     share of cycles whose row held a cache branch and EAGLE3 nodes
mean_cache_accept   mean cache tokens accepted over those verifies (bonus excluded)
cache_high_share    share of those verifies that accepted >= 6 cache tokens (high payoff)
time_per_1k         modelled decode time per 1,000 output tokens, in milliseconds, under a
                    step-time profile (fleet replay with --profile; absent without one)
tokens_per_s        output tokens per second of that modelled time
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ..verify import RowPlan

HIGH_PAYOFF_ACCEPT_LEN = 6


@dataclasses.dataclass(slots=True)
class PolicyTally:
    cycles: int = 0
    tokens: int = 0
    cache_steps: int = 0
    cache_accepted: int = 0
    cache_high: int = 0
    cache_draft_tokens: int = 0  # cache tokens verified
    eagle3_steps: int = 0
    two_branch_steps: int = 0
    time_ms: float = 0.0  # modelled time of these verifies (a profile's, shared equally by a step's rows)

    def add_step(self, plan: RowPlan, out_len: int, accept_len: int, time_ms: float = 0.0) -> None:
        """One verify of ``plan``; ``accept_len``: the cache draft's LCP (capped at the row);
        ``time_ms``: this row's share of the step's modelled time."""
        self.cycles += 1
        self.time_ms += time_ms
        self.tokens += out_len
        if plan.cache_len:
            accepted = min(accept_len, plan.cache_len)
            self.cache_steps += 1
            self.cache_draft_tokens += plan.cache_len
            self.cache_accepted += accepted
            self.cache_high += accepted >= HIGH_PAYOFF_ACCEPT_LEN
            self.two_branch_steps += plan.eagle_nodes > 0
        elif plan.eagle_nodes:
            self.eagle3_steps += 1

    def merge(self, other: PolicyTally) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_json(self) -> dict[str, float]:
        c = max(self.cycles, 1)
        cs = max(self.cache_steps, 1)
        timed = {"time_per_1k": 1000.0 * self.time_ms / max(self.tokens, 1),
                 "tokens_per_s": 1000.0 * self.tokens / self.time_ms} if self.time_ms > 0 else {}
        return {
            **timed,
            "cycles_per_1k": 1000.0 * self.cycles / max(self.tokens, 1),
            "tokens_per_verify": self.tokens / c,
            "cache_pick_rate": self.cache_steps / c,
            "two_branch_rate": self.two_branch_steps / c,
            "mean_cache_accept": self.cache_accepted / cs if self.cache_steps else 0.0,
            "cache_high_share": self.cache_high / cs if self.cache_steps else 0.0,
            "cycles": self.cycles,
            "tokens": self.tokens,
            "cache_steps": self.cache_steps,
            "eagle3_steps": self.eagle3_steps,
            "cache_draft_tokens": self.cache_draft_tokens,
            "two_branch_steps": self.two_branch_steps,
        }


COLUMNS = ("cycles/1k", "tokens/verify", "cache pick", "two-branch", "mean cache accept", "cache accept>=6")


def table_row(name: str, tally: PolicyTally) -> tuple:
    j = tally.to_json()
    return (name, j["cycles_per_1k"], j["tokens_per_verify"], f"{100 * j['cache_pick_rate']:.1f}%",
            f"{100 * j['two_branch_rate']:.1f}%", j["mean_cache_accept"], f"{100 * j['cache_high_share']:.1f}%")


@dataclasses.dataclass(slots=True)
class SourceTally:
    requests: int = 0
    tokens: int = 0
    policies: dict[str, PolicyTally] = dataclasses.field(default_factory=dict)

    def policy(self, name: str) -> PolicyTally:
        t = self.policies.get(name)
        if t is None:
            t = self.policies[name] = PolicyTally()
        return t

    def to_json(self) -> dict:
        return {"requests": self.requests, "tokens": self.tokens,
                "policies": {n: t.to_json() for n, t in self.policies.items()}}


def overall(sources: Iterable[SourceTally]) -> SourceTally:
    total = SourceTally()
    for s in sources:
        total.requests += s.requests
        total.tokens += s.tokens
        for name, t in s.policies.items():
            total.policy(name).merge(t)
    return total
