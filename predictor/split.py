"""Split requests by conversation, stratified by source: no conversation on two sides.

Within each source, conversations are ordered by a seeded hash of their id and cut into
test, validation and train shares, so every source is represented on every side (a
source with 3+ conversations gets at least one in each non-empty share).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable

from sglang_hvd.trace import TraceRecord

TRAIN, VALIDATION, TEST = "train", "validation", "test"


def _key(seed: int, conv_id: str) -> str:
    return hashlib.sha256(f"{seed}:{conv_id}".encode()).hexdigest()


def split_conversations(records: Iterable[TraceRecord], validation_fraction: float, test_fraction: float,
                        seed: int) -> dict[str, str]:
    """conv_id -> TRAIN / VALIDATION / TEST."""
    if not (0 <= validation_fraction < 1 and 0 <= test_fraction < 1 and validation_fraction + test_fraction < 1):
        raise ValueError("validation and test fractions must be in [0, 1) and sum to less than 1")
    by_source: dict[str, set[str]] = defaultdict(set)
    for r in records:
        by_source[r.source].add(r.conv_id)
    side: dict[str, str] = {}
    for source, convs in by_source.items():
        ordered = sorted(convs, key=lambda c: _key(seed, c))
        n = len(ordered)
        n_test = max(1, round(n * test_fraction)) if test_fraction and n >= 3 else round(n * test_fraction)
        n_val = max(1, round(n * validation_fraction)) if validation_fraction and n >= 3 else round(n * validation_fraction)
        for i, conv in enumerate(ordered):
            side[conv] = TEST if i < n_test else VALIDATION if i < n_test + n_val else TRAIN
    return side
