"""The SGLang integration on the real sglang 0.5.23 (CPU): plugin, checks, row swap, worker.

Needs the sglang extra; every test here is skipped without it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
import types

import numpy as np
import pytest

sglang = pytest.importorskip("sglang",
                             reason="needs the sglang extra (pip install '.[sglang]' in the sglang-hvd checkout)")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.sglang

BASE_ARGS = ["--model-path", "/nonexistent/model", "--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "1",
             "--disable-overlap-schedule"]


def _server_args(extra=()):
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(BASE_ARGS + list(extra))


def _worker_class_in_child(env: dict, queue) -> None:
    os.environ.update(env)
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    load_plugins()
    cls = SpeculativeAlgorithm.EAGLE3.create_worker(prepare_server_args(BASE_ARGS))
    eagle = SpeculativeAlgorithm.EAGLE.create_worker(prepare_server_args(BASE_ARGS))
    queue.put((cls.__module__ + "." + cls.__qualname__, eagle.__qualname__))


@pytest.mark.parametrize("enable, expected", [("1", "sglang_hvd.patches.worker.HVDEagleWorkerV2"),
                                              ("0", "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2")])
def test_plugin_is_found_through_the_entry_point_in_a_spawned_child(demo_dir, enable, expected):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    env = {"SGLANG_HVD_ENABLE": enable, "SGLANG_HVD_GATE": os.path.join(demo_dir, "gate")}
    child = ctx.Process(target=_worker_class_in_child, args=(env, queue))
    child.start()
    child.join(180)
    assert child.exitcode == 0
    eagle3, eagle = queue.get(timeout=5)
    assert eagle3 == expected
    assert eagle == "EAGLEWorkerV2"  # only EAGLE3 is routed to HVD


@pytest.mark.parametrize("extra, message", [
    (["--speculative-eagle-topk", "2", "--attention-backend", "trtllm_mha"],
     "--attention-backend trtllm_mha verifies chains only, but --speculative-eagle-topk 2 makes tree rows"),
    (["--pp-size", "2"], "does not support pipeline parallelism"),
    (["--speculative-use-rejection-sampling"], "drop --speculative-use-rejection-sampling"),
    (["--speculative-adaptive"], "drop --speculative-adaptive"),
    (["--enable-dp-attention", "--dp-size", "2", "--tp-size", "2"], "drop --enable-dp-attention, or --hvd-profile"),
    (["--speculative-eagle-topk", "8", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "66"],
     "--speculative-num-draft-tokens 66: HVD's tree rows hold at most 63 draft nodes"),
])
def test_unsupported_setups_are_refused(extra, message):
    from sglang_hvd.patches.checks import UnsupportedSetup, check_server_args
    from sglang_hvd.serving.config import HVDServingConfig

    tiered = HVDServingConfig(enable=True, gate="/g", profile="qwen3-8b-h200")
    check_server_args(_server_args(), tiered)  # the supported setup passes
    with pytest.raises(UnsupportedSetup, match=message):
        check_server_args(_server_args(extra), tiered)
    from sglang.srt.server_args import prepare_server_args

    overlap = prepare_server_args(BASE_ARGS[:-1])
    with pytest.raises(UnsupportedSetup, match="pass --disable-overlap-schedule"):
        check_server_args(overlap)


def test_untested_sglang_versions_are_refused_unless_allowed(monkeypatch):
    from sglang_hvd.patches import checks
    from sglang_hvd.serving.config import HVDServingConfig

    assert checks.check_sglang_version(HVDServingConfig()) == "0.5.23"
    monkeypatch.setattr(checks.metadata, "version", lambda name: "0.6.0")
    with pytest.raises(checks.UnsupportedSetup,
                       match="tested with sglang 0.5.23, found 0.6.0.*--hvd-allow-sglang-version 0.6.0"):
        checks.check_sglang_version(HVDServingConfig())
    assert checks.check_sglang_version(HVDServingConfig(allow_sglang_version="0.6.0")) == "0.6.0"


TREE_SHAPE = ["--speculative-eagle-topk", "4", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "16"]


def test_the_verify_shape_comes_from_the_three_flags():
    from sglang_hvd.patches.checks import UnsupportedSetup, served_shape
    from sglang_hvd.verify import VerifyShape

    assert served_shape(_server_args(TREE_SHAPE)) == VerifyShape(4, 3, 16)
    with pytest.raises(UnsupportedSetup, match="pass --speculative-num-steps, --speculative-num-draft-tokens"):
        served_shape(_server_args())
    with pytest.raises(UnsupportedSetup, match="nodes - 1 = 15 exceeds what EAGLE3 drafts at topk 2, 3 steps"):
        served_shape(_server_args(["--speculative-eagle-topk", "2", "--speculative-num-steps", "3",
                                   "--speculative-num-draft-tokens", "16"]))


def test_launcher_splits_and_validates_arguments(demo_dir, capsys):
    from sglang_hvd.patches import launch as launch_server

    args, rest = launch_server.build_parser().parse_known_args(
        ["--model-path", "m", "--hvd-gate", "g", "--hvd-threshold", "2.5", "--tp-size", "1",
         "--hvd-global-max-tokens", "9000", "--hvd-cache-siblings", "4"])
    assert rest == ["--model-path", "m", "--tp-size", "1"]
    cfg = launch_server.config_from_args(args)
    assert (cfg.gate, cfg.threshold, cfg.drafter_overrides, cfg.cache_siblings) == (
        "g", 2.5, (("global_max_tokens", 9000),), 4)
    args, _ = launch_server.build_parser().parse_known_args(["--hvd-gate", "g", "--hvd-score-rule", "3"])
    assert (launch_server.config_from_args(args).score_rule,
            launch_server.config_from_args(args).threshold) == (3.0, None)
    assert launch_server.main(BASE_ARGS + ["--hvd-gate", "g", "--hvd-score-rule", "3", "--hvd-threshold", "1"]) == 2
    assert "SGLANG_HVD_SCORE_RULE replaces the gate: set one" in capsys.readouterr().err
    assert launch_server.main(BASE_ARGS + ["--hvd-gate", "/nonexistent/gate"]) == 2
    assert "gate directory not found" in capsys.readouterr().err
    assert launch_server.main(BASE_ARGS[:-1] + ["--hvd-gate", os.path.join(demo_dir, "gate")]) == 2
    assert "pass --disable-overlap-schedule" in capsys.readouterr().err
    # The demo gate was trained for topk 4, 3 steps, 16 nodes: a topk-1 server is refused.
    chain = ["--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"]
    assert launch_server.main(BASE_ARGS + chain + ["--hvd-gate", os.path.join(demo_dir, "gate")]) == 2
    err = capsys.readouterr().err
    assert ("was trained for verify rows of topk 4, steps 3, 16 nodes, "
            "but this server verifies topk 1, steps 3, 4 nodes") in err
    assert "serve with --speculative-eagle-topk 4 --speculative-num-steps 3 --speculative-num-draft-tokens 16" in err
    assert launch_server.main(BASE_ARGS + ["--hvd-gate", os.path.join(demo_dir, "gate")]) == 2
    assert ("HVD needs the verify shape its gate was trained for: pass --speculative-num-steps"
            in capsys.readouterr().err)
    # A refused launch leaves the caller's environment alone (no HVD switched on for later servers).
    assert not any(k.startswith("SGLANG_HVD_") for k in os.environ)


def test_launcher_refuses_a_profile_of_another_model_and_a_tier_it_cannot_serve(demo_dir, capsys):
    from sglang_hvd.patches import launch as launch_server

    gate = ["--hvd-gate", os.path.join(demo_dir, "gate")]
    base = ["--speculative-algorithm", "EAGLE3", "--disable-overlap-schedule", *TREE_SHAPE, *gate]
    assert launch_server.main(["--model-path", "/models/llama-3-8b", *base, "--hvd-profile", "qwen3-8b-h200"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sglang_hvd.launch_server: error: --hvd-profile qwen3-8b-h200 times Qwen/Qwen3-8B")
    assert "but this server serves /models/llama-3-8b: measure a profile for it" in err and err.count("\n") == 1
    assert launch_server.main(["--model-path", "/models/Qwen3-8B", *base, "--hvd-profile", "qwen3-8b-h200",
                               "--hvd-tiers", "off,1-3-4"]) == 2
    assert "--hvd-tiers: tier 1-3-4: topk 1, but the server drafts at topk 4" in capsys.readouterr().err
    assert launch_server.main(["--model-path", "/models/Qwen3-8B", *base, "--hvd-profile", "/no/profile.json"]) == 2
    assert "/no/profile.json: no such profile file, and not a shipped estimate" in capsys.readouterr().err
    assert not any(k.startswith("SGLANG_HVD_") for k in os.environ)


def test_launcher_refuses_a_gate_trained_on_another_tokenizer(demo_dir, qwen_dir, tmp_path, capsys):
    import shutil

    from sglang_hvd.patches import launch as launch_server

    model = tmp_path / "model"
    shutil.copytree(qwen_dir, model)
    argv = ["--model-path", str(model), "--speculative-algorithm", "EAGLE3", "--disable-overlap-schedule", *TREE_SHAPE,
            "--hvd-gate", os.path.join(demo_dir, "gate")]
    assert launch_server.main(argv) == 2
    err = capsys.readouterr().err
    assert "the gate was trained on tokenizer hvd-synth-bpe@" in err and "train a gate on traces of this model" in err


def _verify_input(draft_token, bs, n):
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    return EagleVerifyInput(
        draft_token=draft_token, custom_mask=torch.ones(bs * n * n, dtype=torch.bool),
        positions=torch.arange(bs * n), retrieve_index=torch.arange(bs * n).view(bs, n),
        retrieve_next_token=torch.full((bs, n), -1), retrieve_next_sibling=torch.full((bs, n), -1),
        retrieve_cum_len=None, spec_steps=n - 1, topk=1, draft_token_num=n, capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=30, seq_lens_cpu=torch.tensor([10, 10, 10]))


def test_chain_substitution_on_a_real_verify_input():
    from sglang_hvd.patches.rows import pack_plans, substitute_chains

    n, bs = 4, 3
    vi = _verify_input(torch.tensor([5, 11, 12, 13, 6, 21, 22, 23, 7, 31, 32, 33]), bs, n)
    positions = vi.positions.clone()
    packed = pack_plans(np.array([3, 0, 1]), np.array([0, 3, 0]), np.array([[40, 41, 42], [50, 51, 52], [60, -1, -1]]))
    taken = substitute_chains(vi.draft_token, n, packed)
    # Row 0: full cache draft; row 1: EAGLE3 kept; row 2: a one-token cache draft, the rest
    # of its EAGLE3 row stays (the verify rejects it if wrong: lossless).
    assert taken == 2
    assert vi.draft_token.tolist() == [5, 40, 41, 42, 6, 21, 22, 23, 7, 60, 32, 33]
    assert torch.equal(vi.positions, positions) and vi.draft_token_num == 4


class FakeReq:
    def __init__(self, rid, prompt, output):
        self.rid, self.origin_input_ids, self.output_ids, self._done = rid, list(prompt), list(output), False

    def finished(self):
        return self._done


def _bare_worker(demo_dir, tmp_path, shape=None, rank=0, tp_size=1, group=None):
    """A worker built as SGLang's CPU tests build theirs: object.__new__ + attributes (a
    topk-1 worker unless ``shape`` says otherwise; the demo gate's decisions at it)."""
    from sglang_hvd.drafter import create_drafter
    from sglang_hvd.gate import Gate
    from sglang_hvd.patches.rows import Staging
    from sglang_hvd.patches.worker import HVDEagleWorkerV2
    from sglang_hvd.serving.config import HVDServingConfig
    from sglang_hvd.serving.recorder import TraceRecorder
    from sglang_hvd.serving.stepper import HVDStepper
    from sglang_hvd.tiers import Tier
    from sglang_hvd.verify import VerifyShape

    shape = shape or VerifyShape(1, 3, 4)
    w = object.__new__(HVDEagleWorkerV2)
    w.adaptive_controller = None
    w.topk, w.speculative_num_steps, w.speculative_num_draft_tokens = shape.topk, shape.steps, shape.nodes
    w.device = "cpu"
    w.hvd_config = HVDServingConfig(enable=True, gate=os.path.join(demo_dir, "gate"), drafter="python",
                                    record_traces=str(tmp_path / f"served{rank}.jsonl"))
    w.hvd_shape = shape
    gate = Gate(w.hvd_config.gate)
    w.hvd = HVDStepper(create_drafter("python", gate.drafter_config), gate, shape,
                       recorder=TraceRecorder(w.hvd_config.record_traces),
                       tokenizer=gate.spec.tokenizer) if rank == 0 else None
    w._hvd_tp_size, w._hvd_tp_rank, w._hvd_tp_group, w._hvd_dp_rank = tp_size, rank, group, None
    w._hvd_reqs, w._hvd_pending, w._hvd_errors, w._hvd_error_logged, w.hvd_step_us = {}, None, 0, False, 0.0
    w._hvd_last_log = 0.0
    w._hvd_metrics = None
    w._hvd_staging = Staging()
    w.hvd_tiers, w._hvd_tier_rule, w._hvd_tier_states = (Tier(shape),), "static", None
    w._hvd_packed, w._hvd_drafts_skipped, w._hvd_extends_skipped, w._hvd_step_shape = None, 0, 0, None
    w._hvd_clock = w._hvd_timings = w._hvd_refiner = None
    w._hvd_candidate, w._hvd_swaps = None, 0
    w._hvd_admit_at_prefill = True
    w._draft_worker = types.SimpleNamespace(hvd_skip_draft=False)
    return w


