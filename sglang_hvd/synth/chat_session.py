"""synth-chat: free-form chat, the low-repetition control.

Sentences are drawn word by word from a small grammar over a few hundred words, so long
n-grams rarely repeat and the cache drafter should seldom pay off.
"""

from __future__ import annotations

import random
from typing import Any

from .common import assistant

SOURCE = "synth-chat"

NOUNS = ("garden river window teacher city winter market story bridge forest engine letter island mirror "
         "kitchen planet harbor song mountain lantern village camera ocean library morning journey painting "
         "machine festival desert castle orchard puzzle meadow violin tower coffee notebook storm harvest").split()
VERBS = ("finds builds paints follows remembers carries watches opens changes explains imagines discovers "
         "repairs visits crosses answers borrows gathers measures protects").split()
ADJS = ("quiet bright ancient gentle curious narrow golden tired hidden distant careful silver wild empty "
        "warm strange modest sudden").split()
ADVS = "slowly rarely often quietly eagerly barely gladly suddenly".split()
TOPICS = ["travel", "cooking", "music", "history", "gardening", "astronomy", "painting", "architecture"]


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(["the", "a", "every", "one"]), rng.choice(ADJS), rng.choice(NOUNS), rng.choice(ADVS),
             rng.choice(VERBS), rng.choice(["the", "a", "another"]), rng.choice(ADJS), rng.choice(NOUNS)]
    if rng.random() < 0.5:
        words += [rng.choice(["near", "beyond", "under", "before", "after"]), "the", rng.choice(NOUNS)]
    s = " ".join(words)
    return s[0].upper() + s[1:] + rng.choice([".", ".", "!", "?"])


def session(rng: random.Random, index: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, 4)):
        ask = f"Tell me something about {rng.choice(TOPICS)} and the {rng.choice(NOUNS)}."
        messages.append({"role": "user", "content": ask})
        paragraphs = [" ".join(_sentence(rng) for _ in range(rng.randint(2, 5))) for _ in range(rng.randint(1, 3))]
        messages.append(assistant("\n\n".join(paragraphs)))
    return {"id": f"{SOURCE}/{index:04d}", "source": SOURCE, "model": "synthetic", "license": "Apache-2.0",
            "messages": messages}
