"""The served verify: its shape, and what an EAGLE3 draft yields at it.

SGLang verifies one row of ``num_draft_tokens`` (N) tokens per request and step: the
root (the last verified token) and N-1 draft nodes. With ``--speculative-eagle-topk 1``
the nodes form a chain of ``num_steps`` (S) tokens (N = S + 1). With topk K > 1 they
form a tree: EAGLE3 expands K branches for S steps and keeps the N-1 best-scoring
candidates, so ``N - 1 <= K + (S - 1) * K**2`` (SGLang's own bound).

HVD rewrites chosen rows into one of three shapes (RowPlan):
  the EAGLE3 tree      untouched: N-1 EAGLE3 nodes
  a cache chain        L <= N-1 cache tokens, nothing else
  a two-branch row     L cache tokens and EAGLE3's first M nodes under the same root,
                       L + M <= N-1 (topk > 1 only: the tree verify moves the accepted
                       path's KV to the row front, which topk 1 skips)

EAGLE3's yield (tokens per verify, bonus included) as a function of the draft nodes it
keeps is the ``Eagle3Curve``: points ``nodes:tokens``, linear between them, flat after
the last, 1.0 at 0 nodes (the bonus token alone). Replay has no EAGLE3 model, so this
curve *is* EAGLE3 in replay; the decision module reads it too (an EAGLE3 row is worth
curve(N-1) tokens). VerifyModel (the shape and the curve) says what one verify of a row
plan emits; replay, calibration and the gate's spec use it. Measure yours: tokens per
verify of an EAGLE3-only server at each ``--speculative-num-draft-tokens``.

Default curve: 1.75 at 3 nodes is the HVD paper's EAGLE3 figure on these workloads
(chain of 3); 1 and 2 nodes follow a per-token acceptance of 0.45 fitted to it; 7 and
15 nodes (trees at topk 2 and 4) assume +11% and +20% over the chain, the order of
EAGLE-2's tree-over-chain gain. These tree points are an assumption, not a measurement.
"""

from __future__ import annotations

import bisect
import dataclasses
import math

CACHE, EAGLE3, GREEDY = "cache", "eagle3", "greedy"  # RowPlan.kind
MAX_TREE_NODES = 63  # draft nodes per row the worker's tree rows handle (one int64 ancestor mask per node)


@dataclasses.dataclass(frozen=True, slots=True)
class RowPlan:
    """One row's shape: ``cache_len`` cache tokens, ``eagle_nodes`` EAGLE3 nodes.

    (0, N-1): the EAGLE3 tree; (L, 0): a cache chain; (L, M): two branches; (0, 0): a
    plain step (no draft at all; replay's greedy and cache_only without a draft).
    """

    cache_len: int
    eagle_nodes: int

    @property
    def kind(self) -> str:
        if self.cache_len:
            return CACHE
        return EAGLE3 if self.eagle_nodes else GREEDY


def widest_nodes(topk: int, steps: int) -> int:
    """The most tokens a verify row holds when EAGLE3 drafts ``steps`` steps at ``topk``:
    the root and the ``topk + (steps - 1) * topk**2`` candidates SGLang's tree picks from
    (a chain, topk 1: ``steps + 1``)."""
    return 1 + topk + (steps - 1) * topk ** 2


