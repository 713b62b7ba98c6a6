"""Verify tiers: the shapes one server can verify at, no speculation included.

A tier is a verify shape (``VerifyShape``: topk, steps, nodes), written
``TOPK-STEPS-NODES`` (``4-3-16``, ``1-3-4``), or ``off``: a plain decode step, one token
per row and no draft at all. The cost-aware decision (decision.py) picks one tier per
step for the whole batch; every row of that step is planned at that tier's shape.

One server verifies at tiers of its own topk only (SGLang's EAGLE3 draft worker drafts at
one topk) and never wider than the shape it was started at: ``ladder(shape)`` is the set
a server started at ``shape`` chooses from unless told otherwise.
"""

from __future__ import annotations

import dataclasses
import functools

from .verify import MAX_TREE_NODES, VerifyShape, widest_nodes

OFF = "off"


@dataclasses.dataclass(frozen=True, slots=True)
class Tier:
    shape: VerifyShape | None = None  # None: no speculation

    @property
    def name(self) -> str:
        s = self.shape
        return OFF if s is None else f"{s.topk}-{s.steps}-{s.nodes}"

    @property
    def speculates(self) -> bool:
        return self.shape is not None

    @property
    def tokens_per_row(self) -> int:
        """Tokens one row of this tier's verify forward holds (N; 1 for a plain step)."""
        return 1 if self.shape is None else self.shape.nodes

    @property
    def draft_nodes(self) -> int:
        """Draft tokens per row (N-1; 0 for a plain step)."""
        return 0 if self.shape is None else self.shape.draft_nodes

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, text: str) -> Tier:
        """``"off"`` or ``"TOPK-STEPS-NODES"``: ``"4-3-16"`` -> Tier(VerifyShape(4, 3, 16))."""
        t = text.strip().lower()
        if t == OFF:
            return cls()
        parts = t.split("-")
        try:
            if len(parts) != 3:
                raise ValueError
            topk, steps, nodes = (int(p) for p in parts)
        except ValueError:
            raise ValueError(f"bad tier {text!r}; expected off or TOPK-STEPS-NODES, e.g. 4-3-16 or 1-3-4") from None
        try:
            return cls(VerifyShape(topk, steps, nodes))
        except ValueError as e:
            raise ValueError(f"tier {text!r}: {e}") from None


def parse_tiers(text: str, with_off: bool = False) -> tuple[Tier, ...]:
    """``"1-3-4,4-3-16"`` -> the tiers, in order, without repeats (``with_off``: ``off``
    added in front when missing)."""
    tiers: list[Tier] = [Tier()] if with_off else []
    for item in text.split(","):
        if item.strip():
            t = Tier.parse(item)
            if t not in tiers:
                tiers.append(t)
    if not tiers:
        raise ValueError("name at least one tier, e.g. 1-3-4,4-3-16")
    return tuple(tiers)


def steps_for(topk: int, nodes: int) -> int:
    """The fewest EAGLE3 steps whose tree at ``topk`` fills a row of ``nodes`` tokens
    (``widest_nodes(topk, steps) >= nodes``; a chain: ``nodes - 1``)."""
    steps = 1
    while widest_nodes(topk, steps) < nodes:
        steps += 1
    return steps


def _halved(shape: VerifyShape) -> list[Tier]:
    """The served shape and its tiers of halved widths down to 2 nodes, narrowest first, each
    drafted in the fewest steps that fill it (the served shape keeps its own steps)."""
    tiers = [Tier(shape)]
    nodes = shape.nodes // 2
    while nodes >= 2:
        tiers.append(Tier(VerifyShape(shape.topk, steps_for(shape.topk, nodes), nodes)))
        nodes //= 2
    return list(reversed(tiers))


