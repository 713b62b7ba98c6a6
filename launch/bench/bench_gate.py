"""Gate serving cost: feature extraction and onnxruntime inference for a decode batch.

    python launch/bench/bench_gate.py GATE_DIR TRACES [--batch 32]

Collects real feature rows (cache drafts of the traces, with their request histories
and, where the gate serves cache siblings, the row trees its tree features describe),
then times, per call on one core: features for a batch of B rows, and one onnxruntime
call on B rows (median and p99 over many calls). Targets: features <= 200 us and
inference <= 30 us for a batch of 32.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from sglang_hvd.drafter import create_drafter
from sglang_hvd.drafter.native_drafter import default_drafter_name
from sglang_hvd.features import RequestHistory
from sglang_hvd.drafter.row_tree import EMPTY_ROW, speculate_row
from sglang_hvd.policy import RequestState, described
from sglang_hvd.gate import Gate
from sglang_hvd.replay.engine import iter_dense
from sglang_hvd.trace import iter_traces


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("gate")
    p.add_argument("traces", nargs="+")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rows", type=int, default=4096, help="real rows to collect (default: %(default)s)")
    p.add_argument("--calls", type=int, default=2000)
    args = p.parse_args(argv)
    gate = Gate(args.gate)
    drafter = create_drafter(default_drafter_name(), gate.drafter_config)
    n = gate.shape.draft_nodes
    siblings = gate.rule.cache_siblings if gate.shape.allows_branches else 0
    rows, state, current = [], None, None
    for step in iter_dense(iter_traces(args.traces), drafter):
        r = step.record
        if r is not current:
            current, state = r, RequestState(r.prompt_ids)
        if step.draft.tokens:
            row = speculate_row(drafter, r.req_id, n).head(int(described(len(step.draft), siblings, n))) if siblings else EMPTY_ROW
            rows.append(state.feature_input(step.draft, row))
        state.record(step.draft.tokens)
        state.observe([int(r.output_ids[step.pos])])
        if len(rows) >= args.rows:
            break
    rng = np.random.default_rng(0)
    feat_us, infer_us, history_us = [], [], []
    for _ in range(args.calls):
        batch = [rows[i] for i in rng.integers(0, len(rows), size=args.batch)]
        t = time.perf_counter_ns()
        x = gate.extractor(batch)
        feat_us.append((time.perf_counter_ns() - t) / 1e3)
        t = time.perf_counter_ns()
        gate.predict(x)
        infer_us.append((time.perf_counter_ns() - t) / 1e3)
    h = RequestHistory()
    for _ in range(args.calls):
        t = time.perf_counter_ns()
        for _ in range(args.batch):
            h.scalars()
        history_us.append((time.perf_counter_ns() - t) / 1e3)
    q = lambda a: f"median {np.median(a):7.1f} us, p99 {np.percentile(a, 99):7.1f} us"
    print(f"{len(rows)} real rows ({sum(len(x.row) > len(x.draft) for x in rows)} with siblings); batch {args.batch}; "
          "onnxruntime on 1 intra-op thread")
    print(f"features (extractor)      : {q(feat_us)}")
    print(f"history snapshots (x{args.batch})  : {q(history_us)}")
    print(f"gate inference (1 call)   : {q(infer_us)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
