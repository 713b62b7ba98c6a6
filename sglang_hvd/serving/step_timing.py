"""Measured decode steps, and the step-time profile a server serves with refined from them.

The HVD worker times each decode step's parts (patches/worker.py: perf counters on the
CPU; on a GPU, CUDA events read a step late, so the hot path adds no host sync) and
hands them here as StepTiming records. ProfileRefiner keeps the newest ones and

- reports how far the served profile's predictions are from them: mean |predicted /
  measured - 1| per term (verify, draft, extend, host) and for the whole step;
- every ``refit_every`` steps fits a profile to them (step_profile.fit_*), and serves it
  instead only when the samples span enough shapes to fit a term (a term that cannot be
  fitted keeps the served constants) and the fit predicts the recent steps better;
  otherwise the served terms stay and only its untimed part follows the steps' median.

The decision (cost_rule.CostRule) reads ``refiner.profile``; the stepper swaps its rule
between steps when the profile changes (``version`` counts the swaps).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os

import numpy as np

from ..errors import HvdInputError
from ..step_profile import (
    DraftSample,
    ExtendSample,
    HostCost,
    StepProfile,
    VerifySample,
    fit_draft,
    fit_extend,
    fit_verify,
    relative_error,
)

TERMS = ("verify", "draft", "extend", "host", "step")


@dataclasses.dataclass(frozen=True, slots=True)
class StepTiming:
    """One decode step as measured. ``*_ms`` is nan for a part not run or not timed."""

    batch: int
    tokens_per_row: int  # N verified per row (1: a plain step)
    context_tokens: int  # the batch's context, all rows together
    verify_ms: float
    draft_steps: int = 0  # EAGLE3 draft steps run this step (0: no draft)
    topk: int = 1
    draft_ms: float = math.nan
    extend_ms: float = math.nan
    host_ms: float = math.nan  # HVD's own host time (drafts, decision)
    # the whole step as the host saw it: from the previous decode step's end to this one's (the scheduler's
    # work between them included); nan after a prefill or any other forward in between. Not fitted:
    # wall_ms - untimed(...) is what the profile does not time.
    wall_ms: float = math.nan

    def to_json(self) -> dict:
        """A line of a timings file (nan: null)."""
        return {f.name: (None if isinstance(v := getattr(self, f.name), float) and math.isnan(v) else v)
                for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, d: dict) -> StepTiming:
        kw = {}
        for f in dataclasses.fields(cls):
            v = d.get(f.name)
            kw[f.name] = (math.nan if v is None else float(v)) if f.type == "float" else int(v)
        return cls(**kw)


def read_timings(path: str, skip: int = 0) -> list[StepTiming]:
    """The steps of a timings file (``--hvd-timings``, one JSON line each) after its first
    ``skip`` lines; a torn last line (a server still writing) is left out."""
    if not os.path.exists(path):
        raise HvdInputError(f"{path}: no timings file (start the server with --hvd-timings {path})")
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i < skip or not line.endswith("\n"):
                continue
            try:
                out.append(StepTiming.from_json(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise HvdInputError(f"{path}:{i + 1}: not a step timing ({e})") from None
    return out


def cell_medians(timings, min_steps: int = 1) -> list[StepTiming]:
    """One step per grid cell (batch, tokens per row, draft steps, topk, context within a
    factor of 2): each part's median over the cell's steps. Fitting medians keeps a
    paused step (garbage collection, another process) from pulling a constant. Cells of
    fewer than ``min_steps`` steps are left out: under load at concurrency C, the batch
    sizes between two levels are only seen for a step or two while requests arrive or
    finish, and such a cell's "median" is one noisy sample."""
    cells: dict[tuple, list[StepTiming]] = collections.defaultdict(list)
    for t in timings:
        cells[(t.batch, t.tokens_per_row, t.draft_steps, t.topk, int(math.log2(max(t.context_tokens, 1))))].append(t)

    def med(values):
        v = [x for x in values if math.isfinite(x)]
        return float(np.median(v)) if v else math.nan

    return [StepTiming(b, n, int(np.median([t.context_tokens for t in ts])), med(t.verify_ms for t in ts), s, k,
                       med(t.draft_ms for t in ts), med(t.extend_ms for t in ts), med(t.host_ms for t in ts),
                       med(t.wall_ms for t in ts))
            for (b, n, s, k, _), ts in sorted(cells.items()) if len(ts) >= min_steps]


