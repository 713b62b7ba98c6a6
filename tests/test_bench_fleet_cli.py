"""launch/bench/bench_fleet.py: the serving stepper's host time, and a warm global cache (--warm)."""

from __future__ import annotations

import json
import os

import pytest

from conftest import bench_script
from sglang_hvd.drafter import create_drafter
from sglang_hvd.trace import TokenizerId, TraceRecord, TraceWriter, iter_traces, token_array

pytest.importorskip("sglang_hvd.drafter._native", reason="bench_fleet serves the native drafter (not built)")


def _write(path: str, records) -> None:
    with TraceWriter(path) as w:
        for r in records:
            w.write(r)


def _record(i: int, conv: str, output: list[int]) -> TraceRecord:
    return TraceRecord(req_id=f"r{i}", conv_id=conv, turn=0, source="toy", tokenizer=TokenizerId("toy", "0"),
                       prompt_ids=token_array([7, 8, 9]), output_ids=token_array(output))


def test_fill_cache_keeps_every_response_in_the_global_cache_and_no_prompt():
    bf = bench_script("bench_fleet")
    drafter = create_drafter("native")
    bf.fill_cache(drafter, [_record(0, "a", [1, 2, 3, 4]), _record(1, "b", [5, 6]), _record(2, "c", [])])
    mem = drafter.memory_stats()
    assert mem["global_tokens"] == 6  # 4 + 2 response tokens; the prompts stayed in their own indexes
    assert mem["local_tokens"] == 0  # every request finished


def test_warm_cache_leaves_out_the_timed_conversations(demo_dir, tmp_path, capsys):
    bf = bench_script("bench_fleet")
    traces = os.path.join(demo_dir, "traces.jsonl")
    records = list(iter_traces(traces))
    convs = sorted({r.conv_id for r in records})
    timed, other = convs[:2], convs[2:]
    timed_path, warm_path = str(tmp_path / "timed.jsonl"), str(tmp_path / "warm.jsonl")
    _write(timed_path, [r for r in records if r.conv_id in timed])
    warm = [r for r in records if r.conv_id in other]
    _write(warm_path, warm + [r for r in records if r.conv_id in timed])  # the timed ones are left out
    out = str(tmp_path / "fleet.json")
    assert timed and other
    assert bf.main([timed_path, "--gate", os.path.join(demo_dir, "gate"), "--concurrency", "2", "--no-sequential",
                    "--batch", "2", "--warm", warm_path, "--json", out]) == 0
    tokens = sum(len(r.output_ids) for r in warm)
    assert f"warm cache: {len(warm)} responses ({tokens:,} tokens) from {warm_path}" in capsys.readouterr().out
    with open(out) as f:
        assert json.load(f)["warm_cache"] == {"traces": [warm_path], "repeat": 1, "responses": len(warm),
                                              "tokens": tokens}


def _split(demo_dir, tmp_path) -> tuple[str, str, list]:
    """The demo's traces as two files: two conversations to time, the others to warm the cache with."""
    records = list(iter_traces(os.path.join(demo_dir, "traces.jsonl")))
    convs = sorted({r.conv_id for r in records})
    timed_path, warm_path = str(tmp_path / "timed.jsonl"), str(tmp_path / "warm.jsonl")
    _write(timed_path, [r for r in records if r.conv_id in convs[:2]])
    warm = [r for r in records if r.conv_id in convs[2:]]
    _write(warm_path, warm)
    return timed_path, warm_path, warm


def test_a_repeated_warm_cache_and_the_drafter_bounds_set_by_flags(demo_dir, tmp_path, capsys):
    bf = bench_script("bench_fleet")
    timed, warm_path, warm = _split(demo_dir, tmp_path)
    tokens = sum(len(r.output_ids) for r in warm)
    out = str(tmp_path / "fleet.json")
    assert bf.main([timed, "--gate", os.path.join(demo_dir, "gate"), "--concurrency", "0", "--no-sequential",
                    "--batch", "2", "--warm", warm_path, "--warm-repeat", "3", "--max-occurrences", "8",
                    "--max-scan", "4", "--global-max-tokens", str(2 * tokens), "--json", out]) == 0
    text = capsys.readouterr().out
    assert "drafter bounds (set by flags): max_occurrences 8, max_scan 8, " in text  # the scan covers K at least
    assert (f"warm cache: {3 * len(warm)} responses ({3 * tokens:,} tokens) from {warm_path}, 3 times over in the "
            f"global cache at each fleet and fixed-batch run's start; the oldest evicted past {2 * tokens:,}") in text
    with open(out) as f:
        got = json.load(f)
    assert got["warm_cache"] == {"traces": [warm_path], "repeat": 3, "responses": 3 * len(warm), "tokens": 3 * tokens}
    assert got["drafter_bounds"] == {"max_occurrences": 8, "max_scan": 8, "global_max_tokens": 2 * tokens}


