"""Per-request control (sglang_hvd/request_control.py): the ``hvd`` request field, honoured
by the one decision, and each request's own figures, which add up to the server's."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from sglang_hvd.decision import DecisionRule, decide
from sglang_hvd.drafter import create_drafter
from sglang_hvd.gate import Gate
from sglang_hvd.request_control import AUTO, CACHE, EAGLE3, FIGURES, OFF, control_of, parse_control
from sglang_hvd.request_state import RequestState
from sglang_hvd.serving.stepper import HVDStepper
from sglang_hvd.verify import RowPlan, VerifyShape
from tests.test_decision import ListGate, drafts


def test_the_field_accepts_four_values_and_names_them_when_refused():
    assert [parse_control(v) for v in (None, "auto", "off", "cache", "eagle3")] == [AUTO, AUTO, OFF, CACHE, EAGLE3]
    assert control_of({"hvd": "off", "hvd_source": "tau"}) == OFF and control_of(None) == AUTO
    assert control_of({"other": 1}) == AUTO
    for bad in ("OFF", "none", "", 0, True, ["off"]):
        with pytest.raises(ValueError, match=r'custom_params "hvd" must be one of auto, off, cache, eagle3 \(got '):
            parse_control(bad)


def test_each_row_gets_what_its_request_asked_for():
    shape = VerifyShape(4, 3, 16)
    long, short = list(range(20, 40)), [7, 8, 9, 10]
    # predicted: row 0 above the threshold, the others below it
    gate = ListGate([5.2, 0.7, 5.2, 0.7, 5.2, 0.7])
    control = np.array([AUTO, AUTO, OFF, CACHE, EAGLE3, CACHE], np.int8)
    plans = decide(gate, drafts(long, short, long, short, long, []), [RequestState([1, 2]) for _ in range(6)], shape,
                   DecisionRule(threshold=1.5, eagle_reserve=3), control=control)
    assert [plans.plan(i) for i in range(6)] == [
        RowPlan(12, 3),   # auto, predicted above: the cache draft beside 3 EAGLE3 nodes
        RowPlan(0, 15),   # auto, predicted below: EAGLE3's tree
        RowPlan(0, 0),    # off: nothing verified, whatever the gate says
        RowPlan(4, 0),    # cache: its draft although predicted below, and no EAGLE3 nodes beside it
        RowPlan(0, 15),   # eagle3: EAGLE3's tree although predicted above
        RowPlan(0, 0),    # cache without a cache draft: nothing verified
    ]
    assert plans.eagle3  # rows 1 and 4 still verify EAGLE3: the step drafts
    only = decide(ListGate([5.2, 0.7]), drafts(long, short), [RequestState([1]), RequestState([1])], shape,
                  DecisionRule(threshold=1.5), control=np.array([CACHE, OFF], np.int8))
    assert [only.plan(i) for i in range(2)] == [RowPlan(15, 0), RowPlan(0, 0)]  # a cache row of its own fills the row
    assert not only.eagle3  # no row verifies EAGLE3 nodes: the step skips EAGLE3's draft forwards
    at1 = decide(ListGate([5.2, 5.2, 0.7]), drafts(long, long, short), [RequestState([1]) for _ in range(3)],
                 VerifyShape(1, 3, 4), DecisionRule(threshold=1.5), control=np.array([OFF, AUTO, CACHE], np.int8))
    assert [at1.plan(i) for i in range(3)] == [RowPlan(0, 0), RowPlan(3, 0), RowPlan(3, 0)]


def test_off_requests_verify_nothing_and_every_requests_figures_add_up_to_the_servers(demo_dir):
    """Requests that repeat a block (their own tree drafts the rest): one per control,
    served side by side; each step emits the draft's right prefix plus one token."""
    gate = Gate(os.path.join(demo_dir, "gate"))
    shape = gate.verify_model.shape
    stepper = HVDStepper(create_drafter("python", gate.drafter_config), gate, shape,
                         rule=DecisionRule(threshold=-math.inf))
    block = list(range(300, 340))
    truth = {name: block * 4 for name in ("auto", "off", "cache", "eagle3")}
    outputs = {name: truth[name][:1] for name in truth}
    for name in truth:
        stepper.sync(name, block, outputs[name], control=parse_control(name))
    figures = {}
    while outputs:
        rids = list(outputs)
        plans = stepper.plan(rids)
        accepts = []
        for i, rid in enumerate(rids):
            out, want = outputs[rid], truth[rid]
            n = int(plans.cache_lens[i])
            right = 0  # a chain's right prefix (EAGLE3's rows: no token right)
            while right < n and want[len(out) + right] == plans.cache_tokens[i, right]:
                right += 1
            accepts.append(right)
        stepper.verified(rids, accepts)
        for rid, a in zip(rids, accepts):
            out = outputs[rid]
            out.extend(truth[rid][len(out):len(out) + a + 1])
            stepper.sync(rid, block, out)
            if len(out) >= 120:
                figures[rid] = stepper.finish(rid)
                del outputs[rid]
    assert figures["off"]["mode"] == "off" and figures["off"]["rows"] == figures["off"]["plain_rows"] > 100
    assert figures["off"]["cache_rows"] == figures["off"]["eagle3_verifies"] == 0
    assert figures["cache"]["eagle3_verifies"] == 0 and figures["cache"]["cache_accepted"] > 60
    assert figures["eagle3"]["cache_rows"] == 0 and figures["eagle3"]["eagle3_verifies"] == figures["eagle3"]["rows"]
    assert figures["auto"]["cache_rows"] > 0 and figures["auto"]["rows"] < figures["off"]["rows"]
    summary = stepper.summary()
    for key in FIGURES:
        assert sum(f[key] for f in figures.values()) == summary[key], key