def test_a_gate_swap_serves_the_checked_gate_only_after_its_commit(demo_dir, tmp_path):
    """The worker's three phases (patches/gate_endpoint.py drives them over every rank)."""
    from sglang_hvd.harness.faults import gate_variant
    from sglang_hvd.serving.gate_swap import ABORT, CHECK, COMMIT
    from sglang_hvd.verify import VerifyShape

    w = _bare_worker(demo_dir, tmp_path, shape=VerifyShape(4, 3, 16))
    old = w.hvd.gate.digest
    other = gate_variant(os.path.join(demo_dir, "gate"), tmp_path / "other", decision={"threshold": 0.5})
    deep = gate_variant(os.path.join(demo_dir, "gate"), tmp_path / "deep", drafter={"max_depth": 9})
    assert w.hvd_swap(COMMIT, str(other)) == (False, f"no checked gate {other} to serve (check it first)")
    passed, message = w.hvd_swap(CHECK, str(deep))
    assert not passed and "max_depth 9 (served: 64)" in message and w.hvd.gate.digest == old
    passed, message = w.hvd_swap(CHECK, str(other))
    assert passed and w.hvd.gate.digest == old  # checked, not served yet
    assert w.hvd_swap(ABORT, str(other)) == (True, f"gate {old} keeps serving")
    assert w.hvd_swap(COMMIT, str(other))[0] is False  # the abort dropped it
    assert w.hvd_swap(CHECK, str(other))[0]
    passed, message = w.hvd_swap(COMMIT, str(other))
    new = w.hvd.gate.digest
    assert passed and new != old and message == f"serving gate {new} (was {old})"
    assert w.hvd.threshold == 0.5 and w.hvd_stats()["gate_swaps"] == 1 and w.hvd_stats()["gate_digest"] == new
    tp1 = _bare_worker(demo_dir, tmp_path, shape=VerifyShape(4, 3, 16), rank=1, tp_size=2)
    assert tp1.hvd_swap(CHECK, str(other)) == (True, "TP rank 1 holds no gate")


