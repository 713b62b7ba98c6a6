"""Split requests by conversation or task group, stratified by source: no conversation
(and with ``group_by="task"`` no task) on two sides.

Within each source, groups are ordered by a seeded hash of their key and cut into test,
validation and train shares, so every source is represented on every side (a source
with 3+ groups gets at least one in each non-empty share).

Task groups (``task_of``): the conversation id without a trailing ``/trialN``, then its
last path component: ``tau-bench/airline/gpt-4o/task007/trial2`` -> ``task007`` (the 4
trials of a task), ``swe-agent/.../replay__marshmallow-...-1867__xml.../marshmallow-code__
marshmallow-1867`` -> ``marshmallow-code__marshmallow-1867`` (8 runs of one instance).
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Iterable

from sglang_hvd.trace import TraceRecord

TRAIN, VALIDATION, TEST = "train", "validation", "test"
GROUPINGS = ("conversation", "task")
_TRIAL = re.compile(r"/trial\d+$")


def task_of(conv_id: str) -> str:
    return _TRIAL.sub("", conv_id).rsplit("/", 1)[-1]


def _key(seed: int, conv_id: str) -> str:
    return hashlib.sha256(f"{seed}:{conv_id}".encode()).hexdigest()


def split_conversations(records: Iterable[TraceRecord], validation_fraction: float, test_fraction: float,
                        seed: int, group_by: str = "conversation") -> dict[str, str]:
    """conv_id -> TRAIN / VALIDATION / TEST; all conversations of a group on one side."""
    if not (0 <= validation_fraction < 1 and 0 <= test_fraction < 1 and validation_fraction + test_fraction < 1):
        raise ValueError("validation and test fractions must be in [0, 1) and sum to less than 1")
    if group_by not in GROUPINGS:
        raise ValueError(f"group_by must be one of {GROUPINGS}, got {group_by!r}")
    key = task_of if group_by == "task" else (lambda c: c)
    by_source: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for r in records:
        by_source[r.source][key(r.conv_id)].add(r.conv_id)
    side: dict[str, str] = {}
    for source, groups in by_source.items():
        ordered = sorted(groups, key=lambda g: _key(seed, g))
        n = len(ordered)
        n_test = max(1, round(n * test_fraction)) if test_fraction and n >= 3 else round(n * test_fraction)
        n_val = (max(1, round(n * validation_fraction)) if validation_fraction and n >= 3
                 else round(n * validation_fraction))
        for i, group in enumerate(ordered):
            for conv in groups[group]:
                side[conv] = TEST if i < n_test else VALIDATION if i < n_test + n_val else TRAIN
    return side
