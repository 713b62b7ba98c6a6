"""One HVD decode step for a batch, free of sglang and torch.

Per step the serving worker calls, for the batch's requests in row order:
  sync(rid, prompt_ids, output_ids)   bring the drafter up to date with each request
  plan(rids)                          cache drafts + decision.decide -> the BatchPlan of the rows
  verified(rids, accept_lens, rows)   what the verify accepted (metrics, trace steps)
and finish(rid) when a request ends. The decision (gate included) runs once per step on
the whole batch, through the same decision.decide that replay and training use. A gate
that fails at run time makes that step verify EAGLE3's rows: logged once, counted in
``stats()["gate_errors"]``, never raised into the server.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

import numpy as np

from ..decision import BatchPlan, CostRule, DecisionRule, StepMode, decide
from ..drafter.batch import RowTreeBatch
from ..drafter.protocol import Drafter
from ..drafter.row_tree import branch, is_chain, row_path
from ..request_state import RequestState
from ..scorer import ServedScorer
from ..step_profile import EXTEND_EVERY_STEP, HOST_HVD
from ..trace import TokenizerId, TraceRecord, TraceStep, token_array
from ..verify import VerifyShape
from .status import rates

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class _Verify:
    """One row's verify, until the tokens it emitted arrive and say which branch won."""

    pos: int
    cache_draft: tuple[int, ...]  # the cache branch's nodes (empty: an EAGLE3 row)
    cache_parents: tuple[int, ...]  # their parent links (a chain: -1, 0, 1, ...)
    eagle_nodes: int
    accept_len: int = -1  # -1 until the verify returns
    eagle_row: tuple[int, ...] = ()  # the EAGLE3 chain (topk 1), for the recorded trace


class _Request:
    __slots__ = ("prompt", "output", "state", "pending", "steps")

    def __init__(self, prompt: np.ndarray):
        self.prompt = prompt
        self.output: list[int] = []
        self.state = RequestState(prompt)
        self.pending: _Verify | None = None
        self.steps: list[TraceStep] = []


@dataclasses.dataclass(slots=True)
class StepStats:
    steps: int = 0
    rows: int = 0
    cache_rows: int = 0  # rows with a cache branch (a chain or two branches)
    cache_accepted: int = 0  # cache tokens accepted in them
    two_branch_rows: int = 0  # cache rows that kept EAGLE3 nodes beside the cache branch
    tree_rows: int = 0  # cache rows whose cache branch is a tree (siblings beside the chain)
    sibling_wins: int = 0  # tree rows whose accepted path left the chain for a sibling
    eagle3_branch_wins: int = 0  # two-branch rows whose EAGLE3 branch was accepted
    eagle3_rows: int = 0  # rows verifying EAGLE3's draft alone
    eagle3_accepted: int = 0  # EAGLE3 tokens accepted (its rows and its branch wins)
    gate_errors: int = 0
    cpu_us_total: float = 0.0
    modes: dict[str, int] = dataclasses.field(default_factory=dict)  # steps per StepMode name (a cost rule's picks)