@pytest.fixture
def stock_verify(monkeypatch):
    """SGLang's own decode step reduced to its verify (the verify input is the test's, as
    if EAGLE3 had drafted it), and its verify replaced by a recorder: what did HVD hand it?"""
    import sglang.srt.speculative.eagle_worker_v2 as ew

    seen = []
    monkeypatch.setattr(ew.EAGLEWorkerV2, "verify",
                        lambda self, batch, pp_proxy_tensors=None, grammar_barrier=None:
                        seen.append(batch) or "verified")
    monkeypatch.setattr(ew.EAGLEWorkerV2, "forward_batch_generation", lambda self, batch, *a, **k: self.verify(batch))
    return seen


def _batch(reqs, vi, prefill=False):
    """A decode batch verifying ``vi``, or (``prefill``) a batch of prefills."""
    mode = types.SimpleNamespace(is_idle=lambda: False, is_extend=lambda: prefill)
    return types.SimpleNamespace(reqs=reqs, spec_info=vi, forward_mode=mode, is_extend_in_batch=prefill)


def test_worker_bookkeeping_with_a_mixed_batch(demo_dir, tmp_path, stock_verify):
    w = _bare_worker(demo_dir, tmp_path)
    w.hvd.rule = dataclasses.replace(w.hvd.rule, threshold=-1.0)  # every cache draft
    repeated = list(range(100, 140))
    # Request a repeats its own prompt (a good cache draft); b is new text (no draft).
    a, b = FakeReq("a", repeated + [7] + repeated[:5], []), FakeReq("b", [1, 2, 3], [])
    n = 4
    vi = _verify_input(torch.tensor([105, 900, 901, 902, 3, 910, 911, 912]), 2, n)
    assert w.forward_batch_generation(_batch([a, b], vi)) == "verified"
    rows = vi.draft_token.view(2, n).tolist()
    assert rows[0][1:] == [105, 106, 107]  # the cache continues the repeated prompt
    assert rows[1] == [3, 910, 911, 912]  # no cache draft: EAGLE3's row untouched
    assert w.hvd.stats.steps == 1 and set(w._hvd_reqs) == {"a", "b"}
    w.on_verify_complete_cpu([3, 0], batch_size=2)
    # The server appends the accepted tokens + bonus; a finishes.
    a.output_ids += [105, 106, 107, 108]
    a._done = True
    w.note_request_finished(rid="a", natural_stop=True)
    assert "a" not in w.hvd and "b" in w.hvd
    assert (w.hvd.stats.cache_rows, w.hvd.stats.cache_accepted) == (1, 3)
    # b finished without a decode result (e.g. at prefill): collected at the next step.
    b._done = True
    b.output_ids += [4]
    c = FakeReq("c", [9, 9], [])
    w.forward_batch_generation(_batch([c], _verify_input(torch.tensor([9, 1, 2, 3]), 1, n)))
    assert w.hvd.running() == ["c"]
    w.clear_cache_pool()
    assert w.hvd.running() == [] and w._hvd_reqs == {}
    stats = w.hvd_stats()
    assert stats["step_errors"] == 0 and stats["steps"] == 2 and stats["cache_pick_rate"] == 0.5  # a: cache, b: EAGLE3
    assert stats["gate_digest"] == w.hvd.gate.digest and len(stats["gate_digest"]) == 16
    assert (stats["gate_threshold"], stats["gate_eagle_reserve"]) == (w.hvd.rule.threshold, w.hvd.rule.eagle_reserve)
    assert stats["verify_shape"] == w.hvd_shape.describe()
    assert stats["draft_threads"] == 1  # the python drafter's one thread
    from sglang_hvd.decision import DecisionRule

    w.hvd.rule = DecisionRule(-math.inf, 0)  # cache_only serving: /server_info must stay strict JSON
    assert json.loads(json.dumps(w.hvd_stats(), allow_nan=False))["gate_threshold"] == "-inf"
    w.hvd.recorder.close()
    from sglang_hvd.trace import iter_traces

    (rec,) = [r for r in iter_traces(str(tmp_path / "served0.jsonl")) if r.req_id == "a"]
    assert rec.output_ids.tolist() == [105, 106, 107, 108]
    assert [(s.pos, s.src, s.draft, s.accept_len) for s in rec.steps] == [(0, "cache", (105, 106, 107), 3)]


