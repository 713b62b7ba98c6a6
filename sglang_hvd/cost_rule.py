"""Cost-aware verification: which verify shape a whole decode step takes.

Each step the decision (decision.py) asks ``choose_mode`` for the StepMode -- a tier
(tiers.py: ``off`` or TOPK-STEPS-NODES) with or without EAGLE3's draft -- of the most
expected tokens per millisecond for the batch:

  rate(mode) = expected tokens(mode) / step_ms(mode)

expected tokens from the gate's payoff per row (payoff.py) and EAGLE3's curve
(verify.Eagle3Curve), the time from the step-time profile (step_profile.py: the verify
at the tier's width, EAGLE3's draft forwards when drafted, its extend, HVD's host time).
``mode_rows`` defines a mode's rows and tokens one mode at a time (the reference);
``choose_mode`` computes every mode at once with the same arithmetic, since it runs on the
serving hot path: in one native call where the drafter's extension is built
(drafter/native/choose_mode.hpp), else in numpy (``_choose_mode_numpy``, the reference);
tests hold the three equal.

Worked example (one row, a 4-token cache draft the gate expects to accept 3 of at 15
nodes, tiers off and 4-3-16): at ``off`` the step emits 1 token; at ``4-3-16/cache`` (no
EAGLE3 draft) 1 + E_4(p) with E_4(p) = 3, so 4 tokens; at ``4-3-16`` with EAGLE3 the
cache row keeps 11 EAGLE3 nodes beside its 4, worth 1 + 3 + P(miss) x (curve(11) - 1).
Divided by each mode's step time, the largest rate wins.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .drafter.native_drafter import _native
from .payoff import GEOMETRIC_INVERSE, Payoff
from .request_control import CACHE, EAGLE3, OFF, any_control
from .step_profile import EXTEND_EVERY_STEP, StepProfile
from .tiers import Tier, eagle3_cap
from .verify import MAX_TREE_NODES, Eagle3Curve, VerifyShape

PLAIN, CACHE_ONLY, CHAIN, TREE = 0, 1, 2, 3  # how a mode's rows are planned (CostRule.kinds)


@dataclasses.dataclass(frozen=True, slots=True)
class StepMode:
    """What one step verifies: every row at ``tier``'s shape. ``eagle3`` False: no EAGLE3
    draft this step; a row with a cache draft verifies it (a chain, or its row tree), any
    other row takes a plain step (SuffixDecoding's rule, and the cheap end of cost-aware
    HVD under load)."""

    tier: Tier
    eagle3: bool = True

    @property
    def name(self) -> str:
        return self.tier.name if self.eagle3 or not self.tier.speculates else f"{self.tier.name}/cache"

    @property
    def kind(self) -> int:
        if self.tier.shape is None:
            return PLAIN
        if not self.eagle3:
            return CACHE_ONLY
        return TREE if self.tier.shape.allows_branches else CHAIN


@dataclasses.dataclass(frozen=True, slots=True)
class CostRule:
    """Cost-aware verification: each step takes the StepMode with the most predicted tokens
    per second (``choose_mode``) among ``tiers`` (each with and without EAGLE3's draft),
    timed by ``profile``; an EAGLE3 row at a tier yields ``eagle3_curve``'s tokens at its
    nodes, no more than the tier's depth holds (tiers.eagle3_depth_cap, against ``served``);
    ``extend``: when the server pays EAGLE3's draft extend (step_profile.EXTEND_*)."""

    profile: StepProfile
    eagle3_curve: Eagle3Curve
    tiers: tuple[Tier, ...]
    extend: str = EXTEND_EVERY_STEP
    served: VerifyShape | None = None  # the server's shape (None: the widest tier's), for tiers.eagle3_depth_cap
    # the scorer's values are each row's true accepted length (replay's hvd_exact reference), priced as they are
    # (Payoff.exact), not by payoff.py's model of a prediction
    exact: bool = False
    modes: tuple[StepMode, ...] = dataclasses.field(init=False, repr=False, compare=False)
    # [modes, 64] EAGLE3's tokens per verify by nodes 0..63 at each mode's tier (the curve, depth-capped)
    eagle3_tokens: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)
    kinds: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)  # [modes] PLAIN ... TREE
    nodes: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)  # [modes] draft nodes (N-1)
    tree_modes: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)  # the TREE modes' indexes
    # [tree modes, C] EAGLE3's tokens beyond the bonus beside c = 1..C cache nodes at each tree mode (0 past its nodes)
    tree_beside: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)
    # [modes] the least a row yields beyond the bonus: an EAGLE3 row's tokens at a mode with EAGLE3's draft, else 0
    floor: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)
    # batch -> ([modes] step ms at no context, [modes] ms per context token): step_ms is linear in the context
    _times: dict = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if not self.tiers:
            raise ValueError("a cost rule needs at least one tier")
        modes = []
        for t in self.tiers:
            modes += [StepMode(t, False), StepMode(t, True)] if t.speculates else [StepMode(t, False)]
        # cheapest first (fewer tokens per row, then no EAGLE3 draft, then fewer steps): equal rates go to the
        # cheaper shape; without EAGLE3's draft two tiers of one topk and width are the same step (4-2-16/cache,
        # 4-3-16/cache): the one of fewer steps stands for both
        modes.sort(key=lambda m: (m.tier.tokens_per_row, m.eagle3, m.tier.shape.steps if m.tier.shape else 0))
        modes = [m for i, m in enumerate(modes) if m.eagle3 or not m.tier.speculates or not any(
            not o.eagle3 and o.tier.speculates and o.tier.shape.topk == m.tier.shape.topk
            and o.tier.tokens_per_row == m.tier.tokens_per_row for o in modes[:i])]
        object.__setattr__(self, "modes", tuple(modes))
        served = self.served or max((t.shape for t in self.tiers if t.shape is not None),
                                    key=lambda v: (v.nodes, v.steps), default=None)
        by_nodes = np.array(self.eagle3_curve.tokens_upto(MAX_TREE_NODES))
        every = np.arange(MAX_TREE_NODES + 1)
        table = [by_nodes[np.minimum(every, eagle3_cap(m.tier, served))] for m in modes]
        object.__setattr__(self, "eagle3_tokens", np.array(table))
        object.__setattr__(self, "kinds", np.array([m.kind for m in modes]))
        object.__setattr__(self, "nodes", np.array([min(m.tier.draft_nodes, MAX_TREE_NODES) for m in modes]))
        tree = np.flatnonzero(self.kinds == TREE)
        beside = np.zeros((len(tree), int(self.nodes[tree].max()) if len(tree) else 0))
        for i, m in enumerate(tree):
            n = int(self.nodes[m])
            beside[i, :n] = self.eagle3_tokens[m, n - np.arange(1, n + 1)] - 1.0
        object.__setattr__(self, "tree_modes", tree)
        object.__setattr__(self, "tree_beside", beside)
        gain = self.eagle3_tokens[np.arange(len(modes)), self.nodes] - 1.0
        object.__setattr__(self, "floor", np.where((self.kinds == CHAIN) | (self.kinds == TREE), gain, 0.0))
        object.__setattr__(self, "_times", {})

    def step_ms(self, batch: int, context_tokens: float) -> np.ndarray:
        """[modes] each mode's step time for this batch (the profile's, per batch size two
        [modes] arrays kept: the time at no context and per context token)."""
        times = self._times.get(batch)
        if times is None:
            at = [np.array([self.profile.step_ms(m.tier, batch, c, eagle3=m.eagle3, extend=self.extend)
                            for m in self.modes]) for c in (0.0, 1.0)]
            times = self._times[batch] = (at[0], at[1] - at[0])
        return times[0] + times[1] * context_tokens


