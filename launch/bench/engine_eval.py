r"""Engine-in-the-loop evaluation: real SGLang serves recorded conversations on the CPU.

    .venv-sglang/bin/python launch/bench/engine_eval.py TRACES... --modes eagle3_only,cache_only,hvd \
        --gate GATE_DIR [--limit-conversations N] [--concurrency C] --json OUT

Needs the sglang extra (``bash tests/run --sglang`` installs it into .venv-sglang; run
this script with that interpreter, from any folder: every path is resolved and checked
first). For each mode it starts a real SGLang 0.5.23 server on the CPU through the engine
harness (sglang_hvd.harness, harness/ in the repository) whose target is the trace
oracle: its greedy output *is* the recorded conversations, and its EAGLE3 draft is a
stand-in run by SGLang's own EAGLE3 worker that proposes the recorded tokens with a
seeded error model calibrated to the EAGLE3 curve: exactly on chains, and at topk > 1 by
its runner-up probability so that its tree yields the curve's tokens at N-1 nodes
(sglang_hvd.harness.trace_oracle, harness/stubs/hvd_trace_oracle).
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
  hvd_cost     cost-aware HVD (--hvd-profile): each step's tier (off, or a narrower shape of
               the gate's, with or without EAGLE3's draft) picked under --profile (a copy
               naming the oracle target as its model, so the server accepts it); the
               engine's modelled time (the stepper's, per step under that profile) is
               compared with fleet replay's
  eagle3_adaptive  SGLang's own adaptive EAGLE3 (--speculative-adaptive, topk 1 only);
               replay models its rule (sglang_hvd/replay/adaptive.py)

With ``--replicas R`` (R > 1) each mode runs R servers behind sglang-router
(``--router-policy``); the engine figures are the fleet's, replay's stay one server's.

Replay's side is fleet replay (sglang_hvd/replay/fleet.py): the same conversations, the
same concurrency, the serving stepper deciding each batch, responses entering the
global cache as they are generated, as in the server. The JSON also holds sequential replay
(every request after the one before, as `hvd replay` runs) for comparison.

Bad input (a missing or unreadable file, a gate that does not load, a flag out of range)
stops before any work with one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import importlib.util
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time

from sglang_hvd.cli.common import FILE, FOLDER, check_output, non_negative_int, positive_int
from sglang_hvd.cli.options import add_verify_flags, verify_model_from_flags
from sglang_hvd.cost_rule import CostRule
from sglang_hvd.drafter import create_drafter
from sglang_hvd.drafter.protocol import DrafterConfig
from sglang_hvd.errors import HvdInputError
from sglang_hvd.gate import Gate
from sglang_hvd.harness import server as harness
from sglang_hvd.harness.trace_oracle import ORACLE_ARGS, ORACLE_ENV, calibrated_draft_model, write_oracle_models
from sglang_hvd.replay.adaptive import AdaptiveEagle3Planner
from sglang_hvd.replay.fleet import conversations_of, serve_fleet
from sglang_hvd.replay.metrics import SourceTally, overall
from sglang_hvd.replay.policies import Eagle3OnlyPolicy, GatePolicy, GreedyPolicy
from sglang_hvd.replay.simulate import simulate
from sglang_hvd.scorer import ScoreRule
from sglang_hvd.serving.status import fleet_status
from sglang_hvd.serving.stepper import HVDStepper
from sglang_hvd.step_profile import DEFAULT_PROFILE, ESTIMATES, StepProfile, load_profile
from sglang_hvd.tiers import served_tiers
from sglang_hvd.trace import iter_traces
from sglang_hvd.verify import TOPK1_SHAPE, VerifyModel

PROG = "engine_eval"
MODES = ("greedy", "eagle3_only", "eagle3_adaptive", "cache_only", "rule", "hvd", "hvd_cost")
GATED = ("cache_only", "rule", "hvd", "hvd_cost")
KV_TOKENS_PER_SLOT_MARGIN = 1.25
# Without --gate: a 3-token chain (what --verify-* flags left unset take).
DEFAULT_MODEL = VerifyModel(TOPK1_SHAPE)
VERIFY_FLAGS = ("verify_topk", "verify_steps", "verify_nodes", "eagle3_curve", "eagle3_mean")


# ------------------------------------------------------------------------------ settings


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """The flags, resolved and checked: every path absolute (the servers run in the work
    folder), the gate loaded, the verify model and drafter settings the run's."""

    traces: tuple[str, ...]
    modes: tuple[str, ...]
    gate_dir: str | None
    gate: Gate | None
    model: VerifyModel
    drafter_config: DrafterConfig
    rule_score: float | None
    profile: StepProfile
    sources: frozenset[str] | None
    limit_conversations: int | None
    concurrency: int
    replicas: int
    router_policy: str
    draft_seed: int
    work_dir: str | None
    json_path: str | None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", metavar="TRACES", help="trace files (hvd import / hvd collect), .gz or not")
    p.add_argument("--modes", default="eagle3_only,cache_only,hvd", metavar="M1,M2",
                   help=f"comma-separated, from {', '.join(MODES)} (default: %(default)s)")
    p.add_argument("--gate", metavar="GATE_DIR", help="a gate from `hvd train`: needed by cache_only, rule and hvd; "
                   "its verify shape, EAGLE3 curve and drafter settings are the run's")
    p.add_argument("--rule-score", type=float, metavar="C", help="the rule mode's minimum cache draft score "
                   "(default: the gate's calibrated rule_threshold)")
    p.add_argument("--profile", default=DEFAULT_PROFILE, metavar="P",
                   help="the step-time profile of hvd_cost's decision and modelled time: a shipped estimate "
                        f"({', '.join(ESTIMATES)}) or a file from `hvd profile` (default: %(default)s)")
    p.add_argument("--limit-conversations", type=positive_int, metavar="N",
                   help="the first N conversations of each source")
    p.add_argument("--sources", metavar="S1,S2", help="only these sources (default: all)")
    p.add_argument("--concurrency", type=positive_int, default=4, metavar="C",
                   help="conversations in flight (default: %(default)s)")
    p.add_argument("--replicas", type=positive_int, default=1, metavar="R", help="servers per mode; more than one "
                   "are served through sglang-router (the router extra) and replay's figure stays one server's, so "
                   "the ratio shows what routing costs (default: %(default)s)")
    p.add_argument("--router-policy", default="cache_aware", metavar="POLICY",
                   help="sglang-router's --policy with --replicas > 1: cache_aware, round_robin, random, "
                        "power_of_two (default: %(default)s)")
    add_verify_flags(p, gate_default="gate if given", base_shape=DEFAULT_MODEL.shape)
    p.add_argument("--draft-seed", type=non_negative_int, default=0, metavar="N",
                   help="seed of the EAGLE3 stand-in's errors (default: %(default)s)")
    p.add_argument("--work-dir", metavar="DIR", help="where the oracle models and server logs go (default: a temp dir)")
    p.add_argument("--json", metavar="OUT", help="write every figure here")
    return p


