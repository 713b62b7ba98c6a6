"""The HVD worker: SGLang's EAGLEWorkerV2 with cache drafts swapped into chosen rows.

Per decode step, before SGLang's own verify (``verify`` is the one override on the hot
path): bring the cache drafter up to date with every request of the batch, let the
stepper (drafter + features + gate, sglang_hvd/serving/stepper.py) choose rows, and
write the chosen cache drafts into ``batch.spec_info.draft_token`` in place
(patches/rows.py). Verification, KV handling, grammar, logprobs and EAGLE3's own
draft-extend then run unchanged. Accepted counts come back through
``on_verify_complete_cpu``; finished requests leave through ``note_request_finished``
(their response stays in the drafter's global cache); ``clear_cache_pool`` resets.

With tensor parallelism only TP rank 0 runs the stepper; its decision is broadcast over
SGLang's TP group so that every rank verifies identical rows. Anything that goes wrong in
HVD's part of a step is logged once, counted, and that step verifies EAGLE3's rows.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
from sglang.srt.runtime_context import get_observability, get_parallel
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

from sglang_hvd.serving.config import HVDServingConfig
from sglang_hvd.serving.factory import build_stepper

from .rows import substitute_rows

log = logging.getLogger("sglang_hvd")
LOG_EVERY_S = 60.0  # a one-line HVD summary in the server log at most this often


class HVDEagleWorkerV2(EAGLEWorkerV2):
    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self.hvd_config = HVDServingConfig.from_env()
        parallel = get_parallel()
        self._hvd_tp_size = getattr(parallel, "tp_size", 1) or 1
        self._hvd_tp_rank = getattr(parallel, "tp_rank", 0) or 0
        self._hvd_tp_group = getattr(parallel, "tp_group", None)
        # Only TP rank 0 drafts and gates; other ranks receive its decision.
        self.hvd = build_stepper(self.hvd_config) if self._hvd_tp_rank == 0 else None
        self._hvd_reqs: dict = {}  # rid -> Req, for requests the stepper tracks
        self._hvd_pending: tuple[list[str], np.ndarray | None] | None = None
        self._hvd_errors = 0
        self._hvd_error_logged = False
        self.hvd_step_us = 0.0
        self._hvd_last_log = time.monotonic()
        self._hvd_metrics = None
        if self.hvd is not None and getattr(get_observability(), "enable_metrics", False):
            try:
                from .metrics import HVDMetrics

                self._hvd_metrics = HVDMetrics()
            except Exception as e:  # metrics are optional; serving is not
                log.warning("HVD Prometheus metrics unavailable (%s)", e)
        if self.hvd is not None:
            log.info("HVD worker active: gate %s (threshold %g), drafter %s, recording %s",
                     self.hvd_config.gate, self.hvd.threshold, self.hvd.drafter.name,
                     self.hvd_config.record_traces or "off")

    # -- the step ----------------------------------------------------------------------

    def verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None):
        try:
            self._hvd_prepare(batch)
        except Exception as e:  # HVD must never take the server down: verify EAGLE3's rows
            self._hvd_pending = None
            self._hvd_errors += 1
            if not self._hvd_error_logged:
                log.exception("HVD step failed (%s); this step verifies EAGLE3 drafts. Further failures are counted.", e)
                self._hvd_error_logged = True
        return super().verify(batch, pp_proxy_tensors=pp_proxy_tensors, grammar_barrier=grammar_barrier)

    def _hvd_prepare(self, batch) -> None:
        self._hvd_pending = None
        spec = batch.spec_info
        n = int(getattr(spec, "draft_token_num", 0) or 0)
        if batch.forward_mode.is_idle() or n <= 1 or not batch.reqs:
            return
        start = time.perf_counter()
        rids = [req.rid for req in batch.reqs]
        bs = len(rids)
        use = np.zeros(bs, dtype=bool)
        tokens = np.zeros((bs, n - 1), dtype=np.int64)
        lens = np.zeros(bs, dtype=np.int64)
        eagle_rows = None
        if self.hvd is not None:
            for req in batch.reqs:
                self.hvd.sync(req.rid, req.origin_input_ids, req.output_ids)
                self._hvd_reqs[req.rid] = req
            self._hvd_collect_departed(set(rids))
            decision = self.hvd.decide(rids, n - 1)
            use, tokens, lens = decision.use_cache, decision.cache_tokens.astype(np.int64), decision.cache_lens.astype(np.int64)
            if self.hvd.recorder is not None:
                eagle_rows = spec.draft_token.view(bs, n)[:, 1:].cpu().numpy()
        if self._hvd_tp_size > 1:
            use, tokens, lens = self._hvd_broadcast(use, tokens, lens)
        substitute_rows(spec.draft_token, n, use, tokens, lens)
        self._hvd_pending = (rids, eagle_rows)
        self.hvd_step_us = (time.perf_counter() - start) * 1e6
        if self._hvd_metrics is not None:
            self._hvd_metrics.update(self.hvd.summary())
        if self.hvd is not None and time.monotonic() - self._hvd_last_log > LOG_EVERY_S:
            self._hvd_last_log = time.monotonic()
            s = self.hvd.summary()
            log.info("HVD: %d steps, cache pick rate %.2f, mean accept cache %.2f / EAGLE3 %.2f, %.0f us CPU per step, "
                     "%d gate errors, %d step errors", s["steps"], s["cache_pick_rate"], s["cache_mean_accept"],
                     s["eagle3_mean_accept"], s["cpu_us_per_step"], s["gate_errors"], self._hvd_errors)

    def _hvd_broadcast(self, use, tokens, lens):
        """Rank 0's decision to every TP rank, as one int64 tensor [bs, 2 + (N-1)]."""
        packed = np.concatenate([use[:, None].astype(np.int64), lens[:, None], tokens], axis=1)
        t = torch.from_numpy(packed).to(self.device)
        self._hvd_tp_group.broadcast(t, src=0)
        packed = t.cpu().numpy()
        return packed[:, 0].astype(bool), packed[:, 2:], packed[:, 1]

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
        self.hvd.finish(rid, getattr(req, "output_ids_through_stop", None))

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
        return {**stats, "step_errors": self._hvd_errors, "last_step_cpu_us": self.hvd_step_us}
