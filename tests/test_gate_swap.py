"""A hot gate swap's checks (sglang_hvd/serving/gate_swap.py) and the stepper's swap."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from sglang_hvd.calibration import OnlineCalibration
from sglang_hvd.drafter import create_drafter
from sglang_hvd.errors import HvdInputError
from sglang_hvd.gate import Gate
from sglang_hvd.harness.faults import gate_variant
from sglang_hvd.serving.config import HVDServingConfig
from sglang_hvd.serving.gate_swap import load_candidate
from sglang_hvd.serving.stepper import HVDStepper


@pytest.fixture
def served(demo_dir):
    return os.path.join(demo_dir, "gate")


def test_a_gate_of_the_same_shape_drafter_and_tokenizer_is_taken_with_the_servers_own_settings(served, tmp_path):
    current = Gate(served)
    config = HVDServingConfig(enable=True, gate=served, eagle_reserve=2)
    other = gate_variant(served, tmp_path / "b", decision={"threshold": 0.25})
    gate = load_candidate(config, current.verify_model.shape, current, other)
    assert gate.digest != current.digest and gate.rule.threshold == 0.25  # its own threshold ...
    assert gate.rule.eagle_reserve == 2  # ... and the server's explicit --hvd-eagle-reserve
    bounds = gate_variant(served, tmp_path / "c", drafter={"max_scan": current.drafter_config.max_scan + 8})
    assert load_candidate(config, current.verify_model.shape, current, bounds).digest != current.digest  # a bound


@pytest.mark.parametrize("changes, message", [
    (dict(drafter={"max_depth": 7}), r"/bad: its cache drafter settings differ from the served gate's: max_depth 7 "
                                     r"\(served: 64\); the drafter's state was built with the served ones"),
    (dict(tokenizer={"name": "llama3", "digest": "0123"}), r"/bad: trained for tokenizer llama3 \(0123\), the served "
                                                           r"gate for "),
    (dict(verify={"shape": {"topk": 1, "steps": 3, "nodes": 4}, "eagle3_curve": "1:1.0,2:1.4,3:1.6"}),
     r"was trained for verify rows of topk 1, steps 3, 4 nodes, but this server verifies topk 4"),
])
def test_a_gate_that_does_not_fit_the_server_is_refused_in_one_line(served, tmp_path, changes, message):
    current = Gate(served)
    bad = gate_variant(served, tmp_path / "bad", **changes)
    with pytest.raises(HvdInputError, match=message):
        load_candidate(HVDServingConfig(enable=True, gate=served), current.verify_model.shape, current, bad)


def test_a_missing_or_broken_directory_is_refused(served, tmp_path):
    current = Gate(served)
    config = HVDServingConfig(enable=True, gate=served)
    with pytest.raises(HvdInputError, match="no such gate directory on the server's machine"):
        load_candidate(config, current.verify_model.shape, current, str(tmp_path / "none"))
    broken = tmp_path / "broken"
    shutil.copytree(served, broken)
    os.remove(broken / "gate.onnx")
    with pytest.raises(HvdInputError, match="gate.onnx"):
        load_candidate(config, current.verify_model.shape, current, str(broken))


def test_the_stepper_serves_the_new_gate_and_starts_its_calibration_over(served, tmp_path):
    current = Gate(served)
    cal = OnlineCalibration(current.verify_model.shape.draft_nodes)
    stepper = HVDStepper(create_drafter("python", current.drafter_config), current, current.verify_model.shape,
                         calibration=cal)
    stepper.sync("a", [5, 6, 7] * 5, [5])
    b = cal.bucket("tau")
    for _ in range(40):
        cal.observe(b, 1.0, 4)
    assert cal.summary()["tau"]["labels"] == 40
    new = Gate(gate_variant(served, tmp_path / "b", decision={"threshold": 0.25}))
    stepper.swap_gate(new)
    assert stepper.gate is new and stepper.threshold == 0.25
    assert cal.summary() == {} and cal.bucket("tau") == b  # learned offsets gone, buckets kept
    assert cal.apply(np.array([1.0]), np.array([b]))[0] == 1.0


def test_a_cost_rule_takes_a_new_gates_eagle3_curve_and_learns_its_yield_anew(served, tmp_path):
    from sglang_hvd.serving.factory import build_stepper
    from sglang_hvd.verify import Eagle3Curve

    current = Gate(served)
    stepper = build_stepper(HVDServingConfig(enable=True, gate=served, profile="qwen3-8b-h200"),
                            current.verify_model.shape)
    for _ in range(40):
        stepper.eagle3_yield.observe(1, 1)  # a draft that accepts nothing: scale 1/3
    stepper._refresh_eagle3()
    learnt = stepper.step.eagle3_curve
    assert learnt != current.verify_model.eagle3
    same = Gate(gate_variant(served, tmp_path / "same", decision={"threshold": 0.25}))
    stepper.swap_gate(same)  # the same curve: what the rows showed stays
    assert stepper.step.eagle3_curve == learnt and stepper.eagle3_yield.rows == 40
    text = "1:1.2,3:1.4,15:1.6"
    other = Gate(gate_variant(served, tmp_path / "other", verify={"shape": current.verify_model.shape.to_json(),
                                                                  "eagle3_curve": text}))
    stepper.swap_gate(other)
    assert stepper.step.eagle3_curve == Eagle3Curve.parse(text) and stepper.eagle3_yield.rows == 0
