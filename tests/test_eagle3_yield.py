"""EAGLE3's yield refreshed from served verifies (sglang_hvd/serving/eagle3_yield.py)."""

from __future__ import annotations

import pytest

from sglang_hvd.serving.eagle3_yield import Eagle3Yield
from sglang_hvd.verify import Eagle3Curve

BASE = Eagle3Curve.parse("1:1.45,3:1.75,15:2.1")


def points(curve: Eagle3Curve) -> list[float]:
    return [x for point in curve.points for x in point]


def test_the_curve_is_the_gates_until_rows_show_otherwise_then_scaled_by_their_gain():
    y = Eagle3Yield(BASE, prior_rows=2, alpha=0.25)
    assert y.curve() is BASE and y.scale() == 1.0 and not y.stale()
    y.observe(3, 1)  # gain 0 where 0.75 was expected; the prior weighs two rows: (2 * 0.75 + 0) / 3
    assert y.rows == 1 and y.scale() == pytest.approx(2 / 3) and y.stale()
    assert points(y.curve()) == pytest.approx([1, 1.3, 3, 1.5, 15, 1.0 + 2 / 3 * 1.1])
    assert not y.stale()  # nothing observed since that curve
    y.observe(15, 2)  # 1 / 4 == alpha: gain 0.5 -> 0.625 (towards 1), expected 0.75 -> 0.8375 (towards 1.1)
    assert y.scale() == pytest.approx(0.625 / 0.8375)
    y.observe(1, 4)  # 1 / 5 < alpha: each mean moves by alpha towards the row (gain 3, expected 0.45)
    gain, expected = 0.625 + 0.25 * (3 - 0.625), 0.8375 + 0.25 * (0.45 - 0.8375)
    assert y.scale() == pytest.approx(gain / expected)  # 1.21875 / 0.740625
    # one factor for every width: the curve keeps the gate's shape
    s = gain / expected
    assert points(y.curve()) == pytest.approx([1, 1 + 0.45 * s, 3, 1 + 0.75 * s, 15, 1 + 1.1 * s])


def test_a_draft_that_accepts_nothing_is_priced_so_within_a_few_dozen_rows():
    y = Eagle3Yield(BASE)  # the served defaults
    for _ in range(40):
        y.observe(1, 1)
    assert y.scale() == pytest.approx(1 / 3)  # 20 * 0.45 / 60 over 0.45
    assert points(y.curve()) == pytest.approx([1, 1.15, 3, 1.25, 15, 1 + 1.1 / 3])
    y.observe(1, 1)  # 0.3279: moved 1.6% of itself, less than the 2% worth a new curve
    assert not y.stale()
    y.observe(1, 1)  # 0.3226: 3.2%
    assert y.stale()
    y.curve()
    assert not y.stale()


def test_rows_of_mixed_widths_that_realise_the_curve_leave_it_as_it_is():
    """Replay's Eagle3Stream carries one request's fraction across widths: a 15-node row
    after 3-node rows may draw below 2.1 and a 3-node row above 1.75; their total is the
    curve's. Read per width they would bias the curve; read as one factor they do not."""
    from sglang_hvd.verify import Eagle3Stream

    y, stream = Eagle3Yield(BASE), Eagle3Stream()
    for i in range(400):
        nodes = 15 if i % 4 == 3 else 3
        y.observe(nodes, stream.draw(BASE.tokens(nodes)))
    assert y.scale() == pytest.approx(1.0, abs=0.02)


def test_no_draft_nodes_are_ignored_and_bad_settings_refused():
    y = Eagle3Yield(BASE, prior_rows=0)
    y.observe(0, 1)
    assert y.rows == 0 and y.curve() is BASE
    y.observe(7, 1)  # no prior: one row of no gain is a scale of 0
    assert y.curve().points == ((1, 1.0), (3, 1.0), (15, 1.0))
    with pytest.raises(ValueError, match="prior_rows must be >= 0, alpha in"):
        Eagle3Yield(BASE, alpha=0.0)
    with pytest.raises(ValueError, match="tolerance in"):
        Eagle3Yield(BASE, tolerance=1.0)


def test_a_cost_aware_stepper_values_eagle3_by_what_its_verifies_show(demo_dir):
    """Fleet replay draws EAGLE3's tokens from the gate's curve: after its steps the
    stepper's served curve is the gate's, scaled by a factor near 1 (below it here: each
    request's stream starts with no fraction carried, so its first rows round down, and
    60 requests hold only ~100 EAGLE3 rows)."""
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
    serve_fleet([[r] for r in records], stepper, gate.verify_model, 4)
    y = stepper.eagle3_yield
    assert y.rows > 100 and 0.85 < y.scale() < 1.0, (y.rows, y.scale())
    base = gate.verify_model.eagle3
    served = stepper.step.eagle3_curve  # the last refresh's scale: within the tolerance of the scale now
    assert served != base and [m for m, _ in served.points] == [m for m, _ in base.points]
    for (_, t), (_, b) in zip(served.points, base.points):
        assert abs((t - 1.0) / (b - 1.0) - y.scale()) <= 0.02 * y.scale() + 1e-9
