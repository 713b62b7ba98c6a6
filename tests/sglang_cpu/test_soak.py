"""The soak benchmark (launch/bench/soak.py) in short: one minute of mixed load with a gate
that fails on 3-row batches and a recorder writing to a full disk (/dev/full)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

pytest.importorskip("sglang", reason="the SGLang CPU harness needs the sglang extra (sglang==0.5.23)")

from sglang_hvd.harness import server as harness  # noqa: E402

from . import REPO  # noqa: E402

pytestmark = [pytest.mark.sglang, pytest.mark.e2e, pytest.mark.full]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="the disk-full fault writes to /dev/full")
def test_a_minute_of_load_and_faults_loses_nothing(qwen_gates, tmp_path):
    out = tmp_path / "soak.json"
    done = subprocess.run([harness.SGLANG_PYTHON, "launch/bench/soak.py", "--minutes", "1", "--concurrency", "6",
                           "--gate", qwen_gates(1, 3, 4), "--work-dir", str(tmp_path / "work"), "--json", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert all(report["checks"].values()), report["checks"]
    sent = report["sent"]
    assert min(sent.get(k, 0) for k in ("plain", "stop", "stream", "abandon")) > 0, sent
    assert report["lost"] == 0 and report["unaccounted"] == 0 and report["mismatches"] == 0
    hvd = report["hvd"]
    assert hvd["step_errors"] == 0 and hvd["gate_errors"] > 0 and hvd["recorded_failed"] > 0
    assert hvd["cache_pick_rate"] > 0.1  # cache rows served between the gate's failures
    assert report["timeline"] and report["timeline"][-1]["rss_mb"] > 0
