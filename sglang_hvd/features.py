"""Gate features: what the server knows about a cache draft before it verifies it.

One front-end, ``FeatureExtractor.features(drafts, states, trees)`` over the batch records
(drafter/batch.py, request_state.StateBatch), used by the decision (decision.py) for the
server, replay, training and calibration alike.
Versioned: a gate trained on schema N refuses to load against code of schema M != N.

Groups (FEATURE_NAMES lists them in order):
  match      draft length, match length, tree, score, mean/first/last token probability,
             log counts of the matched node and of the first/last drafted node, and how
             much of the length budget the draft used
  position   log output position, log prompt length, output share of the context
  history    the request's earlier drafts as far as the tokens generated since show them
             (request_state.RequestHistory): confirmed tokens and "known broken" of the last 4, log gap
             to the last, mean accepted length of resolved drafts, their log count, and the
             share of the last 16 drafts that broke on their first token
  tokens     structure flags (token_flags.py) of the first draft token, mean flags over
             the draft, mean flags over the last 8 context tokens
  tree       the cache row's siblings (drafter/row_tree.py: the row tree's nodes off the
             chain, among the first min(len(chain) + S, N-1) nodes the decision would
             verify with S cache siblings; none with S = 0 or at topk 1): how many, the sum
             of their path probabilities, the part of it under the root (alternatives to
             the first token), the best one's, and the chain nodes they branch from.
             The chain's own path probability is ``last_prob``; the row's score is
             ``score + tree_sibling_mass``.

Worked example (tree): chain ``5 7 8`` (path probs .5 .375 .25), S = 2, row ``5 7 8 9 4``
with parents ``-1 0 1 -1 0`` and probs ``... .25 .125``: siblings 2, mass .375, under the
root .25, best .25, branch points 2 (the root and node 0).

History values and their leak-free rule: request_state.py (with a worked example).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from .drafter.batch import TREE_CODES, DraftBatch, RowTreeBatch
from .drafter.native_drafter import _native
from .drafter.protocol import LOCAL_TREE, Draft, DrafterConfig
from .drafter.row_tree import RowTree
from .request_state import HISTORY_K, NUM_HISTORY, NativeRequestState, StateBatch, StateSnapshot
from .token_flags import FLAG_NAMES, unpack

FEATURE_SCHEMA_VERSION = 2  # 2: the tree group

FEATURE_NAMES: tuple[str, ...] = (
    "draft_len", "match_len", "is_local_tree", "score", "mean_prob", "first_prob", "last_prob",
    "log_match_count", "log_first_child_count", "log_last_child_count", "budget_use",
    "log_pos", "log_prompt_len", "output_share",
    *(f"hist_obs_{i}" for i in range(1, HISTORY_K + 1)),
    *(f"hist_broke_{i}" for i in range(1, HISTORY_K + 1)),
    "hist_log_gap", "hist_mean_resolved_accept", "hist_log_num_resolved", "hist_first_token_miss_rate",
    *(f"first_tok_{f}" for f in FLAG_NAMES),
    *(f"draft_{f}" for f in FLAG_NAMES),
    *(f"tail_{f}" for f in FLAG_NAMES),
    "tree_siblings", "tree_sibling_mass", "tree_root_alt_mass", "tree_best_sibling_prob", "tree_branch_points",
)
_NUM_SCALAR = 14 + NUM_HISTORY
_NUM_TREE = 5


class FeatureExtractor:
    """Turns a batch's drafts, states and row trees into a ``[batch, len(FEATURE_NAMES)]``
    float32 matrix; built from a gate's token flags and drafter settings."""

    def __init__(self, token_flags: np.ndarray, drafter_config: DrafterConfig):
        self.token_flags = token_flags
        # Flags unpacked once: [vocab_size + 1, len(FLAG_NAMES)] uint8 0/1 (a byte each: the rows a
        # batch gathers stay in cache); the extra last row (all zero) serves ids beyond the
        # tokenizer's vocabulary.
        self.flag_table = np.concatenate([unpack(token_flags), np.zeros((1, len(FLAG_NAMES)), np.float32)]).astype(
            np.uint8)
        self.budgets = np.array([drafter_config.budget(p) for p in range(drafter_config.max_depth + 1)],
                                dtype=np.float32)
        self.vocab_size = len(token_flags)

    def _bits(self, ids: np.ndarray) -> np.ndarray:
        """``[...]`` token ids -> ``[..., len(FLAG_NAMES)]`` uint8 0/1 flags (ids beyond the vocab
        and the -1 of padding: none); their sums are exact counts."""
        return self.flag_table[np.minimum(ids, self.vocab_size)]

    def features(self, drafts: DraftBatch, states: StateBatch, trees: RowTreeBatch | None = None) -> np.ndarray:
        """``[B, len(FEATURE_NAMES)]`` float32 features of a batch's cache drafts in their
        states (taken before the drafts are recorded into the histories); ``trees``: the
        rows' row trees cut at the nodes the decision would verify (``lengths``;
        decision.described), None for chain rows (no siblings).

        Every value is computed in float64 and rounded once to float32. Where the drafter's
        extension is built, two native calls (drafter/native/features.hpp) compute them: all
        but the tree group, then the tree group; ``_numpy_columns`` and ``tree_features`` are
        the references they equal (tests/test_features.py).
        """
        lens = drafts.lengths
        b = len(lens)
        out = np.zeros((b, len(FEATURE_NAMES)), dtype=np.float32)
        if not b:
            return out
        if _native is not None and drafts.width:
            _native.gate_features(out, drafts.tokens, drafts.probs, drafts.child_counts, lens, drafts.match_len,
                                  drafts.match_count, drafts.score, drafts.tree, TREE_CODES[LOCAL_TREE], states.pos,
                                  states.num_prompt_tokens, states.history, states.tails, states.tail_lens,
                                  self.flag_table, self.budgets)
        else:
            self._numpy_columns(drafts, states, out)
        if trees is None:
            return out
        if _native is not None:  # tree_features natively (drafter/native/features.hpp), in place
            _native.tree_features(out, out.shape[1] - _NUM_TREE, trees.parents, trees.probs, lens, trees.lengths)
        else:
            out[:, -_NUM_TREE:] = tree_features(trees, lens, trees.lengths)
        return out

    @staticmethod
    def steps_natively(states: Sequence) -> bool:
        """Whether ``step_features`` can take these states: the extension is built and they
        are its native request states (request_state.new_request_state's)."""
        return _native is not None and bool(states) and type(states[0]) is NativeRequestState

    def step_features(self, drafts: DraftBatch, states: Sequence, trees: RowTreeBatch | None, siblings: int,
                      nodes: int) -> np.ndarray:
        """A decode step's features in one native call (drafter/native/bindings.cpp
        ``step_features``): ``features(drafts, StateBatch.of(states), cut)``, where ``cut``
        is ``trees`` with each drafted row's tree cut at min(its nodes, len(chain) +
        ``siblings``, ``nodes``) (decision.described) and no tree for the other rows (or,
        with ``siblings`` 0, for any); ``trees`` None: no tree group. ``states``: native
        request states (``steps_natively``). The composition is the reference it equals
        (tests/test_features.py)."""
        out = np.zeros((len(drafts), len(FEATURE_NAMES)), dtype=np.float32)
        if len(drafts):
            grown = (trees.parents, trees.probs, trees.lengths) if trees is not None else (None, None, None)
            _native.step_features(out, drafts.tokens, drafts.probs, drafts.child_counts, drafts.lengths,
                                  drafts.match_len, drafts.match_count, drafts.score, drafts.tree,
                                  TREE_CODES[LOCAL_TREE], states, *grown, int(siblings), nodes, self.flag_table,
                                  self.budgets)
        return out

    def _numpy_columns(self, drafts: DraftBatch, states: StateBatch, out: np.ndarray) -> None:
        """All but the tree group, into ``out``: a few whole-batch numpy calls, whatever B.
        Padding does the masking: a draft's tokens past its length and a tail's missing
        tokens are -1, which picks the flag table's all-zero last row."""
        lens = drafts.lengths
        b = len(lens)
        rows = np.arange(b)
        last = np.maximum(lens - 1, 0)
        safe_n = np.maximum(lens, 1)
        # float64 columns 0-13: the match group (0-10) and the position group (11-13)
        f = np.empty((b, 14))
        f[:, 0] = lens
        f[:, 1] = drafts.match_len
        f[:, 2] = drafts.tree == TREE_CODES[LOCAL_TREE]
        f[:, 3] = drafts.score
        f[:, 4] = drafts.score / safe_n
        f[:, 5] = drafts.probs[:, 0]
        f[:, 6] = drafts.probs[rows, last]
        counts = np.empty((b, 5))  # log1p of: match count, first/last child count, pos, prompt length
        counts[:, 0] = drafts.match_count
        counts[:, 1] = drafts.child_counts[:, 0]
        counts[:, 2] = drafts.child_counts[rows, last]
        counts[:, 3] = states.pos
        counts[:, 4] = states.num_prompt_tokens
        logs = np.log1p(counts)
        f[:, 7:10] = logs[:, :3]
        budget = self.budgets[np.minimum(drafts.match_len, len(self.budgets) - 1)]
        f[:, 10] = lens / np.maximum(budget, 1.0)
        f[:, 11:13] = logs[:, 3:]
        f[:, 13] = states.pos / np.maximum(states.pos + states.num_prompt_tokens, 1.0)
        if not lens.all():
            f[lens == 0, :11] = 0.0  # no draft: no match group
        out[:, :14] = f
        out[:, 14:_NUM_SCALAR] = states.history
        # tokens: flags of the first draft token, means over the draft and over the context tail
        nf = len(FLAG_NAMES)
        col = _NUM_SCALAR
        bits = self._bits(drafts.tokens[:, : max(int(lens.max()), 1)])  # [B, longest draft, nf]
        out[:, col : col + nf] = bits[:, 0]
        out[:, col + nf : col + 2 * nf] = bits.sum(1) / safe_n[:, None]
        out[:, col + 2 * nf : col + 3 * nf] = self._bits(states.tails).sum(1) / np.maximum(states.tail_lens, 1)[:, None]

    def of_rows(self, drafts: Sequence[Draft], states: Sequence[StateSnapshot],
                trees: Sequence[RowTree] = ()) -> np.ndarray:
        """Rows gathered one at a time (training labels, benchmarks) through ``features``:
        each row's draft, its state snapshot taken before the draft was recorded and, for
        tree rows, its row tree cut at the nodes described (empty: a chain row)."""
        grown = RowTreeBatch.of(trees) if any(t.tokens for t in trees) else None
        return self.features(DraftBatch.of(drafts), StateBatch.stack(states), grown)