def test_a_global_cache_budget_of_nothing_keeps_no_warm_response(demo_dir, tmp_path, capsys):
    bf = bench_script("bench_fleet")
    timed, warm_path, _ = _split(demo_dir, tmp_path)
    cycles = {}
    for name, extra in (("empty", []), ("warm", ["--warm", warm_path]),
                        ("warm, budget 0", ["--warm", warm_path, "--global-max-tokens", "0"]),
                        ("empty, budget 0", ["--global-max-tokens", "0"])):
        out = str(tmp_path / "fleet.json")
        assert bf.main([timed, "--gate", os.path.join(demo_dir, "gate"), "--concurrency", "0", "--no-sequential",
                        "--batch", "2", *extra, "--json", out]) == 0
        with open(out) as f:
            cycles[name] = json.load(f)["fixed_batch"]["batch 2 (S 4)"]["cycles_per_1k"]
    assert "drafter bounds (the gate's): max_occurrences 1,024, max_scan 4,096, global_max_tokens 2,000,000" in (
        capsys.readouterr().out)
    assert cycles["warm"] != cycles["empty"]  # the earlier responses drafted
    # evicted as they were cached (the timed turns' own responses too): nothing left to draft from
    assert cycles["warm, budget 0"] == cycles["empty, budget 0"]


def test_bad_bounds_and_a_repeat_without_a_warm_cache_are_refused(demo_dir, capsys):
    bf = bench_script("bench_fleet")
    args = [os.path.join(demo_dir, "traces.jsonl"), "--gate", os.path.join(demo_dir, "gate")]
    for bad, message in ((["--max-occurrences", "0"], "--max-occurrences: expected an integer in [1, "),
                         (["--max-scan", "nan"], "--max-scan: expected an integer in [1, "),
                         (["--global-max-tokens", "-1"], "--global-max-tokens: expected an integer in [0, "),
                         (["--warm-repeat", "101"], "--warm-repeat: expected an integer in [1, 100]"),
                         (["--warm-repeat", "2"], "--warm-repeat needs --warm")):
        with pytest.raises(SystemExit):
            bf.main([*args, *bad])
        assert message in capsys.readouterr().err


def test_a_warm_cache_of_only_timed_conversations_is_refused(demo_dir, capsys):
    bf = bench_script("bench_fleet")
    traces = os.path.join(demo_dir, "traces.jsonl")
    with pytest.raises(SystemExit):
        bf.main([traces, "--gate", os.path.join(demo_dir, "gate"), "--warm", traces])
    assert "--warm: no responses outside the conversations of TRACES" in capsys.readouterr().err


def test_a_warm_cache_of_another_tokenizer_or_no_file_is_refused(demo_dir, tmp_path, capsys):
    bf = bench_script("bench_fleet")
    traces, gate = os.path.join(demo_dir, "traces.jsonl"), os.path.join(demo_dir, "gate")
    other = str(tmp_path / "other.jsonl")
    _write(other, [_record(0, "elsewhere", [1, 2, 3])])  # the toy tokenizer, not the demo's
    with pytest.raises(SystemExit):
        bf.main([traces, "--gate", gate, "--warm", other])
    assert "--warm: its token ids are toy's" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bf.main([traces, "--gate", gate, "--warm", str(tmp_path / "missing.jsonl")])
    err = capsys.readouterr().err
    assert "--warm: " in err and "missing.jsonl" in err


def test_traces_that_cannot_be_read_are_refused_in_one_line(demo_dir, tmp_path, capsys):
    bf = bench_script("bench_fleet")
    with pytest.raises(SystemExit):
        bf.main([str(tmp_path / "missing.jsonl"), "--gate", os.path.join(demo_dir, "gate")])
    assert "missing.jsonl: no such file" in capsys.readouterr().err


def test_draft_threads_run_on_the_wall_clock_with_the_same_cycles(demo_dir, tmp_path, capsys):
    bf = bench_script("bench_fleet")
    traces, gate = os.path.join(demo_dir, "traces.jsonl"), os.path.join(demo_dir, "gate")
    args = [traces, "--gate", gate, "--concurrency", "0", "--no-sequential", "--batch", "32", "--limit", "120"]
    for bad, message in ((["--draft-threads", "2"], "--draft-threads above 1 needs --clock wall"),
                         (["--draft-threads", "0", "--clock", "wall"], "--draft-threads: must be in [1, 64], got 0")):
        with pytest.raises(SystemExit):
            bf.main([*args, *bad])
        assert message in capsys.readouterr().err
    cycles = []
    for threads in ("1", "4"):
        out = str(tmp_path / f"t{threads}.json")
        assert bf.main([*args, "--draft-threads", threads, "--clock", "wall", "--json", out]) == 0
        with open(out) as f:
            got = json.load(f)
        assert got["draft_threads"] == int(threads)
        cycles.append(got["fixed_batch"]["batch 32 (S 4)"]["cycles_per_1k"])
    assert "drafts on 4 threads" in capsys.readouterr().out
    assert cycles[0] == cycles[1] > 0  # the same plans on four threads


def test_a_fixed_batch_splits_its_plan_into_appends_drafts_and_decision(demo_dir, tmp_path, capsys):
    bf = bench_script("bench_fleet")
    out = str(tmp_path / "parts.json")
    assert bf.main([os.path.join(demo_dir, "traces.jsonl"), "--gate", os.path.join(demo_dir, "gate"),
                    "--concurrency", "0", "--no-sequential", "--batch", "8", "--limit", "60", "--json", out]) == 0
    header = [line for line in capsys.readouterr().out.splitlines() if line.startswith("batch ")][0].split()
    assert header[-3:] == ["appends", "drafts", "decision"]
    with open(out) as f:
        us = json.load(f)["fixed_batch"]["batch 8 (S 4)"]
    assert us["steps"] > 0 and us["appends"] > 0 and us["drafts"] > 0 and us["decision"] > 0
    assert us["appends"] + us["drafts"] + us["decision"] == pytest.approx(us["plan"], rel=0.02)
    assert us["host"] == pytest.approx(sum(us[p] for p in ("start", "sync", "plan", "verified", "finish")))
