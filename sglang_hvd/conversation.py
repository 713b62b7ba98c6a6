"""OpenAI-format chat conversations (the input of ``hvd import`` and ``hvd synth``).

One JSON object per line: ``{"id", "source", "messages": [...], "tools"?: [...]}``, where
each message has a ``role`` (system, user, assistant, tool), ``content`` (a string; null
only on assistant turns that only call tools), and optionally ``tool_calls`` (assistant),
``tool_call_id`` and ``name`` (tool). See ../shared/data/README.md for the full format.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator
from typing import Any

from .errors import FileFormatError
from .jsonl import iter_json_lines

ROLES = ("system", "user", "assistant", "tool")


@dataclasses.dataclass(frozen=True, slots=True)
class Conversation:
    conv_id: str
    source: str
    messages: tuple[dict[str, Any], ...]  # validated message dicts, as in the file
    tools: tuple[dict[str, Any], ...] | None = None

    @property
    def num_assistant_turns(self) -> int:
        return sum(1 for m in self.messages if m["role"] == "assistant")


def _check_message(m: Any, i: int) -> None:
    if not isinstance(m, dict):
        raise ValueError(f"messages[{i}] must be an object")
    role = m.get("role")
    if role not in ROLES:
        raise ValueError(f"messages[{i}]: unknown role {role!r} (expected one of {', '.join(ROLES)})")
    content = m.get("content")
    has_calls = bool(m.get("tool_calls"))
    if content is None and not (role == "assistant" and has_calls):
        raise ValueError(f"messages[{i}] ({role}): 'content' is missing or null")
    if content is not None and not isinstance(content, str):
        raise ValueError(f"messages[{i}] ({role}): 'content' must be a string, got {type(content).__name__}")
    if "tool_calls" in m and m["tool_calls"] is not None:
        if role != "assistant":
            raise ValueError(f"messages[{i}] ({role}): only assistant messages may have 'tool_calls'")
        calls = m["tool_calls"]
        if not isinstance(calls, list):
            raise ValueError(f"messages[{i}]: 'tool_calls' must be a list")
        for j, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise ValueError(f"messages[{i}].tool_calls[{j}]: needs 'function' with a string 'name'")
            if not isinstance(fn.get("arguments"), (str, dict)):
                raise ValueError(f"messages[{i}].tool_calls[{j}]: 'function.arguments' must be a string or object")


def parse_conversation(obj: Any, source: str) -> Conversation:
    """Validate one decoded line; raises ValueError naming the first problem.

    ``source`` names the workload in reports. Some datasets put a path in the line's
    own ``source`` field (one per SWE-agent trajectory), so only its first component
    counts (``swe-agent/tests/...`` -> ``swe-agent``); without one the caller's
    default (the file's name) is used.
    """
    if not isinstance(obj, dict):
        raise ValueError(f"a conversation must be a JSON object, got {type(obj).__name__}")
    conv_id = obj.get("id")
    if not isinstance(conv_id, str) or not conv_id:
        raise ValueError("'id' must be a non-empty string")
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        _check_message(m, i)
    tools = obj.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise ValueError("'tools' must be a list of tool schema objects")
    own = obj.get("source")
    if isinstance(own, str) and own.strip("/"):
        source = own.strip("/").split("/")[0]
    return Conversation(
        conv_id=conv_id,
        source=source,
        messages=tuple(messages),
        tools=tuple(tools) if tools else None,
    )


def iter_conversations(
    paths: Iterable[str], source: str | None = None
) -> Iterator[tuple[str, int, Conversation]]:
    """Stream ``(path, line_no, conversation)``; a malformed line raises FILE:LINE errors.

    ``source`` overrides the workload name of every conversation.
    """
    for path in paths:
        for line_no, obj in iter_json_lines(path):
            try:
                conv = parse_conversation(obj, source=file_stem(path))
            except ValueError as e:
                raise FileFormatError(path, line_no, str(e)) from None
            yield path, line_no, dataclasses.replace(conv, source=source) if source else conv


def file_stem(path: str) -> str:
    """``data/taubench_airline.jsonl.gz`` -> ``taubench_airline``."""
    name = os.path.basename(path)
    for suffix in (".gz", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return name
