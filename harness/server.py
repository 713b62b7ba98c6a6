"""Start and stop a real SGLang 0.5.23 server on the CPU, for tests and benchmarks.

``start_server(model_dir, extra_args=[...], env={...})`` runs
``python -m sglang.launch_server`` (with the SGLang virtualenv's Python) on
127.0.0.1 and a free port, with the CPU engine switched on and the shims of
``stubs/`` (next to this file) installed in every process (``site/sitecustomize.py`` on
``PYTHONPATH`` plus ``HVD_TEST_SGLANG_CPU=1``). It waits for ``/health`` and returns
an ``SGLangServer``; ``stop()`` kills the server's process group.

Only the standard library is used here, so this module imports anywhere.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SITE_DIR = os.path.join(HERE, "site")
STUBS_DIR = os.path.join(HERE, "stubs")
SGLANG_PYTHON = os.environ.get("HVD_SGLANG_PYTHON", sys.executable)  # the venv running the tests

# Always on: the CPU engine with torch_native attention, no CUDA graphs, float32,
# a small KV pool (without --max-total-tokens the pool reserves ~14 GB of RAM). The pool is
# capped by --max-total-tokens; --mem-fraction-static only has to pass SGLang's start-up
# check that the weights leave room for it, which compares free RAM before and after
# loading: at 0.05 another process allocating during the load (a second server) failed it.
BASE_ARGS = [
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--dtype", "float32",
    "--max-total-tokens", "4096",
    "--max-running-requests", "16",
    "--mem-fraction-static", "0.2",
    "--disable-overlap-schedule",
    "--skip-server-warmup",
    # an idle scheduler otherwise polls its sockets on a full core: on 2 cores, a server
    # waiting for the test's next request halves everything else (CLIs, other servers)
    "--sleep-on-idle",
    "--random-seed", "0",
    "--log-level", "info",
]
BASE_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "HVD_TEST_SGLANG_CPU": "1",
    # one torch.compile'd speculative helper would spend ~20 s in Inductor
    "TORCHDYNAMO_DISABLE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # tiny models on a shared 2-core machine: one OpenMP thread per server is ~10x
    # faster than two fighting over oversubscribed cores
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    # SIGTERM kills the scheduler first; SGLang then sleeps 5 s before py-spy/CUDA
    # diagnostics of a "crash" (every stop() would pay it)
    "SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0",
    "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0",
    "TRANSFORMERS_OFFLINE": "1",
}


def eagle3_args(draft_dir: str, *, topk: int = 1, steps: int = 3, draft_tokens: int | None = None) -> list[str]:
    """Server arguments for EAGLE3 with ``draft_dir`` (``draft_tokens`` defaults to
    ``steps + 1``, what topk 1 requires)."""
    return [
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", draft_dir,
        "--speculative-eagle-topk", str(topk),
        "--speculative-num-steps", str(steps),
        "--speculative-num-draft-tokens", str(draft_tokens if draft_tokens is not None else steps + 1),
    ]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerStartError(RuntimeError):
    def __init__(self, message: str, port_taken: bool = False):
        super().__init__(message)
        self.port_taken = port_taken  # it exited because its port was taken (the log says so)


PORT_TAKEN = "address already in use"  # uvicorn's line when the server's port is bound already
PORT_RETRIES = 2  # new ports tried when another process took the one free_port() found before the server bound it


def _tail(path: str, lines: int = 60) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


@dataclasses.dataclass
class SGLangServer:
    url: str
    pid: int
    log_path: str
    args: list[str]
    process: subprocess.Popen | None = dataclasses.field(default=None, repr=False)
    start_seconds: float = 0.0

    # ----------------------------------------------------------------- requests

    def request(self, path: str, payload: dict | None = None, timeout: float = 300.0):
        """GET (no payload) or POST JSON to ``path``; returns the decoded JSON."""
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{path} -> HTTP {exc.code}: {exc.read()[:2000]!r}\n"
                               f"--- server log tail ---\n{self.log_tail()}") from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise RuntimeError(f"{path} failed: {exc}\n--- server log tail ---\n{self.log_tail()}") from exc
        try:
            return json.loads(body)
        except ValueError:
            return body.decode(errors="replace")

    def generate(self, *, input_ids: list[int] | None = None, text: str | None = None, max_new_tokens: int = 48,
                 sampling_params: dict | None = None, timeout: float = 300.0, **extra) -> dict:
        """SGLang's native ``/generate``, greedy by default (temperature 0, EOS ignored,
        so every request yields exactly ``max_new_tokens``)."""
        params = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
        params.update(sampling_params or {})
        payload = {"sampling_params": params, **extra}
        if input_ids is not None:
            payload["input_ids"] = list(input_ids)
        if text is not None:
            payload["text"] = text
        return self.request("/generate", payload, timeout=timeout)

    def generate_many(self, requests: list[dict], max_workers: int | None = None) -> list[dict]:
        """Send ``generate(**r)`` for every ``r`` at once (so the server batches them)."""
        with concurrent.futures.ThreadPoolExecutor(max_workers=max_workers or len(requests) or 1) as pool:
            return list(pool.map(lambda r: self.generate(**r), requests))

    def server_info(self) -> dict:
        return self.request("/get_server_info")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                return resp.status == 200
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError):
            return False

    # ---------------------------------------------------------------- lifecycle

    def log_tail(self, lines: int = 60) -> str:
        return _tail(self.log_path, lines)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the server's process group, then SIGKILL whatever is left of it."""
        if self.process is None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                break
            if self._wait_group_gone(wait):
                break
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.process = None

    def _wait_group_gone(self, timeout: float) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.process.poll()  # reap the leader, or it lingers as a zombie in the group
            try:
                os.killpg(self.pid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.2)
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def server_env(extra_env: dict | None = None) -> dict:
    # HVD switches reach a server only when a test passes them: a developer's shell (or an
    # earlier test) must not turn a plain EAGLE3 server into an HVD one.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_HVD_")}
    env.update(BASE_ENV)
    paths = [SITE_DIR] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra_env or {})
    return env


