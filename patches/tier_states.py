"""Verify tiers in SGLang: one runtime state per tier, and steps without EAGLE3's draft.

A cost-aware server (``--hvd-profile``) verifies each decode step at one tier
(sglang_hvd/tiers.py): ``off`` (a plain step) or a narrower shape of the served topk.
Each tier needs its own attention backends (and CUDA graphs on a GPU) for its row width:
SGLang builds exactly such a set for ``--speculative-adaptive``
(``EAGLEWorkerV2.build_adaptive_runtime_state`` -> ``SpecRuntimeState``) and swaps it in
with ``apply_runtime_state``. ``TierStates`` builds one per tier with those methods and
activates the step's tier. Two SGLang rules are extended, not copied:

- ``apply_runtime_state`` returns early when the steps are unchanged (its tiers differ in
  steps only); HVD's tiers may share steps with different widths (``4-1-2``, ``4-1-4``),
  so ``activate`` keys by (steps, nodes) and makes SGLang's guard let the switch through.
- SGLang's adaptive rule is topk-1 only; nothing in the state build reads topk, and
  HVD's topk > 1 tiers keep the served topk (tiers.serving_problem), so the same states
  serve trees. The ``off`` tier is SGLang's own steps-0 state (a one-node verify of the
  bonus token; the draft extend still runs, keeping the draft model's KV warm).

A step whose plan verifies no EAGLE3 node (a cache-only step: every row holds a cache
draft or none) skips EAGLE3's draft forwards: ``HVDDraftWorker.draft`` then builds the
verify input with SGLang's own ``build_eagle_verify_input`` from a placeholder draft of
the tier's shape (every node the bonus token) instead of running the draft model, and the
HVD worker writes the cache rows over it as on any step. A row left with placeholder
tokens is verified losslessly (greedy verify rejects a wrong token), at no extra width.
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.speculative import eagle_worker_v2 as ew
from sglang.srt.speculative.adaptive_runtime_state import SpecRuntimeState

from sglang_hvd.tiers import Tier
from sglang_hvd.verify import VerifyShape

from .step_clock import DRAFT, EXTEND

SWITCH_LOG = "Switch adaptive runtime state"  # SGLang's info line per switch: every step under HVD


class _QuietSwitches(logging.Filter):
    """Drops SGLang's per-switch log line (HVD counts its switches in /server_info)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(SWITCH_LOG)


def placeholder_draft(bonus: torch.Tensor, topk: int, steps: int, nodes: int):
    """``(parent_list, top_scores_index, draft_tokens)`` shaped as EAGLE3's ``draft_forward``
    returns them for a tree of ``topk``, ``steps`` and ``nodes`` over ``bonus`` [bs], every
    draft token the row's bonus token. Its tree: the first ``nodes - 1`` candidates in
    SGLang's order (the root's ``topk`` children, then each step's expansions of the
    previous step's first ``topk`` candidates), so every node's parent is in the tree."""
    bs = bonus.shape[0]
    dev = bonus.device
    if topk == 1:
        width = steps if steps > 1 else 0
        parents = torch.arange(-1, width - 1, dtype=torch.long, device=dev).repeat(bs, 1)
        index = torch.arange(steps, dtype=torch.long, device=dev).repeat(bs, 1)
        tokens = bonus.to(torch.long).view(bs, 1).repeat(1, steps)
        return parents, index, tokens
    lists = [torch.arange(-1, topk, dtype=torch.long, device=dev).repeat(bs, 1)]
    for i in range(1, steps):
        lists.append((torch.arange(topk, dtype=torch.long, device=dev) + topk * topk * (i - 1) + topk).repeat(bs, 1))
    parents = torch.cat(lists[:-1], dim=1) if steps > 1 else torch.empty(bs, 0, dtype=torch.long, device=dev)
    index = torch.arange(nodes - 1, dtype=torch.long, device=dev).repeat(bs, 1)
    tokens = bonus.to(torch.long).view(bs, 1).repeat(1, nodes - 1)
    return parents, index, tokens


