"""Find the best draft of one tree (a TokenIndex) for a context: the SuffixDecoding search.

Pattern lengths are handled through the sets of positions where the context's suffix of
each length ends. Those sets are nested (a longer suffix occurs at a subset of the
places a shorter one does), so most lengths share a set with their neighbours, and
lengths that share a set share the draft: only its budget differs. We therefore

  1. narrow the set of the last token backwards one length at a time while it is large,
  2. once it is small, compute each occurrence's backward match length at once
     (a [occurrences x lengths] comparison), giving every remaining distinct set,
  3. draft from each distinct set, longest pattern first, skipping sets whose budget
     cannot beat the best score so far (probabilities are <= 1, so score <= budget).

A set larger than ``max_occurrences`` (K) is walked from its K most recently appended
occurrences (by stamp), which bounds the work on repetitive text; the one-token
pattern's first token still counts all of its occurrences (as the native drafter's
cached successor counts do), and its walk goes on from the newest K. Patterns of two
tokens and more are looked for among the newest ``max_scan`` (M, at least K) occurrences
of the context's last two tokens, which bounds the search on frequent pairs.

Worked example: context ``... 4 7 8``, arena positions of 8 = {10, 31, 52(self)}.
Length 1: {10, 31, 52}. Looking one back, arena[9]=7, arena[30]=7, arena[51]=7: length 2
keeps all three. Two back, arena[8]=4, arena[29]=2, arena[50]=4: length 3 -> {10, 52}.
Sets: lengths 1-2 -> {10, 31, 52}, length 3 and up -> {10, 52} (until 10 stops matching).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq

import numpy as np

from .protocol import EMPTY_DRAFT, EMPTY_TREE, Draft, DrafterConfig, DraftTree
from .token_index import TokenIndex

# Below this many occurrences, backward match lengths are computed as one matrix.
_SMALL_SET = 48


def _groups(index: TokenIndex, rev: np.ndarray, max_p: int, scan_limit: int) -> list[tuple[int, int, np.ndarray]]:
    """Distinct occurrence sets as ``(p_lo, p_hi, end_positions)``, ascending in p.

    ``rev[j]`` is the context's (j+1)-th token from the end; every position in a set for
    pattern length p satisfies ``arena[e - j] == rev[j]`` for j < p. Sets of two tokens and
    more come from the newest ``scan_limit`` occurrences of the last two tokens.
    """
    arena = index.arena
    ends = index.positions(int(rev[0]))
    if len(ends) == 0:
        return []
    if max_p < 2:
        return [(1, max_p, ends)]
    pairs = ends[arena[ends - 1] == rev[1]]
    # The one-token pattern has a set of its own unless every occurrence is the pair's.
    groups = [] if len(pairs) == len(ends) else [(1, 1, ends)]
    if len(pairs) == 0:
        return groups
    p_lo = 1 if not groups else 2
    ends = newest(index, pairs, scan_limit)
    p = 2
    while p < max_p and len(ends) > _SMALL_SET:
        longer = ends[arena[ends - p] == rev[p]]
        if len(longer) != len(ends):
            groups.append((p_lo, p, ends))
            if len(longer) == 0:
                return groups
            p_lo, ends = p + 1, longer
        p += 1
    if p >= max_p:
        groups.append((p_lo, max_p, ends))
        return groups
    # Backward match length of every remaining occurrence, capped at max_p.
    offsets = np.arange(p, max_p)
    window = arena[ends[:, None] - offsets[None, :]]  # [len(ends), max_p - p]
    agree = window == rev[p:max_p][None, :]
    mismatch = ~agree
    run = np.where(mismatch.any(axis=1), mismatch.argmax(axis=1), max_p - p)
    match_len = p + run  # [len(ends)], each in [p, max_p]
    lo = p_lo
    for level in np.unique(match_len).tolist():
        groups.append((lo, level, ends[match_len >= level]))
        lo = level + 1
    return groups


def newest(index: TokenIndex, ends: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` occurrences of ``ends`` appended last (all if fewer), ascending."""
    if len(ends) <= k:
        return ends
    return np.sort(ends[np.argsort(index.stamps[ends], kind="stable")[-k:]])