def test_a_prefill_admits_its_requests_off_the_decode_steps(demo_dir, tmp_path, stock_verify):
    w = _bare_worker(demo_dir, tmp_path)
    w.hvd.rule = dataclasses.replace(w.hvd.rule, threshold=-1.0)  # every cache draft
    repeated = list(range(100, 140))
    a, once = FakeReq("a", repeated + [7] + repeated[:5], []), FakeReq("once", [5, 6], [])
    assert w.forward_batch_generation(_batch([a, once], None, prefill=True)) == "verified"  # SGLang's prefill ran
    # both indexed at the prefill: known to the stepper and the drafter, no decode step planned
    assert w.hvd.running() == ["a", "once"] and w.hvd.stats.steps == 0 and set(w._hvd_reqs) == {"a", "once"}
    assert list(w.hvd.drafter.speculate("a").tokens[:3]) == [105, 106, 107]
    # the first decode step drafts from the prompt indexed at the prefill; "once" ended at its prefill
    once._done = True
    a.output_ids = [105]
    vi = _verify_input(torch.tensor([105, 900, 901, 902]), 1, 4)
    w.forward_batch_generation(_batch([a], vi))
    assert vi.draft_token.tolist()[1:] == [106, 107, 108] and w.hvd.stats.steps == 1
    assert w.hvd.running() == ["a"] and set(w._hvd_reqs) == {"a"}
    # a prefill again of a request the stepper tracks (SGLang retracted it) admits nothing new
    w.forward_batch_generation(_batch([a], None, prefill=True))
    assert w.hvd.running() == ["a"] and w.hvd_stats()["step_errors"] == 0
    # a request that cannot decode (one new token at most: scoring) is not admitted; one that ended at its prefill
    # leaves at the next prefill (a server that only prefills holds one batch), without a record or figures
    score, short = FakeReq("score", [1, 2, 3], []), FakeReq("short", [4, 5, 6], [])
    score.sampling_params = types.SimpleNamespace(max_new_tokens=1)
    w.forward_batch_generation(_batch([score, short], None, prefill=True))
    assert w.hvd.running() == ["a", "short"]
    short._done, short.output_ids = True, [7]
    w.forward_batch_generation(_batch([FakeReq("next", [8, 9], [])], None, prefill=True))
    assert w.hvd.running() == ["a", "next"] and "short" not in w._hvd_reqs and not hasattr(short, "customized_info")
    # a PD-disaggregated prefill server admits none (they decode on another server)
    w._hvd_admit_at_prefill = False
    w.forward_batch_generation(_batch([FakeReq("elsewhere", [1, 2, 3], [])], None, prefill=True))
    assert w.hvd.running() == ["a", "next"]
    w.hvd.recorder.close()
    from sglang_hvd.trace import iter_traces

    # nothing decoded to its end: "once" and "short" ended at their prefills, "a" still runs
    assert list(iter_traces(str(tmp_path / "served0.jsonl"))) == []


