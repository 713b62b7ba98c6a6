"""Training data: replay of traces at the verify shape -> feature matrix, labels, conversation ids.

Labels are what a cache chain of the whole row would accept: min(LCP, N-1); with
``siblings`` S > 0 (serving rows, topk > 1), what the row tree of the chain and up to S
siblings accepts (drafter/row_tree.py): the payoff of the cache branch the decision
verifies. Beside them, the chain's own min(LCP, N-1) (``chain_accept``): what the
payoff curve learns (mlp.CurveLabels)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

import numpy as np

from sglang_hvd import decision
from sglang_hvd.drafter import DrafterConfig, create_drafter
from sglang_hvd.drafter.row_tree import accepted_within
from sglang_hvd.features import FEATURE_NAMES, FeatureExtractor
from sglang_hvd.replay.engine import iter_serving
from sglang_hvd.replay.labelled import iter_labelled
from sglang_hvd.replay.policies import CacheOnlyPolicy, Eagle3OnlyPolicy, OraclePolicy, RulePolicy
from sglang_hvd.report import progress
from sglang_hvd.trace import TraceRecord
from sglang_hvd.verify import VerifyModel


@dataclasses.dataclass(frozen=True, slots=True)
class Dataset:
    features: np.ndarray  # [examples, F] float32
    accept_len: np.ndarray  # [examples] float32 labels
    draft_len: np.ndarray  # [examples] int32
    chain_accept: np.ndarray  # [examples] int32: the cache chain's accepted length, at most N-1
    conv_ids: np.ndarray  # [examples] object (str)
    sources: np.ndarray  # [examples] object (str)

    def __len__(self) -> int:
        return len(self.accept_len)


POSITION_MODES = ("dense", "serving")


class _Recorder:
    """Wraps a behaviour policy: records the draft, the state snapshot, the row tree and
    the label of every draft it sees, in the request state its walk built (features are
    extracted per request, in one batch, by the extractor the gate serves with)."""

    needs_draft = True
    needs_state = True
    batch_key = None

    def __init__(self, inner, sink: list, siblings: int = 0):
        self.inner, self.sink, self.name = inner, sink, f"behaviour:{inner.name}"
        self.siblings = siblings
        self.needs_rows = siblings > 0

    def plan(self, view):
        if view.draft.tokens:
            n = len(view.draft.tokens)
            nodes = int(decision.described(n, self.siblings, view.shape.draft_nodes))
            self.sink.append((view.draft, view.state.snapshot(), view.row.head(nodes),
                              accepted_within(view.oracle_path, nodes), n, view.oracle_accept_len))
            view.state.record(view.draft.tokens)
        return self.inner.plan(view)


def _serving_examples(records, drafter, extractor, model, bar, siblings=0):
    """Examples at the positions serving walks visit, with the history those walks build.

    Behaviour policies: cache_only, eagle3_only (drafting, never verifying drafts), the
    score rule at 1.5 and the oracle, so the examples cover the states a gate meets when it
    picks either source.
    """
    sink: list = []
    behaviour = [CacheOnlyPolicy(), Eagle3OnlyPolicy(), RulePolicy(1.5), OraclePolicy(model.eagle3_tokens)]
    policies = [_Recorder(p, sink, siblings) for p in behaviour]
    for record in records:
        for _ in iter_serving([record], drafter, policies, model):
            pass
        drafts, states, trees, labels, dlen, chain = zip(*sink) if sink else ((), (), (), (), (), ())
        sink.clear()
        bar.update(len(record.output_ids))
        yield (record, extractor.of_rows(drafts, states, trees), np.array(labels, dtype=np.int32),
               np.array(dlen, dtype=np.int32), np.array(chain, dtype=np.int32))


def _dense_examples(records, drafter, extractor, model, bar):
    for req in iter_labelled(records, drafter, extractor):
        bar.update(len(req.record.output_ids))
        chain = np.minimum(req.accept_len, model.shape.draft_nodes)
        yield req.record, req.features, chain, req.draft_len, chain


def build_dataset(records: Sequence[TraceRecord], drafter_name: str, drafter_config: DrafterConfig,
                  token_flags: np.ndarray, desc: str = "features", positions: str = "dense",
                  model: VerifyModel | None = None, siblings: int = 0) -> Dataset:
    """Replay ``records`` in order (one shared drafter) and label cache drafts.

    positions="dense": every non-empty draft at every output position (the paper's mode).
    positions="serving": the drafts met by serving walks of behaviour policies (_serving_examples).
    """
    if positions not in POSITION_MODES:
        raise ValueError(f"positions must be one of {POSITION_MODES}, got {positions!r}")
    if siblings and positions != "serving":
        raise ValueError("dense positions are labelled with the chain's payoff only: "
                         "with --positions dense pass --cache-siblings 0 "
                         "(or use --positions serving, whose labels are the row tree's payoff)")
    extractor = FeatureExtractor(token_flags, drafter_config)
    drafter = create_drafter(drafter_name, drafter_config)
    feats, labels, dlen, chains, convs, sources = [], [], [], [], [], []
    with progress(total=sum(len(r.output_ids) for r in records), desc=desc, unit="tok") as bar:
        if positions == "dense":
            stream = _dense_examples(records, drafter, extractor, model or VerifyModel(), bar)
        else:
            stream = _serving_examples(records, drafter, extractor, model or VerifyModel(), bar, siblings)
        for record, x, y, d, c in stream:
            feats.append(x)
            labels.append(y)
            dlen.append(d)
            chains.append(c)
            convs.append(np.full(len(y), record.conv_id, dtype=object))
            sources.append(np.full(len(y), record.source, dtype=object))
    if not feats:
        empty = np.zeros(0)
        return Dataset(np.zeros((0, len(FEATURE_NAMES)), np.float32), empty.astype(np.float32), empty.astype(np.int32),
                       empty.astype(np.int32), empty.astype(object), empty.astype(object))
    return Dataset(np.concatenate(feats), np.concatenate(labels).astype(np.float32), np.concatenate(dlen),
                   np.concatenate(chains).astype(np.int32), np.concatenate(convs), np.concatenate(sources))


def records_digest(records: Sequence[TraceRecord]) -> str:
    """sha256 over the token ids and request ids of the records, in order."""
    h = hashlib.sha256()
    for r in records:
        h.update(r.req_id.encode())
        h.update(r.prompt_ids.tobytes())
        h.update(r.output_ids.tobytes())
    return h.hexdigest()
