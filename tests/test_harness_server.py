"""The CPU harness's server start (harness/server.py), with a stand-in server: no sglang needed.

A server whose port another process bound between ``free_port()`` and its own bind (two
servers starting side by side: each picks internal ports too) exits with uvicorn's "address
already in use"; the harness starts it again on a new port. Any other exit is reported at once.
"""

from __future__ import annotations

import os
import sys

import pytest

from sglang_hvd.harness.server import ServerStartError, free_port, start_server

# A stand-in for ``python -m sglang.launch_server``: answers /health on --port; while
# STAND_IN_TAKEN (a file) holds a positive count, it takes one and exits as uvicorn does on a
# taken port; STAND_IN_FAIL: exits with another error.
STAND_IN = '''
import http.server, os, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
if os.environ.get("STAND_IN_FAIL"):
    print("RuntimeError: no such model", flush=True)
    sys.exit(1)
taken = os.environ["STAND_IN_TAKEN"]
left = int(open(taken).read())
if left > 0:
    open(taken, "w").write(str(left - 1))
    print(f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): "
          "address already in use", flush=True)
    sys.exit(3)

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
'''


def _start(tmp_path, taken: int, **kwargs):
    (tmp_path / "stand_in_server.py").write_text(STAND_IN)
    (tmp_path / "taken").write_text(str(taken))
    env = {"PYTHONPATH": str(tmp_path), "HVD_TEST_SGLANG_CPU": "0", "STAND_IN_TAKEN": str(tmp_path / "taken"),
           **kwargs.pop("env", {})}
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    return start_server("model", env=env, base_args=[], python=sys.executable, launcher="stand_in_server",
                        log_dir=str(logs), startup_timeout=60, **kwargs), logs


def test_a_server_whose_port_was_taken_starts_again_on_a_new_port(tmp_path):
    server, logs = _start(tmp_path, taken=2)
    try:
        assert server.healthy()
        assert (tmp_path / "taken").read_text() == "0"  # two tries found their port taken, the third started
        assert len(os.listdir(logs)) == 3  # a log per try (server_PORT.log)
    finally:
        server.stop()


def test_a_port_taken_three_times_or_a_port_given_is_reported(tmp_path):
    with pytest.raises(ServerStartError, match="address already in use") as info:
        _start(tmp_path, taken=3)
    assert info.value.port_taken and (tmp_path / "taken").read_text() == "0"
    # a port the caller chose is theirs to change: one try
    with pytest.raises(ServerStartError, match="exited with code 3"):
        _start(tmp_path, taken=1, port=free_port())
    assert (tmp_path / "taken").read_text() == "0"


def test_any_other_start_up_failure_is_reported_after_one_try(tmp_path):
    with pytest.raises(ServerStartError, match="no such model") as info:
        _start(tmp_path, taken=0, env={"STAND_IN_FAIL": "1"})
    assert not info.value.port_taken
    assert len(os.listdir(tmp_path / "logs")) == 1
