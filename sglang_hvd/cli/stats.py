"""``hvd stats TRACES...``: sizes and repetition profile of token traces, per source."""

from __future__ import annotations

import argparse

from ..errors import HvdInputError
from ..jsonl import write_json
from ..report import format_table, progress
from ..stats import RepetitionProfiler
from ..trace import ReadReport, iter_traces
from .common import add_examples, add_json_flag, add_skip_invalid_flag, cli_entry, int_in


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hvd stats",
        description=(
            "Per source: requests, prompt and output tokens, and the repetition profile: the "
            "share of output tokens that continue a match of length >= --match-len in the "
            "request's prompt or earlier output or in an earlier request's output (an upper "
            "bound for a cache drafter). Files are read in the order given."
        ),
    )
    p.add_argument("traces", nargs="+", metavar="TRACES", help="token trace files (.jsonl or .jsonl.gz)")
    p.add_argument("--match-len", type=int_in(1, 4096), metavar="N", default=4,
                   help="match length of the repetition profile, 1 to 4096 (default: %(default)s)")
    add_skip_invalid_flag(p)
    add_json_flag(p)
    add_examples(
        p,
        'hvd stats dev.jsonl.gz',
        'hvd stats dev.jsonl.gz --match-len 8 --json stats.json',
    )
    return p


@cli_entry("stats", build_parser)
def main(args: argparse.Namespace) -> int:
    report = ReadReport()
    profiler = RepetitionProfiler(args.match_len)
    records = iter_traces(args.traces, skip_invalid=args.skip_invalid, report=report)
    profiler.add_all(progress(records, desc="stats", unit="req"))
    if not profiler.sources:
        raise HvdInputError(f"no trace records in {', '.join(args.traces)}" +
                            (f" ({report.num_skipped} malformed lines skipped)" if report.num_skipped else ""))
    header = ["source", "conversations", "requests", "prompt tokens", "output tokens", "mean prompt", "mean output",
              f"repeat@{args.match_len}"]

    def row(name, s):
        j = s.to_json()
        return (name, s.conversations, s.requests, s.prompt_tokens, s.output_tokens, j["mean_prompt_tokens"],
                j["mean_output_tokens"], f"{100 * s.repetition:.1f}%")

    rows = [row(src, s) for src, s in profiler.sources.items()]
    if len(rows) > 1:
        rows.append(row("overall", profiler.overall()))
    print(format_table(header, rows))
    if report.num_skipped:
        print(report.summary())
    if args.json:
        write_json(args.json, {
            "match_len": args.match_len,
            "overall": profiler.overall().to_json(),
            "sources": {src: s.to_json() for src, s in profiler.sources.items()},
            "skipped_lines": report.num_skipped,
        })
    return 0
