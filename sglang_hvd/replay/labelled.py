"""Dense-mode training rows: every non-empty cache draft, its features and its label.

The label is the draft's oracle accept_len: the longest prefix of the draft that the
recorded output repeats. That is what verify accepts, greedy or sampled (a rejected token
is taken out of the distribution the next token is drawn from); over outputs sampled at
the serving temperature and top-p the labels are distributed as served acceptance, and
greedy recordings overstate acceptance served at temperature > 0 (README, "Sampling").
Features come from the same extractor the server uses; the request history at position p
holds the drafts made at every earlier position, each compared only with the tokens
generated before p (features.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import numpy as np

from ..drafter.protocol import Draft, Drafter
from ..features import FeatureExtractor
from ..request_state import RequestState, StateSnapshot
from ..trace import TraceRecord
from .engine import iter_dense


@dataclasses.dataclass(frozen=True, slots=True)
class LabelledRequest:
    record: TraceRecord
    positions: np.ndarray  # [rows] output positions with a non-empty draft
    features: np.ndarray  # [rows, len(FEATURE_NAMES)] float32
    accept_len: np.ndarray  # [rows] int32 labels
    draft_len: np.ndarray  # [rows] int32


def iter_labelled(
    records: Iterable[TraceRecord], drafter: Drafter, extractor: FeatureExtractor
) -> Iterator[LabelledRequest]:
    current: TraceRecord | None = None
    drafts: list[Draft] = []
    states: list[StateSnapshot] = []
    meta: list[tuple[int, int, int]] = []
    state: RequestState | None = None

    def flush():
        feats = extractor.of_rows(drafts, states)
        pos, acc, dl = (np.array(c, dtype=np.int32) for c in zip(*meta)) if meta else (np.zeros(0, np.int32),) * 3
        return LabelledRequest(current, pos, feats, acc, dl)

    for step in iter_dense(records, drafter):
        if step.record is not current:
            if current is not None:
                yield flush()
            current, drafts, states, meta = step.record, [], [], []
            state = RequestState(step.record.prompt_ids)
        if step.draft.tokens:
            drafts.append(step.draft)
            states.append(state.snapshot())
            meta.append((step.pos, step.accept_len, len(step.draft.tokens)))
        state.record(step.draft.tokens)
        state.observe([int(current.output_ids[step.pos])])
    if current is not None:
        yield flush()
