"""Build the serving stepper from an HVDServingConfig (gate, drafter, recorder)."""

from __future__ import annotations

from ..drafter import create_drafter
from ..drafter.native_drafter import default_drafter_name
from ..errors import HvdInputError
from ..gate import Gate
from ..trace import TokenizerId
from .config import HVDServingConfig
from .recorder import TraceRecorder
from .stepper import HVDStepper


def load_gate(config: HVDServingConfig) -> Gate:
    """The configured gate, fully checked (raises GateError with the reason)."""
    return Gate(config.gate, threshold=config.threshold)


def build_stepper(config: HVDServingConfig) -> HVDStepper:
    gate = load_gate(config)
    name = config.drafter or default_drafter_name()
    try:
        drafter = create_drafter(name, config.drafter_config(gate.drafter_config))
    except KeyError as e:
        raise HvdInputError(f"SGLANG_HVD_DRAFTER: {e.args[0]}") from None
    recorder = None
    if config.record_traces:
        try:
            recorder = TraceRecorder(config.record_traces, max_queue=config.record_queue)
        except OSError as e:
            raise HvdInputError(f"{config.record_traces}: cannot record traces there ({e.strerror})") from None
    tok = gate.spec.get("tokenizer", {})
    return HVDStepper(drafter, gate, recorder=recorder,
                      tokenizer=TokenizerId(tok.get("name", "unknown"), tok.get("digest", "unknown")))
