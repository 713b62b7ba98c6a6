"""Build the serving stepper from an HVDServingConfig (gate, drafter, recorder)."""

from __future__ import annotations

import os

from ..calibration import OnlineCalibration
from ..cost_rule import CostRule
from ..drafter import create_drafter
from ..drafter.native_drafter import default_draft_threads, default_drafter_name
from ..errors import HvdInputError
from ..gate import Gate
from ..scorer import ScoreRule, ServedScorer
from ..step_profile import EXTEND_EVERY_STEP, EXTEND_WHEN_DRAFTED, StepProfile, load_profile
from ..tiers import served_tiers
from ..verify import VerifyShape
from .config import HVDServingConfig
from .recorder import TraceRecorder, rank_path
from .stepper import HVDStepper


def load_gate(config: HVDServingConfig) -> ServedScorer:
    """The configured gate, fully checked (raises GateError with the reason); with
    ``score_rule`` the score rule in its place (its settings and shape are the gate's)."""
    gate = Gate(config.gate, threshold=config.threshold, eagle_reserve=config.eagle_reserve,
                cache_siblings=config.cache_siblings)
    return gate if config.score_rule is None else ScoreRule(gate, config.score_rule)


def check_shape(gate: ServedScorer, served: VerifyShape) -> None:
    """The gate's labels and calibration assumed one verify shape: refuse another."""
    want = gate.verify_model.shape
    if want != served:
        raise HvdInputError(
            f"the gate {gate.gate_dir} was trained for verify rows of {want.describe()}, but this server verifies "
            f"{served.describe()}: serve with {want.sglang_flags()}, or train a gate for this shape "
            f"(hvd train ... --verify-topk {served.topk} --verify-steps {served.steps} --verify-nodes {served.nodes})")


def build_stepper(config: HVDServingConfig, shape: VerifyShape, dp_rank: int | None = None,
                  model_path: str | None = None) -> HVDStepper:
    """The stepper of one scheduler; ``dp_rank``: its data-parallel rank when the server
    runs several (each records to its own file, recorder.rank_path); ``model_path``: the
    served model, which a --hvd-profile must time."""
    gate = load_gate(config)
    check_shape(gate, shape)
    name = config.drafter or default_drafter_name()
    threads = config.draft_threads
    if threads is None:
        threads = default_draft_threads() if name == "native" else 1
    try:
        drafter = create_drafter(name, config.drafter_config(gate.drafter_config), threads=threads)
    except KeyError as e:
        raise HvdInputError(f"SGLANG_HVD_DRAFTER: {e.args[0]}") from None
    except ValueError as e:  # draft threads the drafter cannot take
        raise HvdInputError(f"SGLANG_HVD_DRAFT_THREADS: {e}") from None
    recorder = None
    if config.record_traces:
        path = rank_path(config.record_traces, dp_rank)
        try:
            recorder = TraceRecorder(path, max_queue=config.record_queue)
        except OSError as e:
            raise HvdInputError(f"{path}: cannot record traces there ({e.strerror})") from None
    step = cost_rule(config, gate, shape, model_path)
    calibration = OnlineCalibration(shape.draft_nodes) if config.online_calibration else None
    stepper = HVDStepper(drafter, gate, shape, recorder=recorder, tokenizer=gate.spec.tokenizer, step=step,
                         calibration=calibration)
    if config.skip_idle_extend:
        stepper.extend = EXTEND_WHEN_DRAFTED  # its modelled time, as the server runs it
    if config.tier_cycle:
        stepper.cycle = step.modes
    return stepper


def model_name(path: str | None) -> str:
    """A model's name for matching profiles to servers: the last part of its path or hub
    id, lower case (``Qwen/Qwen3-8B`` and ``/models/qwen3-8b/`` are both ``qwen3-8b``)."""
    return os.path.basename(os.path.normpath(str(path or ""))).lower()


def check_profile_model(profile: StepProfile, model_path: str | None, spec: str) -> None:
    """A profile times one target model: refuse it for a server of another."""
    if model_path and model_name(profile.target_model) != model_name(model_path):
        raise HvdInputError(
            f"--hvd-profile {spec} times {profile.target_model} ({profile.describe()}), but this server serves "
            f"{model_path}: measure a profile for it (hvd profile --url URL --timings FILE -o profile.json against a "
            "server started with --hvd-tier-cycle --hvd-timings FILE) or drop --hvd-profile")


def cost_rule(config: HVDServingConfig, gate: ServedScorer, shape: VerifyShape,
              model_path: str | None = None) -> CostRule | None:
    """The cost rule of a cost-aware server (None: cost-blind). Raises HvdInputError for a
    profile that cannot be read or times another model, or a tier the server cannot verify."""
    if config.profile is None and not config.tier_cycle:
        return None
    try:
        tiers = served_tiers(config.tiers, shape)
    except ValueError as e:
        raise HvdInputError(f"--hvd-tiers: {e}") from None
    try:
        profile = load_profile(config.profile or "qwen3-8b-h200")
    except HvdInputError as e:
        raise HvdInputError(f"--hvd-profile {e}") from None
    if config.profile is not None:
        check_profile_model(profile, model_path, config.profile)
    return CostRule(profile, gate.verify_model.eagle3, tiers,
                    extend=EXTEND_WHEN_DRAFTED if config.skip_idle_extend else EXTEND_EVERY_STEP, served=shape)

