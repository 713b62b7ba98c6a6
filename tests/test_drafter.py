"""Cache drafter: literal cases, and every registered drafter against the naive reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from naive_drafter import NaiveDrafter
from sglang_hvd.drafter import Draft, Drafter, DrafterConfig, available_drafters, create_drafter
from sglang_hvd.drafter.row_tree import row_of, speculate_row

DRAFTERS = available_drafters()


@pytest.fixture(params=DRAFTERS)
def make(request):
    """A drafter with SuffixDecoding's budget (factor 1, offset 0: a p-token match drafts at
    most p tokens) unless the test says otherwise; the literal examples below assume it."""
    return lambda **cfg: create_drafter(request.param, DrafterConfig(**{"max_spec_factor": 1.0, "max_spec_offset": 0.0,
                                                                        **cfg}))


def test_registry_and_protocol():
    assert "python" in DRAFTERS
    for name in DRAFTERS:
        assert isinstance(create_drafter(name), Drafter)
    with pytest.raises(KeyError, match="unknown drafter 'rust'; available: "):
        create_drafter("rust")


def test_worked_example_of_the_draft_docstring(make):
    d = make()
    d.start_request("a", [7, 8, 9, 7, 8, 5, 7, 8])
    assert d.speculate("a") == Draft(tokens=(5, 7), probs=(1 / 3, 1 / 3), child_counts=(1, 1), score=2 / 3,
                                     match_len=2, match_count=3, tree="local")


def test_longer_match_drafts_more_and_stops_at_the_end_of_history(make):
    d = make()
    # The prompt repeats "1 2 3 4 5 6" once; the context ends in "1 2 3".
    d.start_request("a", [1, 2, 3, 4, 5, 6, 9, 1, 2, 3])
    draft = d.speculate("a")
    # "1 2 3" occurs twice (once is the context itself): prob 1/2 for every token; the
    # budget of a 3-token match is 3 tokens.
    assert (draft.tokens, draft.probs, draft.match_len, draft.match_count) == ((4, 5, 6), (0.5, 0.5, 0.5), 3, 2)


def test_global_tree_serves_a_later_request(make):
    d = make()
    d.start_request("a", [50, 51])
    d.append("a", [1, 2, 3, 4, 5])
    d.finish_request("a")
    d.start_request("b", [9, 1, 2])
    draft = d.speculate("b")
    # "1 2" occurs once in the global tree (a's response) -> prob 1; budget 2.
    assert (draft.tokens, draft.probs, draft.tree, draft.match_len) == ((3, 4), (1.0, 1.0), "global", 2)


def test_running_responses_are_shared_before_they_finish(make):
    d = make()
    d.start_request("a", [50])
    d.start_request("b", [60, 7, 8])
    d.append("a", [7, 8, 9, 10])  # a is still running
    draft = d.speculate("b")
    assert (draft.tokens, draft.tree) == ((9, 10), "global")


def test_higher_score_wins_and_equal_scores_prefer_the_requests_own_tree(make):
    d = make()
    d.start_request("x", [30])
    d.append("x", [1, 2, 3, 4])
    d.finish_request("x")
    d.start_request("b", [1, 2, 3, 9, 1, 2])
    # Local "1 2": 2 occurrences (one is the context) -> 3 at 1/2, then 9 at 1/2: score 1.0.
    # Global "1 2": once, in x's response -> 3 4 at prob 1: score 2.0.
    draft = d.speculate("b")
    assert (draft.tree, draft.tokens, draft.score) == ("global", (3, 4), 2.0)
    d.start_request("y", [1, 2, 3, 4, 1, 2, 3, 4, 1, 2])
    # Local: the 6-token pattern "1 2 3 4 1 2" occurs twice -> 3 4 1 2 at prob 1/2 each
    # (the copy stops where the history ends): score 2.0. Global: "1 2" -> 3 4: score 2.0.
    draft = d.speculate("y")
    assert (draft.tree, draft.tokens, draft.score, draft.match_len) == ("local", (3, 4, 1, 2), 2.0, 6)


def test_tie_between_children_goes_to_the_most_recent(make):
    d = make()
    d.start_request("a", [1, 5, 1, 6, 1])
    # "1" occurs 3 times; children 5 and 6 once each: 6 is more recent. prob 1/3.
    assert d.speculate("a").tokens == (6,)
    d.append("a", [5, 2, 1])
    # Now "1" -> 5 twice, 6 once (4 occurrences): frequency beats recency, prob 2/4; no
    # longer pattern ("2 1") occurs before, and a 1-token pattern drafts 1 token.
    draft = d.speculate("a")
    assert (draft.tokens, draft.probs, draft.child_counts, draft.match_count) == ((5,), (0.5,), (2,), 4)


def test_min_token_prob_and_depth_limit(make):
    d = make(min_token_prob=0.6)
    d.start_request("a", [1, 2, 3, 9, 1, 2])
    assert d.speculate("a").tokens == ()  # "1 2" -> 3 has prob 1/2 < 0.6
    e = make(max_depth=4, max_spec_factor=10)
    e.start_request("a", [1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3])
    draft = e.speculate("a")
    # Depth 4: a 3-token pattern may draft 1 token, a 2-token one 2, a 1-token one 3; all
    # at prob 1/2 (two occurrences of the pattern), so the 1-token pattern scores best.
    assert (draft.tokens, draft.match_len, draft.score) == ((4, 5, 6), 1, 1.5)


def test_eviction_keeps_the_global_budget(make):
    d = make(global_max_tokens=6)
    d.start_request("a", [0])
    d.append("a", [1, 2, 3, 4])
    d.finish_request("a")
    d.start_request("b", [0])
    d.append("b", [7, 8, 9])
    d.finish_request("b")  # 4 + 3 > 6: a's response (the oldest) goes
    d.start_request("c", [1, 2])
    assert d.speculate("c").tokens == ()
    assert d.memory_stats()["global_tokens"] == 3.0
    d.start_request("e", [7, 8])
    assert d.speculate("e").tokens == (9,)


def test_lifecycle_errors_are_clear(make):
    d = make()
    d.start_request("a", [1])
    with pytest.raises(ValueError, match="already running"):
        d.start_request("a", [1])
    with pytest.raises(KeyError, match="not running"):
        d.speculate("zzz")
    d.reset()
    with pytest.raises(KeyError, match="not running"):
        d.append("a", [1])


def test_append_batch_is_the_appends_in_order_and_all_or_nothing(make):
    one, batch = make(), make()
    for d in (one, batch):
        d.start_request("a", [1, 2, 3])
        d.start_request("b", [7, 8])
    for r, t in (("a", [4, 5]), ("b", [9]), ("a", [6])):
        one.append(r, t)
    batch.append_batch(["a", "b", "a"], [[4, 5], np.array([9], dtype=np.int32), (6,)])  # lists, arrays, tuples
    assert batch.context("a").tolist() == [1, 2, 3, 4, 5, 6] and batch.context("b").tolist() == [7, 8, 9]
    assert [batch.speculate(r) for r in "ab"] == [one.speculate(r) for r in "ab"]
    assert batch.memory_stats()["global_tokens"] == one.memory_stats()["global_tokens"] == 4.0
    # a request that is not running, or a bad id, and nothing of the batch is appended
    with pytest.raises(KeyError, match="request 'zzz' is not running"):
        batch.append_batch(["a", "zzz"], [[1], [2]])
    with pytest.raises(ValueError, match="token ids must be non-negative"):
        batch.append_batch(["a", "b"], [[1], [-2]])
    with pytest.raises(ValueError, match="one token list per request"):
        batch.append_batch(["a", "b"], [[1]])
    assert batch.context("a").tolist() == [1, 2, 3, 4, 5, 6] and batch.context("b").tolist() == [7, 8, 9]


# -- property tests against the naive reference ---------------------------------------

tokens = st.integers(min_value=0, max_value=4)  # a tiny vocabulary makes repeats likely
requests = st.lists(
    st.tuples(st.lists(tokens, min_size=1, max_size=12),
              st.lists(st.lists(tokens, min_size=1, max_size=4), max_size=6)),
    min_size=1, max_size=5,
)
configs = st.fixed_dictionaries({
    "max_depth": st.integers(2, 9),
    "max_spec_tokens": st.integers(1, 8),
    "max_spec_factor": st.sampled_from([0.5, 1.0, 2.0]),
    "max_spec_offset": st.sampled_from([0.0, 1.0, -1.0]),
    "min_token_prob": st.sampled_from([0.0, 0.1, 0.4]),
    "global_max_tokens": st.integers(0, 30),
    "max_occurrences": st.sampled_from([1, 2, 3, 1024]),
    "max_scan": st.sampled_from([1, 2, 4, 16384]),
})


def _occurs(haystack, needle):
    n = len(needle)
    return any(list(haystack[i : i + n]) == list(needle) for i in range(len(haystack) - n + 1))


def _drive(drafters, reqs, check) -> None:
    """Requests one after another (every other one left running): ``check(rid)`` before
    each chunk is appended and after the last."""
    for r, (prompt, chunks) in enumerate(reqs):
        rid = f"r{r}"
        for d in drafters:
            d.start_request(rid, prompt)
        for chunk in chunks:
            check(rid)
            for d in drafters:
                d.append(rid, chunk)
        check(rid)
        if r % 2 == 0:
            for d in drafters:
                d.finish_request(rid)


@pytest.mark.parametrize("name", DRAFTERS)
@settings(max_examples=150, deadline=None)
@given(reqs=requests, cfg=configs)
def test_same_drafts_as_the_naive_reference(name, reqs, cfg):
    config = DrafterConfig(**cfg)
    real, naive = create_drafter(name, config), NaiveDrafter(config)

    def check(rid):
        got = real.speculate(rid)
        assert got == naive.speculate(rid)
        assert list(real.context(rid)) == naive.context(rid)
        # A draft is always a path that occurs in the history, and within its budget.
        if got.tokens:
            ctx = naive.context(rid)
            path = ctx[len(ctx) - got.match_len :] + list(got.tokens)
            history = [naive.context(rid)] + [[t for t, _ in v] for v in naive.responses.values()]
            assert any(_occurs(h, path) for h in history)
            assert len(got.tokens) <= config.budget(got.match_len)
        # Eviction keeps the budget, unless running responses alone exceed it.
        cached = real.memory_stats()["global_tokens"]
        running = sum(len(v) for k, v in naive.responses.items() if k in naive.local)
        assert cached <= config.global_max_tokens or cached == running

    _drive((real, naive), reqs, check)


@pytest.mark.parametrize("name", DRAFTERS)
@settings(max_examples=150, deadline=None)
@given(reqs=requests, cfg=configs, max_nodes=st.sampled_from([1, 2, 3, 5, 16]))
def test_tree_drafts_equal_the_naive_reference_and_beat_the_chain(name, reqs, cfg, max_nodes):
    """Tree drafts: the same trees as a brute force over every node of the continuation
    trie; parents before children, within the node and depth budgets; with room for a
    whole chain the tree scores at least the chain's."""
    config = DrafterConfig(**cfg)
    real, naive = create_drafter(name, config), NaiveDrafter(config)

    def check(rid):
        got = real.speculate_tree(rid, max_nodes)
        assert got == naive.speculate_tree(rid, max_nodes)
        assert len(got) <= max_nodes and got.depth() <= config.budget(got.match_len)
        assert all(parent < i for i, parent in enumerate(got.parents))
        if max_nodes >= config.max_spec_tokens:
            assert got.score >= real.speculate(rid).score - 1e-12
        assert speculate_row(real, rid, max_nodes) == row_of(naive, rid, max_nodes)  # the cache row's tree
        chain = real.speculate(rid)  # the tree of the chain's own set
        assert real.speculate_tree(rid, max_nodes, like=chain) == naive.speculate_tree(rid, max_nodes, like=chain)

    _drive((real, naive), reqs, check)


