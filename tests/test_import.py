"""hvd import: chat conversations -> token traces, on the real Qwen3 tokenizer."""

from __future__ import annotations

import json
import os

import pytest

from conftest import shared_file
from sglang_hvd.cli.import_traces import main as import_main
from sglang_hvd.conversation import iter_conversations, parse_conversation
from sglang_hvd.importer import ImportOptions, import_conversation, render_turns
from sglang_hvd.trace import iter_traces

TOOL_CONV = {
    "id": "c1",
    "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "x", "content": '{"temp_c": 3}'},
        {"role": "assistant", "content": "It is 3 °C in Oslo."},
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}],
}

THINK_END = [151644, 77091, 198, 151667, 271, 151668, 271]  # <|im_start|>assistant\n<think>\n\n</think>\n\n


def test_tool_call_turn_pins_literal_token_ids(qwen):
    records = import_conversation(parse_conversation(TOOL_CONV, "lit"), qwen)
    assert [r.req_id for r in records] == ["c1#0", "c1#1"]
    first, second = records
    # Tool call as Qwen3 emits it:
    # <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>
    assert first.output_ids.tolist() == [
        151657, 198, 4913, 606, 788, 330, 455, 69364, 497, 330, 16370, 788, 5212, 8926, 788, 330, 28867, 385,
        95642, 151658, 151645]
    assert second.output_ids.tolist() == [2132, 374, 220, 18, 36286, 34, 304, 57858, 13, 151645]
    # Non-thinking mode by default: the prompt ends with the empty think block.
    assert first.prompt_ids.tolist()[-7:] == THINK_END
    assert len(first.prompt_ids) == 137 and len(second.prompt_ids) == 177
    # The tool result comes back as a user turn holding <tool_response>.
    assert "<tool_response>\n{\"temp_c\": 3}\n</tool_response>" in qwen.decode(second.prompt_ids)
    assert first.tokenizer.digest == "e671732214d932bb"


def test_thinking_on_leaves_the_think_block_to_the_output(qwen):
    conv = parse_conversation(TOOL_CONV, "lit")
    records = import_conversation(conv, qwen, ImportOptions(thinking="on"))
    assert qwen.decode(records[1].prompt_ids).endswith("<|im_start|>assistant\n")
    assert qwen.decode(records[1].output_ids) == "<think>\n\n</think>\n\nIt is 3 °C in Oslo.<|im_end|>"


def test_reasoning_content_switches_auto_mode_on(qwen):
    conv = parse_conversation({"id": "r", "messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nsmall sum\n</think>\n\n4"}]}, "lit")
    (record,) = import_conversation(conv, qwen)
    assert qwen.decode(record.output_ids) == "<think>\nsmall sum\n</think>\n\n4<|im_end|>"


@pytest.mark.shared_data
def test_every_output_decodes_to_the_rendered_turn(qwen, shared_traces):
    path, _ = shared_traces
    records = iter_traces(path)
    num = 0
    for name in ("taubench_airline.jsonl", "swe_agent.jsonl", "alpaca_llama3_8b.jsonl"):
        for _, _, conv in iter_conversations([shared_file(name)]):
            for turn, (prompt, output) in enumerate(render_turns(conv, qwen, ImportOptions())):
                r = next(records)
                assert (r.conv_id, r.turn) == (conv.conv_id, turn)
                assert qwen.decode(r.output_ids) == output
                assert qwen.decode(r.prompt_ids) == prompt
                assert output.endswith("<|im_end|>") and r.output_ids[-1] == 151645
                num += 1
    assert num == 1381 + 230 + 805


@pytest.mark.shared_data
def test_import_counts_match_the_data_readme(shared_traces):
    _, summary = shared_traces
    s = summary["sources"]
    # ../shared/data/README.md: conversations, assistant turns and Qwen3 tokens generated per file.
    assert (s["tau-bench"]["conversations"], s["tau-bench"]["requests"],
            s["tau-bench"]["output_tokens"]) == (100, 1381, 105488)
    assert (s["alpaca_eval"]["conversations"], s["alpaca_eval"]["requests"],
            s["alpaca_eval"]["output_tokens"]) == (805, 805, 337192)
    # The README counts 21,991; Qwen3's template strips the leading newline of the 10
    # SWE-agent answers that start with one (content.lstrip('\n')), so 10 fewer tokens.
    assert (s["swe-agent"]["conversations"], s["swe-agent"]["requests"],
            s["swe-agent"]["output_tokens"]) == (22, 230, 21981)
    assert summary["tokens_per_s"] > 0


def write_lines(path, lines):
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return str(path)


@pytest.mark.parametrize(
    "lines, message",
    [
        (["{bad json"], "conv.jsonl:1: invalid JSON"),
        ([{"id": 5, "messages": [{"role": "user", "content": "hi"}]}],
         "conv.jsonl:1: 'id' must be a non-empty string (or left out)"),  # missing, it is conv:1
        ([TOOL_CONV, {"id": "z", "messages": [{"role": "robot", "content": "hi"}]}],
         "conv.jsonl:2: messages[0]: unknown role 'robot' (expected one of system, user, assistant, tool)"),
        ([{"id": "z", "messages": [{"role": "user", "content": None}]}],
         "conv.jsonl:1: messages[0] (user): 'content' is missing or null"),
        ([{"id": "z", "messages": [{"role": "user", "content": "a"},
                                   {"role": "assistant", "content": "b", "tool_calls": [{"function": {}}]}]}],
         "conv.jsonl:1: messages[1].tool_calls[0]: needs 'function' with a string 'name'"),
    ],
)
def test_bad_conversations_exit_2_with_one_line_and_no_output(tmp_path, qwen_dir, capsys, lines, message):
    conv = write_lines(tmp_path / "conv.jsonl", lines)
    out = tmp_path / "out" / "t.jsonl"
    assert import_main([conv, "--tokenizer", qwen_dir, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hvd import: error: ")
    assert message in err
    assert not out.exists()
    assert not out.parent.exists() or os.listdir(out.parent) == []


def test_missing_tokenizer_and_missing_input_are_named(tmp_path, qwen_dir, capsys):
    conv = write_lines(tmp_path / "conv.jsonl", [TOOL_CONV])
    assert import_main([conv, "--tokenizer", str(tmp_path / "nope"), "-o", str(tmp_path / "t.jsonl")]) == 2
    assert f"{tmp_path / 'nope'}: tokenizer directory not found" in capsys.readouterr().err
    assert import_main([str(tmp_path / "missing.jsonl"), "--tokenizer", qwen_dir, "-o", str(tmp_path / "t.jsonl")]) == 2
    assert f"{tmp_path / 'missing.jsonl'}: no such file" in capsys.readouterr().err
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    (tmp_path / "tok" / "tokenizer_config.json").write_text("{}")
    assert import_main([conv, "--tokenizer", str(tmp_path / "tok"), "-o", str(tmp_path / "t.jsonl")]) == 2
    assert "not a valid tokenizer.json" in capsys.readouterr().err
    assert not (tmp_path / "t.jsonl").exists()
