"""Gate serving cost: feature extraction and onnxruntime inference for a decode batch.

    python launch/bench/bench_gate.py GATE_DIR TRACES [--batch 32]

Collects real feature rows (cache drafts of the traces, with their request histories
and, where the gate serves cache siblings, the row trees its tree features describe),
then times, per call on one core: features for a batch of B rows, and one onnxruntime
call on B rows (both outputs of a gate with a payoff curve, as a server asks them;
median and p99 over many calls), each batch packed beforehand as the drafter hands it
over (DraftBatch, StateBatch, RowTreeBatch). Targets: features <= 200 us and inference
<= 30 us for a batch of 32.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from sglang_hvd.decision import described
from sglang_hvd.drafter import create_drafter
from sglang_hvd.drafter.batch import DraftBatch, RowTreeBatch
from sglang_hvd.drafter.native_drafter import default_drafter_name
from sglang_hvd.drafter.row_tree import EMPTY_ROW, speculate_row
from sglang_hvd.gate import Gate
from sglang_hvd.replay.engine import iter_dense
from sglang_hvd.request_state import RequestHistory, RequestState, StateBatch
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
    shape = gate.verify_model.shape
    n = shape.draft_nodes
    siblings = gate.rule.cache_siblings if shape.allows_branches else 0
    rows, state, current = [], None, None
    for step in iter_dense(iter_traces(args.traces), drafter):
        r = step.record
        if r is not current:
            current, state = r, RequestState(r.prompt_ids)
        if step.draft.tokens:
            row = (speculate_row(drafter, r.req_id, n).head(int(described(len(step.draft), siblings, n)))
                   if siblings else EMPTY_ROW)
            rows.append((step.draft, state.snapshot(), row))
        state.record(step.draft.tokens)
        state.observe([int(r.output_ids[step.pos])])
        if len(rows) >= args.rows:
            break
    rng = np.random.default_rng(0)
    feat_us, infer_us, history_us = [], [], []
    batches = []
    for _ in range(args.calls):
        drafts, states, trees = zip(*(rows[i] for i in rng.integers(0, len(rows), size=args.batch)))
        grown = RowTreeBatch.of(trees, n) if any(t.tokens for t in trees) else None
        batches.append((DraftBatch.of(drafts), StateBatch.stack(states), grown))
    for drafts, states, trees in batches:
        t = time.perf_counter_ns()
        x = gate.extractor.features(drafts, states, trees)
        feat_us.append((time.perf_counter_ns() - t) / 1e3)
        t = time.perf_counter_ns()
        gate.predict_curve(x)
        infer_us.append((time.perf_counter_ns() - t) / 1e3)
    h = RequestHistory()
    for _ in range(args.calls):
        t = time.perf_counter_ns()
        for _ in range(args.batch):
            h.scalars()
        history_us.append((time.perf_counter_ns() - t) / 1e3)
    def q(a):
        return f"median {np.median(a):7.1f} us, p99 {np.percentile(a, 99):7.1f} us"

    with_siblings = sum(len(row) > len(draft) for draft, _, row in rows)
    print(f"{len(rows)} real rows ({with_siblings} with siblings); batch {args.batch}; "
          f"onnxruntime on 1 intra-op thread; payoff curve of {gate.curve_width} widths")
    print(f"features (extractor)      : {q(feat_us)}")
    print(f"history snapshots (x{args.batch})  : {q(history_us)}")
    print(f"gate inference (1 call)   : {q(infer_us)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
