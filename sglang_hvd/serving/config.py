"""HVD serving settings, carried to SGLang's spawned processes in environment variables.

SGLang starts its scheduler processes with ``spawn``: only environment variables reach
them. Each field of HVDServingConfig below is declared once, with its help
(serving/options.py): it is read from ``SGLANG_HVD_<FIELD>`` and set by the launcher's
flag ``--hvd-<field>`` (``enable``: SGLANG_HVD_ENABLE=1, and ``--hvd-disable`` turns it
off in the launcher, which turns it on). The cache drafter's settings are DrafterConfig's
fields the same way (SGLANG_HVD_MAX_SCAN, --hvd-max-scan, ...). ``python -m
sglang_hvd.launch_server`` turns its ``--hvd-*`` flags into these variables; ``sglang
serve`` and ``sgl.Engine`` users set them directly (the launcher's ``--help`` lists each
flag with its variable). For example:

  SGLANG_HVD_ENABLE=1 SGLANG_HVD_GATE=DIR        HVD on, with the gate of `hvd train`
  SGLANG_HVD_RECORD_TRACES=PATH                  also record token traces of served requests
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from ..drafter.protocol import MAX_DRAFT_THREADS, RESOURCE_BOUNDS, DrafterConfig
from ..errors import HvdInputError
from .options import PREFIX, Option, option, options_of, values_from_env

TESTED_SGLANG_VERSION = "0.5.23"
__all__ = ["DRAFTER_OPTIONS", "OPTIONS", "PREFIX", "SERVING_OPTIONS", "TESTED_SGLANG_VERSION", "HVDServingConfig"]


@dataclasses.dataclass(frozen=True, slots=True)
class HVDServingConfig:
    enable: bool = option(
        False, "serve without HVD (plain SGLang EAGLE3), e.g. for an A/B run", flag="--hvd-disable",
        launcher_default=True)
    gate: str | None = option(None, "gate directory from `hvd train`; required unless --hvd-disable",
                               metavar="GATE_DIR")
    threshold: float | None = option(
        None, "verify the cache draft when the predicted accept length > T (--hvd-threshold=-inf: every "
              "cache draft)",
        metavar="T", minus_inf=True, default_text="the gate's")
    score_rule: float | None = option(
        None, "decide by the score rule instead of the gate's prediction: a cache row when the cache draft's "
              "score (sum of its token probabilities) is >= C; the gate still sets the drafter settings, verify "
              "shape and EAGLE3 reserve; its gate.json rule_threshold is the best C found in training (an A/B "
              "baseline; not with --hvd-threshold)", metavar="C", what="score")
    eagle_reserve: int | None = option(
        None, "EAGLE3 draft nodes kept beside a cache draft in a tree row", metavar="M", at_least=0,
        default_text="the gate's")
    cache_siblings: int | None = option(
        None, "tree-draft nodes a cache row may add beside its chain, from EAGLE3's share (topk > 1)",
        metavar="S", at_least=0, default_text="the gate's")
    drafter: str | None = option(
        None, "cache drafter implementation: native (C++) or python, identical drafts", metavar="NAME",
        default_text="native when built")
    draft_threads: int | None = option(
        None, "threads a decode batch's cache drafts run on, the scheduler's own one of them (the native drafter; "
              "the same drafts on any number; batches under 32 rows draft on the scheduler's thread alone)",
        metavar="N", at_least=1, at_most=MAX_DRAFT_THREADS, default_text="a quarter of the CPUs this process may use, "
                                                                         "1 to 4")
    # DrafterConfig fields set explicitly, as (name, value) in DrafterConfig's field order:
    # their options are DrafterConfig's own fields (DRAFTER_OPTIONS).
    drafter_overrides: tuple[tuple[str, float], ...] = ()
    profile: str | None = option(
        None, "cost-aware verification: each decode step verifies at the tier (--hvd-tiers) of the most predicted "
              "tokens per second under this step-time profile: a shipped estimate (qwen3-8b-h200, qwen3-8b-h100) or "
              "a file from `hvd profile`; unset, every step verifies at the served shape (cost-blind)",
        metavar="P")
    tiers: str | None = option(
        None, "the verify tiers a cost-aware server picks among, e.g. off,4-1-4,4-2-8,4-3-16 (off: no speculation; "
              "TOPK-STEPS-NODES: the served topk, no wider than the served shape, which is always added)",
        metavar="T,...", default_text="off, the served shape's halved widths, the served shape and, at topk > 1, the "
                                      "widest tree of each fewer step count (4-3-16: off,4-1-2,4-1-4,4-1-5,4-2-8,"
                                      "4-2-16,4-3-16)")
    profile_refit: bool = option(
        True, "keep serving --hvd-profile as given: no online refit from the steps the server times (e.g. to "
              "compare with replay under the same profile)", flag="--hvd-no-profile-refit", launcher_default=True)
    skip_idle_extend: bool = option(
        False, "after a decode step that ran no EAGLE3 draft (off, or every row a cache row), skip the draft model's "
               "extend (SGLang runs it every step to keep the draft's KV cache warm): cache-only steps then cost a "
               "verify alone; an EAGLE3 draft after such steps drafts from a stale state (lossless; its yield, "
               "measured online, drops). The cost rule then prices the extend on drafting steps only",
        launcher_default=False)
    online_calibration: bool = option(
        False, "calibrate the gate online: label every judged cache draft by the output that follows it and decide "
               "with the gate's payoff mapped to what the verifies realize, per source bucket (the request's "
               "custom_params hvd_source, else one bucket); guarded by a minimum of 32 labels per bin and a bounded "
               "step per label; /server_info shows predicted against realized payoff (sglang_hvd/calibration.py)",
        launcher_default=False)
    tier_cycle: bool = option(
        False, "diagnostic: step through every tier, with and without EAGLE3's draft, one decode step each, "
               "ignoring the profile (checks that a deployment serves every tier losslessly; slow)",
        launcher_default=False)
    timings: str | None = option(
        None, "append each decode step's measured parts (target verify, EAGLE3 draft, draft extend, HVD host time, "
              "in ms) to PATH, one JSON line per step, for `hvd profile` (TP rank 0; one file per DP rank)",
        metavar="PATH")
    record_traces: str | None = option(
        None, "append token traces of served requests to PATH, off the decode path (one file per DP rank)",
        metavar="PATH")
    record_queue: int = option(4096, "records queued before new ones are dropped, counted", metavar="N",
                               at_least=1)
    allow_sglang_version: str | None = option(
        None, f"run on this sglang version although it is not the tested one ({TESTED_SGLANG_VERSION})",
        metavar="VERSION")

    def __post_init__(self):
        object.__setattr__(self, "drafter_overrides", _ordered_overrides(self.drafter_overrides))
        for opt in OPTIONS:
            value = None if opt.drafter else getattr(self, opt.name)
            problem = opt.problem(value) if value is not None and opt.kind in (int, float) else None
            if problem:
                raise HvdInputError(f"{opt.env} {problem}")
        for name, value in self.drafter_overrides:
            problem = _DRAFTER_BY_NAME[name].problem(value)
            if problem:
                raise HvdInputError(f"{_DRAFTER_BY_NAME[name].env} {problem}")
        if (self.draft_threads or 1) > 1 and self.drafter == "python":
            raise HvdInputError(f"{PREFIX}DRAFT_THREADS={self.draft_threads}: the python drafter drafts on one thread; "
                                f"drop {PREFIX}DRAFTER=python (the native drafter) or the threads")
        if self.enable and not self.gate:
            raise HvdInputError(f"{PREFIX}ENABLE=1 needs a gate: set {PREFIX}GATE=DIR (or --hvd-gate DIR)")
        if self.tiers is not None and self.profile is None and not self.tier_cycle:
            raise HvdInputError(f"{PREFIX}TIERS picks among tiers by a step-time profile: also set {PREFIX}PROFILE "
                                "(--hvd-profile qwen3-8b-h200, or a file from `hvd profile`)")
        if self.score_rule is not None and self.threshold is not None:
            raise HvdInputError(f"{PREFIX}THRESHOLD is the gate's and {PREFIX}SCORE_RULE replaces the gate: set one "
                                "(--hvd-threshold or --hvd-score-rule)")

    def drafter_config(self, base: DrafterConfig) -> DrafterConfig:
        """The gate's drafter settings (``base``) with any explicit overrides applied. Only
        resource bounds (protocol.RESOURCE_BOUNDS) may differ from the gate's: the other
        settings shape the drafts its features describe, so another value is refused."""
        for k, v in self.drafter_overrides:
            opt = _DRAFTER_BY_NAME[k]
            if k not in RESOURCE_BOUNDS and v != getattr(base, k):
                raise HvdInputError(
                    f"{opt.env}={v}: the gate was trained with {k} {getattr(base, k)}, and its features describe "
                    f"drafts of those settings; drop {opt.env} (or {opt.flag}) or train a gate with it "
                    f"(hvd train ... --{k.replace('_', '-')} {v})")
        try:
            return dataclasses.replace(base, **dict(self.drafter_overrides))
        except ValueError as e:
            opts = [_DRAFTER_BY_NAME[k] for k, _ in self.drafter_overrides]
            named = ", ".join(f"{opt.env} ({opt.flag})" for opt in opts)
            raise HvdInputError(f"HVD drafter settings {named}: {e}") from None

    def to_env(self) -> dict[str, str]:
        """The variables that make ``from_env`` return this config (unset options left out)."""
        env = {}
        for opt in OPTIONS:
            if not opt.drafter and getattr(self, opt.name) is not None:
                env[opt.env] = opt.format(getattr(self, opt.name))
        for name, value in self.drafter_overrides:
            env[_DRAFTER_BY_NAME[name].env] = _DRAFTER_BY_NAME[name].format(value)
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HVDServingConfig:
        return cls(**values_from_env(os.environ if environ is None else environ, OPTIONS))


def _drafter_default(name: str) -> str:
    if name in RESOURCE_BOUNDS:
        return "the gate's"
    return "the gate's; no other value is accepted"


def _ordered_overrides(pairs) -> tuple[tuple[str, float], ...]:
    """``pairs`` in DrafterConfig's field order, each value of its field's kind; unknown or
    repeated names are refused."""
    given = dict(pairs)
    if len(given) != len(tuple(pairs)) or set(given) - set(_DRAFTER_BY_NAME):
        raise HvdInputError(f"drafter_overrides: each of {', '.join(_DRAFTER_BY_NAME)} at most once, got "
                            f"{[name for name, _ in pairs]}")
    out = []
    for opt in DRAFTER_OPTIONS:
        if opt.name in given:
            value = given[opt.name]
            if isinstance(value, bool) or not isinstance(value, int if opt.kind is int else (int, float)):
                raise HvdInputError(f"{opt.env} must be a{'n int' if opt.kind is int else ' number'}, got {value!r}")
            out.append((opt.name, opt.kind(value)))
    return tuple(out)


# The table: every option of the server, in --help order. The drafter's come from
# DrafterConfig (its fields' help, each with where its default comes from).
DRAFTER_OPTIONS: tuple[Option, ...] = options_of(DrafterConfig, drafter=True, default_text=_drafter_default)
_DRAFTER_BY_NAME = {opt.name: opt for opt in DRAFTER_OPTIONS}
SERVING_OPTIONS: tuple[Option, ...] = options_of(HVDServingConfig)
OPTIONS: tuple[Option, ...] = SERVING_OPTIONS + DRAFTER_OPTIONS
