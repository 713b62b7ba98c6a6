"""hvd_exact (sglang_hvd/replay/exact.py): cost-aware HVD priced by each cache chain's true
accepted length, through the serving stepper and the one decision."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from sglang_hvd.cli.main import main as hvd
from sglang_hvd.cost_rule import CostRule, choose_mode
from sglang_hvd.decision import DecisionRule
from sglang_hvd.drafter import create_drafter
from sglang_hvd.replay.exact import ExactStepper, TruthScorer
from sglang_hvd.step_profile import DraftCost, ForwardCost, HostCost, StepProfile
from sglang_hvd.tiers import parse_tiers
from sglang_hvd.verify import Eagle3Curve, VerifyShape
from test_decision import drafts
from test_eval_load import small_traces

PROFILE = StepProfile(name="t", kind="measured", target_model="target", draft_model="draft", hardware="test",
                      verify=ForwardCost(1.0, 0.0, 0.0, 0.0), eagle3=DraftCost(0.0, 0.0, 0.0, 0.0, extend_ms=0.0),
                      hvd_cpu=HostCost(0.0, 0.0, 0.0))


def test_the_truth_scorer_counts_the_leading_tokens_the_recording_repeats():
    truth = TruthScorer()
    truth.rows = [np.array([5, 6, 9]), np.array([7, 8]), np.array([1, 2, 3]), np.array([], dtype=np.int64)]
    batch = drafts([5, 6, 7, 8], [7, 8, 9], [], [4])
    assert truth.predict(truth.extractor.features(batch, None)).tolist() == [2.0, 2.0, 0.0, 0.0]
    truth.rows = truth.rows[:2]
    with pytest.raises(ValueError, match="2 rows for a batch of 4"):
        truth.features(batch, None)


def test_true_lengths_are_priced_as_known():
    # a 1 ms verify at any width: 1-3-4 with EAGLE3 (curve 1.75 tokens at 3 nodes) against off. A chain that repeats
    # 3 tokens is worth 3 beyond the bonus, one that repeats none 0: that row keeps EAGLE3's chain (0.75)
    exact = CostRule(PROFILE, Eagle3Curve(), parse_tiers("off,1-3-4"), exact=True)
    mode, rows, expected, _ = choose_mode(exact, np.array([3.0, 0.0]), np.array([6, 6]), 0, 0.0, 15)
    assert (mode.name, rows.tolist(), expected) == ("1-3-4", [True, False], pytest.approx(2 + 3 + 0.75))
    # the gate's rule prices a prediction of 3 of 6 by payoff.py's model instead: less than 3 at 3 nodes
    gate = CostRule(PROFILE, Eagle3Curve(), parse_tiers("off,1-3-4"))
    assert choose_mode(gate, np.array([3.0, 0.0]), np.array([6, 6]), 0, 0.0, 15)[2] < 5.75
    with pytest.raises(ValueError, match="CostRule\\(exact=True\\)"):
        ExactStepper(create_drafter("python"), {}, VerifyShape(1, 3, 4), DecisionRule(), gate)


def test_hvd_exact_runs_by_load_beside_hvd(demo_dir, tmp_path, capsys):
    small_traces(demo_dir, str(tmp_path / "t.jsonl"))
    out = tmp_path / "load.json"
    assert hvd(["eval", str(tmp_path / "t.jsonl"), "--gate", os.path.join(demo_dir, "gate"), "--policies",
                "hvd,hvd_exact", "--concurrency", "2", "--json", str(out)]) == 0
    policies = json.loads(out.read_text())["by_concurrency"]["2"]["policies"]
    assert set(policies) == {"hvd", "hvd_exact"}
    for p in policies.values():
        assert 0 < p["cycles_per_1k"] < 1000 and p["tokens_per_s"] > 0
    # knowing each chain's accepted length, its cache rows accept more than the gate's (4.9 against 2.5 tokens here)
    assert policies["hvd_exact"]["mean_cache_accept"] > policies["hvd"]["mean_cache_accept"] + 1
    assert "hvd_exact" in capsys.readouterr().out
