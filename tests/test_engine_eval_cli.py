"""launch/bench/engine_eval.py refuses bad paths before any work, and hands its servers
absolute ones (they run in the work folder, where a relative path points elsewhere: a
relative --gate used to serve a whole mode and then fail). No sglang needed: every check
here comes before the first server."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from conftest import REPO, bench_script

SCRIPT = os.path.join(REPO, "launch", "bench", "engine_eval.py")


def _engine_eval(cwd, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *argv], cwd=cwd, capture_output=True, text=True, timeout=120)


def _script():
    return bench_script("engine_eval")


def test_help_names_the_shape_flags_and_their_defaults(tmp_path):
    done = _engine_eval(tmp_path, "--help")
    assert done.returncode == 0, done.stderr
    flat = " ".join(done.stdout.split())
    assert "--verify-nodes N" in flat and "(default: the gate's with --gate, else 4)" in flat
    assert "Bad input (a missing or unreadable file, a gate that does not load, a flag out of range)" in flat


@pytest.mark.parametrize("argv, error", [
    # the newcomer's case: the gate's folder relative to where the command runs
    (["t.jsonl", "--gate", "../some/gate"], "--gate ../some/gate: {parent}/some/gate: gate directory not found"),
    (["t.jsonl", "--gate", "half_gate"], "--gate half_gate: {tmp}/half_gate/gate.onnx: missing"),
    (["missing.jsonl", "--modes", "eagle3_only"], "missing.jsonl: no such file"),
    (["folder", "--modes", "eagle3_only"], "folder: is a directory, expected a trace file"),
    (["t.jsonl", "--modes", "eagle3_only", "--json", "folder"], "--json folder: is a directory; give a file path"),
    (["t.jsonl", "--modes", "eagle3_only", "--work-dir", "t.jsonl"], "--work-dir t.jsonl: exists and is not a folder"),
    (["t.jsonl", "--modes", "eagle3_only", "--rule-score", "nan"], "--rule-score nan: expected a finite number"),
    (["t.jsonl", "--modes", "eagle3_only", "--verify-topk", "1", "--verify-nodes", "7"],
     "--verify-topk/--verify-steps/--verify-nodes: with topk 1 a verify row is a chain"),
])
def test_a_bad_path_or_value_is_one_line_and_exit_2_before_any_work(tmp_path, argv, error):
    (tmp_path / "t.jsonl").write_text("{}\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "half_gate").mkdir()
    work = tmp_path / "work"
    if "--work-dir" not in argv:
        argv = [*argv, "--work-dir", str(work)]
    done = _engine_eval(tmp_path, *argv)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("engine_eval: error: " + error.format(tmp=tmp_path, parent=tmp_path.parent)), line
    assert not work.exists() and done.stdout == ""


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads files without read permission")
def test_an_unreadable_trace_file_is_refused(tmp_path):
    traces = tmp_path / "t.jsonl"
    traces.write_text("{}\n")
    traces.chmod(0)
    done = _engine_eval(tmp_path, "t.jsonl", "--modes", "eagle3_only")
    assert done.returncode == 2
    assert done.stderr.strip() == "engine_eval: error: t.jsonl: cannot read it (Permission denied)"


def test_relative_paths_reach_the_servers_absolute(demo_dir, monkeypatch):
    """A relative gate, traces file, work folder and JSON path are made absolute once they
    check out; the server's --hvd-gate is the absolute folder."""
    engine_eval = _script()
    monkeypatch.chdir(demo_dir)
    monkeypatch.setattr(engine_eval.harness, "sglang_available", lambda: None)
    settings = engine_eval.resolve(engine_eval.build_parser().parse_args(
        ["traces.jsonl", "--gate", "gate", "--modes", "eagle3_only,hvd", "--work-dir", "w", "--json", "o.json"]))
    assert settings.traces == (os.path.join(demo_dir, "traces.jsonl"),)
    assert settings.gate_dir == os.path.join(demo_dir, "gate")
    assert (settings.work_dir, settings.json_path) == (os.path.join(demo_dir, "w"), os.path.join(demo_dir, "o.json"))
    assert settings.model == settings.gate.spec.verify and settings.modes == ("eagle3_only", "hvd")
    models = SimpleNamespace(max_context_tokens=4096, draft=os.path.join(demo_dir, "w", "models", "draft"))
    args, _, launcher = engine_eval.server_args("hvd", models, settings.model.shape, settings.gate_dir, 2)
    assert args[args.index("--hvd-gate") + 1] == os.path.join(demo_dir, "gate")
    assert launcher == "sglang_hvd.launch_server"
    assert not os.path.exists("w") and not os.path.exists("o.json")  # checked, not yet written


def test_without_a_gate_the_shape_comes_from_the_verify_flags(tmp_path, monkeypatch):
    """The shared shape parsing (sglang_hvd.cli.options): a 3-token chain unless told."""
    engine_eval = _script()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(engine_eval.harness, "sglang_available", lambda: None)
    (tmp_path / "t.jsonl").write_text("{}\n")
    parse = engine_eval.build_parser().parse_args
    assert engine_eval.resolve(parse(["t.jsonl", "--modes", "greedy"])).model.shape.to_json() == {
        "topk": 1, "steps": 3, "nodes": 4}
    tree = engine_eval.resolve(parse(["t.jsonl", "--modes", "eagle3_only", "--verify-topk", "2", "--verify-nodes", "8",
                                      "--eagle3-mean", "1.5"])).model
    assert tree.shape.to_json() == {"topk": 2, "steps": 3, "nodes": 8} and tree.eagle3.tokens(7) == 1.5
