"""Generate the synthetic workload: conversations.jsonl plus its tokenizer directory."""

from __future__ import annotations

import dataclasses
import json
import os
import random
from collections.abc import Callable
from typing import Any

from ..jsonl import atomic_output, dump_line
from . import chat_session, code_session, config_session, tools_session
from .tokenizer_build import build_tokenizer

# kind -> (source name, generator). The order fixes the interleaving of sessions.
KINDS: dict[str, tuple[str, Callable[[random.Random, int], dict[str, Any]]]] = {
    "tools": (tools_session.SOURCE, tools_session.session),
    "config": (config_session.SOURCE, config_session.session),
    "code": (code_session.SOURCE, code_session.session),
    "chat": (chat_session.SOURCE, chat_session.session),
}


@dataclasses.dataclass(frozen=True, slots=True)
class SynthConfig:
    sessions: int = 240
    """Number of sessions, spread evenly over the kinds (round-robin)."""
    seed: int = 0
    """Seed of every random choice: the same seed writes byte-identical files."""
    kinds: tuple[str, ...] = tuple(KINDS)
    """Session kinds to generate: any of tools, config, code, chat."""
    vocab_size: int = 2048
    """Vocabulary of the byte-level BPE tokenizer trained on the generated text."""

    def __post_init__(self):
        if self.sessions < 1:
            raise ValueError(f"sessions must be >= 1, got {self.sessions}")
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown or not self.kinds:
            raise ValueError(f"unknown session kind(s) {unknown}; choose from {', '.join(KINDS)}")
        if self.vocab_size < 300:
            raise ValueError(f"vocab_size must be >= 300 (256 bytes + specials + merges), got {self.vocab_size}")


def generate(config: SynthConfig) -> list[dict[str, Any]]:
    """The conversations, interleaved by kind, each kind with its own seeded stream."""
    rngs = {k: random.Random(f"{config.seed}:{k}") for k in config.kinds}
    conversations = []
    for i in range(config.sessions):
        kind = config.kinds[i % len(config.kinds)]
        _, make = KINDS[kind]
        conversations.append(make(rngs[kind], i // len(config.kinds)))
    return conversations


def _texts(conversations: list[dict[str, Any]]):
    for conv in conversations:
        for tool in conv.get("tools") or []:
            yield json.dumps(tool)
        for m in conv["messages"]:
            if m.get("content"):
                yield m["content"]
            for call in m.get("tool_calls") or []:
                yield call["function"]["arguments"]


def write_workload(config: SynthConfig, out_dir: str) -> dict[str, Any]:
    """Write ``out_dir/conversations.jsonl`` and ``out_dir/tokenizer/``; return a summary."""
    conversations = generate(config)
    build_tokenizer(_texts(conversations), os.path.join(out_dir, "tokenizer"), config.vocab_size)
    path = os.path.join(out_dir, "conversations.jsonl")
    with atomic_output(path) as f:
        for conv in conversations:
            f.write(dump_line(conv))
    per_source: dict[str, dict[str, int]] = {}
    for conv in conversations:
        s = per_source.setdefault(conv["source"], {"conversations": 0, "assistant_turns": 0})
        s["conversations"] += 1
        s["assistant_turns"] += sum(m["role"] == "assistant" for m in conv["messages"])
    return {"conversations_path": path, "tokenizer_dir": os.path.join(out_dir, "tokenizer"), "sources": per_source}
