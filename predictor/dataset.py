"""Training data: dense replay of traces -> feature matrix, labels, conversation ids."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

import numpy as np

from sglang_hvd.drafter import DrafterConfig, create_drafter
from sglang_hvd.features import FEATURE_NAMES, FeatureExtractor
from sglang_hvd.replay.labelled import iter_labelled
from sglang_hvd.report import progress
from sglang_hvd.trace import TraceRecord


@dataclasses.dataclass(frozen=True, slots=True)
class Dataset:
    features: np.ndarray  # [rows, F] float32
    accept_len: np.ndarray  # [rows] float32 labels
    draft_len: np.ndarray  # [rows] int32
    conv_ids: np.ndarray  # [rows] object (str)
    sources: np.ndarray  # [rows] object (str)

    def __len__(self) -> int:
        return len(self.accept_len)


def build_dataset(records: Sequence[TraceRecord], drafter_name: str, drafter_config: DrafterConfig,
                  token_flags: np.ndarray, desc: str = "features") -> Dataset:
    """Replay ``records`` in order (one shared drafter) and label every non-empty draft."""
    extractor = FeatureExtractor(token_flags, drafter_config)
    drafter = create_drafter(drafter_name, drafter_config)
    feats, labels, dlen, convs, sources = [], [], [], [], []
    with progress(total=sum(len(r.output_ids) for r in records), desc=desc, unit="tok") as bar:
        for req in iter_labelled(records, drafter, extractor):
            feats.append(req.features)
            labels.append(req.accept_len)
            dlen.append(req.draft_len)
            n = len(req.accept_len)
            convs.append(np.full(n, req.record.conv_id, dtype=object))
            sources.append(np.full(n, req.record.source, dtype=object))
            bar.update(len(req.record.output_ids))
    if not feats:
        empty = np.zeros(0)
        return Dataset(np.zeros((0, len(FEATURE_NAMES)), np.float32), empty.astype(np.float32), empty.astype(np.int32),
                       empty.astype(object), empty.astype(object))
    return Dataset(np.concatenate(feats), np.concatenate(labels).astype(np.float32), np.concatenate(dlen),
                   np.concatenate(convs), np.concatenate(sources))


def records_digest(records: Sequence[TraceRecord]) -> str:
    """sha256 over the token ids and request ids of the records, in order."""
    h = hashlib.sha256()
    for r in records:
        h.update(r.req_id.encode())
        h.update(r.prompt_ids.tobytes())
        h.update(r.output_ids.tobytes())
    return h.hexdigest()
