"""Sequential against fleet replay: what concurrency costs in cache hits, and HVD's host time per step.

    python launch/bench/bench_fleet.py dev.jsonl.gz --gate GATE_DIR [--sources swe-agent] \
        [--concurrency 1,8] [--cache-siblings 0,4] [--batch 1,8,32,64] [--profile P] [--warm WARM] \
        [--warm-repeat R] [--max-occurrences K] [--max-scan M] [--global-max-tokens T] \
        [--draft-threads N --clock wall] [--json OUT]

Runs the gate's hvd policy over the traces by sequential replay (``simulate`` with the
first token from the prefill: every request after the one before) and by fleet replay
(sglang_hvd/replay/fleet.py: conversations ``C`` at a time through the serving stepper,
responses entering the global cache as they are generated) at each concurrency, in one process,
and prints cycles per 1,000 tokens and seconds for each, and for fleet replay the serving
stepper's host time per decode step: ``plan`` (drafts, features, gate, row trees, as
``cpu_us_per_step`` reports it) and ``host``, everything the stepper does on the step's
critical path (sync + plan + verified + finish). At a fixed batch, ``plan`` is also split:
``appends`` (the step's new tokens into the drafter), ``drafts`` (its chains and row trees)
and ``decision`` (the rest: features, gate, the cost rule's pick, the row plans). A new
request's prompt is indexed at its prefill (as the server does), off the decode steps:
``prefill``, microseconds per request
(``start`` counts a request first seen at a decode step, none in fleet replay). Fleet
replay at concurrency 1 plans the same rows as sequential replay. ``--cache-siblings``
repeats the fleet runs with each value in the gate's rule. ``--profile P`` times cost-aware
HVD (a cost rule over the served shape's tier ladder under profile P, as a server started
with ``--hvd-profile P`` runs it: the tier picked per step, ``choose_mode`` on the host)
instead of the gate's static shape.

``--batch B1,B2`` adds host time at a fixed batch: every turn of the traces is its own request
(``hvd eval --requests turns``), B at a time, a finished one replaced at once by the next;
only the steps that verify exactly B rows are counted (the run's drain at the end is not).
Per B: those steps, and microseconds per step of each part (mean; p90 of the whole) on this
process's one thread. ``--cache-only`` repeats the fixed batches with SuffixDecoding's stepper
(drafts and row trees, no gate: what ``cache_only`` pays) and prints the step profile's host
term fitted to both (step_profile.fit_host: fixed_ms + (draft_per_row_ms + decide_per_row_ms)
* B), the figures a measured profile takes. Figures are printed, never asserted: compare them
within one run.

``--warm WARM`` (repeatable) starts every fleet and fixed-batch run with the global cache
holding WARM's responses, as a server that has run a while holds earlier responses (up to
the drafter's token budget, oldest evicted first); conversations of TRACES are left out of
it. A cache that holds more text costs more per draft (more occurrences to match and walk)
and drafts more: the host time and cycles of a warm cache are a long-running server's, those
of an empty one its first minutes'. The sequential replay starts empty. ``--warm-repeat R``
fills it with WARM's responses R times over (as a server whose traffic repeats itself holds
each answer several times; the oldest evicted past the budget): every occurrence set R times
larger.

``--max-occurrences K``, ``--max-scan M`` and ``--global-max-tokens T`` replace the gate's
bounds on the drafter's work and cache (a server's ``--hvd-max-occurrences``, ``--hvd-max-scan``,
``--hvd-global-max-tokens``): what smaller bounds save in host time, and what they cost in cycles.

``--draft-threads N`` drafts each step's rows on N threads (a server's ``--hvd-draft-threads``;
the same drafts, plans and cycles): time it with ``--clock wall``, as the CPU clock counts
the calling thread alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence

import numpy as np

from sglang_hvd.cli.common import int_in
from sglang_hvd.cli.options import add_bound_flags, bounds_from_flags, bounds_of
from sglang_hvd.cost_rule import CostRule, StepMode
from sglang_hvd.decision import BatchPlan
from sglang_hvd.drafter import create_drafter
from sglang_hvd.drafter.protocol import MAX_DRAFT_THREADS
from sglang_hvd.errors import HvdInputError
from sglang_hvd.gate import Gate
from sglang_hvd.replay.fleet import conversations_of, serve_fleet
from sglang_hvd.replay.policies import GatePolicy
from sglang_hvd.replay.simulate import simulate
from sglang_hvd.serving.stepper import HVDStepper
from sglang_hvd.step_profile import fit_host, load_profile
from sglang_hvd.tiers import Tier, served_tiers
from sglang_hvd.trace import iter_traces

MAX_WARM_REPEAT = 100
PARTS = ("start", "sync", "plan", "verified", "finish")
# plan's own parts: the step's appends (the tokens synced since the last step, into the drafter),
# its drafts (chains and row trees: the drafter's batch calls) and the decision (the rest: features,
# gate, the cost rule's pick, the row plans)
PLAN_PARTS = ("appends", "drafts", "decision")


CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


class _TimedDrafter:
    """A stepper's drafter, its appends and batch drafts inside a plan timed into ``timed``'s
    plan parts (every other call passed through untimed)."""

    def __init__(self, drafter, timed: TimedStepper):
        self._drafter, self._timed = drafter, timed

    def __getattr__(self, name):
        return getattr(self._drafter, name)

    def _call(self, part: str, name: str, *args):
        timed = self._timed
        if not timed.planning:
            return getattr(self._drafter, name)(*args)
        t = timed.clock()
        try:
            return getattr(self._drafter, name)(*args)
        finally:
            timed._add(part, t)
            timed.inner_reads += 2  # inside plan's own timing

    def append_batch(self, *args):
        return self._call("appends", "append_batch", *args)

    def speculate_step(self, *args):
        return self._call("drafts", "speculate_step", *args)

    def speculate_arrays(self, *args):
        return self._call("drafts", "speculate_arrays", *args)

    def speculate_rows(self, *args):
        return self._call("drafts", "speculate_rows", *args)


class TimedStepper:
    """The serving stepper behind fleet replay's Planner interface, each call timed by
    ``clock``: per verify step, the time of the starts, syncs and finishes since the step
    before, of its plan (and within it of its appends and drafts: PLAN_PARTS) and of its
    verified, and its batch size."""

    def __init__(self, stepper: HVDStepper, clock=time.thread_time):
        self.stepper = stepper
        stepper.drafter = _TimedDrafter(stepper.drafter, self)
        self.planning = False  # inside plan: the drafter's appends and drafts are timed
        self.inner_reads = 0  # clock reads of those timings, inside the plan's (taken off it)
        self.clock = clock
        self.host = stepper.host
        self.extend = stepper.extend
        # what reading the clock itself adds to a timed call (a CPU-time read is a system call,
        # ~1 us here): taken off every call, so that 64 syncs a step do not count 64 of them
        self._overhead_s = min(-clock() + clock() for _ in range(1000))
        self._pending = dict.fromkeys(PARTS + PLAN_PARTS, 0.0)
        self.batch: list[int] = []
        self.parts_us: dict[str, list[float]] = {p: [] for p in PARTS + PLAN_PARTS}
        self.prefill_us: list[float] = []  # each new request's indexing at its prefill

    def _add(self, part: str, start: float) -> None:
        self._pending[part] += max(self.clock() - start - self._overhead_s, 0.0) * 1e6

    def sync(self, rid: str, prompt_ids, output_ids, source: str | None = None) -> None:
        if rid in self.stepper:
            part = "sync"
        else:  # a new request's first sync indexes its prompt: at its prefill (fleet replay, the server) or not
            part = "start" if len(output_ids) else "prefill"
        t = self.clock()
        self.stepper.sync(rid, prompt_ids, output_ids, source)
        if part == "prefill":  # off the decode steps: timed apart
            self.prefill_us.append(max(self.clock() - t - self._overhead_s, 0.0) * 1e6)
        else:
            self._add(part, t)

    def finish(self, rid: str) -> None:
        t = self.clock()
        self.stepper.finish(rid)
        self._add("finish", t)

    def plan(self, rids: Sequence[str]) -> BatchPlan:
        pending = self._pending
        before = {p: pending[p] for p in ("plan", "appends", "drafts")}
        self.planning, self.inner_reads = True, 0
        t = self.clock()
        try:
            plans = self.stepper.plan(rids)
        finally:
            self._add("plan", t)
            self.planning = False
        pending["plan"] = max(pending["plan"] - self.inner_reads * self._overhead_s * 1e6, before["plan"])
        inner = sum(pending[p] - before[p] for p in ("appends", "drafts"))
        pending["decision"] += max(pending["plan"] - before["plan"] - inner, 0.0)
        self.batch.append(len(rids))
        return plans

    def verified(self, rids: Sequence[str], accepts: Sequence[int]) -> None:
        t = self.clock()
        self.stepper.verified(rids, accepts)
        self._add("verified", t)
        for p in PARTS + PLAN_PARTS:  # a step's record closes with its verified
            self.parts_us[p].append(self._pending[p])
            self._pending[p] = 0.0

    def per_step_us(self, batch: int | None = None) -> dict[str, float]:
        """Mean microseconds per step of each part and of all ("host"), their p90 ("host_p90")
        and the steps counted: every step, or those of exactly ``batch`` rows."""
        sizes = np.asarray(self.batch)
        keep = np.ones(len(sizes), bool) if batch is None else sizes == batch
        parts = {p: np.asarray(v)[keep] for p, v in self.parts_us.items()}
        host = sum(parts[p] for p in PARTS) if keep.any() else np.zeros(0)
        out = {p: float(v.mean()) if len(v) else float("nan") for p, v in parts.items()}
        out["host"] = float(host.mean()) if len(host) else float("nan")
        out["host_p90"] = float(np.percentile(host, 90)) if len(host) else float("nan")
        out["steps"] = int(keep.sum())
        # not per step: a new request's prompt indexed at its prefill, per request (every one of the run)
        out["prefill_per_request"] = float(np.mean(self.prefill_us)) if self.prefill_us else float("nan")
        return out


def fill_cache(drafter, records: Sequence) -> None:
    """The records' responses into ``drafter``'s global cache, in their order (each started,
    its response appended, finished: a finished response stays cached, within the drafter's
    token budget). Only the prompt's last token is indexed: a prompt stays in its request's
    own index, which finishing frees."""
    for i, r in enumerate(records):
        rid = f"warm-{i}"
        drafter.start_request(rid, r.prompt_ids[-1:])
        drafter.append_batch([rid], [r.output_ids])
        drafter.finish_request(rid)


def _ints(p: argparse.ArgumentParser, flag: str, text: str, least: int) -> list[int]:
    try:
        values = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        p.error(f"{flag}: expected integers like 1,8, got {text!r}")
    if not values or min(values) < least:
        p.error(f"{flag}: every value must be >= {least}")
    return values


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", nargs="+", metavar="TRACES")
    p.add_argument("--gate", required=True, metavar="GATE_DIR", help="a gate from `hvd train`")
    p.add_argument("--sources", metavar="S1,S2", help="only these sources (default: all)")
    p.add_argument("--concurrency", default="1,8", metavar="C1,C2",
                   help="fleet concurrencies, conversations in flight (default: %(default)s; 0: no such runs)")
    p.add_argument("--cache-siblings", metavar="S1,S2",
                   help="fleet runs with each cache siblings value (default: the gate's)")
    p.add_argument("--limit", type=int, metavar="N", help="only the first N requests (after --sources)")
    p.add_argument("--batch", metavar="B1,B2",
                   help="host time at these fixed batch sizes, every turn its own request (e.g. 1,8,32,64)")
    p.add_argument("--clock", choices=tuple(CLOCKS), default="cpu",
                   help="host time as this thread's CPU time (cpu: what a core of its own would spend, without the "
                        "waits of a shared machine) or as elapsed time (wall) (default: %(default)s)")
    p.add_argument("--no-sequential", action="store_true", help="skip the sequential replay")
    p.add_argument("--cache-only", action="store_true",
                   help="with --batch: also time SuffixDecoding's stepper (no gate) and fit the profile's host term")
    p.add_argument("--profile", metavar="P",
                   help="time cost-aware HVD: a cost rule over the served shape's tier ladder under this step-time "
                        "profile (a shipped estimate such as qwen3-8b-h200, or a profile.json) (default: the gate's "
                        "static shape)")
    p.add_argument("--warm", action="append", metavar="WARM",
                   help="traces whose responses fill the global cache before each fleet and fixed-batch run "
                        "(conversations of TRACES left out; repeatable) (default: an empty cache)")
    p.add_argument("--warm-repeat", type=int_in(1, MAX_WARM_REPEAT), default=1, metavar="R",
                   help=f"fill the global cache with the --warm responses R times over, 1 to {MAX_WARM_REPEAT} "
                        f"(default: %(default)s)")
    p.add_argument("--draft-threads", type=int, default=1, metavar="N",
                   help=f"threads each step's drafts run on, 1 to {MAX_DRAFT_THREADS} (needs --clock wall when more "
                        f"than 1) (default: %(default)s)")
    p.add_argument("--json", metavar="OUT", help="write the figures here")
    add_bound_flags(p)
    a = p.parse_args(argv)
    if a.warm_repeat > 1 and not a.warm:
        p.error("--warm-repeat needs --warm")
    if not 1 <= a.draft_threads <= MAX_DRAFT_THREADS:
        p.error(f"--draft-threads: must be in [1, {MAX_DRAFT_THREADS}], got {a.draft_threads}")
    if a.draft_threads > 1 and a.clock != "wall":
        p.error("--draft-threads above 1 needs --clock wall: the cpu clock counts the calling thread alone, not the "
                "drafts' other threads")
    levels = [] if a.concurrency.strip() == "0" else _ints(p, "--concurrency", a.concurrency, 1)
    profile = None
    if a.profile is not None:  # refused before the gate and traces are read
        try:
            profile = load_profile(a.profile)
        except HvdInputError as e:
            p.error(f"--profile: {e}")
    batches = _ints(p, "--batch", a.batch, 1) if a.batch else []
    sources = {s.strip() for s in a.sources.split(",")} if a.sources else None
    gate = Gate(a.gate)
    drafter_config = bounds_from_flags(a, gate.spec.drafter)
    siblings = _ints(p, "--cache-siblings", a.cache_siblings, 0) if a.cache_siblings else [gate.rule.cache_siblings]
    rules = [dataclasses.replace(gate.rule, cache_siblings=v) for v in siblings]
    model = gate.spec.verify
    if a.limit is not None and a.limit < 1:
        p.error(f"--limit: must be >= 1, got {a.limit}")

    def read(paths: list[str], keep, flag: str = "") -> list:
        try:
            return [r for r in iter_traces(paths) if keep(r)]
        except (OSError, HvdInputError) as e:  # a missing or malformed file: one line, no traceback
            p.error(f"{flag}{e}")

    records = read(a.traces, lambda r: sources is None or r.source in sources)[: a.limit]
    if not records:
        p.error("no records (check TRACES and --sources)")
    warm = []
    if a.warm:
        timed_convs = {r.conv_id for r in records}
        warm = read(a.warm, lambda r: r.conv_id not in timed_convs, "--warm: ") * a.warm_repeat
        if not warm:
            p.error("--warm: no responses outside the conversations of TRACES")
        other = next((r.tokenizer for r in warm if r.tokenizer != records[0].tokenizer), None)
        if other is not None:
            p.error(f"--warm: its token ids are {other.name}'s, TRACES' {records[0].tokenizer.name}'s (one tokenizer "
                    f"for both)")

    cost = None if profile is None else CostRule(profile, model.eagle3, served_tiers(None, model.shape),
                                                 served=model.shape)

    def stepper(rule, scorer=gate, step=cost) -> TimedStepper:
        drafter = create_drafter("native", drafter_config, threads=a.draft_threads)
        fill_cache(drafter, warm)
        return TimedStepper(HVDStepper(drafter, scorer, model.shape, rule=rule, step=step), CLOCKS[a.clock])

    rows = []
    if not a.no_sequential:
        t = time.perf_counter()
        result = simulate(records, create_drafter("native", drafter_config), [GatePolicy(gate, gate.rule)], model,
                          prefill_first=True)
        rows.append((f"sequential (S {gate.rule.cache_siblings})",
                     result.overall.policy("hvd").to_json()["cycles_per_1k"], time.perf_counter() - t, None))
    for rule in rules:
        for c in levels:
            timed = stepper(rule)
            t = time.perf_counter()
            fleet = serve_fleet(conversations_of(records), timed, model, c)
            rows.append((f"fleet x{c} (S {rule.cache_siblings})",
                         fleet.overall.policy("hvd").to_json()["cycles_per_1k"],
                         time.perf_counter() - t, timed.per_step_us()))
    fixed = []
    for rule in rules:
        for b in batches:
            timed = stepper(rule)
            fleet = serve_fleet([[r] for r in records], timed, model, b)
            fixed.append((f"batch {b} (S {rule.cache_siblings})", timed.per_step_us(b),
                          fleet.overall.policy("hvd").to_json()["cycles_per_1k"]))
    drafts_only = []
    if a.cache_only:
        for b in batches:
            timed = stepper(gate.rule, None, StepMode(Tier(model.shape), eagle3=False))
            fleet = serve_fleet([[r] for r in records], timed, model, b)
            drafts_only.append((f"cache_only batch {b}", timed.per_step_us(b),
                                fleet.overall.policy("hvd").to_json()["cycles_per_1k"]))
    decision = "static shape" if cost is None else f"cost-aware under {a.profile}, tiers " + ",".join(
        t.name for t in cost.tiers)
    threads = "" if a.draft_threads == 1 else f", drafts on {a.draft_threads} threads"
    print(f"{len(records)} requests, verify {model.shape.describe()}, gate {a.gate}, hvd: {decision}{threads}")
    c = drafter_config
    whose = "the gate's" if c == gate.spec.drafter else "set by flags"
    print(f"drafter bounds ({whose}): max_occurrences {c.max_occurrences:,}, max_scan {c.scan_limit:,}, "
          f"global_max_tokens {c.global_max_tokens:,}")
    warm_tokens = sum(len(r.output_ids) for r in warm)
    if warm:
        times = "" if a.warm_repeat == 1 else f", {a.warm_repeat} times over"
        kept = "" if warm_tokens <= c.global_max_tokens else f"; the oldest evicted past {c.global_max_tokens:,}"
        print(f"warm cache: {len(warm)} responses ({warm_tokens:,} tokens) from "
              f"{', '.join(a.warm)}{times} in the global cache at each fleet and fixed-batch run's start{kept}")
    if rows:
        print(f"{'replay':<22} {'hvd cycles/1k':>13} {'seconds':>8} {'plan us/step':>12} {'host us/step':>12}"
              f"  ({a.clock} time)")
        for name, cycles, seconds, us in rows:
            plan, host = ("-", "-") if us is None else (f"{us['plan']:.0f}", f"{us['host']:.0f}")
            print(f"{name:<22} {cycles:>13.1f} {seconds:>8.1f} {plan:>12} {host:>12}")
    if fixed:
        print(f"\nhost time at a fixed batch ({a.clock} time; turns as requests; us per step, mean; steps of exactly "
              f"B rows; host = start + sync + plan + verified + finish; plan = appends + drafts + decision; prefill: "
              f"us per request, off the decode steps)")
        print(f"{'batch':<18} {'steps':>6} " + " ".join(f"{p:>9}" for p in PARTS) + f" {'host':>9} {'host p90':>9}"
              f" {'cycles/1k':>9} {'prefill':>9} " + " ".join(f"{p:>9}" for p in PLAN_PARTS))
        for name, us, cycles in fixed + drafts_only:
            print(f"{name:<18} {us['steps']:>6} " + " ".join(f"{us[p]:>9.0f}" for p in PARTS)
                  + f" {us['host']:>9.0f} {us['host_p90']:>9.0f} {cycles:>9.1f} {us['prefill_per_request']:>9.0f} "
                  + " ".join(f"{us[p]:>9.0f}" for p in PLAN_PARTS))
    host_cost = None
    if drafts_only and len(batches) >= 2:
        hvd_rows = fixed[-len(batches):]  # the gate's own rule
        host_cost = fit_host(batches, [us["host"] / 1e3 for _, us, _ in drafts_only],
                             [us["host"] / 1e3 for _, us, _ in hvd_rows])
        print(f"\nprofile host term ({a.clock} time): fixed {host_cost.fixed_ms:.3f} ms, drafts "
              f"{host_cost.draft_per_row_ms:.4f} ms/row, decision {host_cost.decide_per_row_ms:.4f} ms/row")
    if a.json:
        out = {name: {"cycles_per_1k": c, "seconds": s, "stepper_us_per_step": None if u is None else u["plan"],
                      "host_us_per_step": u} for name, c, s, u in rows}
        out["fixed_batch"] = {name: {**us, "cycles_per_1k": c} for name, us, c in fixed + drafts_only}
        if host_cost is not None:
            out["host_cost"] = dataclasses.asdict(host_cost)
        out["draft_threads"] = a.draft_threads
        out["drafter_bounds"] = bounds_of(c)
        if warm:
            out["warm_cache"] = {"traces": a.warm, "repeat": a.warm_repeat, "responses": len(warm),
                                 "tokens": warm_tokens}
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
