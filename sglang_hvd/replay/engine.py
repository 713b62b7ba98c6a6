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
in serving mode all policies walk one request together, sharing a single drafter's
drafts at every position (one dense pass), and gate policies decide in batches. Requests
run in trace order and the global tree persists across them. After each request the
drafter's context must equal prompt + output: replay reconstructs the trace exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from ..drafter.protocol import EMPTY_DRAFT, Draft, Drafter
from ..drafter.row_tree import EMPTY_ROW, accept_len, accepted_within, chain_path, row_path, speculate_row
from ..request_state import new_request_state
from ..trace import TraceRecord
from ..verify import Eagle3Stream, RowPlan, VerifyModel
from .policies import GREEDY_ROW, Policy, StepView


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


def _every_position(drafter: Drafter, record: TraceRecord, out: list[int]) -> Iterator[tuple[int, Draft, int]]:
    """``(pos, draft, LCP with the recorded output)`` at every output position, the
    drafter fed one token at a time (it then holds all of the output but the last token)."""
    for pos in range(len(out)):
        if pos:
            drafter.append(record.req_id, out[pos - 1 : pos])
        draft = drafter.speculate(record.req_id)
        yield pos, draft, accept_len(draft.tokens, out, pos)


def iter_dense(records: Iterable[TraceRecord], drafter: Drafter) -> Iterator[DenseStep]:
    """One labelled draft per output position of every request, in trace order."""
    for record in records:
        out = record.output_ids.tolist()
        drafter.start_request(record.req_id, record.prompt_ids)
        for pos, draft, label in _every_position(drafter, record, out):
            yield DenseStep(record, pos, draft, label)
        _finish(drafter, record, max(len(out) - 1, 0))


def _plan_all(policies: Sequence[Policy], views: list[StepView]) -> list[RowPlan]:
    """Each policy's plan for its view; policies sharing a ``batch_key`` decide in one
    call of their class's ``plan_batch`` (the gate: one batched decision.decide)."""
    plans: list[RowPlan | None] = [None] * len(views)
    groups: dict[object, list[int]] = {}
    for k, (policy, view) in enumerate(zip(policies, views)):
        key = policy.batch_key
        if key is None:
            plans[k] = policy.plan(view)
        else:
            groups.setdefault(key, []).append(k)
    for members in groups.values():
        first = policies[members[0]]
        batch = type(first).plan_batch([policies[k] for k in members], [views[k] for k in members])
        for k, plan in zip(members, batch):
            plans[k] = plan
    return plans


def iter_serving(
    records: Iterable[TraceRecord],
    drafter: Drafter,
    policies: Sequence[Policy],
    model: VerifyModel,
    prefill_first: bool = False,
) -> Iterator[ServingStep]:
    """Every verify step of every policy, request by request.

    ``prefill_first``: the first output token comes from the prefill forward, one token
    in one cycle with no draft (what a server does: it speculates from the second token
    on); else the first step may verify a draft too.

    Within a request the policies walk in waves: each active policy takes its next step
    in every wave, so policies that batch (the gate) decide together, one gate call per
    wave. Drafts come from a dense pass over the request (a draft depends only on the
    position), so the policies may stand at any positions.
    """
    shape = model.shape
    drafting = any(p.needs_draft for p in policies)
    # Row trees (the chain and siblings from the tree draft) where a policy verifies them;
    # at topk 1 a row is a chain.
    trees = shape.allows_branches and any(p.needs_rows for p in policies)
    for record in records:
        out_list = record.output_ids.tolist()
        n = len(out_list)
        drafter.start_request(record.req_id, record.prompt_ids)
        drafts, labels, rows, paths = [], [], [], []
        for pos, draft, label in (_every_position(drafter, record, out_list) if drafting else ()):
            drafts.append(draft)
            labels.append(label)
            row = speculate_row(drafter, record.req_id, shape.draft_nodes) if trees else EMPTY_ROW
            rows.append(row)
            # the nodes the output passes through: a chain's are its first LCP nodes
            paths.append(row_path(row.tokens, row.parents, out_list, pos) if trees
                         else chain_path(min(label, shape.draft_nodes)))
        streams = [Eagle3Stream() for _ in policies]
        # Only policies that read the request's state (the gate) pay for keeping it.
        states = [new_request_state(record.prompt_ids) if p.needs_state else None for p in policies]
        position = [0] * len(policies)
        if prefill_first and n:
            for i, policy in enumerate(policies):
                if states[i] is not None:
                    states[i].observe(out_list[:1])
                yield ServingStep(record.req_id, record.source, policy.name, 0, GREEDY_ROW, EMPTY_DRAFT, 0, 1)
            position = [1] * len(policies)
        active = [i for i in range(len(policies)) if position[i] < n]
        while active:
            views = []
            for i in active:
                pos, needs = position[i], policies[i].needs_draft
                views.append(StepView(req_id=record.req_id, source=record.source, pos=pos, shape=shape,
                                      draft=drafts[pos] if needs else EMPTY_DRAFT, state=states[i],
                                      oracle_accept_len=model.cache_accept_len(labels[pos]) if needs else 0,
                                      row=rows[pos] if needs else EMPTY_ROW, oracle_path=paths[pos] if needs else ()))
            plans = _plan_all([policies[i] for i in active], views)
            still = []
            for i, view, plan in zip(active, views, plans):
                policy, pos = policies[i], view.pos
                if not isinstance(plan, RowPlan) or plan.cache_len + plan.eagle_nodes > shape.draft_nodes:
                    raise ValueError(f"policy {policy.name!r} returned {plan!r}; expected a RowPlan within "
                                     f"{shape.draft_nodes} nodes")
                accepted = accepted_within(view.oracle_path, plan.cache_len)
                out_len = min(model.out_len(plan, accepted, streams[i]), n - pos)
                if states[i] is not None:
                    states[i].observe(out_list[pos : pos + out_len])
                yield ServingStep(record.req_id, record.source, policy.name, pos, plan, view.draft,
                                  view.oracle_accept_len, out_len)
                position[i] = pos + out_len
                if position[i] < n:
                    still.append(i)
            active = still
        _finish(drafter, record, max(n - 1, 0) if drafting else 0)
