"""HVD across a fleet: per-rank recorder files and `hvd status` over /server_info."""

from __future__ import annotations

import json

import pytest

from sglang_hvd.cli.main import main
from sglang_hvd.serving.recorder import rank_path
from sglang_hvd.serving.status import fleet_status

GATE = {"gate_digest": "ab12", "decision": "gate", "gate_threshold": 1.5, "gate_eagle_reserve": 3,
        "verify_shape": "topk 4, steps 3, 16 nodes"}


def hvd_block(dp_rank, rows, cache_rows, cache_accepted, wins=0, **gate):
    return {**GATE, **gate, "dp_rank": dp_rank, "steps": rows, "rows": rows, "cache_rows": cache_rows,
            "eagle3_branch_wins": wins, "cache_accepted": cache_accepted, "eagle3_verifies": rows - cache_rows + wins,
            "eagle3_accepted": rows - cache_rows, "cpu_us_total": 50.0 * rows, "gate_errors": 0, "step_errors": 0,
            "cache_pick_rate": cache_rows / rows, "cache_mean_accept": cache_accepted / max(cache_rows - wins, 1),
            "eagle3_mean_accept": 1.0, "cpu_us_per_step": 50.0}


def info(*blocks):
    return {"internal_states": [{"hvd": b} for b in blocks]}


def test_rank_paths_keep_the_extension():
    assert rank_path("/d/served.jsonl", None) == "/d/served.jsonl"
    assert rank_path("/d/served.jsonl", 1) == "/d/served.dp1.jsonl"
    assert rank_path("t.jsonl.gz", 0) == "t.dp0.jsonl.gz"
    assert rank_path("/d/traces", 2) == "/d/traces.dp2"


def test_totals_are_recomputed_from_the_summed_counts():
    # The module's worked example: 100 rows (40 cache, 2 EAGLE3 branch wins) + 300 rows (60 cache).
    s = fleet_status([("s1", info(hvd_block(0, 100, 40, 120, wins=2), hvd_block(1, 300, 60, 150)))])
    assert s.consistent and [r.dp_rank for r in s.ranks] == [0, 1]
    assert s.totals["rows"] == 400 and s.totals["cache_pick_rate"] == 0.25
    assert s.totals["cache_mean_accept"] == pytest.approx(270 / 98)
    assert s.totals["cpu_us_per_step"] == 50.0 and s.totals["ranks"] == 2


def test_a_replica_on_another_gate_or_without_hvd_is_named():
    s = fleet_status([("s1", info(hvd_block(0, 10, 5, 10))), ("s2", info(hvd_block(0, 10, 5, 10, gate_digest="ff00"))),
                      ("s3", {"internal_states": [{"avg_spec_accept_length": 2.0}]})])
    assert not s.consistent and s.servers_without_hvd == ("s3",)
    assert s.disagreements == ("gate_digest: ab12 (s1 rank 0) != ff00 (s2 rank 0)",)


def test_status_prints_ranks_and_totals_and_fails_on_two_gates(fake_servers, tmp_path, capsys):
    answers, urls = fake_servers
    answers[0].update(info(hvd_block(0, 100, 40, 120, wins=2), hvd_block(1, 300, 60, 150)))
    answers[1].update(info(hvd_block(0, 100, 0, 0)))
    assert main(["status", *urls, "--json", str(tmp_path / "s.json")]) == 0
    out = capsys.readouterr().out
    assert "total (2 servers)" in out and "3 ranks" in out and "one gate: digest ab12 on 3 rank(s)" in out
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["totals"]["rows"] == 500 and saved["totals"]["cache_pick_rate"] == 0.2 and saved["consistent"]
    answers[1].update(info(hvd_block(0, 100, 0, 0, gate_threshold=2.0)))
    assert main(["status", *urls]) == 1
    assert f"not one gate: gate_threshold: 1.5 ({urls[0]} rank 0, {urls[0]} rank 1) != 2.0 ({urls[1]} rank 0)" \
        in capsys.readouterr().out
    assert main(["status", "http://127.0.0.1:1"]) == 2
    assert "http://127.0.0.1:1/server_info: unreachable" in capsys.readouterr().err
    assert main(["status", "127.0.0.1:30000"]) == 2
    assert "'127.0.0.1:30000' is not a server URL: give http://HOST:PORT" in capsys.readouterr().err
