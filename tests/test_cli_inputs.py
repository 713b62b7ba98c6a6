"""Bad input and unwritable outputs: one line, exit 2, nothing left behind, before the work.

Each case was a defect a user reproduced (issue "Reliability ..."): found only after the
whole run, a traceback, or nonsense figures from an empty input.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys

import pytest

from sglang_hvd.cli.main import main as hvd

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_line_error(capsys, command: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hvd {command}: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("flag", ["--json", "--steps"])
def test_replay_checks_its_outputs_before_replaying(synth_traces, tmp_path, capsys, flag):
    assert hvd(["replay", synth_traces, flag, "/proc/hvd-cannot-write-here"]) == 2
    assert "cannot write in /proc" in one_line_error(capsys, "replay")
    assert hvd(["replay", synth_traces, flag, str(tmp_path)]) == 2
    assert "is a directory; give a file path" in one_line_error(capsys, "replay")


def test_import_json_to_an_unwritable_place_leaves_no_trace_file(synth_dir, tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    assert hvd(["import", os.path.join(synth_dir, "conversations.jsonl"),
                "--tokenizer", os.path.join(synth_dir, "tokenizer"),
                "-o", str(out), "--json", "/proc/hvd-x.json"]) == 2
    assert "--json /proc/hvd-x.json: cannot write in /proc" in one_line_error(capsys, "import")
    assert not out.exists() and os.listdir(tmp_path) == []


def test_train_refuses_an_existing_file_or_a_foreign_folder_before_labelling(synth_traces, synth_dir, tmp_path, capsys):
    pytest.importorskip("torch", reason="hvd train needs the train extra")
    tok = os.path.join(synth_dir, "tokenizer")
    existing = tmp_path / "file"
    existing.write_text("x")
    assert hvd(["train", synth_traces, "--tokenizer", tok, "-o", str(existing)]) == 2
    assert "exists and is not a folder; give a new folder" in one_line_error(capsys, "train")
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    assert hvd(["train", synth_traces, "--tokenizer", tok, "-o", str(foreign)]) == 2
    assert "exists and holds other files (notes.txt); choose a new folder" in one_line_error(capsys, "train")
    assert capsys.readouterr().out == ""  # nothing was labelled or trained
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_a_negative_eagle_reserve_is_an_argument_error(demo_dir, capsys):
    with pytest.raises(SystemExit) as e:
        hvd(["eval", os.path.join(demo_dir, "traces.jsonl"), "--gate", os.path.join(demo_dir, "gate"),
             "--eagle-reserve", "-1"])
    assert e.value.code == 2 and "--eagle-reserve: expected an integer in [0, 1024], got -1" in capsys.readouterr().err


def test_a_truncated_gzip_conversation_file_is_one_line(synth_dir, tmp_path, capsys):
    data = gzip.compress(open(os.path.join(synth_dir, "conversations.jsonl"), "rb").read())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    out = tmp_path / "t.jsonl"
    assert hvd(["import", str(cut), "--tokenizer", os.path.join(synth_dir, "tokenizer"), "-o", str(out)]) == 2
    err = one_line_error(capsys, "import")
    assert str(cut) in err and "unreadable (EOFError" in err and "is the file complete?" in err
    assert not out.exists()


def test_empty_inputs_are_refused_not_reported(synth_dir, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert hvd(["stats", str(empty)]) == 2
    assert f"no trace records in {empty}" in one_line_error(capsys, "stats")
    steps = tmp_path / "steps.jsonl"
    assert hvd(["replay", str(empty), "--steps", str(steps)]) == 2
    assert f"no trace records in {empty}" in one_line_error(capsys, "replay")
    assert not steps.exists()
    out = tmp_path / "t.jsonl"
    assert hvd(["import", str(empty), "--tokenizer", os.path.join(synth_dir, "tokenizer"), "-o", str(out)]) == 2
    assert "no conversations in it (an empty file?)" in one_line_error(capsys, "import")
    assert not out.exists()


def test_a_closed_pipe_ends_quietly(synth_traces):
    cmd = [sys.executable, "-m", "sglang_hvd.cli.main", "replay", synth_traces, "--limit", "30"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    # Closed before the command writes (its table comes at the end), like `| head -0`: reading
    # a line first raced with a small output that fits the pipe's buffer and exits 0.
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err


def test_train_refuses_token_ids_beyond_the_tokenizers_vocabulary(synth_traces, synth_dir, tmp_path, capsys):
    pytest.importorskip("torch", reason="hvd train needs the train extra")
    import json

    lines = open(synth_traces).read().splitlines()
    rec = json.loads(lines[1])
    rec["output_ids"][2] = 10**6  # same tokenizer digest, an id no tokenizer of this size has
    edited = tmp_path / "edited.jsonl"
    edited.write_text("\n".join([lines[0], json.dumps(rec), *lines[2:]]) + "\n")
    out = tmp_path / "gate"
    assert hvd(["train", str(edited), "--tokenizer", os.path.join(synth_dir, "tokenizer"), "-o", str(out)]) == 2
    err = one_line_error(capsys, "train")
    assert f"request {rec['req_id']}: token id 1000000 is beyond the vocabulary of --tokenizer" in err
    assert "re-import the conversations with it" in err and not out.exists()


@pytest.mark.parametrize("name", ["synth", "import", "collect", "stats", "replay", "train", "demo", "eval"])
def test_every_help_shows_examples_that_parse(name, capsys):
    import importlib
    import sys

    from sglang_hvd.cli.common import help_examples
    from sglang_hvd.cli.main import COMMANDS, command

    module = COMMANDS[name][0]
    if module is None:
        pytest.importorskip("torch", reason="hvd train needs the train extra")
    parser = importlib.import_module(module or sys.modules[command(name).__module__].__name__).build_parser()
    examples = help_examples(parser)
    assert len(examples) >= 1
    assert "examples:\n  hvd " + name in parser.format_help()
    for argv in examples:
        parser.parse_args(argv)  # exits 2 on an unknown flag or a bad value
    assert capsys.readouterr().err == ""
