"""Run serving-mode replay for a set of policies and tally the results per source."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence

from ..drafter.protocol import Drafter
from ..trace import TraceRecord
from ..verify import VerifyModel
from .engine import DenseStep, ServingStep, iter_dense, iter_serving
from .metrics import SourceTally, overall
from .policies import Policy


@dataclasses.dataclass(slots=True)
class ReplayResult:
    sources: dict[str, SourceTally]
    seconds: float
    num_drafts: int

    @property
    def overall(self) -> SourceTally:
        return overall(self.sources.values())

    def to_json(self) -> dict:
        return {
            "overall": self.overall.to_json(),
            "sources": {name: s.to_json() for name, s in self.sources.items()},
        }


def _count_request(sources: dict[str, SourceTally], record: TraceRecord) -> None:
    s = sources.setdefault(record.source, SourceTally())
    s.requests += 1
    s.tokens += len(record.output_ids)


def _counting(records: Iterable[TraceRecord], sources: dict[str, SourceTally], on_request: Callable | None):
    for record in records:
        _count_request(sources, record)
        if on_request:
            on_request(record)
        yield record


def simulate(
    records: Iterable[TraceRecord],
    drafter: Drafter,
    policies: Sequence[Policy],
    model: VerifyModel,
    on_step: Callable[[ServingStep], None] | None = None,
    on_request: Callable[[TraceRecord], None] | None = None,
    prefill_first: bool = False,
) -> ReplayResult:
    """Serving-mode replay of every policy; tallies per source (``prefill_first``: see
    engine.iter_serving)."""
    sources: dict[str, SourceTally] = {}
    start = time.perf_counter()
    num_drafts = 0
    request, drafted = None, set()  # positions of the current request with a non-empty draft
    for step in iter_serving(_counting(records, sources, on_request), drafter, policies, model, prefill_first):
        sources[step.source].policy(step.policy).add_step(step.plan, step.out_len, step.accept_len)
        if step.req_id != request:
            request, drafted = step.req_id, set()
        if step.draft.tokens and step.pos not in drafted:
            drafted.add(step.pos)
            num_drafts += 1
        if on_step:
            on_step(step)
    return ReplayResult(sources=sources, seconds=time.perf_counter() - start, num_drafts=num_drafts)


@dataclasses.dataclass(slots=True)
class DraftQuality:
    """Dense-mode draft quality of one source: a draft at every output position."""

    positions: int = 0
    drafts: int = 0  # non-empty drafts
    draft_tokens: int = 0
    accepted: int = 0
    accept_ge1: int = 0
    accept_ge6: int = 0
    local: int = 0

    def add(self, step: DenseStep) -> None:
        self.positions += 1
        if step.draft.tokens:
            self.drafts += 1
            self.draft_tokens += len(step.draft.tokens)
            self.accepted += step.accept_len
            self.accept_ge1 += step.accept_len >= 1
            self.accept_ge6 += step.accept_len >= 6
            self.local += step.draft.tree == "local"

    def to_json(self) -> dict[str, float]:
        d = max(self.drafts, 1)
        return {
            "positions": self.positions,
            "draft_rate": self.drafts / max(self.positions, 1),
            "mean_draft_len": self.draft_tokens / d,
            "mean_accept_len": self.accepted / d,
            "accept_ge1_share": self.accept_ge1 / d,
            "accept_ge6_share": self.accept_ge6 / d,
            "local_tree_share": self.local / d,
        }


def dense_quality(records: Iterable[TraceRecord], drafter: Drafter,
                  on_step: Callable[[DenseStep], None] | None = None) -> tuple[dict[str, DraftQuality], float]:
    out: dict[str, DraftQuality] = {}
    start = time.perf_counter()
    for step in iter_dense(records, drafter):
        out.setdefault(step.record.source, DraftQuality()).add(step)
        if on_step:
            on_step(step)
    return out, time.perf_counter() - start