class HVDDraftWorker(ew.EagleDraftWorker):
    """SGLang's EAGLE3 draft worker (its class swapped in place: no new state but two
    attributes the HVD worker sets) whose ``draft`` skips the draft model when
    ``hvd_skip_draft`` says so, and whose draft and extend forwards ``hvd_clock`` times
    (patches/step_clock.py)."""

    hvd_skip_draft = False
    hvd_skip_extend = False  # this step's draft extend is skipped (--hvd-skip-idle-extend)
    hvd_owner = None  # the HVD worker (its SGLang stub for a skipped extend)
    hvd_clock = None

    def draft(self, batch, *, with_topology: bool = False):
        if not self.hvd_skip_draft or with_topology or batch.forward_mode.is_idle():
            clock = self.hvd_clock
            if clock is None:
                return super().draft(batch, with_topology=with_topology)
            clock.start(DRAFT)
            out = super().draft(batch, with_topology=with_topology)
            clock.stop(DRAFT)
            return out
        spec = batch.spec_info
        parents, index, tokens = placeholder_draft(spec.bonus_tokens, self.topk, self.speculative_num_steps,
                                                   self.speculative_num_draft_tokens)
        return ew.build_eagle_verify_input(
            batch, spec, parents, index, tokens, None, target_worker=self.target_worker, topk=self.topk,
            num_steps=self.speculative_num_steps, num_draft_tokens=self.speculative_num_draft_tokens,
            tree_mask_mode=self.tree_mask_mode, device=self.device)


    def _draft_extend_for_decode(self, batch, batch_result, *args, **kwargs):
        if self.hvd_skip_extend and self.hvd_owner is not None:
            # SGLang's own stand-in for a skipped extend (its steps-0 path under
            # SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND): shape-valid next-draft inputs
            self.hvd_owner._stub_skipped_draft_extend(batch, batch_result)
            return None
        return self._timed_extend(batch, batch_result, *args, **kwargs)

    def _timed_extend(self, *args, **kwargs):
        clock = self.hvd_clock
        if clock is None:
            return super()._draft_extend_for_decode(*args, **kwargs)
        clock.start(EXTEND)
        out = super()._draft_extend_for_decode(*args, **kwargs)
        clock.stop(EXTEND)
        return out


class TierStates:
    """The runtime state of each tier of ``worker`` (an EAGLEWorkerV2 after its backends
    exist), built once; ``activate(tier)`` swaps one in."""

    def __init__(self, worker, tiers: tuple[Tier, ...], served: VerifyShape):
        self.worker = worker
        self.switches = 0
        self._states: dict[tuple[int, int], SpecRuntimeState] = {}
        dw = worker._draft_worker
        with ew.draft_tp_context(dw.parallel_layout), ew.speculative_moe_backend_context(), \
                ew.speculative_moe_a2a_backend_context():
            self._states[self.key(Tier(served))] = SpecRuntimeState(
                speculative_num_steps=worker.speculative_num_steps,
                speculative_num_draft_tokens=worker.speculative_num_draft_tokens,
                draft_attn_backend=dw.draft_attn_backend, cuda_graph_runner=dw.cuda_graph_runner,
                target_attn_backend=worker._target_worker.model_runner.attn_backend,
                target_graph_runner=worker._target_worker.model_runner.decode_cuda_graph_runner,
                draft_extend_attn_backend=dw.draft_extend_attn_backend,
                cuda_graph_runner_for_draft_extend=dw.cuda_graph_runner_for_draft_extend)
            for tier in tiers:
                key = self.key(tier)
                if key not in self._states:
                    self._states[key] = worker.build_adaptive_runtime_state(
                        speculative_num_steps=key[0], speculative_num_draft_tokens=key[1], cuda_graph_bs=None)
        logging.getLogger(ew.__name__).addFilter(_QuietSwitches())

    @staticmethod
    def key(tier: Tier) -> tuple[int, int]:
        """(steps, nodes) of SGLang's state for ``tier``: ``off`` is SGLang's steps-0 state."""
        return (0, 1) if tier.shape is None else (tier.shape.steps, tier.shape.nodes)

    def active(self) -> tuple[int, int]:
        return (self.worker.speculative_num_steps, self.worker.speculative_num_draft_tokens)

    def activate(self, tier: Tier) -> None:
        key = self.key(tier)
        if key == self.active():
            return
        if key[0] == self.worker.speculative_num_steps:  # SGLang's guard compares steps alone
            self.worker.speculative_num_steps = -1
        self.worker.apply_runtime_state(self._states[key])
        self.switches += 1