@pytest.mark.parametrize("name", DRAFTERS)
def test_the_tree_of_a_chains_own_set_reports_that_sets_match_length(name):
    """Found by hypothesis: the newest 2 occurrences of "0 4" match 3 tokens, an older one
    only 2. Lengths 2 and 3 walk the same newest-2 set but are different sets of lengths;
    the chain (budget 2 at length 2, 1 at length 3) comes from length 2, and the tree of
    its own set reports 2, not 3 (which the unrestricted tree reports)."""
    config = DrafterConfig(max_depth=4, max_spec_tokens=2, max_spec_factor=0.5, max_spec_offset=1.0,
                           min_token_prob=0.0, global_max_tokens=0, max_occurrences=2, max_scan=4)
    drafter = create_drafter(name, config)
    drafter.start_request("r", [0, 4, 0, 4, 0, 4])
    chain = drafter.speculate("r")
    assert (chain.tokens, chain.probs, chain.match_len, chain.match_count) == ((0, 4), (0.5, 0.5), 2, 2)
    own = drafter.speculate_tree("r", 1, like=chain)
    assert (own.tokens, own.parents, own.probs, own.match_len, own.match_count) == ((0,), (-1,), (0.5,), 2, 2)
    assert drafter.speculate_tree("r", 1).match_len == 3


