"""The HVD worker: SGLang's EAGLEWorkerV2 with cache drafts written into chosen rows.

At a prefill, after its forwards were launched, each new request enters the stepper (its
prompt indexed by the cache drafter, off the decode steps). Per decode step, before EAGLE3
drafts (``forward_batch_generation``): bring the cache drafter up to date with every request
of the batch and let the stepper (drafter + decision.decide, sglang_hvd/serving/stepper.py)
plan each row (EAGLE3's tree, a cache chain, or both as two branches) -- and, on a cost-
aware server (``--hvd-profile``), the step's verify tier (patches/tier_states.py: SGLang's
runtime state of that width, EAGLE3's draft forwards skipped when no row verifies an EAGLE3
node). Then SGLang drafts, and before its verify (``verify``) the plans are written into
``batch.spec_info`` in place (patches/rows.py: tokens only for topk 1; tokens, positions,
links and mask for topk > 1, with the accept width raised to N). Verification, KV handling,
grammar, logprobs and EAGLE3's own draft extend then run unchanged. Accepted counts come
back through ``on_verify_complete_cpu``; finished requests leave through
``note_request_finished`` (their response stays in the drafter's global cache);
``clear_cache_pool`` resets.

With tensor parallelism only TP rank 0 runs the stepper; every rank takes part in the
broadcast of its tier and plans at every decode step (a failure on rank 0 broadcasts "the
served shape, EAGLE3 everywhere"), so all ranks switch to the same tier and verify identical
rows. Anything that goes wrong in HVD's part of a step is logged once, counted, and that
step verifies EAGLE3's rows at the served shape.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time

from sglang.srt.runtime_context import get_observability, get_parallel
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

from sglang_hvd.cost_rule import CostRule
from sglang_hvd.errors import HvdInputError
from sglang_hvd.request_control import AUTO, META_KEY, control_of
from sglang_hvd.serving.config import HVDServingConfig
from sglang_hvd.serving.factory import build_stepper
from sglang_hvd.serving.gate_swap import ABORT, CHECK, COMMIT, load_candidate
from sglang_hvd.serving.recorder import rank_path
from sglang_hvd.serving.step_timing import ProfileRefiner
from sglang_hvd.tiers import Tier, served_tiers
from sglang_hvd.verify import VerifyShape

from .checks import UnsupportedSetup
from .rows import FULL_MASK, QLEN_ONLY, Staging, cut_plain_rows, pack_plans, rewrite_tree_rows, substitute_chains, widen
from .step_clock import HOST, VERIFY, StepClock
from .tier_states import HVDDraftWorker, TierStates
from .tp import broadcast_step

log = logging.getLogger("sglang_hvd")
LOG_EVERY_S = 60.0  # a one-line HVD summary in the server log at most this often


def _custom_params(req) -> dict | None:
    custom = getattr(getattr(req, "sampling_params", None), "custom_params", None)
    return custom if isinstance(custom, dict) else None


def request_source(req) -> str | None:
    """A request's calibration bucket: its sampling params' ``custom_params["hvd_source"]`` (a string), else None."""
    custom = _custom_params(req)
    source = custom.get("hvd_source") if custom is not None else None
    return source if isinstance(source, str) and source else None


def request_control(req) -> int:
    """A request's control (``custom_params["hvd"]``, request_control.py); auto for a value
    the HTTP layer did not refuse (an engine caller's), with a warning."""
    try:
        return control_of(_custom_params(req))
    except ValueError as e:
        log.warning("HVD: request %s: %s; serving it as auto", getattr(req, "rid", "?"), e)
        return AUTO


def set_meta_info(req, figures: dict) -> None:
    """The request's HVD figures into its response's ``meta_info["hvd"]``, through SGLang's
    ``customized_info`` (per-token values: every token carries the same dict, so any
    chunk of a stream that ends the request carries it; the plugin's hook on the
    tokenizer manager keeps the last one, patches/plugin.py)."""
    info = req.customized_info if isinstance(getattr(req, "customized_info", None), dict) else {}
    info[META_KEY] = [figures] * (len(req.output_ids) + 1)
    req.customized_info = info


class HVDEagleWorkerV2(EAGLEWorkerV2):
    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self.hvd_config = HVDServingConfig.from_env()
        # a prefill's requests enter the stepper at the prefill, but not on a PD-disaggregated prefill server (they
        # decode elsewhere: nothing would ever take them out); a decode server takes each at its first decode step
        self._hvd_admit_at_prefill = str(getattr(server_args, "disaggregation_mode", "null") or "null") != "prefill"
        parallel = get_parallel()
        self._hvd_tp_size = getattr(parallel, "tp_size", 1) or 1
        self._hvd_tp_rank = getattr(parallel, "tp_rank", 0) or 0
        self._hvd_tp_group = getattr(parallel, "tp_group", None)
        # With --dp-size > 1 each DP rank is a scheduler of its own with its own stepper:
        # its own global cache, recorder file (recorder.rank_path) and figures.
        dp_size = int(getattr(server_args, "dp_size", 1) or 1)
        self._hvd_dp_rank = (getattr(parallel, "dp_rank", None) or 0) if dp_size > 1 else None
        self.hvd_shape = VerifyShape(topk=self.topk, steps=self.speculative_num_steps,
                                     nodes=self.speculative_num_draft_tokens)
        # The target's attention backend (and its own verify mask, if any) comes later; the
        # draft worker's layout is known now and rechecked each step (_hvd_write).
        if self.topk > 1 and int(self.draft_worker.tree_mask_mode) not in (QLEN_ONLY, FULL_MASK):
            raise UnsupportedSetup(f"HVD rewrites tree rows in the QLEN_ONLY and FULL_MASK mask layouts; this server "
                                   f"builds layout {int(self.draft_worker.tree_mask_mode)}: choose another "
                                   "--attention-backend, or serve a topk-1 gate")
        # Only TP rank 0 drafts and gates; other ranks receive its decision.
        model_path = getattr(server_args, "model_path", None)
        self.hvd = (build_stepper(self.hvd_config, self.hvd_shape, self._hvd_dp_rank, model_path=model_path)
                    if self._hvd_tp_rank == 0 else None)
        # The tiers every rank can switch to (the same tuple on every rank: the step's tier
        # travels as an index into it); one tier, the served shape, on a cost-blind server.
        cost_aware = self.hvd_config.profile is not None or self.hvd_config.tier_cycle
        self.hvd_tiers = served_tiers(self.hvd_config.tiers, self.hvd_shape) if cost_aware else (Tier(self.hvd_shape),)
        self._hvd_tier_rule = "cycle" if self.hvd_config.tier_cycle else ("cost" if cost_aware else "static")
        self._hvd_tier_states: TierStates | None = None  # built with SGLang's backends (init_cuda_graphs)
        if self._draft_worker is not None:  # skips EAGLE3's draft on steps no row verifies it
            self._draft_worker.__class__ = HVDDraftWorker
            self._draft_worker.hvd_owner = self
        self._hvd_staging = Staging()
        self._hvd_reqs: dict = {}  # rid -> Req, for requests the stepper tracks
        self._hvd_pending = None  # (rids, EAGLE3 chains or None) of the step being verified
        self._hvd_packed = None  # this step's packed plans, from its draft to its verify
        self._hvd_drafts_skipped = 0  # steps whose EAGLE3 draft forwards were skipped
        self._hvd_extends_skipped = 0  # steps whose draft extend was skipped (--hvd-skip-idle-extend)
        self._hvd_step_shape = None  # (tier, EAGLE3 drafted) of the step in flight, for its timing
        self._hvd_step_end = None  # perf_counter at the previous decode step's end (None: something else ran since)
        # Rank 0 times each decode step's parts: for --hvd-timings, and to refine a served profile.
        self._hvd_clock = self._hvd_timings = self._hvd_refiner = None
        if self.hvd is not None:
            rule = self.hvd.step
            if isinstance(rule, CostRule) and not self.hvd_config.tier_cycle and self.hvd_config.profile_refit:
                self._hvd_refiner = ProfileRefiner(rule.profile)
            if self.hvd_config.timings:
                path = rank_path(self.hvd_config.timings, self._hvd_dp_rank)
                try:
                    self._hvd_timings = open(path, "a", encoding="utf-8")
                except OSError as e:
                    raise UnsupportedSetup(f"--hvd-timings {path}: cannot write there ({e.strerror})") from None
            if self._hvd_refiner is not None or self._hvd_timings is not None:
                self._hvd_clock = StepClock(self.device)
                if self._draft_worker is not None:
                    self._draft_worker.hvd_clock = self._hvd_clock
        self._hvd_candidate = None  # (gate dir, gate) checked by a swap's first phase (hvd_swap)
        self._hvd_swaps = 0
        self._hvd_errors = 0
        self._hvd_error_logged = False
        self.hvd_step_us = 0.0
        self._hvd_last_log = time.monotonic()
        self._hvd_metrics = None
        if self.hvd is not None and getattr(get_observability(), "enable_metrics", False):
            try:
                from .metrics import HVDMetrics

                self._hvd_metrics = HVDMetrics(self._hvd_dp_rank or 0)
            except Exception as e:  # metrics are optional; serving is not
                log.warning("HVD Prometheus metrics unavailable (%s)", e)
        if self.hvd is not None:
            recorder = self.hvd.recorder
            log.info("HVD worker active%s: gate %s (digest %s, decision %s, threshold %g, EAGLE3 reserve %d, cache "
                     "siblings %d), verify rows of %s, drafter %s, recording %s",
                     "" if self._hvd_dp_rank is None else f" (DP rank {self._hvd_dp_rank})", self.hvd_config.gate,
                     self.hvd.gate.digest, self.hvd.gate.decision, self.hvd.threshold, self.hvd.rule.eagle_reserve,
                     self.hvd.rule.cache_siblings,
                     self.hvd_shape.describe(), self.hvd.drafter.name, recorder.path if recorder else "off")

    def init_cuda_graphs(self):
        super().init_cuda_graphs()
        if len(self.hvd_tiers) > 1 and self._draft_worker is not None:
            self._hvd_tier_states = TierStates(self, self.hvd_tiers, self.hvd_shape)
            log.info("HVD verify tiers: %s (%s)", ", ".join(t.name for t in self.hvd_tiers), self._hvd_tier_rule)

    # -- the step ----------------------------------------------------------------------

    def forward_batch_generation(self, batch, *args, **kwargs):
        if not self._hvd_eligible(batch):
            self._hvd_step_end = None  # the next decode step's wall would hold this forward too
            out = super().forward_batch_generation(batch, *args, **kwargs)
            if self.hvd is not None and self._hvd_admit_at_prefill and self._hvd_prefill(batch):
                self._hvd_admit_new(batch)
            return out
        clock = self._hvd_clock
        start = time.perf_counter()
        if clock is not None:
            clock.discard()  # marks of a prefill's draft extend
            clock.start(HOST)
        self._hvd_prepare(batch)
        if clock is not None:
            clock.stop(HOST)
        self.hvd_step_us = (time.perf_counter() - start) * 1e6
        self._hvd_report()
        out = super().forward_batch_generation(batch, *args, **kwargs)
        if clock is not None:
            self._hvd_timed(batch)
        return out

    def _hvd_timed(self, batch) -> None:
        """Close the step's timing: the timings file, the served profile's refinement. Its
        wall time runs from the previous decode step's end to this one's (the host's view:
        on a GPU, the verify's accepted lengths are read on the host within the step)."""
        now = time.perf_counter()
        wall_ms = math.nan if self._hvd_step_end is None else (now - self._hvd_step_end) * 1e3
        self._hvd_step_end = now
        tier, drafted = self._hvd_step_shape
        shape = self.hvd_tiers[tier].shape
        context = self.hvd.context_tokens  # the stepper's, of this step's batch (0 when it did not need it)
        if not context:
            context = sum(len(r.origin_input_ids) + len(r.output_ids) for r in batch.reqs)
        timing = self._hvd_clock.finish(batch=len(batch.reqs), tokens_per_row=1 if shape is None else shape.nodes,
                                        context_tokens=context, draft_steps=shape.steps if drafted else 0,
                                        topk=self.topk, wall_ms=wall_ms)
        if timing is None:
            return
        if self._hvd_timings is not None:
            try:
                self._hvd_timings.write(json.dumps(timing.to_json()) + "\n")
                self._hvd_timings.flush()
            except (OSError, ValueError) as e:  # a full disk stops the file, never the server
                log.error("HVD: --hvd-timings stopped (%s)", e)
                self._hvd_timings = None
        refiner = self._hvd_refiner
        if refiner is not None and refiner.add(timing) and isinstance(self.hvd.step, CostRule):
            self.hvd.step = dataclasses.replace(self.hvd.step, profile=refiner.profile)
            log.info("HVD: serving the profile refitted from %d timed steps (step error %.1f%%)", refiner.steps,
                     100 * refiner.profile.fit_error.get("step", math.nan))

    def _hvd_prepare(self, batch) -> None:
        """Plan the step (rank 0), agree on it (TP), switch to its tier and say whether
        EAGLE3 drafts; the plans wait in ``_hvd_packed`` for ``verify``."""
        served = self.hvd_tiers.index(Tier(self.hvd_shape))
        step = None
        try:
            step = self._hvd_plan(batch)
        except Exception as e:  # HVD must never take the server down: verify EAGLE3's rows
            self._hvd_pending = None
            self._hvd_failed(e)
        tier, eagle3, packed = step if step is not None else (served, True, None)
        if self._hvd_tp_size > 1:  # every rank, every decode step, whatever rank 0's step did
            tier, eagle3, packed = broadcast_step(tier, eagle3, packed, len(batch.reqs), self.hvd_shape.nodes,
                                                  self.hvd_tiers, self._hvd_tp_group, self._hvd_tp_rank, self.device)
        skip = not eagle3 and self.hvd_tiers[tier].speculates
        if self._hvd_tier_states is not None:
            try:
                self._hvd_tier_states.activate(self.hvd_tiers[tier])
            except Exception as e:  # a state that cannot be applied: the served shape, EAGLE3's rows
                self._hvd_failed(e)
                self._hvd_tier_states.activate(Tier(self.hvd_shape))
                tier, packed, skip, self._hvd_pending = served, None, False, None
        drafted = self.hvd_tiers[tier].speculates and not skip
        self._draft_worker.hvd_skip_draft = skip
        self._draft_worker.hvd_skip_extend = self.hvd_config.skip_idle_extend and not drafted
        self._hvd_drafts_skipped += skip
        self._hvd_extends_skipped += self.hvd_config.skip_idle_extend and not drafted
        self._hvd_packed = packed
        self._hvd_step_shape = (tier, drafted)

    def _hvd_admit_new(self, batch) -> None:
        """A prefill's new requests enter the stepper (their prompts indexed) now, after the
        prefill's forwards were launched: off the decode steps, and on a GPU while it runs.
        Requests that cannot decode (at most one new token: scoring, logprobs) are left out;
        those that ended at an earlier prefill leave first, so a server that only prefills
        holds at most one batch's worth."""
        try:
            self._hvd_collect_departed({req.rid for req in batch.reqs})
            for req in batch.reqs:
                limit = getattr(getattr(req, "sampling_params", None), "max_new_tokens", None)
                if req.rid not in self.hvd and (limit is None or limit > 1):
                    self._hvd_admit(req)
        except Exception as e:  # the request is admitted again at its first decode step
            self._hvd_failed(e)

    def _hvd_admit(self, req) -> None:
        self.hvd.sync(req.rid, req.origin_input_ids, req.output_ids, request_source(req), request_control(req))
        self._hvd_reqs[req.rid] = req

    @staticmethod
    def _hvd_prefill(batch) -> bool:
        """A batch of prefills only (a mixed batch's decode rows are not HVD's)."""
        return batch.forward_mode.is_extend() and not batch.forward_mode.is_idle() and bool(batch.reqs)

    @staticmethod
    def _hvd_eligible(batch) -> bool:
        """A decode step with requests: the same answer on every TP rank (it reads only the batch)."""
        return (not (batch.forward_mode.is_extend() or batch.is_extend_in_batch) and not batch.forward_mode.is_idle()
                and bool(batch.reqs))

    def verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None):
        packed, self._hvd_packed = self._hvd_packed, None
        spec = batch.spec_info
        if packed is not None and packed.shape[0] == len(batch.reqs) and int(spec.draft_token_num) > 1:
            try:
                if self._hvd_pending is not None and self.hvd.recorder is not None and self.topk == 1:
                    n = spec.draft_token_num  # the EAGLE3 chains, for the recorded trace
                    self._hvd_pending = (self._hvd_pending[0], spec.draft_token.view(len(batch.reqs), n)[:, 1:].cpu()
                                         .numpy())
                self._hvd_write(spec, packed)
            except Exception as e:
                self._hvd_pending = None
                self._hvd_failed(e)
        clock = self._hvd_clock
        if clock is None:
            return super().verify(batch, pp_proxy_tensors=pp_proxy_tensors, grammar_barrier=grammar_barrier)
        clock.start(VERIFY)
        out = super().verify(batch, pp_proxy_tensors=pp_proxy_tensors, grammar_barrier=grammar_barrier)
        clock.stop(VERIFY)
        return out

    def _hvd_failed(self, e: Exception) -> None:
        self._hvd_errors += 1
        if not self._hvd_error_logged:
            log.exception("HVD step failed (%s); this step verifies EAGLE3 drafts. Further failures are counted.", e)
            self._hvd_error_logged = True

    def _hvd_plan(self, batch):
        """Rank 0: (tier index, EAGLE3 drafts, packed row plans [bs, 2 N_tier] (pack_plans))
        of this step; None on other ranks."""
        self._hvd_pending = None
        if self.hvd is None:
            return None
        rids = [req.rid for req in batch.reqs]
        for req in batch.reqs:
            if req.rid in self.hvd:
                self.hvd.sync(req.rid, req.origin_input_ids, req.output_ids)
                self._hvd_reqs[req.rid] = req
            else:  # not admitted at its prefill (a mixed batch's, or a failed admission)
                self._hvd_admit(req)
        self._hvd_collect_departed(set(rids))
        plans = self.hvd.plan(rids)
        self._hvd_pending = (rids, None)
        tier = self.hvd_tiers.index(plans.tier if plans.tier is not None else Tier(self.hvd_shape))
        return tier, plans.eagle3, pack_plans(plans.cache_lens, plans.eagle_nodes, plans.cache_tokens,
                                              plans.cache_parents)

    def _hvd_write(self, spec, packed) -> None:
        if self.topk == 1:
            substitute_chains(spec.draft_token, spec.draft_token_num, packed, self._hvd_staging)
        elif rewrite_tree_rows(spec, packed, self._hvd_mask_mode(), self._hvd_staging):
            widen(spec)
        cut_plain_rows(spec.retrieve_next_token, packed)

    def _hvd_mask_mode(self) -> int:
        """The layout SGLang built this step's tree mask in (build_eagle_verify_input's rule)."""
        backend = getattr(self.target_worker.model_runner, "attn_backend", None)
        verify_mask = getattr(backend, "verify_mask", None)
        return int(verify_mask.mode if verify_mask is not None else self.draft_worker.tree_mask_mode)

    def _hvd_report(self) -> None:
        if self.hvd is None:
            return
        if self._hvd_metrics is not None:
            refined = self._hvd_refiner.summary() if self._hvd_refiner is not None else {}
            switches = self._hvd_tier_states.switches if self._hvd_tier_states is not None else 0
            self._hvd_metrics.update({**self.hvd.summary(), **refined, "drafts_skipped": self._hvd_drafts_skipped,
                                      "tier_switches": switches}, self.hvd.calibration)
        if time.monotonic() - self._hvd_last_log > LOG_EVERY_S:
            self._hvd_last_log = time.monotonic()
            s = self.hvd.summary()
            log.info("HVD: %d steps, cache pick rate %.2f (two-branch %.2f), mean accept cache %.2f / EAGLE3 %.2f, "
                     "%.0f us CPU per step, %d gate errors, %d step errors", s["steps"], s["cache_pick_rate"],
                     s["two_branch_rate"], s["cache_mean_accept"], s["eagle3_mean_accept"], s["cpu_us_per_step"],
                     s["gate_errors"], self._hvd_errors)

    def _hvd_collect_departed(self, present: set[str]) -> None:
        # Requests that finished without note_request_finished (e.g. at prefill) or were aborted.
        for rid in [r for r in self._hvd_reqs if r not in present]:
            req = self._hvd_reqs[rid]
            if req.finished():
                self._hvd_finish(rid)

    def _hvd_finish(self, rid: str) -> None:
        req = self._hvd_reqs.pop(rid, None)
        if self.hvd is None or req is None:
            return
        self.hvd.sync(rid, req.origin_input_ids, req.output_ids)
        # output_ids may run past a stop or max_new_tokens inside the last accepted run.
        figures = self.hvd.finish(rid, getattr(req, "output_ids_through_stop", None))
        if figures is not None:
            try:
                set_meta_info(req, figures)
            except Exception as e:  # figures are optional; the response is not
                log.warning("HVD: no meta_info figures for request %s (%s)", rid, e)

    # -- a hot gate swap (serving/gate_swap.py; patches/gate_endpoint.py drives it) ---------

    def hvd_swap(self, phase: str, gate_dir: str) -> tuple[bool, str]:
        """One phase of a gate swap on this rank: (passed, one line). Runs in the scheduler
        between two steps."""
        where = "" if self._hvd_dp_rank is None else f"DP rank {self._hvd_dp_rank}: "
        if self.hvd is None:  # TP ranks > 0 serve rank 0's plans
            return True, f"{where}TP rank {self._hvd_tp_rank} holds no gate"
        if phase == CHECK:
            self._hvd_candidate = None
            try:
                gate = load_candidate(self.hvd_config, self.hvd_shape, self.hvd.gate, gate_dir)
            except HvdInputError as e:
                log.warning("HVD gate swap refused: %s; gate %s keeps serving", e, self.hvd.gate.digest)
                return False, f"{where}{e}"
            self._hvd_candidate = (gate_dir, gate)
            return True, f"{where}gate {gate.digest} checked"
        if phase == COMMIT:
            candidate, self._hvd_candidate = self._hvd_candidate, None
            if candidate is None or candidate[0] != gate_dir:
                return False, f"{where}no checked gate {gate_dir} to serve (check it first)"
            old = self.hvd.gate.digest
            self.hvd.swap_gate(candidate[1])
            self._hvd_swaps += 1
            log.info("HVD: now serving gate %s (digest %s, was %s)", gate_dir, self.hvd.gate.digest, old)
            return True, f"{where}serving gate {self.hvd.gate.digest} (was {old})"
        if phase == ABORT:
            self._hvd_candidate = None
            return True, f"{where}gate {self.hvd.gate.digest} keeps serving"
        return False, f"{where}unknown gate swap phase {phase!r}"

    # -- SGLang's hooks ------------------------------------------------------------------

    def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size: int = 0) -> None:
        super().on_verify_complete_cpu(num_correct_drafts_per_req, batch_size=batch_size)
        pending, self._hvd_pending = self._hvd_pending, None
        if pending is None or self.hvd is None:
            return
        rids, eagle_rows = pending
        if len(num_correct_drafts_per_req) == len(rids):
            self.hvd.verified(rids, num_correct_drafts_per_req, eagle_rows)

    def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
        super().note_request_finished(rid=rid, natural_stop=natural_stop)
        self._hvd_finish(rid)

    def clear_cache_pool(self):
        result = super().clear_cache_pool()
        if self.hvd is not None:
            self.hvd.reset()
        self._hvd_reqs.clear()
        return result

    def hvd_stats(self) -> dict:
        stats = self.hvd.summary() if self.hvd is not None else {}
        gate = {}
        if self.hvd is not None:  # what an operator compares across the replicas of a fleet
            gate = {"gate_digest": self.hvd.gate.digest, "decision": self.hvd.gate.decision,
                    "gate_threshold": self.hvd.rule.threshold,
                    "gate_eagle_reserve": self.hvd.rule.eagle_reserve,
                    "gate_cache_siblings": self.hvd.rule.cache_siblings,
                    "verify_shape": self.hvd_shape.describe(), "modes": dict(self.hvd.stats.modes),
                    "draft_threads": getattr(self.hvd.drafter, "threads", 1),  # the threads a batch drafts on
                    # per mode, the tokens the cost rule expected its steps to emit and those they emitted
                    "mode_expected_tokens": {k: round(v, 1) for k, v in self.hvd.stats.mode_expected.items()},
                    "mode_emitted_tokens": dict(self.hvd.stats.mode_emitted)}
            step = self.hvd.step
            gate["mode_names"] = [m.name for m in step.modes] if isinstance(step, CostRule) else []
            if isinstance(step, CostRule):  # the profile and the EAGLE3 curve the decision values tiers by
                width = self.hvd.gate.curve_width  # how the rule prices a row's widths (payoff.py)
                gate.update(profile=step.profile.name, profile_kind=step.profile.kind,
                            eagle3_curve=step.eagle3_curve.text(),
                            eagle3_yield_scale=round(self.hvd.eagle3_yield.scale(), 4),
                            eagle3_yield_rows=self.hvd.eagle3_yield.rows,
                            payoff_model=f"curve of {width} widths" if width else "geometric")
            if self._hvd_refiner is not None:  # the profile in use and its error on the newest steps
                gate.update(self._hvd_refiner.summary())
            # predicted against realized payoff per source bucket (None: no online calibration)
            gate["calibration"] = self.hvd.calibration.summary() if self.hvd.calibration is not None else None
        out = {**stats, **gate, "step_errors": self._hvd_errors, "last_step_cpu_us": self.hvd_step_us,
               "dp_rank": self._hvd_dp_rank or 0, "tiers": [t.name for t in self.hvd_tiers],
               "tier_rule": self._hvd_tier_rule, "drafts_skipped": self._hvd_drafts_skipped,
               "extends_skipped": self._hvd_extends_skipped, "gate_swaps": self._hvd_swaps,
               "tier_switches": self._hvd_tier_states.switches if self._hvd_tier_states is not None else 0,
               # requests HVD still tracks: 0 on an idle server, or some request leaks
               "tracked_requests": len(self._hvd_reqs),
               "stepper_requests": len(self.hvd.running()) if self.hvd is not None else 0}
        # /server_info is strict JSON: a threshold of -inf (verify every cache draft) goes as "-inf"
        return {k: repr(v) if isinstance(v, float) and not math.isfinite(v) else v for k, v in out.items()}