def ladder(shape: VerifyShape) -> tuple[Tier, ...]:
    """``off``, the served shape's tiers of halved widths down to 2 nodes, each drafted in
    the fewest steps that fill it, the served shape and, at topk > 1, for each EAGLE3 step
    count below the served one the widest tree it fills (capped at the served width): the
    most a step's draft time buys (4-1-5: a one-step tree's 4 candidates, or a 4-token cache
    chain) and the served width in fewer steps (4-2-16: a cheaper EAGLE3 draft beside a
    full-width cache branch). Narrowest first: 4-3-16 -> off, 4-1-2, 4-1-4, 4-1-5, 4-2-8,
    4-2-16, 4-3-16; 1-3-4 -> off, 1-1-2, 1-3-4 (a chain's step count is its width: the
    halved widths sample them)."""
    tiers = _halved(shape)
    if shape.topk > 1:
        for steps in range(1, shape.steps):
            tier = Tier(VerifyShape(shape.topk, steps, min(shape.nodes, widest_nodes(shape.topk, steps))))
            if tier not in tiers:
                tiers.append(tier)
    return (Tier(),) + tuple(sorted(tiers, key=lambda t: (t.shape.nodes, t.shape.steps)))


@functools.lru_cache(maxsize=256)
def eagle3_depth_cap(steps: int, served: VerifyShape) -> int:
    """The most EAGLE3 draft nodes the curve (verify.Eagle3Curve) values in a tree of
    ``steps`` steps on a server of ``served``'s shape. The curve gives EAGLE3's tokens by
    nodes for the trees of the served shape's halved widths (``ladder``'s but for the
    widest trees of fewer steps): each width drafted in the fewest steps that fill it, the served
    width in the served steps. A tier that drafts more nodes in as many steps (4-2-16 beside
    4-3-16, 4-1-5 beside 4-1-4) holds a shallower tree than the curve's of as many nodes: it is
    valued as the widest of those trees drafted in ``steps`` or fewer (4-2-8's 7 nodes, 4-1-4's
    3), a lower bound (more nodes at the same depth accept
    no fewer tokens). A chain (topk 1) is as deep as it has nodes: no cap."""
    if served.topk == 1:
        return MAX_TREE_NODES
    return max((t.shape.draft_nodes for t in _halved(served) if t.shape.steps <= steps), default=0)


def eagle3_cap(tier: Tier | None, served: VerifyShape) -> int:
    """``eagle3_depth_cap`` of a step's tier (no cap for None or ``off``: nothing is drafted)."""
    if tier is None or tier.shape is None:
        return MAX_TREE_NODES
    return eagle3_depth_cap(tier.shape.steps, served)


STATIC_TIERS = "1-1-2,1-3-4,1-7-8,4-1-2,4-1-4,4-2-8,4-3-16"
"""The static shapes replay compares by load (eagle3@T, cache_only@T, hvd@T) unless told
otherwise, those no wider than the gate's: topk-1 chains of 1, 3 and 7 draft tokens
(SGLang's adaptive EAGLE3 steps 1, 3 and 7) and topk-4 trees of 2 to 16 nodes (4-3-16: the
recommended static shape)."""


def serving_problem(tier: Tier, shape: VerifyShape) -> str | None:
    """Why a server started at ``shape`` cannot verify at ``tier``, or None. SGLang's
    EAGLE3 draft worker drafts at one topk, and its memory (KV slots reserved per decode
    step, draft buffers) is sized for the shape it was started at: a tier keeps the topk
    and is no wider, in nodes or in steps. ``off`` is always servable."""
    s = tier.shape
    if s is None:
        return None
    if s.topk != shape.topk:
        return f"tier {tier}: topk {s.topk}, but the server drafts at topk {shape.topk} (--speculative-eagle-topk)"
    if s.nodes > shape.nodes or s.steps > shape.steps:
        return (f"tier {tier} is wider than the served shape {Tier(shape)} (the server's memory is sized for "
                f"{shape.nodes} nodes and {shape.steps} steps)")
    return None


def served_tiers(text: str | None, shape: VerifyShape) -> tuple[Tier, ...]:
    """The tiers a server started at ``shape`` picks among: ``text`` (``off,4-1-4,4-3-16``)
    or, when None, ``ladder(shape)``; the served shape itself is always among them (the
    fallback of a failed step). ValueError names a tier it cannot serve."""
    tiers = ladder(shape) if text is None else parse_tiers(text)
    problems = [p for p in (serving_problem(t, shape) for t in tiers) if p]
    if problems:
        raise ValueError("; ".join(problems))
    if Tier(shape) not in tiers:
        tiers = tiers + (Tier(shape),)
    return tuple(sorted(tiers, key=lambda t: (t.tokens_per_row, t.shape.steps if t.shape else 0)))
