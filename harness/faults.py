"""Faults to inject into HVD servers on the CPU harness (test and benchmark code).

``gate_variant(good, where, **parts)`` copies a trained gate with parts of its gate.json
changed (another digest; e.g. a decision threshold, or drafter settings a server refuses).

``faulty_gate(good, where, ...)`` copies a trained gate and appends nodes to its ONNX
graph so that it loads (the load-time probe runs a batch of 2) and then fails inside
onnxruntime on the batch sizes chosen:

* ``works_only_at=2``: a Reshape to [2]: every batch size but 2 raises;
* ``fails_at=3``: a Reshape to [B], except [4] when B == 3: only 3-row batches raise
  (intermittent failures under load).
"""

from __future__ import annotations

import os
import shutil


def faulty_gate(good: str, where: str, *, works_only_at: int | None = None, fails_at: int | None = None) -> str:
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    if (works_only_at is None) == (fails_at is None):
        raise ValueError("give exactly one of works_only_at, fails_at")
    shutil.copytree(good, where)
    path = os.path.join(where, "gate.onnx")
    model = onnx.load(path)
    g = model.graph
    node = next(n for n in g.node if "accept_len" in n.output)  # (a gate with a payoff curve ends in its Sigmoid)
    node.output[list(node.output).index("accept_len")] = "pre_fault"
    i64 = lambda name, v: g.initializer.append(numpy_helper.from_array(np.array(v, dtype=np.int64), name))  # noqa: E731
    if works_only_at is not None:
        i64("fault_shape", [works_only_at])
        g.node.append(helper.make_node("Reshape", ["pre_fault", "fault_shape"], ["accept_len"]))
    else:
        i64("fault_batch", [fails_at])
        i64("fault_wrong", [fails_at + 1])
        g.node.extend([
            helper.make_node("Shape", ["pre_fault"], ["fault_b"]),
            helper.make_node("Equal", ["fault_b", "fault_batch"], ["fault_hit"]),
            helper.make_node("Where", ["fault_hit", "fault_wrong", "fault_b"], ["fault_shape"]),
            helper.make_node("Reshape", ["pre_fault", "fault_shape"], ["accept_len"]),
        ])
    onnx.save(model, path)
    return where


def gate_variant(good: str, where, **parts: dict) -> str:
    """A copy of the gate ``good`` at ``where`` with gate.json's parts updated (each a dict
    merged into that part, e.g. ``decision={"threshold": 0.5}``); returns its path."""
    import json

    shutil.copytree(good, where)
    path = os.path.join(where, "gate.json")
    with open(path) as f:
        spec = json.load(f)
    for part, values in parts.items():
        spec[part].update(values)
    with open(path, "w") as f:
        json.dump(spec, f)
    return str(where)
