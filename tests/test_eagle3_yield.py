"""EAGLE3's yield refreshed from served verifies (sglang_hvd/serving/eagle3_yield.py)."""

from __future__ import annotations

import pytest

from sglang_hvd.serving.eagle3_yield import Eagle3Yield
from sglang_hvd.verify import Eagle3Curve

BASE = Eagle3Curve.parse("1:1.45,3:1.75,15:2.1")


def test_a_node_count_replaces_its_point_once_it_has_enough_rows():
    y = Eagle3Yield(BASE, min_rows=4, alpha=0.5)
    for tokens in (2, 2, 3):
        y.observe(3, tokens)
    assert y.curve() is BASE and y.observed() == {}  # 3 rows < 4: the gate's curve
    y.observe(3, 1)
    assert y.observed() == {3: 2.0}  # the plain mean of 2, 2, 3, 1
    assert y.curve() == Eagle3Curve(((1, 1.45), (3, 2.0), (15, 2.1)))
    y.observe(3, 4)  # past min_rows: weighted, the newest row by alpha
    assert y.observed() == {3: 3.0}
    # a wider row never yields less: 15 nodes keep at least 3's tokens
    assert y.curve() == Eagle3Curve(((1, 1.45), (3, 3.0), (15, 3.0)))


def test_a_width_the_gate_never_named_becomes_a_point_and_no_drafts_are_ignored():
    y = Eagle3Yield(BASE, min_rows=1)
    y.observe(0, 1)
    y.observe(7, 2)
    assert y.curve() == Eagle3Curve(((1, 1.45), (3, 1.75), (7, 2.0), (15, 2.1)))
    with pytest.raises(ValueError, match="min_rows must be >= 1 and alpha in"):
        Eagle3Yield(BASE, alpha=0.0)


def test_a_cost_aware_stepper_values_eagle3_by_what_its_verifies_show(demo_dir):
    """Fleet replay draws EAGLE3's tokens from the gate's curve: after enough steps the
    stepper's served curve has the observed points, close to the gate's."""
    import os

    from sglang_hvd.gate import Gate
    from sglang_hvd.replay.fleet import serve_fleet
    from sglang_hvd.serving.config import HVDServingConfig
    from sglang_hvd.serving.factory import build_stepper
    from sglang_hvd.trace import iter_traces

    gate = Gate(os.path.join(demo_dir, "gate"))
    records = list(iter_traces(os.path.join(demo_dir, "traces.jsonl")))[:60]
    cfg = HVDServingConfig(enable=True, gate=os.path.join(demo_dir, "gate"), profile="qwen3-8b-h200")
    stepper = build_stepper(cfg, gate.verify_model.shape)
    stepper.eagle3_yield.min_rows = 20
    serve_fleet([[r] for r in records], stepper, gate.verify_model, 4)
    seen = stepper.eagle3_yield.observed()
    assert seen and stepper.stats.steps > 256
    served = stepper.step.eagle3_curve
    assert served != gate.verify_model.eagle3
    for nodes, tokens in seen.items():
        assert abs(tokens - gate.verify_model.eagle3.tokens(nodes)) < 0.35, (nodes, tokens)
