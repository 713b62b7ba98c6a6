"""A drafter's batch outputs: the chain drafts of a decode batch and their row trees.

``Drafter.speculate_arrays(req_ids)`` returns a DraftBatch, ``Drafter.speculate_rows(req_ids,
B)`` a RowTreeBatch: row i of each is request ``req_ids[i]``. Both are frozen records of
numpy arrays, padded to one width; the decision (decision.py) and the features
(features.py) read them, nothing writes them after they are made.

Worked example (width 4): drafts ``5 7`` (probs .5 .25, from the request's own tree) and
none give ``tokens [[5, 7, -1, -1], [-1, -1, -1, -1]]``, ``lengths [2, 0]``, ``tree [1, 0]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .protocol import GLOBAL_TREE, LOCAL_TREE, Draft
from .row_tree import RowTree

TREE_CODES = {"": 0, LOCAL_TREE: 1, GLOBAL_TREE: 2}  # DraftBatch.tree
TREE_NAMES = {code: name for name, code in TREE_CODES.items()}


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class DraftBatch:
    """Chain drafts of B requests (Draft's fields as arrays), padded to a width W."""

    tokens: np.ndarray  # [B, W] int32, -1 padded
    probs: np.ndarray  # [B, W] float64 path probability of each token, 0 padded
    child_counts: np.ndarray  # [B, W] int64 trie count of each drafted token's node, 0 padded
    lengths: np.ndarray  # [B] int32 draft tokens (0: no draft)
    match_len: np.ndarray  # [B] int32 context tokens matched
    match_count: np.ndarray  # [B] int64 occurrences of the matched pattern
    score: np.ndarray  # [B] float64 sum of probs
    tree: np.ndarray  # [B] int32 TREE_CODES: 0 none, 1 local, 2 global

    def __post_init__(self):
        b = len(self.lengths)
        if self.tokens.ndim != 2 or self.tokens.shape[0] != b or self.probs.shape != self.tokens.shape:
            raise ValueError(f"draft batch of {b} rows with tokens {self.tokens.shape} and probs {self.probs.shape}")

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    @classmethod
    def of(cls, drafts: Sequence[Draft], width: int | None = None) -> DraftBatch:
        """Drafts packed at ``width`` (default: the longest draft, at least 1)."""
        b = len(drafts)
        w = max((len(d.tokens) for d in drafts), default=0) if width is None else width
        w = max(w, 1)
        tokens = np.full((b, w), -1, dtype=np.int32)
        probs, counts = np.zeros((b, w)), np.zeros((b, w), dtype=np.int64)
        lengths, match_len, tree = (np.zeros(b, dtype=np.int32) for _ in range(3))
        match_count, score = np.zeros(b, dtype=np.int64), np.zeros(b)
        for i, d in enumerate(drafts):
            n = len(d.tokens)
            tokens[i, :n], probs[i, :n], counts[i, :n] = d.tokens, d.probs, d.child_counts
            lengths[i], match_len[i], match_count[i] = n, d.match_len, d.match_count
            score[i], tree[i] = d.score, TREE_CODES[d.tree]
        return cls(tokens, probs, counts, lengths, match_len, match_count, score, tree)

    def draft(self, i: int) -> Draft:
        """Row i as a Draft record."""
        n = int(self.lengths[i])
        if not n:
            return Draft()
        return Draft(tokens=tuple(self.tokens[i, :n].tolist()), probs=tuple(self.probs[i, :n].tolist()),
                     child_counts=tuple(self.child_counts[i, :n].tolist()), score=float(self.score[i]),
                     match_len=int(self.match_len[i]), match_count=int(self.match_count[i]),
                     tree=TREE_NAMES[int(self.tree[i])])

    def draft_tokens(self, i: int) -> tuple[int, ...]:
        return tuple(self.tokens[i, : int(self.lengths[i])].tolist())


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class RowTreeBatch:
    """Row trees (row_tree.py) of B requests, padded to a width W (the nodes asked for)."""

    tokens: np.ndarray  # [B, W] int32, -1 padded
    parents: np.ndarray  # [B, W] int32 parent index (-1: under the root), -1 padded
    probs: np.ndarray  # [B, W] float64 path probability of each node, 0 padded
    lengths: np.ndarray  # [B] int32 nodes in the row tree

    def __post_init__(self):
        b = len(self.lengths)
        if self.tokens.ndim != 2 or self.tokens.shape[0] != b or self.parents.shape != self.tokens.shape:
            raise ValueError(
                f"row-tree batch of {b} rows with tokens {self.tokens.shape}, parents {self.parents.shape}")

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    @classmethod
    def empty(cls, b: int, width: int) -> RowTreeBatch:
        return cls(np.full((b, width), -1, np.int32), np.full((b, width), -1, np.int32), np.zeros((b, width)),
                   np.zeros(b, np.int32))

    @classmethod
    def of(cls, rows: Sequence[RowTree], width: int | None = None) -> RowTreeBatch:
        """Row trees packed at ``width`` (default: the largest row, at least 1)."""
        w = max(max((len(r.tokens) for r in rows), default=0) if width is None else width, 1)
        out = cls.empty(len(rows), w)
        for i, row in enumerate(rows):
            n = len(row.tokens)
            out.lengths[i] = n
            out.tokens[i, :n], out.parents[i, :n], out.probs[i, :n] = row.tokens, row.parents, row.probs
        return out

    def row(self, i: int) -> RowTree:
        n = int(self.lengths[i])
        return RowTree(tuple(self.tokens[i, :n].tolist()), tuple(self.parents[i, :n].tolist()),
                       tuple(self.probs[i, :n].tolist()))

    def scatter(self, which: np.ndarray, b: int, width: int, num_nodes: np.ndarray) -> RowTreeBatch:
        """This batch's rows placed at batch rows ``which`` (distinct, ascending: np.flatnonzero's)
        of a new batch of ``b`` rows and ``width`` nodes, row k cut at ``num_nodes[k]`` nodes; the
        other rows empty. Every row asked at this width (a batch whose rows all drafted): the node
        arrays are shared, not copied (nothing writes a batch after it is made)."""
        lengths = np.minimum(self.lengths, num_nodes)
        if len(which) == b and width == self.width:  # which is 0, 1, ..., b - 1
            return RowTreeBatch(self.tokens, self.parents, self.probs, lengths.astype(np.int32, copy=False))
        out = RowTreeBatch.empty(b, width)
        w = min(width, self.width)
        out.tokens[which, :w], out.parents[which, :w], out.probs[which, :w] = (
            self.tokens[:, :w], self.parents[:, :w], self.probs[:, :w])
        out.lengths[which] = lengths
        return out
