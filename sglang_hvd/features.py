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

from collections.abc import Sequence

import numpy as np

from .drafter.batch import TREE_CODES, DraftBatch, RowTreeBatch
from .drafter.protocol import LOCAL_TREE, Draft, DrafterConfig
from .drafter.row_tree import RowTree
from .request_state import HISTORY_K, NUM_HISTORY, StateBatch, StateSnapshot
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
        # Flags unpacked once: [vocab_size + 1, len(FLAG_NAMES)] float32; the extra last row
        # (all zero) serves ids beyond the tokenizer's vocabulary.
        self.flag_table = np.concatenate([unpack(token_flags), np.zeros((1, len(FLAG_NAMES)), np.float32)])
        self.budgets = np.array([drafter_config.budget(p) for p in range(drafter_config.max_depth + 1)],
                                dtype=np.float32)
        self.vocab_size = len(token_flags)

    def _bits(self, ids: np.ndarray) -> np.ndarray:
        """``[n]`` token ids -> ``[n, len(FLAG_NAMES)]`` 0/1 flags (ids beyond the vocab: none)."""
        return self.flag_table[np.minimum(ids, self.vocab_size)]

    def features(self, drafts: DraftBatch, states: StateBatch, trees: RowTreeBatch | None = None) -> np.ndarray:
        """``[B, len(FEATURE_NAMES)]`` float32 features of a batch's cache drafts in their
        states (taken before the drafts are recorded into the histories); ``trees``: the
        rows' row trees cut at the nodes the decision would verify (``lengths``;
        decision.described), None for chain rows (no siblings)."""
        lens = drafts.lengths.astype(np.int64)
        if not len(lens):
            return np.zeros((0, len(FEATURE_NAMES)), dtype=np.float32)
        last = np.maximum(lens - 1, 0)[:, None]
        raw = np.stack([
            lens, drafts.match_len, drafts.tree == TREE_CODES[LOCAL_TREE], drafts.score,
            drafts.probs[:, 0], np.take_along_axis(drafts.probs, last, 1)[:, 0], drafts.match_count,
            drafts.child_counts[:, 0], np.take_along_axis(drafts.child_counts, last, 1)[:, 0],
            states.pos, states.num_prompt_tokens,
        ], axis=1).astype(np.float64)
        ids = drafts.tokens[np.arange(drafts.width)[None, :] < lens[:, None]].astype(np.int64)
        tail_lens = states.tail_lens.astype(np.int64)
        tail_ids = states.tails[np.arange(states.tails.shape[1])[None, :] < tail_lens[:, None]].astype(np.int64)
        out = self._compute(raw, np.asarray(states.history, dtype=np.float32), ids, lens, tail_ids, tail_lens)
        if trees is not None:
            out[:, -_NUM_TREE:] = tree_features(trees, lens, trees.lengths)
        return out

    def of_rows(self, drafts: Sequence[Draft], states: Sequence[StateSnapshot],
                trees: Sequence[RowTree] = ()) -> np.ndarray:
        """Rows gathered one at a time (training labels, benchmarks) through ``features``:
        each row's draft, its state snapshot taken before the draft was recorded and, for
        tree rows, its row tree cut at the nodes described (empty: a chain row)."""
        grown = RowTreeBatch.of(trees) if any(t.tokens for t in trees) else None
        return self.features(DraftBatch.of(drafts), StateBatch.stack(states), grown)

    def _compute(self, raw: np.ndarray, history: np.ndarray, ids: np.ndarray, lens: np.ndarray,
                 tail_ids: np.ndarray, tail_lens: np.ndarray) -> np.ndarray:
        """raw [b, 11]: draft len, match len, is local, score, first prob, last prob, match
        count, first/last child count, pos, prompt len; ids/tail_ids flat with their lens."""
        b = len(raw)
        out = np.zeros((b, len(FEATURE_NAMES)), dtype=np.float32)
        n, match_len = raw[:, 0], raw[:, 1]
        has = n > 0
        safe_n = np.maximum(n, 1.0)
        budget = self.budgets[np.minimum(match_len, len(self.budgets) - 1).astype(np.int64)]
        match = np.stack([
            n, match_len, raw[:, 2], raw[:, 3], raw[:, 3] / safe_n, raw[:, 4], raw[:, 5],
            np.log1p(raw[:, 6]), np.log1p(raw[:, 7]), np.log1p(raw[:, 8]), n / np.maximum(budget, 1.0),
        ], axis=1)
        out[:, :11] = np.where(has[:, None], match, 0.0)
        pos, prompt = raw[:, 9], raw[:, 10]
        out[:, 11] = np.log1p(pos)
        out[:, 12] = np.log1p(prompt)
        out[:, 13] = pos / np.maximum(pos + prompt, 1.0)
        out[:, 14:_NUM_SCALAR] = history
        nf = len(FLAG_NAMES)
        col = _NUM_SCALAR
        if has.any():
            bits = self._bits(ids)  # [total_draft_tokens, nf]
            starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
            out[has, col : col + nf] = bits[starts[has]]
            out[has, col + nf : col + 2 * nf] = np.add.reduceat(bits, starts[has], axis=0) / lens[has, None]
        if len(tail_ids):
            tbits = self._bits(tail_ids)
            has_tail = tail_lens > 0
            tstarts = np.concatenate([[0], np.cumsum(tail_lens)[:-1]])
            tail_sums = np.add.reduceat(tbits, tstarts[has_tail], axis=0)
            out[has_tail, col + 2 * nf : col + 3 * nf] = tail_sums / tail_lens[has_tail, None]
        return out


def tree_features(trees: RowTreeBatch, chain_lens: np.ndarray, num_nodes: np.ndarray) -> np.ndarray:
    """The tree group ``[B, 5]`` of row trees whose first
    ``num_nodes[i]`` nodes row i verifies; its siblings are those past its chain
    (``chain_lens``, cut at the row)."""
    parents, probs = trees.parents, trees.probs
    b, w = parents.shape
    col = np.arange(w)[None, :]
    limit = np.minimum(np.asarray(num_nodes, dtype=np.int64), w)[:, None]
    chain = np.minimum(np.asarray(chain_lens, dtype=np.int64)[:, None], limit)
    sib = (col >= chain) & (col < limit)
    mass = probs * sib
    out = np.empty((b, _NUM_TREE), dtype=np.float32)
    out[:, 0] = sib.sum(1)
    out[:, 1] = mass.sum(1)
    out[:, 2] = (mass * (parents < 0)).sum(1)
    out[:, 3] = mass.max(1) if w else 0.0
    # distinct chain nodes (the root included) that siblings hang from: sorted keys, counted where they change
    keys = np.sort(np.where(sib & (parents < chain), parents + 1, -1), axis=1)
    out[:, 4] = ((keys[:, 1:] != keys[:, :-1]) & (keys[:, 1:] >= 0)).sum(1) + (keys[:, 0] >= 0)
    return out
