"""The one drafter contract: config, the Draft record, the Protocol and its registry.

A cache drafter follows SuffixDecoding (arXiv 2411.04975): two depth-limited suffix
tries with counts, one per request (its prompt + its output so far) and one global (the
responses of earlier and running requests). To draft for a request whose context is c:

  for every pattern length p (1 <= p < min(len(c), max_depth)) and both trees:
    node   = the trie node of c[-p:]  (count(node) = occurrences of that string)
    budget = min(max_spec_tokens, floor(max_spec_factor * p + max_spec_offset), max_depth - p)
    walk greedily to the most frequent child (ties: the most recently seen one),
    prob *= count(child) / count(node), while prob >= min_token_prob and within budget
    score  = sum of prob over the drafted tokens
  keep the best score; ties go to the longer pattern, then to the request's own tree.

Drafters differ in how fast they do this, never in what they return: every
implementation must return the same Draft for the same history (tests/test_drafter.py
runs the same conformance suite over every registered drafter).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from .batch import DraftBatch, RowTreeBatch

LOCAL_TREE = "local"  # the request's own prompt + output
GLOBAL_TREE = "global"  # responses of earlier and running requests


@dataclasses.dataclass(frozen=True, slots=True)
class DrafterConfig:
    """Cache drafter settings (defaults: the HVD paper's depth, draft cap and probability
    floor; max_spec_factor 1 and max_spec_offset 4 chosen behind the gate by
    launch/bench/sweep_drafter.py on the dev traces, where SuffixDecoding and
    ArcticInference verify every draft with factor 1, offset 0)."""

    max_depth: int = dataclasses.field(default=64, metadata={
        "help": "depth limit of the suffix trees: pattern length + draft length <= max_depth"})
    max_spec_tokens: int = dataclasses.field(default=64, metadata={
        "help": "longest cache draft, in tokens"})
    max_spec_factor: float = dataclasses.field(default=1.0, metadata={
        "help": "a p-token match may draft at most max_spec_factor * p + max_spec_offset tokens (SuffixDecoding: "
                "factor 1, offset 0; behind a gate, which can refuse the long drafts it makes, offset 4 verifies "
                "fewer cycles: README, launch/bench/sweep_drafter.py)"})
    max_spec_offset: float = dataclasses.field(default=4.0, metadata={
        "help": "see max_spec_factor"})
    min_token_prob: float = dataclasses.field(default=0.1, metadata={
        "help": "stop drafting when the path probability of the next token drops below this"})
    global_max_tokens: int = dataclasses.field(default=2_000_000, metadata={
        "help": "token budget of the global tree of responses; the oldest finished ones are evicted first"})
    max_occurrences: int = dataclasses.field(default=1024, metadata={
        "help": "a pattern's draft is walked from at most this many of its occurrences, the most recently "
                "appended (bounds drafting CPU on repetitive text; the one-token pattern's first token still "
                "counts all)"})
    max_scan: int = dataclasses.field(default=4096, metadata={
        "help": "patterns of two tokens and more are looked for among this many occurrences of the context's "
                "last two tokens, the most recently appended (bounds the match scan on frequent pairs; "
                "at least max_occurrences)"})

    def __post_init__(self):
        if self.max_depth < 2:
            raise ValueError(f"max_depth must be >= 2, got {self.max_depth}")
        if self.max_spec_tokens < 1:
            raise ValueError(f"max_spec_tokens must be >= 1, got {self.max_spec_tokens}")
        if self.max_spec_factor < 0 or self.max_spec_offset < -self.max_depth:
            raise ValueError("max_spec_factor must be >= 0 and max_spec_offset > -max_depth")
        if not 0.0 <= self.min_token_prob <= 1.0:
            raise ValueError(f"min_token_prob must be in [0, 1], got {self.min_token_prob}")
        if self.global_max_tokens < 0:
            raise ValueError(f"global_max_tokens must be >= 0, got {self.global_max_tokens}")
        if self.max_occurrences < 1:
            raise ValueError(f"max_occurrences must be >= 1, got {self.max_occurrences}")
        if self.max_scan < 1:
            raise ValueError(f"max_scan must be >= 1, got {self.max_scan}")

    @property
    def scan_limit(self) -> int:
        """The occurrences of the context's last two tokens searched: max_scan, at least max_occurrences."""
        return max(self.max_scan, self.max_occurrences)

    def budget(self, match_len: int) -> int:
        """Most tokens a pattern of ``match_len`` tokens may draft."""
        by_factor = int(match_len * self.max_spec_factor + self.max_spec_offset + 1e-6)
        return max(0, min(self.max_spec_tokens, by_factor, self.max_depth - match_len))


# DrafterConfig fields that bound resources (memory, CPU per step) rather than say what a
# draft is: a server may set them apart from its gate's. The others shape every draft the
# gate's features describe, so a server refuses values other than the gate's.
RESOURCE_BOUNDS = ("global_max_tokens", "max_occurrences", "max_scan")

# The most threads a drafter drafts a batch on (native_drafter.NativeDrafter, --hvd-draft-threads).
MAX_DRAFT_THREADS = 64