def parse_modes(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise HvdInputError(f"--modes: unknown mode {bad[0] if bad else '(none)'!r}; choose from {', '.join(MODES)}")
    return modes


def readable_file(path: str, flag: str) -> str:
    """``path`` made absolute, once it is a file this process can read."""
    where = f"{flag} {path}" if flag else path
    full = os.path.abspath(path)
    if not os.path.exists(full):
        raise HvdInputError(f"{where}: no such file")
    if os.path.isdir(full):
        raise HvdInputError(f"{where}: is a directory, expected a trace file (JSON Lines, .gz or not)")
    try:
        with open(full, "rb") as f:
            f.read(1)
    except OSError as e:
        raise HvdInputError(f"{where}: cannot read it ({e.strerror or e})") from None
    return full


def load_gate(path: str) -> tuple[str, Gate]:
    """The gate folder made absolute and loaded (the servers get the absolute path)."""
    full = os.path.abspath(path)
    try:
        return full, Gate(full)
    except HvdInputError as e:
        raise HvdInputError(f"--gate {path}: {e}") from None


def verify_settings(a: argparse.Namespace, gate: Gate | None) -> tuple[VerifyModel, DrafterConfig]:
    if gate is not None:
        given = [f for f in VERIFY_FLAGS if getattr(a, f) is not None]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise HvdInputError(f"{flag}: with --gate the verify shape and EAGLE3 curve are the gate's; "
                                "drop --verify-*/--eagle3-*")
        return gate.spec.verify, gate.spec.drafter
    return verify_model_from_flags(a, DEFAULT_MODEL), DrafterConfig()


def rule_score_of(a: argparse.Namespace, gate: Gate | None, modes: tuple[str, ...]) -> float | None:
    score = a.rule_score if a.rule_score is not None or gate is None else gate.spec.rule_threshold
    if a.rule_score is not None and not math.isfinite(a.rule_score):
        raise HvdInputError(f"--rule-score {a.rule_score}: expected a finite number")
    if "rule" in modes and (score is None or not math.isfinite(score)):
        raise HvdInputError("--modes rule: the gate has no calibrated rule_threshold; pass --rule-score C")
    return score


def resolve(a: argparse.Namespace) -> Settings:
    """Every check that needs no server, before any work (HvdInputError names the flag)."""
    modes = parse_modes(a.modes)
    if any(m in GATED for m in modes) and not a.gate:
        raise HvdInputError("--modes cache_only, rule, hvd and hvd_cost need --gate GATE_DIR (a folder written by "
                            "`hvd train`)")
    if a.replicas > 1 and importlib.util.find_spec("sglang_router") is None:
        raise HvdInputError("--replicas > 1 needs sglang-router: pip install '.[router]' (from the checkout)")
    traces = tuple(readable_file(t, "") for t in a.traces)
    gate_dir, gate = load_gate(a.gate) if a.gate else (None, None)
    model, drafter_config = verify_settings(a, gate)
    rule_score = rule_score_of(a, gate, modes)
    if "eagle3_adaptive" in modes and model.shape.topk != 1:
        raise HvdInputError(f"--modes eagle3_adaptive: SGLang's --speculative-adaptive drafts chains only (topk 1), "
                            f"but the run's shape is {model.shape.describe()}")
    try:
        profile = load_profile(a.profile)
    except HvdInputError as e:
        raise HvdInputError(f"--profile {e}") from None
    work_dir = json_path = None
    if a.work_dir:
        check_output(a.work_dir, FOLDER, "--work-dir")
        work_dir = os.path.abspath(a.work_dir)
    if a.json:
        check_output(a.json, FILE, "--json")
        json_path = os.path.abspath(a.json)
    reason = harness.sglang_available()
    if reason:
        raise HvdInputError(f"the engine needs the sglang extra ({reason}): run with .venv-sglang/bin/python after "
                            "`bash tests/run --sglang --co -q`")
    return Settings(traces=traces, modes=modes, gate_dir=gate_dir, gate=gate, model=model,
                    drafter_config=drafter_config, rule_score=rule_score, profile=profile,
                    sources=frozenset(s.strip() for s in a.sources.split(",")) if a.sources else None,
                    limit_conversations=a.limit_conversations, concurrency=a.concurrency, replicas=a.replicas,
                    router_policy=a.router_policy, draft_seed=a.draft_seed, work_dir=work_dir, json_path=json_path)


# --------------------------------------------------------------------- conversations, oracle


def first_conversations(records, limit: int | None) -> list[list]:
    """Conversations in file order, turns in order; ``limit``: the first N of each source."""
    kept, per_source = [], collections.Counter()
    for turns in conversations_of(records):
        per_source[turns[0].source] += 1
        if limit is None or per_source[turns[0].source] <= limit:
            kept.append(turns)
    return kept


def load_conversations(s: Settings) -> list[list]:
    records = [r for r in iter_traces(s.traces) if s.sources is None or r.source in s.sources]
    convs = first_conversations(records, s.limit_conversations)
    if not convs:
        raise HvdInputError("no conversations to serve (check TRACES and --sources)")
    return convs


@dataclasses.dataclass(frozen=True, slots=True)
class Oracle:
    """The trace oracle's model folders and what it serves: the conversations less the
    requests it dropped (a prefix another recording continues differently)."""

    models: object  # trace_oracle.OracleModels
    draft_model: object  # hvd_trace_oracle.table.DraftErrorModel
    convs: list[list]
    dropped: frozenset[str]

    @property
    def served(self) -> list:
        return [r for turns in self.convs for r in turns]


def build_oracle(s: Settings, convs: list[list], work: str) -> Oracle:
    shape, curve = s.model.shape, s.model.eagle3
    if shape.topk > 1:
        print(f"{PROG}: calibrating the EAGLE3 stand-in's tree to {curve.tokens(shape.draft_nodes):.3g} tokens "
              f"per verify at {shape.draft_nodes} nodes (~20 s)", file=sys.stderr)
    draft_model = calibrated_draft_model(curve, shape.topk, shape.steps, shape.nodes, seed=s.draft_seed)
    models = write_oracle_models(os.path.join(work, "models"), [r for turns in convs for r in turns], draft_model)
    dropped = frozenset(models.report.dropped)
    kept = [[r for r in turns if r.req_id not in dropped] for turns in convs]
    return Oracle(models, draft_model, [turns for turns in kept if turns], dropped)


def describe_run(s: Settings, oracle: Oracle) -> str:
    served, d = oracle.served, oracle.draft_model
    return (f"{PROG}: {len(oracle.convs)} conversations, {len(served)} requests, "
            f"{sum(len(r.output_ids) for r in served):,} output tokens; verify {s.model.shape.describe()}, "
            f"EAGLE3 curve {s.model.eagle3.text()}; {len(oracle.dropped)} requests dropped (a prefix another "
            f"recording continues differently); EAGLE3 stand-in: per-depth accuracy "
            f"{', '.join(f'{q:.3f}' for q in d.accept_probs)}, runner-up {d.runner_up_prob:g}")


def settings_json(s: Settings, oracle: Oracle) -> dict:
    return {"traces": list(s.traces), "modes": list(s.modes), "gate": s.gate_dir, "shape": s.model.shape.to_json(),
            "eagle3_curve": s.model.eagle3.text(), "concurrency": s.concurrency,
            "limit_conversations": s.limit_conversations, "replicas": s.replicas,
            "router_policy": s.router_policy if s.replicas > 1 else None,
            "rule_score": s.rule_score if "rule" in s.modes else None,
            "profile": s.profile.describe() if "hvd_cost" in s.modes else None,
            "draft_error_model": oracle.draft_model.to_json(), "conversations": len(oracle.convs),
            "requests": len(oracle.served), "dropped_requests": sorted(oracle.dropped)}


# ---------------------------------------------------------------------------- the engine


def oracle_profile(profile: StepProfile, models, work: str) -> str:
    """``profile`` written for the oracle target (a server refuses a profile of another
    model; the oracle stands in for the recorded one): its path."""
    path = os.path.join(work, "profile.json")
    dataclasses.replace(profile, target_model=models.target,
                        note=f"{profile.note} (engine_eval: for the trace oracle {models.target})").write(path)
    return path


def server_args(mode: str, models, shape, gate_dir: str | None, concurrency: int,
                rule_score: float | None = None, profile_path: str | None = None) -> tuple[list, dict, str]:
    base = list(harness.BASE_ARGS)
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
        if mode == "hvd_cost":  # the profile as replay has it: no online refit from the CPU's step times
            args += ["--hvd-profile", profile_path, "--hvd-no-profile-refit"]
        launcher = "sglang_hvd.launch_server"
    if mode == "eagle3_adaptive":
        args += ["--speculative-adaptive"]
    return args, env, launcher


def start_servers(s: Settings, mode: str, models, work: str):
    """(the server to send to, the replicas): one server, or R behind sglang-router."""
    profile = oracle_profile(s.profile, models, work) if mode == "hvd_cost" else None
    args, env, launcher = server_args(mode, models, s.model.shape, s.gate_dir, s.concurrency, s.rule_score, profile)
    replicas = []
    try:
        for _ in range(s.replicas):
            replicas.append(harness.start_server(models.target, args, env, base_args=[], log_dir=work,
                                                 launcher=launcher))
        if s.replicas == 1:
            return replicas[0], replicas
        return harness.start_router([r.url for r in replicas], s.router_policy, log_dir=work), replicas
    except BaseException:
        for r in replicas:
            r.stop()
        raise


class Progress:
    """A line on stderr every 5 s (and at the end): output tokens served so far."""

    def __init__(self, mode: str, total_tokens: int):
        self.mode, self.total = mode, total_tokens
        self.done, self.last, self.started = 0, 0.0, time.time()

    def __call__(self, tokens: int) -> None:
        self.done += tokens
        if time.time() - self.last > 5 or self.done == self.total:
            self.last = time.time()
            print(f"  {self.mode}: {self.done:,}/{self.total:,} tokens ({time.time() - self.started:.0f} s)",
                  file=sys.stderr)


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


def engine_json(tally: SourceTally, mode: str) -> dict:
    t = tally.policy(mode)
    return {"cycles_per_1k": t.to_json()["cycles_per_1k"], "requests": tally.requests, "tokens": tally.tokens,
            "cycles": t.cycles}


def engine_tallies(records, results, mode: str) -> tuple[dict, list]:
    """Per source and overall: requests, output tokens and served cycles (a request's
    prefill forward plus its verifies; one per token without speculation), and the
    requests whose output differs from the recording."""
    sources: dict[str, SourceTally] = collections.defaultdict(SourceTally)
    mismatches = []
    for r in records:
        got, meta = results[r.req_id]
        want = r.output_ids.tolist()
        if got != want:
            k = first_difference(got, want)
            mismatches.append({"req_id": r.req_id, "position": k, "got": got[k:k + 5], "want": want[k:k + 5]})
        tokens = int(meta["completion_tokens"])
        tally = sources[r.source]
        tally.requests += 1
        tally.tokens += tokens
        tally.policy(mode).tokens += tokens
        tally.policy(mode).cycles += tokens if mode == "greedy" else 1 + int(meta.get("spec_verify_ct", 0))
    figures = {name: engine_json(t, mode) for name, t in sources.items()}
    figures["overall"] = engine_json(overall(sources.values()), mode)
    return figures, mismatches


def server_state(infos: list[tuple[str, dict]]) -> dict | None:
    """HVD's own figures from /get_server_info: one server's, or the fleet's totals."""
    status = fleet_status(infos)
    if len(status.ranks) == 1:
        return dict(status.ranks[0].hvd)
    return {**status.totals, "replicas": [dict(r.hvd) for r in status.ranks]} if status.ranks else None


# ----------------------------------------------------------------------------- replay


def policy_figures(result, policy: str) -> dict:
    """``{source: figures, "overall": figures}`` of one policy of a replay result."""
    out = {name: s.policy(policy).to_json() for name, s in result.sources.items()}
    out["overall"] = result.overall.policy(policy).to_json()
    return out


def replay(convs: list[list], mode: str, gate, model: VerifyModel, drafter_config, concurrency: int,
           rule_score: float | None = None, profile: StepProfile | None = None) -> dict:
    """Replay's prediction for the served order: fleet replay (the serving stepper, the
    same conversations ``concurrency`` at a time; cache_only is the served decision at
    threshold -inf, rule the score rule in the gate's place, eagle3_only the stepper
    without a gate, hvd_cost the stepper with the server's cost rule, timed by its profile,
    eagle3_adaptive SGLang's rule) and, for reference, sequential replay (every request
    after the one before; not for the modes that decide per batch)."""
    records = [r for turns in convs for r in turns]
    if mode == "eagle3_adaptive":
        fleet = serve_fleet(convs, AdaptiveEagle3Planner(model.shape.steps), model, concurrency, policy=mode)
        return {"fleet": fleet.to_json(mode), "sequential": None}
    if mode == "hvd_cost":
        rule = CostRule(profile, model.eagle3, served_tiers(None, model.shape), served=model.shape)
        stepper = HVDStepper(create_drafter("native", drafter_config), gate, model.shape, step=rule)
        fleet = serve_fleet(convs, stepper, model, concurrency, policy=mode, profile=profile)
        return {"fleet": fleet.to_json(mode), "sequential": None, "modes": dict(stepper.stats.modes)}
    if mode == "greedy":
        result = simulate(records, create_drafter("native", drafter_config), [GreedyPolicy()], model,
                          prefill_first=True)
        out = policy_figures(result, "greedy")
        return {"fleet": out, "sequential": out}
    if mode == "rule":
        gate = ScoreRule(gate, rule_score)
    rule = {"eagle3_only": None, "cache_only": dataclasses.replace(gate.rule, threshold=-math.inf) if gate else None,
            "rule": gate.rule if gate else None, "hvd": gate.rule if gate else None}[mode]
    stepper = HVDStepper(create_drafter("native", drafter_config), gate if mode != "eagle3_only" else None,
                         model.shape, rule=rule)
    fleet = serve_fleet(convs, stepper, model, concurrency, policy=mode).to_json(mode)
    policy = Eagle3OnlyPolicy() if mode == "eagle3_only" else GatePolicy(gate, rule, mode)
    result = simulate(records, create_drafter("native", drafter_config), [policy], model, prefill_first=True)
    return {"fleet": fleet, "sequential": policy_figures(result, policy.name)}


# ------------------------------------------------------------------------------- a mode


def run_mode(s: Settings, mode: str, oracle: Oracle, work: str) -> dict:
    """Serve every conversation in ``mode``, then replay them; the mode's report."""
    served = oracle.served
    started = time.time()
    server, replicas = start_servers(s, mode, oracle.models, work)
    try:
        results = serve(server, oracle.convs, s.concurrency, Progress(mode, sum(len(r.output_ids) for r in served)))
        infos = [(r.url, r.server_info()) for r in replicas]
    finally:
        for x in {id(x): x for x in [server, *replicas]}.values():
            x.stop()
    engine, mismatches = engine_tallies(served, results, mode)
    predicted = replay(oracle.convs, mode, s.gate, s.model, s.drafter_config, s.concurrency, s.rule_score,
                       s.profile)
    fleet, sequential = predicted["fleet"], predicted["sequential"] or {}
    hvd = server_state(infos)
    report = {
        "engine": engine["overall"], "replay": {"cycles_per_1k": fleet["overall"]["cycles_per_1k"],
                                                "sequential_cycles_per_1k": sequential.get("overall", {}).get(
                                                    "cycles_per_1k")},
        "ratio": engine["overall"]["cycles_per_1k"] / max(fleet["overall"]["cycles_per_1k"], 1e-9),
        "lossless": not mismatches, "mismatches": mismatches[:20], "num_mismatches": len(mismatches),
        "sources": {src: {"engine": engine[src], "replay": fleet[src], "replay_sequential": sequential.get(src)}
                    for src in engine if src != "overall"},
        "server_hvd": hvd, "seconds": time.time() - started,
    }
    if mode == "hvd_cost":
        report["time"] = modelled_time(hvd or {}, fleet["overall"], engine["overall"]["tokens"], predicted["modes"])
    return report


def modelled_time(hvd: dict, fleet: dict, engine_tokens: int, replay_modes: dict) -> dict:
    """The engine's modelled decode time (its stepper's, step by step under the profile)
    beside fleet replay's, per 1,000 output tokens, and the tiers each ran."""
    engine_ms = float(hvd.get("modelled_ms", 0.0))
    engine_per_1k = 1000.0 * engine_ms / max(engine_tokens, 1)
    replay_per_1k = float(fleet.get("time_per_1k", 0.0))
    return {"engine_time_per_1k": engine_per_1k, "replay_time_per_1k": replay_per_1k,
            "ratio": engine_per_1k / replay_per_1k if replay_per_1k else math.nan,
            "engine_tokens_per_s": 1000.0 * engine_tokens / engine_ms if engine_ms else math.nan,
            "replay_tokens_per_s": fleet.get("tokens_per_s"), "engine_modes": hvd.get("modes", {}),
            "replay_modes": replay_modes}


def print_table(report: dict) -> None:
    print(f"\n{'mode':<12} {'source':<12} {'engine c/1k':>11} {'replay c/1k':>11} {'ratio':>6}  lossless"
          "   (replay: fleet replay at the same concurrency)")
    for mode, m in report["modes"].items():
        for src, v in sorted(m["sources"].items()) + [("overall", {"engine": m["engine"], "replay": m["replay"]})]:
            e, r = v["engine"]["cycles_per_1k"], v["replay"]["cycles_per_1k"]
            print(f"{mode:<12} {src:<12} {e:>11.1f} {r:>11.1f} {e / max(r, 1e-9):>6.3f}  "
                  f"{'yes' if m['lossless'] else 'NO (%d)' % m['num_mismatches']}")
        if "time" in m:
            t = m["time"]
            print(f"{mode:<12} {'time/1k ms':<12} {t['engine_time_per_1k']:>11.1f} {t['replay_time_per_1k']:>11.1f} "
                  f"{t['ratio']:>6.3f}  (modelled under the profile: engine tiers {t['engine_modes']}, replay tiers "
                  f"{t['replay_modes']})")


def run(s: Settings) -> int:
    convs = load_conversations(s)
    work = s.work_dir or tempfile.mkdtemp(prefix="hvd_engine_eval_")
    os.makedirs(work, exist_ok=True)
    oracle = build_oracle(s, convs, work)
    print(describe_run(s, oracle), file=sys.stderr)
    report = {"settings": settings_json(s, oracle), "modes": {}}
    for mode in s.modes:
        report["modes"][mode] = run_mode(s, mode, oracle, work)
    print_table(report)
    if s.json_path:
        with open(s.json_path, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if all(m["lossless"] for m in report["modes"].values()) else 1


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    # a SIGTERM (timeout, kill) unwinds like Ctrl-C, so the running server is stopped too
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return run(resolve(a))
    except HvdInputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
