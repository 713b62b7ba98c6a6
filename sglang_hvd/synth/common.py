"""Small helpers shared by the session generators."""

from __future__ import annotations

import json
import random
from typing import Any

FIRST_NAMES = ["Ava", "Liam", "Mia", "Noah", "Zoe", "Omar", "Iris", "Leo",
               "Nina", "Raj", "Sofia", "Yuki", "Ethan", "Lena", "Marco", "Priya"]
LAST_NAMES = ["Garcia", "Chen", "Novak", "Okafor", "Silva", "Kim", "Müller",
              "Rossi", "Patel", "Dubois", "Haddad", "Larsen", "Ito", "Brown"]
CITIES = ["Austin", "Boston", "Denver", "Lisbon", "Osaka", "Berlin",
          "Toronto", "Madrid", "Seattle", "Dublin", "Nairobi", "Oslo"]
MONTHS = ["01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11", "12"]


def person(rng: random.Random) -> tuple[str, str]:
    return rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)


def date(rng: random.Random, year: int = 2026) -> str:
    return f"{year}-{rng.choice(MONTHS)}-{rng.randint(1, 28):02d}"


def amount(rng: random.Random, lo: float = 5, hi: float = 900) -> float:
    return round(rng.uniform(lo, hi), 2)


def ident(rng: random.Random, prefix: str, digits: int = 5) -> str:
    return f"{prefix}{rng.randrange(10 ** (digits - 1), 10**digits)}"


def tool_call(rng: random.Random, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call; arguments serialised the way chat APIs return them."""
    return {
        "id": f"call_{rng.getrandbits(48):012x}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def tool_schema(
    name: str, description: str, params: dict[str, str], required: list[str] | None = None
) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": t} for k, t in params.items()},
                "required": required if required is not None else list(params),
            },
        },
    }


def assistant(content: str | None = None, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    m: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        m["tool_calls"] = calls
    return m


def tool_result(call: dict[str, Any], payload: Any) -> dict[str, Any]:
    return {
        "role": "tool",
        "tool_call_id": call["id"],
        "name": call["function"]["name"],
        "content": json.dumps(payload),
    }
