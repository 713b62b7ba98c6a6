"""``hvd adapt``'s checks before any training, against a stand-in HTTP server (the whole
loop on a real server: tests/sglang_cpu/test_e2e_hvd.py)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch", reason="hvd adapt trains a gate: the train extra")

from sglang_hvd.gate import Gate  # noqa: E402
from sglang_hvd.predictor import adapt_cli  # noqa: E402
from sglang_hvd.predictor.adapt_cli import held_back_split, overrides  # noqa: E402
from sglang_hvd.trace import ReadReport, iter_traces  # noqa: E402


@pytest.fixture
def fake_server(fake_servers):
    """``(url, states)``: /server_info answers ``{"internal_states": states}`` (set by the test)."""
    answers, urls = fake_servers
    states: list = []
    answers[0]["internal_states"] = states
    return urls[0], states


def hvd_block(digest: str, threshold=1.0) -> dict:
    return {"hvd": {"gate_digest": digest, "decision": "gate", "gate_threshold": threshold, "gate_eagle_reserve": 0,
                    "gate_cache_siblings": 4, "verify_shape": "topk 4, steps 3, 16 nodes", "dp_rank": 0}}


def run(demo_dir, url, tmp_path, *extra):
    traces = os.path.join(demo_dir, "traces.jsonl")
    return adapt_cli.main([traces, "--url", url, "--gate", os.path.join(demo_dir, "gate"), "--base", traces,
                           "--tokenizer", os.path.join(demo_dir, "tokenizer"), "-o", str(tmp_path / "new"), *extra])


def test_the_gate_given_must_be_the_one_the_server_serves(demo_dir, fake_server, tmp_path, capsys):
    url, states = fake_server
    assert run(demo_dir, url, tmp_path) == 2
    assert "runs no HVD worker: start it with python -m sglang_hvd.launch_server" in capsys.readouterr().err
    states[:] = [hvd_block("0123456789abcdef")]
    assert run(demo_dir, url, tmp_path) == 2
    digest = Gate(os.path.join(demo_dir, "gate")).digest
    assert (f"--gate {os.path.join(demo_dir, 'gate')} is gate {digest}, but {url} serves 0123456789abcdef: pass the "
            "directory of the gate it serves") in capsys.readouterr().err
    states[:] = [hvd_block(digest), {"hvd": {**hvd_block("fedcba9876543210")["hvd"], "dp_rank": 1}}]
    assert run(demo_dir, url, tmp_path) == 2
    assert f"its ranks serve different gates ({digest}, fedcba9876543210)" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "new")  # nothing trained or written


@pytest.mark.parametrize("flag, value", [("--held-back", "1"), ("--held-back", "nan"), ("--min-gain", "inf"),
                                         ("--concurrency", "0"), ("--epochs", "0")])
def test_bad_numbers_are_refused_before_any_work(demo_dir, tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit) as e:  # argparse: no server is asked
        run(demo_dir, "http://127.0.0.1:9", tmp_path, flag, value)
    assert e.value.code == 2 and flag in capsys.readouterr().err


def test_a_url_that_is_not_one_is_refused_before_any_work(demo_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        run(demo_dir, "127.0.0.1:30000", tmp_path)
    assert e.value.code == 2
    assert "--url: expected a server URL like http://127.0.0.1:30000, got '127.0.0.1:30000'" in capsys.readouterr().err


def test_held_back_requests_are_the_most_recent_of_each_file(demo_dir, tmp_path):
    lines = open(os.path.join(demo_dir, "traces.jsonl")).read().splitlines()
    (tmp_path / "a.jsonl").write_text("\n".join(lines[:10]) + "\n")
    (tmp_path / "b.jsonl").write_text("\n".join(lines[10:15]) + "\n")
    train, held = held_back_split([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")], 0.2, False, ReadReport())
    ids = [r.req_id for r in iter_traces(os.path.join(demo_dir, "traces.jsonl"))][:15]
    assert [r.req_id for r in held] == ids[8:10] + ids[14:15]  # 2 of 10, 1 of 5 (at least one)
    assert [r.req_id for r in train] == ids[:8] + ids[10:14]
    (tmp_path / "c.jsonl").write_text(lines[0] + "\n")
    with pytest.raises(Exception, match=r"c.jsonl: 1 recorded request\(s\); adapting needs at least 2 per file"):
        held_back_split([str(tmp_path / "c.jsonl")], 0.2, False, ReadReport())


def test_the_servers_explicit_decision_settings_apply_to_both_gates(demo_dir):
    rule = Gate(os.path.join(demo_dir, "gate")).rule
    served = {"threshold": rule.threshold, "eagle_reserve": rule.eagle_reserve, "cache_siblings": rule.cache_siblings}
    assert overrides(rule, served) == {}
    assert overrides(rule, {**served, "threshold": float("-inf")}) == {"threshold": float("-inf")}
