"""The one HVD decision: which shape each request's verify row takes this step.

Called by the serving stepper (a decode batch) and by replay, training and calibration
(one row at a time), so the gate is trained, calibrated and evaluated on exactly the
decisions it makes when it serves.

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

import collections
import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from .drafter.protocol import Draft
from .drafter.row_tree import EMPTY_ROW, RowTree
from .features import TAIL_TOKENS, FeatureInput, RequestHistory
from .verify import VerifyShape


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


CACHE, EAGLE3, GREEDY = "cache", "eagle3", "greedy"
MAX_TREE_NODES = 63  # draft nodes per row the worker's tree rows handle (one int64 ancestor mask per node)


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


@dataclasses.dataclass(frozen=True, slots=True)
class RowPlans:
    """The decision for a batch, row-aligned with the request ids passed to ``decide``."""

    cache_lens: np.ndarray  # [B] int32 cache nodes the row verifies (0: no cache branch)
    eagle_nodes: np.ndarray  # [B] int32 EAGLE3 nodes the row keeps (N-1: untouched)
    cache_tokens: np.ndarray  # [B, N-1] int32 the cache branch's nodes (a chain, or a row tree), -1 padded
    cache_parents: np.ndarray  # [B, N-1] int32 each node's parent (-1: the root); a chain: -1, 0, 1, ...
    predicted: np.ndarray  # [B] float32 the gate's accept_len (nan: no draft or no verdict)
    gate_error: Exception | None = None  # the gate failed; every row verifies EAGLE3's tree

    def plan(self, i: int) -> RowPlan:
        return RowPlan(int(self.cache_lens[i]), int(self.eagle_nodes[i]))

    @property
    def use_cache(self) -> np.ndarray:
        return self.cache_lens > 0


class RequestState:
    """What the decision knows of one request between steps: prompt length, output
    position, the last TAIL_TOKENS context tokens and the history of its cache drafts.

    ``observe(tokens)`` with every token the request emits; ``record(tokens)`` with each
    cache draft judged (before its verify)."""

    __slots__ = ("num_prompt_tokens", "pos", "tail", "history")

    def __init__(self, prompt_ids: Sequence[int] | np.ndarray):
        self.num_prompt_tokens = len(prompt_ids)
        self.pos = 0  # output tokens observed
        self.tail = collections.deque((int(t) for t in prompt_ids[-TAIL_TOKENS:]), maxlen=TAIL_TOKENS)
        self.history = RequestHistory()

    def observe(self, tokens: Sequence[int]) -> None:
        if len(tokens):
            self.pos += len(tokens)
            self.tail.extend(tokens)
            self.history.observe(tokens)

    def record(self, draft_tokens: tuple[int, ...]) -> None:
        self.history.record(self.pos, draft_tokens)

    def feature_input(self, draft: Draft, row: RowTree = EMPTY_ROW) -> FeatureInput:
        """This state as one Draft-object feature row (training and benchmarks; the
        serving path builds the same features from arrays, ``feature_rows``). ``row``:
        the nodes of the draft's row tree the decision would verify (``described``)."""
        return FeatureInput(draft, self.pos, self.num_prompt_tokens, tuple(self.tail), self.history.scalars(), row)


def described(chain_len, siblings, draft_nodes: int):
    """Nodes of a cache row's tree that a decision with ``siblings`` S would verify (its
    tree features describe them; training labels them): min(len(chain) + S, N-1)."""
    return np.minimum(chain_len + siblings, draft_nodes)  # ints or arrays of rows


