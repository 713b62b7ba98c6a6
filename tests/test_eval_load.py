"""``hvd eval --concurrency`` (sglang_hvd/cli/eval_load.py): the JSON interface of issue 23 on a
small synthetic workload, and the flags refused before any trace is read."""

from __future__ import annotations

import argparse
import json
import math
import os

import pytest

from sglang_hvd.cli.eval_load import check_tiers
from sglang_hvd.cli.main import main as hvd
from sglang_hvd.verify import VerifyShape

STATIC = ("1-3-4", "4-3-16")


def small_traces(demo_dir: str, path: str) -> list[dict]:
    """The first 2 turns of the demo's first 3 conversations, written to ``path``."""
    kept, turns = [], {}
    with open(os.path.join(demo_dir, "traces.jsonl")) as f, open(path, "w") as out:
        for line in f:
            r = json.loads(line)
            conv = r["conv_id"]
            if turns.get(conv, 0) < 2 and (conv in turns or len(turns) < 3):
                turns[conv] = turns.get(conv, 0) + 1
                kept.append(r)
                out.write(line)
    return kept


def test_eval_by_concurrency_writes_every_policy_timed(demo_dir, tmp_path, capsys):
    records = small_traces(demo_dir, str(tmp_path / "t.jsonl"))
    out = tmp_path / "load.json"
    assert hvd(["eval", str(tmp_path / "t.jsonl"), "--gate", os.path.join(demo_dir, "gate"), "--concurrency", "1,2",
                "--tiers", "off," + ",".join(STATIC), "--static-tiers", ",".join(STATIC), "--json", str(out)]) == 0
    capsys.readouterr()
    data = json.loads(out.read_text())
    assert set(data["by_concurrency"]) == {"1", "2"} and data["profile"]["name"] == "qwen3-8b-h200"  # the default
    names = {"greedy", "eagle3_adaptive", "hvd"} | {f"{f}@{t}" for f in ("eagle3", "cache_only", "hvd") for t in STATIC}
    for level in data["by_concurrency"].values():
        policies = level["policies"]
        assert set(policies) == names
        for name, p in policies.items():
            figures = [p["tokens_per_s"], p["time_per_1k"], p["cycles_per_1k"]]
            assert all(math.isfinite(x) and x > 0 for x in figures), name
            assert p["tokens_per_s"] * p["time_per_1k"] == pytest.approx(1e6), name  # both from one modelled time
        assert policies["greedy"]["cycles_per_1k"] == 1000.0  # a token a cycle, prefills included
        assert policies["greedy"]["modes"] == {"off": 1.0}
        assert policies["eagle3@4-3-16"]["modes"] == {"4-3-16": 1.0}
        assert policies["cache_only@1-3-4"]["modes"] == {"1-3-4/cache": 1.0}  # no EAGLE3 draft
        # the cost-aware policy's picks carry what each mode's steps were expected to emit, and emitted; no other's
        tokens = policies["hvd"]["mode_tokens"]
        assert set(tokens) == set(policies["hvd"]["modes"])
        assert all(v["expected_per_step"] >= 1 and v["emitted_per_step"] >= 1 for v in tokens.values())
        assert all("mode_tokens" not in p for name, p in policies.items() if name != "hvd")
    # greedy one request at a time: every decode step is the H200 estimate's plain step, 0.4 + 4.1 ms, plus
    # 147,456 bytes of KV a context token at 4 TB/s; a request's first token is its (untimed) prefill
    ms = sum(4.5 + (len(r["prompt_ids"]) + pos) * 147_456 / 4e12 * 1e3
             for r in records for pos in range(1, len(r["output_ids"])))
    tokens = sum(len(r["output_ids"]) for r in records)
    assert data["by_concurrency"]["1"]["policies"]["greedy"]["time_per_1k"] == pytest.approx(1000 * ms / tokens)


def test_default_tiers_come_from_the_gate_s_shape():
    args = argparse.Namespace(tiers=None, static_tiers=None)
    check_tiers(args, VerifyShape(4, 3, 16))
    # one server's ladder
    assert [t.name for t in args.tiers] == ["off", "4-1-2", "4-1-4", "4-1-5", "4-2-8", "4-2-16", "4-3-16"]
    # the static shapes, and the ladder's tiers beside them
    assert [t.name for t in args.static_tiers] == ["1-1-2", "1-3-4", "1-7-8", "4-1-2", "4-1-4", "4-2-8", "4-3-16",
                                                   "4-1-5", "4-2-16"]
    args = argparse.Namespace(tiers=None, static_tiers=None)
    check_tiers(args, VerifyShape(1, 3, 4))  # a chain gate: nothing wider than 4 nodes
    assert [t.name for t in args.tiers] == ["off", "1-1-2", "1-3-4"]
    assert [t.name for t in args.static_tiers] == ["1-1-2", "1-3-4", "4-1-2", "4-1-4"]


