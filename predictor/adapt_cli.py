"""``hvd adapt RECORDED... --url URL --gate DIR --base TRACES... --tokenizer DIR -o NEW_GATE``:
retrain the gate from what a server served, and swap it in only if replay says it is better.

The loop (README "Adapting the gate to your traffic"): a server records its traffic
(``--hvd-record-traces``), ``hvd adapt`` trains a candidate gate on the base training set
plus the recorded traces except the most recent ones, replays both the serving gate and
the candidate over those held-back recent traces (fleet replay, the serving stepper,
``--concurrency`` requests at once), and pushes the candidate through the server's hot
gate swap (``POST /hvd/update_gate``) only if its verify cycles per 1k tokens are lower
by at least ``--min-gain``. Both figures are printed (and written with ``--json``).

The candidate keeps what the swap checks against the served gate: the verify shape, the
cache drafter's settings and the tokenizer are the serving gate's. Both gates are replayed
with the decision settings the server serves them with: where the server's threshold,
EAGLE3 reserve or cache siblings differ from the serving gate's own (an explicit
``--hvd-threshold`` ...), that value applies to both, as it will after the swap.

Recorded files are read in order (each DP rank writes its own, in the order its requests
finished): the last ``--held-back`` fraction of each file is the held-back set.
"""

from __future__ import annotations

import argparse
import os

from sglang_hvd.cli.common import (
    GATE_FOLDER,
    MAX_EPOCHS,
    add_examples,
    add_json_flag,
    add_skip_invalid_flag,
    cli_entry,
    declare_outputs,
    float_in,
    int_in,
    seconds,
    seed,
    server_url,
)
from sglang_hvd.cli.status import server_info, update_gate
from sglang_hvd.errors import HvdInputError
from sglang_hvd.jsonl import write_json
from sglang_hvd.report import format_table
from sglang_hvd.serving.status import fleet_status
from sglang_hvd.trace import ReadReport, iter_traces, single_tokenizer

from .train_cli import check_tokenizer, training

