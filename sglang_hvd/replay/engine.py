"""The replay engine: the serving drafter driven over recorded traces, step by step.

Two modes, both running the registered drafter exactly as the server does (start the
request with its prompt, speculate, append what the step emitted, finish):

dense    draft at every output position p (context = prompt + output[:p]) and label the
         draft with its oracle accept_len = LCP(draft, output[p:]). The paper's training
         data: one record per position, whatever a policy would have visited.
serving  walk each policy as the decode loop would: at position p the policy chooses a
         draft source; a cache verify emits accept_len + 1 tokens (accept_len capped by the
         verify width, VerifyModel.max_cache_tokens), an EAGLE3 verify what the acceptance
         model yields, greedy one; the next step starts there.

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
from ..features import TAIL_TOKENS, RequestHistory
from ..trace import TraceRecord
from .acceptance import VerifyModel
from .policies import CACHE, EAGLE3, GREEDY, Policy, StepView


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
    choice: str  # CACHE, EAGLE3 or GREEDY
    draft: Draft
    accept_len: int  # of the cache draft at pos (whatever the choice)
    out_len: int  # tokens this verify emitted


_NO_HISTORY = RequestHistory()  # shown to policies that do not keep one (never updated)


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
    acceptance: VerifyModel,
) -> Iterator[ServingStep]:
    """Every verify step of every policy, request by request, positions ascending."""
    for record in records:
        out = record.output_ids
        out_list = out.tolist()
        n = len(out)
        drafter.start_request(record.req_id, record.prompt_ids)
        streams = [acceptance.stream(record.req_id) for _ in policies]
        # Only policies that read the history (the gate) pay for keeping it.
        histories = [RequestHistory() if getattr(p, "needs_history", False) else None for p in policies]
        context = np.concatenate([record.prompt_ids[-TAIL_TOKENS:], out])
        shift = min(len(record.prompt_ids), TAIL_TOKENS)
        heap = [(0, i) for i in range(len(policies))]
        fed = 0
        draft_pos, draft, label = -1, EMPTY_DRAFT, 0
        while heap:
            pos, i = heapq.heappop(heap)
            policy = policies[i]
            if policy.needs_draft and draft_pos != pos:
                drafter.append(record.req_id, out_list[fed:pos])
                fed = pos
                draft = drafter.speculate(record.req_id)
                draft_pos, label = pos, acceptance.cache_accept_len(accept_len(draft.tokens, out_list, pos))
            history = histories[i]
            view = StepView(
                req_id=record.req_id, source=record.source, pos=pos, num_prompt_tokens=len(record.prompt_ids),
                draft=draft if policy.needs_draft else EMPTY_DRAFT,
                tail=context[max(0, pos + shift - TAIL_TOKENS) : pos + shift],
                history=history if history is not None else _NO_HISTORY,
                oracle_accept_len=label if policy.needs_draft else 0,
            )
            choice = policy.decide(view)
            if choice == CACHE:
                out_len = label + 1
            elif choice == EAGLE3:
                out_len = next(streams[i])
            elif choice == GREEDY:
                out_len = 1
            else:
                raise ValueError(f"policy {policy.name!r} returned {choice!r}; expected cache, eagle3 or greedy")
            out_len = min(out_len, n - pos)
            if history is not None:
                history.record(pos, view.draft)
                history.observe(out_list[pos : pos + out_len])
            yield ServingStep(record.req_id, record.source, policy.name, pos, choice, view.draft, view.oracle_accept_len, out_len)
            if pos + out_len < n:
                heapq.heappush(heap, (pos + out_len, i))
        _finish(drafter, record, fed)
