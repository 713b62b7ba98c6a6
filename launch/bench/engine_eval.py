"""Engine-in-the-loop evaluation: real SGLang serves recorded conversations on the CPU.

    python launch/bench/engine_eval.py TRACES... --modes eagle3_only,cache_only,hvd \
        --gate GATE_DIR [--limit-conversations N] [--concurrency C] --json OUT

Needs the sglang extra (``bash tests/run --sglang`` installs it into .venv-sglang; run
this script with that interpreter, from the repository root). For each mode it starts a
real SGLang 0.5.23 server on the CPU harness (tests/sglang_cpu) whose target is the
trace oracle: its greedy output *is* the recorded conversations, and its EAGLE3 draft
is a stand-in run by SGLang's own EAGLE3 worker that proposes the recorded tokens with a
seeded error model calibrated to the EAGLE3 curve: exactly on chains, and at topk > 1 by
its runner-up probability so that its tree yields the curve's tokens at N-1 nodes
(tests/sglang_cpu/trace_oracle.py, stubs/hvd_trace_oracle).
Each conversation's turns are sent in order, ``--concurrency`` conversations at a time
(a fleet of agents). Per mode and source it reports the served cycles per 1,000 output
tokens (per request: the prefill forward plus ``spec_verify_ct`` verifies), replay's
prediction for the same records, settings and order (first token from the prefill, as
served), their ratio, and a lossless check: every output must equal its recording.

Modes:
  greedy       no speculation (cycles = tokens)
  eagle3_only  EAGLE3 alone (the stand-in draft)
  cache_only   HVD with the gate's threshold at -inf: the cache draft whenever the cache
               drafter has one (at topk > 1 EAGLE3 keeps the nodes it leaves, and the
               chain takes the gate's cache siblings), else EAGLE3's row; replay runs the
               same decision
  rule         HVD with the score rule in the gate's place (--hvd-score-rule C: a cache row
               when the cache draft's score >= C; C: --rule-score, default the gate's
               calibrated rule_threshold); rows built as the gate's would be
  hvd          HVD with the gate's own decision rule

With ``--replicas R`` (R > 1) each mode runs R servers behind sglang-router
(``--router-policy``); the engine figures are the fleet's, replay's stay one server's.

Replay's side is fleet replay (sglang_hvd/replay/fleet.py): the same conversations, the
same concurrency, the serving stepper deciding each batch, responses entering the
global cache as they are generated, as in the server. The JSON also holds sequential replay
(every request after the one before, as `hvd replay` runs) for comparison.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from sglang_hvd.drafter import create_drafter  # noqa: E402
from sglang_hvd.gate import Gate, ScoreRuleGate  # noqa: E402
from sglang_hvd.replay.acceptance import VerifyModel  # noqa: E402
from sglang_hvd.replay.policies import Eagle3Only, GatePolicy, Greedy  # noqa: E402
from sglang_hvd.replay.fleet import conversations_of, serve_fleet  # noqa: E402
from sglang_hvd.replay.simulate import simulate  # noqa: E402
from sglang_hvd.serving.status import fleet_status  # noqa: E402
from sglang_hvd.serving.stepper import HVDStepper  # noqa: E402
from sglang_hvd.trace import iter_traces  # noqa: E402
from sglang_hvd.verify import Eagle3Curve, VerifyShape  # noqa: E402
from tests.sglang_cpu import harness  # noqa: E402
from tests.sglang_cpu.trace_oracle import ORACLE_ARGS, ORACLE_ENV, calibrated_draft_model, write_oracle_models  # noqa: E402

MODES = ("greedy", "eagle3_only", "cache_only", "rule", "hvd")
GATED = ("cache_only", "rule", "hvd")
KV_TOKENS_PER_SLOT_MARGIN = 1.25


@dataclasses.dataclass(slots=True)
class Tally:
    requests: int = 0
    tokens: int = 0
    cycles: int = 0

    def to_json(self) -> dict:
        return {"cycles_per_1k": 1000.0 * self.cycles / max(self.tokens, 1), "requests": self.requests,
                "tokens": self.tokens, "cycles": self.cycles}


def first_conversations(records, limit: int | None) -> list[list]:
    """Conversations in file order, turns in order; ``limit``: the first N of each source."""
    kept, per_source = [], collections.Counter()
    for turns in conversations_of(records):
        per_source[turns[0].source] += 1
        if limit is None or per_source[turns[0].source] <= limit:
            kept.append(turns)
    return kept


def server_args(mode: str, models, shape: VerifyShape, gate_dir: str | None, concurrency: int,
                rule_score: float | None = None) -> tuple[list, dict, str]:
    base = [a for a in harness.BASE_ARGS]
    for flag in ("--max-total-tokens", "--max-running-requests"):
        i = base.index(flag)
        del base[i:i + 2]
    tokens = int(models.max_context_tokens * max(concurrency, 1) * KV_TOKENS_PER_SLOT_MARGIN)
    args = base + ORACLE_ARGS + ["--max-total-tokens", str(tokens), "--max-running-requests", str(max(concurrency, 1)),
                                 "--chunked-prefill-size", "8192"]
    env = dict(ORACLE_ENV)
    launcher = "sglang.launch_server"
    if mode != "greedy":
        args += harness.eagle3_args(models.draft, topk=shape.topk, steps=shape.steps, draft_tokens=shape.nodes)
    if mode in GATED:
        args += ["--hvd-gate", gate_dir, "--hvd-drafter", "native"]
        if mode == "cache_only":
            args += ["--hvd-threshold=-inf"]
        if mode == "rule":
            args += [f"--hvd-score-rule={rule_score!r}"]
        launcher = "sglang_hvd.launch_server"
    return args, env, launcher


def serve(server, convs: list[list], concurrency: int, progress) -> dict[str, tuple]:
    """req_id -> (output_ids, meta_info): each conversation's turns in order."""
    results: dict[str, tuple] = {}
    lock = threading.Lock()

    def run(turns):
        for r in turns:
            out = server.generate(input_ids=r.prompt_ids.tolist(), max_new_tokens=len(r.output_ids), timeout=3600)
            with lock:
                results[r.req_id] = (out["output_ids"], out["meta_info"])
                progress(len(r.output_ids))

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(concurrency, 1)) as pool:
        for f in [pool.submit(run, turns) for turns in convs]:
            f.result()
    return results


