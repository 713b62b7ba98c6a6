"""Dense-mode training rows: every non-empty cache draft, its features and its label.

The label is the draft's oracle accept_len. Features come from the same extractor the
server uses; the request history at position p holds the drafts made at every earlier
position, each compared only with the tokens generated before p (features.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import numpy as np

from ..drafter.protocol import Drafter
from ..features import TAIL_TOKENS, FeatureExtractor, FeatureInput, RequestHistory
from ..trace import TraceRecord
from .engine import iter_dense


@dataclasses.dataclass(frozen=True, slots=True)
class LabelledRequest:
    record: TraceRecord
    positions: np.ndarray  # [rows] output positions with a non-empty draft
    features: np.ndarray  # [rows, len(FEATURE_NAMES)] float32
    accept_len: np.ndarray  # [rows] int32 labels
    draft_len: np.ndarray  # [rows] int32


def iter_labelled(records: Iterable[TraceRecord], drafter: Drafter, extractor: FeatureExtractor) -> Iterator[LabelledRequest]:
    current: TraceRecord | None = None
    rows: list[FeatureInput] = []
    meta: list[tuple[int, int, int]] = []
    history = RequestHistory()

    def flush():
        feats = extractor(rows)
        pos, acc, dl = (np.array(c, dtype=np.int32) for c in zip(*meta)) if meta else (np.zeros(0, np.int32),) * 3
        return LabelledRequest(current, pos, feats, acc, dl)

    for step in iter_dense(records, drafter):
        if step.record is not current:
            if current is not None:
                yield flush()
            current, rows, meta, history = step.record, [], [], RequestHistory()
            context = np.concatenate([current.prompt_ids[-TAIL_TOKENS:], current.output_ids])
            shift = min(len(current.prompt_ids), TAIL_TOKENS)
        pos = step.pos
        if step.draft.tokens:
            rows.append(FeatureInput(step.draft, pos, len(current.prompt_ids),
                                     context[max(0, pos + shift - TAIL_TOKENS) : pos + shift], history.scalars()))
            meta.append((pos, step.accept_len, len(step.draft.tokens)))
        history.record(pos, step.draft)
        history.observe([int(current.output_ids[pos])])
    if current is not None:
        yield flush()
