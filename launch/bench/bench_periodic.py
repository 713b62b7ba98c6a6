"""Cache drafter cost on periodic text, as the global cache fills (issue: HVD's CPU time per
decode step grew ~50x on the CPU harness's digit-cycle model).

    python launch/bench/bench_periodic.py [--requests 60] [--drafters native,python] [--max-occurrences 1024,1000000]

Each request's prompt and output walk a 10-token cycle; after each request finishes, its
400-token response joins the global cache. Prints the mean speculate + append time per
decode step every 10 requests, per drafter. Every occurrence of a periodic pattern
continues it, so without a bound the native searcher's work per draft grows with the
global cache (linearly: 74 us -> 3.6 ms per step after 40 requests before the bound).
DrafterConfig.max_occurrences (default 1024) walks a set from its newest 1024
occurrences and stops matching once that many match the whole context: the cost levels
off once the cache holds that many (--max-occurrences to compare).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from sglang_hvd.drafter import DrafterConfig, create_drafter

CYCLE = list(range(15, 25))
OUTPUT_TOKENS = 400


def step_costs_us(name: str, requests: int, every: int, max_occurrences: int) -> list[tuple[int, float]]:
    drafter = create_drafter(name, DrafterConfig(max_occurrences=max_occurrences))
    prompt = np.array(CYCLE * 3, dtype=np.int32)
    text = CYCLE * (OUTPUT_TOKENS // len(CYCLE) + 2)
    out_rows = []
    for req in range(requests):
        rid = f"r{req}"
        drafter.start_request(rid, prompt)
        emitted, steps, start = 0, 0, time.perf_counter()
        while emitted < OUTPUT_TOKENS:
            k = int(drafter.speculate_arrays([rid]).lengths[0])
            chunk = text[emitted:emitted + k + 1]  # the draft is right: it and the bonus token are emitted
            drafter.append(rid, chunk)
            emitted += len(chunk)
            steps += 1
        drafter.finish_request(rid)
        if req % every == 0 or req == requests - 1:
            out_rows.append((req, (time.perf_counter() - start) / steps * 1e6))
    return out_rows


def print_series(first_column: str, rows: dict[str, list[tuple[int, float]]], unit: str, decimals: int) -> None:
    """One column per series of (x, microseconds) rows, x in the first column."""
    names = list(rows)
    width = max(16, *(len(n) + len(unit) + 2 for n in names))
    print(first_column + "  " + "  ".join(f"{n + ' ' + unit:>{width}}" for n in names))
    for i, (x, _) in enumerate(rows[names[0]]):
        print(f"{x:>{len(first_column)}}  " + "  ".join(f"{rows[n][i][1]:>{width}.{decimals}f}" for n in names))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=60, metavar="N",
                   help="requests served in a row (default: %(default)s)")
    p.add_argument("--drafters", default="native,python", metavar="D1,D2", help="drafters (default: %(default)s)")
    p.add_argument("--max-occurrences", default="1024", metavar="K1,K2",
                   help="DrafterConfig.max_occurrences values to compare (default: %(default)s)")
    a = p.parse_args(argv)
    if a.requests < 1:
        p.error("--requests must be >= 1")
    try:
        caps = [int(k) for k in a.max_occurrences.split(",")]
    except ValueError:
        p.error(f"--max-occurrences: integers expected, got {a.max_occurrences!r}")
    rows = {f"{name} K={k}": step_costs_us(name, a.requests, 10, k) for name in a.drafters.split(",") for k in caps}
    print_series("requests in the global cache", rows, "us/step", 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
