"""``hvd``: one command line tool, one subcommand per job.

Each subcommand lives in its own module with ``build_parser()`` and ``main(argv=None)``;
modules are imported only when their command runs (``hvd train`` alone imports torch).
Commands of the runtime core are modules of ``sglang_hvd.cli``; commands that live
outside the core (``train``, on the offline side) are found through the entry point
group ``sglang_hvd.commands`` that the package registers, so the core never imports them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from importlib import metadata

from .. import __version__
from ..errors import HvdInputError

ENTRY_POINT_GROUP = "sglang_hvd.commands"
# name -> (core module, or None: the entry point of that name; one-line summary).
# Order is the order of the data flow.
COMMANDS: dict[str, tuple[str | None, str]] = {
    "synth": ("sglang_hvd.cli.synth", "write the embedded synthetic agentic workload (conversations + tokenizer)"),
    "import": ("sglang_hvd.cli.import_traces", "turn chat conversations (OpenAI JSONL) into token traces"),
    "collect": ("sglang_hvd.cli.collect", "gather token traces from a running SGLang server (your own model)"),
    "stats": ("sglang_hvd.cli.stats", "sizes and repetition profile of token traces, per source"),
    "replay": ("sglang_hvd.cli.replay", "replay traces through the cache drafter; compare verify policies"),
    "train": (None, "train the payoff gate by trace replay; export it to ONNX (needs the train extra)"),
    "demo": ("sglang_hvd.cli.demo", "the whole loop on the embedded workload: synth, import, train, eval"),
    "eval": ("sglang_hvd.cli.eval", "evaluate a gate against greedy, EAGLE3, cache-only, the rule and the oracle"),
    "status": ("sglang_hvd.cli.status", "HVD figures and gate of running servers, per DP rank and in total"),
    "profile": ("sglang_hvd.cli.profile", "measure a step-time profile on a running server (cost-aware verification)"),
    "adapt": (None, "retrain the gate from a server's recorded traffic; swap it in if replay says it is better"),
}


def command(name: str) -> Callable[[list[str] | None], int]:
    """The ``main(argv)`` of command ``name`` (raises HvdInputError when it is not installed)."""
    module, _ = COMMANDS[name]
    if module is not None:
        return importlib.import_module(module).main
    found = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        raise HvdInputError(f"`hvd {name}` is not installed: no {ENTRY_POINT_GROUP!r} entry point named {name!r} "
                            "(reinstall sglang-hvd: pip install '.[train]' in the sglang-hvd checkout)")
    return found[0].load()

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
    try:
        run = command(name)
    except HvdInputError as e:
        print(f"hvd: error: {e}", file=sys.stderr)
        return 2
    return run(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
