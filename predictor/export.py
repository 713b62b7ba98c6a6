"""Export the gate MLP to ONNX, checked for parity with torch before anything is written.

The graph is written op by op from the trained weights (Sub, Div, then MatMul + Add +
Relu per layer, then Squeeze): input ``features`` [batch, F] float32, output
``accept_len`` [batch], batch axis dynamic; a model with a payoff curve of W widths also
outputs ``accept_survival`` [batch, W] (Slice, Sigmoid). It must pass ``onnx.checker``
and agree with the torch model within ``max_abs_diff`` (default 1e-4) on held-out rows,
every output, or the export fails and no gate directory is written.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from sglang_hvd.gate import INPUT_NAME, OUTPUT_NAME, SURVIVAL_NAME
from sglang_hvd.gate_spec import FILES, GateSpec

from .mlp import GateMLP

OPSET = 17


class ExportParityError(RuntimeError):
    """onnxruntime and torch disagree on the exported gate."""


def to_onnx(model: GateMLP) -> onnx.ModelProto:
    num_features = int(model.mean.shape[0])
    inits = [numpy_helper.from_array(model.mean.numpy().astype(np.float32), "mean"),
             numpy_helper.from_array(model.std.numpy().astype(np.float32), "std"),
             numpy_helper.from_array(np.array([1], dtype=np.int64), "squeeze_axes")]
    nodes = [helper.make_node("Sub", [INPUT_NAME, "mean"], ["centred"]),
             helper.make_node("Div", ["centred", "std"], ["h0"])]
    linears = [m for m in model.net if isinstance(m, torch.nn.Linear)]
    h = "h0"
    for i, lin in enumerate(linears):
        w = lin.weight.detach().numpy().T.astype(np.float32)  # [in, out]
        b = lin.bias.detach().numpy().astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [helper.make_node("MatMul", [h, f"w{i}"], [f"mm{i}"]),
                  helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"z{i}"])]
        if i < len(linears) - 1:
            nodes.append(helper.make_node("Relu", [f"z{i}"], [f"h{i + 1}"]))
            h = f"h{i + 1}"
    last = f"z{len(linears) - 1}"
    outputs = [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch"])]
    width = model.curve_width
    if width:  # [batch, 1 + W]: accept_len from column 0, the survival from the rest
        inits += [numpy_helper.from_array(np.array([v], dtype=np.int64), name)
                  for name, v in (("first", 0), ("second", 1), ("end", 1 + width), ("columns", 1))]
        nodes += [helper.make_node("Slice", [last, "first", "second", "columns"], ["accept_col"]),
                  helper.make_node("Squeeze", ["accept_col", "squeeze_axes"], [OUTPUT_NAME]),
                  helper.make_node("Slice", [last, "second", "end", "columns"], ["survival_logits"]),
                  helper.make_node("Sigmoid", ["survival_logits"], [SURVIVAL_NAME])]
        outputs.append(helper.make_tensor_value_info(SURVIVAL_NAME, TensorProto.FLOAT, ["batch", width]))
    else:
        nodes.append(helper.make_node("Squeeze", [last, "squeeze_axes"], [OUTPUT_NAME]))
    graph = helper.make_graph(
        nodes, "hvd_gate",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", num_features])],
        outputs,
        initializer=inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="sglang-hvd")
    proto.ir_version = 8  # readable by onnxruntime >= 1.14
    onnx.checker.check_model(proto, full_check=True)
    return proto


def parity(proto: onnx.ModelProto, model: GateMLP, rows: np.ndarray) -> float:
    """Max |onnxruntime - torch| over ``rows``, every output."""
    import onnxruntime as ort

    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.ascontiguousarray(rows, dtype=np.float32)
    names = [OUTPUT_NAME, SURVIVAL_NAME] if model.curve_width else [OUTPUT_NAME]
    got = session.run(names, {INPUT_NAME: x})
    with torch.no_grad():
        xt = torch.from_numpy(x)
        want = [model(xt).numpy()] + ([model.survival(xt).numpy()] if model.curve_width else [])
    diff = 0.0
    for name, g, w in zip(names, got, want):
        if g.shape != w.shape:
            raise ExportParityError(f"onnxruntime returned {name} of shape {g.shape}, torch {w.shape}")
        if len(x):
            diff = max(diff, float(np.max(np.abs(g - w))))
    return diff


def write_gate_dir(out_dir: str, model: GateMLP, spec: GateSpec, token_flags: np.ndarray,
                   parity_rows: np.ndarray, max_abs_diff: float = 1e-4) -> float:
    """Export, check parity, then write the gate directory atomically. Returns the parity."""
    proto = to_onnx(model)
    diff = parity(proto, model, parity_rows)
    if not diff <= max_abs_diff:
        raise ExportParityError(f"onnxruntime differs from torch by {diff:.3g} (> {max_abs_diff:g}) on held-out rows")
    export_info = {"opset": OPSET, "parity_max_abs_diff": diff, "parity_rows": int(len(parity_rows))}
    data = {**spec.to_json(), "export": export_info}
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; a gate folder is read by servers of other users
    try:
        onnx.save(proto, os.path.join(tmp, "gate.onnx"))
        np.save(os.path.join(tmp, "token_flags.npy"), token_flags.astype(np.uint16))
        with open(os.path.join(tmp, "gate.json"), "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        if os.path.exists(out_dir):
            leftovers = set(os.listdir(out_dir)) - set(FILES) - {"metrics.json", "calibration.png"}
            if leftovers:
                raise FileExistsError(f"{out_dir} exists and holds other files ({', '.join(sorted(leftovers))}); "
                                      "choose a new folder")
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return diff
