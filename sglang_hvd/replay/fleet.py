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

With a step-time profile (step_profile.py) every verify step is also timed: the
profile's time for the step's tier at its batch and context (the running requests'
prompts and outputs so far), EAGLE3's draft forwards when some row verifies EAGLE3
nodes, the draft model's extend as the planner's server runs it (``extend``: every step in
SGLang, drafted or not), HVD's host time when the planner is HVD's; each row carries an equal share, so
per-source times add up to the whole. Prefills are not timed (the same for every
policy); a new request enters the stepper at its prefill (its prompt indexed then, as the
server does), before its first decode step.

With ``concurrency`` 1 this walks the requests in file order, as ``simulate`` with
``prefill_first`` does, and plans every row alike (tests/test_serving_core.py).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from ..decision import BatchPlan
from ..drafter.row_tree import row_path
from ..step_profile import EXTEND_EVERY_STEP, EXTEND_NONE, HOST_NONE, StepProfile
from ..tiers import Tier, eagle3_cap
from ..trace import TraceRecord
from ..verify import Eagle3Stream, RowPlan, VerifyModel
from .metrics import SourceTally, overall

PREFILL_ROW = RowPlan(0, 0)


class Planner(Protocol):
    """What fleet replay drives: the serving stepper (serving/stepper.py), or a baseline
    that drafts nothing (FixedPlanner, adaptive.AdaptiveEagle3Planner)."""

    host: str  # the host work its steps pay (step_profile.HOST_HVD, HOST_DRAFTS or HOST_NONE)
    extend: str  # when its steps pay EAGLE3's draft extend (step_profile.EXTEND_*)

    def sync(self, rid: str, prompt_ids, output_ids, source: str | None = None) -> None: ...

    def finish(self, rid: str) -> None: ...

    def plan(self, rids: Sequence[str]) -> BatchPlan: ...

    def verified(self, rids: Sequence[str], accepts: Sequence[int]) -> None: ...


class FixedPlanner:
    """Drafts nothing: every row at ``tier`` verifies EAGLE3's draft (``eagle3@T``), or
    takes a plain step at ``off`` (``greedy``)."""

    host = HOST_NONE

    def __init__(self, tier: Tier):
        self.tier = tier
        self.extend = EXTEND_EVERY_STEP if tier.speculates else EXTEND_NONE
        self.modes: dict[str, int] = {}

    def sync(self, rid: str, prompt_ids, output_ids, source: str | None = None) -> None:
        pass

    def finish(self, rid: str) -> None:
        pass

    def plan(self, rids: Sequence[str]) -> BatchPlan:
        self.modes[self.tier.name] = self.modes.get(self.tier.name, 0) + 1
        if self.tier.shape is None:
            return BatchPlan.plain(len(rids))
        return BatchPlan.all_eagle3(len(rids), self.tier.draft_nodes, self.tier)

    def verified(self, rids: Sequence[str], accepts: Sequence[int]) -> None:
        pass


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
    time_ms: float = 0.0  # modelled decode time of every verify step (0 without a profile)

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


def serve_fleet(conversations: Sequence[Sequence[TraceRecord]], stepper: Planner, model: VerifyModel,
                concurrency: int, policy: str = "hvd",
                on_step: Callable[[FleetStep], None] | None = None,
                profile: StepProfile | None = None) -> FleetResult:
    """Serve ``conversations`` (each a list of turns in order) through ``stepper``;
    tallies under the name ``policy`` per source, timed by ``profile`` when given."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    waiting = collections.deque(collections.deque(turns) for turns in conversations if turns)
    sources: dict[str, SourceTally] = {}
    emitted: dict[str, list[int]] = {}
    running: dict[str, tuple[TraceRecord, collections.deque, Eagle3Stream]] = {}
    batch_sizes: list[int] = []
    total_ms = 0.0
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
        # the server indexes a new request's prompt at its prefill (patches/worker.py), off the decode steps
        stepper.sync(r.req_id, r.prompt_ids, [], r.source)

    def end(rid: str) -> None:
        nonlocal in_flight
        r, turns, _ = running.pop(rid)
        stepper.sync(rid, r.prompt_ids, emitted[rid], r.source)
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
            stepper.sync(rid, running[rid][0].prompt_ids, emitted[rid], running[rid][0].source)
        plans = stepper.plan(rids)
        row_ms = 0.0
        if profile is not None:
            context = sum(len(running[rid][0].prompt_ids) + len(emitted[rid]) for rid in rids)
            step_ms = profile.step_ms(plans.tier or Tier(model.shape), len(rids), context, eagle3=plans.eagle3,
                                      host=stepper.host, extend=stepper.extend)
            total_ms += step_ms
            row_ms = step_ms / len(rids)
        accepts = np.zeros(len(rids), dtype=np.int64)
        cap = eagle3_cap(plans.tier, model.shape)  # EAGLE3's nodes valued at the step's depth
        for i, rid in enumerate(rids):
            r, _, stream = running[rid]
            pos = len(emitted[rid])
            plan = plans.plan(i)
            # a row verifies at most N-1 cache nodes: only that much of the recording is compared
            accepted = len(row_path(plans.cache_tokens[i, : plan.cache_len].tolist(),
                                    plans.cache_parents[i, : plan.cache_len].tolist(),
                                    r.output_ids[pos : pos + plan.cache_len].tolist()))
            verified = model.out_len(plan, accepted, stream, cap)  # the tokens the verify gives
            out = min(verified, len(r.output_ids) - pos)  # those the response keeps
            sources[r.source].policy(policy).add_step(plan, out, accepted, row_ms)
            emitted[rid].extend(r.output_ids[pos : pos + out].tolist())
            # a server's accepted lengths are the verify's, not cut at the response's end (SGLang cuts the output
            # after on_verify_complete_cpu): the EAGLE3 yield the stepper learns from them is not biased low
            accepts[i] = verified - 1
            if on_step is not None:
                on_step(FleetStep(rid, pos, plan, float(plans.predicted[i]), out))
        batch_sizes.append(len(rids))
        stepper.verified(rids, accepts)
        for rid in rids:
            if len(emitted[rid]) >= len(running[rid][0].output_ids):
                end(rid)
    return FleetResult(sources, emitted, batch_sizes, total_ms)

