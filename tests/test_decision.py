"""The one decision (sglang_hvd/decision.py): row plans from drafts, scorer and verify shape."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_hvd.decision import DecisionRule, decide, plan_rows
from sglang_hvd.drafter import DrafterConfig
from sglang_hvd.drafter.batch import DraftBatch
from sglang_hvd.drafter.protocol import Draft
from sglang_hvd.features import FeatureExtractor
from sglang_hvd.request_state import RequestState
from sglang_hvd.scorer import Scorer, WithoutCurve
from sglang_hvd.verify import RowPlan, VerifyShape


class ListGate(WithoutCurve):
    """A scorer predicting the given accept lengths, one per row (in row order)."""

    reads_trees = False

    def __init__(self, values):
        self.extractor = FeatureExtractor(np.zeros(100, np.uint16), DrafterConfig())
        self.values = list(values)
        self.batches = []

    def predict(self, x):
        self.batches.append(len(x))
        return np.array(self.values[: len(x)], dtype=np.float32)


def drafts(*token_lists):
    return DraftBatch.of([Draft(tokens=tuple(t), probs=(1.0,) * len(t), child_counts=(1,) * len(t), score=len(t),
                                match_len=len(t), match_count=2, tree="local" if t else "")
                          for t in token_lists], 20)


def test_rows_take_eagle3_a_chain_or_two_branches():
    assert isinstance(ListGate([]), Scorer)  # the test scorer keeps the Protocol
    shape = VerifyShape(4, 3, 16)
    states = [RequestState([1, 2, 3]) for _ in range(4)]
    gate = ListGate([0.0, 5.2, 5.2, 0.7])
    long, short = list(range(20, 40)), [7, 8, 9, 10]
    plans = decide(gate, drafts([], long, short, long), states, shape, DecisionRule(threshold=1.5, eagle_reserve=3))
    assert [plans.plan(i) for i in range(4)] == [
        RowPlan(0, 15),   # no cache draft: EAGLE3's tree
        RowPlan(12, 3),   # a long draft: cut to 15 - 3 tokens, EAGLE3 keeps its first 3 nodes
        RowPlan(4, 11),   # a short draft leaves EAGLE3 more
        RowPlan(0, 15),   # predicted 0.7 <= 1.5: EAGLE3
    ]
    assert gate.batches == [4]  # one gate call for the batch
    assert np.isnan(plans.predicted[0]) and plans.predicted[1] == pytest.approx(5.2)
    assert plans.cache_tokens.shape == (4, 15) and plans.cache_tokens[2, :5].tolist() == [7, 8, 9, 10, -1]
    # Every non-empty draft entered its request's history, judged or not.
    assert [len(s.history._recent) for s in states] == [0, 1, 1, 1]


def test_topk1_rows_are_chains_and_reserves_never_empty_the_cache_branch():
    cache, eagle = plan_rows(np.array([True, False]), np.array([9, 9]), VerifyShape(1, 3, 4), eagle_reserve=3)
    assert cache.tolist() == [3, 0] and eagle.tolist() == [0, 3]
    cache, eagle = plan_rows(np.array([True]), np.array([9]), VerifyShape(2, 3, 8), eagle_reserve=20)
    assert cache.tolist() == [1] and eagle.tolist() == [6]  # a reserve of N-1 or more still leaves one cache token


def test_a_failing_gate_falls_back_only_when_asked():
    class Broken(ListGate):
        def predict(self, x):
            raise RuntimeError("boom")

    shape = VerifyShape(2, 3, 8)
    states = [RequestState([1]), RequestState([1])]
    plans = decide(Broken([]), drafts([5, 6], []), states, shape, DecisionRule(), fallback=True)
    assert isinstance(plans.gate_error, RuntimeError)
    assert [plans.plan(i) for i in range(2)] == [RowPlan(0, 7), RowPlan(0, 7)]
    assert len(states[0].history._recent) == 1  # the history still saw the draft
    with pytest.raises(RuntimeError, match="boom"):
        decide(Broken([]), drafts([5, 6]), [RequestState([1])], shape, DecisionRule())


def test_request_state_keeps_the_tail_and_the_position():
    s = RequestState(list(range(20)))
    assert (s.num_prompt_tokens, s.pos, list(s.tail)) == (20, 0, list(range(12, 20)))
    s.observe([100, 101])
    assert s.pos == 2 and list(s.tail) == [14, 15, 16, 17, 18, 19, 100, 101]
    with pytest.raises(ValueError, match="draft recorded at position 1, but 2 tokens were observed"):
        s.history.record(1, (5,))


class TreeReadingGate(ListGate):
    """A ListGate that reads tree features (as a trained Gate does) and keeps its inputs."""

    reads_trees = True

    def predict(self, x):
        self.features = x
        return super().predict(x)


def test_a_gate_that_reads_trees_gets_every_drafted_rows_tree_cut_at_chain_plus_siblings():
    from sglang_hvd.drafter.batch import RowTreeBatch
    from sglang_hvd.drafter.row_tree import RowTree
    from sglang_hvd.features import FEATURE_NAMES

    shape = VerifyShape(4, 3, 8)  # 7 draft nodes
    states = [RequestState([1, 2, 3]) for _ in range(3)]
    # rows 0 and 2 have chains 5 6 and 7 8 9 10 11; each tree adds siblings under the root
    rows = {0: RowTree((5, 6, 40, 41, 42), (-1, 0, -1, -1, 2), (0.5, 0.5, 0.25, 0.125, 0.25)),
            2: RowTree((7, 8, 9, 10, 11, 50, 51), (-1, 0, 1, 2, 3, -1, 5), (0.5,) * 5 + (0.25, 0.25))}
    asked = []

    def trees(which):
        asked.append(which.tolist())
        return RowTreeBatch.of([rows[i] for i in which], 7)

    gate = TreeReadingGate([3.0, 9.0, 0.5])
    plans = decide(gate, drafts([5, 6], [], [7, 8, 9, 10, 11]), states, shape,
                   DecisionRule(threshold=1.0, eagle_reserve=1, cache_siblings=2), trees=trees)
    assert asked == [[0, 2]]  # one call, every drafted row, before the gate
    col = FEATURE_NAMES.index("tree_siblings")
    # row 0: chain 2 + S 2 = 4 nodes described: 40 and 41 (mass .375; 42 is past them); row 2: 5 + 2 = 7
    # nodes: 50 under the root, 51 under 50 (one branch point, the root)
    assert gate.features[:, col : col + 5].tolist() == [[2.0, 0.375, 0.375, 0.25, 1.0], [0.0] * 5,
                                                        [2.0, 0.5, 0.25, 0.25, 1.0]]
    # row 0 verifies its 4 described nodes (within its share 7 - 1), row 2 (0.5 <= 1) EAGLE3's tree
    assert [plans.plan(i) for i in range(3)] == [RowPlan(4, 3), RowPlan(0, 7), RowPlan(0, 7)]
    assert plans.cache_tokens[0, :4].tolist() == [5, 6, 40, 41]
    assert plans.cache_parents[0, :4].tolist() == [-1, 0, -1, -1]
    # every row's trees made beforehand (the serving stepper's speculate_step): the same features and rows
    for s in states:
        s.history = RequestState([1, 2, 3]).history  # (decide recorded the drafts: start over)
    every = RowTreeBatch.of([rows.get(i, RowTree()) for i in range(3)], 7)
    gate2 = TreeReadingGate([3.0, 9.0, 0.5])
    again = decide(gate2, drafts([5, 6], [], [7, 8, 9, 10, 11]), states, shape,
                   DecisionRule(threshold=1.0, eagle_reserve=1, cache_siblings=2), trees=every)
    assert gate2.features.tolist() == gate.features.tolist()
    assert [again.plan(i) for i in range(3)] == [RowPlan(4, 3), RowPlan(0, 7), RowPlan(0, 7)]
    assert again.cache_tokens.tolist() == plans.cache_tokens.tolist()
    assert again.cache_parents.tolist() == plans.cache_parents.tolist()
    with pytest.raises(ValueError, match="row trees of 3 rows x 7 nodes for a batch of 3 x 3"):
        decide(gate, drafts([5, 6], [], [7, 8, 9, 10, 11]), states, VerifyShape(4, 2, 4),
               DecisionRule(threshold=1.0, eagle_reserve=1, cache_siblings=2), trees=every)
    # a gate that reads no trees (the score rule): trees only for the cache rows with room
    asked.clear()
    decide(ListGate([3.0, 9.0, 0.5]), drafts([5, 6], [], [7, 8, 9, 10, 11]), states, shape,
           DecisionRule(threshold=1.0, eagle_reserve=1, cache_siblings=2), trees=trees)
    assert asked == [[0]]