@pytest.mark.parametrize("name", DRAFTERS)
def test_branching_trees_on_longer_streams_equal_the_naive_reference(name):
    """Seeded streams over 4 tokens (so continuations branch), 40 requests sharing the
    global tree, max_occurrences 3 (narrowing inside the tree): equal trees, and most of
    them branch."""
    rng = np.random.default_rng(5)
    config = DrafterConfig(max_depth=8, max_spec_tokens=6, max_spec_factor=2.0, max_spec_offset=0.0,
                           min_token_prob=0.05, max_occurrences=3, max_scan=5)
    real, naive = create_drafter(name, config), NaiveDrafter(config)
    branching = compared = grafted = 0
    for r in range(40):
        rid, prompt = f"r{r}", rng.integers(0, 4, size=6).tolist()
        for d in (real, naive):
            d.start_request(rid, prompt)
        for _ in range(8):
            got = real.speculate_tree(rid, 8)
            assert got == naive.speculate_tree(rid, 8)
            row = speculate_row(real, rid, 8)
            assert row == row_of(naive, rid, 8)
            compared += 1
            branching += len(set(got.parents)) < len(got.parents)
            grafted += len(row) > len(real.speculate(rid).tokens)
            chunk = rng.integers(0, 4, size=2).tolist()
            for d in (real, naive):
                d.append(rid, chunk)
        for d in (real, naive):
            d.finish_request(rid)
    assert compared == 320 and branching > 200 and grafted > 80, (branching, grafted)