@dataclasses.dataclass(frozen=True, slots=True)
class VerifyShape:
    """SGLang's verify shape: ``--speculative-eagle-topk``, ``--speculative-num-steps``,
    ``--speculative-num-draft-tokens`` (N, the root included)."""

    topk: int = dataclasses.field(default=4, metadata={
        "help": "EAGLE3 branches per step (SGLang --speculative-eagle-topk)"})
    steps: int = dataclasses.field(default=3, metadata={
        "help": "EAGLE3 draft steps (SGLang --speculative-num-steps)"})
    nodes: int = dataclasses.field(default=16, metadata={
        "help": "tokens per verify row, the root included (SGLang --speculative-num-draft-tokens); "
                "a cache draft is verified up to nodes - 1 tokens at a time"})

    def __post_init__(self):
        if self.topk < 1 or self.steps < 1 or self.nodes < 2:
            raise ValueError(f"verify shape needs topk >= 1, steps >= 1 and nodes >= 2, got {self.describe()}")
        if self.topk == 1 and self.nodes != self.steps + 1:
            raise ValueError(
                f"with topk 1 a verify row is a chain: nodes must be steps + 1 = {self.steps + 1}, got {self.nodes}")
        bound = widest_nodes(self.topk, self.steps) - 1
        if self.nodes - 1 > bound:
            steps = f"{self.steps} step{'' if self.steps == 1 else 's'}"
            raise ValueError(f"nodes - 1 = {self.nodes - 1} exceeds what EAGLE3 drafts at topk {self.topk}, {steps} "
                             f"(topk + (steps - 1) * topk^2 = {bound})")

    @property
    def draft_nodes(self) -> int:
        """Draft tokens per row (N - 1): the most cache tokens one verify checks."""
        return self.nodes - 1

    @property
    def allows_branches(self) -> bool:
        """Two-branch rows need SGLang's tree path (topk > 1): it moves the accepted
        path's KV, predictions and hidden states to the row front; topk 1 assumes the
        accepted path is the chain's prefix."""
        return self.topk > 1

    def describe(self) -> str:
        return f"topk {self.topk}, steps {self.steps}, {self.nodes} nodes"

    def sglang_flags(self) -> str:
        return (f"--speculative-eagle-topk {self.topk} --speculative-num-steps {self.steps} "
                f"--speculative-num-draft-tokens {self.nodes}")

    def to_json(self) -> dict[str, int]:
        return {"topk": self.topk, "steps": self.steps, "nodes": self.nodes}

    @classmethod
    def from_json(cls, d: dict) -> VerifyShape:
        return cls(topk=int(d["topk"]), steps=int(d["steps"]), nodes=int(d["nodes"]))


TOPK1_SHAPE = VerifyShape(topk=1, steps=3, nodes=4)  # what HVD served before tree rows


@dataclasses.dataclass(frozen=True, slots=True)
class Eagle3Curve:
    """EAGLE3 tokens per verify (bonus included) by draft nodes verified: ``((nodes,
    tokens), ...)``, nodes ascending, tokens >= 1 and non-decreasing."""

    points: tuple[tuple[int, float], ...] = ((1, 1.45), (2, 1.66), (3, 1.75), (7, 1.95), (15, 2.1))

    def __post_init__(self):
        if not self.points:
            raise ValueError("the EAGLE3 curve needs at least one NODES:TOKENS point")
        nodes = [n for n, _ in self.points]
        tokens = [t for _, t in self.points]
        if nodes[0] < 1 or any(b <= a for a, b in zip(nodes, nodes[1:])):
            raise ValueError(f"EAGLE3 curve nodes must be >= 1 and strictly ascending, got {nodes}")
        if tokens[0] < 1.0 or any(b < a for a, b in zip(tokens, tokens[1:])):
            raise ValueError(f"EAGLE3 curve tokens must be >= 1 (the bonus token) and non-decreasing, got {tokens}")

    def tokens(self, nodes: int) -> float:
        """Expected tokens per verify with ``nodes`` EAGLE3 draft nodes (1.0 at 0)."""
        if nodes <= 0:
            return 1.0
        return self._at(nodes, *self._knots())

    def tokens_upto(self, nodes: int) -> list[float]:
        """``[tokens(0), tokens(1), ..., tokens(nodes)]``, the same values in one call."""
        xs, ys = self._knots()
        return [1.0] + [self._at(m, xs, ys) for m in range(1, nodes + 1)]

    def _knots(self) -> tuple[list[int], list[float]]:
        """The interpolation's knots: (0, 1.0) and the points."""
        return [0] + [n for n, _ in self.points], [1.0] + [t for _, t in self.points]

    @staticmethod
    def _at(nodes: int, xs: list[int], ys: list[float]) -> float:
        if nodes >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, nodes)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (nodes - x0) / (x1 - x0)

    def text(self) -> str:
        return ",".join(f"{n}:{t:g}" for n, t in self.points)

    @classmethod
    def parse(cls, text: str) -> Eagle3Curve:
        """``"1:1.45,3:1.75,15:2.1"`` -> Eagle3Curve(((1, 1.45), (3, 1.75), (15, 2.1)))."""
        points = []
        for item in text.split(","):
            nodes, sep, tokens = item.strip().partition(":")
            try:
                if not sep:
                    raise ValueError
                points.append((int(nodes), float(tokens)))
            except ValueError:
                raise ValueError(
                    f"bad EAGLE3 curve point {item!r}; expected NODES:TOKENS, e.g. 3:1.75,15:2.1") from None
        return cls(tuple(points))

    @classmethod
    def constant(cls, tokens: float) -> Eagle3Curve:
        """``tokens`` per verify at any node count >= 1 (a one-number EAGLE3 model)."""
        return cls(((1, float(tokens)),))


