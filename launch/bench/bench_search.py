"""The cache drafter's search alone: chain drafts and row trees of B running requests.

    python launch/bench/bench_search.py dev.jsonl.gz [--sources tau-bench,swe-agent] [--finished 600] \
        [--batch 64] [--repeats 30] [--drafter native] [--threads N]

The first ``--finished`` requests of the traces (after ``--sources``) run to the end and
stay in the global cache; the next ``--batch`` start with their prompt and the first half
of their output. Then, ``--repeats`` times each, the batch's chain drafts
(``speculate_arrays``) and row trees of 15 nodes (``speculate_rows``) are timed as this
thread's CPU time; the best of each is printed (the search is pure: every repeat drafts
the same). For a library change, run it from each build in turn, several times: the
machine's speed drifts between runs. ``--threads N`` drafts the batch on N threads (the
native drafter; a server's ``--hvd-draft-threads``), timed as elapsed time then, as this
thread's CPU time does not count the others.
"""

from __future__ import annotations

import argparse
import sys
import time

from sglang_hvd.drafter import DrafterConfig, available_drafters, create_drafter
from sglang_hvd.drafter.protocol import MAX_DRAFT_THREADS
from sglang_hvd.trace import iter_traces

ROW_NODES = 15  # a row tree's nodes: the recommended 4-3-16 shape's N-1


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", metavar="TRACES")
    p.add_argument("--sources", metavar="S1,S2", help="only these sources (default: all)")
    p.add_argument("--finished", type=_positive, default=600, metavar="N",
                   help="requests run to the end first, in the global cache (default: %(default)s)")
    p.add_argument("--batch", type=_positive, default=64, metavar="B", help="running requests (default: %(default)s)")
    p.add_argument("--repeats", type=_positive, default=30, metavar="R",
                   help="timed calls of each kind, the best kept (default: %(default)s)")
    p.add_argument("--drafter", default="native", choices=available_drafters(),
                   help="registered drafter (default: %(default)s)")
    p.add_argument("--threads", type=_positive, default=1, metavar="N",
                   help=f"threads the batch is drafted on, at most {MAX_DRAFT_THREADS} (the native drafter; above 1, "
                        f"timed as elapsed time) (default: %(default)s)")
    a = p.parse_args(argv)
    if a.threads > MAX_DRAFT_THREADS:
        p.error(f"--threads: must be <= {MAX_DRAFT_THREADS}, got {a.threads}")
    if a.threads > 1 and a.drafter != "native":
        p.error(f"--threads: the {a.drafter} drafter drafts on one thread")
    sources = {s.strip() for s in a.sources.split(",")} if a.sources else None
    records = [r for r in iter_traces(a.traces) if sources is None or r.source in sources]
    if len(records) < a.finished + a.batch:
        p.error(f"{len(records)} requests, fewer than --finished {a.finished} + --batch {a.batch}")
    drafter = create_drafter(a.drafter, DrafterConfig(), threads=a.threads)
    clock = time.thread_time if a.threads == 1 else time.perf_counter
    for r in records[: a.finished]:
        drafter.start_request(r.req_id, r.prompt_ids)
        drafter.append_batch([r.req_id], [list(r.output_ids)])
        drafter.finish_request(r.req_id)
    running = records[a.finished : a.finished + a.batch]
    for r in running:
        drafter.start_request(r.req_id, r.prompt_ids)
        drafter.append_batch([r.req_id], [list(r.output_ids[: len(r.output_ids) // 2])])
    rids = [r.req_id for r in running]
    chains = rows = float("inf")
    for _ in range(a.repeats):
        t = clock()
        drafter.speculate_arrays(rids)
        chains = min(chains, clock() - t)
        t = clock()
        drafter.speculate_rows(rids, ROW_NODES)
        rows = min(rows, clock() - t)
    timed = "this thread's CPU time" if a.threads == 1 else f"elapsed time, {a.threads} threads"
    print(f"{a.drafter} drafter, {a.finished} finished requests cached, {a.batch} running "
          f"(best of {a.repeats}, {timed}):")
    print(f"  chain drafts (speculate_arrays)           {chains * 1e6:8.0f} us")
    print(f"  row trees of {ROW_NODES} nodes (speculate_rows)    {rows * 1e6:8.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
