"""``hvd profile --url URL --timings PATH -o PROFILE``: measure a step-time profile on your
own hardware, model pair and SGLang flags.

The server runs the ``--hvd-tier-cycle`` diagnostic (every decode step the next tier, with
and without EAGLE3's draft) and writes each step's measured parts to ``--hvd-timings
PATH`` (serving/step_timing.py). This command sends it load over a grid of concurrencies
and prompt lengths, reads the steps it timed, takes the median of each grid cell (batch,
row width, draft steps, context within a factor of 2; a cell of fewer than --min-steps
steps, a batch size seen only while requests arrive or finish, is left out), fits the
profile's constants to the cells (step_profile.fit_*), and checks the fit on held-back cells: a diagonal of the
(batch, width) grid is left out of a first fit and predicted by it. The profile written is
fitted to every cell; its ``fit_error`` holds the held-back errors.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import random
import urllib.error
import urllib.request

from ..collect import Client, CollectOptions
from ..errors import HvdInputError
from ..jsonl import write_json
from ..report import format_table, progress
from ..serving.step_timing import StepTiming, cell_medians, errors, fit_profile, fittable, read_timings, untimed
from ..step_profile import DraftCost, ForwardCost, HostCost, StepProfile
from .common import FILE, add_examples, add_json_flag, cli_entry, declare_outputs, int_in, int_list_in, seconds

HOLD_BACK_EVERY = 4  # every 4th (batch, width) pair is held back from the first fit


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hvd profile",
        description=("Measure a step-time profile (what a decode step costs by batch, row width and context) on your "
                     "hardware, model pair and SGLang flags, for cost-aware verification (--hvd-profile). Start the "
                     "server with --hvd-tier-cycle (every decode step the next tier, with and without EAGLE3's draft) "
                     "and --hvd-timings PATH (each step's measured parts); this command sends it load at each "
                     "concurrency and prompt length, fits the profile to the median of each grid cell, checks it on "
                     "held-back cells (a diagonal of the batch x width grid), and writes the profile fitted to every "
                     "cell, with the held-back errors as its fit_error. Then restart the server with --hvd-profile "
                     "PROFILE (without --hvd-tier-cycle)."))
    p.add_argument("--url", required=True, metavar="URL",
                   help="an HVD server started with --hvd-tier-cycle and --hvd-timings PATH, e.g. "
                        "http://127.0.0.1:30000")
    p.add_argument("--timings", required=True, metavar="PATH", help="the file that server writes (its --hvd-timings)")
    p.add_argument("-o", "--output", required=True, metavar="PROFILE", help="the profile JSON to write")
    p.add_argument("--concurrency", type=int_list_in(1, 4096), default=(1, 2, 4, 8), metavar="C,...",
                   help="requests in flight, one level after another (default: 1,2,4,8); at least 3 levels")
    p.add_argument("--prompt-tokens", type=int_list_in(1, 1_000_000), default=(64, 512), metavar="P,...",
                   help="prompt lengths in tokens, each at every concurrency (default: 64,512); keep "
                        "concurrency x (prompt + new tokens) within the server's KV pool")
    p.add_argument("--new-tokens", type=int_in(2, 100_000), default=48, metavar="N",
                   help="tokens each request generates (EOS ignored) (default: %(default)s)")
    p.add_argument("--rounds", type=int_in(1, 100), default=2, metavar="R",
                   help="send the whole grid R times, one round after another: a cell's steps then come from R "
                        "stretches of time, so a minute when the machine ran slower (a neighbour, clocks) moves every "
                        "cell a little instead of a few cells a lot (default: %(default)s)")
    p.add_argument("--min-steps", type=int_in(1, 10_000), default=3, metavar="K",
                   help="leave out grid cells timed fewer than K steps: batch sizes between two concurrency levels, "
                        "seen for a step or two while requests arrive or finish, whose median is one noisy sample "
                        "(default: %(default)s)")
    p.add_argument("--name", metavar="NAME", help="the profile's name (default: the output file's stem)")
    p.add_argument("--target-model", metavar="M", help="target model named in the profile (default: the server's "
                                                       "--model-path; the server refuses a profile of another model)")
    p.add_argument("--draft-model", metavar="D", help="draft model (default: the server's draft model path)")
    p.add_argument("--hardware", default="unknown", metavar="H", help="what it ran on, e.g. 'NVIDIA H200' "
                                                                      "(default: %(default)s)")
    p.add_argument("--timeout", type=seconds, default=600.0, metavar="SECONDS",
                   help="seconds per request (default: %(default)s)")
    p.add_argument("--seed", type=int_in(0, 2**31 - 1), default=0, metavar="S",
                   help="seed of the prompts' random token ids (default: %(default)s)")
    add_json_flag(p)
    declare_outputs(p, output=FILE)
    add_examples(p, "hvd profile --url http://127.0.0.1:30000 --timings /tmp/steps.jsonl -o profile.json",
                 "hvd profile --url http://127.0.0.1:30000 --timings /tmp/steps.jsonl -o profile.json --concurrency "
                 "1,2,4,8,16,32 --prompt-tokens 256,2048 --hardware H200")
    return p


def server_info(url: str, timeout_s: float) -> dict:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/server_info", timeout=timeout_s) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as e:
        raise HvdInputError(f"{url}: cannot read /server_info ({getattr(e, 'reason', e)})") from None


def hvd_block(info: dict) -> dict:
    for state in info.get("internal_states") or []:
        if isinstance(state, dict) and isinstance(state.get("hvd"), dict):
            return state["hvd"]
    return {}


def send_load(url: str, concurrency, prompt_tokens, new_tokens: int, timeout_s: float, seed: int,
              rounds: int = 1) -> int:
    """Every (prompt length, concurrency) level in turn, ``c`` requests at once, the whole
    grid ``rounds`` times (new prompts each time); returns the tokens generated."""
    rng = random.Random(seed)
    levels = [(p, c) for _ in range(rounds) for p in prompt_tokens for c in concurrency]
    client = Client(url, CollectOptions(concurrency=max(concurrency), max_new_tokens=new_tokens, timeout_s=timeout_s,
                                        retries=1))
    generated = 0
    with progress(total=sum(c for _, c in levels), desc="profile load", unit="req") as bar, \
            concurrent.futures.ThreadPoolExecutor(max_workers=max(concurrency)) as pool:
        for p, c in levels:
            prompts = [[rng.randrange(100, 5000) for _ in range(p)] for _ in range(c)]
            for out in pool.map(lambda ids: client.generate(ids, ignore_eos=True), prompts):
                generated += len(out.get("output_ids") or [])
                bar.update(1)
    return generated


def held_back_pairs(cells: list[StepTiming]) -> set[tuple[int, int]]:
    """The (batch, width) pairs left out of the first fit: a diagonal of the grid, (i + j) %
    HOLD_BACK_EVERY == HOLD_BACK_EVERY - 1 for the i-th batch and j-th width, so every batch
    and every width keeps cells in the fit (the held-back ones are interpolated, not
    extrapolated)."""
    batches = sorted({c.batch for c in cells})
    widths = sorted({c.tokens_per_row for c in cells})
    return {(b, n) for i, b in enumerate(batches) for j, n in enumerate(widths)
            if (i + j) % HOLD_BACK_EVERY == HOLD_BACK_EVERY - 1}


def fit_checked(cells: list[StepTiming], base: StepProfile, name: str) -> tuple[StepProfile, dict[str, float]]:
    """The profile fitted to every cell, and its held-back errors per term."""
    held = held_back_pairs(cells)
    kept = [c for c in cells if (c.batch, c.tokens_per_row) not in held]
    missing = {"verify", "draft", "extend", "host"} - fittable(kept)
    if missing:
        raise HvdInputError(f"the timed steps do not span enough shapes to fit {', '.join(sorted(missing))} (verify: 3 "
                            "batch x width values; draft: 2 EAGLE3 step counts; extend: a timed extend; host: 2 batch "
                            "sizes): add --concurrency levels, and serve several tiers (--hvd-tiers) with "
                            "--hvd-tier-cycle")
    held_back = errors(fit_profile(base, kept, name), [c for c in cells if (c.batch, c.tokens_per_row) in held])
    profile = fit_profile(base, cells, name)
    return profile, held_back


@cli_entry("profile", build_parser)
def main(args: argparse.Namespace) -> int:
    if len(args.concurrency) < 3:
        raise HvdInputError("--concurrency: name at least 3 levels (the verify fit needs 3 batch sizes), e.g. 1,2,4")
    info = server_info(args.url, args.timeout)
    hvd = hvd_block(info)
    if hvd.get("tier_rule") != "cycle":
        found = f"tier rule {hvd.get('tier_rule')}" if hvd else "no HVD worker"
        raise HvdInputError(f"{args.url} is not running the tier-cycle diagnostic ({found}): start it with "
                            "--hvd-gate G --hvd-tier-cycle --hvd-timings PATH")
    skip = sum(1 for _ in open(args.timings, encoding="utf-8")) if os.path.exists(args.timings) else 0
    generated = send_load(args.url, args.concurrency, args.prompt_tokens, args.new_tokens, args.timeout, args.seed,
                          args.rounds)
    timings = read_timings(args.timings, skip)
    if not timings:
        raise HvdInputError(f"{args.timings}: the server timed no decode steps under the load (is it the file this "
                            "server writes with --hvd-timings?)")
    cells = cell_medians(timings, args.min_steps)
    left_out = len(cell_medians(timings)) - len(cells)
    name = args.name or os.path.splitext(os.path.basename(args.output))[0]
    base = StepProfile(name=name, kind="measured", hardware=args.hardware,
                       target_model=args.target_model or str(info.get("model_path") or "unknown"),
                       draft_model=args.draft_model or str(info.get("speculative_draft_model_path") or "unknown"),
                       verify=ForwardCost(0.0, 0.0, 0.0, 0.0), eagle3=DraftCost(0.0, 0.0, 0.0, 0.0, 0.0),
                       hvd_cpu=HostCost(0.0, 0.0, 0.0))
    profile, held_back = fit_checked(cells, base, name)
    rest_ms, rest_share, walled = untimed(timings)
    profile = dataclasses.replace(
        profile, fit_error=held_back, untimed_ms=rest_ms if walled else 0.0,
        note=f"hvd profile: {len(timings):,} decode steps in {len(cells)} cells of >= {args.min_steps} steps "
             f"({left_out} smaller cells left out), {len(args.concurrency)} concurrencies x {len(args.prompt_tokens)} "
             f"prompt lengths x {args.rounds} rounds; fit_error: held-back cells (a diagonal of the batch x width "
             "grid)")
    profile.write(args.output)
    rows = [(term, f"{100 * e:.1f}%") for term, e in held_back.items()]
    print(format_table(("term", "held-back error"), rows,
                       title=f"\n{len(timings):,} steps timed ({generated:,} tokens generated), {len(cells)} cells "
                             f"of >= {args.min_steps} steps ({left_out} smaller left out)"))
    if walled:
        print(f"untimed: {rest_ms:.2f} ms a step, {100 * rest_share:.1f}% of its wall time (median of {walled:,} "
              "steps run back to back: the scheduler and SGLang's speculative path around the forwards, paid at "
              "every tier; in the profile as untimed_ms)")
    print(f"wrote {args.output}: {profile.describe()}")
    if args.json:
        write_json(args.json, {"profile": profile.to_json(), "held_back_error": held_back, "steps": len(timings),
                               "cells": len(cells), "cells_left_out": left_out,
                               "untimed": {"ms": rest_ms, "share_of_wall": rest_share, "steps": walled}
                               if walled else None})
    return 0
