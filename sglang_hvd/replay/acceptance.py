"""What a verify step yields in replay: the served verify, modelled.

A row's plan (policy.RowPlan) holds L cache tokens and M EAGLE3 nodes. Under greedy
verification the cache branch's accepted length is exact: a = min(LCP(draft, recorded
output), L). SGLang's tree verify tries the cache branch first (it is the root's first
child), so

  a >= 1                 the cache branch: a + 1 tokens (the bonus token included)
  a == 0 and M > 0       EAGLE3's branch: a draw from the EAGLE3 curve at M nodes
  a == 0 and M == 0      the bonus token alone: 1

Replay has no EAGLE3 draft model: an EAGLE3 branch yields whole tokens realising the
curve's mean (verify.Eagle3Stream, one stream per request and policy, so every policy
sees the same realisation for the same node counts). Every step is capped by what is
left of the recorded output.
"""

from __future__ import annotations

import dataclasses

from ..policy import RowPlan
from ..verify import Eagle3Curve, Eagle3Stream, VerifyShape


@dataclasses.dataclass(frozen=True, slots=True)
class VerifyModel:
    shape: VerifyShape = VerifyShape()
    eagle3: Eagle3Curve = Eagle3Curve()

    @property
    def eagle3_tokens(self) -> float:
        """Expected tokens of an untouched EAGLE3 row (its N-1 nodes)."""
        return self.eagle3.tokens(self.shape.draft_nodes)

    def cache_accept_len(self, accept_len: int) -> int:
        """What a cache chain of the whole row accepts of a draft whose LCP is accept_len."""
        return min(accept_len, self.shape.draft_nodes)

    def out_len(self, plan: RowPlan, accept_len: int, stream: Eagle3Stream) -> int:
        """Tokens one verify emits for ``plan`` when the cache draft's LCP is ``accept_len``."""
        a = min(accept_len, plan.cache_len)
        if a or not plan.eagle_nodes:
            return a + 1
        return stream.draw(self.eagle3.tokens(plan.eagle_nodes))

    def to_json(self) -> dict:
        return {"shape": self.shape.to_json(), "eagle3_curve": self.eagle3.text()}

    @classmethod
    def from_json(cls, d: dict) -> VerifyModel:
        return cls(VerifyShape.from_json(d["shape"]), Eagle3Curve.parse(d["eagle3_curve"]))
