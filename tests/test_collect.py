"""hvd collect against a stand-in server: retries, a server dying mid-run, resume."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sglang_hvd.cli.main import main as hvd
from sglang_hvd.trace import iter_traces


class FakeSGLang:
    """/generate answers output_ids = last 3 prompt ids + [7]; `fail` decides failures."""

    def __init__(self):
        self.calls = 0
        self.sampling: list[dict] = []  # sampling_params of every request answered
        self.fail = lambda n: None  # call number -> HTTP status to fail with, or None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    outer.calls += 1
                    status = outer.fail(outer.calls)
                if status:
                    self.send_response(status)
                    self.end_headers()
                    self.wfile.write(b'{"error": "nope"}')
                    return
                with lock:
                    outer.sampling.append(body["sampling_params"])
                out = {"text": "x", "output_ids": body["input_ids"][-3:] + [7], "meta_info": {}}
                data = json.dumps(out).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def server():
    s = FakeSGLang()
    yield s
    s.close()


def args(synth_dir, out, url, *extra):
    return ["collect", os.path.join(synth_dir, "conversations.jsonl"), "--server", url, "--tokenizer",
            os.path.join(synth_dir, "tokenizer"), "-o", str(out), "--concurrency", "3", "--limit", "2", *extra]


def test_collects_every_turn_and_retries_transient_errors(synth_dir, tmp_path, server):
    server.fail = lambda n: 503 if n in (2, 3) else None  # two transient failures
    out = tmp_path / "c.jsonl"
    assert hvd(args(synth_dir, out, server.url, "--retries", "3")) == 0
    records = list(iter_traces(str(out)))
    turns = sum(1 for r in records)
    assert turns > 4 and server.calls == turns + 2
    for r in records:
        assert r.output_ids.tolist() == r.prompt_ids.tolist()[-3:] + [7]
    assert len({r.req_id for r in records}) == turns and not os.path.exists(str(out) + ".partial")
    assert {(p["temperature"], p["top_p"]) for p in server.sampling} == {(0.0, 1.0)}  # greedy by default


def test_collects_at_the_serving_temperature_and_refuses_impossible_ones(synth_dir, tmp_path, server, capsys):
    assert hvd(args(synth_dir, tmp_path / "s.jsonl", server.url, "--temperature", "0.7", "--top-p", "0.9")) == 0
    assert server.sampling and {(p["temperature"], p["top_p"]) for p in server.sampling} == {(0.7, 0.9)}
    capsys.readouterr()
    for flag, value, says in (("--temperature", "-1", "expected a temperature in [0, 100], got -1"),
                              ("--top-p", "0", "expected a top-p in (0, 1], got 0"),
                              ("--top-p", "1.5", "expected a top-p in (0, 1], got 1.5"),
                              ("--top-p", "x", "expected a top-p in (0, 1], got 'x'")):
        calls = server.calls
        with pytest.raises(SystemExit) as exit_:
            hvd(args(synth_dir, tmp_path / "bad.jsonl", server.url, flag, value))
        assert exit_.value.code == 2 and says in capsys.readouterr().err and server.calls == calls


def test_a_server_dying_mid_run_keeps_progress_and_the_rerun_resumes(synth_dir, tmp_path, server, capsys):
    out = tmp_path / "c.jsonl"
    server.fail = lambda n: 503 if n > 5 else None  # the server dies after 5 answers
    assert hvd(args(synth_dir, out, server.url, "--retries", "1")) == 2
    err = capsys.readouterr().err
    assert "still failing after 1 retries (HTTP 503)" in err and "rerun the same command to resume" in err
    kept = [json.loads(line)["req_id"] for line in open(str(out) + ".partial")]
    assert len(kept) == 5 and not out.exists()
    server.fail = lambda n: None
    before = server.calls
    assert hvd(args(synth_dir, out, server.url)) == 0
    records = [r.req_id for r in iter_traces(str(out))]
    assert len(records) == len(set(records)) and set(kept) <= set(records)
    assert server.calls - before == len(records) - 5  # nothing collected twice


def test_refused_requests_are_reported_and_the_output_exists_check(synth_dir, tmp_path, server, capsys):
    out = tmp_path / "c.jsonl"
    server.fail = lambda n: 400 if n == 1 else None
    assert hvd(args(synth_dir, out, server.url)) == 1
    text = capsys.readouterr().out
    assert "the server refused the request (HTTP 400)" in text and "Rerun to retry them" in text
    assert os.path.exists(str(out) + ".partial") and not out.exists()
    assert hvd(args(synth_dir, out, server.url)) == 0  # the rerun retries the refused one only
    out2 = tmp_path / "exists.jsonl"
    out2.write_text("")
    assert hvd(args(synth_dir, out2, server.url)) == 2
    assert "exists; choose another path" in capsys.readouterr().err
