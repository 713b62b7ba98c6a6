"""Fuzz the command line's input paths: every malformed input is one line on stderr, exit 2,
no traceback and no output file; a randomly damaged trace file is either read (exit 0) or
refused that way, never a crash."""

from __future__ import annotations

import gzip
import json
import os
import random

import pytest

from sglang_hvd.cli.main import main as hvd


def bad_trace_inputs(tmp_path, good_line: str) -> dict[str, str]:
    rec = json.loads(good_line)

    def variant(**changes) -> str:
        return json.dumps({**rec, **changes})

    cases = {
        "not json": "{this is not json",
        "a list, not an object": "[1, 2, 3]",
        "missing output_ids": json.dumps({k: v for k, v in rec.items() if k != "output_ids"}),
        "ids as a string": variant(prompt_ids="1 2 3"),
        "ids of floats": variant(output_ids=[1.5, 2.0]),
        "a negative id": variant(output_ids=[3, -1]),
        "an id of 10^30": variant(prompt_ids=[10**30]),
        "a bool id": variant(output_ids=[True, 4]),
        "turn as a string": variant(turn="3"),
        "unknown version": variant(v=99),
        "binary junk": "\x00\x01\x02\xff\xfe",
    }
    paths = {}
    for i, (name, line) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}.jsonl"
        path.write_text(good_line + "\n" + line + "\n", errors="surrogateescape")
        paths[name] = str(path)
    full = gzip.compress(((good_line + "\n") * 50).encode())
    (tmp_path / "cut.jsonl.gz").write_bytes(full[: len(full) // 2])
    paths["truncated gzip"] = str(tmp_path / "cut.jsonl.gz")
    (tmp_path / "adir").mkdir()
    paths["a directory"] = str(tmp_path / "adir")
    paths["missing file"] = str(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("")
    paths["empty file"] = str(tmp_path / "empty.jsonl")
    return paths


def commands(kind: str, path: str, out: str, synth_dir: str, demo_dir: str | None) -> list[str]:
    tok = os.path.join(synth_dir, "tokenizer")
    return {
        "stats": ["stats", path, "--json", out],
        "replay": ["replay", path, "--json", out],
        "eval": ["eval", path, "--gate", os.path.join(demo_dir or "", "gate"), "--json", out],
        "train": ["train", path, "--tokenizer", tok, "-o", out],
    }[kind]


@pytest.mark.parametrize("kind", ["stats", "replay", "eval", "train"])
def test_every_malformed_trace_input_is_one_line_and_exit_2(kind, synth_traces, synth_dir, tmp_path, capsys, request):
    demo = None
    if kind in ("eval", "train"):
        pytest.importorskip("torch", reason="needs the train extra")
        demo = request.getfixturevalue("demo_dir") if kind == "eval" else None
    capsys.readouterr()  # whatever the fixtures printed
    good = open(synth_traces).readline().strip()
    for name, path in bad_trace_inputs(tmp_path, good).items():
        out = str(tmp_path / f"out_{kind}")
        rc = hvd(commands(kind, path, out, synth_dir, demo))
        err = capsys.readouterr().err.strip()
        assert rc == 2, (kind, name, rc, err)
        assert err.startswith(f"hvd {kind}: error: ") and "\n" not in err and "Traceback" not in err, (kind, name, err)
        assert not os.path.exists(out), (kind, name)


def test_every_malformed_conversation_input_is_one_line_and_exit_2(synth_dir, tmp_path, capsys):
    good = open(os.path.join(synth_dir, "conversations.jsonl")).readline().strip()
    conv = json.loads(good)
    cases = {
        "not json": "{oops",
        "messages not a list": json.dumps({**conv, "messages": "hello"}),
        "a message without a role": json.dumps({**conv, "messages": [{"content": "hi"}]}),
        "content a number": json.dumps({**conv, "messages": [{"role": "user", "content": 5},
                                                             {"role": "assistant", "content": "x"}]}),
        "a number, not an object": "42",
    }
    paths = {}
    for i, (name, line) in enumerate(cases.items()):
        p = tmp_path / f"c{i}.jsonl"
        p.write_text(good + "\n" + line + "\n")
        paths[name] = str(p)
    full = gzip.compress(((good + "\n") * 20).encode())
    (tmp_path / "cut.jsonl.gz").write_bytes(full[: len(full) // 2])
    paths["truncated gzip"] = str(tmp_path / "cut.jsonl.gz")
    paths["missing file"] = str(tmp_path / "missing.jsonl")
    (tmp_path / "d").mkdir()
    paths["a directory"] = str(tmp_path / "d")
    for name, path in paths.items():
        out = tmp_path / "traces.jsonl"
        rc = hvd(["import", path, "--tokenizer", os.path.join(synth_dir, "tokenizer"), "-o", str(out)])
        err = capsys.readouterr().err.strip()
        assert rc == 2, (name, rc, err)
        assert err.startswith("hvd import: error: ") and "\n" not in err and "Traceback" not in err, (name, err)
        assert not out.exists() and not os.path.exists(str(out) + ".partial"), name


def test_randomly_damaged_trace_files_are_read_or_refused_never_a_crash(synth_traces, tmp_path, capsys):
    lines = open(synth_traces).read().splitlines()[:6]
    data = ("\n".join(lines) + "\n").encode()
    rng = random.Random(2026)
    outcomes = {0: 0, 2: 0}
    for case in range(60):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 6)):
            i = rng.randrange(len(damaged))
            op = rng.choice(("flip", "delete", "insert"))
            if op == "flip":
                damaged[i] = rng.randrange(256)
            elif op == "delete":
                del damaged[i]
            else:
                damaged.insert(i, rng.choice(b'{}[]",:-0123456789e\n'))
        path = tmp_path / f"f{case}.jsonl"
        path.write_bytes(bytes(damaged))
        rc = hvd(["stats", str(path)])
        captured = capsys.readouterr()
        assert rc in outcomes, (case, rc, captured.err)
        assert "Traceback" not in captured.err, (case, captured.err)
        if rc == 2:
            assert "\n" not in captured.err.strip(), (case, captured.err)
        outcomes[rc] += 1
    assert outcomes[2] > 30  # most damage is caught; some (inside a number) leaves valid ids