class HVDStepper:
    host = HOST_HVD  # the host work of a step (step_profile): drafts, features, gate, row trees
    extend = EXTEND_EVERY_STEP  # the server's EAGLE3 draft extend runs every decode step (SGLang's rule)

    def __init__(self, drafter: Drafter, gate: ServedScorer | None, shape: VerifyShape,
                 rule: DecisionRule | None = None, recorder=None, tokenizer: TokenizerId | None = None,
                 source: str = "served", step: StepMode | CostRule | None = None):
        self.drafter = drafter
        self.gate = gate
        self.shape = shape
        self.step = step  # None: every step at ``shape`` with EAGLE3; a CostRule picks per step
        self.rule = rule if rule is not None else (gate.rule if gate is not None else DecisionRule())
        self.recorder = recorder
        self.tokenizer = tokenizer or TokenizerId("unknown", "unknown")
        self.source = source
        self._reqs: dict[str, _Request] = {}
        self.stats = StepStats()
        self._gate_error_logged = False

    @property
    def threshold(self) -> float:
        return self.rule.threshold

    def __contains__(self, rid: str) -> bool:
        return rid in self._reqs

    # -- bookkeeping -------------------------------------------------------------------

    def sync(self, rid: str, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> None:
        """Register a new request, or append the tokens it emitted since the last sync."""
        st = self._reqs.get(rid)
        if st is None:
            st = self._reqs[rid] = _Request(np.asarray(prompt_ids, dtype=np.int32))
            self.drafter.start_request(rid, st.prompt)
        new = list(output_ids[len(st.output):])
        if not new:
            return
        st.output.extend(new)
        st.state.observe(new)
        self.drafter.append(rid, new)
        self._resolve(st)

    def finish(self, rid: str, final_output: Sequence[int] | None = None) -> None:
        """The request ended: its response stays in the global cache; record its trace.

        ``final_output``: the response as returned, when the server cut tokens it had
        already accepted (a stop string, max_new_tokens inside an accepted run).
        """
        st = self._reqs.pop(rid, None)
        if st is None:
            return
        self.drafter.finish_request(rid)
        if final_output is not None and len(final_output) < len(st.output):
            st.output = list(final_output)
        self._resolve(st, final=True)
        if self.recorder is not None and st.output:
            self.recorder.record(TraceRecord(
                req_id=rid, conv_id=rid, turn=0, source=self.source, tokenizer=self.tokenizer,
                prompt_ids=token_array(st.prompt), output_ids=token_array(st.output),
                # A stop or max_new_tokens may cut the last verify's accepted run short.
                steps=tuple(dataclasses.replace(s, accept_len=min(s.accept_len, len(st.output) - s.pos))
                            for s in st.steps if s.pos < len(st.output)),
            ))

    def running(self) -> list[str]:
        return list(self._reqs)

    def reset(self) -> None:
        self._reqs.clear()
        self.drafter.reset()

    # -- the step --------------------------------------------------------------------

    def plan(self, rids: Sequence[str]) -> BatchPlan:
        """Cache drafts for the batch and the row plan of each row (decision.decide)."""
        start = time.perf_counter()
        states = [self._reqs[r] for r in rids]
        arrays = self.drafter.speculate_arrays(rids)

        def trees(rows: np.ndarray) -> RowTreeBatch:  # the drafted rows (tree features) or those with room
            return self.drafter.speculate_rows([rids[i] for i in rows], self.shape.draft_nodes)

        context = sum(len(s.prompt) + len(s.output) for s in states) if isinstance(self.step, CostRule) else 0
        plans = decide(self.gate, arrays, [s.state for s in states], self.shape, self.rule, fallback=True, trees=trees,
                       step=self.step, context_tokens=context)
        if plans.tier is not None:
            name = StepMode(plans.tier, plans.eagle3).name  # what the step ran
            self.stats.modes[name] = self.stats.modes.get(name, 0) + 1
        if plans.gate_error is not None:
            self.stats.gate_errors += 1
            if not self._gate_error_logged:
                e = plans.gate_error
                log.error("HVD gate failed at run time (%s: %s); this step and any like it use EAGLE3 drafts. "
                          "Further gate errors are counted, not logged.", e.__class__.__name__, e)
                self._gate_error_logged = True
        for i, s in enumerate(states):
            cache = int(plans.cache_lens[i])
            s.pending = _Verify(len(s.output), tuple(plans.cache_tokens[i, :cache].tolist()),
                                tuple(plans.cache_parents[i, :cache].tolist()), int(plans.eagle_nodes[i]))
        self.stats.cpu_us_total += (time.perf_counter() - start) * 1e6
        self.stats.steps += 1
        return plans

    def verified(self, rids: Sequence[str], accept_lens: Sequence[int], eagle3_rows: np.ndarray | None = None) -> None:
        """Accepted draft tokens per row (bonus excluded) of the step just verified.

        ``eagle3_rows`` [B, N-1]: the EAGLE3 chains of the rows (topk 1), for the recorded
        trace. Which branch of a two-branch row won is known once its tokens arrive (the
        next ``sync``): the verify tries the cache branch first, so it won exactly when
        the first emitted token is the cache draft's first token.
        """
        for i, rid in enumerate(rids):
            st = self._reqs.get(rid)
            if st is None or st.pending is None or st.pending.accept_len >= 0:
                continue
            has_row = eagle3_rows is not None and not st.pending.cache_draft
            row = tuple(int(t) for t in eagle3_rows[i]) if has_row else ()
            st.pending = dataclasses.replace(st.pending, accept_len=int(accept_lens[i]), eagle_row=row)
            self._resolve(st)

    def _resolve(self, st: _Request, final: bool = False) -> None:
        v = st.pending
        if v is None or v.accept_len < 0:
            return
        a = v.accept_len
        if len(st.output) < v.pos + a and not final:
            return  # its tokens have not arrived yet
        st.pending = None
        emitted = st.output[v.pos : v.pos + a]
        self.stats.rows += 1
        if v.cache_draft:
            self.stats.cache_rows += 1
            self.stats.two_branch_rows += v.eagle_nodes > 0
            path = row_path(v.cache_draft, v.cache_parents, emitted)
            self.stats.tree_rows += not is_chain(v.cache_parents)
            self.stats.sibling_wins += path != tuple(range(len(path)))
            if a == 0 or path:
                self.stats.cache_accepted += a
                # a tree row is recorded as the branch the output took (its LCP with the output is the path)
                draft = branch(v.cache_draft, v.cache_parents, path)
                step = TraceStep(pos=v.pos, src="cache", draft=draft, accept_len=min(a, len(draft)))
            else:
                self.stats.eagle3_branch_wins += 1
                self.stats.eagle3_accepted += a
                step = TraceStep(pos=v.pos, src="eagle3", draft=tuple(emitted), accept_len=len(emitted))
        else:
            self.stats.eagle3_rows += 1
            self.stats.eagle3_accepted += a
            # topk 1: the EAGLE3 chain; a tree: the path the verify accepted.
            draft = v.eagle_row or tuple(emitted)
            step = TraceStep(pos=v.pos, src="eagle3", draft=draft, accept_len=min(a, len(draft)))
        if self.recorder is not None:
            st.steps.append(step)

    def summary(self) -> dict[str, float]:
        s = self.stats
        counts = {"steps": s.steps, "rows": s.rows, "cache_rows": s.cache_rows, "two_branch_rows": s.two_branch_rows,
                  "tree_rows": s.tree_rows, "sibling_wins": s.sibling_wins,
                  "eagle3_branch_wins": s.eagle3_branch_wins, "cache_accepted": s.cache_accepted,
                  "eagle3_verifies": s.eagle3_rows + s.eagle3_branch_wins, "eagle3_accepted": s.eagle3_accepted,
                  "cpu_us_total": s.cpu_us_total}
        # the counts behind the rates travel too, so that several ranks or replicas add up exactly
        return {**counts, **rates(counts), "gate_errors": s.gate_errors,
                "recorded_dropped": getattr(self.recorder, "num_dropped", 0),
                "recorded_failed": getattr(self.recorder, "num_failed", 0)}
