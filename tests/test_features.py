"""Gate features: literal values, and no label leakage."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_hvd.drafter import Draft, DrafterConfig, create_drafter
from sglang_hvd.drafter.batch import RowTreeBatch
from sglang_hvd.drafter.protocol import DraftTree
from sglang_hvd.drafter.row_tree import row_tree
from sglang_hvd.features import FEATURE_NAMES, FeatureExtractor, tree_features
from sglang_hvd.replay.labelled import iter_labelled
from sglang_hvd.request_state import RequestHistory, StateSnapshot
from sglang_hvd.token_flags import FLAG_BITS, FLAG_NAMES, build_token_flags, flags_of
from sglang_hvd.trace import TokenizerId, TraceRecord, token_array

COL = {name: i for i, name in enumerate(FEATURE_NAMES)}
# A toy vocabulary: id -> text.
VOCAB = ["a", " b", "{\"", "42", "\n", "    ", "<|im_end|>", "\":", "x", "y"]
FLAGS = build_token_flags(VOCAB, special_ids={6})


def test_token_flags_of_literal_texts():
    assert flags_of("{\"") == FLAG_BITS["bracket"] | FLAG_BITS["quote"] | FLAG_BITS["json"]
    assert flags_of(" b") == FLAG_BITS["word_start"] | FLAG_BITS["alpha"]
    assert flags_of("42") == FLAG_BITS["digit"]
    assert flags_of("\n") == FLAG_BITS["newline"] | FLAG_BITS["space"]
    assert flags_of("    ") == FLAG_BITS["space"] | FLAG_BITS["code"]
    assert flags_of("<|im_end|>", special=True) & FLAG_BITS["special"]


def test_history_worked_example_of_the_docstring():
    a, b, c, d, e, x = 1, 2, 3, 4, 5, 9
    h = RequestHistory()
    h.observe([0] * 10)
    h.record(10, (a, b, c, d))
    h.observe([a, b])
    h.record(12, (c, d, e))
    h.observe([c])
    # p=13: draft@12 confirmed 1 (c); draft@10 confirmed 3; nothing broken or resolved yet.
    assert h.scalars() == [1.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, math.log1p(1), 0.0, 0.0, 0.0]
    h.observe([x])
    # p=14: both broke on x: accept_len 1 and 3, mean 2.0; gap to the last draft is 2.
    assert h.scalars() == [1.0, 3.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, math.log1p(2), 2.0, math.log1p(2), 0.0]


@settings(max_examples=80, deadline=None)
@given(steps=st.lists(st.tuples(st.lists(st.integers(0, 2), max_size=4), st.lists(st.integers(0, 2), min_size=1,
                                                                                 max_size=3)), max_size=60))
def test_the_first_token_miss_rate_counted_as_drafts_come_and_go_is_the_windows(steps):
    """RequestHistory keeps the miss count as drafts enter and leave the window of the last
    MISS_WINDOW (16); it equals counting the window's drafts that broke on their first token."""
    h = RequestHistory()
    for draft, emitted in steps:
        h.record(h.pos, tuple(draft))
        h.observe(emitted)
        window = list(h._recent)
        want = sum(e.broke and e.confirmed == 0 for e in window) / len(window) if window else 0.0
        assert h.scalars()[-1] == want


