"""gate.json as one typed record: what a gate was trained for and how it decides.

Every reader (the runtime gate, the server's start-up checks, ``hvd eval``) goes through
``GateSpec.read``; ``hvd train`` writes it with ``to_json``. A field that is missing or
of the wrong type is a GateError naming the file and the field. Format history:
1 (no verify shape; cache drafts capped by max_cache_tokens), 2 (verify shape, EAGLE3
curve, decision rule with an EAGLE3 reserve; the rule's ``cache_siblings``, added
later, reads as 0 when absent: such gates verify chains as before).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from .cost import CostModel
from .decision import DecisionRule
from .drafter.protocol import DrafterConfig
from .errors import HvdInputError
from .features import FEATURE_NAMES, FEATURE_SCHEMA_VERSION
from .trace import TokenizerId
from .verify import VerifyModel

GATE_FORMAT_VERSION = 2
FILES = ("gate.onnx", "gate.json", "token_flags.npy")


class GateError(HvdInputError):
    """A gate directory that cannot be used; the message names the file and the fix."""


@dataclasses.dataclass(frozen=True, slots=True)
class GateSplit:
    """How training split the traces (``hvd eval --held-out`` reads test_conversations)."""

    seed: int = 0
    validation_fraction: float = 0.2
    test_fraction: float = 0.0
    group_by: str = "conversation"  # predictor.split.GROUPINGS
    test_conversations: tuple[str, ...] = ()
    validation_conversations: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class GateSpec:
    decision: DecisionRule  # threshold (and EAGLE3 reserve) the gate decides with
    drafter: DrafterConfig  # the cache drafter settings its features describe
    verify: VerifyModel  # the verify shape and EAGLE3 curve its labels and calibration assumed
    tokenizer: TokenizerId  # its token-structure features index these ids
    costs: CostModel = CostModel()
    rule_threshold: float | None = None  # the score rule's best constant on validation
    split: GateSplit = GateSplit()
    drafter_impl: str = "native"
    # W > 0: gate.onnx also outputs each draft's survival at widths 1..W (payoff.py); 0: the geometric model
    payoff_curve: int = 0
    provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Informational only (model, training, validation, export): never read by code paths
    that decide anything."""

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": GATE_FORMAT_VERSION,
            "feature_schema_version": FEATURE_SCHEMA_VERSION,
            "feature_names": list(FEATURE_NAMES),
            "normalisation": "inside gate.onnx (Sub mean, Div std); feed raw features",
            "decision": self.decision.to_json(),
            "drafter": dataclasses.asdict(self.drafter),
            "drafter_impl": self.drafter_impl,
            "verify": self.verify.to_json(),
            "tokenizer": {"name": self.tokenizer.name, "digest": self.tokenizer.digest},
            "costs": dataclasses.asdict(self.costs),
            "rule_threshold": self.rule_threshold,
            "payoff_curve": self.payoff_curve,
            "split": {**dataclasses.asdict(self.split), "test_conversations": list(self.split.test_conversations),
                      "validation_conversations": list(self.split.validation_conversations)},
            **dict(self.provenance),
        }

    @classmethod
    def from_json(cls, d: Any, where: str = "gate.json") -> GateSpec:
        if not isinstance(d, dict):
            raise GateError(f"{where}: expected a JSON object")
        version = d.get("format_version")
        if version != GATE_FORMAT_VERSION:
            hint = " (written before verify shapes; retrain it with `hvd train`)" if version == 1 else ""
            raise GateError(
                f"{where}: gate format version {version!r}, this sglang-hvd reads {GATE_FORMAT_VERSION}{hint}")
        schema = d.get("feature_schema_version")
        if schema != FEATURE_SCHEMA_VERSION or list(d.get("feature_names", [])) != list(FEATURE_NAMES):
            raise GateError(
                f"{where}: trained on feature schema {schema!r} ({len(d.get('feature_names', []))} features), "
                f"but this sglang-hvd computes schema {FEATURE_SCHEMA_VERSION} ({len(FEATURE_NAMES)} features); "
                "retrain the gate with this version (`hvd train`)")
        known = {"format_version", "feature_schema_version", "feature_names", "normalisation", "decision", "drafter",
                 "drafter_impl", "verify", "tokenizer", "costs", "rule_threshold", "split", "payoff_curve"}

        def part(key: str, build):
            try:
                return build(d[key])
            except KeyError as e:
                inside = f" ({e.args[0]!r} in it)" if e.args[0] != key else ""
                raise GateError(f"{where}: missing {key!r}{inside}") from None
            except (TypeError, ValueError, AttributeError) as e:
                raise GateError(f"{where}: bad {key!r} ({e})") from None

        def gate_split(v) -> GateSplit:
            return GateSplit(**{**v, "test_conversations": tuple(v.get("test_conversations", ())),
                                "validation_conversations": tuple(v.get("validation_conversations", ()))})

        split = d.get("split") or {}
        return cls(
            decision=part("decision", lambda v: DecisionRule(float(v["threshold"]), int(v["eagle_reserve"]),
                                                             int(v.get("cache_siblings", 0)))),
            drafter=part("drafter", lambda v: DrafterConfig(**v)),
            verify=part("verify", VerifyModel.from_json),
            tokenizer=part("tokenizer", lambda v: TokenizerId(str(v["name"]), str(v["digest"]))),
            costs=part("costs", lambda v: CostModel(**v)) if "costs" in d else CostModel(),
            rule_threshold=(part("rule_threshold", lambda v: None if v is None else float(v))
                            if "rule_threshold" in d else None),
            split=part("split", gate_split) if split else GateSplit(),
            drafter_impl=str(d.get("drafter_impl", "native")),
            payoff_curve=part("payoff_curve", _curve_width) if "payoff_curve" in d else 0,
            provenance={k: v for k, v in d.items() if k not in known},
        )

    @classmethod
    def read(cls, gate_dir: str) -> GateSpec:
        if not os.path.isdir(gate_dir):
            raise GateError(f"{gate_dir}: gate directory not found (train one with `hvd train TRACES -o {gate_dir}`)")
        for name in FILES:
            if not os.path.isfile(os.path.join(gate_dir, name)):
                raise GateError(f"{os.path.join(gate_dir, name)}: missing; a gate directory holds {', '.join(FILES)}")
        path = os.path.join(gate_dir, "gate.json")
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise GateError(f"{path}: not valid JSON ({e})") from e
        return cls.from_json(data, path)


def _curve_width(v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"a number of widths >= 0 expected, got {v!r}")
    return v