def feature_rows(extractor, drafts: dict[str, np.ndarray], states: Sequence[RequestState],
                 rows: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """``[B, len(FEATURE_NAMES)]`` features of the rows' cache drafts in their states
    (taken before the drafts are recorded into the histories); ``rows``: their row trees
    cut at the nodes described (``row_lengths``), None for chain rows."""
    b = len(states)
    pos = np.fromiter((s.pos for s in states), dtype=np.float64, count=b)
    prompt = np.fromiter((s.num_prompt_tokens for s in states), dtype=np.float64, count=b)
    hist = np.array([s.history.scalars() for s in states], dtype=np.float32).reshape(b, -1)
    tails = np.full((b, TAIL_TOKENS), -1, dtype=np.int64)
    tail_lens = np.zeros(b, dtype=np.int64)
    for i, s in enumerate(states):
        tail_lens[i] = len(s.tail)
        tails[i, : len(s.tail)] = s.tail
    return extractor.from_arrays(drafts, pos, prompt, hist, tails, tail_lens, rows)


def gate_predictions(gate, drafts: dict[str, np.ndarray], states: Sequence[RequestState],
                     rows: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """The gate's value per row ``[B]`` float64 (raises on a bad gate): a learned gate's
    predicted accept_len (float32 from onnxruntime, exact in float64), the score rule's
    draft scores (gate.ScoreRuleGate)."""
    b = len(states)
    pred = np.asarray(gate.predict_rows(drafts, states, rows), dtype=np.float64)
    if pred.shape != (b,) or not np.all(np.isfinite(pred)):
        raise ValueError(f"gate returned shape {pred.shape} / non-finite values for a batch of {b}")
    return pred


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


RowTrees = Callable[[np.ndarray], dict[str, np.ndarray]]
"""``trees(rows)``: the row trees (drafter/row_tree.py) of those batch rows, as
``rows_to_arrays`` packs them: for the gate's tree features, every row with a draft;
for a gate that reads none (the score rule), only the cache rows with room for
siblings."""


def _grown(trees: RowTrees, which: np.ndarray, lens: np.ndarray, siblings: np.ndarray, b: int, n: int) -> dict[str, np.ndarray]:
    """The row trees of rows ``which`` in batch-wide arrays [b, n], each cut at the nodes
    the decision would verify (``row_lengths``: ``described``; other rows: 0)."""
    got = trees(which)
    out = {"row_tokens": np.full((b, n), -1, np.int32), "row_parents": np.full((b, n), -1, np.int32),
           "row_probs": np.zeros((b, n)), "row_lengths": np.zeros(b, np.int32)}
    for key in ("row_tokens", "row_parents", "row_probs"):
        out[key][which] = got[key][:, :n]
    out["row_lengths"][which] = np.minimum(got["row_lengths"], described(lens[which], siblings[which], n))
    return out


def decide(gate, drafts: dict[str, np.ndarray], states: Sequence[RequestState], shape: VerifyShape,
           rule: DecisionRule | Sequence[DecisionRule], fallback: bool = False, trees: RowTrees | None = None) -> RowPlans:
    """The row plans of a batch. ``drafts``: a drafter's ``speculate_arrays`` output for
    the rows (protocol.drafts_to_arrays); ``states``: the rows' RequestStates, whose
    histories this records every non-empty draft into (judged or not); ``rule``: one
    for the batch (the server), or one per row (replay deciding for several policies at
    once); ``trees``: where the rule adds cache siblings (topk > 1), the source of row
    trees (RowTrees), asked once per batch.

    A gate that raises: with ``fallback`` (the server) every row verifies EAGLE3's tree
    and the error is returned in ``gate_error``; without it (replay, training) it
    propagates."""
    lens = drafts["lengths"].astype(np.int32)
    b = len(lens)
    if isinstance(rule, DecisionRule):
        threshold, reserve, siblings = rule.threshold, rule.eagle_reserve, rule.cache_siblings
    else:
        threshold = np.array([r.threshold for r in rule], dtype=np.float64)
        reserve = np.array([r.eagle_reserve for r in rule], dtype=np.int32)
        siblings = np.array([r.cache_siblings for r in rule], dtype=np.int32)
    predicted = np.full(b, np.nan, dtype=np.float32)
    use = np.zeros(b, dtype=bool)
    judged = lens > 0
    error = None
    n = shape.draft_nodes
    siblings = np.broadcast_to(siblings, (b,))
    grows = trees is not None and shape.allows_branches and n <= MAX_TREE_NODES
    rows = None  # the row trees of the rows asked, cut at the nodes described
    if grows and gate is not None and getattr(gate, "reads_rows", False) and (want := np.flatnonzero(judged & (siblings > 0))).size:
        rows = _grown(trees, want, lens, siblings, b, n)
    if gate is not None and judged.any():
        try:
            pred = gate_predictions(gate, drafts, states, rows)
        except Exception as e:  # onnxruntime raises its own types; a failed gate must not stop a server
            if not fallback:
                raise
            error = e
        else:
            predicted = np.where(judged, pred, np.nan).astype(np.float32)
            use = judged & (pred > np.asarray(threshold, dtype=np.float64))
    for i, s in enumerate(states):
        if k := int(lens[i]):
            s.record(tuple(drafts["tokens"][i, :k].tolist()))
    cache, eagle = plan_rows(use, lens, shape, reserve)
    tokens = np.full((b, n), -1, dtype=np.int32)
    w = min(n, drafts["tokens"].shape[1])
    tokens[:, :w] = drafts["tokens"][:, :w]
    parents = np.broadcast_to(np.arange(-1, n - 1, dtype=np.int32), (b, n)).copy()  # chains
    if grows:
        share = n - np.minimum(reserve, n - 1)  # the cache branch's most nodes, per row or for all
        room = np.flatnonzero(use & (siblings > 0) & (cache < share))
        if len(room):
            if rows is None:
                rows = _grown(trees, room, lens, siblings, b, n)
            grown = np.minimum(rows["row_lengths"][room], np.broadcast_to(share, (b,))[room]).astype(np.int32)
            cache[room], eagle[room] = grown, n - grown
            tokens[room], parents[room] = rows["row_tokens"][room], rows["row_parents"][room]
    return RowPlans(cache, eagle, tokens, parents, predicted, error)


def no_decision(b: int, draft_nodes: int) -> RowPlans:
    """Every row of ``draft_nodes`` (N-1) draft tokens keeps EAGLE3's tree (a step whose
    decision failed)."""
    return RowPlans(np.zeros(b, np.int32), np.full(b, draft_nodes, np.int32), np.full((b, draft_nodes), -1, np.int32),
                    np.full((b, draft_nodes), -1, np.int32), np.full(b, np.nan, np.float32))
