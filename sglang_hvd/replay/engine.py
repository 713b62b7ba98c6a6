"""The replay engine: the serving drafter driven over recorded traces, step by step.

Two modes, both running the registered drafter exactly as the server does (start the
request with its prompt, speculate, append what the step emitted, finish):

dense    draft at every output position p (context = prompt + output[:p]) and label the
         draft with its oracle accept_len = LCP(draft, output[p:]). The paper's training
         data: one record per position, whatever a policy would have visited.
serving  walk each policy as the decode loop would: at position p the policy chooses a
         row plan (cache tokens, EAGLE3 nodes) at the verify shape; the verify emits what
         the VerifyModel says of that plan (exact for the cache branch, the EAGLE3 curve
         for EAGLE3's); the next step starts there.

A draft depends only on the tokens appended so far (not on how they were chunked), so
in serving mode all policies walk one request together, in order of position, sharing a
single drafter and drafting only where some policy that needs a draft stands. Requests
run in trace order and the global tree persists across them. After each request the
drafter's context must equal prompt + output: replay reconstructs the trace exactly.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from ..drafter.protocol import EMPTY_DRAFT, Draft, Drafter
from ..policy import RequestState, RowPlan
from ..trace import TraceRecord
from ..verify import Eagle3Stream
from .acceptance import VerifyModel
from .policies import Policy, StepView


def accept_len(draft_tokens: Sequence[int], continuation: Sequence[int], start: int = 0) -> int:
    """Longest common prefix of a draft and the true continuation[start:] (greedy verify)."""
    n = min(len(draft_tokens), len(continuation) - start)
    k = 0
    while k < n and draft_tokens[k] == continuation[start + k]:
        k += 1
    return k


@dataclasses.dataclass(frozen=True, slots=True)
class DenseStep:
    record: TraceRecord
    pos: int
    draft: Draft
    accept_len: int


@dataclasses.dataclass(frozen=True, slots=True)
class ServingStep:
    req_id: str
    source: str
    policy: str
    pos: int
    plan: RowPlan  # the row this verify checked (plan.kind: cache, eagle3 or greedy)
    draft: Draft
    accept_len: int  # of the cache draft at pos, capped at the row (N-1), whatever the plan
    out_len: int  # tokens this verify emitted

    @property
    def choice(self) -> str:
        return self.plan.kind


class ReconstructionError(AssertionError):
    """The drafter's view of a request differs from the trace: a drafter bookkeeping bug."""


def _finish(drafter: Drafter, record: TraceRecord, fed: int) -> None:
    if fed < len(record.output_ids):
        drafter.append(record.req_id, record.output_ids[fed:])
    held = drafter.context(record.req_id)
    expected = np.concatenate([record.prompt_ids, record.output_ids])
    if not np.array_equal(held, expected):
        raise ReconstructionError(f"{record.req_id}: the drafter holds {len(held)} tokens that differ from the trace")
    drafter.finish_request(record.req_id)


def iter_dense(records: Iterable[TraceRecord], drafter: Drafter) -> Iterator[DenseStep]:
    """One labelled draft per output position of every request, in trace order."""
    for record in records:
        out = record.output_ids.tolist()
        drafter.start_request(record.req_id, record.prompt_ids)
        for pos in range(len(out)):
            if pos:
                drafter.append(record.req_id, out[pos - 1 : pos])
            draft = drafter.speculate(record.req_id)
            yield DenseStep(record, pos, draft, accept_len(draft.tokens, out, pos))
        _finish(drafter, record, max(len(out) - 1, 0))


def iter_serving(
    records: Iterable[TraceRecord],
    drafter: Drafter,
    policies: Sequence[Policy],
    model: VerifyModel,
) -> Iterator[ServingStep]:
    """Every verify step of every policy, request by request, positions ascending."""
    shape = model.shape
    for record in records:
        out = record.output_ids
        out_list = out.tolist()
        n = len(out)
        drafter.start_request(record.req_id, record.prompt_ids)
        streams = [Eagle3Stream() for _ in policies]
        # Only policies that read the request's state (the gate) pay for keeping it.
        states = [RequestState(record.prompt_ids) if getattr(p, "needs_state", False) else None for p in policies]
        heap = [(0, i) for i in range(len(policies))]
        fed = 0
        draft_pos, draft, full_label = -1, EMPTY_DRAFT, 0
        while heap:
            pos, i = heapq.heappop(heap)
            policy = policies[i]
            if policy.needs_draft and draft_pos != pos:
                drafter.append(record.req_id, out_list[fed:pos])
                fed = pos
                draft = drafter.speculate(record.req_id)
                draft_pos, full_label = pos, accept_len(draft.tokens, out_list, pos)
            state = states[i]
            label = model.cache_accept_len(full_label) if policy.needs_draft else 0
            view = StepView(req_id=record.req_id, source=record.source, pos=pos, shape=shape,
                            draft=draft if policy.needs_draft else EMPTY_DRAFT, state=state, oracle_accept_len=label)
            plan = policy.decide(view)
            if not isinstance(plan, RowPlan) or plan.cache_len + plan.eagle_nodes > shape.draft_nodes:
                raise ValueError(f"policy {policy.name!r} returned {plan!r}; expected a RowPlan within {shape.draft_nodes} nodes")
            out_len = min(model.out_len(plan, full_label if policy.needs_draft else 0, streams[i]), n - pos)
            if state is not None:
                state.observe(out_list[pos : pos + out_len])
            yield ServingStep(record.req_id, record.source, policy.name, pos, plan, view.draft, label, out_len)
            if pos + out_len < n:
                heapq.heappush(heap, (pos + out_len, i))
        _finish(drafter, record, fed)