def _walk(index: TokenIndex, ends: np.ndarray, limit: int, min_prob: float, cap: int, exact_first: bool = False):
    """Greedy most-frequent-child walk from a node whose occurrences end at ``ends``,
    counting over the newest ``cap`` of them (after the first step: ``exact_first``).

    Returns ``(tokens, probs, child_counts)``. The parent count at each step is the
    number of occurrences still on the path, including those whose next slot is a
    SENTINEL (the string occurs there but nothing follows yet).
    """
    arena = index.arena
    prob = 1.0
    cur = ends if exact_first else newest(index, ends, cap)
    tokens: list[int] = []
    probs: list[float] = []
    counts: list[int] = []
    # Large sets: narrow with numpy until the set is small enough for plain lists.
    while len(cur) > _SMALL_SET and len(tokens) < limit:
        if tokens:
            cur = newest(index, cur, cap)
            if len(cur) <= _SMALL_SET:
                break
        nxt = arena[cur + 1]
        valid = nxt >= 0
        nv = nxt[valid]
        if len(nv) == 0:
            return tokens, probs, counts
        if len(nv) > 512:  # counting beats sorting for large sets
            num = np.bincount(nv)
            best = int(num.max())
            tied_tokens = np.flatnonzero(num == best)
        else:
            vals, num = np.unique(nv, return_counts=True)
            best = int(num.max())
            tied_tokens = vals[num == best]
        if len(tied_tokens) == 1:
            tok = int(tied_tokens[0])
        else:  # most recently appended among the most frequent
            mask = np.isin(nv, tied_tokens)
            tok = int(nv[mask][index.stamps[cur[valid] + 1][mask].argmax()])
        prob *= best / len(cur)
        if prob < min_prob:
            return tokens, probs, counts
        tokens.append(tok)
        probs.append(prob)
        counts.append(best)
        cur = cur[valid][nv == tok] + 1
    todo = limit - len(tokens)
    if todo <= 0:
        return tokens, probs, counts
    cur = newest(index, cur, cap) if tokens or not exact_first else cur
    # Small sets: the next `todo` tokens after every occurrence, walked in Python.
    rows = arena[cur[:, None] + 1 + np.arange(todo)[None, :]].tolist()  # [len(cur), todo]
    alive = list(range(len(rows)))
    for step in range(todo):
        if len(alive) == 1:
            # One occurrence left: the rest is a literal copy with unchanged probability.
            if prob >= min_prob:
                for tok in rows[alive[0]][step:]:
                    if tok < 0:
                        break
                    tokens.append(tok)
                    probs.append(prob)
                    counts.append(1)
            break
        num_by_tok: dict[int, int] = {}
        for i in alive:
            tok = rows[i][step]
            if tok >= 0:
                num_by_tok[tok] = num_by_tok.get(tok, 0) + 1
        if not num_by_tok:
            break
        best = max(num_by_tok.values())
        tied = [t for t, n in num_by_tok.items() if n == best]
        if len(tied) == 1:
            tok = tied[0]
        else:  # most recently appended among the most frequent
            stamps = index.stamps
            tok = max(((int(stamps[int(cur[i]) + 1 + step]), rows[i][step]) for i in alive if rows[i][step] in tied))[1]
        prob *= best / len(alive)
        if prob < min_prob:
            break
        tokens.append(tok)
        probs.append(prob)
        counts.append(best)
        alive = [i for i in alive if rows[i][step] == tok]
        if len(alive) > cap:  # after an exact first step: go on from the newest K
            stamps = index.stamps
            alive = sorted(sorted(alive, key=lambda i: int(stamps[int(cur[i]) + 1 + step]))[-cap:])
    return tokens, probs, counts


@functools.lru_cache(maxsize=16)
def _budget_table(config: DrafterConfig) -> tuple[int, ...]:
    """``budget(p)`` for p = 0 .. max_depth."""
    return tuple(config.budget(p) for p in range(config.max_depth + 1))


@functools.lru_cache(maxsize=1 << 16)
def _best_length(config: DrafterConfig, p_lo: int, p_hi: int) -> int:
    """The pattern length in [p_lo, p_hi] with the largest budget (ties: the longer)."""
    budgets = _budget_table(config)
    return max(range(p_lo, p_hi + 1), key=lambda q: (budgets[q], q))


def _sets(index: TokenIndex, context_tail: np.ndarray, config: DrafterConfig):
    """The distinct occurrence sets of the context's suffixes, longest pattern first, as
    ``(p_lo, p_hi, limit, ends, alone, match_count)``: same set => same draft, grown with
    the largest budget of its lengths (``limit``; ties: the longer). ``alone``: the
    one-token pattern with a set of its own, whose first step counts every occurrence;
    every other set is walked from its newest K (``match_count`` is the size walked)."""
    max_p = min(len(context_tail), config.max_depth) - 1
    if max_p < 1:
        return
    rev = np.ascontiguousarray(context_tail[::-1][: max_p + 1])
    budgets = _budget_table(config)
    for p_lo, p_hi, ends in reversed(_groups(index, rev, max_p, config.scan_limit)):
        alone = p_hi == 1 and not (max_p == 1 and bool(np.all(index.arena[ends - 1] == rev[1])))
        count = len(ends) if alone else min(len(ends), config.max_occurrences)
        yield p_lo, p_hi, budgets[_best_length(config, p_lo, p_hi)], ends, alone, count


