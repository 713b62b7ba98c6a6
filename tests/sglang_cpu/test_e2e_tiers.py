"""HVD's verify tiers end to end on a real SGLang 0.5.23 server (CPU engine), against the
non-speculative server's output: the tier switches mid-stream, every decode step.

Servers (one at a time, ~40 s to start each), the tiny random Llama target with its
EAGLE3 draft (almost never right), every cache draft verified (threshold -1):
  reference   no speculation: the expected tokens
  cycle_1     topk 1 (1-3-4) with --hvd-tier-cycle: its tiers off, 1-1-2, 1-3-4, each with
              and without EAGLE3's draft, one decode step each in turn (a different tier
              at nearly every step of every request; cache-only steps skip the draft)
  cycle_2     the same at topk 2 over its default ladder (2-3-8: off, 2-1-2, 2-1-3, 2-2-4,
              2-2-7, 2-3-8 as trees; 2-1-3 and 2-2-7 the widest trees of 1 and 2 steps, as
              4-1-5 and 4-2-16 beside 4-3-16), with --hvd-skip-idle-extend: no draft extend
              after a step without an EAGLE3 draft, so the next EAGLE3 draft starts from a
              stale state
(TP ranks agreeing on each step's tier: the broadcast in a real 2-process group,
tests/test_sglang_plugin.py; a TP 2 tier-cycle server was dropped for the CI budget)
  cost_off    1-3-4 with --hvd-profile of a verify that costs 100 ms per token and nothing
              else: no tier can beat a plain step (N tokens per row cost N times one, and
              at most N come back), so every step runs ``off``
Every prompt is sent twice: round 2 finds round 1's responses in the global cache, so
its cache drafts are right and long.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("sglang", reason="the SGLang CPU harness needs the sglang extra (sglang==0.5.23)")

from sglang_hvd.harness import server as harness  # noqa: E402

pytestmark = [pytest.mark.sglang, pytest.mark.e2e]


def _prompts() -> list[dict]:
    rng = random.Random(23)
    block = [rng.randrange(100, 150000) for _ in range(20)]
    reqs = [dict(input_ids=[rng.randrange(100, 150000) for _ in range(n)], max_new_tokens=m)
            for n, m in zip([11, 30, 52], [36, 28, 40])]
    reqs += [dict(input_ids=block * 3, max_new_tokens=36), dict(input_ids=block + [5, 6] + block, max_new_tokens=30)]
    return reqs


PROMPTS = _prompts()


def _expensive_verify_profile(path: str, model: str) -> str:
    from sglang_hvd.step_profile import DraftCost, ForwardCost, HostCost, StepProfile

    StepProfile(name="expensive-verify", kind="measured", target_model=model, draft_model="tiny draft",
                hardware="test", verify=ForwardCost(0.0, 100.0, 0.0, 0.0), eagle3=DraftCost(0.0, 0.0, 0.0, 0.0, 0.0),
                hvd_cpu=HostCost(0.0, 0.0, 0.0)).write(path)
    return path


@pytest.fixture(scope="module")
def runs(sglang_server_factory, sglang_cpu_models, qwen_gates, tmp_path_factory) -> dict:
    m = sglang_cpu_models
    work = tmp_path_factory.mktemp("tiers_e2e")
    gate1, gate2 = qwen_gates(1, 3, 4), qwen_gates(2, 3, 8)
    chain = harness.eagle3_args(m.llama_draft, topk=1, steps=3)
    tree = harness.eagle3_args(m.llama_draft, topk=2, steps=3, draft_tokens=8)
    every = ["--hvd-threshold", "-1", "--hvd-drafter", "native"]
    profile = _expensive_verify_profile(str(work / "expensive.json"), m.llama)
    configs = {
        "reference": dict(extra_args=[]),
        "cycle_1": dict(extra_args=chain + ["--hvd-gate", gate1, "--hvd-tier-cycle", *every]),
        "cycle_2": dict(extra_args=tree + ["--hvd-gate", gate2, "--hvd-tier-cycle", "--hvd-skip-idle-extend",
                                           *every]),
        "cost_off": dict(extra_args=chain + ["--hvd-gate", gate1, "--hvd-profile", profile, *every]),
    }
    out = {}
    for name, cfg in configs.items():
        launcher = {} if name == "reference" else {"launcher": "sglang_hvd.launch_server"}
        server = sglang_server_factory(m.llama, **cfg, **launcher)
        try:
            rounds = [server.generate_many(PROMPTS) for _ in range(2)]
            states = [s["hvd"] for s in server.server_info().get("internal_states") or [] if "hvd" in s]
            out[name] = dict(rounds=rounds, hvd=states[0] if states else None, log=server.log_path)
        finally:
            server.stop()
    return out


def _tokens(run, round_):
    return [r["output_ids"] for r in run["rounds"][round_]]


@pytest.mark.parametrize("name", ["cycle_1", "cycle_2", "cost_off"])
def test_tier_switches_mid_stream_leave_the_output_unchanged(runs, name):
    want = _tokens(runs["reference"], 0)
    for round_ in (0, 1):
        assert _tokens(runs[name], round_) == want, f"{name} round {round_} (log: {runs[name]['log']})"


@pytest.mark.parametrize("name, tiers", [("cycle_1", ["off", "1-1-2", "1-3-4"]),
                                         ("cycle_2", ["off", "2-1-2", "2-1-3", "2-2-4", "2-2-7", "2-3-8"])])
def test_the_tier_cycle_runs_every_mode_and_skips_eagle3s_draft_on_cache_only_steps(runs, name, tiers):
    hvd = runs[name]["hvd"]
    assert hvd["tiers"] == tiers and hvd["tier_rule"] == "cycle"
    modes = ["off"] + [f"{t}{suffix}" for t in tiers[1:] for suffix in ("/cache", "")]
    assert sorted(hvd["mode_names"]) == sorted(modes)
    # every tier ran, in turn (a mode with EAGLE3 counts as cache-only when no row kept an EAGLE3 node)
    per_tier = {}
    for mode, n in hvd["modes"].items():
        per_tier[mode.split("/")[0]] = per_tier.get(mode.split("/")[0], 0) + n
    cycle = len(modes)
    assert sum(per_tier.values()) == hvd["steps"] and abs(per_tier["off"] - hvd["steps"] / cycle) <= 1, hvd["modes"]
    assert all(abs(per_tier[t] - 2 * hvd["steps"] / cycle) <= 2 for t in tiers[1:]), hvd["modes"]
    # a switch at every change of tier (a mode with and one without EAGLE3 share their tier's state):
    # each full cycle switches once into every tier
    assert hvd["tier_switches"] >= len(tiers) * (hvd["steps"] // cycle), (hvd["tier_switches"], hvd["steps"])
    # a cache-only step verifies no EAGLE3 node: its draft forwards were skipped
    cache_only = sum(hvd["modes"][m] for m in modes if m.endswith("/cache"))
    assert hvd["drafts_skipped"] >= cache_only > 0
    assert hvd["step_errors"] == 0 and hvd["gate_errors"] == 0
    assert hvd["cache_accepted"] > 0 and hvd["plain_rows"] > 0
    # the tiny draft accepts (almost) nothing: the EAGLE3 curve the rule serves has lost (almost) all its gain
    assert hvd["eagle3_yield_rows"] > 20 and hvd["eagle3_yield_scale"] < 0.2, hvd


def test_a_profile_where_verifying_costs_more_than_it_yields_picks_no_speculation(runs):
    hvd = runs["cost_off"]["hvd"]
    assert hvd["tier_rule"] == "cost" and hvd["profile"] == "expensive-verify" and hvd["profile_kind"] == "measured"
    assert hvd["payoff_model"] == "curve of 3 widths", hvd  # the 1-3-4 gate's own payoff curve (hvd train's default)
    assert hvd["modes"] == {"off": hvd["steps"]} and hvd["steps"] > 0
    assert hvd["cache_rows"] == 0 and hvd["plain_rows"] == hvd["rows"]
    assert hvd["eagle3_yield_rows"] == 0 and hvd["eagle3_yield_scale"] == 1.0  # no EAGLE3 row: the gate's curve
    # the server timed its steps: what no profile term times (SGLang's scheduler around the forwards) is there,
    # and a small part of the wall
    assert hvd["profile_untimed_ms"] > 0 and 0 < hvd["profile_untimed_share"] < 0.5, hvd
    # every step expected its rows' bonus tokens, and emitted them (one a row)
    assert hvd["mode_expected_tokens"] == {"off": float(hvd["rows"])} and hvd["mode_emitted_tokens"] == {
        "off": hvd["rows"]}, hvd
    metas = [r["meta_info"] for r in runs["cost_off"]["rounds"][1]]
    # one token per decode step: no draft token was accepted
    assert sum(m["completion_tokens"] - 1 for m in metas) == sum(m["spec_verify_ct"] for m in metas)


def test_skipped_idle_extends_leave_the_output_unchanged_and_are_counted(runs):
    hvd, plain = runs["cycle_2"]["hvd"], runs["cycle_1"]["hvd"]
    # off and the cache-only modes run no EAGLE3 draft: their steps skip the extend
    idle = sum(n for mode, n in hvd["modes"].items() if mode == "off" or mode.endswith("/cache"))
    assert hvd["extends_skipped"] == idle > 0 and plain["extends_skipped"] == 0
