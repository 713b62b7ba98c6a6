"""Gate features: what the server knows about a cache draft before it verifies it.

One implementation, used by replay (training and evaluation) and by the serving worker.
Versioned: a gate trained on schema N refuses to load against code of schema M != N.

Groups (FEATURE_NAMES lists them in order):
  match      draft length, match length, tree, score, mean/first/last token probability,
             log counts of the matched node and of the first/last drafted node, and how
             much of the length budget the draft used
  position   log output position, log prompt length, output share of the context
  history    the request's earlier drafts as far as the tokens generated since show them
             (RequestHistory): confirmed tokens and "known broken" of the last 4, log gap
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

No label leakage: every history value at position p is computed from tokens before p.
A draft made at q < p is compared only with output[q:p]; its ``confirmed`` count is
min(accept_len(q), p - q) and it counts as broken only once a mismatch lies before p.

Worked example (history): drafts were made at q=10 (tokens a b c d) and q=12 (c d e).
The output is ``a b c x ...`` from position 10. At p=13 (tokens 10, 11, 12 known):
  draft@10: confirmed 3 (a b c), not broken yet (its 4th token d is at position 13)
  draft@12: compared with output[12:13] = c: confirmed 1, not broken
At p=14 (x known): draft@10 broke: resolved with accept_len 3; draft@12 compared
with c x: confirmed 1, broke (d != x): resolved with accept_len 1.
Features at p=14: hist_obs = (1, 3, 0, 0), hist_broke = (1, 1, 0, 0), gap log(1 + 2),
mean resolved accept 2.0.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
from collections.abc import Sequence

import numpy as np

from .drafter.protocol import LOCAL_TREE, Draft, DrafterConfig
from .drafter.row_tree import EMPTY_ROW, RowTree, rows_to_arrays
from .token_flags import FLAG_NAMES, unpack

FEATURE_SCHEMA_VERSION = 2  # 2: the tree group
HISTORY_K = 4  # earlier drafts shown one by one
MISS_WINDOW = 16  # drafts over which the first-token miss rate is taken
TAIL_TOKENS = 8  # context tokens whose flags are averaged

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
_NUM_SCALAR = 14 + 2 * HISTORY_K + 4
_NUM_TREE = 5


class _Entry:
    __slots__ = ("pos", "tokens", "confirmed", "broke")

    def __init__(self, pos: int, tokens: tuple[int, ...]):
        self.pos, self.tokens, self.confirmed, self.broke = pos, tokens, 0, False

    @property
    def resolved(self) -> bool:
        return self.broke or self.confirmed == len(self.tokens)


class RequestHistory:
    """A request's recent cache drafts and what the tokens generated since reveal of them.

    Call ``record(pos, draft_tokens)`` when a draft is made at output position ``pos``
    (before its verify), and ``observe(tokens)`` with every token the request emits, in
    order. policy.RequestState does both for the decision.
    """

    __slots__ = ("pos", "_recent", "_open", "resolved_sum", "resolved_count")

    def __init__(self):
        self.pos = 0  # output tokens observed so far
        self._recent: collections.deque[_Entry] = collections.deque(maxlen=MISS_WINDOW)
        self._open: list[_Entry] = []  # entries still unresolved
        self.resolved_sum = 0
        self.resolved_count = 0

    def record(self, pos: int, draft_tokens: tuple[int, ...]) -> None:
        if pos != self.pos:
            raise ValueError(f"draft recorded at position {pos}, but {self.pos} tokens were observed")
        if draft_tokens:
            entry = _Entry(pos, tuple(draft_tokens))
            self._recent.append(entry)
            self._open.append(entry)

    def observe(self, tokens: Sequence[int]) -> None:
        start = self.pos
        self.pos += len(tokens)
        if not self._open:
            return
        still_open = []
        for e in self._open:
            # e.confirmed == start - e.pos: an open entry has matched every token so far.
            offset = start - e.pos
            n = min(len(tokens), len(e.tokens) - offset)
            k = 0
            while k < n and e.tokens[offset + k] == tokens[k]:
                k += 1
            e.confirmed = offset + k
            if k < n:
                e.broke = True
            if e.resolved:
                self.resolved_sum += e.confirmed
                self.resolved_count += 1
            else:
                still_open.append(e)
        self._open = still_open

    def scalars(self) -> list[float]:
        recent = self._recent
        obs, broke = [0.0] * HISTORY_K, [0.0] * HISTORY_K
        for i in range(min(HISTORY_K, len(recent))):
            e = recent[-1 - i]
            obs[i] = float(e.confirmed)
            broke[i] = float(e.broke)
        gap = math.log1p(self.pos - recent[-1].pos) if recent else 0.0
        mean_acc = self.resolved_sum / self.resolved_count if self.resolved_count else 0.0
        misses = sum(1 for e in recent if e.broke and e.confirmed == 0) / len(recent) if recent else 0.0
        return obs + broke + [gap, mean_acc, math.log1p(self.resolved_count), misses]


@dataclasses.dataclass(frozen=True, slots=True)
class FeatureInput:
    """One row: a request's cache draft at one decode step, with what the server knows."""

    draft: Draft
    pos: int  # output tokens generated so far
    num_prompt_tokens: int
    tail: Sequence[int]  # the last TAIL_TOKENS context tokens (fewer at the very start)
    history: Sequence[float]  # RequestHistory.scalars() taken BEFORE this draft is recorded
    row: RowTree = EMPTY_ROW  # the cache row's first min(len(chain) + S, N-1) nodes (empty: a chain row)


