"""Serving core without sglang: env configuration, the per-step stepper, trace recording."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from sglang_hvd.decision import DecisionRule, decide
from sglang_hvd.drafter import DrafterConfig, create_drafter
from sglang_hvd.drafter.batch import DraftBatch
from sglang_hvd.drafter.native_drafter import native_available
from sglang_hvd.drafter.protocol import Draft
from sglang_hvd.errors import HvdInputError
from sglang_hvd.features import FeatureExtractor
from sglang_hvd.gate import Gate
from sglang_hvd.replay.engine import iter_serving
from sglang_hvd.replay.fleet import serve_fleet
from sglang_hvd.replay.policies import GatePolicy, RulePolicy
from sglang_hvd.replay.simulate import simulate
from sglang_hvd.request_state import RequestState
from sglang_hvd.scorer import ScoreRule, WithoutCurve
from sglang_hvd.serving.config import HVDServingConfig
from sglang_hvd.serving.recorder import TraceRecorder
from sglang_hvd.serving.stepper import HVDStepper
from sglang_hvd.trace import TokenizerId, TraceRecord, iter_traces, token_array
from sglang_hvd.verify import RowPlan, VerifyModel, VerifyShape


def test_config_round_trips_through_the_environment():
    cfg = HVDServingConfig(enable=True, gate="/g", threshold=1.5, eagle_reserve=3, cache_siblings=4, drafter="python",
                           drafter_overrides=(("max_depth", 32), ("global_max_tokens", 1000)), record_traces="/t.jsonl")
    env = cfg.to_env()
    assert env["SGLANG_HVD_ENABLE"] == "1" and env["SGLANG_HVD_GATE"] == "/g" and env["SGLANG_HVD_MAX_DEPTH"] == "32"
    assert env["SGLANG_HVD_EAGLE_RESERVE"] == "3" and env["SGLANG_HVD_CACHE_SIBLINGS"] == "4"
    assert "SGLANG_HVD_SCORE_RULE" not in env
    assert HVDServingConfig.from_env(env) == cfg
    rule = HVDServingConfig(enable=True, gate="/g", score_rule=2.5)
    assert rule.to_env()["SGLANG_HVD_SCORE_RULE"] == "2.5" and HVDServingConfig.from_env(rule.to_env()) == rule
    # a resource bound may differ from the gate's; what shapes drafts must not
    assert cfg.drafter_config(DrafterConfig(max_depth=32)).global_max_tokens == 1000
    with pytest.raises(HvdInputError, match=r"SGLANG_HVD_MAX_DEPTH=32: the gate was trained with max_depth 64, and its "
                                            r"features describe drafts of those settings; drop SGLANG_HVD_MAX_DEPTH"):
        cfg.drafter_config(DrafterConfig())
    assert HVDServingConfig.from_env({}) == HVDServingConfig()  # nothing set: HVD off


@pytest.mark.parametrize("env, message", [
    ({"SGLANG_HVD_ENABLE": "1"}, "SGLANG_HVD_ENABLE=1 needs a gate: set SGLANG_HVD_GATE=DIR"),
    ({"SGLANG_HVD_ENABLE": "yes"}, "SGLANG_HVD_ENABLE must be 0 or 1, got 'yes'"),
    ({"SGLANG_HVD_THRESHOLD": "high"}, "SGLANG_HVD_THRESHOLD='high' is not a valid float"),
    ({"SGLANG_HVD_MAX_DEPTH": "1.5"}, "SGLANG_HVD_MAX_DEPTH='1.5' is not a valid int"),
    ({"SGLANG_HVD_EAGLE_RESERVE": "-1"}, "SGLANG_HVD_EAGLE_RESERVE must be >= 0, got -1"),
    ({"SGLANG_HVD_CACHE_SIBLINGS": "-2"}, "SGLANG_HVD_CACHE_SIBLINGS must be >= 0, got -2"),
    ({"SGLANG_HVD_SCORE_RULE": "2", "SGLANG_HVD_THRESHOLD": "1"}, "SGLANG_HVD_SCORE_RULE replaces the gate: set one"),
    ({"SGLANG_HVD_SCORE_RULE": "nan"}, "SGLANG_HVD_SCORE_RULE must be a finite score, got nan"),
    ({"SGLANG_HVD_TIERS": "off,1-3-4"}, "SGLANG_HVD_TIERS picks among tiers by a step-time profile: also set "
                                        "SGLANG_HVD_PROFILE"),
    ({"SGLANG_HVD_TIER_CYCLE": "on"}, "SGLANG_HVD_TIER_CYCLE must be 0 or 1, got 'on'"),
])
def test_bad_environment_is_named(env, message):
    with pytest.raises(HvdInputError, match=message):
        HVDServingConfig.from_env(env)


class FailingGate(WithoutCurve):
    reads_trees = False

    def __init__(self, real):
        self.extractor = real.extractor
        self.rule = real.rule

    def predict(self, x):
        raise RuntimeError("onnxruntime exploded")


def serve(records, stepper, model: VerifyModel, concurrency=4, log=None):
    """Fleet replay (replay/fleet.py) of ``records``, each its own conversation; returns
    what each request emitted. ``log`` collects (req_id, pos, plan, predicted) of every
    verified row."""
    on_step = None if log is None else (lambda s: log.append((s.req_id, s.pos, s.plan, s.predicted)))
    return serve_fleet([[r] for r in records], stepper, model, concurrency, on_step=on_step).emitted


@pytest.fixture
def demo_gate(demo_dir):
    return Gate(os.path.join(demo_dir, "gate"))


@pytest.mark.parametrize("siblings", [0, 4])
def test_stepper_serves_losslessly_and_records_replayable_traces(demo_dir, demo_gate, tmp_path, siblings):
    records = list(iter_traces(os.path.join(demo_dir, "traces.jsonl")))[:40]
    recorder = TraceRecorder(str(tmp_path / "served.jsonl"))
    rule = dataclasses.replace(demo_gate.rule, cache_siblings=siblings)
    stepper = HVDStepper(create_drafter("python", demo_gate.drafter_config), demo_gate, demo_gate.verify_model.shape,
                         rule=rule, recorder=recorder, tokenizer=records[0].tokenizer)
    emitted = serve(records, stepper, demo_gate.verify_model)
    recorder.close()
    for r in records:
        assert emitted[r.req_id] == r.output_ids.tolist()
    summary = stepper.summary()
    assert summary["gate_errors"] == 0 and 0.2 < summary["cache_pick_rate"] < 1.0
    assert summary["two_branch_rate"] > 0.0  # the demo gate's shape (topk 4) keeps EAGLE3 nodes beside cache drafts
    assert summary["cache_mean_accept"] > 2 * summary["eagle3_mean_accept"]
    back = {r.req_id: r for r in iter_traces(str(tmp_path / "served.jsonl"))}
    assert set(back) == {r.req_id for r in records} and recorder.num_dropped == 0
    for r in records:
        got = back[r.req_id]
        assert got.prompt_ids.tolist() == r.prompt_ids.tolist() and got.output_ids.tolist() == r.output_ids.tolist()
        # Every step's accepted prefix is, by the trace reader's own check, the emitted text.
        assert {s.src for s in got.steps} <= {"cache", "eagle3"} and got.steps[0].pos == 1  # token 0: the prefill
        assert all(b.pos == a.pos + a.accept_len + 1 for a, b in zip(got.steps, got.steps[1:]))
    assert stepper.running() == []


@pytest.mark.parametrize("siblings", [0, 4])
def test_server_and_replay_make_the_same_decisions_step_by_step(demo_dir, demo_gate, siblings):
    """The one decision path: the serving stepper (one request at a time, so its global
    cache evolves as replay's does) and replay's hvd policy plan every row alike, tree
    rows (cache siblings) included."""
    records = list(iter_traces(os.path.join(demo_dir, "traces.jsonl")))[:60]
    model = demo_gate.verify_model
    rule = dataclasses.replace(demo_gate.rule, cache_siblings=siblings)
    served = []
    stepper = HVDStepper(create_drafter("native", demo_gate.drafter_config), demo_gate, model.shape, rule=rule)
    trees = []  # rows whose cache branch is not a chain
    plan = stepper.plan

    def logged(rids):
        plans = plan(rids)
        for i in range(len(rids)):
            n = int(plans.cache_lens[i])
            trees.append(plans.cache_parents[i, :n].tolist() != list(range(-1, n - 1)))
        return plans

    stepper.plan = logged
    serve(records, stepper, model, concurrency=1, log=served)
    assert (sum(trees) > 100) == (siblings > 0)
    policy = GatePolicy(demo_gate, rule)
    drafter = create_drafter("python", demo_gate.drafter_config)
    replayed = [(s.req_id, s.pos, s.plan)
                for s in iter_serving(records, drafter, [policy], model, prefill_first=True) if s.pos]
    assert len(served) == len(replayed) > 1000  # verify steps of 60 requests
    assert [(rid, pos, plan) for rid, pos, plan, _ in served] == replayed
    # Same predictions, bit for bit, for every judged draft.
    assert [p for *_, p in served if p == p] == [p for _, p, _ in policy.judged]
    kinds = {plan.kind for _, _, plan in replayed}
    two_branch = sum(plan.cache_len > 0 and plan.eagle_nodes > 0 for _, _, plan in replayed)
    assert kinds == {"cache", "eagle3"} and two_branch > 0


def test_the_served_score_rule_is_replays_rule_at_topk_1(demo_dir, demo_gate):
    """--hvd-score-rule: the serving decision with draft scores in the gate's place. On
    chains it verifies exactly the rows of replay's score rule (RulePolicy), so both
    replays give the same cycles, and the stepper plans the same rows."""
    records = list(iter_traces(os.path.join(demo_dir, "traces.jsonl")))[:40]
    model = VerifyModel(VerifyShape(1, 3, 4), demo_gate.verify_model.eagle3)
    served_rule = ScoreRule(demo_gate, 2.0)
    assert served_rule.decision == "score >= 2" and served_rule.digest == demo_gate.digest
    gated = GatePolicy(served_rule, served_rule.rule, "rule")
    baseline = RulePolicy(2.0)
    result = simulate(records, create_drafter("native", demo_gate.drafter_config), [gated, baseline], model)
    a, b = result.overall.policy("rule").to_json(), result.overall.policy("rule@2").to_json()
    assert a["cycles_per_1k"] == b["cycles_per_1k"] and a["cache_pick_rate"] == b["cache_pick_rate"] > 0.1
    # A score of exactly the minimum is taken (>=), one just below is not.
    arrays = DraftBatch.of([Draft((5, 6), (1.0, 1.0), (1, 1), 2.0, 2, 2, "local"),
                           Draft((5, 6), (1.0, 0.99), (1, 1), 1.99, 2, 2, "local"), Draft()], 4)
    plans = decide(served_rule, arrays, [RequestState([1, 2]) for _ in range(3)], model.shape, served_rule.rule)
    assert plans.use_cache.tolist() == [True, False, False]
    assert plans.predicted[:2].tolist() == pytest.approx([2.0, 1.99])


def test_a_gate_failing_at_run_time_falls_back_to_eagle3(demo_dir, demo_gate, caplog):
    records = list(iter_traces(os.path.join(demo_dir, "traces.jsonl")))[:6]
    stepper = HVDStepper(create_drafter("python", demo_gate.drafter_config), FailingGate(demo_gate),
                         demo_gate.verify_model.shape)
    with caplog.at_level("ERROR"):
        emitted = serve(records, stepper, demo_gate.verify_model)
    assert all(emitted[r.req_id] == r.output_ids.tolist() for r in records)
    s = stepper.summary()
    assert s["gate_errors"] == s["steps"] > 0 and s["cache_pick_rate"] == 0.0
    assert caplog.text.count("HVD gate failed at run time (RuntimeError: onnxruntime exploded)") == 1


def test_recorder_drops_rather_than_blocks(tmp_path):
    import threading

    from sglang_hvd.trace import TokenizerId, TraceRecord, token_array

    class HeldFile:  # the writer's file, whose first write waits until the test lets it go
        def __init__(self, f):
            self.f, self.entered, self.go = f, threading.Event(), threading.Event()

        def write(self, text):
            self.entered.set()
            self.go.wait(30)
            return self.f.write(text)

        def __getattr__(self, name):
            return getattr(self.f, name)

    rec = TraceRecorder(str(tmp_path / "t.jsonl.gz"), max_queue=1, flush_s=0.05)
    held = rec._file = HeldFile(rec._file)

    def record(rid):
        return rec.record(TraceRecord(rid, rid, 0, "s", TokenizerId("t", "d"), token_array([1]), token_array([2])))

    assert record("a") is True and held.entered.wait(30)  # the writer holds "a", stuck in its write
    assert record("b") is True  # the queue's only slot
    assert record("c") is False and rec.num_dropped == 1  # a full queue drops, it does not block
    held.go.set()
    rec.close()
    assert [x.req_id for x in iter_traces(str(tmp_path / "t.jsonl.gz"))] == ["a", "b"]
    assert (rec.num_written, rec.num_failed, rec.num_dropped) == (2, 0, 1)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device whose writes fail: disk full)")
def test_a_full_disk_costs_records_not_the_recorder(caplog):
    import logging

    from sglang_hvd.trace import TokenizerId, TraceRecord, token_array

    rec = TraceRecorder("/dev/full", flush_s=0.05)  # every write: ENOSPC
    big = token_array([7] * 3000)  # more than the file buffer: the write itself fails
    with caplog.at_level(logging.ERROR, logger="sglang_hvd.serving.recorder"):
        for i in range(5):
            assert rec.record(TraceRecord(f"r{i}", "c", 0, "s", TokenizerId("t", "d"), big, big)) is True
        rec.record(TraceRecord("small", "c", 0, "s", TokenizerId("t", "d"), token_array([1]), token_array([2])))
        rec.close()  # returns: the writer thread is alive to take the stop
    assert not rec._thread.is_alive()
    assert (rec.num_written, rec.num_failed, rec.num_dropped) == (0, 6, 0)  # the small one fails at the flush
    errors = [r.getMessage() for r in caplog.records]
    assert len(errors) == 1 and "writing to /dev/full failed (OSError: [Errno 28] No space left on device)" in errors[0]


def test_a_stop_inside_an_accepted_run_is_recorded_consistently(tmp_path):
    rec = TraceRecorder(str(tmp_path / "t.jsonl"))
    st = HVDStepper(create_drafter("python"), None, VerifyShape(1, 3, 4), recorder=rec)
    st.sync("r", [1, 2, 3, 1, 2, 3, 1, 2], [])
    d = st.plan(["r"])
    st.verified(["r"], [3], np.array([[9, 9, 9]]))  # EAGLE3 row (no gate): 3 accepted + bonus = 4 tokens
    st.sync("r", [1, 2, 3, 1, 2, 3, 1, 2], [9, 9, 9, 4])
    st.finish("r", final_output=[9, 9])  # max_new_tokens=2 cut the run
    rec.close()
    (r,) = iter_traces(str(tmp_path / "t.jsonl"))
    assert r.output_ids.tolist() == [9, 9]
    assert [(s.pos, s.src, s.draft, s.accept_len) for s in r.steps] == [(0, "eagle3", (9, 9, 9), 2)]
    assert not d.use_cache[0] and d.plan(0) == RowPlan(0, 3)


class Sure(WithoutCurve):  # a gate that always predicts a long accepted run
    rule = DecisionRule(threshold=1.0, eagle_reserve=3)
    reads_trees = False

    def __init__(self, extractor):
        self.extractor = extractor

    def predict(self, x):
        return np.full(len(x), 9.0, dtype=np.float32)


def test_a_two_branch_row_won_by_eagle3_is_recorded_as_an_eagle3_step(tmp_path):
    rec = TraceRecorder(str(tmp_path / "t.jsonl"))
    st = HVDStepper(create_drafter("python", DrafterConfig(max_spec_factor=1.0, max_spec_offset=0.0)),
                    Sure(FeatureExtractor(np.zeros(50, np.uint16), DrafterConfig())),
                    VerifyShape(2, 3, 8), recorder=rec)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]
    st.sync("r", prompt, [])
    plans = st.plan(["r"])
    # "1 2 3 4 5 1 2 3" recurs: the draft 4 5 1 2 3 is cut to 7 - 3 (the reserve) = 4 tokens.
    assert plans.plan(0) == RowPlan(4, 3)
    assert plans.cache_tokens[0, :4].tolist() == [4, 5, 1, 2]
    st.verified(["r"], [2])  # the tree accepted 2 drafts ...
    st.sync("r", prompt, [7, 8, 9])  # ... EAGLE3's: the cache branch starts with 4, not 7
    plans = st.plan(["r"])
    st.verified(["r"], [0])
    st.sync("r", prompt, [7, 8, 9, 6])
    st.finish("r")
    rec.close()
    (r,) = iter_traces(str(tmp_path / "t.jsonl"))
    assert [(s.pos, s.src, s.draft, s.accept_len) for s in r.steps][0] == (0, "eagle3", (7, 8), 2)
    s = st.summary()
    assert (s["eagle3_branch_wins"], s["rows"]) == (1, 2) and s["two_branch_rate"] > 0


def test_a_tree_row_won_by_a_sibling_is_recorded_as_the_cache_branch_it_took(tmp_path):
    rec = TraceRecorder(str(tmp_path / "t.jsonl"))
    st = HVDStepper(create_drafter("python", DrafterConfig(max_spec_factor=4.0, max_spec_offset=0.0)),
                    Sure(FeatureExtractor(np.zeros(60, np.uint16), DrafterConfig())),
                    VerifyShape(2, 3, 8), rule=DecisionRule(threshold=1.0, eagle_reserve=0, cache_siblings=4),
                    recorder=rec)
    # after "1 2" the chain says 3 8 1 2 (2 of 3 times), the tree draft also 4 7 (1 of 3)
    prompt = [1, 2, 3, 8, 1, 2, 3, 8, 1, 2, 4, 7, 9, 1, 2]
    st.sync("r", prompt, [])
    plans = st.plan(["r"])
    assert plans.plan(0) == RowPlan(7, 0)
    assert plans.cache_tokens[0].tolist() == [3, 8, 1, 2, 4, 7, 9]  # the chain's 7 first (capped at N-1)...
    plans_parents = plans.cache_parents[0].tolist()
    assert plans_parents == [-1, 0, 1, 2, 3, 4, 5]  # ... the chain fills the row: no room for siblings
    st.verified(["r"], [0])
    st.sync("r", prompt, [5])
    st.plan(["r"])  # context ... 1 2 5: no draft
    st.verified(["r"], [0])
    st.sync("r", prompt, [5, 1])
    st.finish("r")
    # a shorter chain: "9 1 2" was seen once, followed by nothing; "1 2" drafts 3 8 1 2 ... and the sibling 4 7
    st2 = HVDStepper(create_drafter("python", DrafterConfig(max_spec_factor=1.0, max_spec_offset=0.0)), st.gate,
                     VerifyShape(2, 3, 8), rule=DecisionRule(threshold=1.0, eagle_reserve=0, cache_siblings=4),
                     recorder=rec)
    st2.sync("q", prompt, [])
    plans = st2.plan(["q"])
    n = int(plans.cache_lens[0])
    assert plans.cache_tokens[0, :n].tolist() == [3, 8, 4, 7] and plans.cache_parents[0, :n].tolist() == [-1, 0, -1, 2]
    assert plans.plan(0) == RowPlan(4, 3)
    st2.verified(["q"], [2])  # the verify accepted 2 tokens ...
    st2.sync("q", prompt, [4, 7, 5])  # ... down the sibling 4 7
    st2.finish("q")
    rec.close()
    got = {r.req_id: r for r in iter_traces(str(tmp_path / "t.jsonl"))}
    assert [(s.pos, s.src, s.draft, s.accept_len) for s in got["q"].steps] == [(0, "cache", (4, 7), 2)]
    s = st2.summary()
    got_counts = (s["cache_rows"], s["tree_rows"], s["sibling_wins"], s["cache_accepted"], s["eagle3_branch_wins"])
    assert got_counts == (1, 1, 1, 2, 0)
    assert st.summary()["tree_rows"] == 0


def test_fleet_serves_turns_in_order_and_drafts_from_what_was_generated_before():
    def rec(conv: str, turn: int, prompt: list[int], out: list[int]) -> TraceRecord:
        return TraceRecord(f"{conv}/{turn}", conv, turn, "s", TokenizerId("t", "d"), token_array(prompt),
                           token_array(out))

    out = list(range(1000, 1060))  # no token repeats: a cache draft can only come from another response
    prompt = list(range(2000, 2030))
    convs = [[rec("a", 0, prompt, out), rec("a", 1, prompt + out + [7], [5, 6])], [rec("b", 0, prompt, out)]]
    model = VerifyModel(VerifyShape(1, 3, 4))

    def run(concurrency: int):
        st = HVDStepper(create_drafter("python", DrafterConfig()),
                        Sure(FeatureExtractor(np.zeros(50, np.uint16), DrafterConfig())),
                        model.shape, rule=DecisionRule(-np.inf, 0))
        steps = []
        result = serve_fleet(convs, st, model, concurrency, policy="x", on_step=steps.append)
        return result, steps, st

    for concurrency in (1, 2):
        result, steps, st = run(concurrency)
        assert result.emitted == {"a/0": out, "a/1": [5, 6], "b/0": out}
        assert st.running() == []
        order = [s.req_id for s in steps]
        assert max(i for i, r in enumerate(order) if r == "a/0") < min(i for i, r in enumerate(order) if r == "a/1")
        tally = result.sources["s"].policy("x")
        assert (result.sources["s"].requests, result.sources["s"].tokens, tally.tokens) == (3, 122, 122)
        b_cache = [s for s in steps if s.req_id == "b/0" and s.plan.cache_len]
        if concurrency == 1:  # b starts after a finished: a's response is in the global cache
            assert b_cache and len([s for s in steps if s.req_id == "b/0"]) < 25
            assert max(result.batch_sizes) == 1
        else:  # a and b in flight together, in step: neither has generated what the other needs next
            assert not b_cache and not [s for s in steps if s.req_id == "a/0" and s.plan.cache_len]
            assert max(result.batch_sizes) == 2


def test_sync_hands_the_drafter_each_steps_new_tokens_in_one_append_batch():
    calls = []

    class Spy:
        """The python drafter, with the lifecycle calls the stepper makes logged."""

        def __init__(self):
            self.real = create_drafter("python", DrafterConfig())

        def __getattr__(self, name):
            method = getattr(self.real, name)
            if name not in ("start_request", "append", "append_batch", "speculate_arrays", "finish_request"):
                return method
            def logged(*args):
                calls.append((name, *(a.tolist() if isinstance(a, np.ndarray) else a for a in args[:2])))
                return method(*args)

            return logged

    drafter = Spy()
    stepper = HVDStepper(drafter, None, VerifyShape(1, 3, 4))
    stepper.sync("a", [1, 2, 3], [4])
    stepper.sync("b", [5, 6], [7, 8])
    stepper.sync("a", [1, 2, 3], [4, 9])
    stepper.plan(["a", "b"])
    stepper.sync("a", [1, 2, 3], [4, 9, 1])
    stepper.finish("a")
    # appends wait for the next call that needs them (a start, a step's drafts, a finish), in the order they came
    assert calls == [("start_request", "a", [1, 2, 3]), ("append_batch", ["a"], [[4]]),
                     ("start_request", "b", [5, 6]), ("append_batch", ["b", "a"], [[7, 8], [9]]),
                     ("speculate_arrays", ["a", "b"]), ("append_batch", ["a"], [[1]]), ("finish_request", "a")]
    assert drafter.context("b").tolist() == [5, 6, 7, 8] and drafter.memory_stats()["global_tokens"] == 5.0


def test_cost_aware_serving_settings_are_checked_before_serving(demo_dir, demo_gate, tmp_path):
    from sglang_hvd.serving.factory import build_stepper, cost_rule
    from sglang_hvd.step_profile import load_profile

    shape = demo_gate.verify_model.shape  # the demo gate's: 4-3-16
    gate_dir = os.path.join(demo_dir, "gate")
    cfg = HVDServingConfig(enable=True, gate=gate_dir, profile="qwen3-8b-h200", tiers="4-1-4,off", tier_cycle=False,
                           timings=str(tmp_path / "t.jsonl"))
    assert HVDServingConfig.from_env(cfg.to_env()) == cfg
    assert cost_rule(HVDServingConfig(enable=True, gate=gate_dir), demo_gate, shape) is None  # cost-blind
    rule = cost_rule(cfg, demo_gate, shape, "/models/qwen3-8b/")
    assert [t.name for t in rule.tiers] == ["off", "4-1-4", "4-3-16"] and rule.profile.name == "qwen3-8b-h200"
    assert [m.name for m in rule.modes] == ["off", "4-1-4/cache", "4-1-4", "4-3-16/cache", "4-3-16"]
    with pytest.raises(HvdInputError, match=r"--hvd-profile qwen3-8b-h200 times Qwen/Qwen3-8B .* but this server "
                                            r"serves /models/llama-3-8b: measure a profile for it \(hvd profile"):
        cost_rule(cfg, demo_gate, shape, "/models/llama-3-8b")
    with pytest.raises(HvdInputError, match="--hvd-tiers: tier 1-3-4: topk 1, but the server drafts at topk 4"):
        cost_rule(dataclasses.replace(cfg, tiers="off,1-3-4"), demo_gate, shape)
    measured = dataclasses.replace(load_profile("qwen3-8b-h100"), name="mine", kind="measured",
                                   target_model="/data/tiny-llama")
    measured.write(str(tmp_path / "p.json"))
    mine = dataclasses.replace(cfg, profile=str(tmp_path / "p.json"), tiers=None)
    assert cost_rule(mine, demo_gate, shape, "/elsewhere/TINY-LLAMA").profile.name == "mine"
    with pytest.raises(HvdInputError, match="no such profile file, and not a shipped estimate"):
        cost_rule(dataclasses.replace(cfg, profile=str(tmp_path / "missing.json")), demo_gate, shape)
    # the tier-cycle diagnostic: every mode in turn, whatever the profile
    stepper = build_stepper(HVDServingConfig(enable=True, gate=gate_dir, tier_cycle=True, drafter="python"), shape)
    assert [m.name for m in stepper.cycle] == ["off", "4-1-2/cache", "4-1-2", "4-1-4/cache", "4-1-4", "4-1-5/cache",
                                               "4-1-5", "4-2-8/cache", "4-2-8", "4-2-16/cache", "4-2-16", "4-3-16"]



@pytest.mark.skipif(not native_available(), reason="the native drafter is not built")
def test_the_server_drafts_on_the_threads_it_is_given_or_on_its_default(demo_dir, demo_gate):
    from sglang_hvd.drafter.native_drafter import default_draft_threads
    from sglang_hvd.serving.factory import build_stepper

    shape, gate_dir = demo_gate.verify_model.shape, os.path.join(demo_dir, "gate")
    assert build_stepper(HVDServingConfig(enable=True, gate=gate_dir, draft_threads=3), shape).drafter.threads == 3
    assert build_stepper(HVDServingConfig(enable=True, gate=gate_dir), shape).drafter.threads == default_draft_threads()
    # the reference drafter drafts on one thread: its default is 1
    assert not hasattr(build_stepper(HVDServingConfig(enable=True, gate=gate_dir, drafter="python"), shape).drafter,
                       "threads")

def test_a_cost_aware_stepper_counts_what_each_mode_expected_and_emitted(demo_dir, demo_gate):
    from sglang_hvd.serving.factory import build_stepper

    records = list(iter_traces(os.path.join(demo_dir, "traces.jsonl")))[:30]
    cfg = HVDServingConfig(enable=True, gate=os.path.join(demo_dir, "gate"), profile="qwen3-8b-h200",
                           drafter="python")
    stepper = build_stepper(cfg, demo_gate.verify_model.shape)
    emitted = serve(records, stepper, demo_gate.verify_model, concurrency=8)
    for r in records:
        assert emitted[r.req_id] == r.output_ids.tolist()
    st, s = stepper.stats, stepper.summary()
    # every step was a cost rule's pick: each mode run has its expected tokens, none other
    assert set(st.mode_expected) == set(st.modes) == set(st.mode_emitted) and len(st.modes) >= 2
    # a row emits its accepted tokens and the bonus: the modes' tokens add up to the stepper's counts
    assert sum(st.mode_emitted.values()) == s["rows"] + s["cache_accepted"] + s["eagle3_accepted"]
    # a step of rows emits, and expects, at least one token
    for mode, steps in st.modes.items():
        assert st.mode_emitted[mode] >= steps and st.mode_expected[mode] >= steps, mode

def test_a_stepper_cycling_through_every_tier_serves_losslessly_and_records_no_plain_steps(demo_dir, demo_gate,
                                                                                           tmp_path):
    from sglang_hvd.serving.factory import build_stepper

    records = list(iter_traces(os.path.join(demo_dir, "traces.jsonl")))[:30]
    cfg = HVDServingConfig(enable=True, gate=os.path.join(demo_dir, "gate"), tier_cycle=True,
                           record_traces=str(tmp_path / "served.jsonl"))
    stepper = build_stepper(cfg, demo_gate.verify_model.shape)
    emitted = serve(records, stepper, demo_gate.verify_model)
    stepper.recorder.close()
    for r in records:
        assert emitted[r.req_id] == r.output_ids.tolist()
    # One mode per step, in turn: each tier's share of the steps is its share of the cycle
    # (a mode with EAGLE3 counts as cache-only when no row kept an EAGLE3 node).
    modes, steps = stepper.stats.modes, stepper.stats.steps
    per_tier = {}
    for name, n in modes.items():
        per_tier[name.split("/")[0]] = per_tier.get(name.split("/")[0], 0) + n
    # 12 modes: off, and each tier with and without EAGLE3's draft but 4-3-16 (4-2-16/cache is the same step)
    assert sum(modes.values()) == steps and per_tier["off"] in (steps // 12, steps // 12 + 1)
    assert all(abs(per_tier[t] - 2 * steps / 12) <= 2 for t in ("4-1-2", "4-1-4", "4-1-5", "4-2-8", "4-2-16"))
    assert abs(per_tier["4-3-16"] - steps / 12) <= 2
    assert all(modes.get(f"{t}/cache", 0) > 0 and modes.get(t, 0) > 0 for t in ("4-1-4", "4-1-5", "4-2-8", "4-2-16"))
    s = stepper.summary()
    assert s["plain_rows"] > 0 and s["cache_rows"] > 0 and s["gate_errors"] == 0
    assert s["rows"] == s["plain_rows"] + s["cache_rows"] + s["eagle3_verifies"] - s["eagle3_branch_wins"]
    back = {r.req_id: r for r in iter_traces(str(tmp_path / "served.jsonl"))}
    assert set(back) == {r.req_id for r in records}
    for r in records:  # the trace reader checks each recorded step against the output
        assert back[r.req_id].output_ids.tolist() == r.output_ids.tolist()