def first_difference(got: list[int], want: list[int]) -> int:
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return i
    return min(len(got), len(want))


def engine_tallies(records, results, mode: str) -> tuple[dict, list]:
    by_source: dict[str, Tally] = collections.defaultdict(Tally)
    mismatches = []
    for r in records:
        got, meta = results[r.req_id]
        want = r.output_ids.tolist()
        if got != want:
            k = first_difference(got, want)
            mismatches.append({"req_id": r.req_id, "position": k, "got": got[k:k + 5], "want": want[k:k + 5]})
        tokens = int(meta["completion_tokens"])
        cycles = tokens if mode == "greedy" else 1 + int(meta.get("spec_verify_ct", 0))
        for key in (r.source, "overall"):
            t = by_source[key]
            t.requests += 1
            t.tokens += tokens
            t.cycles += cycles
    return {k: v.to_json() for k, v in by_source.items()}, mismatches


def replay(convs: list[list], mode: str, gate, model: VerifyModel, drafter_config, concurrency: int,
           rule_score: float | None = None) -> dict:
    """Replay's prediction for the served order: fleet replay (the serving stepper, the
    same conversations ``concurrency`` at a time; cache_only is the served decision at
    threshold -inf, rule the score rule in the gate's place, eagle3_only the stepper
    without a gate) and, for reference,
    sequential replay (every request after the one before)."""
    records = [r for turns in convs for r in turns]
    if mode == "greedy":
        result = simulate(records, create_drafter("native", drafter_config), [Greedy()], model, prefill_first=True)
        out = {name: s.policy("greedy").to_json() for name, s in result.sources.items()}
        out["overall"] = result.overall.policy("greedy").to_json()
        return {"fleet": out, "sequential": out}
    if mode == "rule":
        gate = ScoreRuleGate(gate, rule_score)
    rule = {"eagle3_only": None, "cache_only": dataclasses.replace(gate.rule, threshold=-math.inf) if gate else None,
            "rule": gate.rule if gate else None, "hvd": gate.rule if gate else None}[mode]
    stepper = HVDStepper(create_drafter("native", drafter_config), gate if mode != "eagle3_only" else None,
                         model.shape, rule=rule)
    fleet = serve_fleet(convs, stepper, model, concurrency, policy=mode).to_json(mode)
    policy = Eagle3Only() if mode == "eagle3_only" else GatePolicy(gate, rule, mode)
    result = simulate(records, create_drafter("native", drafter_config), [policy], model, prefill_first=True)
    sequential = {name: s.policy(policy.name).to_json() for name, s in result.sources.items()}
    sequential["overall"] = result.overall.policy(policy.name).to_json()
    return {"fleet": fleet, "sequential": sequential}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", metavar="TRACES", help="trace files (hvd import / hvd collect), .gz or not")
    p.add_argument("--modes", default="eagle3_only,cache_only,hvd", metavar="M1,M2",
                   help=f"comma-separated, from {', '.join(MODES)} (default: %(default)s)")
    p.add_argument("--gate", metavar="GATE_DIR", help="a gate from `hvd train`: needed by cache_only and hvd; its "
                   "verify shape, EAGLE3 curve and drafter settings are the run's")
    p.add_argument("--rule-score", type=float, metavar="C", help="the rule mode's minimum cache draft score "
                   "(default: the gate's calibrated rule_threshold)")
    p.add_argument("--limit-conversations", type=int, metavar="N", help="the first N conversations of each source")
    p.add_argument("--sources", metavar="S1,S2", help="only these sources (default: all)")
    p.add_argument("--concurrency", type=int, default=4, metavar="C", help="conversations in flight (default: %(default)s)")
    p.add_argument("--replicas", type=int, default=1, metavar="R", help="servers per mode; more than one are "
                   "served through sglang-router (the router extra) and replay's figure stays one server's, so the "
                   "ratio shows what routing costs (default: %(default)s)")
    p.add_argument("--router-policy", default="cache_aware", metavar="POLICY",
                   help="sglang-router's --policy with --replicas > 1: cache_aware, round_robin, random, "
                        "power_of_two (default: %(default)s)")
    p.add_argument("--verify-topk", type=int, metavar="K", help="without --gate: SGLang's topk (default 1)")
    p.add_argument("--verify-steps", type=int, metavar="S", help="without --gate: draft steps (default 3)")
    p.add_argument("--eagle3-curve", metavar="CURVE", help="without --gate: EAGLE3 tokens per verify by draft nodes "
                   f"(default {Eagle3Curve().text()})")
    p.add_argument("--draft-seed", type=int, default=0, metavar="N", help="seed of the EAGLE3 stand-in's errors")
    p.add_argument("--work-dir", metavar="DIR", help="where the oracle models and server logs go (default: a temp dir)")
    p.add_argument("--json", metavar="OUT", help="write every figure here")
    a = p.parse_args(argv)
    # a SIGTERM (timeout, kill) unwinds like Ctrl-C, so the running server is stopped too
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        p.error(f"--modes: unknown mode {bad[0] if bad else '(none)'!r}; choose from {', '.join(MODES)}")
    if any(m in GATED for m in modes) and not a.gate:
        p.error("--modes cache_only, rule and hvd need --gate GATE_DIR (a folder written by `hvd train`)")
    if a.concurrency < 1:
        p.error("--concurrency must be >= 1")
    if a.replicas < 1:
        p.error("--replicas must be >= 1")
    if a.replicas > 1:
        import importlib.util

        if importlib.util.find_spec("sglang_router") is None:
            p.error("--replicas > 1 needs sglang-router: pip install 'sglang-hvd[router]'")
    if a.json and os.path.isdir(a.json):
        p.error(f"--json {a.json}: is a directory")
    reason = harness.sglang_available()
    if reason:
        p.error(f"the engine needs the sglang extra ({reason}): run with .venv-sglang/bin/python after "
                "`bash tests/run --sglang --co -q`")

    gate = Gate(a.gate) if a.gate else None
    if gate is not None:
        model, drafter_config = gate.spec.verify, gate.spec.drafter
        if a.verify_topk or a.verify_steps or a.eagle3_curve:
            p.error("with --gate the verify shape and EAGLE3 curve are the gate's; drop --verify-*/--eagle3-curve")
    else:
        from sglang_hvd.drafter.protocol import DrafterConfig

        topk, steps = a.verify_topk or 1, a.verify_steps or 3
        nodes = steps + 1 if topk == 1 else min(topk + (steps - 1) * topk ** 2, 16) + 1
        model = VerifyModel(VerifyShape(topk, steps, nodes), Eagle3Curve.parse(a.eagle3_curve) if a.eagle3_curve else Eagle3Curve())
        drafter_config = DrafterConfig()
    rule_score = a.rule_score if a.rule_score is not None or gate is None else gate.spec.rule_threshold
    if "rule" in modes and (rule_score is None or not math.isfinite(rule_score)):
        p.error("--modes rule: the gate has no calibrated rule_threshold; pass --rule-score C")
    shape = model.shape
    sources = {s.strip() for s in a.sources.split(",")} if a.sources else None
    records = [r for r in iter_traces(a.traces) if sources is None or r.source in sources]
    convs = first_conversations(records, a.limit_conversations)
    if not convs:
        p.error("no conversations to serve (check TRACES and --sources)")
    work = a.work_dir or tempfile.mkdtemp(prefix="hvd_engine_eval_")
    if shape.topk > 1:
        print(f"engine_eval: calibrating the EAGLE3 stand-in's tree to {model.eagle3.tokens(shape.draft_nodes):.3g} tokens "
              f"per verify at {shape.draft_nodes} nodes (~20 s)", file=sys.stderr)
    draft_model = calibrated_draft_model(model.eagle3, shape.topk, shape.steps, shape.nodes, seed=a.draft_seed)
    models = write_oracle_models(os.path.join(work, "models"), [r for turns in convs for r in turns], draft_model)
    dropped = set(models.report.dropped)
    convs = [[r for r in turns if r.req_id not in dropped] for turns in convs]
    convs = [turns for turns in convs if turns]
    served = [r for turns in convs for r in turns]
    total_tokens = sum(len(r.output_ids) for r in served)
    print(f"engine_eval: {len(convs)} conversations, {len(served)} requests, {total_tokens:,} output tokens; "
          f"verify {shape.describe()}, EAGLE3 curve {model.eagle3.text()}; "
          f"{len(dropped)} requests dropped (a prefix another recording continues differently); EAGLE3 stand-in: "
          f"per-depth accuracy {', '.join(f'{q:.3f}' for q in draft_model.accept_probs)}, "
          f"runner-up {draft_model.runner_up_prob:g}", file=sys.stderr)

    report = {"settings": {"traces": a.traces, "modes": modes, "gate": a.gate, "shape": shape.to_json(),
                           "eagle3_curve": model.eagle3.text(), "concurrency": a.concurrency,
                           "limit_conversations": a.limit_conversations,
                           "replicas": a.replicas, "router_policy": a.router_policy if a.replicas > 1 else None,
                           "rule_score": rule_score if "rule" in modes else None, "draft_error_model": draft_model.to_json(),
                           "conversations": len(convs), "requests": len(served), "dropped_requests": sorted(dropped)},
              "modes": {}}
    for mode in modes:
        args, env, launcher = server_args(mode, models, shape, a.gate, a.concurrency, rule_score)
        started = time.time()
        replicas = []
        try:
            for _ in range(a.replicas):
                replicas.append(harness.start_server(models.target, args, env, base_args=[], log_dir=work, launcher=launcher))
            server = replicas[0] if a.replicas == 1 else harness.start_router([r.url for r in replicas], a.router_policy,
                                                                               log_dir=work)
        except BaseException:
            for r in replicas:
                r.stop()
            raise
        done = [0]
        last = [0.0]

        def progress(n, mode=mode):
            done[0] += n
            if time.time() - last[0] > 5 or done[0] == total_tokens:
                last[0] = time.time()
                print(f"  {mode}: {done[0]:,}/{total_tokens:,} tokens ({time.time() - started:.0f} s)", file=sys.stderr)

        try:
            results = serve(server, convs, a.concurrency, progress)
            infos = [(r.url, r.server_info()) for r in replicas]
        finally:
            for s in {id(x): x for x in [server, *replicas]}.values():
                s.stop()
        engine, mismatches = engine_tallies(served, results, mode)
        predicted = replay(convs, mode, gate, model, drafter_config, a.concurrency, rule_score)
        fleet, sequential = predicted["fleet"], predicted["sequential"]
        status = fleet_status(infos)
        hvd_state = dict(status.ranks[0].hvd) if len(status.ranks) == 1 else (
            {**status.totals, "replicas": [dict(r.hvd) for r in status.ranks]} if status.ranks else None)
        report["modes"][mode] = {
            "engine": engine["overall"], "replay": {"cycles_per_1k": fleet["overall"]["cycles_per_1k"],
                                                    "sequential_cycles_per_1k": sequential["overall"]["cycles_per_1k"]},
            "ratio": engine["overall"]["cycles_per_1k"] / max(fleet["overall"]["cycles_per_1k"], 1e-9),
            "lossless": not mismatches, "mismatches": mismatches[:20], "num_mismatches": len(mismatches),
            "sources": {s: {"engine": engine[s], "replay": fleet[s], "replay_sequential": sequential[s]}
                        for s in engine if s != "overall"},
            "server_hvd": hvd_state, "seconds": time.time() - started,
        }
    print(f"\n{'mode':<12} {'source':<12} {'engine c/1k':>11} {'replay c/1k':>11} {'ratio':>6}  lossless"
          "   (replay: fleet replay at the same concurrency)")
    for mode, m in report["modes"].items():
        for s, v in sorted(m["sources"].items()) + [("overall", {"engine": m["engine"], "replay": m["replay"]})]:
            e, r = v["engine"]["cycles_per_1k"], v["replay"]["cycles_per_1k"]
            print(f"{mode:<12} {s:<12} {e:>11.1f} {r:>11.1f} {e / max(r, 1e-9):>6.3f}  "
                  f"{'yes' if m['lossless'] else 'NO (%d)' % m['num_mismatches']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if all(m["lossless"] for m in report["modes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
