"""One HVD decode step for a batch, free of sglang and torch.

Per step the serving worker calls, for the batch's requests in row order:
  sync(rid, prompt_ids, output_ids)   bring the drafter up to date with each request
  plan(rids)                          cache drafts + decision.decide -> the BatchPlan of the rows
  verified(rids, accept_lens, rows)   what the verify accepted (metrics, trace steps)
and finish(rid) when a request ends (it returns the request's own figures, for its
response's meta_info: request_control.py). The decision (gate included) runs once per step on
the whole batch, through the same decision.decide that replay and training use. A gate
that fails at run time makes that step verify EAGLE3's rows: logged once, counted in
``stats()["gate_errors"]``, never raised into the server.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Sequence

import numpy as np

from ..calibration import CalibrationInput, OnlineCalibration
from ..decision import BatchPlan, CostRule, DecisionRule, StepMode, chain_parents, decide, described, reads_row_trees
from ..drafter.batch import RowTreeBatch
from ..drafter.protocol import Drafter
from ..drafter.row_tree import branch, row_path
from ..request_control import AUTO, FIGURES, figures
from ..request_state import new_request_state
from ..scorer import ServedScorer
from ..step_profile import EXTEND_EVERY_STEP, HOST_HVD
from ..tiers import eagle3_cap
from ..trace import TokenizerId, TraceRecord, TraceStep, token_array
from ..verify import VerifyShape
from .eagle3_yield import Eagle3Yield
from .status import rates

log = logging.getLogger(__name__)


class _Step:
    """A plan's decisions as its rows' verifies read them: the BatchPlan, and its per-row
    counts as lists (made once per step, not once per row); and each row's verify until the
    tokens it emitted arrive and say which branch won: its accepted length (-1 until the
    verify returns) and, where recorded, its EAGLE3 chain (topk 1). A request waiting on row
    ``i`` holds ``(step, i, pos)``: the step, its row and its output's length at the plan."""

    __slots__ = ("plans", "cache_lens", "eagle_nodes", "eagle3_cap", "mode", "chain", "first", "accepts", "eagle_rows")

    def __init__(self, plans: BatchPlan, eagle3_cap: int, mode: str | None = None):
        self.plans = plans
        self.mode = mode  # the StepMode name the step ran (StepStats.modes), None without a tier
        self.cache_lens: list[int] = plans.cache_lens.tolist()
        self.eagle_nodes: list[int] = plans.eagle_nodes.tolist()
        self.eagle3_cap = eagle3_cap  # the EAGLE3 nodes the step's depth is valued at (tiers.eagle3_cap)
        self.accepts: list[int] = [-1] * len(self.cache_lens)
        self.eagle_rows: dict[int, tuple[int, ...]] = {}
        # per row: whether its cache branch is a chain (its verified nodes' parents -1, 0, 1, ...), and its first node
        parents = plans.cache_parents
        n = parents.shape[1]
        if n:
            # only rows grown from a row tree can leave the chain: their first link that differs
            # (argmax: the first True; 0 where none differs) lies within their verified nodes
            off = parents != chain_parents(n)
            self.chain: list[bool] = ((off.argmax(axis=1) >= plans.cache_lens) | ~off.any(axis=1)).tolist()
            self.first: list[int] = plans.cache_tokens[:, 0].tolist()
        else:  # the off tier: no cache nodes
            self.chain = [True] * len(self.cache_lens)
            self.first = [-1] * len(self.cache_lens)


class _Request:
    __slots__ = ("prompt", "output", "context", "state", "pending", "steps", "bucket", "labels", "control", "counts")

    def __init__(self, prompt: np.ndarray, bucket: int = 0, control: int = AUTO):
        self.prompt = prompt
        self.control = control  # its per-request control (request_control.py)
        # its own share of StepStats' counts (request_control.FIGURES), for its response
        self.counts = dict.fromkeys(FIGURES, 0)
        self.output: list[int] = []
        self.context = len(prompt)  # its context tokens: len(prompt) + len(output), kept by sync
        self.state = new_request_state(prompt)
        self.pending: tuple[_Step, int, int] | None = None  # (step, row, pos) of its verify (_Step)
        self.steps: list[TraceStep] = []
        self.bucket = bucket  # its calibration bucket (calibration.py)
        # judged drafts waiting for the output that labels them: (pos, tokens, parents, predicted), in pos order
        self.labels: list[tuple[int, list[int], list[int], float]] = []


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
    plain_rows: int = 0  # rows that verified no draft (the off tier; a cache-only step's rows without a cache draft)
    gate_errors: int = 0
    cpu_us_total: float = 0.0
    modes: dict[str, int] = dataclasses.field(default_factory=dict)  # steps per StepMode name (a cost rule's picks)
    # per StepMode name: the tokens the cost rule expected its steps to emit, and those its rows emitted (accepted
    # + 1 each, counted as each row's tokens arrive): where the two part, the payoff or the yield is misjudged
    mode_expected: dict[str, float] = dataclasses.field(default_factory=dict)
    mode_emitted: dict[str, int] = dataclasses.field(default_factory=dict)
    modelled_ms: float = 0.0  # the steps' time under a cost rule's profile (0 without one)


