"""What a verify step yields in replay: the serving verify setup, modelled.

Cache steps are exact: a cache draft's accepted length is its longest common prefix with
the recorded output, except that a verify can only check ``max_cache_tokens`` of it
(SGLang with ``--speculative-eagle-topk 1`` verifies N-1 draft tokens per row; 0 means
no limit). Replay has no EAGLE3 draft model, so an EAGLE3 step emits a number of tokens
drawn from an acceptance model (always >= 1: the bonus token), capped by what is left of
the output:

- ``mean``: a fixed mean m (default 1.75, the HVD paper's EAGLE3 figure on these
  workloads), realised deterministically by carrying the fraction: with m = 1.75 the
  steps emit 1, 2, 2, 2, 1, 2, 2, 2, ... (floor((k+1)m) - floor(km)).
- ``dist``: an empirical distribution over tokens per cycle, sampled with a generator
  seeded by (seed, request id), so every policy sees the same draws for a request.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Iterator

import numpy as np


@dataclasses.dataclass(frozen=True, slots=True)
class VerifyModel:
    mean_tokens_per_cycle: float = dataclasses.field(default=1.75, metadata={
        "help": "mean tokens one EAGLE3 verify emits (accepted + bonus), realised deterministically"})
    distribution: tuple[tuple[int, float], ...] = dataclasses.field(default=(), metadata={
        "help": "empirical tokens-per-cycle distribution TOKENS:PROB,... (e.g. 1:0.45,2:0.3,3:0.25); overrides the mean"})
    seed: int = dataclasses.field(default=0, metadata={"help": "seed of the distribution draws"})
    max_cache_tokens: int = dataclasses.field(default=0, metadata={
        "help": "cache draft tokens one verify can check (SGLang topk 1: num_draft_tokens - 1); 0 = no limit"})

    def __post_init__(self):
        if self.distribution:
            values = [v for v, _ in self.distribution]
            probs = [p for _, p in self.distribution]
            if any(v < 1 for v in values) or any(p < 0 for p in probs) or not math.isclose(sum(probs), 1.0, abs_tol=1e-6):
                raise ValueError("distribution needs tokens_per_cycle >= 1 and probabilities summing to 1")
        elif self.mean_tokens_per_cycle < 1.0:
            raise ValueError(f"mean tokens per cycle must be >= 1 (the bonus token), got {self.mean_tokens_per_cycle}")
        if self.max_cache_tokens < 0:
            raise ValueError(f"max_cache_tokens must be >= 0 (0: no limit), got {self.max_cache_tokens}")

    def cache_accept_len(self, accept_len: int) -> int:
        """What a verify accepts of a cache draft whose full accepted length is accept_len."""
        return min(accept_len, self.max_cache_tokens) if self.max_cache_tokens else accept_len

    @property
    def expected_tokens_per_cycle(self) -> float:
        if self.distribution:
            return float(sum(v * p for v, p in self.distribution))
        return self.mean_tokens_per_cycle

    def stream(self, req_id: str) -> Iterator[int]:
        """Tokens per cycle of successive EAGLE3 steps of one request."""
        if self.distribution:
            values = np.array([v for v, _ in self.distribution])
            probs = np.array([p for _, p in self.distribution])
            rng = np.random.default_rng([self.seed, zlib.crc32(req_id.encode())])
            while True:
                yield from values[rng.choice(len(values), size=256, p=probs / probs.sum())].tolist()
        m = self.mean_tokens_per_cycle
        k = 0
        while True:
            yield math.floor((k + 1) * m + 1e-9) - math.floor(k * m + 1e-9)
            k += 1

    @staticmethod
    def parse_distribution(text: str) -> tuple[tuple[int, float], ...]:
        """``"1:0.45,2:0.3,3:0.25"`` -> ((1, 0.45), (2, 0.3), (3, 0.25))."""
        pairs = []
        for item in text.split(","):
            value, _, prob = item.partition(":")
            try:
                pairs.append((int(value), float(prob)))
            except ValueError:
                raise ValueError(f"bad distribution item {item!r}; expected TOKENS:PROB, e.g. 1:0.45,2:0.3,3:0.25") from None
        return tuple(pairs)
