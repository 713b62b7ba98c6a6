"""Cache drafter cost per step when the same responses come back again and again (the soak's
workload, without a server: launch/bench/soak.py found HVD's CPU time per step growing).

    python launch/bench/bench_repeats.py [--requests 40000] [--every 4000] [--limits 1024:4096,1000000000:1000000000]

24 prompts (random tokens, some repeating a block) are served in random order, each always
answered with its own fixed response (a greedy server's), 3 draft tokens accepted at most
per step; every finished response joins the global cache, so each response is stored
thousands of times. Prints the mean time of one speculate call (one request) every
``--every`` requests, per ``K:M`` pair (DrafterConfig.max_occurrences, max_scan). Without
bounds the work per draft grows with the copies held (the sets walked and the occurrences
of the context's last two tokens scanned); with them it levels off once a set holds K
occurrences.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import numpy as np
from bench_periodic import print_series  # this folder (a script's own folder is its first import path)

from sglang_hvd.drafter import DrafterConfig, create_drafter


def workload(seed: int = 0) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    specs = []
    for _ in range(24):
        block = [rng.randrange(100, 150000) for _ in range(rng.randrange(4, 24))]
        prompt = block * rng.randrange(1, 4) + [rng.randrange(100, 150000) for _ in range(rng.randrange(0, 8))]
        specs.append((prompt, [rng.randrange(100, 150000) for _ in range(rng.choice([8, 16, 24, 40]))]))
    return specs


def step_costs_us(drafter_name: str, k: int, m: int, requests: int, every: int) -> list[tuple[int, float]]:
    specs = workload()
    rng = random.Random(1)
    drafter = create_drafter(drafter_name, DrafterConfig(max_occurrences=k, max_scan=m))
    rows, spent_s, calls = [], 0.0, 0
    for req in range(1, requests + 1):
        prompt, out = specs[rng.randrange(len(specs))]
        rid = f"r{req}"
        drafter.start_request(rid, np.array(prompt, np.int32))
        pos = 0
        while pos < len(out):
            start = time.perf_counter()
            length = int(drafter.speculate_arrays([rid]).lengths[0])
            spent_s += time.perf_counter() - start
            calls += 1
            step = out[pos:pos + min(length, 3) + 1]  # the draft is right; at most 3 accepted, then the bonus
            drafter.append(rid, step)
            pos += len(step)
        drafter.finish_request(rid)
        if req % every == 0:
            rows.append((req, spent_s / calls * 1e6))
            print(f"K={k} M={m}: {req} requests, {rows[-1][1]:.1f} us", file=sys.stderr, flush=True)
            spent_s, calls = 0.0, 0
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=40000, metavar="N",
                   help="requests served in a row (default: %(default)s)")
    p.add_argument("--every", type=int, default=4000, metavar="N",
                   help="report every N requests (default: %(default)s)")
    p.add_argument("--limits", default="1024:4096,1000000000:1000000000", metavar="K:M,...",
                   help="max_occurrences:max_scan pairs to compare (default: %(default)s, the defaults and no bound)")
    p.add_argument("--drafter", default="native", choices=("native", "python"), help="(default: %(default)s)")
    a = p.parse_args(argv)
    if a.requests < 1 or not 1 <= a.every <= a.requests:
        p.error("--requests must be >= 1 and --every in [1, --requests]")
    try:
        limits = [tuple(int(v) for v in pair.split(":")) for pair in a.limits.split(",")]
        if any(len(pair) != 2 or min(pair) < 1 for pair in limits):
            raise ValueError
    except ValueError:
        p.error(f"--limits takes K:M pairs of positive integers separated by commas, got {a.limits!r}")
    rows = {}
    for k, m in limits:
        rows[f"K={k} M={m}"] = step_costs_us(a.drafter, k, m, a.requests, a.every)
    print_series("requests served", rows, "us", 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
