"""OpenAI-format chat conversations (the input of ``hvd import`` and ``hvd collect``, the
output of ``hvd synth``). The format, in full (also docs/input-format.md):

One JSON object per line (JSON Lines; ``.gz`` accepted; blank lines skipped)::

    {"id": "support/42",                      optional: a non-empty string naming the conversation
     "source": "support",                     optional: the workload name in reports
     "messages": [                            required: a non-empty list, in order
       {"role": "system", "content": "You are ..."},
       {"role": "user", "content": "Book a flight to Oslo"},
       {"role": "assistant", "content": null,
        "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": "{\"to\": \"OSL\"}"}}]},
       {"role": "tool", "tool_call_id": "call_1", "name": "search", "content": "[...]"},
       {"role": "assistant", "content": "Found two flights ..."}],
     "tools": [{"type": "function", "function": {"name": "search", "parameters": {...}}}]}   optional

- ``role``: system, user, assistant or tool. ``content``: a string; null (or absent) only on
  an assistant message with ``tool_calls``. Other message keys (``reasoning_content``,
  ``tool_call_id``, ``name``) are passed to the chat template as they are.
- ``tool_calls`` (assistant only): a list of ``{"function": {"name": str, "arguments": str
  or object}}``. ``tools``: a list of tool schema objects, given to the chat template.
- ``id``: when missing, the conversation is named after its file and line,
  ``FILE_STEM:LINE`` (``chats.jsonl.gz`` line 7 -> ``chats:7``); an id must be unique for
  ``hvd train``'s split by conversation to keep each conversation on one side.
- ``source``: its first path component names the workload (``swe-agent/tests/...`` ->
  ``swe-agent``); when missing, the file's stem does (``taubench_airline.jsonl`` ->
  ``taubench_airline``); ``hvd import --source`` overrides both.

So a plain OpenAI chat request body, ``{"messages": [...]}``, is a valid line.
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


def parse_conversation(obj: Any, source: str, default_id: str | None = None) -> Conversation:
    """Validate one decoded line; raises ValueError naming the first problem.

    ``default_id`` names a conversation without an ``id`` (iter_conversations passes
    ``FILE_STEM:LINE``); without it, a missing id is refused.

    ``source`` names the workload in reports. Some datasets put a path in the line's
    own ``source`` field (one per SWE-agent trajectory), so only its first component
    counts (``swe-agent/tests/...`` -> ``swe-agent``); without one the caller's
    default (the file's name) is used.
    """
    if not isinstance(obj, dict):
        raise ValueError(f"a conversation must be a JSON object, got {type(obj).__name__}")
    conv_id = obj.get("id")
    if conv_id is None and default_id:
        conv_id = default_id
    if not isinstance(conv_id, str) or not conv_id:
        raise ValueError("'id' must be a non-empty string" + (" (or left out)" if default_id else ""))
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

    ``source`` overrides the workload name of every conversation; a line without an
    ``id`` is named ``FILE_STEM:LINE``.
    """
    for path in paths:
        stem = file_stem(path)
        for line_no, obj in iter_json_lines(path):
            try:
                conv = parse_conversation(obj, source=stem, default_id=f"{stem}:{line_no}")
            except ValueError as e:
                raise FileFormatError(path, line_no, str(e)) from None
            yield path, line_no, dataclasses.replace(conv, source=source) if source else conv


def file_stem(path: str) -> str:
    """``data/taubench_airline.jsonl.gz`` -> ``taubench_airline``."""
    name = os.path.basename(path)
    for suffix in (".gz", ".jsonl", ".json"):
        name = name.removesuffix(suffix)
    return name