def test_feature_row_literal_values():
    ex = FeatureExtractor(FLAGS, DrafterConfig(max_spec_factor=1.0, max_spec_offset=0.0))
    draft = Draft(tokens=(2, 3, 7), probs=(0.5, 0.5, 0.25), child_counts=(4, 4, 2), score=1.25, match_len=5,
                  match_count=8, tree="local")
    x = ex.of_rows([draft, Draft()], [StateSnapshot(pos=9, num_prompt_tokens=91, tail=(0, 1, 4), history=(0.0,) * 12),
                                      StateSnapshot(0, 5, (), (0.0,) * 12)])
    assert x.shape == (2, len(FEATURE_NAMES)) and x.dtype == np.float32
    f = dict(zip(FEATURE_NAMES, x[0].tolist()))
    assert (f["draft_len"], f["match_len"], f["is_local_tree"]) == (3.0, 5.0, 1.0)
    assert (f["score"], f["first_prob"], f["last_prob"]) == (1.25, 0.5, 0.25)
    assert math.isclose(f["mean_prob"], 1.25 / 3, rel_tol=1e-6)
    assert math.isclose(f["log_match_count"], math.log1p(8), rel_tol=1e-6)
    assert math.isclose(f["budget_use"], 3 / 5, rel_tol=1e-6)  # budget of a 5-token match: 5
    assert math.isclose(f["output_share"], 0.09, rel_tol=1e-6)
    # First draft token is {" (id 2): bracket, quote, json.
    assert [n for n in FLAG_NAMES if f[f"first_tok_{n}"]] == ["bracket", "quote", "json"]
    # Draft {" 42 ": -> json in 2 of 3 tokens, digit in 1 of 3.
    assert math.isclose(f["draft_json"], 2 / 3, rel_tol=1e-6) and math.isclose(f["draft_digit"], 1 / 3, rel_tol=1e-6)
    # Tail a, " b", "\n": newline 1/3, alpha 2/3.
    assert math.isclose(f["tail_newline"], 1 / 3, rel_tol=1e-6) and math.isclose(f["tail_alpha"], 2 / 3, rel_tol=1e-6)
    # No draft, position 0, empty tail, empty history: only the prompt length is non-zero.
    assert np.flatnonzero(x[1]).tolist() == [COL["log_prompt_len"]]
    assert math.isclose(x[1, COL["log_prompt_len"]], math.log1p(5), rel_tol=1e-6)


def test_tree_features_of_the_docstring_example_and_none_for_a_chain_row():
    ex = FeatureExtractor(FLAGS, DrafterConfig())
    chain = Draft(tokens=(5, 7, 8), probs=(0.5, 0.375, 0.25), child_counts=(4, 3, 2), score=1.125, match_len=3,
                  match_count=8, tree="global")
    tree = DraftTree(tokens=(5, 9, 7, 4, 8), parents=(-1, -1, 0, 0, 2), probs=(0.5, 0.25, 0.375, 0.125, 0.25))
    row = row_tree(chain, tree, 3 + 2)  # S = 2 siblings: 9 under the root, 4 under node 0
    assert (row.tokens, row.parents) == ((5, 7, 8, 9, 4), (-1, 0, 1, -1, 0))
    state = StateSnapshot(4, 20, (1,), (0.0,) * 12)
    x = ex.of_rows([chain] * 3, [state] * 3, [row, row.head(0), row.head(4)])
    names = ["tree_siblings", "tree_sibling_mass", "tree_root_alt_mass", "tree_best_sibling_prob", "tree_branch_points"]
    tree_cols = [COL[n] for n in names]
    assert x[0, tree_cols].tolist() == [2.0, 0.375, 0.25, 0.25, 2.0]
    assert x[1, tree_cols].tolist() == [0.0] * 5  # a chain row (S = 0) has no siblings
    assert x[2, tree_cols].tolist() == [1.0, 0.25, 0.25, 0.25, 1.0]  # S = 1: only 9
    assert np.array_equal(x[0, : tree_cols[0]], x[1, : tree_cols[0]])  # the other groups do not see the tree
    # the serving path: a batch of whole row trees, cut at the nodes described
    trees = RowTreeBatch.of([row, row], 15)
    assert tree_features(trees, np.array([3, 3]), np.array([5, 4])).tolist() == [x[0, tree_cols].tolist(),
                                                                                 x[2, tree_cols].tolist()]
    # a chain cut short by the row: nodes past the cut are not the chain's; 9 under the root is a sibling
    cut = row_tree(chain, tree, 2)
    assert tree_features(RowTreeBatch.of([cut], 2), np.array([3]), np.array([2])).tolist() == [[0.0] * 5]


def _records(prefix, suffix, prompt):
    tok = TokenizerId("toy", "d")
    return [TraceRecord(req_id="r", conv_id="c", turn=0, source="s", tokenizer=tok,
                        prompt_ids=token_array(prompt), output_ids=token_array(prefix + suffix))]


@settings(max_examples=60, deadline=None)
@given(prompt=st.lists(st.integers(0, 9), min_size=1, max_size=30),
       prefix=st.lists(st.integers(0, 9), min_size=1, max_size=30),
       tail_a=st.lists(st.integers(0, 9), min_size=1, max_size=10),
       tail_b=st.lists(st.integers(0, 9), min_size=1, max_size=10))
