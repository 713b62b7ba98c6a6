"""Conversations -> a ShareGPT-format JSON file for SGLang's serving benchmark.

Each assistant turn becomes one entry whose "human" value is the prompt exactly as the
model's chat template renders it (so bench_serving, without --apply-chat-template,
sends the same text the model would see in production) and whose "gpt" value is the
recorded answer (bench_serving takes its token length as the output length).

    python launch/to_sharegpt.py CONVERSATIONS... --tokenizer MODEL_DIR -o prompts.json
"""

from __future__ import annotations

import argparse
import json
import sys

from sglang_hvd.conversation import iter_conversations
from sglang_hvd.importer import ImportOptions, render_turns
from sglang_hvd.tokenizer import ChatTokenizer


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("conversations", nargs="+")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("-o", "--output", required=True)
    args = p.parse_args(argv)
    tok = ChatTokenizer(args.tokenizer)
    entries = []
    for _, _, conv in iter_conversations(args.conversations):
        for turn, (prompt, output) in enumerate(render_turns(conv, tok, ImportOptions())):
            entries.append({"id": f"{conv.conv_id}#{turn}",
                            "conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": output}]})
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(entries, f, ensure_ascii=False)
    print(f"wrote {len(entries)} prompts to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
