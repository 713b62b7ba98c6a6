"""What the drafter's work bounds change: drafts at every position, bounded against unbounded.

    python launch/bench/bench_bounds.py dev.jsonl.gz [--max-scan 1024,2048,4096] [--max-occurrences 1024] \
[--sources S1,S2]

DrafterConfig.max_occurrences (K: a set is walked from its newest K occurrences) and
max_scan (M: longer patterns are looked for among the newest M occurrences of the last two
tokens) bound the drafter's work on repetitive text; they may change drafts. This walks
the traces as dense replay does (a draft at every output position, the native drafter)
once per setting and once without bounds, and prints how many drafts differ (and how many
of those differ in their tokens, not only in their counts or probabilities).
"""

from __future__ import annotations

import argparse
import sys
import time

from sglang_hvd.drafter import DrafterConfig, create_drafter
from sglang_hvd.errors import HvdInputError
from sglang_hvd.replay.engine import iter_dense
from sglang_hvd.report import format_table
from sglang_hvd.trace import iter_traces

UNBOUNDED = 10**9


def drafts(records, k: int, m: int) -> list:
    drafter = create_drafter("native", DrafterConfig(max_occurrences=k, max_scan=m))
    return [step.draft for step in iter_dense(records, drafter)]


def _ints(text: str, flag: str, p: argparse.ArgumentParser) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
        if min(values) < 1:
            raise ValueError
        return values
    except ValueError:
        p.error(f"{flag} takes positive integers separated by commas, got {text!r}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", metavar="TRACES", help="token traces (hvd import / collect)")
    p.add_argument("--max-scan", default="1024,2048,4096", metavar="M1,M2", help="(default: %(default)s)")
    p.add_argument("--max-occurrences", default="1024", metavar="K1,K2", help="(default: %(default)s)")
    p.add_argument("--sources", metavar="S1,S2", help="only these sources (default: all)")
    a = p.parse_args(argv)
    scans, caps = _ints(a.max_scan, "--max-scan", p), _ints(a.max_occurrences, "--max-occurrences", p)
    sources = set(a.sources.split(",")) if a.sources else None
    try:
        records = [r for r in iter_traces(a.traces) if sources is None or r.source in sources]
    except HvdInputError as e:
        p.error(str(e))
    if not records:
        p.error("no request to walk (check --sources)")
    start = time.perf_counter()
    reference = drafts(records, UNBOUNDED, UNBOUNDED)
    print(f"{len(reference):,} positions, unbounded walk {time.perf_counter() - start:.1f} s", file=sys.stderr)
    rows = []
    for k in caps:
        for m in scans:
            got = drafts(records, k, m)
            differ = [(x, y) for x, y in zip(got, reference) if x != y]
            rows.append((k, m, len(got), len(differ), sum(x.tokens != y.tokens for x, y in differ)))
    print(format_table(["max_occurrences", "max_scan", "positions", "drafts differing", "tokens differing"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
