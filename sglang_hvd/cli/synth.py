"""``hvd synth -o DIR``: write the embedded default workload."""

from __future__ import annotations

import argparse
import os

from ..errors import HvdInputError
from ..jsonl import write_json
from ..report import format_table
from ..synth.workload import KINDS, SynthConfig, write_workload
from .common import FOLDER, MAX_SESSIONS, add_examples, add_json_flag, cli_entry, declare_outputs, int_in, seed

DEFAULTS = SynthConfig()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hvd synth",
        description=(
            "Write a seeded synthetic agentic workload: DIR/conversations.jsonl (OpenAI chat "
            "format) and DIR/tokenizer/ (a byte-level BPE tokenizer trained in code, with a "
            "chat template). No network needed. Feed both to `hvd import`."
        ),
    )
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="folder to write into (created if missing)")
    p.add_argument("--sessions", type=int_in(1, MAX_SESSIONS), metavar="N", default=DEFAULTS.sessions,
                   help="number of sessions, spread round-robin over the kinds (default: %(default)s)")
    p.add_argument("--seed", type=seed, metavar="N", default=DEFAULTS.seed,
                   help="random seed; same seed, same files (default: %(default)s)")
    p.add_argument("--kinds", metavar="K1,K2", default=",".join(KINDS),
                   help="comma-separated session kinds from: tools, config, code, chat (default: all)")
    p.add_argument("--vocab-size", type=int_in(300, 65536), metavar="N", default=DEFAULTS.vocab_size,
                   help="vocabulary size of the trained tokenizer, 300 to 65536 (default: %(default)s)")
    add_json_flag(p)
    declare_outputs(p, output=FOLDER)
    add_examples(
        p,
        'hvd synth -o synth',
        'hvd synth -o synth --sessions 48 --seed 3 --kinds code,tools',
    )
    return p


@cli_entry("synth", build_parser)
def main(args: argparse.Namespace) -> int:
    try:
        config = SynthConfig(
            sessions=args.sessions,
            seed=args.seed,
            kinds=tuple(k.strip() for k in args.kinds.split(",") if k.strip()),
            vocab_size=args.vocab_size,
        )
    except ValueError as e:
        raise HvdInputError(str(e)) from None
    summary = write_workload(config, args.output)
    rows = [(src, s["conversations"], s["assistant_turns"]) for src, s in summary["sources"].items()]
    print(format_table(["source", "conversations", "assistant turns"], rows,
                       title=f"wrote {summary['conversations_path']}"))
    print(f"tokenizer: {summary['tokenizer_dir']}")
    print(f"next: hvd import {summary['conversations_path']} --tokenizer {summary['tokenizer_dir']} "
          f"-o {os.path.join(args.output, 'traces.jsonl')}")
    if args.json:
        write_json(args.json, summary)
    return 0