def _spawn(args: list[str], log_path: str, port: int, env: dict | None = None) -> SGLangServer:
    """Run ``args`` in a new session (its process group is what ``stop()`` kills), output
    to ``log_path`` after the command line, working directory the log's folder."""
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(args) + "\n")
        log.flush()
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                cwd=os.path.dirname(log_path))
    return SGLangServer(url=f"http://127.0.0.1:{port}", pid=proc.pid, log_path=log_path, args=args, process=proc)


def start_server(model_dir: str, extra_args: list[str] | None = None, env: dict | None = None, *,
                 startup_timeout: float = 240.0, log_dir: str | None = None, port: int | None = None,
                 base_args: list[str] | None = None, python: str = SGLANG_PYTHON,
                 launcher: str = "sglang.launch_server") -> SGLangServer:
    """Launch ``sglang.launch_server`` for ``model_dir`` and wait until ``/health`` is OK.

    ``launcher`` is the module run with ``-m`` (``sglang_hvd.launch_server`` for HVD).
    ``extra_args`` come after ``BASE_ARGS`` (argparse: a repeated flag wins last);
    ``env`` is added to the environment (after ``BASE_ENV``). On failure to become
    healthy within ``startup_timeout`` the server is killed and ``ServerStartError``
    carries the command and the log tail. The server's working directory is ``log_dir``:
    paths in ``extra_args`` must be absolute (``model_dir`` and ``log_dir`` are made so).
    A server on a port of ``free_port()``'s that exits because another process bound that
    port first (servers starting side by side pick their internal ports too) is started
    again on a new one, up to PORT_RETRIES times.
    """
    for attempt in range(PORT_RETRIES + 1):
        try:
            return _start_server(model_dir, extra_args, env, startup_timeout=startup_timeout, log_dir=log_dir,
                                 port=port or free_port(), base_args=base_args, python=python, launcher=launcher)
        except ServerStartError as e:
            if port is not None or not e.port_taken or attempt == PORT_RETRIES:
                raise


def _start_server(model_dir: str, extra_args: list[str] | None, env: dict | None, *, startup_timeout: float,
                  log_dir: str | None, port: int, base_args: list[str] | None, python: str,
                  launcher: str) -> SGLangServer:
    """One try of ``start_server`` on ``port``."""
    # The server runs in the log folder: a relative model folder would point elsewhere there.
    model_dir = os.path.abspath(model_dir) if os.path.exists(model_dir) else model_dir
    args = [python, "-m", launcher, "--model-path", model_dir, "--host", "127.0.0.1", "--port", str(port),
            *(BASE_ARGS if base_args is None else base_args), *(extra_args or [])]
    log_dir = os.path.abspath(log_dir or tempfile.mkdtemp(prefix="sglang_cpu_"))
    started = time.time()
    server = _spawn(args, os.path.join(log_dir, f"server_{port}.log"), port, env=server_env(env))
    proc, log_path = server.process, server.log_path
    try:
        while True:
            if proc.poll() is not None:
                tail = server.log_tail(80)
                raise ServerStartError(f"SGLang server exited with code {proc.returncode} during start-up\n"
                                       f"command: {' '.join(args)}\n"
                                       f"--- log tail ({log_path}) ---\n{tail}", port_taken=PORT_TAKEN in tail)
            if server.healthy():
                break
            if time.time() - started > startup_timeout:
                raise ServerStartError(f"SGLang server not healthy after {startup_timeout:.0f} s\n"
                                       f"command: {' '.join(args)}\n"
                                       f"--- log tail ({log_path}) ---\n{server.log_tail(80)}")
            time.sleep(1.0)
    except BaseException:
        server.stop()
        raise
    server.start_seconds = time.time() - started
    return server


