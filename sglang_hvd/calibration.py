"""Online calibration: the gate's predicted payoff mapped to the payoff the verifies realize.

The gate is trained offline on other models and workloads; where it serves, its predicted
accept_len drifts from what cache drafts really get. The serving stepper (and fleet replay,
which runs it; and replay's ``hvd_online`` policy) labels every judged cache draft once
its outcome is known -- the draft's accepted length against the output that followed, the
label training uses (replay/labelled.py) -- and feeds ``(predicted, realized)`` here. The
decision (decision.decide) then compares the *calibrated* payoff with its threshold (a
cost rule still prices the rows by the gate's own value: decide's docstring says why).

The map, per source bucket (a request's source where known, else one bucket ``served``):
the gate's prediction falls in one of ``BIN_EDGES``' bins; each bin keeps a running mean of
``realized - predicted`` (an exact mean over its first ``1 / min_rate`` samples, then an
exponential average at ``min_rate``), and the calibrated payoff is the prediction plus its
bin's offset, clipped to [0, cap]. Guardrails:

  * a bin acts only after ``min_samples`` labels (before that: the prediction unchanged);
  * one label moves a bin's offset by at most ``max_step`` tokens;
  * memory is bounded: ``max_buckets`` buckets of ``len(BIN_EDGES) + 1`` bins each (later
    sources share the last one, ``other``), and nothing else per label;
  * ``reset()`` forgets every offset and tally (the server calls it when its gate changes).

Worked example (min_samples 2, min_rate 0.5, max_step 1): labels (predicted 1.2,
realized 4) and (1.4, 4) fall in bin [1, 1.5). The first moves its offset from 0 toward
2.8, by at most 1.0: 1.0; the second by 0.5 x (2.6 - 1.0) = 0.8: 1.8. A prediction of
1.3 is then served as 3.1 (before the second label, with one sample, as 1.3).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

# Upper edges of the prediction bins (tokens): finer where the threshold sits (~1-2)
BIN_EDGES = np.array([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0], dtype=np.float64)
DEFAULT_BUCKET = "served"
OTHER_BUCKET = "other"


@dataclasses.dataclass(frozen=True, slots=True)
class CalibrationConfig:
    min_samples: int = 32  # labels a bin needs before it changes a prediction
    min_rate: float = 0.01  # the running mean's weight of a new label, once past 1 / min_rate labels
    max_step: float = 0.25  # tokens one label may move a bin's offset
    max_buckets: int = 32  # source buckets kept (the last is ``other``)

    def __post_init__(self):
        if self.min_samples < 1:
            raise ValueError(f"calibration min_samples must be >= 1, got {self.min_samples}")
        if not (math.isfinite(self.min_rate) and 0 < self.min_rate <= 1):
            raise ValueError(f"calibration min_rate must be in (0, 1], got {self.min_rate}")
        if not (math.isfinite(self.max_step) and self.max_step > 0):
            raise ValueError(f"calibration max_step must be a finite number > 0, got {self.max_step}")
        if self.max_buckets < 2:
            raise ValueError(f"calibration max_buckets must be >= 2, got {self.max_buckets}")


class OnlineCalibration:
    """Predicted -> realized payoff per source bucket (module docstring). ``cap``: the most
    a cache row can accept (the served shape's N-1 draft nodes)."""

    def __init__(self, cap: int, config: CalibrationConfig = CalibrationConfig()):
        if cap < 1:
            raise ValueError(f"calibration cap must be >= 1, got {cap}")
        self.cap = cap
        self.config = config
        self.reset()

    def reset(self) -> None:
        """Forget what was learned (a new gate); the sources keep their buckets (live
        requests hold their ids)."""
        k, bins = self.config.max_buckets, len(BIN_EDGES) + 1
        if not hasattr(self, "_names"):
            self._names: dict[str, int] = {}
        self._count = np.zeros((k, bins), np.int64)
        self._offset = np.zeros((k, bins), np.float64)
        # per bucket (the report): labels, sums of predicted, realized, |served - realized|, |pred - realized|
        self._tally = np.zeros((k, 5), np.float64)

    def bucket(self, name: str | None) -> int:
        """The bucket id of a source (None: ``served``); sources past ``max_buckets - 1`` share ``other``."""
        name = name or DEFAULT_BUCKET
        b = self._names.get(name)
        if b is None:
            if len(self._names) < self.config.max_buckets - 1:
                b = self._names[name] = len(self._names)
            else:
                b = self._names.setdefault(OTHER_BUCKET, self.config.max_buckets - 1)
        return b

    def apply(self, predicted: np.ndarray, buckets: np.ndarray) -> np.ndarray:
        """The calibrated payoff ``[B]`` float64 of predictions ``[B]`` (nan stays nan) in ``buckets`` ``[B]``."""
        pred = np.asarray(predicted, dtype=np.float64)
        bins = np.searchsorted(BIN_EDGES, np.nan_to_num(pred), side="right")
        offset = np.where(self._count[buckets, bins] >= self.config.min_samples, self._offset[buckets, bins], 0.0)
        return np.where(np.isnan(pred), np.nan, np.clip(pred + offset, 0.0, self.cap))

    def observe(self, bucket: int, predicted: float, realized: float) -> None:
        """One judged draft's outcome: the gate said ``predicted``, the verify (or the output) ``realized``."""
        if not math.isfinite(predicted):
            return
        cfg = self.config
        b = int(np.searchsorted(BIN_EDGES, predicted, side="right"))
        old = float(self._offset[bucket, b])
        acting = self._count[bucket, b] >= cfg.min_samples
        served = min(max(predicted + old, 0.0), self.cap) if acting else predicted  # apply's value, one row
        n = self._count[bucket, b] = self._count[bucket, b] + 1
        rate = max(1.0 / n, cfg.min_rate)
        step = rate * ((realized - predicted) - old)
        self._offset[bucket, b] = old + max(-cfg.max_step, min(cfg.max_step, step))
        self._tally[bucket] += (1.0, predicted, realized, abs(served - realized), abs(predicted - realized))

    def summary(self) -> dict[str, dict[str, float]]:
        """Per bucket: labels, mean predicted and realized payoff, and the mean absolute error of
        the payoff served (calibrated at the time) and of the gate's own prediction."""
        out = {}
        for name, b in sorted(self._names.items(), key=lambda kv: kv[1]):
            n, pred, real, served_err, gate_err = self._tally[b].tolist()
            if n:
                out[name] = {"labels": int(n), "predicted": pred / n, "realized": real / n,
                             "served_error": served_err / n, "gate_error": gate_err / n,
                             "bins_acting": int((self._count[b] >= self.config.min_samples).sum())}
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class CalibrationInput:
    """What decision.decide reads to calibrate a batch's predictions: the map, and each row's bucket ``[B]``."""

    calibration: OnlineCalibration
    buckets: np.ndarray

    def apply(self, predicted: np.ndarray) -> np.ndarray:
        return self.calibration.apply(predicted, self.buckets)
