"""Policies by load: fleet replay of every policy at several concurrencies, timed by a
step-time profile (``hvd eval --concurrency``).

Policy names (a static tier T written TOPK-STEPS-NODES, tiers.py):
  greedy           no speculation
  eagle3@T         EAGLE3's draft at every row, tier T
  eagle3_adaptive  SGLang's adaptive EAGLE3 (replay/adaptive.py) over its default tiers
  cache_only@T     SuffixDecoding at tier T: a row with a cache draft verifies it, any
                   other row takes a plain step; no EAGLE3 draft
  hvd@T            today's cost-blind HVD: the gate's decision at tier T
  hvd              cost-aware HVD: the decision picks the tier (and whether EAGLE3
                   drafts) per step from the gate's payoffs and the profile (cost_rule.CostRule)
  hvd_exact        hvd priced by each cache chain's true accepted length (replay/exact.py):
                   what a gate that knew it would buy; a reference, run when named
  hvd_online       hvd with online calibration (calibration.py), starting cold at the
                   first request: the payoffs it decides with are the gate's, mapped to
                   what the verifies so far realized (per source); hvd_online@T: hvd@T so
                   calibrated

cache_only pays the profile's host time of its drafts, HVD that and its decision's; the
EAGLE3 baselines and greedy pay none. Every policy with an EAGLE3 model (eagle3@T,
eagle3_adaptive, hvd@T, hvd) pays its draft extend at every step, drafted or not, as SGLang
runs it (``LoadSettings.extend``: HVD's servers may instead pay it on drafting steps only, as
one started with --hvd-skip-idle-extend does; replay does not model the lower yield of an
EAGLE3 draft made after skipped extends).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..calibration import OnlineCalibration
from ..cost_rule import CostRule, StepMode
from ..drafter import create_drafter
from ..drafter.native_drafter import default_drafter_name
from ..gate import Gate
from ..serving.stepper import HVDStepper
from ..step_profile import EXTEND_EVERY_STEP, EXTEND_NONE, HOST_DRAFTS, StepProfile
from ..tiers import Tier
from ..trace import TraceRecord
from ..verify import VerifyModel
from .adaptive import AdaptiveEagle3Planner
from .exact import ExactStepper
from .fleet import FixedPlanner, FleetResult, Planner, serve_fleet

COST_AWARE = "hvd"
ONLINE = "hvd_online"  # hvd with online calibration (calibration.py)
EXACT = "hvd_exact"  # hvd priced by the true accepted lengths (replay/exact.py)
STATIC_FAMILIES = ("hvd", ONLINE, "eagle3", "cache_only")
UNTIERED = ("greedy", "eagle3_adaptive", COST_AWARE, ONLINE, EXACT)


def policy_names(static_tiers: Sequence[Tier]) -> list[str]:
    names = ["greedy", "eagle3_adaptive"]
    for family in ("eagle3", "cache_only", "hvd"):
        names += [f"{family}@{t.name}" for t in static_tiers if t.speculates]
    return names + [COST_AWARE]


def parse_policy(name: str) -> tuple[str, Tier | None]:
    """``"hvd@4-3-16"`` -> ("hvd", Tier(4-3-16)); ``"greedy"`` -> ("greedy", None)."""
    family, sep, tier = name.partition("@")
    if not sep:
        if family not in UNTIERED:
            raise ValueError(f"unknown policy {name!r}; choose from {', '.join(UNTIERED)} or a tiered policy "
                             f"({', '.join(f + '@T' for f in STATIC_FAMILIES)})")
        return family, None
    if family not in STATIC_FAMILIES:
        raise ValueError(f"unknown policy {name!r}; a tiered policy is {', '.join(f + '@T' for f in STATIC_FAMILIES)}")
    return family, Tier.parse(tier)


@dataclasses.dataclass(frozen=True, slots=True)
class LoadSettings:
    gate: Gate
    model: VerifyModel  # the served shape (the widest tier) and the EAGLE3 curve
    profile: StepProfile
    tiers: tuple[Tier, ...]  # what cost-aware HVD chooses from
    drafter: str = ""  # registered drafter name ("": the fastest built)
    extend: str = EXTEND_EVERY_STEP  # when HVD's server pays EAGLE3's draft extend (step_profile.EXTEND_*)


def make_planner(name: str, s: LoadSettings, outputs: Mapping[str, np.ndarray] | None = None) -> Planner:
    """The planner of policy ``name``; ``outputs``: each request's recorded output (hvd_exact reads it)."""
    family, tier = parse_policy(name)
    if family == "greedy":
        return FixedPlanner(Tier())
    if family == "eagle3_adaptive":
        return AdaptiveEagle3Planner()
    if family == "eagle3":
        return FixedPlanner(tier)
    drafter = create_drafter(s.drafter or default_drafter_name(), s.gate.drafter_config)
    if family == "cache_only":
        stepper = HVDStepper(drafter, None, s.model.shape, rule=s.gate.rule, step=StepMode(tier, eagle3=False))
        stepper.host = HOST_DRAFTS  # SuffixDecoding pays for its drafts, not for a decision,
        stepper.extend = EXTEND_NONE  # and runs no draft model
        return stepper
    if tier is not None:
        step = StepMode(tier)
    else:
        step = CostRule(s.profile, s.model.eagle3, s.tiers, extend=s.extend, served=s.model.shape,
                        exact=family == EXACT)
    if family == EXACT:
        if outputs is None:
            raise ValueError(f"{EXACT} reads the recorded outputs: pass them")
        stepper = ExactStepper(drafter, outputs, s.model.shape, s.gate.rule, step)
        stepper.extend = s.extend
        return stepper
    calibration = OnlineCalibration(s.model.shape.draft_nodes) if family == ONLINE else None
    stepper = HVDStepper(drafter, s.gate, s.model.shape, step=step, calibration=calibration)
    stepper.extend = s.extend
    return stepper


