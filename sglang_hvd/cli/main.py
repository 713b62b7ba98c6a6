"""``hvd``: one command line tool, one subcommand per job.

Each subcommand lives in its own module with ``build_parser()`` and ``main(argv=None)``;
modules are imported only when their command runs (``hvd train`` alone imports torch).
"""

from __future__ import annotations

import importlib
import sys

from .. import __version__

# name -> (module, one-line summary). Order is the order of the data flow.
COMMANDS: dict[str, tuple[str, str]] = {
    "synth": ("sglang_hvd.cli.synth", "write the embedded synthetic agentic workload (conversations + tokenizer)"),
    "import": ("sglang_hvd.cli.import_traces", "turn chat conversations (OpenAI JSONL) into token traces"),
    "collect": ("sglang_hvd.cli.collect", "gather token traces from a running SGLang server (your own model)"),
    "stats": ("sglang_hvd.cli.stats", "sizes and repetition profile of token traces, per source"),
    "replay": ("sglang_hvd.cli.replay", "replay traces through the cache drafter; compare verify policies"),
    "train": ("sglang_hvd.cli.train", "train the payoff gate by trace replay; export it to ONNX (needs the train extra)"),
    "demo": ("sglang_hvd.cli.demo", "the whole loop on the embedded workload: synth, import, train, eval"),
    "eval": ("sglang_hvd.cli.eval", "evaluate a gate against greedy, EAGLE3, cache-only, the rule and the oracle"),
}

USAGE = """usage: hvd [-h] [--version] COMMAND [ARGS...]

Hybrid Verified Decoding tools: build token traces, replay them, train and evaluate the gate.

commands:
{commands}

Run `hvd COMMAND --help` for the options of one command."""


def _usage() -> str:
    width = max(len(n) for n in COMMANDS)
    return USAGE.format(commands="\n".join(f"  {n.ljust(width)}  {d}" for n, (_, d) in COMMANDS.items()))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"hvd (sglang-hvd) {__version__}")
        return 0
    name = argv[0]
    if name not in COMMANDS:
        print(f"hvd: error: unknown command {name!r} (choose from {', '.join(COMMANDS)})", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
