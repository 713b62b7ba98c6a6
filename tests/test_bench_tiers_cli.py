"""launch/bench/bench_tiers.py's requests and its --vocab flag, checked without sglang
(every check here comes before the first server)."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO, bench_script

SCRIPT = os.path.join(REPO, "launch", "bench", "bench_tiers.py")


def _script():
    return bench_script("bench_tiers")


def test_requests_stay_below_the_vocabulary_and_the_default_ones_are_unchanged():
    bt = _script()
    # the requests of every earlier run (Qwen3's vocabulary): seed 0's first ids
    assert [r["input_ids"][:3] for r in bt.make_requests(0, 2, 32)] == [[110350, 10712, 67973],
                                                                          [65768, 139708, 38625]]
    small = bt.make_requests(0, 64, 32, vocab=8192)
    assert max(max(r["input_ids"]) for r in small) < 8192
    assert min(min(r["input_ids"]) for r in small) >= 100
    assert all(r["max_new_tokens"] == 32 for r in small)


def test_vocab_out_of_range_is_refused_before_any_work(tmp_path):
    for bad in ("1024", "nan", "200000"):
        done = subprocess.run([sys.executable, SCRIPT, "--vocab", bad, "--work-dir", str(tmp_path / "w")],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (bad, done.stderr)
        assert "--vocab" in done.stderr
        assert not (tmp_path / "w").exists()