@pytest.mark.parametrize("name", DRAFTERS)
def test_trees_of_nodes_with_many_continuations_equal_the_naive_reference(name):
    """5 6 7 8 1 2 followed by any of 24 tokens, 60 times, depth 6: every pattern's set is the
    same 60 occurrences, so the tree's root (under the matched pattern) has more than 16
    distinct continuations, where the native drafter's small table of children gives way to a
    sort; below it each has one or a few. Equal trees and row trees, branching at the root."""
    rng = np.random.default_rng(7)
    config = DrafterConfig(max_depth=6, max_spec_tokens=6, max_spec_factor=2.0, max_spec_offset=0.0,
                           min_token_prob=0.01)
    real, naive = create_drafter(name, config), NaiveDrafter(config)
    unit = [5, 6, 7, 8, 1, 2]
    wide = 0
    for r in range(6):
        rid = f"r{r}"
        after = rng.integers(10, 34, size=60).tolist()
        assert len(set(after)) > 16
        prompt = [t for x in after for t in (*unit, x)] + unit
        for d in (real, naive):
            d.start_request(rid, prompt)
        for _ in range(4):
            got = real.speculate_tree(rid, 24)
            assert got == naive.speculate_tree(rid, 24)
            assert speculate_row(real, rid, 24) == row_of(naive, rid, 24)
            wide += got.parents.count(-1) > 1
            chunk = [int(rng.integers(10, 34)), *unit]
            for d in (real, naive):
                d.append(rid, chunk)
        for d in (real, naive):
            d.finish_request(rid)
    assert wide > 20  # of 24 trees, most branch at their root


@pytest.mark.parametrize("name", DRAFTERS)
def test_a_tree_draft_keeps_the_sibling_a_chain_drops(name):
    """The DraftTree docstring's example: after 7 8 the history went on with 9 once and 5
    once; the chain takes 5 (the newer), the tree both, each with what followed it."""
    d = create_drafter(name, DrafterConfig(max_spec_factor=1.0, max_spec_offset=0.0))
    d.start_request("a", [1, 7, 8, 9, 7, 8, 5, 7, 8])
    assert d.speculate("a").tokens == (5, 7)
    t = d.speculate_tree("a", 4)
    assert (t.tokens, t.parents, t.child_counts) == ((5, 9, 7, 7), (-1, -1, 0, 1), (1, 1, 1, 1))
    assert t.probs == pytest.approx((1 / 3,) * 4) and t.score == pytest.approx(4 / 3)
    assert (t.match_len, t.match_count, t.tree, t.depth()) == (2, 3, "local", 2)
    assert d.speculate_tree("a", 1).tokens == (5,)


