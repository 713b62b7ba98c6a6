"""The SGLang integration on the real sglang 0.5.23 (CPU): plugin, checks, row swap, worker.

Needs the sglang extra; every test here is skipped without it.
"""

from __future__ import annotations

import multiprocessing
import os
import types

import numpy as np
import pytest

sglang = pytest.importorskip("sglang", reason="needs the sglang extra (pip install 'sglang-hvd[sglang]')")
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
    (["--speculative-eagle-topk", "2"], "pass --speculative-eagle-topk 1"),
    (["--pp-size", "2"], "does not support pipeline parallelism"),
    (["--speculative-use-rejection-sampling"], "drop --speculative-use-rejection-sampling"),
])
def test_unsupported_setups_are_refused(extra, message):
    from sglang_hvd.patches.checks import UnsupportedSetup, check_server_args

    check_server_args(_server_args())  # the supported setup passes
    with pytest.raises(UnsupportedSetup, match=message):
        check_server_args(_server_args(extra))
    from sglang.srt.server_args import prepare_server_args

    overlap = prepare_server_args(BASE_ARGS[:-1])
    with pytest.raises(UnsupportedSetup, match="pass --disable-overlap-schedule"):
        check_server_args(overlap)


def test_untested_sglang_versions_are_refused_unless_allowed(monkeypatch):
    from sglang_hvd.patches import checks
    from sglang_hvd.serving.config import HVDServingConfig

    assert checks.check_sglang_version(HVDServingConfig()) == "0.5.23"
    monkeypatch.setattr(checks.metadata, "version", lambda name: "0.6.0")
    with pytest.raises(checks.UnsupportedSetup, match="tested with sglang 0.5.23, found 0.6.0.*--hvd-allow-sglang-version 0.6.0"):
        checks.check_sglang_version(HVDServingConfig())
    assert checks.check_sglang_version(HVDServingConfig(allow_sglang_version="0.6.0")) == "0.6.0"


def test_launcher_splits_and_validates_arguments(demo_dir, capsys):
    from sglang_hvd import launch_server

    args, rest = launch_server.build_parser().parse_known_args(
        ["--model-path", "m", "--hvd-gate", "g", "--hvd-threshold", "2.5", "--tp-size", "1", "--hvd-max-depth", "32"])
    assert rest == ["--model-path", "m", "--tp-size", "1"]
    cfg = launch_server.config_from_args(args)
    assert (cfg.gate, cfg.threshold, cfg.drafter_overrides) == ("g", 2.5, (("max_depth", 32),))
    assert launch_server.main(BASE_ARGS + ["--hvd-gate", "/nonexistent/gate"]) == 2
    assert "gate directory not found" in capsys.readouterr().err
    assert launch_server.main(BASE_ARGS[:-1] + ["--hvd-gate", os.path.join(demo_dir, "gate")]) == 2
    assert "pass --disable-overlap-schedule" in capsys.readouterr().err
    # A refused launch leaves the caller's environment alone (no HVD switched on for later servers).
    assert not any(k.startswith("SGLANG_HVD_") for k in os.environ)


def test_launcher_refuses_a_gate_trained_on_another_tokenizer(demo_dir, qwen_dir, tmp_path, capsys):
    import shutil

    from sglang_hvd import launch_server

    model = tmp_path / "model"
    shutil.copytree(qwen_dir, model)
    argv = ["--model-path", str(model)] + BASE_ARGS[2:] + ["--hvd-gate", os.path.join(demo_dir, "gate")]
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


def test_row_substitution_on_a_real_verify_input():
    from sglang_hvd.patches.rows import substitute_rows

    n, bs = 4, 3
    vi = _verify_input(torch.tensor([5, 11, 12, 13, 6, 21, 22, 23, 7, 31, 32, 33]), bs, n)
    positions = vi.positions.clone()
    taken = substitute_rows(vi.draft_token, n,
                            use_cache=np.array([True, False, True]),
                            cache_tokens=np.array([[40, 41, 42], [50, 51, 52], [60, -1, -1]]),
                            cache_lens=np.array([3, 3, 1]))
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


