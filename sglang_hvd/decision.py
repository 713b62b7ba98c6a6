"""The one HVD decision: which shape each request's verify row takes this step.

Called by the serving stepper (a decode batch) and by replay, training and calibration
(one row at a time), so the gate is trained, calibrated and evaluated on exactly the
decisions it makes when it serves. Data flows one way:

  drafts (DraftBatch) + states (RequestState)  [+ row trees (RowTreeBatch) for a scorer
  that reads them]  -> features (scorer.extractor) -> values (scorer.predict)
  -> plans (BatchPlan)

and the drafts are then recorded into the requests' histories. Nothing downstream calls
back into this module.

Per row (request) and step, given its cache draft, its state and the verify shape:

  predicted = gate(features)                      accept_len the gate expects
  predicted <= threshold or no draft  -> the EAGLE3 tree, untouched
  otherwise                           -> a cache row: the cache draft's first
      L = min(len(draft), N-1 - reserve) tokens, and EAGLE3's first M = N-1 - L nodes
      beside it under the root (topk > 1; with topk 1 the row is the chain alone)

``reserve`` (DecisionRule.eagle_reserve) keeps that many nodes for EAGLE3 even when the
cache draft could fill the row; a short cache draft leaves more. With ``cache_siblings``
S > 0 (topk > 1) the cache branch is the row tree (drafter/row_tree.py: the chain, then
the tree draft's other nodes): L = min(len(chain) + S, len(row tree), N-1 - reserve)
nodes of it, so up to S siblings take nodes EAGLE3 would otherwise get. The verify follows the
cache branch when its first token is right and EAGLE3's nodes otherwise, so a wrong
cache guess still yields EAGLE3's tokens: worth curve(M) instead of 1. Threshold and
reserve are calibrated together on validation replay (``hvd train``) under the EAGLE3
curve, and stored in gate.json.

Worked example (N = 16, reserve 3): a 20-token cache draft with predicted 5.2 > 1.5 ->
L = min(20, 15 - 3) = 12, M = 3; a 4-token draft -> L = 4, M = 11; predicted 0.7 ->
L = 0, M = 15 (EAGLE3's tree).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .cost_rule import CostRule, StepMode, choose_mode
from .drafter.batch import DraftBatch, RowTreeBatch
from .drafter.native_drafter import _native
from .features import FeatureExtractor
from .request_control import CACHE, EAGLE3, OFF, any_control
from .request_state import RequestState, StateBatch
from .tiers import Tier
from .verify import MAX_TREE_NODES, RowPlan, VerifyShape

if TYPE_CHECKING:
    from .calibration import CalibrationInput
    from .scorer import Scorer


@dataclasses.dataclass(frozen=True, slots=True)
class DecisionRule:
    threshold: float = 1.0  # verify a cache row when the predicted accept_len > threshold
    eagle_reserve: int = 0  # EAGLE3 nodes kept beside a cache draft (topk > 1 shapes)
    cache_siblings: int = 0  # tree-draft nodes a cache row may add to its chain (topk > 1 shapes)

    def __post_init__(self):
        if self.eagle_reserve < 0:
            raise ValueError(f"eagle_reserve must be >= 0, got {self.eagle_reserve}")
        if self.cache_siblings < 0:
            raise ValueError(f"cache_siblings must be >= 0, got {self.cache_siblings}")

    def to_json(self) -> dict:
        return {"threshold": self.threshold, "eagle_reserve": self.eagle_reserve, "cache_siblings": self.cache_siblings}


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class BatchPlan:
    """The decision for a batch, row-aligned with the request ids passed to ``decide``."""

    cache_lens: np.ndarray  # [B] int32 cache nodes the row verifies (0: no cache branch)
    eagle_nodes: np.ndarray  # [B] int32 EAGLE3 nodes the row keeps (N-1: untouched)
    cache_tokens: np.ndarray  # [B, N-1] int32 the cache branch's nodes (a chain, or a row tree), -1 padded
    cache_parents: np.ndarray  # [B, N-1] int32 each node's parent (-1: the root); a chain: -1, 0, 1, ...
    predicted: np.ndarray  # [B] float32 the scorer's value (nan: no draft or no verdict)
    gate_error: Exception | None = None  # the scorer failed; every row verifies EAGLE3's tree
    tier: Tier | None = None  # the shape every row of the step is planned at (None: the caller's shape)
    eagle3: bool = True  # some row verifies EAGLE3 nodes: the step runs EAGLE3's draft forwards
    expected_tokens: float = math.nan  # what a cost rule expected the step to emit (nan: no cost rule)

    def plan(self, i: int) -> RowPlan:
        return RowPlan(int(self.cache_lens[i]), int(self.eagle_nodes[i]))

    @property
    def use_cache(self) -> np.ndarray:
        return self.cache_lens > 0

    @classmethod
    def all_eagle3(cls, b: int, draft_nodes: int, tier: Tier | None = None) -> BatchPlan:
        """Every row of ``draft_nodes`` (N-1) draft tokens keeps EAGLE3's tree (a step whose
        decision failed)."""
        return cls(np.zeros(b, np.int32), np.full(b, draft_nodes, np.int32), np.full((b, draft_nodes), -1, np.int32),
                   np.full((b, draft_nodes), -1, np.int32), np.full(b, np.nan, np.float32), tier=tier)

    @classmethod
    def plain(cls, b: int, predicted: np.ndarray | None = None, expected_tokens: float = math.nan) -> BatchPlan:
        """No speculation: every row takes a plain decode step (the ``off`` tier)."""
        empty = np.zeros((b, 0), np.int32)
        pred = np.full(b, np.nan, np.float32) if predicted is None else predicted
        return cls(np.zeros(b, np.int32), np.zeros(b, np.int32), empty, empty.copy(), pred, tier=Tier(), eagle3=False,
                   expected_tokens=expected_tokens)


def described(chain_len, siblings, draft_nodes: int):
    """Nodes of a cache row's tree that a decision with ``siblings`` S would verify (its
    tree features describe them; training labels them): min(len(chain) + S, N-1)."""
    return np.minimum(chain_len + siblings, draft_nodes)  # ints or arrays of rows


def predictions(scorer: Scorer, features: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The scorer's value per row ``[B]`` float64 of a batch's ``features`` (its extractor's;
    raises on a bad scorer): a learned gate's predicted accept_len (float32 from
    onnxruntime, exact in float64), the score rule's draft scores; and, where the scorer
    learned one (a gate's payoff curve), each row's survival ``[B, W]`` (payoff.py; else
    None), from the same run."""
    b = len(features)
    value, survival = scorer.predict_curve(features)
    pred = np.asarray(value, dtype=np.float64)
    if pred.shape != (b,) or not np.isfinite(pred).all():  # (the methods: np.all costs more per call)
        raise ValueError(f"scorer returned shape {pred.shape} / non-finite values for a batch of {b}")
    if survival is not None and (survival.shape[0] != b or not np.isfinite(survival).all()):
        raise ValueError(f"scorer returned a survival curve of shape {survival.shape} / non-finite values for a "
                         f"batch of {b}")
    return pred, survival


