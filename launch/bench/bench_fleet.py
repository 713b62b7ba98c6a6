"""Sequential replay against fleet replay: what concurrency costs in cache hits, and speed.

    python launch/bench/bench_fleet.py dev.jsonl.gz --gate GATE_DIR [--sources swe-agent] \
        [--concurrency 1,8] [--cache-siblings 0,4] [--json OUT]

Runs the gate's hvd policy over the traces by sequential replay (``simulate`` with the
first token from the prefill: every request after the one before) and by fleet replay
(sglang_hvd/replay/fleet.py: conversations ``C`` at a time through the serving stepper,
responses entering the global cache as they are generated) at each concurrency, in one process,
and prints cycles per 1,000 tokens and seconds for each, and for fleet replay the serving
stepper's CPU time per decode step (drafts, gate, row trees: what a server spends beside
the GPU). Fleet replay at concurrency 1 plans the same rows as sequential replay.
``--cache-siblings`` repeats the fleet runs with each value in the gate's rule.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from sglang_hvd.drafter import create_drafter
from sglang_hvd.gate import Gate
from sglang_hvd.replay.fleet import conversations_of, serve_fleet
from sglang_hvd.replay.policies import GatePolicy
from sglang_hvd.replay.simulate import simulate
from sglang_hvd.serving.stepper import HVDStepper
from sglang_hvd.trace import iter_traces


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", metavar="TRACES")
    p.add_argument("--gate", required=True, metavar="GATE_DIR", help="a gate from `hvd train`")
    p.add_argument("--sources", metavar="S1,S2", help="only these sources (default: all)")
    p.add_argument("--concurrency", default="1,8", metavar="C1,C2", help="fleet concurrencies (default: %(default)s)")
    p.add_argument("--cache-siblings", metavar="S1,S2",
                   help="fleet runs with each cache siblings value (default: the gate's)")
    p.add_argument("--json", metavar="OUT", help="write the figures here")
    a = p.parse_args(argv)
    try:
        levels = [int(c) for c in a.concurrency.split(",") if c.strip()]
    except ValueError:
        p.error(f"--concurrency: expected integers like 1,8, got {a.concurrency!r}")
    if not levels or min(levels) < 1:
        p.error("--concurrency: every value must be >= 1")
    sources = {s.strip() for s in a.sources.split(",")} if a.sources else None
    gate = Gate(a.gate)
    try:
        siblings = [int(v) for v in a.cache_siblings.split(",")] if a.cache_siblings else [gate.rule.cache_siblings]
        rules = [dataclasses.replace(gate.rule, cache_siblings=v) for v in siblings]
    except ValueError as e:
        p.error(f"--cache-siblings: expected integers >= 0 like 0,4 ({e})")
    model = gate.spec.verify
    records = [r for r in iter_traces(a.traces) if sources is None or r.source in sources]
    if not records:
        p.error("no records (check TRACES and --sources)")
    rows = []
    t = time.perf_counter()
    result = simulate(records, create_drafter("native", gate.spec.drafter), [GatePolicy(gate, gate.rule)], model,
                      prefill_first=True)
    rows.append((f"sequential (S {gate.rule.cache_siblings})", result.overall.policy("hvd").to_json()["cycles_per_1k"],
                 time.perf_counter() - t, None))
    for rule in rules:
        for c in levels:
            stepper = HVDStepper(create_drafter("native", gate.spec.drafter), gate, model.shape, rule=rule)
            t = time.perf_counter()
            fleet = serve_fleet(conversations_of(records), stepper, model, c)
            rows.append((f"fleet x{c} (S {rule.cache_siblings})",
                         fleet.overall.policy("hvd").to_json()["cycles_per_1k"],
                         time.perf_counter() - t, stepper.summary()["cpu_us_per_step"]))
    print(f"{len(records)} requests, verify {model.shape.describe()}, gate {a.gate}")
    print(f"{'replay':<22} {'hvd cycles/1k':>13} {'seconds':>8} {'stepper us/step':>15}")
    for name, cycles, seconds, cpu in rows:
        print(f"{name:<22} {cycles:>13.1f} {seconds:>8.1f} {'-' if cpu is None else f'{cpu:.0f}':>15}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({name: {"cycles_per_1k": c, "seconds": s, "stepper_us_per_step": u} for name, c, s, u in rows}, f,
                      indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