def test_a_failing_step_verifies_eagle3_rows_and_is_counted(demo_dir, tmp_path, caplog, stock_verify):
    w = _bare_worker(demo_dir, tmp_path)

    def broken(batch):
        raise RuntimeError("drafter exploded")

    w._hvd_plan = broken
    vi = _verify_input(torch.tensor([5, 11, 12, 13]), 1, 4)
    with caplog.at_level("ERROR"):
        assert w.forward_batch_generation(_batch([FakeReq("a", [1, 2], [])], vi)) == "verified"
        assert w.forward_batch_generation(_batch([FakeReq("a", [1, 2], [])], vi)) == "verified"
    assert w.hvd_stats()["step_errors"] == 2 and vi.draft_token.tolist() == [5, 11, 12, 13]
    assert caplog.text.count("HVD step failed (drafter exploded)") == 1
    w.hvd.recorder.close()


class RecordingGroup:
    """SGLang's GroupCoordinator.broadcast, for one process: rank 0 keeps what it sent;
    another rank receives it."""

    sent: list = []

    def __init__(self, rank):
        self.rank = rank

    def broadcast(self, t, src=0):
        if self.rank == 0:
            RecordingGroup.sent.append(t.clone())
        else:
            t.copy_(RecordingGroup.sent.pop(0))