def step_features(scorer: Scorer, drafts: DraftBatch, states: Sequence[RequestState], trees: RowTreeBatch | None,
                  siblings: int | np.ndarray, judged: np.ndarray, draft_limit: int) -> np.ndarray:
    """The scorer's features of a batch; ``trees``: every row's row tree of ``draft_limit``
    nodes (or those already described: describing again changes nothing), or None where the
    scorer reads none; each drafted row whose rule adds siblings is described by its tree
    cut at ``described`` nodes. In one native call (FeatureExtractor.step_features) where the
    extension is built, the states are native and one rule serves the batch (the serving
    stepper); else the composition it equals (``_described_trees``, StateBatch.of, the
    extractor's ``features``)."""
    if (not isinstance(siblings, np.ndarray) and isinstance(scorer.extractor, FeatureExtractor)
            and scorer.extractor.steps_natively(states)):
        return scorer.extractor.step_features(drafts, states, trees, siblings, draft_limit)
    described_trees = None
    if trees is not None and (want := np.flatnonzero(judged & (siblings > 0))).size:
        described_trees = _described_trees(trees, want, drafts.lengths, siblings, len(drafts), draft_limit)
    return scorer.extractor.features(drafts, StateBatch.of(states), described_trees)


def plan_rows(use: np.ndarray, draft_lens: np.ndarray, shape: VerifyShape,
              eagle_reserve: int | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cache nodes and EAGLE3 nodes per row for the rows that ``use`` their cache draft
    (``eagle_reserve``: one for all rows, or one per row)."""
    n = shape.draft_nodes
    reserve = np.minimum(eagle_reserve, n - 1) if shape.allows_branches else 0
    cache = np.where(use, np.minimum(draft_lens, n - reserve), 0).astype(np.int32)
    if shape.allows_branches:
        eagle = (n - cache).astype(np.int32)
    else:  # topk 1: a cache row is the chain alone
        eagle = np.where(cache > 0, 0, n).astype(np.int32)
    return cache, eagle


RowTreeSource = Callable[[np.ndarray], RowTreeBatch] | RowTreeBatch
"""``trees(rows)``: the row trees (drafter/row_tree.py) of those batch rows, of N-1 nodes
(the drafter's ``speculate_rows``), asked at most once per batch: for a scorer that reads
trees, every row with a draft; for one that reads none (the score rule), only the cache
rows with room for siblings. An input the caller provides, never a call back into it. Or
the row trees of every row of the batch, made beforehand (the drafter's
``speculate_step``, for a scorer that reads trees: the serving stepper)."""


def reads_row_trees(scorer: Scorer | None, shape: VerifyShape) -> bool:
    """Whether ``decide`` asks every drafted row's tree before scoring, at ``shape``, of the
    rows whose rule adds cache siblings: a scorer with tree features, a shape that grows trees."""
    return (scorer is not None and scorer.reads_trees and shape.allows_branches
            and shape.draft_nodes <= MAX_TREE_NODES)


def _described_trees(trees: RowTreeSource, which: np.ndarray, lens: np.ndarray, siblings: int | np.ndarray, b: int,
                     n: int) -> RowTreeBatch:
    """The row trees of rows ``which`` in a batch of ``b`` rows and ``n`` nodes, each cut at
    the nodes the decision would verify (``described``; other rows: empty)."""
    cut = described(lens[which], _of_rows(siblings, which), n)
    if isinstance(trees, RowTreeBatch):  # every row's, made beforehand: only the lengths change
        _check_trees(trees, b, n)
        lengths = np.zeros(b, np.int32)
        lengths[which] = np.minimum(trees.lengths[which], cut)
        return RowTreeBatch(trees.tokens, trees.parents, trees.probs, lengths)
    return trees(which).scatter(which, b, n, cut)


def _check_trees(trees: RowTreeBatch, b: int, n: int) -> None:
    if len(trees) != b or trees.width != n:
        raise ValueError(f"row trees of {len(trees)} rows x {trees.width} nodes for a batch of {b} x {n}")


def _of_rows(value: int | np.ndarray, rows: np.ndarray):
    """A rule's value for ``rows``: the batch's one value, or the rows' own (one rule per row)."""
    return value[rows] if isinstance(value, np.ndarray) else value


@functools.lru_cache(maxsize=64)
def chain_parents(n: int) -> np.ndarray:
    """``[1, n]`` int32 parent links of a chain row: -1, 0, 1, ..., n - 2."""
    return np.arange(-1, n - 1, dtype=np.int32)[None, :]


@functools.lru_cache(maxsize=64)
def _at_shape(shape: VerifyShape) -> StepMode:
    """The step mode of a decision without one: every row at ``shape``, with EAGLE3."""
    return StepMode(Tier(shape))


def _row_plans_numpy(use: np.ndarray, lens: np.ndarray, reserve: int | np.ndarray, siblings: int | np.ndarray,
                     at: VerifyShape, eagle3: bool, drafts: DraftBatch, trees: RowTreeSource | None,
                     described_trees: RowTreeBatch | None, draft_limit: int,
                     control: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each row's plan at ``at`` (topk, N-1 nodes): its cache nodes and EAGLE3 nodes
    ``[B]``, and its cache branch's tokens and parents ``[B, N-1]`` int32, for the rows that
    ``use`` their cache draft with an EAGLE3 ``reserve`` and may add ``siblings`` tree nodes
    from ``trees`` (row trees of ``draft_limit`` nodes, or None: chains only;
    ``described_trees``: those already cut as the decision describes them, or None);
    ``eagle3``: the step runs EAGLE3's draft; ``control``: the rows' controls, or None.
    The reference of the native pass (drafter/native/row_plans.hpp), and the path where
    the row trees come from a call (replay) or nothing is built."""
    b, n = len(lens), at.draft_nodes
    cache, eagle = plan_rows(use, lens, at, reserve)
    if not eagle3:
        eagle[:] = 0
    if drafts.width >= n:
        tokens = np.array(drafts.tokens[:, :n], dtype=np.int32)
    else:
        tokens = np.full((b, n), -1, dtype=np.int32)
        tokens[:, : drafts.width] = drafts.tokens
    parents = np.repeat(chain_parents(n), b, axis=0)
    if trees is not None:
        share = n - np.minimum(reserve, n - 1)  # the cache branch's most nodes, per row or for all
        room = np.flatnonzero(use & (siblings > 0) & (cache < share))
        if len(room):
            if described_trees is None:
                described_trees = _described_trees(trees, room, lens, siblings, b, draft_limit)
            # a row tree lists parents before children: its first nodes are a tree too
            grown = np.minimum(described(lens[room], _of_rows(siblings, room), n),
                               np.minimum(described_trees.lengths[room], _of_rows(share, room)))
            grown = grown.astype(np.int32)
            cache[room] = grown
            eagle[room] = n - grown if eagle3 else 0
            tokens[room], parents[room] = described_trees.tokens[room, :n], described_trees.parents[room, :n]
    if control is not None:
        eagle[(control == OFF) | (control == CACHE)] = 0
    return cache, eagle, tokens, parents


def decide(scorer: Scorer | None, drafts: DraftBatch, states: Sequence[RequestState], shape: VerifyShape,
           rule: DecisionRule | Sequence[DecisionRule], fallback: bool = False,
           trees: RowTreeSource | None = None, step: StepMode | CostRule | None = None,
           context_tokens: float = 0.0, calibration: CalibrationInput | None = None,
           control: np.ndarray | None = None) -> BatchPlan:
    """The row plans of a batch. ``drafts``: a drafter's ``speculate_arrays`` for the rows;
    ``states``: the rows' RequestStates, whose histories this records every non-empty
    draft into (judged or not); ``rule``: one for the batch (the server), or one per row
    (replay deciding for several policies at once); ``trees``: where the rule adds cache
    siblings (topk > 1), the source of row trees (RowTreeSource), at ``shape``'s N-1
    nodes; ``step``: the StepMode every row is planned at (default: ``shape`` with
    EAGLE3), or a CostRule that picks it for this batch (``choose_mode``) from the scores
    and ``context_tokens`` (the batch's context, all rows together). Row trees grow cache
    rows at tree tiers (topk > 1) of at most ``shape``'s nodes. ``calibration``: the
    online map of predicted to realized payoff (calibration.py) and each row's bucket;
    the threshold then reads the calibrated payoff. A cost rule neither asks the threshold
    nor the calibration: it picks its cache rows, and their EAGLE3 reserve, by its own
    prices (cost_rule.mode_rows), from the scorer's own value (payoff.py's model of how a
    prediction's tokens spread over widths was fitted to it; a calibrated mean raised on
    bimodal outcomes overstates the first token's hit rate: replay lost 4.3% tokens/s
    pricing by it).
    BatchPlan.predicted stays the scorer's own value, what the calibration learns from.
    ``control``: [B] each row's per-request control (request_control.py: auto, off,
    cache, eagle3), honoured after the step's mode is chosen: an ``off`` row verifies no
    draft, a ``cache`` row its whole cache draft (no EAGLE3 nodes; none without a draft),
    an ``eagle3`` row EAGLE3's tree (None: every row auto).

    A scorer that raises: with ``fallback`` (the server) every row verifies EAGLE3's tree
    at ``shape`` and the error is returned in ``gate_error``; without it (replay,
    training) it propagates."""
    lens = drafts.lengths.astype(np.int32, copy=False)
    b = len(lens)
    if isinstance(rule, DecisionRule):  # one rule: its values stay scalars
        threshold, reserve, siblings = rule.threshold, rule.eagle_reserve, rule.cache_siblings
    else:
        if step is not None:
            raise ValueError("a step mode or cost rule decides for one batch: pass one DecisionRule")
        threshold = np.array([r.threshold for r in rule], dtype=np.float64)
        reserve = np.array([r.eagle_reserve for r in rule], dtype=np.int32)
        siblings = np.array([r.cache_siblings for r in rule], dtype=np.int32)
    predicted = np.full(b, np.nan, dtype=np.float32)
    use = np.zeros(b, dtype=bool)
    judged = lens > 0
    error = None
    grows = siblings > 0  # the rule adds siblings to cache rows (a bool, or one per row)
    described_trees = None  # the row trees of the rows asked, cut at the nodes described
    payoff = None  # [B] float64 the calibrated payoff (nan: not judged), with a calibration
    survival = None  # [B, W] the gate's payoff curve, where it learned one
    lens_list = lens.tolist()
    if scorer is not None and any(lens_list):
        read = trees if trees is not None and reads_row_trees(scorer, shape) else None  # the trees scored
        if read is not None and not isinstance(read, RowTreeBatch):  # called for, once: the rows described
            want = np.flatnonzero(judged & grows)
            read = described_trees = _described_trees(trees, want, lens, siblings, b, shape.draft_nodes) \
                if want.size else None
        elif read is not None:
            _check_trees(read, b, shape.draft_nodes)
        try:
            pred, survival = predictions(scorer, step_features(scorer, drafts, states, read, siblings, judged,
                                                               shape.draft_nodes))
        except Exception as e:  # onnxruntime raises its own types; a failed gate must not stop a server
            if not fallback:
                raise
            error = e
        else:
            predicted = np.where(judged, pred, np.nan).astype(np.float32)
            if not isinstance(step, CostRule):  # a cost rule picks its rows by its own prices (choose_mode)
                if calibration is not None:
                    payoff = calibration.apply(np.where(judged, pred, np.nan))
                use = judged & ((pred if payoff is None else payoff) > threshold)
    if any(lens_list):
        type(states[0]).record_rows(states, drafts.tokens, lens)
    expected = math.nan
    if error is not None or step is None:
        mode = _at_shape(shape)
    elif isinstance(step, CostRule):
        mode, use, expected, reserve = choose_mode(step, predicted.astype(np.float64), lens, int(reserve),
                                                   context_tokens, shape.draft_nodes, control, survival)
    else:
        mode = step
    if mode.tier.shape is None:
        return BatchPlan.plain(b, predicted, expected)
    at = mode.tier.shape
    if not mode.eagle3:
        use, reserve = judged, 0
    controlled = any_control(control)
    if controlled:  # the rows' own asks, over the gate's verdicts
        cache_only = control == CACHE
        use = np.where(cache_only, judged, use & (control != OFF) & (control != EAGLE3))
        reserve = np.where(cache_only, 0, reserve)  # a cache row of its own fills the row
    grow = trees is not None and at.allows_branches and at.draft_nodes <= min(MAX_TREE_NODES, shape.draft_nodes)
    if _native is not None and (not grow or isinstance(trees, RowTreeBatch)):  # the trees at hand: one native pass
        if grow:
            _check_trees(trees, b, shape.draft_nodes)
        per_reserve, per_siblings = isinstance(reserve, np.ndarray), isinstance(siblings, np.ndarray)
        cache, eagle, tokens, parents = _native.row_plans(
            use, lens, 0 if per_reserve else int(reserve), reserve if per_reserve else None, at.draft_nodes,
            at.allows_branches, mode.eagle3, drafts.tokens, *((trees.tokens, trees.parents, trees.lengths) if grow
                                                            else (None, None, None)),
            0 if per_siblings else int(siblings), siblings if per_siblings else None, control if controlled else None)
    else:
        cache, eagle, tokens, parents = _row_plans_numpy(use, lens, reserve, siblings, at, mode.eagle3, drafts,
                                                         trees if grow else None, described_trees, shape.draft_nodes,
                                                         control if controlled else None)
    return BatchPlan(cache, eagle, tokens, parents, predicted, error, tier=mode.tier, eagle3=bool(eagle.any()),
                     expected_tokens=expected)