def _bare_worker(demo_dir, tmp_path):
    """A worker built as SGLang's CPU tests build theirs: object.__new__ + attributes."""
    from sglang_hvd.patches.worker import HVDEagleWorkerV2
    from sglang_hvd.serving.config import HVDServingConfig
    from sglang_hvd.serving.factory import build_stepper

    w = object.__new__(HVDEagleWorkerV2)
    w.adaptive_controller = None
    w.hvd_config = HVDServingConfig(enable=True, gate=os.path.join(demo_dir, "gate"), drafter="python",
                                    record_traces=str(tmp_path / "served.jsonl"))
    w.hvd = build_stepper(w.hvd_config)
    w._hvd_tp_size, w._hvd_tp_rank, w._hvd_tp_group = 1, 0, None
    w._hvd_reqs, w._hvd_pending, w._hvd_errors, w._hvd_error_logged, w.hvd_step_us = {}, None, 0, False, 0.0
    w._hvd_last_log = 0.0
    w._hvd_metrics = None
    return w


def test_worker_bookkeeping_with_a_mixed_batch(demo_dir, tmp_path):
    w = _bare_worker(demo_dir, tmp_path)
    repeated = list(range(100, 140))
    # Request a repeats its own prompt (a good cache draft); b is new text (no draft).
    a, b = FakeReq("a", repeated + [7] + repeated[:5], []), FakeReq("b", [1, 2, 3], [])
    n = 4
    vi = _verify_input(torch.tensor([105, 900, 901, 902, 3, 910, 911, 912]), 2, n)
    batch = types.SimpleNamespace(reqs=[a, b], spec_info=vi, forward_mode=types.SimpleNamespace(is_idle=lambda: False))
    w._hvd_prepare(batch)
    rows = vi.draft_token.view(2, n).tolist()
    assert rows[0][1:] == [105, 106, 107]  # the cache continues the repeated prompt
    assert rows[1] == [3, 910, 911, 912]  # no cache draft: EAGLE3's row untouched
    assert w.hvd.stats.steps == 1 and set(w._hvd_reqs) == {"a", "b"}
    w.on_verify_complete_cpu([3, 0], batch_size=2)
    assert (w.hvd.stats.cache_rows, w.hvd.stats.cache_accepted, w.hvd.stats.eagle3_rows) == (1, 3, 1)
    # The server appends the accepted tokens + bonus; a finishes.
    a.output_ids += [105, 106, 107, 108]
    a._done = True
    w.note_request_finished(rid="a", natural_stop=True)
    assert "a" not in w.hvd and "b" in w.hvd
    # b finished without a decode result (e.g. at prefill): collected at the next step.
    b._done = True
    b.output_ids += [4]
    c = FakeReq("c", [9, 9], [])
    vi2 = _verify_input(torch.tensor([9, 1, 2, 3]), 1, n)
    w._hvd_prepare(types.SimpleNamespace(reqs=[c], spec_info=vi2, forward_mode=types.SimpleNamespace(is_idle=lambda: False)))
    assert w.hvd.running() == ["c"]
    w.clear_cache_pool()
    assert w.hvd.running() == [] and w._hvd_reqs == {}
    stats = w.hvd_stats()
    assert stats["step_errors"] == 0 and stats["steps"] == 2
    w.hvd.recorder.close()
    from sglang_hvd.trace import iter_traces

    (rec,) = [r for r in iter_traces(str(tmp_path / "served.jsonl")) if r.req_id == "a"]
    assert rec.output_ids.tolist() == [105, 106, 107, 108]
    assert [(s.pos, s.src, s.draft, s.accept_len) for s in rec.steps] == [(0, "cache", (105, 106, 107), 3)]


def test_a_failing_step_verifies_eagle3_rows_and_is_counted(demo_dir, tmp_path, caplog):
    w = _bare_worker(demo_dir, tmp_path)

    def broken(batch):
        raise RuntimeError("drafter exploded")

    w._hvd_prepare = broken
    import sglang.srt.speculative.eagle_worker_v2 as ew

    original = ew.EAGLEWorkerV2.verify
    ew.EAGLEWorkerV2.verify = lambda self, batch, pp_proxy_tensors=None, grammar_barrier=None: "verified"
    try:
        with caplog.at_level("ERROR"):
            assert w.verify(types.SimpleNamespace()) == "verified"
            assert w.verify(types.SimpleNamespace()) == "verified"
    finally:
        ew.EAGLEWorkerV2.verify = original
    assert w.hvd_stats()["step_errors"] == 2
    assert caplog.text.count("HVD step failed (drafter exploded)") == 1
    w.hvd.recorder.close()
