"""Workload statistics of token traces: sizes and a repetition profile per source.

Repetition: the share of output tokens that continue a match of length >= k (default 4)
in what came before: the token, together with the k tokens before it, already occurred
in this request's prompt or earlier output, or in an earlier request's output. It is the
ceiling of what any cache drafter with a k-token match can draft.

Worked example (k = 2, one request): prompt [5, 6, 7], output [5, 6, 7, 9].
  output[0]=5 follows (6, 7): (6, 7, 5) never seen      -> no
  output[1]=6 follows (7, 5): never seen                -> no
  output[2]=7 follows (5, 6): (5, 6, 7) is in the prompt -> yes
  output[3]=9 follows (6, 7): (6, 7, 9) never seen      -> no     => repetition 1/4
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from .trace import TraceRecord

_MULT = np.uint64(0x9E3779B97F4A7C15)


def ngram_hashes(ids: np.ndarray, n: int) -> np.ndarray:
    """A 64-bit hash of every n-gram of ``ids`` ([len(ids) - n + 1] uint64)."""
    ids = ids.astype(np.uint64)
    count = len(ids) - n + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64)
    h = np.zeros(count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = (h ^ ids[j : j + count]) * _MULT
            h ^= h >> np.uint64(29)
    return h


@dataclasses.dataclass(slots=True)
class SourceStats:
    requests: int = 0
    conversations: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    repeated_output_tokens: int = 0
    max_prompt_tokens: int = 0

    @property
    def repetition(self) -> float:
        return self.repeated_output_tokens / self.output_tokens if self.output_tokens else 0.0

    def to_json(self) -> dict:
        return {
            "requests": self.requests,
            "conversations": self.conversations,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "mean_prompt_tokens": self.prompt_tokens / self.requests if self.requests else 0.0,
            "max_prompt_tokens": self.max_prompt_tokens,
            "mean_output_tokens": self.output_tokens / self.requests if self.requests else 0.0,
            "repetition": self.repetition,
        }


class RepetitionProfiler:
    """Accumulates per-source statistics over a stream of records (in trace order).

    Earlier outputs count across sources: a global cache sees every earlier response.
    """

    def __init__(self, match_len: int = 4):
        if match_len < 1:
            raise ValueError(f"match_len must be >= 1, got {match_len}")
        self.match_len = match_len
        self.sources: dict[str, SourceStats] = {}
        self._conversations: dict[str, set[str]] = {}
        self._earlier_outputs: set[int] = set()

    def add(self, record: TraceRecord) -> None:
        n = self.match_len + 1
        seq = np.concatenate([record.prompt_ids, record.output_ids])
        hashes = ngram_hashes(seq, n)
        # hashes[i] covers seq[i : i + n]; output token j sits at seq index P + j, so its
        # n-gram starts at P + j - match_len.
        num_prompt = len(record.prompt_ids)
        first = num_prompt - self.match_len
        _, first_index = np.unique(hashes, return_index=True)
        seen_first = np.zeros(len(hashes), dtype=bool)
        seen_first[first_index] = True
        out_hashes = hashes[max(first, 0) :]
        # Seen before in this request: the hash is not at its own first occurrence.
        repeated = ~seen_first[max(first, 0) :]
        earlier = self._earlier_outputs
        repeated |= np.fromiter((int(h) in earlier for h in out_hashes), dtype=bool, count=len(out_hashes))
        stats = self.sources.setdefault(record.source, SourceStats())
        stats.requests += 1
        stats.prompt_tokens += num_prompt
        stats.output_tokens += len(record.output_ids)
        stats.max_prompt_tokens = max(stats.max_prompt_tokens, num_prompt)
        stats.repeated_output_tokens += int(repeated.sum())
        convs = self._conversations.setdefault(record.source, set())
        convs.add(record.conv_id)
        stats.conversations = len(convs)
        self._earlier_outputs.update(ngram_hashes(record.output_ids, n).tolist())

    def add_all(self, records: Iterable[TraceRecord]) -> None:
        for record in records:
            self.add(record)

    def overall(self) -> SourceStats:
        total = SourceStats()
        for s in self.sources.values():
            total.requests += s.requests
            total.conversations += s.conversations
            total.prompt_tokens += s.prompt_tokens
            total.output_tokens += s.output_tokens
            total.repeated_output_tokens += s.repeated_output_tokens
            total.max_prompt_tokens = max(total.max_prompt_tokens, s.max_prompt_tokens)
        return total