def start_router(worker_urls: list[str], policy: str = "cache_aware", *, log_dir: str | None = None,
                 startup_timeout: float = 60.0, python: str = SGLANG_PYTHON,
                 extra_args: list[str] | None = None) -> SGLangServer:
    """``sglang-router`` (the ``router`` extra) in front of running servers, on 127.0.0.1
    and a free port; waits until every worker is registered and healthy in its
    ``/workers`` (its ``/health`` answers before it has any). Returned as an
    SGLangServer (``generate`` goes through the router; ``stop()`` ends it)."""
    port = free_port()
    args = [python, "-m", "sglang_router.launch_router", "--worker-urls", *worker_urls, "--policy", policy,
            "--host", "127.0.0.1", "--port", str(port), *(extra_args or [])]
    log_dir = log_dir or tempfile.mkdtemp(prefix="sglang_router_")
    started = time.time()
    router = _spawn(args, os.path.join(log_dir, f"router_{port}.log"), port)
    proc, log_path = router.process, router.log_path

    def ready() -> bool:
        try:
            with urllib.request.urlopen(router.url + "/workers", timeout=5) as resp:
                workers = json.loads(resp.read()).get("workers", [])
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError, ValueError):
            return False
        return len(workers) == len(worker_urls) and all(w.get("is_healthy") for w in workers)

    try:
        while not ready():
            if proc.poll() is not None or time.time() - started > startup_timeout:
                raise ServerStartError(f"sglang-router did not become healthy (exit code {proc.returncode})\n"
                                       f"command: {' '.join(args)}\n"
                                       f"--- log tail ({log_path}) ---\n{router.log_tail(40)}")
            time.sleep(0.5)
    except BaseException:
        router.stop()
        raise
    router.start_seconds = time.time() - started
    return router


def _json(url: str, method: str = "GET", body: dict | None = None, timeout: float = 10.0):
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not condition():
        if time.time() > deadline:
            raise TimeoutError(f"{what}: not done after {timeout:.0f} s")
        time.sleep(0.5)


def router_workers(router: SGLangServer) -> list[dict]:
    return _json(router.url + "/workers")["workers"]


def roll_replica(router: SGLangServer, old: SGLangServer, restart, timeout: float = 240.0) -> SGLangServer:
    """Replace one replica behind sglang-router without failing a request: take it out
    of the router (``DELETE /workers/ID``), wait until it has no request left
    (``/v1/loads``), stop it, ``restart()`` (returns the new server), add that to the
    router (``POST /workers``) and wait until the router reports it healthy. The
    procedure the README gives for rolling a new gate."""
    (worker,) = [w for w in router_workers(router) if w["url"] == old.url]
    _json(f"{router.url}/workers/{worker['id']}", method="DELETE")
    _wait(lambda: all(w["url"] != old.url for w in router_workers(router)), timeout, "router removes the worker")

    def drained() -> bool:
        loads = _json(old.url + "/v1/loads?include=core")["loads"]
        return all(load.get("num_running_reqs", 0) + load.get("num_waiting_reqs", 0) == 0 for load in loads)

    _wait(drained, timeout, f"{old.url} drains")
    old.stop()
    new = restart()
    _json(router.url + "/workers", method="POST", body={"url": new.url})
    _wait(lambda: any(w["url"] == new.url and w.get("is_healthy") for w in router_workers(router)), timeout,
          "router adds the restarted worker")
    return new


def sglang_available(python: str = SGLANG_PYTHON) -> str | None:
    """None when ``python`` can import sglang, else the reason it cannot."""
    if not os.path.exists(python):
        return f"{python} does not exist (set HVD_SGLANG_PYTHON)"
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        import importlib.util

        return None if importlib.util.find_spec("sglang") else "sglang is not installed"
    probe = "import importlib.util,sys; sys.exit(importlib.util.find_spec('sglang') is None)"
    rc = subprocess.run([python, "-c", probe], capture_output=True).returncode
    return None if rc == 0 else f"sglang is not importable by {python}"
