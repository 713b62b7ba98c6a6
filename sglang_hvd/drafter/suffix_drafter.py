"""The reference cache drafter ("python"): two occurrence indexes, SuffixDecoding search.

- Each running request has its own TokenIndex holding one document: prompt + output.
- One global TokenIndex holds a document per response, running or finished. Finished
  responses stay until the token budget (``global_max_tokens``) forces the oldest out;
  running ones are never evicted.

Appends may come in any chunking (one token at a time in dense replay, accepted chunks
in serving): the indexes depend only on the token sequence, so drafts do too.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from .batch import DraftBatch, RowTreeBatch
from .protocol import GLOBAL_TREE, LOCAL_TREE, Draft, DrafterConfig, DraftTree, as_token_array
from .registry import register_drafter
from .row_tree import EMPTY_ROW, row_of
from .suffix_match import best_draft, best_tree
from .token_index import TokenIndex


@register_drafter("python")
class SuffixDrafter:
    """Reference implementation of the Drafter protocol (numpy, one request at a time)."""

    name = "python"

    def __init__(self, config: DrafterConfig | None = None):
        self.config = config or DrafterConfig()
        self.reset()

    def reset(self) -> None:
        self._local: dict[str, TokenIndex] = {}
        self._global = TokenIndex(pad=self.config.max_depth, initial_capacity=1 << 16)
        self._finished: OrderedDict[str, None] = OrderedDict()  # cached responses, oldest first
        self.num_evicted_responses = 0

    # -- lifecycle -------------------------------------------------------------------

    def start_request(self, req_id: str, prompt_ids: Sequence[int] | np.ndarray) -> None:
        if req_id in self._local:
            raise ValueError(f"request {req_id!r} is already running")
        if req_id in self._finished:  # a reused id replaces its old cached response
            del self._finished[req_id]
            self._global.remove_doc(req_id)
        capacity = len(prompt_ids) + 2 * self.config.max_depth + 512
        local = TokenIndex(pad=self.config.max_depth, initial_capacity=capacity)
        local.add_doc(0, as_token_array(prompt_ids))
        self._local[req_id] = local
        self._global.add_doc(req_id, np.zeros(0, dtype=np.int32), spare=64)

    def append(self, req_id: str, token_ids: Sequence[int] | np.ndarray) -> None:
        tokens = as_token_array(token_ids)
        self._running(req_id).extend(0, tokens)
        self._global.extend(req_id, tokens)
        if self._global.num_live > self.config.global_max_tokens:
            self._evict()

    def finish_request(self, req_id: str) -> None:
        """The request ended (finished or aborted): its response stays in the global cache."""
        self._running(req_id)
        del self._local[req_id]
        self._finished[req_id] = None
        self._evict()

    # -- drafting --------------------------------------------------------------------

    def speculate(self, req_id: str) -> Draft:
        local = self._running(req_id)
        end = local.doc_end(0) + 1
        tail = local.arena[max(local.pad, end - self.config.max_depth) : end]
        own = best_draft(local, tail, self.config, LOCAL_TREE)
        shared = best_draft(self._global, tail, self.config, GLOBAL_TREE)
        return own if own.score >= shared.score else shared

    def speculate_tree(self, req_id: str, max_nodes: int, like: Draft | None = None) -> DraftTree:
        """A tree draft of at most ``max_nodes`` nodes (the reference semantics); ``like``:
        only from the occurrence set that chain draft was drawn from (its tree and match
        length)."""
        local = self._running(req_id)
        end = local.doc_end(0) + 1
        tail = local.arena[max(local.pad, end - self.config.max_depth) : end]
        if like is not None and like.tokens:
            index = local if like.tree == LOCAL_TREE else self._global
            return best_tree(index, tail, self.config, like.tree, max_nodes, only_len=like.match_len)
        own = best_tree(local, tail, self.config, LOCAL_TREE, max_nodes)
        shared = best_tree(self._global, tail, self.config, GLOBAL_TREE, max_nodes)
        return own if own.score >= shared.score else shared

    def speculate_rows(self, req_ids: Sequence[str], max_nodes: int) -> RowTreeBatch:
        """The row trees of a batch (row_tree.py, whose functions are the reference)."""
        return RowTreeBatch.of([row_of(self, r, max_nodes) for r in req_ids], max_nodes)

    def speculate_batch(self, req_ids: Sequence[str]) -> list[Draft]:
        return [self.speculate(r) for r in req_ids]

    def speculate_step(self, req_ids: Sequence[str], max_nodes: int,
                       siblings: int | None = None) -> tuple[DraftBatch, RowTreeBatch]:
        """``speculate_arrays`` and ``speculate_rows`` of the batch (the native drafter's one
        call); ``siblings``: each row's tree cut at min(len(chain) + siblings, max_nodes)."""
        if siblings is not None and siblings < 0:
            raise ValueError(f"siblings must be >= 0, got {siblings}")
        chains = self.speculate_arrays(req_ids)
        if siblings is None:
            return chains, self.speculate_rows(req_ids, max_nodes)
        cuts = np.minimum(chains.lengths + siblings, max_nodes).tolist()
        return chains, RowTreeBatch.of([row_of(self, r, m) if m else EMPTY_ROW for r, m in zip(req_ids, cuts)],
                                       max_nodes)

    def speculate_arrays(self, req_ids: Sequence[str]) -> DraftBatch:
        return DraftBatch.of(self.speculate_batch(req_ids), self.config.max_spec_tokens)

    def append_batch(self, req_ids: Sequence[str], token_ids: Sequence) -> None:
        """Each request's emitted tokens, in order; nothing is appended unless every request
        runs and every id is valid."""
        if len(req_ids) != len(token_ids):
            raise ValueError(f"append_batch: one token list per request, got {len(token_ids)} for {len(req_ids)}")
        chunks = [as_token_array(t) for t in token_ids]
        for r in req_ids:
            self._running(r)
        for r, t in zip(req_ids, chunks):
            self.append(r, t)

    # -- introspection ---------------------------------------------------------------

    def context(self, req_id: str) -> np.ndarray:
        """The request's prompt + output as the drafter holds it (a copy)."""
        return self._running(req_id).tokens(0).copy()

    def memory_stats(self) -> dict[str, float]:
        cached = self._global.num_live
        local_tokens = sum(ix.num_live for ix in self._local.values())
        nbytes = self._global.nbytes() + sum(ix.nbytes() for ix in self._local.values())
        return {
            "global_tokens": float(cached),
            "local_tokens": float(local_tokens),
            "bytes": float(nbytes),
            "bytes_per_token": nbytes / max(1, cached + local_tokens),
            "evicted_responses": float(self.num_evicted_responses),
            "compactions": float(self._global.num_compactions),
        }

    def _running(self, req_id: str) -> TokenIndex:
        try:
            return self._local[req_id]
        except KeyError:
            raise KeyError(f"request {req_id!r} is not running (start_request first)") from None

    def _evict(self) -> None:
        while self._global.num_live > self.config.global_max_tokens and self._finished:
            oldest, _ = self._finished.popitem(last=False)
            self._global.remove_doc(oldest)
            self.num_evicted_responses += 1
