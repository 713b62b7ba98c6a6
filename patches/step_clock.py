"""Timing a decode step's parts on the serving hot path, without adding a host sync.

The HVD worker brackets each part of a decode step -- HVD's own host work, EAGLE3's draft
forwards, the target's verify, the draft model's extend -- with ``start(part)`` /
``stop(part)`` and closes the step with ``finish(...)``, which returns a StepTiming
(sglang_hvd/serving/step_timing.py) or None:

- on the CPU each bracket reads ``time.perf_counter`` (the forwards run synchronously),
  and ``finish`` returns the step just run;
- on a GPU each bracket records a CUDA event on the current stream; ``finish`` returns
  the *previous* step, whose events completed before the scheduler read this step's
  accepted lengths on the host (checked with ``query()``: a step whose events are not
  done is dropped, never waited for). HVD's host part is always a perf counter.
"""

from __future__ import annotations

import math
import time

import torch

from sglang_hvd.serving.step_timing import StepTiming

HOST, DRAFT, VERIFY, EXTEND = "host", "draft", "verify", "extend"


class StepClock:
    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self._marks: dict[str, list] = {}  # part -> [start, stop] (seconds, or CUDA events)
        self._pending: tuple[dict, dict] | None = None  # GPU: the previous step's marks and shape

    def start(self, part: str) -> None:
        if self.cuda and part != HOST:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._marks[part] = [ev, None]
        else:
            self._marks[part] = [time.perf_counter(), None]

    def stop(self, part: str) -> None:
        mark = self._marks.get(part)
        if mark is None:
            return
        if self.cuda and part != HOST:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            mark[1] = ev
        else:
            mark[1] = time.perf_counter()

    def discard(self) -> None:
        """Forget the current step's marks (a step that was not a decode step)."""
        self._marks = {}

    def finish(self, **shape) -> StepTiming | None:
        """Close the step of ``shape`` (StepTiming's batch, tokens_per_row, context_tokens,
        draft_steps, topk, wall_ms); returns a completed step's timing, or None."""
        marks, self._marks = self._marks, {}
        if not self.cuda:
            return _timing(shape, {p: (m[1] - m[0]) * 1e3 for p, m in marks.items() if m[1] is not None})
        done, self._pending = self._pending, (marks, shape)
        if done is None:
            return None
        marks, shape = done
        ms = {}
        for part, (a, b) in marks.items():
            if b is None:
                continue
            if part == HOST:
                ms[part] = (b - a) * 1e3
            elif b.query():
                ms[part] = a.elapsed_time(b)
            else:
                return None  # not done yet: drop the step rather than wait
        return _timing(shape, ms)


def _timing(shape: dict, ms: dict[str, float]) -> StepTiming | None:
    if VERIFY not in ms:
        return None
    return StepTiming(verify_ms=ms[VERIFY], draft_ms=ms.get(DRAFT, math.nan), extend_ms=ms.get(EXTEND, math.nan),
                      host_ms=ms.get(HOST, math.nan), **shape)
