"""Online calibration (sglang_hvd/calibration.py): its guardrails, the decision reading the
calibrated payoff, labels in the serving stepper, and ``hvd_online`` in replay."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sglang_hvd.calibration import CalibrationConfig, CalibrationInput, OnlineCalibration
from sglang_hvd.decision import DecisionRule, decide
from sglang_hvd.drafter import DrafterConfig, create_drafter
from sglang_hvd.drafter.batch import DraftBatch
from sglang_hvd.drafter.protocol import Draft
from sglang_hvd.features import FeatureExtractor
from sglang_hvd.request_state import RequestState
from sglang_hvd.scorer import WithoutCurve
from sglang_hvd.serving.stepper import HVDStepper
from sglang_hvd.verify import RowPlan, VerifyShape


def test_the_docstring_example():
    cal = OnlineCalibration(15, CalibrationConfig(min_samples=2, min_rate=0.5, max_step=1.0))
    b = cal.bucket("tau-bench")
    cal.observe(b, 1.2, 4)
    assert cal.apply(np.array([1.3]), np.array([b]))[0] == 1.3  # one label: below min_samples, unchanged
    cal.observe(b, 1.4, 4)
    assert cal.apply(np.array([1.3]), np.array([b]))[0] == pytest.approx(3.1)
    assert cal.apply(np.array([0.7, 1.6]), np.array([b, b])).tolist() == [0.7, 1.6]  # other bins untouched


def test_few_labels_change_nothing_and_a_constant_bias_is_learned_per_bucket():
    cal = OnlineCalibration(15)  # defaults: 32 labels per bin, 0.25 tokens a label at most
    a, other = cal.bucket("a"), cal.bucket("b")
    for _ in range(31):
        cal.observe(a, 1.2, 3.2)
    assert cal.apply(np.array([1.2]), np.array([a]))[0] == 1.2
    cal.observe(a, 1.2, 3.2)
    first = cal.apply(np.array([1.2]), np.array([a]))[0]
    assert 1.2 < first <= 1.2 + 32 * 0.25  # acting now, by bounded steps
    rng = np.random.default_rng(0)
    for p in rng.uniform(0, 10, 20_000):
        cal.observe(a, float(p), float(p) + 1.5)
    probe = np.array([0.3, 1.7, 2.5, 5.0, 9.0])
    assert np.allclose(cal.apply(probe, np.full(5, a)), probe + 1.5, atol=0.02)
    assert cal.apply(probe, np.full(5, other)).tolist() == probe.tolist()  # another source: its own map
    before = cal.apply(np.array([5.0]), np.array([a]))[0]
    cal.observe(a, 5.0, 1000.0)  # one wild label moves a bin by at most max_step
    assert cal.apply(np.array([5.0]), np.array([a]))[0] - before <= 0.25 + 1e-12
    s = cal.summary()["a"]
    assert s["labels"] == 20_033 and s["realized"] > s["predicted"] and s["served_error"] < s["gate_error"]
    assert s["bins_acting"] == 9 and "b" not in cal.summary()  # 9 bins below 12 tokens; b: no labels


def test_reset_nan_cap_and_bounded_buckets():
    cal = OnlineCalibration(3, CalibrationConfig(min_samples=1, max_step=10.0, max_buckets=3))
    assert [cal.bucket(s) for s in ("a", None, "c", "d", "a")] == [0, 1, 2, 2, 0]  # None: "served"; c, d: "other"
    assert set(cal._names) == {"a", "served", "other"}
    cal.observe(0, 2.5, 3)
    cal.observe(0, 0.2, 3)
    assert cal.apply(np.array([2.5, np.nan, 0.2]), np.array([0, 0, 0])).tolist()[0] == 3.0
    out = cal.apply(np.array([2.5, np.nan, 0.2]), np.array([0, 0, 0]))
    assert math.isnan(out[1]) and out[2] == pytest.approx(3.0)
    cal.observe(0, 20.0, 3)  # a prediction past the cap: its bin, clipped on the way out
    assert cal.apply(np.array([20.0]), np.array([0]))[0] == 3.0
    cal.reset()  # a new gate: nothing learned holds
    assert cal.apply(np.array([2.5]), np.array([0]))[0] == 2.5 and cal.summary() == {}
    assert cal.bucket("a") == 0  # the sources keep their buckets (live requests hold the ids)


@pytest.mark.parametrize("kwargs, message", [
    (dict(min_samples=0), "min_samples must be >= 1"),
    (dict(min_rate=0.0), "min_rate must be in"),
    (dict(min_rate=float("nan")), "min_rate must be in"),
    (dict(max_step=float("inf")), "max_step must be a finite number > 0"),
    (dict(max_buckets=1), "max_buckets must be >= 2"),
])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CalibrationConfig(**kwargs)


class Doubtful(WithoutCurve):  # a gate that always predicts 0.4 accepted tokens: below the threshold
    rule = DecisionRule(threshold=1.0)
    reads_trees = False

    def __init__(self, extractor):
        self.extractor = extractor

    def predict(self, x):
        return np.full(len(x), 0.4, dtype=np.float32)


def test_the_decision_reads_the_calibrated_payoff():
    gate = Doubtful(FeatureExtractor(np.zeros(20, np.uint16), DrafterConfig()))
    drafts = DraftBatch.of([Draft(tokens=(5, 6, 7), probs=(1.0, 1.0, 1.0), child_counts=(1, 1, 1), score=3.0), Draft()])
    cal = OnlineCalibration(3, CalibrationConfig(min_samples=1, max_step=5.0))
    b = cal.bucket("x")
    shape = VerifyShape(1, 3, 4)

    def plan():
        return decide(gate, drafts, [RequestState([1, 2]), RequestState([1, 2])], shape, gate.rule,
                      calibration=CalibrationInput(cal, np.array([b, b])))

    assert plan().plan(0) == RowPlan(0, 3)  # cold: the gate's 0.4 <= 1.0, EAGLE3's row
    cal.observe(b, 0.4, 3)
    p = plan()
    assert p.plan(0) == RowPlan(3, 0) and p.plan(1) == RowPlan(0, 3)  # 0.4 served as 3.0; no draft: EAGLE3
    assert p.predicted[0] == np.float32(0.4)  # the plan keeps the gate's own value


def test_the_stepper_labels_drafts_by_the_output_and_learns_from_them():
    gate = Doubtful(FeatureExtractor(np.zeros(50, np.uint16), DrafterConfig()))
    cal = OnlineCalibration(3, CalibrationConfig(min_samples=1, max_step=5.0))
    st = HVDStepper(create_drafter("python", DrafterConfig(max_spec_factor=1.0, max_spec_offset=0.0)), gate,
                    VerifyShape(1, 3, 4), calibration=cal)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]
    st.sync("r", prompt, [], source="tau-bench")
    output: list[int] = []
    plans = []
    for token in (4, 5, 1, 2):  # the output repeats the prompt; each EAGLE3 verify emits one token
        p = st.plan(["r"])
        plans.append(p.plan(0))
        st.verified(["r"], [0])
        output.append(token)
        st.sync("r", prompt, output)
    # the first draft (4 5 1) is labelled once 3 tokens of output passed it: all 3 accepted
    assert plans[:3] == [RowPlan(0, 3)] * 3 and plans[3] == RowPlan(3, 0)
    s = cal.summary()
    assert list(s) == ["tau-bench"] and s["tau-bench"]["labels"] == 2  # drafts at 0 and 1 labelled; 2, 3 waiting
    assert s["tau-bench"]["realized"] == 3.0 and s["tau-bench"]["predicted"] == pytest.approx(0.4)
    st.finish("r")  # the rest are labelled by the output as it ended
    assert cal.summary()["tau-bench"]["labels"] == 4


def test_replay_s_online_policy_learns_a_label_only_once_its_walk_has_passed_it():
    from types import SimpleNamespace

    from sglang_hvd.replay.policies import GatePolicy

    cal = OnlineCalibration(15, CalibrationConfig(min_samples=1))
    policy = GatePolicy(None, DecisionRule(), name="hvd_online", calibration=cal)
    b = cal.bucket("s")
    policy._labels.extend([("r", 0, 3, 0.5, b), ("r", 2, 0, 0.5, b)])  # labels 3 (known at pos 4) and 0 (at pos 3)

    def labelled():
        return cal.summary().get("s", {}).get("labels", 0)

    policy._observe_passed(SimpleNamespace(req_id="r", pos=3))
    assert labelled() == 0  # the first draft's run (positions 0-2) and the token after it (3) are not all out yet
    policy._observe_passed(SimpleNamespace(req_id="r", pos=4))
    assert labelled() == 2  # in order: the first, then the second (known since position 3)
    policy._labels.append(("r", 4, 9, 0.5, b))
    policy._observe_passed(SimpleNamespace(req_id="q", pos=0))  # another request: "r" ended, its output is whole
    assert labelled() == 3 and not policy._labels
