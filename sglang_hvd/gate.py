"""The runtime payoff gate: a trained MLP in ONNX, run on the CPU with onnxruntime.

A gate directory holds:
  gate.onnx        input "features" [batch, F] float32 (raw features: standardisation is
                   inside the graph), output "accept_len" [batch] float32
  gate.json        format and feature-schema versions, feature names in order, threshold,
                   the drafter settings it was trained with, training data digest, metrics
  token_flags.npy  structure flags per token id of the tokenizer it was trained with

Everything is checked at load time (a missing file, a schema mismatch, a graph that does
not run): a bad gate is an error when the server starts, never at the first decode step.
Decision rule: verify the cache draft when the predicted accept_len > threshold.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from .drafter.protocol import DrafterConfig
from .errors import HvdInputError
from .features import FEATURE_NAMES, FEATURE_SCHEMA_VERSION, FeatureExtractor

GATE_FORMAT_VERSION = 1
INPUT_NAME, OUTPUT_NAME = "features", "accept_len"
FILES = ("gate.onnx", "gate.json", "token_flags.npy")


class GateError(HvdInputError):
    """A gate directory that cannot be used; the message names the file and the fix."""


def read_gate_json(gate_dir: str) -> dict[str, Any]:
    if not os.path.isdir(gate_dir):
        raise GateError(f"{gate_dir}: gate directory not found (train one with `hvd train TRACES -o {gate_dir}`)")
    for name in FILES:
        if not os.path.isfile(os.path.join(gate_dir, name)):
            raise GateError(f"{os.path.join(gate_dir, name)}: missing; a gate directory holds {', '.join(FILES)}")
    path = os.path.join(gate_dir, "gate.json")
    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GateError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(spec, dict):
        raise GateError(f"{path}: expected a JSON object")
    if spec.get("format_version") != GATE_FORMAT_VERSION:
        raise GateError(f"{path}: gate format version {spec.get('format_version')!r}, this sglang-hvd reads {GATE_FORMAT_VERSION}")
    schema = spec.get("feature_schema_version")
    if schema != FEATURE_SCHEMA_VERSION or list(spec.get("feature_names", [])) != list(FEATURE_NAMES):
        raise GateError(
            f"{path}: trained on feature schema {schema!r} ({len(spec.get('feature_names', []))} features), but this "
            f"sglang-hvd computes schema {FEATURE_SCHEMA_VERSION} ({len(FEATURE_NAMES)} features); retrain the gate "
            "with this version (`hvd train`)"
        )
    return spec


class Gate:
    """Predicts accept_len for a batch of feature rows with one onnxruntime call."""

    def __init__(self, gate_dir: str, threshold: float | None = None, intra_op_threads: int = 1):
        spec = read_gate_json(gate_dir)
        flags_path = os.path.join(gate_dir, "token_flags.npy")
        try:
            token_flags = np.load(flags_path, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise GateError(f"{flags_path}: unreadable ({e})") from e
        self._setup(spec, token_flags, os.path.join(gate_dir, "gate.onnx"), gate_dir, threshold, intra_op_threads)

    @classmethod
    def in_memory(cls, spec: dict[str, Any], token_flags: np.ndarray, model: bytes, threshold: float | None = None) -> Gate:
        """A gate from parts not yet written (training calibrates its threshold this way)."""
        gate = cls.__new__(cls)
        gate._setup(spec, token_flags, model, "<in memory>", threshold, 1)
        return gate

    def _setup(self, spec, token_flags, model, where: str, threshold, intra_op_threads: int) -> None:
        import onnxruntime as ort

        self.gate_dir = where
        self.spec = spec
        self.threshold = float(spec["threshold"] if threshold is None else threshold)
        try:
            self.drafter_config = DrafterConfig(**spec["drafter"])
        except (KeyError, TypeError, ValueError) as e:
            raise GateError(f"{where}: bad 'drafter' settings in gate.json ({e})") from e
        if token_flags.ndim != 1 or token_flags.dtype != np.uint16:
            raise GateError(f"{where}: token_flags.npy must be a 1-D uint16 array, got {token_flags.dtype} {token_flags.shape}")
        self.token_flags = token_flags
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        try:
            self.session = ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception types for bad models
            raise GateError(f"{where}: onnxruntime cannot load gate.onnx ({e})") from e
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        if [i.name for i in inputs] != [INPUT_NAME] or [o.name for o in outputs] != [OUTPUT_NAME]:
            raise GateError(f"{where}: gate.onnx must have input {INPUT_NAME!r} and output {OUTPUT_NAME!r}")
        try:
            probe = self.predict(np.zeros((2, len(FEATURE_NAMES)), dtype=np.float32))
        except Exception as e:
            raise GateError(f"{where}: gate.onnx fails on a probe batch ({e})") from e
        if probe.shape != (2,) or not np.all(np.isfinite(probe)):
            raise GateError(f"{where}: gate.onnx returned {probe.shape} / non-finite values on a probe batch")
        self.extractor = FeatureExtractor(self.token_flags, self.drafter_config)

    def predict(self, features: np.ndarray) -> np.ndarray:
        """``[batch, F]`` float32 -> predicted accept_len ``[batch]``."""
        return self.session.run([OUTPUT_NAME], {INPUT_NAME: np.ascontiguousarray(features, dtype=np.float32)})[0].reshape(-1)

    def decide(self, features: np.ndarray) -> np.ndarray:
        """``[batch]`` bool: verify the cache draft (predicted accept_len > threshold)."""
        return self.predict(features) > self.threshold
