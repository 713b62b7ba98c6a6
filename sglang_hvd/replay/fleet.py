"""Fleet replay: recorded conversations served the way the engine serves them, through
the serving stepper itself (serving/stepper.py: drafter sync, batched ``decision.decide``,
verified counts, finish into the global cache).

Up to ``concurrency`` conversations are in flight; each sends its turns in order, a
turn starting once the one before it finished (an agent waits for its reply). Each new
request's first token comes from its prefill (one cycle, no draft); then every running
request verifies one row per step, all in one batch, planned by one ``stepper.decide``
call (``HVDStepper.plan``). A verify emits what replay's VerifyModel says of the row's plan (cache branch
exact, EAGLE3 from one Eagle3Stream per request), capped at the recorded output. Every
response enters the global cache token by token as it is generated (the drafter's own
rule, as in the server), so requests in flight together draft only from what the others
have generated so far, where sequential replay sees every earlier response whole.

With ``concurrency`` 1 this walks the requests in file order, as ``simulate`` with
``prefill_first`` does, and plans every row alike (tests/test_serving_core.py).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from ..drafter.row_tree import row_path
from ..serving.stepper import HVDStepper
from ..trace import TraceRecord
from ..verify import Eagle3Stream, RowPlan, VerifyModel
from .metrics import SourceTally, overall

PREFILL_ROW = RowPlan(0, 0)


@dataclasses.dataclass(frozen=True, slots=True)
class FleetStep:
    req_id: str
    pos: int
    plan: RowPlan
    predicted: float  # the gate's accept_len for the row's cache draft (nan: none judged)
    out_len: int


@dataclasses.dataclass(slots=True)
class FleetResult:
    sources: dict[str, SourceTally]
    emitted: dict[str, list[int]]  # what each request emitted (the recording, if the yield model is right)
    batch_sizes: list[int]  # rows per verify step

    @property
    def overall(self) -> SourceTally:
        return overall(self.sources.values())

    def to_json(self, policy: str) -> dict:
        out = {name: s.policy(policy).to_json() for name, s in self.sources.items()}
        out["overall"] = self.overall.policy(policy).to_json()
        return out


def conversations_of(records: Sequence[TraceRecord]) -> list[list[TraceRecord]]:
    """Records grouped by conversation (first appearance order), turns in order."""
    convs: dict[str, list[TraceRecord]] = collections.OrderedDict()
    for r in records:
        convs.setdefault(r.conv_id, []).append(r)
    return [sorted(turns, key=lambda r: r.turn) for turns in convs.values()]


def serve_fleet(conversations: Sequence[Sequence[TraceRecord]], stepper: HVDStepper, model: VerifyModel,
                concurrency: int, policy: str = "hvd",
                on_step: Callable[[FleetStep], None] | None = None) -> FleetResult:
    """Serve ``conversations`` (each a list of turns in order) through ``stepper``;
    tallies under the name ``policy`` per source."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    waiting = collections.deque(collections.deque(turns) for turns in conversations if turns)
    sources: dict[str, SourceTally] = {}
    emitted: dict[str, list[int]] = {}
    running: dict[str, tuple[TraceRecord, collections.deque, Eagle3Stream]] = {}
    batch_sizes: list[int] = []
    in_flight = 0  # conversations holding a slot

    def start(turns: collections.deque) -> None:
        r = turns.popleft()
        s = sources.setdefault(r.source, SourceTally())
        s.requests += 1
        s.tokens += len(r.output_ids)
        out = r.output_ids[:1].tolist()
        emitted[r.req_id] = out
        if out:
            s.policy(policy).add_step(PREFILL_ROW, 1, 0)
        running[r.req_id] = (r, turns, Eagle3Stream())

    def end(rid: str) -> None:
        nonlocal in_flight
        r, turns, _ = running.pop(rid)
        stepper.sync(rid, r.prompt_ids, emitted[rid])
        stepper.finish(rid)
        if turns:
            start(turns)
        else:
            in_flight -= 1

    while waiting or running:
        while waiting and in_flight < concurrency:
            in_flight += 1
            start(waiting.popleft())
        while True:  # a one-token (or empty) output ends at its prefill, and its next turn may too
            done = [rid for rid, (r, _, _) in running.items() if len(emitted[rid]) >= len(r.output_ids)]
            if not done:
                break
            for rid in done:
                end(rid)
        rids = list(running)
        if not rids:
            continue
        for rid in rids:
            stepper.sync(rid, running[rid][0].prompt_ids, emitted[rid])
        plans = stepper.plan(rids)
        accepts = np.zeros(len(rids), dtype=np.int64)
        for i, rid in enumerate(rids):
            r, _, stream = running[rid]
            pos = len(emitted[rid])
            plan = plans.plan(i)
            # a row verifies at most N-1 cache nodes: only that much of the recording is compared
            accepted = len(row_path(plans.cache_tokens[i, : plan.cache_len].tolist(),
                                    plans.cache_parents[i, : plan.cache_len].tolist(),
                                    r.output_ids[pos : pos + plan.cache_len].tolist()))
            out = min(model.out_len(plan, accepted, stream), len(r.output_ids) - pos)
            sources[r.source].policy(policy).add_step(plan, out, accepted)
            emitted[rid].extend(r.output_ids[pos : pos + out].tolist())
            accepts[i] = out - 1
            if on_step is not None:
                on_step(FleetStep(rid, pos, plan, float(plans.predicted[i]), out))
        batch_sizes.append(len(rids))
        stepper.verified(rids, accepts)
        for rid in rids:
            if len(emitted[rid]) >= len(running[rid][0].output_ids):
                end(rid)
    return FleetResult(sources, emitted, batch_sizes)

