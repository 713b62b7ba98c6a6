"""Tree drafts against chain drafts: what several continuations buy, and what they cost.

    python launch/bench/bench_trees.py dev.jsonl.gz [--nodes 4,8,16] [--sources tau-bench,swe-agent] [--limit N]

Walks every request of the traces as dense replay does (a draft at every output position,
requests in file order, each response joining the global cache), and at each position asks
the native drafter for the chain (``speculate``) and for trees of at most B nodes
(``speculate_tree``) and row trees (``speculate_rows``: the chain, then the tree draft's
other nodes; what HVD's cache rows verify). Prints per source and B: the median and p99
latency of each call (us), and the tokens greedy verification would accept per position
from a row of B draft tokens (chain: its first B tokens, the longest common prefix with the
recorded output; tree and row tree: the deepest node on the recorded output's path; and the
better of chain and tree at each position, an oracle's choice), over every position and
over those where the chain is wrong before its B-th token or has none (what a sibling can
save). Drafter settings: DrafterConfig's defaults
(``--max-spec-factor`` to change). Not the served figures: verify cost and the gate are
not modelled here (see hvd replay for those).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import sys
import time

import numpy as np

from sglang_hvd.drafter import DrafterConfig, create_drafter
from sglang_hvd.drafter.row_tree import row_path, speculate_row
from sglang_hvd.errors import HvdInputError
from sglang_hvd.replay.engine import accept_len
from sglang_hvd.report import format_table
from sglang_hvd.trace import iter_traces


def walk(records, config: DrafterConfig, nodes: list[int]) -> dict:
    """Per source: latencies (us) and accepted tokens per position, chain and trees."""
    drafter = create_drafter("native", config)
    stats = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in records:
        s = stats[r.source]
        drafter.start_request(r.req_id, r.prompt_ids)
        out = r.output_ids
        for pos in range(len(out)):
            t = time.perf_counter_ns()
            chain = drafter.speculate(r.req_id)
            s["chain_us"].append((time.perf_counter_ns() - t) / 1e3)
            for b in nodes:  # the chain as a verify row of b draft tokens holds it: its first b
                got = accept_len(chain.tokens[:b], out, pos)
                s[f"chain{b}"].append(got)
                s[f"chain{b}_short"].append(got < min(len(chain.tokens[:b]), len(out) - pos) or not chain.tokens)
                t = time.perf_counter_ns()
                tree = drafter.speculate_tree(r.req_id, b)
                s[f"tree{b}_us"].append((time.perf_counter_ns() - t) / 1e3)
                s[f"tree{b}"].append(len(row_path(tree.tokens, tree.parents, out, pos)))
                t = time.perf_counter_ns()
                row = speculate_row(drafter, r.req_id, b)
                s[f"row{b}_us"].append((time.perf_counter_ns() - t) / 1e3)
                s[f"row{b}"].append(len(row_path(row.tokens, row.parents, out, pos)))
            drafter.append(r.req_id, out[pos : pos + 1])
        drafter.finish_request(r.req_id)
    return stats


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", metavar="TRACES", help="token traces (hvd import / collect)")
    p.add_argument("--nodes", default="4,8,16", metavar="B1,B2", help="tree node budgets (default: %(default)s)")
    p.add_argument("--sources", metavar="S1,S2", help="only these sources (default: all)")
    p.add_argument("--limit", type=int, metavar="N", help="first N requests (after --sources) only")
    p.add_argument("--max-spec-factor", type=float, default=DrafterConfig().max_spec_factor, metavar="X",
                   help="drafter budget per matched token (default: %(default)s)")
    a = p.parse_args(argv)
    try:
        nodes = [int(b) for b in a.nodes.split(",")]
        if min(nodes) < 1:
            raise ValueError
    except ValueError:
        p.error(f"--nodes takes positive integers separated by commas, got {a.nodes!r}")
    sources = set(a.sources.split(",")) if a.sources else None
    try:
        records = [r for r in iter_traces(a.traces) if sources is None or r.source in sources]
    except HvdInputError as e:
        p.error(str(e))
    records = list(itertools.islice(records, a.limit))
    if not records:
        p.error("no request to walk (check --sources)")
    print(f"{len(records):,} requests, {sum(len(r.output_ids) for r in records):,} positions", file=sys.stderr)
    stats = walk(records, DrafterConfig(max_spec_factor=a.max_spec_factor), nodes)
    rows = []
    for source, s in sorted(stats.items()):
        for b in nodes:
            short = np.array(s[f"chain{b}_short"])
            chain, tree = np.array(s[f"chain{b}"], dtype=float), np.array(s[f"tree{b}"], dtype=float)
            row = np.array(s[f"row{b}"], dtype=float)
            for name, us, acc in (("chain", s["chain_us"], chain), ("tree", s[f"tree{b}_us"], tree),
                                  ("row tree (chain + siblings)", s[f"row{b}_us"], row),
                                  ("better of chain and tree", None, np.maximum(chain, tree))):
                rows.append((source, b, name, f"{np.median(us):.1f}" if us else "-",
                             f"{np.percentile(us, 99):.0f}" if us else "-", f"{acc.mean():.3f}",
                             f"{acc[short].mean():.3f}" if short.any() else "-"))
    print(format_table(["source", "nodes", "draft", "median us", "p99 us", "accepted per position",
                        "where the chain falls short"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
