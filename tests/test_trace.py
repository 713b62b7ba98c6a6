"""The token trace format: round trip, validation with FILE:LINE, skipping, gzip."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from sglang_hvd.errors import FileFormatError
from sglang_hvd.trace import ReadReport, TokenizerId, TraceRecord, TraceStep, TraceWriter, iter_traces, token_array

TOK = TokenizerId(name="toy", digest="0123abcd")


def record(req_id="c#0", steps=()):
    return TraceRecord(
        req_id=req_id, conv_id="c", turn=0, source="toy", tokenizer=TOK,
        prompt_ids=token_array([1, 2, 3]), output_ids=token_array([4, 5, 6, 7]), steps=steps,
    )


def line(**override):
    obj = record().to_json()
    obj.update(override)
    return json.dumps(obj)


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_round_trip_keeps_every_field(tmp_path, name):
    path = str(tmp_path / name)
    steps = (TraceStep(pos=0, src="cache", draft=(4, 5, 9), accept_len=2),
             TraceStep(pos=3, src="eagle3", draft=(), accept_len=0))
    with TraceWriter(path) as w:
        w.write(record("c#0", steps))
        w.write(record("c#1"))
    if name.endswith(".gz"):
        with gzip.open(path, "rt") as f:
            assert f.readline().startswith('{"v":1,"req_id":"c#0"')
    back = list(iter_traces(path))
    assert [r.req_id for r in back] == ["c#0", "c#1"]
    assert back[0].steps == steps
    assert back[0].tokenizer == TOK
    assert back[0].prompt_ids.tolist() == [1, 2, 3]
    assert back[0].output_ids.dtype == np.int32
    assert not back[0].output_ids.flags.writeable


@pytest.mark.parametrize(
    "bad, message",
    [
        ("{not json", "invalid JSON"),
        (line(v=2), "trace format version 2 is newer than this sglang-hvd reads (1); upgrade sglang-hvd"),
        (line(v=None), "'v' must be the trace format version 1"),
        (line(output_ids=[]), "'output_ids' is empty"),
        (line(prompt_ids=[1, -2]), "'prompt_ids'[1] = -2 is not a token id (ids lie in [0, 2^31))"),
        (line(output_ids=[5, 10**30]), "'output_ids'[1] = 1000000000000000000000000000000 is not a token id"),
        (line(output_ids=[5, 2**31]), "'output_ids'[1] = 2147483648 is not a token id"),
        (line(prompt_ids=[1, 2.5]), "'prompt_ids' must hold non-negative integers only"),
        (line(req_id=""), "'req_id' must be a non-empty string"),
        (line(tokenizer="qwen"), "'tokenizer' must be an object with 'name' and 'digest'"),
        (line(steps=[{"pos": 0, "src": "ngram", "draft": [4], "accept_len": 1}]),
         "steps[0]: 'src' must be one of cache, eagle3, greedy"),
        (line(steps=[{"pos": 1, "src": "cache", "draft": [9], "accept_len": 1}]),
         "steps[0]: the accepted draft prefix differs from output_ids at pos 1"),
        (line(steps=[{"pos": 9, "src": "cache", "draft": [], "accept_len": 0}]),
         "steps[0]: pos 9 is past the output (4 tokens)"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad, message):
    path = tmp_path / "t.jsonl"
    path.write_text(line() + "\n\n" + bad + "\n")
    with pytest.raises(FileFormatError) as e:
        list(iter_traces(str(path)))
    assert str(e.value).startswith(f"{path}:3: ")
    assert message in str(e.value)


def test_skip_invalid_counts_and_keeps_going(tmp_path):
    path = tmp_path / "t.jsonl"
    good2 = json.loads(line())
    good2["req_id"] = "c#9"
    path.write_text("\n".join([line(), "{oops", line(output_ids="x"), line(), json.dumps(good2)]) + "\n")
    report = ReadReport()
    got = [r.req_id for r in iter_traces(str(path), skip_invalid=True, report=report)]
    # line 4 repeats req_id c#0: a duplicate is invalid too
    assert got == ["c#0", "c#9"]
    assert report.num_skipped == 3
    assert report.first_errors[0] == (
        f"{path}:2: invalid JSON (Expecting property name enclosed in double quotes at column 2)")
    assert report.first_errors[2] == f"{path}:4: duplicate req_id 'c#0'"


def test_failed_writer_leaves_nothing(tmp_path):
    path = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError):
        with TraceWriter(str(path)) as w:
            w.write(record())
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_reading_streams_without_loading_the_file(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(line() + "\n{broken\n")
    stream = iter_traces(str(path))
    assert next(stream).req_id == "c#0"  # the first record arrives before the bad line is read
    with pytest.raises(FileFormatError):
        next(stream)