def _split(payoff: Payoff, lens: np.ndarray, n: int, eagle_reserve: int,
           eagle3_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A tree row's best cache branch at ``n`` nodes: of c = 1 .. its share (min(L, n -
    reserve)) cache nodes, the c of the most tokens beyond the bonus,
      value(c) = E_c(p) + (1 - p) x (eagle3_tokens[n - c] - 1)
    (the smallest of equals). Returns each row's best value (0 without a draft), its c and
    its share."""
    share = np.where(lens > 0, np.minimum(lens, n - min(eagle_reserve, n - 1)), 0)
    c = np.arange(1, n + 1)[:, None]  # [n, 1]
    value = payoff.by_width(n) + (1.0 - payoff.first_hit) * (eagle3_tokens[n - c] - 1.0)  # [n, B]
    value[c > share] = -np.inf
    best = value.argmax(axis=0)
    rows = np.arange(len(lens))
    return np.where(lens > 0, value[best, rows], 0.0), best + 1, share


def mode_rows(mode: StepMode, payoff: Payoff, lens: np.ndarray, eagle_reserve: int, eagle3_tokens: np.ndarray,
              control: np.ndarray | None = None) -> tuple[np.ndarray, float, int | np.ndarray]:
    """The rows that verify their cache draft at ``mode``, the tokens the step is expected
    to emit, and the EAGLE3 reserve the rows are planned with (``eagle_reserve``, or one
    per row). A cache row of L nodes yields 1 + its expected accepted length at L
    (payoff.py), plus, beside M EAGLE3 nodes, P(its first token misses) x (the curve's
    tokens at M - 1); an EAGLE3 row the curve's tokens at its nodes (``eagle3_tokens``:
    the curve by nodes at this mode's tier, a row of ``CostRule.eagle3_tokens``); a plain
    row 1. Which rows take their cache draft:

      no EAGLE3 draft       every drafted row (a row slot is paid for anyway)
      a topk-1 tier         a row whose cache chain is expected to beat EAGLE3's
                            (the row holds one or the other)
      a tree tier (topk>1)  a row whose cache branch beside EAGLE3's nodes is expected
                            to beat EAGLE3's whole tree (the gate's threshold is not
                            asked: the rule weighs its own prices). The branch takes the
                            number of nodes c of the most value (``_split``): where
                            that cuts the draft short of its share, the row's reserve
                            is N - c (its other nodes EAGLE3's, no row tree); else the
                            rule's ``eagle_reserve`` (a row tree may grow in its share)

    The rows' cache and EAGLE3 nodes are those ``plan_rows`` gives (before row trees).
    ``control``: [B] the rows' per-request controls (request_control.py), priced as decide
    plans them: an ``off`` row yields 1 at any mode, a ``cache`` row its whole cache draft
    at any speculating mode, an ``eagle3`` row EAGLE3's tokens at a mode with EAGLE3's draft
    and 1 without. The rows returned are the rule's (decide applies the controls to them).
    """
    b = len(lens)
    kind = mode.kind
    reserve = eagle_reserve
    if kind == PLAIN:
        return np.zeros(b, dtype=bool), float(b), reserve
    n = min(mode.tier.draft_nodes, MAX_TREE_NODES)
    chain = payoff.accepted(np.minimum(lens, n))
    gain = eagle3_tokens[n] - 1.0  # an EAGLE3 row's tokens beyond the bonus
    if kind == CACHE_ONLY:
        rows, per_row = lens > 0, chain
    elif kind == CHAIN:
        rows = (lens > 0) & (chain > gain)
        per_row = np.where(rows, chain, gain)
    else:
        value, c, share = _split(payoff, lens, n, eagle_reserve, eagle3_tokens)
        rows = (lens > 0) & (value > gain)
        per_row = np.where(rows, value, gain)
        reserve = np.where(rows & (c < share), n - c, eagle_reserve).astype(np.int32)
    if any_control(control):
        per_row = np.select([control == OFF, control == CACHE, control == EAGLE3],
                            [0.0, chain, 0.0 if kind == CACHE_ONLY else gain], per_row)
    return rows, float(b + per_row.sum()), reserve


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class _AllModes:
    """``mode_rows`` at every mode at once: each row's tokens beyond the bonus per mode, and
    at each tree mode its best cache branch (``_split``'s value, c and share; value -inf
    without a draft)."""

    per_row: np.ndarray  # [modes, B]
    chain: np.ndarray  # [modes, B] the row's cache chain at the mode's nodes (0 without a draft)
    branch: np.ndarray  # [tree modes, B]
    c: np.ndarray  # [tree modes, B]
    share: np.ndarray  # [tree modes, B]


def _all_modes(cost: CostRule, payoff: Payoff, lens: np.ndarray, eagle_reserve: int,
               control: np.ndarray | None) -> _AllModes:
    n = cost.nodes[:, None]  # [modes, 1] (0 at ``off``: no cache tokens)
    chain = payoff.accepted(n)  # [modes, B] E at min(N-1, L): 0 without a draft
    # a row's best at a mode: plain 0, cache_only its chain, a chain tier the better of its chain and EAGLE3's
    # (EAGLE3's alone without a draft: its chain is 0), a tree tier (below) its best branch or EAGLE3's tree
    per_row = np.maximum(chain, cost.floor[:, None])
    tree = cost.tree_modes
    best = c = share = np.zeros((0, len(lens)))
    if len(tree):  # _split at every tree mode: [tree modes, c, B], widths past a row's share masked
        reserve = np.minimum(eagle_reserve, n[tree] - 1)
        share = np.minimum(lens[None, :], n[tree] - reserve)  # [tree modes, B] (0 without a draft: EAGLE3's tree)
        widths = np.arange(1, cost.tree_beside.shape[1] + 1)[None, :, None]
        branch = payoff.by_width(widths.shape[1])[None] + (1.0 - payoff.first_hit) * cost.tree_beside[:, :, None]
        branch[widths > share[:, None, :]] = -np.inf
        best, c = branch.max(axis=1), branch.argmax(axis=1) + 1  # [tree modes, B] (c: the smallest of equals)
        per_row[tree] = np.maximum(best, cost.floor[tree, None])
    if any_control(control):
        kinds = cost.kinds[:, None]
        per_row = np.select([control[None, :] == OFF, control[None, :] == CACHE, control[None, :] == EAGLE3],
                            [0.0, np.where(kinds == PLAIN, 0.0, chain), cost.floor[:, None]], per_row)
    return _AllModes(per_row, chain, best, c, share)


def expected_tokens(cost: CostRule, payoff: Payoff, lens: np.ndarray, eagle_reserve: int,
                    control: np.ndarray | None = None) -> np.ndarray:
    """[modes] the tokens each mode's step is expected to emit: ``mode_rows``'s totals, all
    modes at once ([modes, B] arrays, a dozen numpy calls whatever the number of tiers)."""
    return len(lens) + _all_modes(cost, payoff, lens, eagle_reserve, control).per_row.sum(axis=1)


def choose_mode(cost: CostRule, predicted: np.ndarray, lens: np.ndarray, eagle_reserve: int,
                context_tokens: float, cap: int, control: np.ndarray | None = None,
                survival: np.ndarray | None = None) -> tuple[StepMode, np.ndarray, float, int | np.ndarray]:
    """The StepMode of the most expected tokens per millisecond for this batch (of equals,
    the first in ``cost.modes``: the cheaper shape), the rows that verify their cache draft at
    it and their EAGLE3 reserve (``mode_rows``'s, from the same arrays), and the tokens it
    expects the step to emit (the stepper sets them beside the emitted). ``predicted``: the
    gate's accept_len, trained at ``cap`` nodes; ``control``: the rows' per-request controls
    (``mode_rows``), or None; ``survival``: the gate's own payoff curve (payoff.py), or None."""
    if _native is not None and not cost.exact:
        best, rows, expected, per_row = _native.choose_mode(
            predicted, lens, survival, cap, GEOMETRIC_INVERSE, control if any_control(control) else None, eagle_reserve,
            cost.nodes, cost.kinds, cost.floor, cost.step_ms(len(lens), context_tokens), cost.tree_modes,
            cost.tree_beside)
        return cost.modes[best], rows, expected, eagle_reserve if per_row is None else per_row
    return _choose_mode_numpy(cost, predicted, lens, eagle_reserve, context_tokens, cap, control, survival)


def _choose_mode_numpy(cost: CostRule, predicted: np.ndarray, lens: np.ndarray, eagle_reserve: int,
                       context_tokens: float, cap: int, control: np.ndarray | None = None,
                       survival: np.ndarray | None = None) -> tuple[StepMode, np.ndarray, float, int | np.ndarray]:
    """``choose_mode`` in numpy: the reference of the native kernel, and the path without it."""
    widest = int(cost.nodes.max())
    payoff = Payoff.exact(predicted, lens, widest) if cost.exact else Payoff(predicted, lens, cap, widest, survival)
    every = _all_modes(cost, payoff, lens, eagle_reserve, control)
    expected = len(lens) + every.per_row.sum(axis=1)
    best = int(np.argmax(expected / cost.step_ms(len(lens), context_tokens)))
    mode, kind, drafted = cost.modes[best], cost.kinds[best], lens > 0
    reserve = eagle_reserve
    if kind == PLAIN:
        rows = np.zeros(len(lens), dtype=bool)
    elif kind == CACHE_ONLY:
        rows = drafted
    elif kind == CHAIN:
        rows = drafted & (every.chain[best] > cost.floor[best])
    else:
        t = cost.tree_modes.tolist().index(best)
        rows = drafted & (every.branch[t] > cost.floor[best])
        reserve = np.where(rows & (every.c[t] < every.share[t]), cost.nodes[best] - every.c[t],
                           eagle_reserve).astype(np.int32)
    return mode, rows, float(expected[best]), reserve
