"""Serving core without sglang: env configuration, the per-step stepper, trace recording."""

from __future__ import annotations

import os

import numpy as np
import pytest

from sglang_hvd.drafter import DrafterConfig, create_drafter
from sglang_hvd.errors import HvdInputError
from sglang_hvd.replay.engine import accept_len
from sglang_hvd.serving.config import HVDServingConfig
from sglang_hvd.serving.recorder import TraceRecorder
from sglang_hvd.serving.stepper import HVDStepper
from sglang_hvd.trace import iter_traces


def test_config_round_trips_through_the_environment():
    cfg = HVDServingConfig(enable=True, gate="/g", threshold=1.5, drafter="python",
                           drafter_overrides=(("max_depth", 32), ("min_token_prob", 0.2)), record_traces="/t.jsonl")
    env = cfg.to_env()
    assert env["SGLANG_HVD_ENABLE"] == "1" and env["SGLANG_HVD_GATE"] == "/g" and env["SGLANG_HVD_MAX_DEPTH"] == "32"
    assert HVDServingConfig.from_env(env) == cfg
    assert cfg.drafter_config(DrafterConfig()).max_depth == 32
    assert HVDServingConfig.from_env({}) == HVDServingConfig()  # nothing set: HVD off


@pytest.mark.parametrize("env, message", [
    ({"SGLANG_HVD_ENABLE": "1"}, "SGLANG_HVD_ENABLE=1 needs a gate: set SGLANG_HVD_GATE=DIR"),
    ({"SGLANG_HVD_ENABLE": "yes"}, "SGLANG_HVD_ENABLE must be 0 or 1, got 'yes'"),
    ({"SGLANG_HVD_THRESHOLD": "high"}, "SGLANG_HVD_THRESHOLD='high' is not a valid float"),
    ({"SGLANG_HVD_MAX_DEPTH": "1.5"}, "SGLANG_HVD_MAX_DEPTH='1.5' is not a valid int"),
])
def test_bad_environment_is_named(env, message):
    with pytest.raises(HvdInputError, match=message):
        HVDServingConfig.from_env(env)


class FailingGate:
    threshold = 1.0

    def __init__(self, real):
        self.extractor = real.extractor

    def predict(self, x):
        raise RuntimeError("onnxruntime exploded")


def serve(records, stepper, width=7, concurrency=4):
    """A toy serving loop: greedy verify of either the cache draft or an EAGLE3 row that
    gets its first token right (accept 1). Returns the emitted outputs by request."""
    queue = list(records)
    running, emitted = {}, {}
    while queue or running:
        while queue and len(running) < concurrency:
            r = queue.pop(0)
            running[r.req_id] = r
            emitted[r.req_id] = []
        rids = list(running)
        for rid in rids:
            stepper.sync(rid, running[rid].prompt_ids, emitted[rid])
        decision = stepper.decide(rids, width)
        accepts, eagle_rows = [], np.zeros((len(rids), width), dtype=np.int32)
        for i, rid in enumerate(rids):
            truth = running[rid].output_ids[len(emitted[rid]):]
            eagle_rows[i, 0] = truth[0]  # EAGLE3 guesses one token right
            eagle_rows[i, 1:] = 0
            if decision.use_cache[i]:
                a = accept_len(decision.cache_tokens[i, : decision.cache_lens[i]].tolist(), truth)
            else:
                a = accept_len(eagle_rows[i].tolist(), truth)
            a = min(a, len(truth) - 1)
            accepts.append(a)
            emitted[rid].extend(truth[: a + 1].tolist())
        stepper.verified(rids, accepts, eagle_rows)
        for rid in rids:
            if len(emitted[rid]) == len(running[rid].output_ids):
                stepper.sync(rid, running[rid].prompt_ids, emitted[rid])
                stepper.finish(rid)
                del running[rid]
    return emitted


@pytest.fixture
def demo_gate(demo_dir):
    from sglang_hvd.gate import Gate

    return Gate(os.path.join(demo_dir, "gate"))


