"""Build the serving stepper from an HVDServingConfig (gate, drafter, recorder)."""

from __future__ import annotations

from ..drafter import create_drafter
from ..drafter.native_drafter import default_drafter_name
from ..errors import HvdInputError
from ..gate import Gate
from ..scorer import ScoreRule, ServedScorer
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


def build_stepper(config: HVDServingConfig, shape: VerifyShape, dp_rank: int | None = None) -> HVDStepper:
    """The stepper of one scheduler; ``dp_rank``: its data-parallel rank when the server
    runs several (each records to its own file, recorder.rank_path)."""
    gate = load_gate(config)
    check_shape(gate, shape)
    name = config.drafter or default_drafter_name()
    try:
        drafter = create_drafter(name, config.drafter_config(gate.drafter_config))
    except KeyError as e:
        raise HvdInputError(f"SGLANG_HVD_DRAFTER: {e.args[0]}") from None
    recorder = None
    if config.record_traces:
        path = rank_path(config.record_traces, dp_rank)
        try:
            recorder = TraceRecorder(path, max_queue=config.record_queue)
        except OSError as e:
            raise HvdInputError(f"{path}: cannot record traces there ({e.strerror})") from None
    return HVDStepper(drafter, gate, shape, recorder=recorder, tokenizer=gate.spec.tokenizer)
