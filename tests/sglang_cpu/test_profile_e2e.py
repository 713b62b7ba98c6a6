"""``hvd profile`` against a real SGLang 0.5.23 server (CPU engine) running the tier-cycle
diagnostic: the profile it writes predicts held-back cells' verify time within 10%.

One server (~40 s to start), the tiny random Llama target with its EAGLE3 draft at topk 1
(1-3-4: tiers off, 1-1-2, 1-3-4, each with and without EAGLE3's draft, one decode step
each in turn), --hvd-timings. ``hvd profile`` sends it concurrency 1, 2, 4, 8 at prompts of
64 and 256 tokens, 48 new tokens each, the whole grid twice (~60 s of load). What keeps the
verify error low on a shared 2-core machine: medians of ~19 steps per (batch, width, draft
steps, context) cell, from two stretches of time (one pass of 48 tokens: a slow first
stretch, another process on the cores, raised a third of the cells by ~20% and the held-back
error to 10.4% once in the suite, against 4-7% on a quiet machine), and cells of fewer than 3
steps left out (batch sizes seen only while requests arrive or finish: one sample each).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("sglang", reason="the SGLang CPU harness needs the sglang extra (sglang==0.5.23)")

from sglang_hvd.harness import server as harness  # noqa: E402

pytestmark = [pytest.mark.sglang, pytest.mark.e2e]


@pytest.fixture(scope="module")
def profiled(sglang_server_factory, sglang_cpu_models, qwen_gates, tmp_path_factory) -> dict:
    from sglang_hvd.cli import profile as hvd_profile

    m = sglang_cpu_models
    work = tmp_path_factory.mktemp("profile_e2e")
    timings, out, report = (str(work / name) for name in ("steps.jsonl", "profile.json", "report.json"))
    args = harness.eagle3_args(m.llama_draft, topk=1, steps=3) + [
        "--hvd-gate", qwen_gates(1, 3, 4), "--hvd-tier-cycle", "--hvd-timings", timings, "--hvd-drafter", "native",
        "--max-total-tokens", "8192"]
    server = sglang_server_factory(m.llama, extra_args=args, launcher="sglang_hvd.launch_server")
    try:
        rc = hvd_profile.main(["--url", server.url, "--timings", timings, "-o", out, "--json", report,
                               "--concurrency", "1,2,4,8", "--prompt-tokens", "64,256", "--new-tokens", "48",
                               "--rounds", "2", "--hardware", "CPU"])
    finally:
        server.stop()
    with open(report) as f:
        return dict(rc=rc, path=out, report=json.load(f), log=server.log_path)


def test_hvd_profile_predicts_held_back_verify_time_within_ten_percent(profiled):
    assert profiled["rc"] == 0, profiled["log"]
    held = profiled["report"]["held_back_error"]
    assert set(held) == {"verify", "draft", "extend", "host", "step"}
    assert held["verify"] <= 0.10, (held, profiled["report"]["cells"])
    # steps run back to back carry their wall time, of which the timed parts are most, not all
    rest = profiled["report"]["untimed"]
    assert rest["steps"] >= 100 and rest["ms"] > 0 and 0 < rest["share_of_wall"] < 0.5, rest


def test_the_profile_written_is_served_by_a_server_of_its_model(profiled, sglang_cpu_models):
    from sglang_hvd.step_profile import load_profile

    p = load_profile(profiled["path"])
    assert p.kind == "measured" and p.target_model == sglang_cpu_models.llama and p.hardware == "CPU"
    assert p.fit_error == profiled["report"]["held_back_error"]
    assert p.untimed_ms == profiled["report"]["untimed"]["ms"] > 0
    # every (batch, width) cell of the load, none of the in-between batch sizes
    assert profiled["report"]["cells"] >= 24 and profiled["report"]["cells_left_out"] >= 0
    # a verify of more tokens costs more, at every batch
    assert all(p.verify.ms(b, 4, 500) > p.verify.ms(b, 1, 500) for b in (1, 8))