class Eagle3Stream:
    """Whole tokens per EAGLE3 verify of one request, realising the curve's means by
    carrying the fraction: at a constant 1.75 the steps emit 1, 2, 2, 2, 1, 2, 2, 2, ...
    (floor((k+1)m) - floor(km)); rows with fewer nodes draw a smaller mean."""

    __slots__ = ("credit",)

    def __init__(self):
        self.credit = 0.0

    def draw(self, mean: float) -> int:
        before = math.floor(self.credit + 1e-9)
        self.credit += mean
        return math.floor(self.credit + 1e-9) - before


@dataclasses.dataclass(frozen=True, slots=True)
class VerifyModel:
    """What a verify step yields, modelled (replay, calibration, the gate's labels).

    A row's plan holds L cache tokens and M EAGLE3 nodes. Under greedy verification the
    cache branch's accepted length is exact: a = min(LCP(draft, recorded output), L).
    SGLang's tree verify tries the cache branch first (it is the root's first child), so

      a >= 1                 the cache branch: a + 1 tokens (the bonus token included)
      a == 0 and M > 0       EAGLE3's branch: a draw from the EAGLE3 curve at M nodes
      a == 0 and M == 0      the bonus token alone: 1

    Replay has no EAGLE3 draft model: an EAGLE3 branch yields whole tokens realising the
    curve's mean (Eagle3Stream, one stream per request and policy, so every policy sees
    the same realisation for the same node counts).
    """

    shape: VerifyShape = VerifyShape()
    eagle3: Eagle3Curve = Eagle3Curve()

    @property
    def eagle3_tokens(self) -> float:
        """Expected tokens of an untouched EAGLE3 row (its N-1 nodes)."""
        return self.eagle3.tokens(self.shape.draft_nodes)

    def cache_accept_len(self, accept_len: int) -> int:
        """What a cache chain of the whole row accepts of a draft whose LCP is accept_len."""
        return min(accept_len, self.shape.draft_nodes)

    def out_len(self, plan: RowPlan, accept_len: int, stream: Eagle3Stream, eagle3_cap: int = MAX_TREE_NODES) -> int:
        """Tokens one verify emits for ``plan`` when the cache draft's LCP is ``accept_len``;
        its EAGLE3 nodes valued at no more than ``eagle3_cap`` (a step's tier drafted in fewer
        steps than the curve's trees of as many nodes: tiers.eagle3_depth_cap)."""
        a = min(accept_len, plan.cache_len)
        if a or not plan.eagle_nodes:
            return a + 1
        return stream.draw(self.eagle3.tokens(min(plan.eagle_nodes, eagle3_cap)))

    def to_json(self) -> dict:
        return {"shape": self.shape.to_json(), "eagle3_curve": self.eagle3.text()}

    @classmethod
    def from_json(cls, d: dict) -> VerifyModel:
        return cls(VerifyShape.from_json(d["shape"]), Eagle3Curve.parse(d["eagle3_curve"]))
