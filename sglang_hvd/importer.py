"""Conversations -> token traces: every assistant message becomes one generation request.

For assistant message i of a conversation:
  prompt  = template(messages[:i], tools, add_generation_prompt=True)
  output  = template(messages[:i+1], tools)[len(prompt):], cut after the end-of-turn token
so the output is exactly what the template says the model emits for that turn (for Qwen3:
the empty think block of non-thinking mode sits in the prompt, then content, then
``<tool_call>`` blocks, then ``<|im_end|>``). Both texts are tokenized separately, as
the server does: the prompt is encoded once and the output arrives token by token.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .conversation import Conversation
from .errors import HvdInputError
from .tokenizer import ChatTokenizer
from .trace import TraceRecord, token_array

THINKING_MODES = ("auto", "on", "off")


@dataclasses.dataclass(frozen=True, slots=True)
class ImportOptions:
    thinking: str = "auto"
    """auto: thinking mode only for conversations with reasoning content; on / off: force it."""
    end_of_turn: str | None = None
    """Text that ends an assistant turn; default: the tokenizer's eos_token."""

    def __post_init__(self):
        if self.thinking not in THINKING_MODES:
            raise ValueError(f"thinking must be one of {THINKING_MODES}, got {self.thinking!r}")


def has_reasoning(conv: Conversation) -> bool:
    return any(
        m["role"] == "assistant" and (m.get("reasoning_content") or "<think>" in (m.get("content") or ""))
        for m in conv.messages
    )


def _for_template(message: dict[str, Any]) -> dict[str, Any]:
    # OpenAI allows content null on tool-call-only turns; templates test it with string ops.
    return message if message.get("content") is not None else {**message, "content": ""}


def render_turns(conv: Conversation, tokenizer: ChatTokenizer, options: ImportOptions) -> list[tuple[str, str]]:
    """``(prompt_text, output_text)`` for every assistant message, in order."""
    end_of_turn = options.end_of_turn or tokenizer.eos_token
    if not end_of_turn:
        raise HvdInputError(f"{tokenizer.path}: tokenizer_config.json has no eos_token; pass --end-of-turn")
    enable_thinking = {"on": True, "off": False, "auto": has_reasoning(conv)}[options.thinking]
    messages = [_for_template(m) for m in conv.messages]
    tools = list(conv.tools) if conv.tools else None
    turns = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        where = f"conversation {conv.conv_id!r}, message {i}"
        try:
            prompt = tokenizer.render(messages[:i], tools=tools, add_generation_prompt=True,
                                      enable_thinking=enable_thinking)
            full = tokenizer.render(messages[: i + 1], tools=tools, enable_thinking=enable_thinking)
        except Exception as e:  # jinja2 raises TemplateError, TypeError, UndefinedError...
            raise HvdInputError(f"{where}: the chat template failed ({e.__class__.__name__}: {e})") from e
        if not full.startswith(prompt):
            raise HvdInputError(
                f"{where}: the template's rendering of the assistant turn does not extend its "
                "generation prompt, so the emitted text cannot be isolated"
            )
        output = full[len(prompt) :]
        end = output.rfind(end_of_turn)
        if end < 0:
            raise HvdInputError(f"{where}: the rendered turn has no end-of-turn text {end_of_turn!r}; "
                                "pass --end-of-turn")
        turns.append((prompt, output[: end + len(end_of_turn)]))
    return turns


def import_conversation(
    conv: Conversation, tokenizer: ChatTokenizer, options: ImportOptions = ImportOptions()
) -> list[TraceRecord]:
    """One TraceRecord per assistant message of ``conv``."""
    turns = render_turns(conv, tokenizer, options)
    if not turns:
        return []
    encoded = tokenizer.encode_batch([text for pair in turns for text in pair])
    records = []
    for turn, (prompt_ids, output_ids) in enumerate(zip(encoded[0::2], encoded[1::2])):
        if not prompt_ids or not output_ids:
            raise HvdInputError(f"conversation {conv.conv_id!r}, assistant turn {turn}: empty prompt or output")
        records.append(
            TraceRecord(
                req_id=f"{conv.conv_id}#{turn}",
                conv_id=conv.conv_id,
                turn=turn,
                source=conv.source,
                tokenizer=tokenizer.identity,
                prompt_ids=token_array(prompt_ids),
                output_ids=token_array(output_ids),
            )
        )
    return records
