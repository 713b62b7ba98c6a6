"""HVD figures as Prometheus gauges, beside SGLang's own (``--enable-metrics``).

SGLang runs prometheus_client in multiprocess mode: gauges created in the scheduler
process are collected by the HTTP server's ``/metrics``. Updated at most once a second.
Labelled ``dp_rank`` (0 without data parallelism): each DP rank's scheduler has its own
stepper, so each reports its own series (``sum by (...)`` / ``avg`` in PromQL for the
server).
"""

from __future__ import annotations

import time

GAUGES = {
    "steps": "HVD decode steps judged",
    "cache_pick_rate": "Share of verify rows that held a cache branch (a chain or two branches)",
    "two_branch_rate": "Share of verify rows that held a cache branch and EAGLE3 nodes",
    "eagle3_branch_wins": "Two-branch rows whose EAGLE3 branch was accepted",
    "cache_mean_accept": "Mean accepted cache tokens of rows whose cache branch was taken",
    "eagle3_mean_accept": "Mean accepted draft tokens of EAGLE3 rows and EAGLE3 branch wins",
    "cpu_us_per_step": "CPU microseconds of drafting and gating per decode step",
    "gate_errors": "Steps whose gate call failed (they verified EAGLE3 drafts)",
    "drafts_skipped": "Decode steps whose EAGLE3 draft forwards were skipped (no row verified an EAGLE3 node)",
    "tier_switches": "Switches of the verify tier (cost-aware serving, --hvd-profile)",
    "profile_version": "Step-time profiles refitted online and served after the first",
    "profile_error_step": "Mean |predicted / measured - 1| of the served profile's step time on the newest steps",
    "profile_untimed_ms": "Median ms of a decode step that no profile term times (SGLang's scheduler around the "
                          "forwards), newest steps",
    "recorded_dropped": "Trace records dropped because the recorder queue was full",
    "recorded_failed": "Trace records lost because writing them failed (disk full, read-only file)",
}


# Online calibration (--hvd-online-calibration), labelled dp_rank and bucket (a request source)
CALIBRATION_GAUGES = {
    "labels": "Judged cache drafts labelled by the output that followed them",
    "predicted": "Mean payoff (accepted cache tokens) the gate predicted",
    "realized": "Mean payoff the verified output realized",
    "served_error": "Mean |served payoff - realized| (the calibrated payoff the decision used)",
    "gate_error": "Mean |gate's prediction - realized|",
}


class HVDMetrics:
    def __init__(self, dp_rank: int = 0):
        from prometheus_client import Gauge

        self._dp_rank = str(dp_rank)
        self._gauges = {k: Gauge(f"sglang:hvd_{k}", doc, labelnames=["dp_rank"], multiprocess_mode="mostrecent")
                        .labels(dp_rank=self._dp_rank) for k, doc in GAUGES.items()}
        self._calibration = {k: Gauge(f"sglang:hvd_calibration_{k}", doc, labelnames=["dp_rank", "bucket"],
                                      multiprocess_mode="mostrecent") for k, doc in CALIBRATION_GAUGES.items()}
        self._last = 0.0

    def update(self, summary: dict, calibration=None) -> None:
        """``summary``: the stepper's; ``calibration``: its OnlineCalibration (None: off), read only when due."""
        now = time.monotonic()
        if now - self._last < 1.0:
            return
        self._last = now
        for key, gauge in self._gauges.items():
            gauge.set(float(summary.get(key, 0.0)))
        if calibration is not None:
            for bucket, figures in calibration.summary().items():
                for key, gauge in self._calibration.items():
                    gauge.labels(dp_rank=self._dp_rank, bucket=bucket).set(float(figures[key]))
