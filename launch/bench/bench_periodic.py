"""Cache drafter cost on periodic text, as the global cache fills (issue: HVD's CPU time per
decode step grew ~50x on the CPU harness's digit-cycle model).

    python launch/bench/bench_periodic.py [--requests 60] [--drafters native,python]

Each request's prompt and output walk a 10-token cycle; after each request finishes, its
400-token response joins the global cache. Prints the mean speculate + append time per
decode step every 10 requests, per drafter. The native searcher scans every occurrence of
the context's last two tokens, so on periodic text its step cost grows with the global
cache (linearly); the Python reference walks a suffix tree and stays flat.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from sglang_hvd.drafter import DrafterConfig, create_drafter  # noqa: E402

CYCLE = list(range(15, 25))
OUTPUT_TOKENS = 400


def step_costs_us(name: str, requests: int, every: int) -> list[tuple[int, float]]:
    drafter = create_drafter(name, DrafterConfig())
    prompt = np.array(CYCLE * 3, dtype=np.int32)
    text = CYCLE * (OUTPUT_TOKENS // len(CYCLE) + 2)
    out_rows = []
    for req in range(requests):
        rid = f"r{req}"
        drafter.start_request(rid, prompt)
        emitted, steps, start = 0, 0, time.perf_counter()
        while emitted < OUTPUT_TOKENS:
            k = int(drafter.speculate_arrays([rid])["lengths"][0])
            chunk = text[emitted:emitted + k + 1]  # the draft is right: it and the bonus token are emitted
            drafter.append(rid, chunk)
            emitted += len(chunk)
            steps += 1
        drafter.finish_request(rid)
        if req % every == 0 or req == requests - 1:
            out_rows.append((req, (time.perf_counter() - start) / steps * 1e6))
    return out_rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=60, metavar="N", help="requests served in a row (default: %(default)s)")
    p.add_argument("--drafters", default="native,python", metavar="D1,D2", help="drafters (default: %(default)s)")
    a = p.parse_args(argv)
    if a.requests < 1:
        p.error("--requests must be >= 1")
    rows = {name: step_costs_us(name, a.requests, 10) for name in a.drafters.split(",")}
    names = list(rows)
    print("requests in the global cache  " + "  ".join(f"{n + ' us/step':>16}" for n in names))
    for i, (req, _) in enumerate(rows[names[0]]):
        print(f"{req:>28}  " + "  ".join(f"{rows[n][i][1]:>16.0f}" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
