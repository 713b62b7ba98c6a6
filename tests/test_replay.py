"""Replay engine, acceptance model, policies and the hvd replay CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import shared_file
from sglang_hvd.cli.main import main as hvd
from sglang_hvd.drafter import DrafterConfig, create_drafter
from sglang_hvd.replay.engine import ReconstructionError, accept_len, iter_dense, iter_serving
from sglang_hvd.replay.policies import PolicyOptions, make_policies
from sglang_hvd.replay.simulate import simulate
from sglang_hvd.trace import TokenizerId, TraceRecord, token_array
from sglang_hvd.verify import Eagle3Curve, Eagle3Stream, RowPlan, VerifyModel, VerifyShape

TOK = TokenizerId("toy", "d")
# SuffixDecoding's budget: a p-token match drafts at most p tokens
FACTOR1 = DrafterConfig(max_spec_factor=1.0, max_spec_offset=0.0)


def rec(req_id, prompt, output, source="toy", conv=None):
    return TraceRecord(req_id=req_id, conv_id=conv or req_id, turn=0, source=source, tokenizer=TOK,
                       prompt_ids=token_array(prompt), output_ids=token_array(output))


def test_accept_len_is_the_longest_common_prefix():
    out = np.array([5, 6, 7, 8])
    assert accept_len((5, 6, 9), out) == 2
    assert accept_len((5, 6, 7, 8, 9), out) == 4  # never past the recorded output
    assert accept_len((), out) == 0
    assert accept_len((1,), out) == 0


def test_eagle3_stream_carries_the_fraction():
    s = Eagle3Stream()
    assert [s.draw(1.75) for _ in range(8)] == [1, 2, 2, 2, 1, 2, 2, 2]
    s = Eagle3Stream()
    assert [s.draw(3.0) for _ in range(3)] == [3, 3, 3]
    # Means that change from step to step (two-branch rows keep fewer EAGLE3 nodes):
    # credit 1.5 -> 1, 3.5 -> 2, 4.5 -> 1, 6.6 -> 2.
    s = Eagle3Stream()
    assert [s.draw(m) for m in (1.5, 2.0, 1.0, 2.1)] == [1, 2, 1, 2]


def test_eagle3_curve_interpolates_and_checks_its_points():
    curve = Eagle3Curve.parse("1:1.45,3:1.75,15:2.1")
    assert curve.tokens(0) == 1.0  # no EAGLE3 node: the bonus token alone
    assert curve.tokens(1) == 1.45 and curve.tokens(3) == 1.75 and curve.tokens(40) == 2.1
    assert curve.tokens(2) == pytest.approx(1.6)
    assert curve.tokens(9) == pytest.approx(1.925)
    assert Eagle3Curve().tokens(3) == 1.75  # the HVD paper's figure for a 3-token chain
    assert Eagle3Curve.constant(1.75).tokens(15) == 1.75
    with pytest.raises(ValueError, match="strictly ascending"):
        Eagle3Curve.parse("3:1.75,2:1.5")
    with pytest.raises(ValueError, match="non-decreasing"):
        Eagle3Curve.parse("1:1.5,3:1.2")
    with pytest.raises(ValueError, match="expected NODES:TOKENS"):
        Eagle3Curve.parse("3=1.75")


def test_verify_shape_follows_sglangs_bounds():
    assert VerifyShape(4, 3, 16).draft_nodes == 15 and VerifyShape(4, 3, 16).allows_branches
    assert not VerifyShape(1, 3, 4).allows_branches
    with pytest.raises(ValueError, match="nodes must be steps \\+ 1 = 4"):
        VerifyShape(1, 3, 8)
    with pytest.raises(ValueError, match=r"exceeds what EAGLE3 drafts at topk 2, 3 steps "
                                         r"\(topk \+ \(steps - 1\) \* topk\^2 = 10\)"):
        VerifyShape(2, 3, 12)
    assert VerifyShape(2, 3, 11).draft_nodes == 10


def test_two_branch_rows_yield_the_cache_branch_when_its_first_token_is_right():
    model = VerifyModel(VerifyShape(4, 3, 16), Eagle3Curve.constant(2.0))
    s = Eagle3Stream()
    assert model.out_len(RowPlan(12, 3), 20, s) == 13  # cache branch, cut at its 12 tokens
    assert model.out_len(RowPlan(12, 3), 5, s) == 6
    assert s.credit == 0.0  # EAGLE3's branch was not drawn
    assert model.out_len(RowPlan(12, 3), 0, s) == 2  # first cache token wrong: EAGLE3's branch
    assert model.out_len(RowPlan(15, 0), 0, s) == 1  # a chain alone: the bonus token
    assert model.out_len(RowPlan(0, 15), 9, s) == 2  # EAGLE3's tree; the cache draft is not in the row
    assert model.out_len(RowPlan(0, 0), 9, s) == 1  # a plain step


def test_serving_walk_of_cache_only_on_a_literal_trace():
    # The output repeats the prompt's "1 2 3 4 5 6 7 8", then ends with 9.
    record = rec("a", [1, 2, 3, 4, 5, 6, 7, 8, 0], [1, 2, 3, 4, 5, 6, 7, 8, 9])
    policies = make_policies(["greedy", "cache_only"], PolicyOptions())
    model = VerifyModel(VerifyShape(4, 3, 16))
    steps = list(iter_serving([record], create_drafter("python", FACTOR1), policies, model))
    cache = [(s.pos, s.choice, s.draft.tokens, s.accept_len, s.out_len) for s in steps if s.policy == "cache_only"]
    assert cache == [
        (0, "greedy", (), 0, 1),                    # "0" occurs only as the context: no draft, plain step
        (1, "cache", (2,), 1, 2),                   # "1" -> 2 (1-token budget), bonus 3
        (3, "cache", (4, 5, 6), 3, 4),              # "1 2 3" -> 4 5 6 (3-token budget), bonus 7
        (7, "cache", (8, 0, 1, 2, 3, 4, 5), 1, 2),  # "1 .. 7" -> copies on past 8 into "0": 9 rejects it
    ]
    assert [s.pos for s in steps if s.policy == "greedy"] == list(range(9))


def test_dense_mode_labels_every_position():
    record = rec("a", [1, 2, 3, 9, 1], [2, 3, 7])
    steps = list(iter_dense([record], create_drafter("python", FACTOR1)))
    assert [(s.pos, s.draft.tokens, s.accept_len) for s in steps] == [
        (0, (2,), 1),        # "1" -> 2 (1-token budget): right
        (1, (3, 9), 1),      # "1 2" -> 3 9: 3 right, 9 wrong
        (2, (9, 1, 2), 0),   # "1 2 3" -> 9 1 2: the output says 7
    ]


class ForgetfulDrafter:
    """Drops every second append: replay must notice the context no longer matches."""

    def __init__(self):
        self.inner = create_drafter("python")
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def append(self, req_id, tokens):
        self.calls += 1
        if self.calls % 2:
            self.inner.append(req_id, tokens)


def test_replay_detects_a_drafter_that_loses_tokens():
    record = rec("a", [1, 2, 3], [4, 5, 6, 7])
    with pytest.raises(ReconstructionError, match="differ from the trace"):
        list(iter_dense([record], ForgetfulDrafter()))


traces = st.lists(st.tuples(st.lists(st.integers(0, 5), min_size=1, max_size=15),
                            st.lists(st.integers(0, 5), min_size=1, max_size=40)), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(traces=traces, mean=st.sampled_from([1.0, 1.75, 2.5]))
def test_cache_only_never_needs_more_cycles_than_greedy(traces, mean):
    records = [rec(f"r{i}", p, o) for i, (p, o) in enumerate(traces)]
    policies = make_policies(["greedy", "eagle3_only", "cache_only", "rule", "oracle"],
                             PolicyOptions(rule_thresholds=(0.5, 2.0)))
    model = VerifyModel(VerifyShape(4, 3, 16), Eagle3Curve.constant(mean))
    result = simulate(records, create_drafter("python", DrafterConfig(max_depth=8)), policies, model)
    p = result.overall.policies
    tokens = sum(len(o) for _, o in traces)
    assert p["greedy"].cycles == tokens
    assert p["cache_only"].cycles <= p["greedy"].cycles
    assert p["eagle3_only"].cycles <= p["greedy"].cycles
    # Every policy emits exactly the recorded output.
    assert all(t.tokens == tokens for t in p.values())


@pytest.mark.shared_data
def test_regression_cache_only_cycles_on_swe_agent(tmp_path, qwen_dir):
    traces = tmp_path / "swe.jsonl.gz"
    assert hvd(["import", shared_file("swe_agent.jsonl"), "--tokenizer", qwen_dir, "-o", str(traces)]) == 0
    out = tmp_path / "r.json"
    # A verify wide enough for the longest draft (64 tokens): the drafter's figure uncapped.
    assert hvd(["replay", str(traces), "--policies", "greedy,eagle3_only,cache_only", "--json", str(out),
                "--max-spec-factor", "1", "--max-spec-offset", "0", "--verify-topk", "8", "--verify-steps", "3",
                "--verify-nodes", "65", "--eagle3-mean", "1.75"]) == 0
    policies = json.loads(out.read_text())["sources"]["swe-agent"]["policies"]
    # Measured with the python drafter (depth 64, factor 1, offset 0, min prob 0.1);
    # a change of the drafter's semantics moves this figure. Tolerance: 1%.
    assert policies["cache_only"]["cycles_per_1k"] == pytest.approx(416.27, rel=0.01)
    assert policies["greedy"]["cycles_per_1k"] == 1000.0
    assert policies["eagle3_only"]["tokens_per_verify"] == pytest.approx(1.735, abs=0.005)


def test_replay_cli_json_layout_and_tables(synth_traces, tmp_path, capsys):
    out = tmp_path / "r.json"
    steps = tmp_path / "steps.jsonl"
    assert hvd(["replay", synth_traces, "--json", str(out), "--rule-threshold", "2", "--steps", str(steps),
                "--limit", "60"]) == 0
    text = capsys.readouterr().out
    assert "overall:" in text and "rule@2" in text and "tokens/s" in text
    data = json.loads(out.read_text())
    assert set(data["overall"]["policies"]) == {"greedy", "eagle3_only", "cache_only", "rule@2"}
    assert set(data["overall"]["policies"]["cache_only"]) >= {"cycles_per_1k", "tokens_per_verify", "cache_pick_rate",
                                                              "mean_cache_accept", "cache_high_share"}
    assert set(data["sources"]) <= {"synth-tools", "synth-config", "synth-code", "synth-chat"}
    first = json.loads(steps.read_text().splitlines()[0])
    assert set(first) >= {"req_id", "policy", "pos", "choice", "accept_len", "out_len", "draft"}


def test_replay_cli_refuses_bad_options_and_mixed_tokenizers(tmp_path, capsys):
    from sglang_hvd.trace import TraceWriter

    path = tmp_path / "t.jsonl"
    with TraceWriter(str(path)) as w:
        w.write(rec("a", [1], [2]))
        w.write(TraceRecord(req_id="b", conv_id="b", turn=0, source="toy", tokenizer=TokenizerId("other", "e"),
                            prompt_ids=token_array([1]), output_ids=token_array([2])))
    assert hvd(["replay", str(path)]) == 2
    assert "token ids of different tokenizers cannot share a cache" in capsys.readouterr().err
    assert hvd(["replay", str(path), "--policies", "greedy,magic"]) == 2
    assert "unknown policy 'magic'" in capsys.readouterr().err
    assert hvd(["replay", str(path), "--max-depth", "1"]) == 2
    assert "max_depth must be >= 2" in capsys.readouterr().err


def test_verify_width_caps_what_a_cache_verify_accepts():
    record = rec("a", [1, 2, 3, 4, 5, 6, 7, 8, 0], [1, 2, 3, 4, 5, 6, 7, 8, 9])
    policies = make_policies(["cache_only"], PolicyOptions())
    steps = list(iter_serving([record], create_drafter("python", FACTOR1), policies, VerifyModel(VerifyShape(1, 2, 3))))
    # As in the walk above, but a topk-1 row of 3 nodes checks at most 2 cache tokens.
    assert [(s.pos, s.draft.tokens[:3], s.accept_len, s.out_len) for s in steps] == [
        (0, (), 0, 1), (1, (2,), 1, 2), (3, (4, 5, 6), 2, 3), (6, (7, 8, 0), 2, 3)]


def test_row_trees_in_replay_cache_tree_and_the_tree_oracle_follow_a_sibling():
    # The prompt continues "1 2" with 3 8 twice and 4 7 once; the output takes 4 7 5.
    prompt = [1, 2, 3, 8, 1, 2, 3, 8, 1, 2, 4, 7, 9, 1, 2]
    record = rec("a", prompt, [4, 7, 5])
    policies = make_policies(["cache_only", "cache_tree", "oracle", "tree_oracle"], PolicyOptions(eagle3_tokens=2.1))
    model = VerifyModel(VerifyShape(4, 3, 16))
    steps = list(iter_serving([record], create_drafter("python", FACTOR1), policies, model))
    first = {s.policy: (s.plan.cache_len, s.plan.eagle_nodes, s.out_len) for s in steps if s.pos == 0}
    assert first == {
        "cache_only": (2, 0, 1),  # the chain 3 8 (a 2-token match drafts 2): wrong at once, the bonus alone
        "cache_tree": (4, 0, 3),  # chain + the tree's 4 7 under the root: 4 7 accepted, bonus 5
        "oracle": (0, 15, 2),  # the chain would yield 1 < 2.1: EAGLE3's row (2 tokens from the curve's stream)
        "tree_oracle": (4, 0, 3),  # the row tree yields 3 > 2.1
    }
    # at topk 1 a row is a chain: the tree policies verify the chain
    steps = list(iter_serving([record], create_drafter("python", FACTOR1), policies, VerifyModel(VerifyShape(1, 3, 4))))
    assert [(s.plan.cache_len, s.out_len) for s in steps if s.pos == 0 and s.policy == "cache_tree"] == [(2, 1)]