def test_changing_tokens_after_p_changes_no_feature_of_p(prompt, prefix, tail_a, tail_b):
    """Features at positions <= p = len(prefix) depend only on tokens before them."""
    ex = FeatureExtractor(FLAGS, DrafterConfig(max_depth=12))
    rows = []
    for suffix in (tail_a, tail_b):
        drafter = create_drafter("python", DrafterConfig(max_depth=12))
        (req,) = iter_labelled(_records(prefix, suffix, prompt), drafter, ex)
        keep = req.positions <= len(prefix)
        rows.append((req.positions[keep], req.features[keep]))
    assert np.array_equal(rows[0][0], rows[1][0])
    assert np.array_equal(rows[0][1], rows[1][1])


def test_rows_gathered_one_by_one_and_a_drafters_batch_give_the_same_features():
    """Training (drafts and state snapshots gathered row by row, FeatureExtractor.of_rows)
    and serving (the drafter's DraftBatch and RowTreeBatch, StateBatch.of) share one
    front-end; the inputs they pack must agree too."""
    from sglang_hvd.drafter import available_drafters
    from sglang_hvd.request_state import RequestState, StateBatch

    rng = np.random.default_rng(1)
    ex = FeatureExtractor(FLAGS, DrafterConfig(max_depth=10))
    for name in available_drafters():
        d = create_drafter(name, DrafterConfig(max_depth=10))
        ids = [f"r{i}" for i in range(6)]
        states = []
        for r in ids:
            prompt = rng.integers(0, 10, size=30)
            d.start_request(r, prompt)
            states.append(RequestState(prompt))
            out = rng.integers(0, 10, size=int(rng.integers(0, 8))).tolist()
            d.append(r, out)
            states[-1].record((1, 2))
            states[-1].observe(out)
        drafts, batch = d.speculate_batch(ids), d.speculate_arrays(ids)
        assert sum(len(x.tokens) > 0 for x in drafts) >= 3  # the comparison covers real drafts
        want = ex.of_rows(drafts, [s.snapshot() for s in states])
        got = ex.features(batch, StateBatch.of(states))
        assert np.array_equal(got, want), name
        # with row trees of the chain and 3 siblings each, cut at 7 nodes
        trees = d.speculate_rows(ids, 9)
        described = np.minimum(np.minimum(trees.lengths, batch.lengths + 3), 7)
        rows = [trees.row(i).head(int(described[i])) for i in range(6)]
        assert sum(len(r) > len(x.tokens) for r, x in zip(rows, drafts)) >= 2  # rows with siblings
        want = ex.of_rows(drafts, [s.snapshot() for s in states], rows)
        got = ex.features(batch, StateBatch.of(states), trees.scatter(np.arange(6), 6, 9, described))
        assert np.array_equal(got, want), name


def test_tree_features_match_a_node_by_node_count_on_random_rows():
    rng = np.random.default_rng(3)
    b, w = 200, 9
    parents = np.full((b, w), -1, dtype=np.int32)
    for j in range(1, w):
        parents[:, j] = rng.integers(-1, j, size=b)  # any earlier node, or the root
    probs = rng.random((b, w))
    trees = RowTreeBatch(np.zeros((b, w), np.int32), parents, probs, np.full(b, w, np.int32))
    chain_lens, num_nodes = rng.integers(0, 12, size=b), rng.integers(0, w + 1, size=b)
    got = tree_features(trees, chain_lens, num_nodes)
    for i in range(b):
        cut = min(chain_lens[i], num_nodes[i])
        sibs = range(cut, num_nodes[i])
        masses = [probs[i, j] for j in sibs]
        want = [len(sibs), sum(masses), sum(probs[i, j] for j in sibs if parents[i, j] < 0),
                max(masses, default=0.0), len({parents[i, j] for j in sibs if parents[i, j] < cut})]
        assert got[i].tolist() == pytest.approx(want, rel=1e-6), i