held_back_share = float_in(0.0, 1.0, low_open=True, high_open=True, what="a fraction")  # (0, 1)
gain_share = float_in(0.0, 1.0, high_open=True, what="a fraction")  # [0, 1)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hvd adapt",
        description=(
            "Retrain the gate from a server's recorded traffic and swap it in if replay says it is better: train a "
            "candidate on --base plus the recorded traces (--hvd-record-traces files) but the most recent "
            "--held-back of each file, replay the serving gate and the candidate over those held-back traces (fleet "
            "replay at --concurrency), print both figures, and push the candidate to the server (POST "
            "/hvd/update_gate: every rank swaps or none) only if its verify cycles per 1k tokens are lower by at "
            "least --min-gain. The candidate keeps the serving gate's verify shape, drafter settings and tokenizer; "
            "both are replayed with the decision settings the server serves them with. Exit status 0 when the "
            "candidate was pushed or the serving gate kept as better, 1 when the server refused the push. Needs "
            "the `train` extra (torch, onnx)."
        ),
    )
    p.add_argument("recorded", nargs="+", metavar="RECORDED", help="traces the server recorded (one file per DP rank)")
    p.add_argument("--url", required=True, metavar="URL", type=server_url, help="the HVD server, e.g. http://127.0.0.1:30000")
    p.add_argument("--gate", required=True, metavar="DIR", help="the gate directory the server serves (its digest is "
                                                                 "checked against the server's)")
    p.add_argument("--base", nargs="+", required=True, metavar="TRACES",
                   help="the base training set (token traces, e.g. what the serving gate was trained on)")
    p.add_argument("--tokenizer", required=True, metavar="DIR", help="the tokenizer of every trace file")
    p.add_argument("-o", "--output", required=True, metavar="NEW_GATE", help="the candidate gate directory to write")
    p.add_argument("--held-back", type=held_back_share, default=0.2, metavar="F",
                   help="fraction of each recorded file, its most recent requests, kept for the comparison "
                        "(default: %(default)s)")
    p.add_argument("--concurrency", type=int_in(1, 4096), default=8, metavar="C",
                   help="requests replayed at once in the comparison (default: %(default)s)")
    p.add_argument("--min-gain", type=gain_share, default=0.0, metavar="F",
                   help="push only if the candidate's cycles per 1k tokens are below the serving gate's by this "
                        "fraction (default: %(default)s: any gain)")
    p.add_argument("--epochs", type=int_in(1, MAX_EPOCHS), default=40, metavar="N",
                   help="most training epochs (default: %(default)s)")
    p.add_argument("--seed", type=seed, default=0, metavar="N", help="training and split seed (default: %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="train and compare, push nothing")
    p.add_argument("--timeout", type=seconds, default=300.0, metavar="SECONDS",
                   help="per request to the server (default: %(default)s)")
    add_skip_invalid_flag(p)
    add_json_flag(p)
    declare_outputs(p, output=GATE_FOLDER)
    add_examples(
        p,
        "hvd adapt served.jsonl --url http://127.0.0.1:30000 --gate gate --base dev.jsonl.gz --tokenizer qwen3 "
        "-o gate_v2",
        "hvd adapt served.dp0.jsonl served.dp1.jsonl --url http://10.0.0.5:30000 --gate gate --base dev.jsonl.gz "
        "--tokenizer qwen3 -o gate_v2 --min-gain 0.02 --json adapt.json",
    )
    return p


def served_rule(url: str, timeout_s: float) -> tuple[str, dict]:
    """The gate digest every rank of ``url`` serves, and its decision settings as served."""
    status = fleet_status([(url, server_info(url, timeout_s))])
    if not status.ranks:
        raise HvdInputError(f"{url} runs no HVD worker: start it with python -m sglang_hvd.launch_server "
                            "(or SGLANG_HVD_ENABLE=1)")
    digests = {r.hvd.get("gate_digest") for r in status.ranks}
    if len(digests) != 1:
        raise HvdInputError(f"{url}: its ranks serve different gates ({', '.join(sorted(map(str, digests)))}); "
                            "finish that roll-out first")
    hvd = status.ranks[0].hvd
    return digests.pop(), {"threshold": float(hvd["gate_threshold"]), "eagle_reserve": int(hvd["gate_eagle_reserve"]),
                           "cache_siblings": int(hvd["gate_cache_siblings"])}


def overrides(own, served: dict) -> dict:
    """The server's decision settings that differ from the serving gate's own rule (its
    explicit flags): they apply to any gate it serves."""
    return {k: v for k, v in served.items() if getattr(own, k) != v}


def held_back_split(paths, fraction: float, skip_invalid: bool, report: ReadReport):
    """(training records, held-back records): the last ``fraction`` of each file's records
    (at least one) held back, in file order."""
    train, held = [], []
    for path in paths:
        records = list(iter_traces([path], skip_invalid=skip_invalid, report=report))
        if len(records) < 2:
            raise HvdInputError(f"{path}: {len(records)} recorded request(s); adapting needs at least 2 per file "
                                "(some to learn from, some to compare on)")
        cut = len(records) - max(1, round(fraction * len(records)))
        train += records[:cut]
        held += records[cut:]
    return train, held


def replay_figures(gate, records, concurrency: int) -> dict:
    """Fleet replay of ``records`` (each its own request, in order) with ``gate`` at its
    verify shape: the overall figures of policy ``hvd@SHAPE``."""
    from sglang_hvd.replay.by_load import LoadSettings, make_planner
    from sglang_hvd.replay.fleet import serve_fleet
    from sglang_hvd.step_profile import load_profile
    from sglang_hvd.tiers import Tier

    model = gate.verify_model
    name = f"hvd@{Tier(model.shape).name}"
    settings = LoadSettings(gate, model, load_profile("qwen3-8b-h200"), (Tier(model.shape),))
    result = serve_fleet([[r] for r in records], make_planner(name, settings), model, concurrency, policy=name,
                         profile=settings.profile)
    return result.overall.policy(name).to_json()


@cli_entry("adapt", build_parser)
def main(args: argparse.Namespace) -> int:
    TrainConfig, TrainOptions, train_gate = training("adapt")
    from sglang_hvd.gate import Gate

    serving = Gate(args.gate)
    digest, served = served_rule(args.url, args.timeout)
    if digest != serving.digest:
        raise HvdInputError(f"--gate {args.gate} is gate {serving.digest}, but {args.url} serves {digest}: pass the "
                            "directory of the gate it serves")
    forced = overrides(serving.rule, served)
    report = ReadReport()
    recorded, held = held_back_split(args.recorded, args.held_back, args.skip_invalid, report)
    base = list(iter_traces(args.base, skip_invalid=args.skip_invalid, report=report))
    records = list(single_tokenizer(base + recorded))
    tokenizer, flags = check_tokenizer(records, args.tokenizer)
    if held[0].tokenizer.digest != serving.spec.tokenizer.digest or tokenizer.identity != serving.spec.tokenizer:
        raise HvdInputError(f"the traces are tokenized with {records[0].tokenizer.name}, the serving gate's features "
                            f"index {serving.spec.tokenizer.name}: pass traces of the served tokenizer")
    spec = serving.spec
    opts = TrainOptions(split_seed=args.seed, model=TrainConfig(max_epochs=args.epochs, seed=args.seed),
                        drafter=spec.drafter, verify=serving.verify_model,
                        costs=spec.costs, cache_siblings=spec.decision.cache_siblings)
    print(f"hvd adapt: {len(base):,} base + {len(recorded):,} recorded requests to train on, {len(held):,} recent "
          f"requests held back; serving gate {serving.digest}", flush=True)
    try:
        train_gate(records, flags, tokenizer.identity, args.output, opts)
    except (ValueError, FileExistsError) as e:
        raise HvdInputError(str(e)) from None
    candidate = Gate(args.output, **forced)
    serving_now = Gate(args.gate, **forced) if forced else serving  # as the server serves it
    figures = {"serving": {"gate": args.gate, "digest": serving.digest, **replay_figures(serving_now, held,
                                                                                        args.concurrency)},
               "candidate": {"gate": args.output, "digest": candidate.digest,
                             **replay_figures(candidate, held, args.concurrency)}}
    old, new = figures["serving"]["cycles_per_1k"], figures["candidate"]["cycles_per_1k"]
    better = new < old * (1 - args.min_gain)
    rows = [(name, f"{f['digest']}", f"{f['cycles_per_1k']:.1f}", f"{f.get('tokens_per_s', 0):,.0f}",
             f"{100 * f['cache_pick_rate']:.1f}%") for name, f in figures.items()]
    print(format_table(["gate", "digest", "cycles/1k", "tokens/s (shipped H200 estimate)", "cache pick"], rows,
                       title=f"\nreplay of the {len(held):,} held-back requests (concurrency {args.concurrency}"
                             f"{', server settings ' + str(forced) if forced else ''})"))
    pushed, message, code = False, "", 0
    if not better:
        message = (f"kept the serving gate: the candidate's {new:.1f} cycles/1k are not below {old:.1f}"
                   f"{f' by {100 * args.min_gain:g}%' if args.min_gain else ''}")
    elif args.dry_run:
        message = f"--dry-run: the candidate ({new:.1f} cycles/1k against {old:.1f}) was not pushed"
    else:
        pushed, message = update_gate(args.url, os.path.abspath(args.output), args.timeout)
        message = (f"pushed {candidate.digest} to {args.url}: {message}" if pushed
                   else f"{args.url} refused the candidate: {message}")
        code = 0 if pushed else 1
    print(message)
    if report.num_skipped:
        print(report.summary())
    if args.json:
        write_json(args.json, {**figures, "held_back_requests": len(held), "trained_requests": len(records),
                               "server_settings": forced, "better": better, "pushed": pushed, "message": message})
    return code
