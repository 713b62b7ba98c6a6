"""Cache drafter benchmark: latency, memory, draft quality and replay throughput.

Prints, for each depth (default 24 and 64), on the given token traces:
  speculate latency (median, p99, us), append latency per token (median, p99, us), the
  median time to draft a batch of 32 running requests,
  prompt indexing time (start_request) for the longest prompts, bytes per cached token,
  dense draft quality (mean accept_len of non-empty drafts), cache_only cycles per 1k,
  dense replay throughput (a draft at every position, timed calls included) and serving-mode
  replay throughput (output tokens/s, all baseline policies walked together).
With --arctic, the same walk runs through arctic-inference's SuffixDecodingCache (via
launch/bench/arctic_adapter.py) in the same process, side by side.

    hvd import ../shared/data/conversations/*.jsonl --tokenizer QWEN_DIR -o dev.jsonl.gz
    python launch/bench/bench_drafter.py dev.jsonl.gz [--arctic] [--limit N]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

import numpy as np

from sglang_hvd.drafter import DrafterConfig, available_drafters, create_drafter
from sglang_hvd.replay.engine import accept_len
from sglang_hvd.replay.policies import BASELINES, PolicyOptions, make_policies
from sglang_hvd.replay.simulate import simulate
from sglang_hvd.report import format_table
from sglang_hvd.trace import iter_traces
from sglang_hvd.verify import Eagle3Curve, VerifyModel, VerifyShape


def dense_walk(records, drafter):
    """Draft at every position; time every call. Returns a dict of measurements."""
    spec_ns, append_ns, start = [], [], []
    accepted, drafts = 0, 0
    began = time.perf_counter()
    for r in records:
        t = time.perf_counter_ns()
        drafter.start_request(r.req_id, r.prompt_ids)
        start.append((len(r.prompt_ids), time.perf_counter_ns() - t))
        out = r.output_ids
        for pos in range(len(out)):
            t = time.perf_counter_ns()
            d = drafter.speculate(r.req_id)
            spec_ns.append(time.perf_counter_ns() - t)
            if d.tokens:
                drafts += 1
                accepted += accept_len(d.tokens, out[pos:])
            t = time.perf_counter_ns()
            drafter.append(r.req_id, out[pos : pos + 1])
            append_ns.append(time.perf_counter_ns() - t)
        drafter.finish_request(r.req_id)
    seconds = time.perf_counter() - began
    spec, app = np.array(spec_ns) / 1e3, np.array(append_ns) / 1e3
    start.sort()
    longest = start[-max(1, len(start) // 20) :]  # the 5% longest prompts
    return {
        "speculate_med_us": float(np.median(spec)), "speculate_p99_us": float(np.percentile(spec, 99)),
        "append_med_us": float(np.median(app)), "append_p99_us": float(np.percentile(app, 99)),
        "index_us_per_1k_prompt_tokens": float(np.mean([ns / 1e3 / max(n, 1) * 1000 for n, ns in longest])),
        "longest_prompt_tokens": longest[-1][0], "longest_prompt_index_ms": longest[-1][1] / 1e6,
        "mean_accept_len": accepted / max(drafts, 1), "positions": len(spec_ns),
        "dense_positions_per_s": len(spec_ns) / seconds,
        "memory": drafter.memory_stats(),
    }


def batch_of(records, make, cfg, size=32, rounds=200):
    """Median time to draft a batch of `size` running requests (speculate_batch)."""
    drafter = make(cfg)
    live = []
    for r in records[:size]:
        drafter.start_request(r.req_id, r.prompt_ids)
        live.append(r)
    times = []
    fn = getattr(drafter, "speculate_arrays", drafter.speculate_batch)
    ids = [r.req_id for r in live]
    for k in range(rounds):
        t = time.perf_counter_ns()
        fn(ids)
        times.append(time.perf_counter_ns() - t)
        for r in live:  # advance every request by one real token
            if k < len(r.output_ids):
                drafter.append(r.req_id, r.output_ids[k : k + 1])
    return float(np.median(times)) / 1e3


def serving(records, drafter):
    policies = make_policies(list(BASELINES), PolicyOptions(rule_thresholds=(1.0, 3.0)))
    # A row wide enough for any draft of depth 64 (cache_only uncapped), EAGLE3 flat at 1.75.
    result = simulate(records, drafter, policies, VerifyModel(VerifyShape(8, 3, 65), Eagle3Curve.constant(1.75)))
    total = result.overall
    return {"tokens_per_s": total.tokens / result.seconds,
            "cache_only_cycles_per_1k": total.policies["cache_only"].to_json()["cycles_per_1k"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--depths", default="24,64", help="comma-separated tree depths (default: %(default)s)")
    p.add_argument("--limit", type=int, help="first N requests only")
    p.add_argument("--max-spec-factor", type=float, default=1.0,
                   help="draft budget per matched token; 1 is SuffixDecoding's and ArcticInference's, so the drafters "
                        "compare like for like (default: %(default)s; hvd's default is 2)")
    p.add_argument("--drafters", default=",".join(available_drafters()),
                   help="registered drafters to measure (default: %(default)s)")
    p.add_argument("--arctic", action="store_true", help="also measure arctic-inference's SuffixDecodingCache")
    args = p.parse_args(argv)
    records = list(itertools.islice(iter_traces(args.traces), args.limit))
    print(f"{len(records):,} requests, {sum(len(r.prompt_ids) for r in records):,} prompt tokens, "
          f"{sum(len(r.output_ids) for r in records):,} output tokens")
    makers = {name: (lambda cfg, n=name: create_drafter(n, cfg)) for name in args.drafters.split(",")}
    if args.arctic:
        from arctic_adapter import ArcticDrafter  # this folder (a script's own folder is its first import path)

        makers["arctic-inference"] = ArcticDrafter
    rows = []
    for depth in [int(d) for d in args.depths.split(",")]:
        cfg = DrafterConfig(max_depth=depth, max_spec_factor=args.max_spec_factor)
        for name, make in makers.items():
            d = dense_walk(records, make(cfg))
            s = serving(records, make(cfg))
            batch_us = batch_of(records, make, cfg)
            mem = d["memory"]
            rows.append((f"{name} depth {depth}", d["speculate_med_us"], d["speculate_p99_us"],
                         d["append_med_us"], d["append_p99_us"], batch_us, d["longest_prompt_index_ms"],
                         mem.get("bytes_per_token", float("nan")), d["mean_accept_len"],
                         s["cache_only_cycles_per_1k"], d["dense_positions_per_s"], s["tokens_per_s"]))
            print(f"done: {name} depth {depth}", file=sys.stderr)
    header = ("drafter", "spec med us", "spec p99 us", "append med us", "append p99 us", "batch of 32 us",
              "index longest prompt ms", "bytes/cached tok", "mean accept", "cache_only cyc/1k", "dense replay pos/s",
              "serving replay tok/s")
    print(format_table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