def test_every_tp_rank_joins_the_broadcast_even_when_rank_0s_step_fails(demo_dir, tmp_path, stock_verify):
    RecordingGroup.sent = []
    lead = _bare_worker(demo_dir, tmp_path, rank=0, tp_size=2, group=RecordingGroup(0))
    other = _bare_worker(demo_dir, tmp_path, rank=1, tp_size=2, group=RecordingGroup(1))

    def broken(batch):
        raise RuntimeError("drafter exploded")

    lead._hvd_plan = broken
    vi0 = _verify_input(torch.tensor([5, 11, 12, 13]), 1, 4)
    vi1 = _verify_input(torch.tensor([5, 11, 12, 13]), 1, 4)
    lead.forward_batch_generation(_batch([FakeReq("a", [1, 2], [])], vi0))
    # The served tier (0, the only one), EAGLE3 drafts, no plans: EAGLE3's rows as drafted
    assert len(RecordingGroup.sent) == 1
    assert RecordingGroup.sent[0].tolist() == [[0, 1, 0, -1, -1, -1, -1, -1], [-1] * 8]
    other.forward_batch_generation(_batch([FakeReq("a", [1, 2], [])], vi1))
    assert RecordingGroup.sent == [] and torch.equal(vi0.draft_token, vi1.draft_token)
    lead.hvd.recorder.close()