@pytest.mark.parametrize("flags, message", [
    (["--concurrency", "0"], "argument --concurrency: expected comma-separated integers in [1, 100000], got 0"),
    (["--concurrency", "nan"], "argument --concurrency: expected comma-separated integers in [1, 100000], got 'nan'"),
    (["--concurrency", "1", "--tiers", "1-3-5"], "argument --tiers: tier '1-3-5': with topk 1 a verify row is a chain"),
    (["--concurrency", "1", "--profile", "no-profile.json"],
     "no-profile.json: no such profile file, and not a shipped estimate (qwen3-8b-h200, qwen3-8b-h100)"),
    (["--concurrency", "1", "--tiers", "off,4-3-32"], "tier 4-3-32 verifies 32 tokens per row, more than the gate's "
                                                      "topk 4, steps 3, 16 nodes; name tiers of at most 16 nodes"),
    (["--concurrency", "1", "--static-tiers", "8-3-32"], "tier 8-3-32 verifies 32 tokens per row"),
    # without --concurrency a load flag would do nothing
    (["--profile", "qwen3-8b-h100", "--tiers", "1-3-4"],
     "--profile, --tiers apply to fleet replay by load: add --concurrency C,... or leave them out"),
    (["--requests", "turns"], "--requests applies to fleet replay by load: add --concurrency C,... or leave it out"),
    (["--policies", "hvd,nope"], "argument --policies: unknown policy 'nope'; sequential replay runs cache_only, "
                                 "cache_tree, eagle3_only, greedy, hvd, hvd_online, oracle, rule, tree_oracle; fleet"),
    (["--policies", "hvd@1-3-4"], "--policies: unknown policy 'hvd@1-3-4' (a policy of fleet replay by load: add "
                                  "--concurrency C,...)"),
    (["--policies", "hvd,cache_tree", "--verify-topk", "1", "--verify-steps", "3", "--verify-nodes", "4"],
     "--policies: unknown policy 'cache_tree' (a tree policy: at topk > 1 only)"),
    (["--concurrency", "1", "--policies", "hvd_online@4-3-32"], "--policies: hvd_online@4-3-32 verifies 32 tokens per "
                                                                "row, more than the gate's topk 4, steps 3, 16 nodes"),
    (["--concurrency", "1", "--policies", "oracle"], "--policies: unknown policy 'oracle'; choose from greedy, "
                                                     "eagle3_adaptive, hvd, hvd_online, hvd_exact or a tiered policy"),
    (["--policies", ","], "argument --policies: expected policy names like hvd,hvd_online, got ','"),
], ids=["concurrency-0", "concurrency-nan", "bad-tier", "missing-profile", "tier-too-wide", "static-tier-too-wide",
        "profile-and-tiers-alone", "requests-alone", "unknown-policy", "tiered-policy-alone", "tree-policy-at-topk-1",
        "online-tier-too-wide", "sequential-policy-by-load", "no-policy"])
def test_bad_load_flags_are_refused_before_any_trace_is_read(flags, message, demo_dir, tmp_path, capsys):
    # the traces do not exist: a refusal naming the flag shows they were never opened
    argv = ["eval", str(tmp_path / "missing.jsonl"), "--gate", os.path.join(demo_dir, "gate"), *flags,
            "--json", str(tmp_path / "o.json")]
    try:
        code = hvd(argv)
    except SystemExit as e:  # argparse
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and "missing.jsonl" not in err
    assert not (tmp_path / "o.json").exists()


def test_policies_pick_what_runs_and_hvd_online_starts_cold(demo_dir, tmp_path, capsys):
    records = small_traces(demo_dir, str(tmp_path / "t.jsonl"))
    gate = os.path.join(demo_dir, "gate")
    out = tmp_path / "seq.json"
    assert hvd(["eval", str(tmp_path / "t.jsonl"), "--gate", gate, "--policies", "hvd,hvd_online",
                "--json", str(out)]) == 0
    overall = json.loads(out.read_text())["overall"]
    assert set(overall["policies"]) == {"hvd", "hvd_online", "oracle"}  # the oracle: always, the reference
    assert overall["gate"]["judged"] > 0  # hvd's judgements
    for p in overall["policies"].values():
        assert 0 < p["cycles_per_1k"] <= 1000
    # outputs cut to 15 tokens: each source (2 requests) judges at most 30 drafts, so no bin of a
    # cold calibration reaches its 32 labels, whatever the gate predicts: hvd_online plans as hvd does
    with open(tmp_path / "short.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps({**r, "output_ids": r["output_ids"][:15]}) + "\n")
    out = tmp_path / "load.json"
    assert hvd(["eval", str(tmp_path / "short.jsonl"), "--gate", gate, "--policies", "hvd@1-3-4,hvd_online@1-3-4",
                "--concurrency", "2", "--json", str(out)]) == 0
    policies = json.loads(out.read_text())["by_concurrency"]["2"]["policies"]
    assert set(policies) == {"hvd@1-3-4", "hvd_online@1-3-4"}
    assert policies["hvd@1-3-4"]["tokens"] == 86  # 5 outputs cut to 15 tokens, one of 11
    assert policies["hvd_online@1-3-4"]["cycles_per_1k"] == policies["hvd@1-3-4"]["cycles_per_1k"]
    capsys.readouterr()