@dataclasses.dataclass(slots=True)
class LoadRun:
    policy: str
    concurrency: int
    result: FleetResult
    modes: dict[str, int]  # steps per tier (and /cache: no EAGLE3 draft) the policy ran
    seconds: float
    # a cost rule's picks, per mode: (tokens its steps were expected to emit, tokens they emitted), all steps together
    mode_tokens: dict[str, tuple[float, int]] = dataclasses.field(default_factory=dict)


def run_by_load(conversations: Sequence[Sequence[TraceRecord]], names: Sequence[str], concurrencies: Sequence[int],
                s: LoadSettings, on_run: Callable[[LoadRun], None] | None = None) -> list[LoadRun]:
    runs = []
    outputs = {r.req_id: r.output_ids for turns in conversations for r in turns} if EXACT in names else None
    for c in concurrencies:
        for name in names:
            started = time.perf_counter()
            planner = make_planner(name, s, outputs)
            result = serve_fleet(conversations, planner, s.model, c, policy=name, profile=s.profile)
            stepper = planner if isinstance(planner, HVDStepper) else None
            modes = planner.modes if stepper is None else stepper.stats.modes
            tokens = {} if stepper is None else {m: (e, stepper.stats.mode_emitted.get(m, 0))
                                                 for m, e in stepper.stats.mode_expected.items()}
            run = LoadRun(name, c, result, dict(modes), time.perf_counter() - started, tokens)
            runs.append(run)
            if on_run is not None:
                on_run(run)
    return runs


def by_concurrency_json(runs: Sequence[LoadRun]) -> dict:
    """``{"C": {"policies": {NAME: figures}, "sources": {SRC: {"policies": ...}}}}``."""
    out: dict[str, dict] = {}
    for run in runs:
        level = out.setdefault(str(run.concurrency), {"policies": {}, "sources": {}})
        figures = run.result.overall.policy(run.policy).to_json()
        steps = sum(run.modes.values())
        figures["modes"] = {m: n / steps for m, n in sorted(run.modes.items())} if steps else {}
        if run.mode_tokens:  # what the cost rule expected each mode's steps to emit, and what they did
            figures["mode_tokens"] = {m: {"expected_per_step": e / run.modes[m], "emitted_per_step": o / run.modes[m]}
                                      for m, (e, o) in sorted(run.mode_tokens.items())}
        level["policies"][run.policy] = figures
        for src, tally in run.result.sources.items():
            level["sources"].setdefault(src, {"policies": {}})["policies"][run.policy] = tally.policy(
                run.policy).to_json()
    return out
