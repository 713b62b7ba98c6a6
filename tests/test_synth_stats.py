"""hvd synth (the embedded workload) and hvd stats (repetition profile)."""

from __future__ import annotations

import json
import os

import pytest

from sglang_hvd.cli.main import main as hvd
from sglang_hvd.conversation import iter_conversations
from sglang_hvd.stats import RepetitionProfiler
from sglang_hvd.trace import TokenizerId, TraceRecord, iter_traces, token_array


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        assert hvd(["synth", "-o", str(tmp_path / name), "--sessions", "8", "--seed", str(seed)]) == 0
    def read(n, f):
        return (tmp_path / n / f).read_bytes()

    assert read("a", "conversations.jsonl") == read("b", "conversations.jsonl")
    assert read("a", "tokenizer/tokenizer.json") == read("b", "tokenizer/tokenizer.json")
    assert read("a", "conversations.jsonl") != read("c", "conversations.jsonl")


def test_sessions_are_valid_conversations_of_every_kind(synth_dir):
    convs = [c for _, _, c in iter_conversations([os.path.join(synth_dir, "conversations.jsonl")])]
    assert len(convs) == 24
    assert [c.source for c in convs[:4]] == ["synth-tools", "synth-config", "synth-code", "synth-chat"]
    tools = [c for c in convs if c.source == "synth-tools"]
    calls = [call["function"]["name"] for c in tools for m in c.messages for call in m.get("tool_calls") or []]
    assert {"get_customer", "get_order"} <= set(calls)
    # Arguments depend on state: the same call structure with different order ids.
    order_ids = {json.loads(call["function"]["arguments"])["order_id"]
                 for c in tools for m in c.messages for call in m.get("tool_calls") or []
                 if call["function"]["name"] == "get_order"}
    assert len(order_ids) > 10


def test_workload_makes_cache_drafts_pay_off_unevenly(synth_traces):
    """Agentic kinds repeat a lot, chat hardly at all: the contrast the gate exists for."""
    profiler = RepetitionProfiler(4)
    profiler.add_all(iter_traces(synth_traces))
    rep = {s: v.repetition for s, v in profiler.sources.items()}
    assert rep["synth-chat"] < 0.10
    assert rep["synth-tools"] > 0.5 and rep["synth-config"] > 0.8 and rep["synth-code"] > 0.8


def test_invalid_synth_options_exit_2(tmp_path, capsys):
    assert hvd(["synth", "-o", str(tmp_path), "--kinds", "tools,poetry"]) == 2
    assert "unknown session kind(s) ['poetry']" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        hvd(["synth", "-o", str(tmp_path), "--sessions", "0"])
    assert e.value.code == 2


def rec(req_id, prompt, output):
    return TraceRecord(req_id=req_id, conv_id=req_id, turn=0, source="s", tokenizer=TokenizerId("t", "d"),
                       prompt_ids=token_array(prompt), output_ids=token_array(output))


def test_repetition_worked_example():
    p = RepetitionProfiler(match_len=2)
    # (5, 6, 7) is in the prompt, so only output[2] continues a 2-token match.
    p.add(rec("a", [5, 6, 7], [5, 6, 7, 9]))
    assert p.sources["s"].repeated_output_tokens == 1
    # A later request: (6, 7, 9) occurred in the earlier output; (9, 1, 2) and (1, 2, 3) did not.
    p.add(rec("b", [8, 6, 7], [9, 1, 2, 3]))
    assert p.sources["s"].repeated_output_tokens == 2
    assert p.sources["s"].output_tokens == 8
    assert p.overall().repetition == 0.25


def test_stats_cli_prints_and_writes_json(synth_traces, tmp_path, capsys):
    out = tmp_path / "stats.json"
    assert hvd(["stats", synth_traces, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "repeat@4" in text and "synth-config" in text and "overall" in text
    data = json.loads(out.read_text())
    assert set(data["sources"]) == {"synth-tools", "synth-config", "synth-code", "synth-chat"}
    assert data["overall"]["requests"] == sum(s["requests"] for s in data["sources"].values())
    assert data["overall"]["conversations"] == 24


def test_cli_usage_and_unknown_command(capsys):
    assert hvd(["--help"]) == 0
    usage = capsys.readouterr().out
    assert "synth" in usage and "import" in usage and "stats" in usage
    assert hvd(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_progress_off_a_terminal_is_a_line_every_few_seconds():
    import io

    from sglang_hvd.report import LineProgress

    now = [0.0]
    out = io.StringIO()
    bar = LineProgress(total=40, desc="import", unit="conv", every_s=5.0, stream=out, clock=lambda: now[0])
    with bar:
        for _ in range(40):
            now[0] += 0.5
            bar.update(1)
    assert out.getvalue().splitlines() == [
        "import: 10/40 conv (25%), 5 s, ~15 s left",
        "import: 20/40 conv (50%), 10 s, ~10 s left",
        "import: 30/40 conv (75%), 15 s, ~5 s left",
        "import: 40/40 conv (100%), 20 s, done",
    ]
    quiet = io.StringIO()  # shorter than a period: nothing at all
    with LineProgress(range(3), desc="x", stream=quiet, clock=lambda: 0.0) as it:
        assert list(it) == [0, 1, 2]
    assert quiet.getvalue() == ""