@dataclasses.dataclass(frozen=True, slots=True)
class Draft:
    """A chain draft and what a gate can learn from how it was found.

    Worked example (max_depth 64, factor 1, offset 0, min_token_prob 0.1): the request's
    own tree holds ``7 8 9 7 8 5 7 8`` and the context ends in ``7 8``.
    Pattern ``7 8`` (match_len 2) occurs 3 times (match_count 3; the last occurrence is
    the context itself, which has no continuation yet). Its children 9 and 5 were each
    seen once: the tie goes to 5, seen more recently, with prob 1/3. ``7 8 5`` occurs once
    and continues with 7: prob stays 1/3. The budget of a 2-token pattern is 2 tokens, so
    the draft is ``5 7`` with probs (1/3, 1/3), child_counts (1, 1), score 2/3. (Pattern
    ``8`` alone also drafts ``5``, score 1/3: the longer pattern wins.)
    """

    tokens: tuple[int, ...] = ()
    probs: tuple[float, ...] = ()  # path probability of each token (non-increasing)
    child_counts: tuple[int, ...] = ()  # trie count of each drafted token's node
    score: float = 0.0  # sum(probs)
    match_len: int = 0  # tokens of context matched (0 for an empty draft)
    match_count: int = 0  # occurrences of the matched pattern in its tree
    tree: str = ""  # LOCAL_TREE or GLOBAL_TREE ("" when empty)

    def __len__(self) -> int:
        return len(self.tokens)


EMPTY_DRAFT = Draft()


@dataclasses.dataclass(frozen=True, slots=True)
class DraftTree:
    """A tree draft (SuffixDecoding's tree speculation): several continuations of the
    matched pattern, at most ``max_nodes`` nodes, chosen best-first by path probability.

    Nodes are listed in the order they were chosen, so a parent always precedes its
    children; ``parents[i]`` is the index of node i's parent, -1 under the root (the
    matched pattern). ``probs[i]`` is node i's path probability (the product of
    count(child) / count(node) from the root), ``child_counts[i]`` its trie count, and
    ``score`` the sum of ``probs`` (the expected tokens verify accepts if the counts are
    the target's probabilities; nodes of one depth are disjoint events, so a tree of
    depth d scores at most d). A chain is the tree whose nodes each have one child.
    Pattern lengths that share an occurrence set share one tree, grown with the largest
    of their budgets (ties: the longer); ``match_len`` is the longest of them whose budget
    admits the tree's depth.

    Worked example (max_depth 64, factor 1, min_token_prob 0.1): the request's own tree
    holds ``7 8 9 7 8 5 7 8``, the context ends in ``7 8`` (3 occurrences, the last the
    context itself) and max_nodes is 4. Children of the root: 5 (1 of 3, newest) and 9 (1 of 3): node 0
    is 5 (prob 1/3), node 1 is 9 (1/3, a tie: the more recent goes first); with a budget
    of 2 tokens per path, node 2 is 7 under 5 (1/3) and node 3 is 7 under 9 (1/3):
    tokens (5, 9, 7, 7), parents (-1, -1, 0, 1), score 4/3.
    """

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    probs: tuple[float, ...] = ()
    child_counts: tuple[int, ...] = ()
    score: float = 0.0
    match_len: int = 0
    match_count: int = 0
    tree: str = ""

    def __len__(self) -> int:
        return len(self.tokens)

    def depth(self) -> int:
        """Tokens on the longest root-to-leaf path."""
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return max(depths, default=0)


EMPTY_TREE = DraftTree()


def as_token_array(ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Validated token ids for a drafter: a contiguous 1-D int32 array, no negatives."""
    arr = np.ascontiguousarray(ids, dtype=np.int32)
    if arr.ndim != 1:
        raise ValueError(f"token ids must be one-dimensional, got shape {arr.shape}")
    if arr.size and arr.min() < 0:
        raise ValueError("token ids must be non-negative")
    return arr

@runtime_checkable
class Drafter(Protocol):
    """Lifecycle of a cache drafter, as the serving loop and replay drive it.

    start_request(req_id, prompt)   index the prompt; open the request's running response
    append(req_id, tokens)          tokens the request emitted (accepted + bonus)
    speculate(req_id) -> Draft      a draft for the next tokens of the request
    speculate_arrays(req_ids)       the drafts of a decode batch (batch.DraftBatch)
    speculate_tree(req_id, B[, like])
                                    a tree draft of at most B nodes (DraftTree); like=chain:
                                    only from the occurrence set that chain came from
    speculate_rows(req_ids, B)      the batch's row trees of at most B nodes (batch.RowTreeBatch;
                                    row_tree.py: the chain, then the tree draft's siblings)
    speculate_step(req_ids, B[, S]) speculate_arrays and speculate_rows of the same batch, in one
                                    call (a row without a draft: an empty row tree); with S, each
                                    row's tree cut at min(len(chain) + S, B) nodes (the nodes a
                                    decision with S cache siblings describes: decision.described)
    append_batch(req_ids, tokens)   append for a whole batch in one call
    finish_request(req_id)          drop the request's own tree; its response stays cached
    reset()                         forget everything (SGLang's flush_cache)
    """

    name: ClassVar[str]
    config: DrafterConfig

    def start_request(self, req_id: str, prompt_ids: Sequence[int] | np.ndarray) -> None: ...

    def append(self, req_id: str, token_ids: Sequence[int] | np.ndarray) -> None: ...

    def speculate(self, req_id: str) -> Draft: ...

    def speculate_batch(self, req_ids: Sequence[str]) -> list[Draft]: ...

    def speculate_arrays(self, req_ids: Sequence[str]) -> DraftBatch: ...

    def speculate_tree(self, req_id: str, max_nodes: int, like: Draft | None = None) -> DraftTree: ...

    def speculate_rows(self, req_ids: Sequence[str], max_nodes: int) -> RowTreeBatch: ...

    def speculate_step(self, req_ids: Sequence[str], max_nodes: int,
                       siblings: int | None = None) -> tuple[DraftBatch, RowTreeBatch]: ...

    def append_batch(self, req_ids: Sequence[str], token_ids: Sequence) -> None: ...

    def finish_request(self, req_id: str) -> None: ...

    def reset(self) -> None: ...

    def context(self, req_id: str) -> np.ndarray: ...

    def memory_stats(self) -> dict[str, float]: ...