def _match_len(config: DrafterConfig, p_lo: int, p_hi: int, depth: int) -> int:
    """Every length of a set whose budget admits the whole draft drafts the same; the
    longest of them is the match (as a search over all lengths finds)."""
    budgets = _budget_table(config)
    return max(q for q in range(p_lo, p_hi + 1) if budgets[q] >= depth)


def best_draft(index: TokenIndex, context_tail: np.ndarray, config: DrafterConfig, tree: str) -> Draft:
    """The best-scoring draft of one tree; ties go to the longer pattern."""
    best = EMPTY_DRAFT
    for p_lo, p_hi, limit, ends, alone, count in _sets(index, context_tail, config):
        if limit <= best.score:  # probabilities are <= 1
            continue
        tokens, probs, counts = _walk(index, ends, limit, config.min_token_prob, config.max_occurrences,
                                      exact_first=alone)
        score = float(sum(probs))
        if tokens and score > best.score:
            best = Draft(tokens=tuple(tokens), probs=tuple(probs), child_counts=tuple(counts), score=score,
                         match_len=_match_len(config, p_lo, p_hi, len(tokens)), match_count=count, tree=tree)
    return best


def _grow_tree(index: TokenIndex, ends: np.ndarray, limit: int, max_nodes: int, min_prob: float, cap: int,
               exact_first: bool) -> list[tuple[int, int, float, int]]:
    """Best-first tree from a node whose occurrences end at ``ends``: ``(token, parent,
    prob, count)`` per node in the order chosen. A frontier node's key is (-prob, depth,
    -newest stamp of its occurrences): ties go to the shallower node, then to the more
    recently appended one (the chain walk's rule), so parents come before children. A
    node's children are counted over the newest ``cap`` of its occurrences (its first
    level over all of them with ``exact_first``, as the chain walk does)."""
    arena, stamps = index.arena, index.stamps
    nodes: list[tuple[int, int, float, int]] = []
    frontier: list = []

    def push_children(occ: np.ndarray, parent: int, prob: float, depth: int) -> None:
        nxt = arena[occ + 1]
        valid = nxt >= 0
        if not valid.any():
            return
        total = len(occ)
        for tok in np.unique(nxt[valid]).tolist():
            hit = occ[nxt == tok] + 1
            child = prob * (len(hit) / total)
            if child >= min_prob:
                heapq.heappush(frontier, (-child, depth, -int(stamps[hit].max()), tok, parent, hit))

    if limit < 1:
        return nodes
    push_children(ends if exact_first else newest(index, ends, cap), -1, 1.0, 1)
    while frontier and len(nodes) < max_nodes:
        neg_prob, depth, _, tok, parent, occ = heapq.heappop(frontier)
        nodes.append((tok, parent, -neg_prob, len(occ)))
        if depth < limit:
            push_children(newest(index, occ, cap), len(nodes) - 1, -neg_prob, depth + 1)
    return nodes


def best_tree(index: TokenIndex, context_tail: np.ndarray, config: DrafterConfig, tree: str,
              max_nodes: int, only_len: int = 0) -> DraftTree:
    """The best-scoring tree draft of one tree (at most ``max_nodes`` nodes, each path
    within its pattern's budget); the same sets and tie rules as ``best_draft``.
    ``only_len`` > 0: only the set of that pattern length (a chain draft's own set)."""
    best = EMPTY_TREE
    if max_nodes < 1:
        return best
    for p_lo, p_hi, limit, ends, alone, count in _sets(index, context_tail, config):
        if only_len and not p_lo <= only_len <= p_hi:
            continue
        if min(limit, max_nodes) <= best.score:  # a level's probabilities sum to <= 1
            continue
        nodes = _grow_tree(index, ends, limit, max_nodes, config.min_token_prob, config.max_occurrences,
                           exact_first=alone)
        score = float(sum(n[2] for n in nodes))
        if nodes and score > best.score:
            candidate = DraftTree(tokens=tuple(n[0] for n in nodes), parents=tuple(n[1] for n in nodes),
                                  probs=tuple(n[2] for n in nodes), child_counts=tuple(n[3] for n in nodes),
                                  score=score, match_count=count, tree=tree)
            best = dataclasses.replace(candidate, match_len=_match_len(config, p_lo, p_hi, candidate.depth()))
    return best
