"""launch/bench/bench_steady.py: the cache drafter served at a full cache (evictions, compactions)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import bench_script
from sglang_hvd.trace import TokenizerId, TraceRecord, token_array

pytest.importorskip("sglang_hvd.drafter._native", reason="bench_steady serves the native drafter (not built)")


def _records(n: int) -> list[TraceRecord]:
    rng = np.random.default_rng(0)
    tok = TokenizerId("toy", "0")
    return [TraceRecord(req_id=f"r{i}", conv_id=f"r{i}", turn=0, source="toy", tokenizer=tok,
                        prompt_ids=token_array(rng.integers(0, 50, 30).tolist()),
                        output_ids=token_array(rng.integers(0, 50, 90).tolist())) for i in range(n)]


def test_a_small_cache_served_past_its_budget_evicts_and_compacts_and_times_every_step():
    bs = bench_script("bench_steady")
    # 40 responses of 90 tokens, 8 at a time, 3 tokens a step: 5 waves of 30 steps; a 1,000-token cache
    times, mem = bs.serve(_records(40), repeat=2, in_flight=8, global_max_tokens=1000)
    assert len(times) == 2 * 5 * 30 and np.all(times > 0)
    assert mem["global_tokens"] <= 1000
    assert mem["evicted_responses"] == 80 - 11  # all but the newest 11 responses of 90 tokens (990 <= 1,000)
    assert mem["compactions"] >= 1


def test_flags_out_of_range_are_refused_before_any_work(capsys):
    bs = bench_script("bench_steady")
    with pytest.raises(SystemExit):
        bs.main(["missing.jsonl.gz", "--in-flight", "0"])
    assert "--in-flight: expected a positive integer, got 0" in capsys.readouterr().err
