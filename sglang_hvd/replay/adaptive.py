"""SGLang's adaptive EAGLE3 (``--speculative-adaptive``, sglang 0.5.23), modelled for
replay: the baseline cost-aware HVD has to beat under load.

SGLang's rule (sglang/srt/speculative/adaptive_spec_params.py, read on the 0.5.23 wheel;
this is our own implementation of the behaviour it documents): topk 1 only; per
batch-size slot (the largest configured batch size <= the batch) an exponential moving
average of the accepted draft tokens per request (alpha 0.2, fed only while the slot
speculates) picks ``num_steps`` among the slot's candidates, a verify of steps + 1
tokens, 0 meaning no speculation. After 10 warm-up batches it revisits the choice every
5 batches: from 0 it probes the next candidate; else it steps down while the EMA is at
most (previous candidate - 0.5 + down hysteresis; 0.5 + hysteresis toward 0) and, if it
did not step down, up while the EMA exceeds (current - 0.5 + up hysteresis). Default
slots: batch 1 steps {1, 3, 5, 7} (down hysteresis -0.25), 8 {0, 1, 3}, 32 {0, 1},
64 {0}. CUDA-graph batch padding is left out (replay has no graphs).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence

import numpy as np

from ..decision import BatchPlan
from ..step_profile import EXTEND_EVERY_STEP, HOST_NONE
from ..tiers import Tier
from ..verify import VerifyShape


@dataclasses.dataclass(frozen=True, slots=True)
class AdaptiveSlot:
    candidate_steps: tuple[int, ...]
    up_hysteresis: float = 0.0
    down_hysteresis: float = 0.0


DEFAULT_SLOTS = {1: AdaptiveSlot((1, 3, 5, 7), 0.0, -0.25), 8: AdaptiveSlot((0, 1, 3)), 32: AdaptiveSlot((0, 1)),
                 64: AdaptiveSlot((0,))}
EMA_ALPHA, WARMUP_BATCHES, UPDATE_INTERVAL = 0.2, 10, 5


class _SlotState:
    __slots__ = ("slot", "steps", "ema", "batches")

    def __init__(self, slot: AdaptiveSlot, initial_steps: int):
        self.slot = slot
        c = slot.candidate_steps
        self.steps = initial_steps if initial_steps in c else c[len(c) // 2]
        self.ema = float(self.steps - 1)
        self.batches = 0

    def update(self, accepted: Sequence[int]) -> None:
        if not len(accepted):
            return
        if self.steps > 0:
            self.ema = (1 - EMA_ALPHA) * self.ema + EMA_ALPHA * float(np.mean(accepted))
        self.batches += 1
        if self.batches > WARMUP_BATCHES and (self.batches - WARMUP_BATCHES) % UPDATE_INTERVAL == 0:
            self._revisit()

    def _revisit(self) -> None:
        c = self.slot.candidate_steps
        i = c.index(self.steps)
        if self.steps == 0:  # probe the next candidate
            i = min(i + 1, len(c) - 1)
            if c[i] > 0 and self.ema < 0:
                self.ema = float(c[i] - 1)
            self.steps = c[i]
            return
        start = i
        while i > 0:
            below = c[i - 1]
            drop = (0.5 if below == 0 else below - 0.5) + self.slot.down_hysteresis
            if self.ema > drop:
                break
            i -= 1
        if i == start:
            while i < len(c) - 1 and self.ema > c[i] - 0.5 + self.slot.up_hysteresis:
                i += 1
        self.steps = c[i]


class AdaptiveEagle3Planner:
    """A fleet-replay planner (replay/fleet.py) serving EAGLE3 chains the way SGLang's
    adaptive controller does: no cache drafts, one tier per step by the batch's slot."""

    host = HOST_NONE
    extend = EXTEND_EVERY_STEP  # SGLang runs the draft extend at steps 0 too

    def __init__(self, initial_steps: int = 3, slots: dict[int, AdaptiveSlot] | None = None):
        slots = DEFAULT_SLOTS if slots is None else slots
        self._keys = sorted(slots)
        self._slots = {k: _SlotState(slots[k], initial_steps) for k in self._keys}
        self.modes: dict[str, int] = {}

    def _route(self, batch: int) -> _SlotState:
        return self._slots[self._keys[max(0, bisect.bisect_right(self._keys, batch) - 1)]]

    def sync(self, rid: str, prompt_ids, output_ids, source: str | None = None) -> None:
        pass

    def finish(self, rid: str) -> None:
        pass

    def plan(self, rids: Sequence[str]) -> BatchPlan:
        steps = self._route(len(rids)).steps
        plan = (BatchPlan.plain(len(rids)) if steps == 0 else
                BatchPlan.all_eagle3(len(rids), steps, Tier(VerifyShape(1, steps, steps + 1))))
        self.modes[plan.tier.name] = self.modes.get(plan.tier.name, 0) + 1
        return plan

    def verified(self, rids: Sequence[str], accepts: Sequence[int]) -> None:
        self._route(len(rids)).update(accepts)