def test_native_tree_features_equal_the_numpy_reference_bit_for_bit():
    """drafter/native/features.hpp's tree group against tree_features on random row trees:
    every width the decision uses (a chain of 1 node to 63), chains longer than the row,
    rows cut anywhere; and a parent out of range is refused, not read."""
    from sglang_hvd.drafter.native_drafter import _native

    if _native is None:
        pytest.skip("the native extension is not built")
    rng = np.random.default_rng(5)
    for w in (1, 2, 8, 15, 16, 63):
        b = 40
        parents = np.full((b, w), -1, dtype=np.int32)
        for j in range(1, w):
            parents[:, j] = rng.integers(-1, j, size=b)
        probs = rng.random((b, w)) * (rng.random((b, w)) < 0.8)
        lengths = rng.integers(0, w + 1, size=b).astype(np.int32)
        chain_lens = rng.integers(0, w + 3, size=b).astype(np.int32)
        trees = RowTreeBatch(np.zeros((b, w), np.int32), parents, probs, lengths)
        out = np.full((b, 9), 7.0, dtype=np.float32)
        _native.tree_features(out, 3, parents, probs, chain_lens, lengths)
        want = tree_features(trees, chain_lens, lengths)
        assert np.array_equal(out[:, 3:8], want), w
        assert (out[:, :3] == 7.0).all() and (out[:, 8] == 7.0).all()  # the other columns untouched
    parents[0, 1] = w  # past the row
    with pytest.raises(ValueError, match="parent out of range"):
        _native.tree_features(out, 0, parents, probs, chain_lens, lengths)


def _native_and_reference(ex: FeatureExtractor, drafts, states) -> tuple[np.ndarray, np.ndarray]:
    got = ex.features(drafts, states)
    want = np.zeros_like(got)
    ex._numpy_columns(drafts, states, want)
    return got, want


@pytest.mark.parametrize("width", [1, 3, 12])
def test_native_features_equal_the_numpy_reference_bit_for_bit(width):
    """The native kernel (drafter/native/features.hpp) against the numpy reference on random
    batches with every edge the reference handles: empty drafts, ids beyond the vocabulary,
    -1 padding, match lengths past the budget table, short and empty tails, large counts."""
    from sglang_hvd.drafter.batch import DraftBatch
    from sglang_hvd.drafter.native_drafter import _native
    from sglang_hvd.request_state import HISTORY_K, NUM_HISTORY, TAIL_TOKENS, StateBatch

    if _native is None:
        pytest.skip("the native extension is not built")
    rng = np.random.default_rng(width)
    ex = FeatureExtractor(FLAGS, DrafterConfig(max_depth=10))
    for _ in range(30):
        b = int(rng.integers(1, 70))
        lens = rng.integers(0, width + 1, size=b).astype(np.int32)
        lens[0] = 0  # always one row without a draft
        live = np.arange(width)[None, :] < lens[:, None]
        tokens = np.where(live, rng.integers(0, len(VOCAB) + 3, size=(b, width)), -1).astype(np.int32)
        probs = np.where(live, rng.random((b, width)), 0.0)
        counts = np.where(live, rng.integers(0, 1 << 40, size=(b, width)), 0).astype(np.int64)
        drafts = DraftBatch(tokens, probs, counts, lens, rng.integers(0, 14, size=b).astype(np.int32),
                            rng.integers(0, 1 << 40, size=b).astype(np.int64), probs.sum(1),
                            rng.integers(0, 3, size=b).astype(np.int32))
        tail_lens = rng.integers(0, TAIL_TOKENS + 1, size=b).astype(np.int64)
        tails = np.where(np.arange(TAIL_TOKENS)[None, :] < tail_lens[:, None],
                         rng.integers(0, len(VOCAB) + 3, size=(b, TAIL_TOKENS)), -1).astype(np.int64)
        history = rng.random((b, NUM_HISTORY)).astype(np.float32)
        history[:, :HISTORY_K] = rng.integers(0, 9, size=(b, HISTORY_K))
        states = StateBatch(rng.integers(0, 1 << 20, size=b).astype(np.float64),
                            rng.integers(0, 1 << 20, size=b).astype(np.float64), history, tails, tail_lens)
        got, want = _native_and_reference(ex, drafts, states)
        assert np.array_equal(got, want)
        assert got[0, : COL["budget_use"] + 1].tolist() == [0.0] * (COL["budget_use"] + 1)  # no draft: no match group