class FeatureExtractor:
    """Turns FeatureInputs into a ``[batch, len(FEATURE_NAMES)]`` float32 matrix."""

    def __init__(self, token_flags: np.ndarray, drafter_config: DrafterConfig):
        self.token_flags = token_flags
        # Flags unpacked once: [vocab_size + 1, len(FLAG_NAMES)] float32; the extra last row
        # (all zero) serves ids beyond the tokenizer's vocabulary.
        self.flag_table = np.concatenate([unpack(token_flags), np.zeros((1, len(FLAG_NAMES)), np.float32)])
        self.budgets = np.array([drafter_config.budget(p) for p in range(drafter_config.max_depth + 1)], dtype=np.float32)
        self.vocab_size = len(token_flags)

    def _bits(self, ids: np.ndarray) -> np.ndarray:
        """``[n]`` token ids -> ``[n, len(FLAG_NAMES)]`` 0/1 flags (ids beyond the vocab: none)."""
        return self.flag_table[np.minimum(ids, self.vocab_size)]

    def __call__(self, rows: Sequence[FeatureInput]) -> np.ndarray:
        """Features of Draft-object rows (replay)."""
        b = len(rows)
        if b == 0:
            return np.zeros((0, len(FEATURE_NAMES)), dtype=np.float32)
        # One tuple per row, everything else vectorised over the batch.
        raw = np.fromiter(itertools.chain.from_iterable(
            (len(d.tokens), d.match_len, d.tree == LOCAL_TREE, d.score,
             d.probs[0] if d.probs else 0.0, d.probs[-1] if d.probs else 0.0,
             d.match_count, d.child_counts[0] if d.child_counts else 0,
             d.child_counts[-1] if d.child_counts else 0, r.pos, r.num_prompt_tokens)
            for r in rows for d in (r.draft,)), dtype=np.float64, count=11 * b).reshape(b, 11)
        width = _NUM_SCALAR - 14
        history = np.fromiter(itertools.chain.from_iterable(r.history for r in rows), dtype=np.float32,
                              count=width * b).reshape(b, width)
        lens = raw[:, 0].astype(np.int64)
        ids = np.fromiter(itertools.chain.from_iterable(r.draft.tokens for r in rows), dtype=np.int64, count=int(lens.sum()))
        tails = [r.tail[-TAIL_TOKENS:] if len(r.tail) > TAIL_TOKENS else r.tail for r in rows]
        tail_lens = np.fromiter(map(len, tails), dtype=np.int64, count=b)
        tail_ids = np.concatenate([np.asarray(t, dtype=np.int64) for t in tails]) if tail_lens.any() else np.zeros(0, np.int64)
        out = self._compute(raw, history, ids, lens, tail_ids, tail_lens)
        if any(r.row.tokens for r in rows):
            trees = rows_to_arrays([r.row for r in rows], max(len(r.row) for r in rows))
            out[:, -_NUM_TREE:] = tree_features(trees, lens, trees["row_lengths"])
        return out

    def from_arrays(self, drafts: dict[str, np.ndarray], pos: np.ndarray, num_prompt_tokens: np.ndarray,
                    history: np.ndarray, tails: np.ndarray, tail_lens: np.ndarray,
                    rows: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """Features of a decode batch from a drafter's array output (serving).

        drafts: ``speculate_arrays`` output (tokens/probs/child_counts [B, W] padded,
        lengths, match_len, match_count, score, tree [B]); pos, num_prompt_tokens [B];
        history [B, H] (RequestHistory.scalars rows); tails [B, TAIL_TOKENS] with the
        last ``tail_lens[i]`` context tokens of row i left-aligned; rows: the batch's row
        trees (``speculate_rows`` arrays) cut at the nodes the decision would verify
        (``row_lengths``; None: chain rows, no siblings).
        """
        lens = drafts["lengths"].astype(np.int64)
        b = len(lens)
        last = np.maximum(lens - 1, 0)[:, None]
        raw = np.stack([
            lens, drafts["match_len"], drafts["tree"] == 1, drafts["score"],
            drafts["probs"][:, 0], np.take_along_axis(drafts["probs"], last, 1)[:, 0], drafts["match_count"],
            drafts["child_counts"][:, 0], np.take_along_axis(drafts["child_counts"], last, 1)[:, 0], pos, num_prompt_tokens,
        ], axis=1).astype(np.float64)
        ids = drafts["tokens"][np.arange(drafts["tokens"].shape[1])[None, :] < lens[:, None]].astype(np.int64)
        tail_ids = tails[np.arange(tails.shape[1])[None, :] < tail_lens[:, None]].astype(np.int64)
        out = self._compute(raw, np.asarray(history, dtype=np.float32), ids, lens, tail_ids, tail_lens.astype(np.int64))
        if rows is not None:
            out[:, -_NUM_TREE:] = tree_features(rows, lens, rows["row_lengths"])
        return out

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
            out[has_tail, col + 2 * nf : col + 3 * nf] = np.add.reduceat(tbits, tstarts[has_tail], axis=0) / tail_lens[has_tail, None]
        return out


def tree_features(rows: dict[str, np.ndarray], chain_lens: np.ndarray, num_nodes: np.ndarray) -> np.ndarray:
    """The tree group ``[B, 5]`` of row trees (``rows_to_arrays`` arrays) whose first
    ``num_nodes[i]`` nodes row i verifies; its siblings are those past its chain
    (``chain_lens``, cut at the row)."""
    parents, probs = rows["row_parents"], rows["row_probs"]
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
