"""The served decision's native paths against their references, and decide taking either
path to the same plans: the row plans' native pass (drafter/native/row_plans.hpp, against
decision._row_plans_numpy) and a step's features in one call (FeatureExtractor.step_features,
against its composition).

decide takes the native paths where the row trees are at hand and the states are native
(the serving stepper's); the references serve where the trees come from a call (replay),
one rule per row, or nothing is built."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_hvd import decision
from sglang_hvd.decision import DecisionRule, _row_plans_numpy, decide
from sglang_hvd.drafter.batch import DraftBatch, RowTreeBatch
from sglang_hvd.drafter.native_drafter import _native
from sglang_hvd.request_control import AUTO, CACHE, EAGLE3, OFF
from sglang_hvd.request_state import RequestState
from sglang_hvd.verify import VerifyShape

needs_native = pytest.mark.skipif(_native is None, reason="the native extension is not built")


def random_trees(rng, b: int, width: int) -> RowTreeBatch:
    """Valid row trees: node k's parent is a node before it or the root (-1), -1 padded."""
    tokens = np.full((b, width), -1, np.int32)
    parents = np.full((b, width), -1, np.int32)
    lengths = rng.integers(0, width + 1, b).astype(np.int32)
    for i, m in enumerate(lengths):
        tokens[i, :m] = rng.integers(0, 50, m)
        parents[i, :m] = [rng.integers(-1, k) if k else -1 for k in range(m)]
    return RowTreeBatch(tokens, parents, rng.random((b, width)), lengths)


def random_drafts(rng, b: int, width: int) -> DraftBatch:
    lens = rng.integers(0, width + 1, b).astype(np.int32)
    lens[rng.random(b) < 0.3] = 0
    tokens = np.where(np.arange(width)[None, :] < lens[:, None], rng.integers(0, 50, (b, width)), -1).astype(np.int32)
    probs = np.where(tokens >= 0, 0.5, 0.0)
    z = np.zeros(b)
    return DraftBatch(tokens, probs, (tokens >= 0).astype(np.int64), lens, lens.copy(), z.astype(np.int64), z,
                      (lens > 0).astype(np.int32))


SHAPES = [VerifyShape(4, 3, 16), VerifyShape(4, 2, 8), VerifyShape(4, 1, 2), VerifyShape(1, 3, 4), VerifyShape(1, 1, 2)]


@needs_native
@pytest.mark.parametrize("seed", range(40))
def test_the_native_row_plans_equal_the_numpy_reference(seed):
    rng = np.random.default_rng(seed)
    b = int(rng.integers(1, 70))
    served = VerifyShape(4, 3, 16)  # the row trees are made at the served shape's N-1 nodes
    at = SHAPES[seed % len(SHAPES)]
    drafts = random_drafts(rng, b, int(rng.choice([4, 15, 20])))
    use = (drafts.lengths > 0) & (rng.random(b) < 0.7)
    reserve = int(rng.integers(0, 6)) if seed % 2 else rng.integers(0, 16, b).astype(np.int32)
    siblings = int(rng.integers(0, 5)) if seed % 3 else rng.integers(0, 5, b).astype(np.int32)
    eagle3 = bool(seed % 5)
    control = rng.choice(np.array([AUTO, OFF, CACHE, EAGLE3], np.int8), b) if seed % 4 == 0 else None
    trees = random_trees(rng, b, served.draft_nodes) if seed % 7 and at.allows_branches else None  # (as decide)
    want = _row_plans_numpy(use, drafts.lengths, reserve, siblings, at, eagle3, drafts, trees, None,
                            served.draft_nodes, control)
    per_reserve, per_siblings = isinstance(reserve, np.ndarray), isinstance(siblings, np.ndarray)
    got = _native.row_plans(use, drafts.lengths, 0 if per_reserve else reserve, reserve if per_reserve else None,
                            at.draft_nodes, at.allows_branches, eagle3, drafts.tokens,
                            *((trees.tokens, trees.parents, trees.lengths) if trees else (None,) * 3),
                            0 if per_siblings else siblings, siblings if per_siblings else None, control)
    for name, w, g in zip(("cache", "eagle", "tokens", "parents"), want, got):
        assert g.dtype == np.int32 and g.shape == w.shape, name
        np.testing.assert_array_equal(g, w, err_msg=name)


@needs_native
def test_a_grown_row_literally():
    """N-1 = 15, reserve 3, 2 siblings: a 4-token chain whose row tree has 9 nodes verifies
    min(4 + 2, 9, 15 - 3) = 6 tree nodes and keeps 9 EAGLE3 nodes; a row tree of 5 nodes
    stops it at 5; a row that does not use its draft keeps EAGLE3's 15."""
    drafts = DraftBatch(np.array([[7, 8, 9, 10], [7, 8, 9, 10], [1, -1, -1, -1]], np.int32), np.full((3, 4), 0.5),
                        np.ones((3, 4), np.int64), np.array([4, 4, 1], np.int32), np.array([4, 4, 1], np.int32),
                        np.ones(3, np.int64), np.zeros(3), np.ones(3, np.int32))
    tokens = np.full((3, 15), -1, np.int32)
    parents = np.full((3, 15), -1, np.int32)
    tokens[:2, :9] = [7, 8, 9, 10, 20, 21, 22, 23, 24]
    parents[:2, :9] = [-1, 0, 1, 2, -1, 0, 3, 4, 1]
    trees = RowTreeBatch(tokens, parents, np.zeros((3, 15)), np.array([9, 5, 0], np.int32))
    use = np.array([True, True, False])
    cache, eagle, tok, par = _native.row_plans(use, drafts.lengths, 3, None, 15, True, True, drafts.tokens,
                                               trees.tokens, trees.parents, trees.lengths, 2, None, None)
    assert cache.tolist() == [6, 5, 0]
    assert eagle.tolist() == [9, 10, 15]
    assert tok[0, :6].tolist() == [7, 8, 9, 10, 20, 21] and par[0, :6].tolist() == [-1, 0, 1, 2, -1, 0]
    assert tok[2].tolist() == [1] + [-1] * 14 and par[2].tolist() == list(range(-1, 14))