def predicted(profile: StepProfile, t: StepTiming) -> dict[str, float]:
    """What ``profile`` says each timed part of step ``t`` costs (the parts ``t`` timed)."""
    out = {"verify": profile.verify.ms(t.batch, t.tokens_per_row, t.context_tokens)}
    if t.draft_steps and math.isfinite(t.draft_ms):
        out["draft"] = profile.eagle3.ms(t.batch, t.draft_steps, t.topk, t.context_tokens)
    if math.isfinite(t.extend_ms):
        out["extend"] = profile.eagle3.extend(t.batch, t.context_tokens)
    if math.isfinite(t.host_ms):
        out["host"] = profile.hvd_cpu.ms(t.batch)
    out["step"] = sum(out.values())
    return out


def measured(t: StepTiming) -> dict[str, float]:
    out = {"verify": t.verify_ms}
    if t.draft_steps and math.isfinite(t.draft_ms):
        out["draft"] = t.draft_ms
    if math.isfinite(t.extend_ms):
        out["extend"] = t.extend_ms
    if math.isfinite(t.host_ms):
        out["host"] = t.host_ms
    out["step"] = sum(out.values())
    return out


def untimed(timings) -> tuple[float, float, int]:
    """What the timed parts miss: ``(median ms, median share of the wall, steps)`` over the
    steps with a wall time (nan, nan, 0 without any). The profile prices the parts; this
    is the rest of a step (SGLang's scheduler and speculative bookkeeping around the
    forwards), paid by every step of the server whatever its tier."""
    rest, share = [], []
    for t in timings:
        if math.isfinite(t.wall_ms) and t.wall_ms > 0:
            rest.append(max(t.wall_ms - measured(t)["step"], 0.0))
            share.append(rest[-1] / t.wall_ms)
    if not rest:
        return math.nan, math.nan, 0
    return float(np.median(rest)), float(np.median(share)), len(rest)


def errors(profile: StepProfile, timings) -> dict[str, float]:
    """Mean |predicted / measured - 1| per term over ``timings`` (terms never timed: absent)."""
    pred: dict[str, list[float]] = collections.defaultdict(list)
    meas: dict[str, list[float]] = collections.defaultdict(list)
    for t in timings:
        m = measured(t)
        for term, v in predicted(profile, t).items():
            if m[term] > 0:
                pred[term].append(v)
                meas[term].append(m[term])
    return {term: relative_error(pred[term], meas[term]) for term in TERMS if meas.get(term)}


def fittable(timings) -> set[str]:
    """The terms ``timings`` span enough shapes to fit: verify, 3 distinct B * N; draft, 2
    distinct step counts; extend, any timed; host, 2 distinct batches."""
    out = set()
    if len({t.batch * t.tokens_per_row for t in timings if t.verify_ms > 0}) >= 3:
        out.add("verify")
    if len({t.draft_steps for t in timings if t.draft_steps and t.draft_ms > 0}) >= 2:
        out.add("draft")
    if any(t.extend_ms > 0 for t in timings):
        out.add("extend")
    if len({t.batch for t in timings if t.host_ms > 0}) >= 2:
        out.add("host")
    return out