def tree_features(trees: RowTreeBatch, chain_lens: np.ndarray, num_nodes: np.ndarray) -> np.ndarray:
    """The tree group ``[B, 5]`` of row trees whose first
    ``num_nodes[i]`` nodes row i verifies; its siblings are those past its chain
    (``chain_lens``, cut at the row)."""
    parents, probs = trees.parents, trees.probs
    b, w = parents.shape
    limit = np.minimum(num_nodes, w)
    chain = np.minimum(chain_lens, limit)
    below = _below(w)
    sib = below[limit] > below[chain]  # nodes chain <= k < limit
    mass = probs * sib
    out = np.empty((b, _NUM_TREE), dtype=np.float32)
    out[:, 0] = limit - chain
    out[:, 1] = mass.sum(1)
    out[:, 2] = (mass * (parents < 0)).sum(1)
    out[:, 3] = mass.max(1) if w else 0.0
    # distinct chain nodes (the root included) that siblings hang from: marked in a row of w + 1 flags (+ 1 unused)
    hangs = np.zeros((b, w + 2), dtype=bool)
    hangs.reshape(-1)[np.where(sib & (parents < chain[:, None]), parents + 1, w + 1) + _row_starts(b, w + 2)] = True
    out[:, 4] = np.count_nonzero(hangs[:, : w + 1], axis=1)
    return out


@functools.cache
def _below(w: int) -> np.ndarray:
    """``[w + 1, w]`` bool: row k marks the nodes below index k."""
    return np.arange(w)[None, :] < np.arange(w + 1)[:, None]


@functools.lru_cache(maxsize=64)
def _row_starts(b: int, w: int) -> np.ndarray:
    """``[b, 1]``: the flat index of each row's first element in a ``[b, w]`` array."""
    return (np.arange(b) * w)[:, None]