@pytest.mark.parametrize("name", DRAFTERS)
@settings(max_examples=60, deadline=None)
@given(prompt=st.lists(tokens, min_size=1, max_size=20), output=st.lists(tokens, min_size=1, max_size=30),
       cut=st.integers(1, 5))
def test_drafts_do_not_depend_on_how_appends_are_chunked(name, prompt, output, cut):
    one, many = create_drafter(name), create_drafter(name)
    one.start_request("a", prompt)
    many.start_request("a", prompt)
    for i, tok in enumerate(output):
        one.append("a", [tok])
        if (i + 1) % cut == 0 or i + 1 == len(output):
            start = (i // cut) * cut
            many.append("a", output[start : i + 1])
            assert one.speculate("a") == many.speculate("a")


@pytest.mark.parametrize("name", DRAFTERS)
@pytest.mark.parametrize("max_occurrences,max_scan", [(1024, 16384), (5, 5), (5, 60)])
def test_long_prompts_and_many_responses_match_the_reference(name, max_occurrences, max_scan):
    """Large occurrence sets take the narrowing path; relocation and compaction kick in
    (they move documents: the newest occurrences must still be found by stamp)."""
    rng = np.random.default_rng(0)
    config = DrafterConfig(max_depth=12, max_spec_tokens=8, global_max_tokens=500, max_occurrences=max_occurrences,
                           max_scan=max_scan)
    real, naive = create_drafter(name, config), NaiveDrafter(config)
    motif = rng.integers(0, 6, size=40).tolist()
    for r in range(30):
        prompt = (motif * 3 + rng.integers(0, 6, size=200).tolist())[: 150 + 10 * r]
        for d in (real, naive):
            d.start_request(f"q{r}", prompt)
        for step in range(40):
            assert real.speculate(f"q{r}") == naive.speculate(f"q{r}")
            if step % 4 == 0:
                assert real.speculate_tree(f"q{r}", 12) == naive.speculate_tree(f"q{r}", 12)
            chunk = (motif[step % 40 : step % 40 + 3] if step % 3 else rng.integers(0, 6, size=2).tolist())
            for d in (real, naive):
                d.append(f"q{r}", chunk)
        for d in (real, naive):
            d.finish_request(f"q{r}")
    stats = real.memory_stats()
    assert stats["evicted_responses"] > 0 and stats["compactions"] > 0
    assert stats["global_tokens"] <= 500


@pytest.mark.parametrize("name", DRAFTERS)
def test_a_periodic_history_is_walked_from_its_newest_occurrences(name):
    """max_occurrences bounds the work on repetitive text. The best pattern here (22
    tokens, budget 42) recurs 394 times; with 16 the walk counts the newest 16, the ones
    nearest the context's end, whose continuations run out sooner: same tokens, lower
    path probabilities (at depth j, 16 - ceil(j / 3) of them are still on the path)."""
    prompt = [1, 2, 3] * 400 + [1, 2]
    drafts = []
    for k in (1024, 16):
        d = create_drafter(name, DrafterConfig(max_spec_factor=2.0, max_spec_offset=0.0, max_occurrences=k))
        d.start_request("a", prompt)
        drafts.append(d.speculate("a"))
    full, capped = drafts
    assert full.tokens == capped.tokens == (3, 1, 2) * 14 and full.match_len == capped.match_len == 22
    assert (full.match_count, capped.match_count) == (394, 16)
    assert capped.probs[:4] == (15 / 16, 15 / 16, 15 / 16, 14 / 16) and capped.score == pytest.approx(22.3125)
    assert full.score == pytest.approx(41.2005076)


@pytest.mark.parametrize("name", DRAFTERS)
def test_long_matches_are_looked_for_among_the_newest_occurrences_of_the_last_two_tokens(name):
    """max_scan bounds the match scan. The context ends 7 8 9 1 2; the only earlier 7 8 9 1 2
    (followed by 5 6) is older than the ten 4 1 2 (followed by 3): with max_scan 4 the scan
    stops among those, so the 5-token match is not found and the draft is the pair's."""
    prompt = [7, 8, 9, 1, 2, 5, 6, 5, 6] + [4, 1, 2, 3] * 10 + [7, 8, 9, 1, 2]
    drafts = {}
    for scan in (16384, 4):
        d = create_drafter(name, DrafterConfig(max_occurrences=4, max_scan=scan))
        d.start_request("a", prompt)
        drafts[scan] = d.speculate("a")
    assert drafts[16384].tokens[:4] == (5, 6, 5, 6) and drafts[16384].match_len == 5
    assert drafts[4].tokens[:4] == (3, 4, 1, 2) and drafts[4].match_len == 2


def _dense_drafts(name, records, config=None):
    from sglang_hvd.replay.engine import iter_dense

    return [(s.record.req_id, s.pos, s.draft) for s in iter_dense(records, create_drafter(name, config))]


@pytest.mark.skipif("native" not in DRAFTERS, reason="the native drafter is not built")
def test_native_equals_python_on_the_synthetic_traces(synth_traces):
    from sglang_hvd.trace import iter_traces

    records = list(iter_traces(synth_traces))[:200]
    assert _dense_drafts("native", records) == _dense_drafts("python", records)


@pytest.mark.shared_data
@pytest.mark.skipif("native" not in DRAFTERS, reason="the native drafter is not built")
def test_native_row_trees_equal_python_s_in_a_batch_served_as_the_server_does(shared_traces):
    """A step's chains, then its row trees (the native drafter grows each from the set its
    chain was walked from): the same rows as the reference, which searches the set again.
    Eight requests in flight, every token appended in one batch per step."""
    from sglang_hvd.trace import iter_traces

    path, _ = shared_traces
    records = [r for r in iter_traces(path) if r.source == "tau-bench"][:24]
    drafters = [create_drafter(name, DrafterConfig(global_max_tokens=20_000)) for name in ("native", "python")]
    rows_seen = branching = 0  # rows, and rows whose tree branches (siblings beside the chain)
    for start in range(0, len(records), 8):
        batch = records[start : start + 8]
        pos = {r.req_id: 0 for r in batch}
        for d in drafters:
            for r in batch:
                d.start_request(r.req_id, r.prompt_ids)
        while pos:
            rids = list(pos)
            got = []
            for d in drafters:
                chains = d.speculate_arrays(rids)
                rows = d.speculate_rows(rids, 15)
                got.append((chains.tokens.tolist(), rows.tokens.tolist(), rows.parents.tolist(), rows.probs.tolist(),
                            rows.lengths.tolist()))
                # the serving stepper's one call: the same drafts and row trees
                step_chains, step_rows = d.speculate_step(rids, 15)
                assert (step_chains.tokens.tolist(), step_rows.tokens.tolist(), step_rows.parents.tolist(),
                        step_rows.probs.tolist(), step_rows.lengths.tolist()) == got[-1]
                assert step_chains.score.tolist() == chains.score.tolist()
                assert step_chains.match_len.tolist() == chains.match_len.tolist()
                # with 4 cache siblings: each row the first min(len(chain) + 4, 15) nodes of its row tree
                _, cut_rows = d.speculate_step(rids, 15, siblings=4)
                cuts = np.minimum(chains.lengths + 4, 15)
                assert cut_rows.lengths.tolist() == np.minimum(rows.lengths, cuts).tolist()
                for i, m in enumerate(cut_rows.lengths.tolist()):
                    assert cut_rows.tokens[i, :m].tolist() == rows.tokens[i, :m].tolist()
                    assert cut_rows.parents[i, :m].tolist() == rows.parents[i, :m].tolist()
                    assert cut_rows.probs[i, :m].tolist() == rows.probs[i, :m].tolist()
            assert got[0] == got[1]
            rows_seen += len(rids)
            branching += sum(ps[:n] != list(range(-1, n - 1)) for ps, n in zip(got[0][2], got[0][4]))
            done = []
            for r in batch:
                if r.req_id in pos:
                    pos[r.req_id] += 3  # three tokens a step
                    if pos[r.req_id] >= len(r.output_ids):
                        done.append(r.req_id)
            for d in drafters:
                d.append_batch(rids, [r.output_ids[pos[r.req_id] - 3 : pos[r.req_id]].tolist()
                                      for r in batch if r.req_id in pos])
                for rid in done:
                    d.finish_request(rid)
            for rid in done:
                del pos[rid]
    assert (rows_seen, branching) == (863, 273)


@pytest.mark.shared_data
@pytest.mark.skipif("native" not in DRAFTERS, reason="the native drafter is not built")
def test_native_equals_python_on_dev_traces(shared_traces):
    """Same drafts, scores and match lengths at every position of real agentic traces."""
    from sglang_hvd.trace import iter_traces

    path, _ = shared_traces
    records = [r for r in iter_traces(path) if r.source == "swe-agent"][:60]
    records += [r for r in iter_traces(path) if r.source == "tau-bench"][:60]
    config = DrafterConfig(global_max_tokens=20_000)  # small enough that eviction happens
    native, python = _dense_drafts("native", records, config), _dense_drafts("python", records, config)
    assert len(native) == sum(len(r.output_ids) for r in records)
    assert native == python


@pytest.mark.parametrize("name", DRAFTERS)
@settings(max_examples=40, deadline=None)
@given(base=st.lists(tokens, min_size=300, max_size=400), turns=st.lists(
    st.tuples(st.integers(0, 40), st.lists(tokens, min_size=1, max_size=30), st.lists(tokens, min_size=1, max_size=12)),
    min_size=2, max_size=5))
def test_multi_turn_prompts_sharing_a_prefix_draft_like_the_reference(name, base, turns):
    """Each turn re-sends the previous context (minus a few tail tokens) plus new text, the
    shape of agentic conversations; a drafter may reuse its index of the shared prefix."""
    config = DrafterConfig(max_depth=10, max_spec_tokens=6)
    real, naive = create_drafter(name, config), NaiveDrafter(config)
    context = list(base)
    for t, (cut, new, output) in enumerate(turns):
        prompt = context[: max(1, len(context) - cut)] + new
        for d in (real, naive):
            d.start_request(f"t{t}", prompt)
        for tok in output:
            assert real.speculate(f"t{t}") == naive.speculate(f"t{t}")
            for d in (real, naive):
                d.append(f"t{t}", [tok])
        for d in (real, naive):
            d.finish_request(f"t{t}")
        context = prompt + output


@pytest.mark.parametrize("name", DRAFTERS)
def test_a_full_cache_of_short_responses_compacts_now_and_then_not_at_every_eviction(name):
    # 10-token responses keep 64 slots each: live tokens are always under a third of the arena, which once
    # made every eviction compact the whole global index (~100 ms per finished request at 2 M tokens)
    drafter = create_drafter(name, DrafterConfig(global_max_tokens=3000))
    for r in range(1300):
        drafter.start_request(f"r{r}", [1, 2, 3])
        drafter.append(f"r{r}", [r % 97 + 10, *range(20, 29)])
        drafter.finish_request(f"r{r}")
    stats = drafter.memory_stats()
    assert stats["global_tokens"] == 3000 and stats["evicted_responses"] == 1000
    assert 1 <= stats["compactions"] <= 20  # the arena is reclaimed, a compaction per dozens of evictions


def test_native_frees_old_finished_indexes_off_the_caller_and_drafts_stay_the_references():
    """Finished requests' own indexes are kept for the next turn's prompt (16 of them); older
    ones are freed on the drafter's background thread. Twenty conversations' two turns, each
    second prompt the first turn's context extended: the native drafts equal the Python
    reference's throughout, and every dropped index is freed."""
    import time

    if "native" not in available_drafters():
        pytest.skip("the native extension is not built")
    rng = np.random.default_rng(3)
    native, ref = create_drafter("native"), create_drafter("python")
    contexts = {}
    for turn in range(2):
        for conv in range(20) if turn == 0 else reversed(range(20)):  # the newest kept index first
            old = contexts.get(conv, [])
            prompt = old + rng.integers(0, 12, size=300).tolist()
            rid = f"{conv}/{turn}"
            for d in (native, ref):
                d.start_request(rid, prompt)
            output = rng.integers(0, 12, size=40).tolist()
            for k in range(0, len(output), 8):
                for d in (native, ref):
                    d.append(rid, output[k : k + 8])
                assert native.speculate(rid) == ref.speculate(rid)
            for d in (native, ref):
                d.finish_request(rid)
            contexts[conv] = prompt + output
    deadline = time.monotonic() + 10
    while native._core.pending_frees() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert native._core.pending_frees() == 0
    assert native._core.reused_prompt_tokens() == 16 * 340  # the 16 kept first turns (300 + 40 tokens) reused