def test_native_features_refuse_mismatched_arrays():
    from sglang_hvd.drafter.native_drafter import _native

    if _native is None:
        pytest.skip("the native extension is not built")
    z32, z64, f64 = np.zeros(2, np.int32), np.zeros(2, np.int64), np.zeros(2)
    args = (np.zeros((2, 3), np.int32), np.zeros((2, 3)), np.zeros((2, 3), np.int64), z32, z32, z64, f64, z32, 1,
            f64, f64, np.zeros((2, 12), np.float32), np.zeros((2, 8), np.int64), z64, np.zeros((5, 4), np.uint8),
            np.ones(4, np.float32))
    with pytest.raises(ValueError, match="writeable C-contiguous float32"):
        _native.gate_features(np.zeros((2, 60)), *args)  # float64
    with pytest.raises(ValueError, match="mismatched shapes"):
        _native.gate_features(np.zeros((3, 60), np.float32), *args)
    with pytest.raises(ValueError, match="too few columns"):
        _native.gate_features(np.zeros((2, 20), np.float32), *args)


def _random_step(rng, b: int, width: int, tree_width: int):
    """A decode step's inputs: native request states with histories, drafts, row trees."""
    from sglang_hvd.drafter.batch import DraftBatch
    from sglang_hvd.request_state import new_request_state

    states = []
    for _ in range(b):
        s = new_request_state(rng.integers(0, len(VOCAB) + 3, size=int(rng.integers(0, 12))).astype(np.int32))
        for _ in range(int(rng.integers(0, 6))):
            s.record(rng.integers(0, len(VOCAB), size=int(rng.integers(1, 5))).tolist())
            s.observe(rng.integers(0, len(VOCAB), size=int(rng.integers(1, 4))).tolist())
        states.append(s)
    lens = rng.integers(0, width + 1, size=b).astype(np.int32)
    live = np.arange(width)[None, :] < lens[:, None]
    tokens = np.where(live, rng.integers(0, len(VOCAB) + 3, size=(b, width)), -1).astype(np.int32)
    probs = np.where(live, rng.random((b, width)), 0.0)
    drafts = DraftBatch(tokens, probs, np.where(live, 3, 0).astype(np.int64), lens,
                        rng.integers(0, 14, size=b).astype(np.int32), rng.integers(0, 99, size=b).astype(np.int64),
                        probs.sum(1), rng.integers(0, 3, size=b).astype(np.int32))
    parents = np.full((b, tree_width), -1, dtype=np.int32)
    for j in range(1, tree_width):
        parents[:, j] = rng.integers(-1, j, size=b)
    trees = RowTreeBatch(rng.integers(0, len(VOCAB), size=(b, tree_width)).astype(np.int32), parents,
                         rng.random((b, tree_width)), rng.integers(0, tree_width + 1, size=b).astype(np.int32))
    return states, drafts, trees


@pytest.mark.parametrize("siblings", [0, 1, 3])
def test_a_steps_features_in_one_call_equal_their_composition(siblings):
    """FeatureExtractor.step_features (one native call over native states, the trees cut
    as the decision describes them) against features(drafts, StateBatch.of(states), the
    trees cut by decision._described_trees), bit for bit: with trees, without, at a tier of
    fewer nodes than the trees'."""
    from sglang_hvd.decision import _described_trees
    from sglang_hvd.request_state import StateBatch

    ex = FeatureExtractor(FLAGS, DrafterConfig(max_depth=10))
    rng = np.random.default_rng(siblings)
    for k in range(20):
        b = int(rng.integers(1, 40))
        states, drafts, trees = _random_step(rng, b, 15, 15)
        if not ex.steps_natively(states):
            pytest.skip("the native extension is not built")
        nodes = 15 if k % 2 else 7
        want_rows = np.flatnonzero((drafts.lengths > 0) & (siblings > 0))
        cut = _described_trees(trees, want_rows, drafts.lengths, siblings, b, 15) if want_rows.size else None
        cut_lengths = None if cut is None else np.minimum(cut.lengths, np.minimum(drafts.lengths + siblings, nodes))
        if cut is not None:
            cut = RowTreeBatch(cut.tokens, cut.parents, cut.probs, cut_lengths.astype(np.int32))
        want = ex.features(drafts, StateBatch.of(states), cut)
        got = ex.step_features(drafts, states, trees, siblings, nodes)
        assert np.array_equal(got, want), k
        assert np.array_equal(ex.step_features(drafts, states, None, siblings, nodes),
                              ex.features(drafts, StateBatch.of(states)))
    with pytest.raises(ValueError, match="mismatched shapes"):  # a state missing
        ex.step_features(drafts, states[:-1], trees, siblings, 15)