def test_stepper_serves_losslessly_and_records_replayable_traces(demo_dir, demo_gate, tmp_path):
    records = list(iter_traces(os.path.join(demo_dir, "traces.jsonl")))[:40]
    recorder = TraceRecorder(str(tmp_path / "served.jsonl"))
    stepper = HVDStepper(create_drafter("python", demo_gate.drafter_config), demo_gate, recorder=recorder,
                         tokenizer=records[0].tokenizer)
    emitted = serve(records, stepper)
    recorder.close()
    for r in records:
        assert emitted[r.req_id] == r.output_ids.tolist()
    summary = stepper.summary()
    assert summary["gate_errors"] == 0 and 0.2 < summary["cache_pick_rate"] < 1.0
    assert summary["cache_mean_accept"] > 2 * summary["eagle3_mean_accept"] and summary["eagle3_mean_accept"] <= 1.0
    back = {r.req_id: r for r in iter_traces(str(tmp_path / "served.jsonl"))}
    assert set(back) == {r.req_id for r in records} and recorder.num_dropped == 0
    for r in records:
        got = back[r.req_id]
        assert got.prompt_ids.tolist() == r.prompt_ids.tolist() and got.output_ids.tolist() == r.output_ids.tolist()
        # Every step's accepted prefix is, by the trace reader's own check, the emitted text.
        assert {s.src for s in got.steps} <= {"cache", "eagle3"} and got.steps[0].pos == 0
    assert stepper.running() == []


def test_a_gate_failing_at_run_time_falls_back_to_eagle3(demo_dir, demo_gate, caplog):
    records = list(iter_traces(os.path.join(demo_dir, "traces.jsonl")))[:6]
    stepper = HVDStepper(create_drafter("python", demo_gate.drafter_config), FailingGate(demo_gate), threshold=1.0)
    with caplog.at_level("ERROR"):
        emitted = serve(records, stepper)
    assert all(emitted[r.req_id] == r.output_ids.tolist() for r in records)
    s = stepper.summary()
    assert s["gate_errors"] == s["steps"] > 0 and s["cache_pick_rate"] == 0.0
    assert caplog.text.count("HVD gate failed at run time (RuntimeError: onnxruntime exploded)") == 1


def test_recorder_drops_rather_than_blocks(tmp_path):
    from sglang_hvd.trace import TokenizerId, TraceRecord, token_array

    rec = TraceRecorder(str(tmp_path / "t.jsonl.gz"), max_queue=1, flush_s=0.05)
    rec._queue.put(None)  # occupy the only slot so the next record cannot be queued...
    r = TraceRecord("a", "a", 0, "s", TokenizerId("t", "d"), token_array([1]), token_array([2]))
    assert rec.record(r) is False and rec.num_dropped == 1
    rec._queue.get()  # ...free it again
    assert rec.record(r) is True
    rec.close()
    assert [x.req_id for x in iter_traces(str(tmp_path / "t.jsonl.gz"))] == ["a"]


def test_a_stop_inside_an_accepted_run_is_recorded_consistently(tmp_path):
    rec = TraceRecorder(str(tmp_path / "t.jsonl"))
    st = HVDStepper(create_drafter("python"), None, recorder=rec)
    st.sync("r", [1, 2, 3, 1, 2, 3, 1, 2], [])
    d = st.decide(["r"], 3)
    st.verified(["r"], [3], np.array([[9, 9, 9]]))  # EAGLE3 row (no gate): 3 accepted + bonus = 4 tokens
    st.sync("r", [1, 2, 3, 1, 2, 3, 1, 2], [9, 9, 9, 4])
    st.finish("r", final_output=[9, 9])  # max_new_tokens=2 cut the run
    rec.close()
    (r,) = iter_traces(str(tmp_path / "t.jsonl"))
    assert r.output_ids.tolist() == [9, 9]
    assert [(s.pos, s.src, s.draft, s.accept_len) for s in r.steps] == [(0, "eagle3", (9, 9, 9), 2)]
    assert not d.use_cache[0]