@needs_native
def test_the_native_row_plans_refuse_mismatched_shapes():
    lens = np.array([2, 0], np.int32)
    tokens = np.zeros((2, 4), np.int32)
    with pytest.raises(ValueError, match="mismatched shapes"):
        _native.row_plans(np.ones(3, bool), lens, 0, None, 15, True, True, tokens, None, None, None, 0, None, None)
    with pytest.raises(ValueError, match="mismatched shapes"):  # trees narrower than the tier's nodes
        _native.row_plans(np.ones(2, bool), lens, 0, None, 15, True, True, tokens, np.zeros((2, 8), np.int32),
                          np.zeros((2, 8), np.int32), lens, 0, None, None)


class _Values:
    """A scorer of fixed values that reads row trees (so decide grows them before scoring)."""

    reads_trees = True

    def __init__(self, values):
        self.values = values

        class _Extractor:
            def features(self, drafts, states, trees=None):
                return np.zeros((len(drafts), 1), np.float32)

        self.extractor = _Extractor()

    def predict(self, features):
        return self.values[: len(features)]

    def predict_curve(self, features):
        return self.predict(features), None


@needs_native
@pytest.mark.parametrize("seed", range(12))
def test_decide_plans_the_same_rows_with_either_path(seed, monkeypatch):
    rng = np.random.default_rng(100 + seed)
    b = int(rng.integers(1, 40))
    shape = SHAPES[seed % 3]  # the tree shapes
    drafts = random_drafts(rng, b, shape.draft_nodes)
    trees = random_trees(rng, b, shape.draft_nodes)
    rule = DecisionRule(threshold=1.0, eagle_reserve=int(rng.integers(0, 4)), cache_siblings=int(rng.integers(0, 4)))
    control = rng.choice(np.array([AUTO, OFF, CACHE, EAGLE3], np.int8), b) if seed % 2 else None
    scorer = _Values(rng.random(b) * 4)

    def plans():
        states = [RequestState([1, 2, 3]) for _ in range(b)]
        return decide(scorer, drafts, states, shape, rule, trees=trees, control=control)

    native = plans()
    monkeypatch.setattr(decision, "_native", None)
    reference = plans()
    for field in ("cache_lens", "eagle_nodes", "cache_tokens", "cache_parents"):
        np.testing.assert_array_equal(getattr(native, field), getattr(reference, field), err_msg=field)
    assert native.eagle3 == reference.eagle3


class _FeatureScorer:
    """A scorer over the gate's own features (a FeatureExtractor): a fixed mix of them, so
    that any feature that differs moves its row's value."""

    reads_trees = True

    def __init__(self, seen):
        from sglang_hvd.drafter import DrafterConfig
        from sglang_hvd.features import FeatureExtractor

        self.extractor = FeatureExtractor(np.arange(60, dtype=np.uint16), DrafterConfig(max_depth=10))
        self.seen = seen

    def predict_curve(self, features):
        self.seen.append(features.copy())
        weights = np.linspace(0.05, 0.4, features.shape[1])
        return np.asarray(features, np.float64) @ weights, None


@needs_native
@pytest.mark.parametrize("seed", range(8))
def test_decide_scores_the_same_features_with_either_path(seed, monkeypatch):
    """decide over native states and row trees made beforehand: the one-call features
    (FeatureExtractor.step_features) and their composition give the scorer the same
    features and the rows the same plans."""
    from sglang_hvd.features import FeatureExtractor
    from sglang_hvd.request_state import new_request_state

    rng = np.random.default_rng(200 + seed)
    b = int(rng.integers(2, 40))
    shape = SHAPES[seed % 3]
    drafts = random_drafts(rng, b, shape.draft_nodes)
    drafts.lengths[0], drafts.tokens[0, 0] = 1, 7  # a row drafted: the scorer is asked
    trees = random_trees(rng, b, shape.draft_nodes)
    rule = DecisionRule(threshold=2.0, eagle_reserve=int(rng.integers(0, 4)), cache_siblings=int(rng.integers(0, 4)))
    prompts = [rng.integers(0, 50, int(rng.integers(1, 20))).astype(np.int32) for _ in range(b)]

    def plans(seen):
        states = [new_request_state(p) for p in prompts]
        return decide(_FeatureScorer(seen), drafts, states, shape, rule, trees=trees)

    one_call, composed = [], []
    native = plans(one_call)
    monkeypatch.setattr(FeatureExtractor, "steps_natively", staticmethod(lambda states: False))
    reference = plans(composed)
    assert len(one_call) == len(composed) == 1
    np.testing.assert_array_equal(one_call[0], composed[0])
    for field in ("cache_lens", "eagle_nodes", "cache_tokens", "cache_parents", "predicted"):
        np.testing.assert_array_equal(getattr(native, field), getattr(reference, field), err_msg=field)