def fit_profile(base: StepProfile, timings, name: str) -> StepProfile:
    """``base`` with each term refitted where ``timings`` span enough shapes (``fittable``;
    the host's drafts share kept from ``base``; the extend's constants as far as its
    samples span batch and context, step_profile.fit_extend), and the untimed part of a
    step the median of the steps with a wall time (``untimed``). Others keep ``base``'s
    constants."""
    verify, eagle3, host = base.verify, base.eagle3, base.hvd_cpu
    terms = fittable(timings)
    if "verify" in terms:
        verify = fit_verify([VerifySample(t.batch, t.tokens_per_row, t.context_tokens, t.verify_ms) for t in timings
                             if t.verify_ms > 0])
    if "draft" in terms:  # the draft forwards refitted; the extend's constants stay the served ones until fit_extend
        eagle3 = fit_draft([DraftSample(t.batch, t.draft_steps, t.topk, t.context_tokens, t.draft_ms)
                            for t in timings if t.draft_steps and t.draft_ms > 0], eagle3.extend_ms,
                           eagle3.extend_per_token_ms, eagle3.extend_per_context_token_ms)
    if "extend" in terms:
        eagle3 = fit_extend([ExtendSample(t.batch, t.context_tokens, t.extend_ms) for t in timings if t.extend_ms > 0],
                            eagle3)
    hs = [t for t in timings if t.host_ms > 0]
    if "host" in terms:
        b = np.array([t.batch for t in hs], dtype=np.float64)
        y = np.array([t.host_ms for t in hs])
        slope, intercept = np.polyfit(b, y, 1) if b.std() > 0 else (0.0, float(y.mean()))
        per_row = max(float(slope), 0.0)
        share = base.hvd_cpu.draft_per_row_ms / max(base.hvd_cpu.draft_per_row_ms + base.hvd_cpu.decide_per_row_ms,
                                                    1e-12)
        host = HostCost(max(float(intercept), 0.0), per_row * share, per_row * (1 - share))
    rest_ms, _, walled = untimed(timings)
    fitted = dataclasses.replace(base, name=name, kind="measured", verify=verify, eagle3=eagle3, hvd_cpu=host,
                                 untimed_ms=rest_ms if walled else base.untimed_ms,
                                 note=f"refitted online from {len(timings)} served steps over {base.describe()}")
    return dataclasses.replace(fitted, fit_error=errors(fitted, timings))


class ProfileRefiner:
    """The served profile, its error on the newest steps, and its online refit."""

    def __init__(self, profile: StepProfile, window: int = 2048, refit_every: int = 512, refit: bool = True):
        if window < 16 or refit_every < 1:
            raise ValueError(f"window must be >= 16 and refit_every >= 1, got {window} and {refit_every}")
        self.base = profile
        self.profile = profile
        self.refit = refit
        self.refit_every = refit_every
        self.version = 0  # profiles served after the first
        self._timings: collections.deque[StepTiming] = collections.deque(maxlen=window)
        self._since_fit = 0
        self.steps = 0

    def add(self, t: StepTiming) -> bool:
        """One measured step; True when the served profile changed."""
        self._timings.append(t)
        self.steps += 1
        self._since_fit += 1
        if not self.refit or self._since_fit < self.refit_every:
            return False
        self._since_fit = 0
        candidate = fit_profile(self.base, self._timings, f"{self.base.name}+online")
        now = errors(self.profile, self._timings).get("step", math.inf)
        if candidate.fit_error.get("step", math.inf) < now:
            self.profile = candidate
        elif candidate.untimed_ms != self.profile.untimed_ms:  # the terms stay, the untimed part follows the steps
            self.profile = dataclasses.replace(self.profile, untimed_ms=candidate.untimed_ms)
        else:
            return False
        self.version += 1
        return True

    def summary(self) -> dict:
        """For /server_info: the profile in use and how well it predicts the newest steps."""
        err = errors(self.profile, self._timings)
        rest_ms, rest_share, walled = untimed(self._timings)
        return {"profile": self.profile.name, "profile_kind": self.profile.kind, "profile_version": self.version,
                "profile_steps_timed": self.steps,
                **{f"profile_error_{term}": round(v, 4) for term, v in err.items()},
                # what no profile term times (SGLang's scheduler around the forwards), newest steps' median
                **({"profile_untimed_ms": round(rest_ms, 3), "profile_untimed_share": round(rest_share, 4)}
                   if walled else {})}
