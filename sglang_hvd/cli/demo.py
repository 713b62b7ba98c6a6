"""``hvd demo``: the whole loop on the embedded workload, offline, in a few minutes.

synth -> import -> train (a quarter of the conversations held out) -> eval on the held-out
conversations, printing the policy table. Every step is the public command of the same
name, run in-process; the folder keeps each step's output for a closer look.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from ..errors import HvdInputError
from ..jsonl import write_json
from .common import (
    FOLDER,
    MAX_EPOCHS,
    MAX_SESSIONS,
    add_examples,
    add_json_flag,
    cli_entry,
    declare_outputs,
    int_in,
    seed,
)
from .main import command


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hvd demo",
        description=(
            "Run the full HVD loop on the embedded synthetic agentic workload, offline: hvd synth, hvd import, "
            "hvd train (holding out a quarter of the conversations), hvd eval on the held-out conversations. "
            "Prints the policy table: verify cycles per 1,000 tokens of greedy, EAGLE3, SuffixDecoding "
            "(cache_only), the score rule, HVD and the oracle. Needs the train extra."
        ),
    )
    p.add_argument("-o", "--output", default="hvd-demo", metavar="DIR", help="working folder (default: %(default)s)")
    p.add_argument("--sessions", type=int_in(1, MAX_SESSIONS), metavar="N", default=160,
                   help="synthetic sessions to generate (default: %(default)s)")
    p.add_argument("--seed", type=seed, metavar="N", default=0,
                   help="seed of the workload, split and training (default: %(default)s)")
    p.add_argument("--epochs", type=int_in(1, MAX_EPOCHS), metavar="N", default=40,
                   help="most training epochs (default: %(default)s)")
    add_json_flag(p)
    declare_outputs(p, output=FOLDER)
    add_examples(
        p,
        'hvd demo',
        'hvd demo -o demo --sessions 80 --json demo.json',
    )
    return p


def drafter_line() -> str:
    """Which cache drafter implementation the demo (and every hvd command) runs, and, for the
    Python fallback, why and how to get the native one."""
    from ..drafter import native_drafter

    if native_drafter.native_available():
        return "drafter: native (the C++ extension)"
    reason = native_drafter.native_import_error() or "not importable"
    return ("drafter: python, the slow fallback (10-40x slower than native): the native C++ extension was not "
            f"built ({reason}); to fix, install g++ (a C++17 compiler) and reinstall sglang-hvd")


def _step(title: str, argv: list[str]) -> None:
    print(f"\n$ hvd {title} {' '.join(argv)}", flush=True)
    start = time.perf_counter()
    code = command(title)(argv)
    if code:
        raise HvdInputError(f"hvd {title} failed (exit {code})")
    print(f"[{title}: {time.perf_counter() - start:.0f} s]", flush=True)


@cli_entry("demo", build_parser)
def main(args: argparse.Namespace) -> int:
    d = args.output
    conv, tok = os.path.join(d, "conversations.jsonl"), os.path.join(d, "tokenizer")
    traces, gate, result = os.path.join(d, "traces.jsonl"), os.path.join(d, "gate"), os.path.join(d, "eval.json")
    start = time.perf_counter()
    print(drafter_line(), flush=True)
    _step("synth", ["-o", d, "--sessions", str(args.sessions), "--seed", str(args.seed)])
    _step("import", [conv, "--tokenizer", tok, "-o", traces])
    _step("train", [traces, "--tokenizer", tok, "-o", gate, "--test-fraction", "0.25", "--seed", str(args.seed),
                           "--epochs", str(args.epochs)])
    _step("eval", [traces, "--gate", gate, "--held-out", "--json", result])
    with open(result) as f:
        evaluation = json.load(f)
    overall = evaluation["overall"]["policies"]
    cyc = {name: p["cycles_per_1k"] for name, p in overall.items()}
    print(f"\nHVD on held-out sessions: {cyc['hvd']:.1f} verify cycles per 1k tokens vs {cyc['cache_only']:.1f} "
          f"cache-only (SuffixDecoding), {cyc['eagle3_only']:.1f} EAGLE3-only and {cyc['oracle']:.1f} "
          "for the oracle gate "
          f"({time.perf_counter() - start:.0f} s in all; files in {d}/)")
    if args.json:  # the held-out evaluation, as `hvd eval --json` writes it
        write_json(args.json, evaluation)
    return 0
