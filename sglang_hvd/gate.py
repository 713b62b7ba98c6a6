"""The runtime payoff gate: a trained MLP in ONNX, run on the CPU with onnxruntime.

A gate directory holds:
  gate.onnx        input "features" [batch, F] float32 (raw features: standardisation is
                   inside the graph), output "accept_len" [batch] float32 and, in gates
                   with a payoff curve (gate.json payoff_curve W > 0), "accept_survival"
                   [batch, W] float32: P(the cache draft's first k tokens are accepted)
  gate.json        a GateSpec (gate_spec.py): format and feature-schema versions, feature
                   names, the decision rule, the drafter settings, the verify shape and
                   EAGLE3 curve it was trained for, the tokenizer, provenance
  token_flags.npy  structure flags per token id of the tokenizer it was trained with

Everything is checked at load time (a missing file, a schema mismatch, a graph that does
not run): a bad gate is an error when the server starts, never at the first decode step.
A Gate is a scorer (scorer.py: the Protocol, and the score rule that can serve in its
place); how its predictions become row plans: decision.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import numpy as np

from .features import FEATURE_NAMES, FeatureExtractor
from .gate_spec import GateError, GateSpec  # noqa: F401  (GateError: what a bad gate raises)

INPUT_NAME, OUTPUT_NAME, SURVIVAL_NAME = "features", "accept_len", "accept_survival"


def gate_digest(model: str | bytes, spec: GateSpec, token_flags: np.ndarray) -> str:
    """16 hex digits naming a gate's content (model, spec, token flags): every replica of a
    fleet serving the same gate reports the same digest, whatever its path."""
    h = hashlib.sha256()
    if isinstance(model, (bytes, bytearray)):
        h.update(model)
    else:
        with open(model, "rb") as f:
            h.update(f.read())
    h.update(json.dumps(spec.to_json(), sort_keys=True).encode())
    h.update(np.ascontiguousarray(token_flags).tobytes())
    return h.hexdigest()[:16]


class Gate:
    """Predicts accept_len for a batch of feature rows with one onnxruntime call.

    ``spec`` (GateSpec) says what it was trained for; ``rule`` is the decision rule it
    serves with (the spec's, with ``threshold`` / ``eagle_reserve`` / ``cache_siblings``
    when given)."""

    def __init__(self, gate_dir: str, threshold: float | None = None, intra_op_threads: int = 1,
                 eagle_reserve: int | None = None, cache_siblings: int | None = None):
        spec = GateSpec.read(gate_dir)
        flags_path = os.path.join(gate_dir, "token_flags.npy")
        try:
            token_flags = np.load(flags_path, allow_pickle=False)
        except (ValueError, OSError) as e:
            raise GateError(f"{flags_path}: unreadable ({e})") from e
        self._setup(spec, token_flags, os.path.join(gate_dir, "gate.onnx"), gate_dir, threshold, intra_op_threads)
        if eagle_reserve is not None:
            self.rule = dataclasses.replace(self.rule, eagle_reserve=eagle_reserve)
        if cache_siblings is not None:
            self.rule = dataclasses.replace(self.rule, cache_siblings=cache_siblings)

    @classmethod
    def in_memory(cls, spec: GateSpec, token_flags: np.ndarray, model: bytes, threshold: float | None = None) -> Gate:
        """A gate from parts not yet written (training calibrates its decision rule this way)."""
        gate = cls.__new__(cls)
        gate._setup(spec, token_flags, model, "<in memory>", threshold, 1)
        return gate

    def _setup(self, spec: GateSpec, token_flags, model, where: str, threshold, intra_op_threads: int) -> None:
        import onnxruntime as ort

        self.gate_dir = where
        self.spec = spec
        self.rule = (spec.decision if threshold is None
                     else dataclasses.replace(spec.decision, threshold=float(threshold)))
        if token_flags.ndim != 1 or token_flags.dtype != np.uint16:
            raise GateError(f"{where}: token_flags.npy must be a 1-D uint16 array, "
                            f"got {token_flags.dtype} {token_flags.shape}")
        self.token_flags = token_flags
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        # A failing run raises to decision.decide, which falls back, counts and logs once;
        # onnxruntime's own error line on every failed step would flood a server's log.
        options.log_severity_level = 4
        try:
            self.session = ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception types for bad models
            raise GateError(f"{where}: onnxruntime cannot load gate.onnx ({e})") from e
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        self.curve_width = spec.payoff_curve
        want = [OUTPUT_NAME, SURVIVAL_NAME] if self.curve_width else [OUTPUT_NAME]
        if [i.name for i in inputs] != [INPUT_NAME] or [o.name for o in outputs] != want:
            raise GateError(f"{where}: gate.onnx must have input {INPUT_NAME!r} and outputs {want} "
                            f"(gate.json payoff_curve {self.curve_width}), got {[o.name for o in outputs]}")
        try:
            probe, survival = self.predict_curve(np.zeros((2, len(FEATURE_NAMES)), dtype=np.float32))
        except Exception as e:
            raise GateError(f"{where}: gate.onnx fails on a probe batch ({e})") from e
        if probe.shape != (2,) or not np.all(np.isfinite(probe)):
            raise GateError(f"{where}: gate.onnx returned {probe.shape} / non-finite values on a probe batch")
        if survival is not None and (survival.shape != (2, self.curve_width)
                                     or not np.all((survival >= 0) & (survival <= 1))):
            raise GateError(f"{where}: gate.onnx returned a survival curve of shape {survival.shape} (want "
                            f"(2, {self.curve_width})) or values outside [0, 1] on a probe batch")
        self.extractor = FeatureExtractor(self.token_flags, self.drafter_config)
        self.digest = gate_digest(model, spec, token_flags)

    reads_trees = True  # its tree features describe each drafted row's tree (decision.decide grows them first)

    @property
    def decision(self) -> str:
        """How rows are chosen, as /server_info and the start-up log say it."""
        return "gate"

    @property
    def drafter_config(self):
        return self.spec.drafter

    @property
    def verify_model(self):
        return self.spec.verify

    def predict(self, features: np.ndarray) -> np.ndarray:
        """``[batch, F]`` float32 raw features -> predicted accept_len ``[batch]`` float32."""
        inputs = {INPUT_NAME: np.ascontiguousarray(features, dtype=np.float32)}
        return self.session.run([OUTPUT_NAME], inputs)[0].reshape(-1)

    def predict_curve(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """One run: predicted accept_len ``[batch]`` and, in a gate with a payoff curve, each
        row's survival ``[batch, W]`` (None in a gate without one)."""
        if not self.curve_width:
            return self.predict(features), None
        inputs = {INPUT_NAME: np.ascontiguousarray(features, dtype=np.float32)}
        pred, survival = self.session.run([OUTPUT_NAME, SURVIVAL_NAME], inputs)
        return pred.reshape(-1), survival
