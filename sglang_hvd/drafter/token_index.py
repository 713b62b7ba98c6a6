"""Occurrence index over token documents: the storage behind both suffix tries.

A depth-limited suffix trie with counts answers two questions: how often does a string
s (|s| <= depth) occur, and with which next tokens. Both follow from the set of
positions where s ends, so instead of trie nodes we keep the tokens themselves and an
inverted index token -> positions; the matcher (suffix_match.py) narrows position sets
with vectorised numpy. Counts are exactly the trie's counts, for any depth.

Layout: every document (a prompt + output, or one response) is a contiguous run of the
arena, an int32 array; unused or freed slots hold SENTINEL (-1), which matches no token,
so a run can never continue across documents. The arena starts with ``pad`` sentinels so
that looking back up to ``pad`` tokens from any position stays in bounds.

Positions of each token are kept in two parts: a CSR over the arena as of the last
rebuild (rebuilt in one stable argsort when the rest grows large) and Python
lists for positions appended since. A document that outgrows its reserved room moves to
the end of the arena (capacity doubles, so appends are amortised O(1)); its old slots are
overwritten with SENTINEL, and stale index entries are filtered on lookup by checking
the arena still holds the token there. A parallel ``stamps`` array records when each
token was appended, for the recency tie-break.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

SENTINEL = -1


class TokenIndex:
    """Documents of tokens in one arena, with an index from token to positions."""

    def __init__(self, pad: int, initial_capacity: int = 1024):
        self.pad = pad
        self.arena = np.full(max(initial_capacity, 2 * pad + 1), SENTINEL, dtype=np.int32)
        # stamps[i]: when arena[i] was appended (a counter shared by all documents). Among
        # equally frequent continuations the matcher prefers the most recently appended.
        self.stamps = np.zeros(len(self.arena), dtype=np.int64)
        self.clock = 0
        self.size = pad  # arena[:size] is in use (documents, their spare room, freed slots)
        self.docs: dict[Hashable, list[int]] = {}  # doc -> [start, length, capacity]
        self.num_live = 0  # tokens in live documents
        self._sorted_pos = np.zeros(0, dtype=np.int32)  # CSR: positions sorted by (token, position)
        self._sorted_tok = np.zeros(0, dtype=np.int32)  # token at each of those positions
        self._recent: dict[int, list[int]] = {}  # token -> positions added since the last rebuild (ascending)
        self._num_recent = 0
        self._has_stale = False
        self.num_compactions = 0
        self.dead = 0  # slots (spare room included) of documents removed since the last compaction

    # -- documents ---------------------------------------------------------------------

    def add_doc(self, doc: Hashable, tokens: np.ndarray, spare: int = 256) -> None:
        """A new document holding ``tokens``, with room for ``spare`` more before it moves."""
        if doc in self.docs:
            raise KeyError(f"document {doc!r} already exists")
        n = len(tokens)
        start = self._reserve(n + spare + 1)  # +1: a trailing sentinel always follows
        self.arena[start : start + n] = tokens
        self.stamps[start : start + n] = np.arange(self.clock, self.clock + n)
        self.clock += n
        self.docs[doc] = [start, n, n + spare]
        self.num_live += n
        if n > 1024:
            self._rebuild()  # one argsort beats a Python loop for a long prompt
        else:
            self._index_range(start, start + n)

    def extend(self, doc: Hashable, tokens: np.ndarray) -> None:
        """Append tokens to a document, moving it to the arena's end if it is full."""
        entry = self.docs[doc]
        start, n, cap = entry
        k = len(tokens)
        if k == 0:
            return
        if n + k > cap:
            new_cap = max(2 * cap, n + k + 256)
            new_start = self._reserve(new_cap + 1)
            self.arena[new_start : new_start + n] = self.arena[start : start + n]
            self.stamps[new_start : new_start + n] = self.stamps[start : start + n]
            self.arena[start : start + n] = SENTINEL
            self._has_stale = True
            self._index_range(new_start, new_start + n)
            start, cap = new_start, new_cap
        self.arena[start + n : start + n + k] = tokens
        self.stamps[start + n : start + n + k] = np.arange(self.clock, self.clock + k)
        self.clock += k
        entry[:] = [start, n + k, cap]
        self.num_live += k
        self._index_range(start + n, start + n + k)

    def remove_doc(self, doc: Hashable) -> int:
        """Free a document's slots; returns how many tokens it held."""
        start, n, cap = self.docs.pop(doc)
        self.arena[start : start + n] = SENTINEL
        self.num_live -= n
        self.dead += cap + 1
        self._has_stale = True
        # Once freed documents fill half the arena in use (the native index's rule): not on
        # live tokens against the arena, which documents' spare room makes true after every removal.
        if self.size > 4 * self.pad + 4096 and 2 * self.dead > self.size:
            self._compact()
        return n

    def tokens(self, doc: Hashable) -> np.ndarray:
        start, n, _ = self.docs[doc]
        return self.arena[start : start + n]

    def doc_end(self, doc: Hashable) -> int:
        """Arena position of the document's last token."""
        start, n, _ = self.docs[doc]
        return start + n - 1

    # -- lookups ---------------------------------------------------------------------

    def positions(self, token: int) -> np.ndarray:
        """Ascending arena positions holding ``token`` (int64)."""
        key = np.int32(token)  # a Python int would make numpy cast the whole array to int64
        lo = np.searchsorted(self._sorted_tok, key, side="left")
        hi = np.searchsorted(self._sorted_tok, key, side="right")
        found = self._sorted_pos[lo:hi].astype(np.int64)
        recent = self._recent.get(token)
        if recent:
            found = np.concatenate([found, np.asarray(recent, dtype=np.int64)])
        if self._has_stale and len(found):
            found = found[self.arena[found] == token]
        return found

    def nbytes(self) -> int:
        """Bytes held by the arena and the index (Python lists counted at ~36 B/entry)."""
        index = self._sorted_pos.nbytes + self._sorted_tok.nbytes + 36 * self._num_recent
        return int(self.arena.nbytes + self.stamps.nbytes + index)

    # -- internals -------------------------------------------------------------------

    def _reserve(self, n: int) -> int:
        if self.size + n + self.pad > len(self.arena):
            if self.num_live < self.size // 2 and self.size > 4096:
                self._compact()
            if self.size + n + self.pad > len(self.arena):
                grown = np.full(max(2 * len(self.arena), self.size + n + self.pad), SENTINEL, dtype=np.int32)
                grown[: self.size] = self.arena[: self.size]
                stamps = np.zeros(len(grown), dtype=np.int64)
                stamps[: self.size] = self.stamps[: self.size]
                self.arena, self.stamps = grown, stamps
        start = self.size
        self.size += n
        return start

    def _index_range(self, lo: int, hi: int) -> None:
        recent = self._recent
        for pos, tok in zip(range(lo, hi), self.arena[lo:hi].tolist()):
            lst = recent.get(tok)
            if lst is None:
                recent[tok] = [pos]
            else:
                lst.append(pos)
        self._num_recent += hi - lo
        if self._num_recent > max(4096, len(self._sorted_pos) // 4):
            self._rebuild()

    def _rebuild(self) -> None:
        """Fold recent positions into the CSR: one stable sort of the live arena."""
        live = np.flatnonzero(self.arena[: self.size] != SENTINEL).astype(np.int32)
        toks = self.arena[live]
        order = np.argsort(toks, kind="stable")
        self._sorted_pos = live[order]
        self._sorted_tok = toks[order]
        self._recent = {}
        self._num_recent = 0
        self._has_stale = False

    def _compact(self) -> None:
        """Move live documents to the front (keeping order and spare room); reindex."""
        self.num_compactions += 1
        need = self.pad + sum(cap + 1 for _, _, cap in self.docs.values()) + self.pad
        arena = np.full(max(need, 2 * self.pad + 1024), SENTINEL, dtype=np.int32)
        stamps = np.zeros(len(arena), dtype=np.int64)
        size = self.pad
        for entry in sorted(self.docs.values()):
            start, n, cap = entry
            arena[size : size + n] = self.arena[start : start + n]
            stamps[size : size + n] = self.stamps[start : start + n]
            entry[0] = size
            size += cap + 1
        self.arena, self.stamps, self.size = arena, stamps, size
        self.dead = 0
        self._rebuild()