EAGLE3_REFRESH_STEPS = 8  # how often the EAGLE3 yield is checked for a move worth a new curve


class HVDStepper:
    host = HOST_HVD  # the host work of a step (step_profile): drafts, features, gate, row trees
    extend = EXTEND_EVERY_STEP  # the server's EAGLE3 draft extend runs every decode step (SGLang's rule)

    def __init__(self, drafter: Drafter, gate: ServedScorer | None, shape: VerifyShape,
                 rule: DecisionRule | None = None, recorder=None, tokenizer: TokenizerId | None = None,
                 source: str = "served", step: StepMode | CostRule | None = None,
                 calibration: OnlineCalibration | None = None):
        self.drafter = drafter
        self.gate = gate
        self.shape = shape
        self.step = step  # None: every step at ``shape`` with EAGLE3; a CostRule picks per step
        self.rule = rule if rule is not None else (gate.rule if gate is not None else DecisionRule())
        self.recorder = recorder
        self.tokenizer = tokenizer or TokenizerId("unknown", "unknown")
        self.source = source
        self._reqs: dict[str, _Request] = {}
        # sync's new tokens, per request, until the drafter and the requests' decision states take them
        self._append_rids: list[str] = []
        self._append_tokens: list[list[int]] = []
        self._append_states: list = []
        self._controlled = 0  # tracked requests whose control is not auto
        self.stats = StepStats()
        self._gate_error_logged = False
        self.context_tokens = 0  # the last planned step's context tokens (plan)
        self.cycle: tuple[StepMode, ...] = ()  # the tier-cycle diagnostic: these modes in turn, one per step
        # a cost rule values EAGLE3 rows by the curve the verifies show (eagle3_yield.py), checked every
        # EAGLE3_REFRESH_STEPS steps and refreshed when its scale moved (Eagle3Yield.stale)
        self.eagle3_yield = Eagle3Yield(step.eagle3_curve) if isinstance(step, CostRule) else None
        # modelled_ms times every step by the cost rule's profile as given (not by an online refit of it)
        self.time_profile = step.profile if isinstance(step, CostRule) else None
        # online calibration (calibration.py): every judged draft is labelled once the output has passed it
        self.calibration = calibration

    @property
    def _trees_first(self) -> bool:
        """Whether decide asks every drafted row's tree (decision.reads_row_trees, with cache
        siblings): the drafter makes them with the drafts."""
        return self.rule.cache_siblings > 0 and reads_row_trees(self.gate, self.shape)

    @property
    def threshold(self) -> float:
        return self.rule.threshold

    def __contains__(self, rid: str) -> bool:
        return rid in self._reqs

    # -- bookkeeping -------------------------------------------------------------------

    def sync(self, rid: str, prompt_ids: Sequence[int], output_ids: Sequence[int], source: str | None = None,
             control: int = AUTO) -> None:
        """Register a new request, or take the tokens it emitted since the last sync (the
        drafter gets every request's new tokens in one ``append_batch`` before it drafts).
        ``source``: the new request's calibration bucket (None: one bucket for all);
        ``control``: its per-request control (request_control.py; auto by default)."""
        st = self._reqs.get(rid)
        if st is None:
            self._flush_appends()  # the drafter sees every append and start in the order they came
            bucket = self.calibration.bucket(source) if self.calibration is not None else 0
            st = self._reqs[rid] = _Request(np.asarray(prompt_ids, dtype=np.int32), bucket, control)
            self._controlled += control != AUTO
            self.drafter.start_request(rid, st.prompt)
        if len(output_ids) <= len(st.output):
            return
        new = list(output_ids[len(st.output):])
        st.output.extend(new)
        st.context += len(new)
        self._append_rids.append(rid)
        self._append_tokens.append(new)
        self._append_states.append(st.state)
        self._resolve(st)
        if st.labels:
            self._label(st)

    def _flush_appends(self) -> None:
        """The tokens taken by ``sync`` since the last flush, into the requests' decision states
        and the drafter, one call each (nothing reads a state between its sync and this flush:
        ``plan`` flushes first)."""
        if self._append_rids:
            rids, tokens, states = self._append_rids, self._append_tokens, self._append_states
            self._append_rids, self._append_tokens, self._append_states = [], [], []  # taken even if refused
            type(states[0]).observe_rows(states, tokens)
            self.drafter.append_batch(rids, tokens)

    def finish(self, rid: str, final_output: Sequence[int] | None = None) -> dict | None:
        """The request ended: its response stays in the global cache; record its trace.
        Returns the request's figures (request_control.figures; None: not tracked, or it
        ended at its prefill: no decode row, nothing recorded).

        ``final_output``: the response as returned, when the server cut tokens it had
        already accepted (a stop string, max_new_tokens inside an accepted run).
        """
        st = self._reqs.pop(rid, None)
        if st is None:
            return None
        self._controlled -= st.control != AUTO
        self._flush_appends()
        self.drafter.finish_request(rid)
        if final_output is not None and len(final_output) < len(st.output):
            st.output = list(final_output)
        self._resolve(st, final=True)
        if st.labels:
            self._label(st, final=True)
        if not st.counts["rows"]:  # ended at its prefill (the server admits requests there): no decode row
            return None
        if self.recorder is not None and st.output:
            self.recorder.record(TraceRecord(
                req_id=rid, conv_id=rid, turn=0, source=self.source, tokenizer=self.tokenizer,
                prompt_ids=token_array(st.prompt), output_ids=token_array(st.output),
                # A stop or max_new_tokens may cut the last verify's accepted run short.
                steps=tuple(dataclasses.replace(s, accept_len=min(s.accept_len, len(st.output) - s.pos))
                            for s in st.steps if s.pos < len(st.output)),
            ))
        return figures(st.control, st.counts)

    def running(self) -> list[str]:
        return list(self._reqs)

    def swap_gate(self, gate: ServedScorer) -> None:
        """Serve ``gate`` (checked by serving/gate_swap.py) from the next step on, with its
        rule; the online calibration starts over (it learnt the old gate's errors), and
        drafts the old gate judged are not labelled into it. A cost rule values EAGLE3's
        rows by the new gate's EAGLE3 curve when it names another one (its yield learnt
        anew against it); with the same curve, the yield learnt so far stays."""
        self.gate = gate
        self.rule = gate.rule
        self._gate_error_logged = False
        curve = gate.verify_model.eagle3
        if isinstance(self.step, CostRule) and curve != self.eagle3_yield.base:
            self.eagle3_yield = Eagle3Yield(curve)
            self.step = dataclasses.replace(self.step, eagle3_curve=curve)
        if self.calibration is not None:
            self.calibration.reset()
            for st in self._reqs.values():
                st.labels.clear()

    def reset(self) -> None:
        self._reqs.clear()
        self._controlled = 0
        self._append_rids, self._append_tokens, self._append_states = [], [], []
        self.drafter.reset()

    # -- the step --------------------------------------------------------------------

    def plan(self, rids: Sequence[str]) -> BatchPlan:
        """Cache drafts for the batch and the row plan of each row (decision.decide)."""
        start = time.perf_counter()
        self._flush_appends()
        if self.eagle3_yield is not None and self.stats.steps % EAGLE3_REFRESH_STEPS == EAGLE3_REFRESH_STEPS - 1:
            self._refresh_eagle3()
        states = [self._reqs[r] for r in rids]
        asked: list[tuple[np.ndarray, RowTreeBatch]] = []  # the row trees decide asked for (labels read them)
        n = self.shape.draft_nodes
        if self._trees_first:  # decide asks every drafted row's tree: drafted together, in one call
            arrays, trees = self.drafter.speculate_step(rids, n, self.rule.cache_siblings)  # cut as described
            asked.append((np.arange(len(rids)), trees))
        else:
            arrays = self.drafter.speculate_arrays(rids)

            def trees(rows: np.ndarray) -> RowTreeBatch:  # the cache rows with room (a scorer without tree features)
                got = self.drafter.speculate_rows([rids[i] for i in rows], n)
                asked.append((rows, got))
                return got

        step = self.cycle[self.stats.steps % len(self.cycle)] if self.cycle else self.step
        timed = isinstance(step, CostRule) or self.time_profile is not None
        context = sum([s.context for s in states]) if timed else 0
        self.context_tokens = context  # the step's context, all rows (0 when no cost rule needed it)
        calibrated = None
        if self.calibration is not None:
            calibrated = CalibrationInput(self.calibration, np.fromiter((s.bucket for s in states), np.int64,
                                                                        len(states)))
        control = None
        if self._controlled:
            control = np.fromiter((s.control for s in states), np.int8, len(states))
        plans = decide(self.gate, arrays, [s.state for s in states], self.shape, self.rule, fallback=True, trees=trees,
                       step=step, context_tokens=context, calibration=calibrated, control=control)
        if calibrated is not None:
            self._queue_labels(states, arrays, plans.predicted, asked[0] if asked else None)
        name = None
        picked = math.isfinite(plans.expected_tokens)  # a cost rule's pick
        if plans.tier is not None:
            name = StepMode(plans.tier, plans.eagle3).name  # what the step ran
            self.stats.modes[name] = self.stats.modes.get(name, 0) + 1
            if picked:
                self.stats.mode_expected[name] = self.stats.mode_expected.get(name, 0.0) + plans.expected_tokens
            if self.time_profile is not None:  # the step's time under the profile given (as fleet replay's)
                self.stats.modelled_ms += self.time_profile.step_ms(plans.tier, len(rids), context,
                                                                    eagle3=plans.eagle3, host=self.host,
                                                                    extend=self.extend)
        if plans.gate_error is not None:
            self.stats.gate_errors += 1
            if not self._gate_error_logged:
                e = plans.gate_error
                log.error("HVD gate failed at run time (%s: %s); this step and any like it use EAGLE3 drafts. "
                          "Further gate errors are counted, not logged.", e.__class__.__name__, e)
                self._gate_error_logged = True
        step = _Step(plans, eagle3_cap(plans.tier, self.shape), name if picked else None)
        for i, s in enumerate(states):
            s.pending = (step, i, len(s.output))
        self.stats.cpu_us_total += (time.perf_counter() - start) * 1e6
        self.stats.steps += 1
        return plans

    def _queue_labels(self, states: list[_Request], drafts, predicted: np.ndarray,
                      asked: tuple[np.ndarray, RowTreeBatch] | None) -> None:
        """Each judged draft of the step waits in its request for its label: the nodes the
        gate judged (the row tree cut where the decision describes it, as training labels
        it, where decide built it; else the chain), at the served shape's N-1 nodes."""
        judged = np.flatnonzero(np.isfinite(predicted))
        if not len(judged):
            return
        n = self.shape.draft_nodes
        lens = np.minimum(drafts.lengths, n)
        tree_of = {}
        if asked is not None:
            rows, got = asked
            cut = described(drafts.lengths[rows], self.rule.cache_siblings, n)
            tree_of = {int(r): (k, int(min(c, got.lengths[k]))) for k, (r, c) in enumerate(zip(rows, cut))}
        pred = predicted[judged].tolist()
        for i, p in zip(judged.tolist(), pred):
            st = states[i]
            if i in tree_of:
                k, m = tree_of[i]
                tokens, parents = asked[1].tokens[k, :m].tolist(), asked[1].parents[k, :m].tolist()
            else:
                m = int(lens[i])
                tokens, parents = drafts.tokens[i, :m].tolist(), list(range(-1, m - 1))
            st.labels.append((len(st.output), tokens, parents, p))

    def _label(self, st: _Request, final: bool = False) -> None:
        """The judged drafts whose nodes the output has passed (all of them at the end), into the calibration."""
        out = st.output
        done = 0
        for pos, tokens, parents, p in st.labels:
            if not final and len(out) - pos < len(tokens):
                break
            self.calibration.observe(st.bucket, p, len(row_path(tokens, parents, out, pos)))
            done += 1
        del st.labels[:done]

    def _refresh_eagle3(self) -> None:
        """The cost rule's EAGLE3 curve, from the EAGLE3 rows verified so far."""
        if isinstance(self.step, CostRule) and self.eagle3_yield.stale():
            curve = self.eagle3_yield.curve()
            if curve != self.step.eagle3_curve:
                self.step = dataclasses.replace(self.step, eagle3_curve=curve)

    def verified(self, rids: Sequence[str], accept_lens: Sequence[int], eagle3_rows: np.ndarray | None = None) -> None:
        """Accepted draft tokens per row (bonus excluded) of the step just verified.

        ``eagle3_rows`` [B, N-1]: the EAGLE3 chains of the rows (topk 1), for the recorded
        trace. Which branch of a two-branch row won is known once its tokens arrive (the
        next ``sync``): the verify tries the cache branch first, so it won exactly when
        the first emitted token is the cache draft's first token.
        """
        accepts = accept_lens.tolist() if isinstance(accept_lens, np.ndarray) else accept_lens
        for i, rid in enumerate(rids):
            st = self._reqs.get(rid)
            if st is None or st.pending is None:
                continue
            step, row, _ = st.pending
            if step.accepts[row] >= 0:
                continue
            step.accepts[row] = int(accepts[i])
            if eagle3_rows is not None and not step.cache_lens[row]:
                step.eagle_rows[row] = tuple(int(t) for t in eagle3_rows[i])
            self._resolve(st)

    def _resolve(self, st: _Request, final: bool = False) -> None:
        if st.pending is None:
            return
        step, row, pos = st.pending
        a = step.accepts[row]
        if a < 0 or (len(st.output) < pos + a and not final):
            return  # its verify has not returned, or its tokens have not arrived yet
        st.pending = None
        stats, own = self.stats, st.counts
        stats.rows += 1
        if step.mode is not None:
            stats.mode_emitted[step.mode] = stats.mode_emitted.get(step.mode, 0) + a + 1
        own["rows"] += 1
        record = self.recorder is not None
        cache = step.cache_lens[row]
        if not cache and not step.eagle_nodes[row]:
            stats.plain_rows += 1  # nothing drafted was verified: no trace step
            own["plain_rows"] += 1
            return
        if not cache:
            stats.eagle3_rows += 1
            stats.eagle3_accepted += a
            own["eagle3_verifies"] += 1
            own["eagle3_accepted"] += a
            if self.eagle3_yield is not None:
                # a shallower tier's rows count at the nodes its depth is valued at (what the cost rule reads)
                self.eagle3_yield.observe(min(step.eagle_nodes[row], step.eagle3_cap), a + 1)
            if record:
                # topk 1: the EAGLE3 chain; a tree: the path the verify accepted.
                draft = step.eagle_rows.get(row) or tuple(st.output[pos : pos + a])
                st.steps.append(TraceStep(pos=pos, src="eagle3", draft=draft, accept_len=min(a, len(draft))))
            return
        stats.cache_rows += 1
        own["cache_rows"] += 1
        stats.two_branch_rows += step.eagle_nodes[row] > 0
        plans = step.plans
        if step.chain[row]:
            # a chain: the verify took the cache branch exactly when its first token was emitted
            out = st.output
            won = a == 0 or (len(out) > pos and out[pos] == step.first[row])
            path = None
        else:
            tokens = plans.cache_tokens[row, :cache].tolist()
            parents = tuple(plans.cache_parents[row, :cache].tolist())
            path = row_path(tokens, parents, st.output[pos : pos + a])
            stats.tree_rows += 1
            stats.sibling_wins += path != tuple(range(len(path)))
            won = a == 0 or len(path) > 0
        if won:
            stats.cache_accepted += a
            own["cache_accepted"] += a
            if record:
                # a tree row is recorded as the branch the output took (its LCP with the output is the path)
                draft = (tuple(plans.cache_tokens[row, :cache].tolist()) if path is None
                         else branch(tokens, parents, path))
                st.steps.append(TraceStep(pos=pos, src="cache", draft=draft, accept_len=min(a, len(draft))))
        else:
            stats.eagle3_branch_wins += 1
            stats.eagle3_accepted += a
            own["eagle3_verifies"] += 1
            own["eagle3_accepted"] += a
            if record:
                emitted = st.output[pos : pos + a]
                st.steps.append(TraceStep(pos=pos, src="eagle3", draft=tuple(emitted), accept_len=len(emitted)))

    def summary(self) -> dict[str, float]:
        s = self.stats
        counts = {"steps": s.steps, "rows": s.rows, "cache_rows": s.cache_rows, "two_branch_rows": s.two_branch_rows,
                  "tree_rows": s.tree_rows, "sibling_wins": s.sibling_wins, "plain_rows": s.plain_rows,
                  "eagle3_branch_wins": s.eagle3_branch_wins, "cache_accepted": s.cache_accepted,
                  "eagle3_verifies": s.eagle3_rows + s.eagle3_branch_wins, "eagle3_accepted": s.eagle3_accepted,
                  "cpu_us_total": s.cpu_us_total, "modelled_ms": s.modelled_ms}
        # the counts behind the rates travel too, so that several ranks or replicas add up exactly
        return {**counts, **rates(counts), "gate_errors": s.gate_errors,
                "recorded_dropped": getattr(self.recorder, "num_dropped", 0),
                "recorded_failed": getattr(self.recorder, "num_failed", 0)}
