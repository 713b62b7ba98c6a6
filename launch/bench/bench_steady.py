"""The cache drafter at a full cache: the stalls of a serving step's appends once evictions and compactions run.

    python launch/bench/bench_steady.py dev.jsonl.gz [--repeat 14] [--in-flight 64] [--global-max-tokens 2000000]

Serves the traces' responses through the native drafter as the serving stepper does: ``--in-flight``
requests at a time, each step appending three tokens of every running response in one
``append_batch`` and drafting the batch (``speculate_arrays``), a finished response staying in
the global cache. ``--repeat`` passes over the traces (each pass new request ids) fill the cache
past ``--global-max-tokens``, so that the oldest responses are evicted and the index compacts
now and then. Prints the appends' time per step (median, p99, max), the largest few (a
compaction, an arena or a table growing: one serving step stalled that long), and the index's
memory, compactions and evictions at the end.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from sglang_hvd.cli.common import positive_int
from sglang_hvd.drafter import DrafterConfig, create_drafter
from sglang_hvd.errors import HvdInputError
from sglang_hvd.report import progress
from sglang_hvd.trace import iter_traces

TOKENS_PER_STEP = 3


def serve(records, repeat: int, in_flight: int, global_max_tokens: int) -> tuple[np.ndarray, dict]:
    """Each step's append time in seconds, and the drafter's memory_stats at the end."""
    drafter = create_drafter("native", DrafterConfig(global_max_tokens=global_max_tokens))
    queue = [(f"{p}.{i}", r) for p in range(repeat) for i, r in enumerate(records)]
    running, pos, times = [], {}, []
    bar = progress(total=len(queue), desc="responses", unit="req")
    nxt = 0
    while nxt < len(queue) or running:
        while len(running) < in_flight and nxt < len(queue):
            rid, r = queue[nxt]
            nxt += 1
            drafter.start_request(rid, r.prompt_ids)
            running.append((rid, r))
            pos[rid] = 0
        rids = [rid for rid, _ in running]
        tokens = [r.output_ids[pos[rid] : pos[rid] + TOKENS_PER_STEP].tolist() for rid, r in running]
        t = time.perf_counter()
        drafter.append_batch(rids, tokens)
        times.append(time.perf_counter() - t)
        drafter.speculate_arrays(rids)
        still = []
        for rid, r in running:
            pos[rid] += TOKENS_PER_STEP
            if pos[rid] >= len(r.output_ids):
                drafter.finish_request(rid)
                bar.update(1)
            else:
                still.append((rid, r))
        running = still
    bar.close()
    return np.asarray(times), drafter.memory_stats()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", metavar="TRACES", help="token traces (hvd import / collect)")
    p.add_argument("--repeat", type=positive_int, default=14, metavar="N",
                   help="passes over the traces (default: %(default)s: dev.jsonl.gz's 465k response tokens x 14 "
                        "overfill the default cache about three times)")
    p.add_argument("--in-flight", type=positive_int, default=64, metavar="B",
                   help="requests at a time (default: %(default)s)")
    p.add_argument("--global-max-tokens", type=positive_int, default=DrafterConfig().global_max_tokens, metavar="T",
                   help="the global cache's token budget (default: the drafter's, %(default)s)")
    p.add_argument("--sources", metavar="S1,S2", help="only these sources (default: all)")
    a = p.parse_args(argv)
    sources = set(a.sources.split(",")) if a.sources else None
    try:
        records = [r for r in iter_traces(a.traces) if (sources is None or r.source in sources) and len(r.output_ids)]
    except HvdInputError as e:
        p.error(str(e))
    if not records:
        p.error("no response to serve (check --sources)")
    start = time.perf_counter()
    times, mem = serve(records, a.repeat, a.in_flight, a.global_max_tokens)
    us = times * 1e6
    largest = ", ".join(f"{v / 1e3:.1f}" for v in np.sort(us)[-6:][::-1])
    print(f"{len(records) * a.repeat:,} responses, {len(us):,} steps of up to {a.in_flight} rows, "
          f"{time.perf_counter() - start:.1f} s")
    print(f"appends per step: median {np.median(us):,.0f} us, p99 {np.percentile(us, 99):,.0f} us, "
          f"max {us.max() / 1e3:,.1f} ms; the largest, ms: {largest}")
    print(f"at the end: {mem['global_tokens']:,.0f} cached tokens, {mem['bytes'] / 1e6:,.1f} MB "
          f"({mem['bytes_per_token']:.1f} bytes a token), {mem['compactions']:.0f} compactions, "
          f"{mem['evicted_responses']:,.0f} responses evicted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