class GlooGroup:
    """The one method of SGLang's GroupCoordinator the plan broadcast uses, over gloo."""

    def broadcast(self, t, src=0):
        import torch.distributed as dist

        dist.broadcast(t, src=src)


def _tp_rank(rank: int, init_file: str, queue) -> None:
    import numpy as np
    import torch.distributed as dist

    from sglang_hvd.patches.rows import pack_plans
    from sglang_hvd.patches.tp import broadcast_step
    from sglang_hvd.tiers import parse_tiers

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        got = []
        tiers = parse_tiers("off,2-1-2,2-3-8")
        plans = pack_plans(np.array([2, 0]), np.array([5, 7]), np.array([[9, 8, -1, -1, -1, -1, -1], [-1] * 7]))
        narrow = pack_plans(np.array([1, 0]), np.array([0, 0]), np.array([[4], [-1]]))
        plain = pack_plans(np.zeros(2, int), np.zeros(2, int), np.zeros((2, 0), int))
        # Step 1: rank 0 planned at 2-3-8; step 2: its HVD step failed (no plans); step 3: a
        # cache-only step at 2-1-2; step 4: off.
        for step in ((2, True, plans), (2, True, None), (1, False, narrow), (0, False, plain)):
            mine = step if rank == 0 else (1, True, np.full((2, 16), 123))  # what other ranks hold is ignored
            tier, eagle3, packed = broadcast_step(*mine, 2, 8, tiers, GlooGroup(), rank)
            got.append((tier, eagle3, None if packed is None else packed.tolist()))
        queue.put((rank, got))
    finally:
        dist.destroy_process_group()


def test_plans_broadcast_over_a_real_two_process_group_every_step(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_tp_rank, args=(r, str(tmp_path / "init"), queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    results = dict(queue.get(timeout=5) for _ in procs)
    assert results[0] == results[1]
    chain = [-1, 0, 1, 2, 3, 4, 5]  # pack_plans' parents for chains
    planned = [[2, 5, 9, 8, -1, -1, -1, -1, -1] + chain, [0, 7, -1, -1, -1, -1, -1, -1, -1] + chain]
    assert results[0] == [(2, True, planned), (2, True, None), (1, False, [[1, 0, 4, -1], [0, 0, -1, -1]]),
                          (0, False, [[0, 0], [0, 0]])]
