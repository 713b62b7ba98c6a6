"""The cache row's tree (drafter/row_tree.py): the chain, then the tree draft's siblings."""

from __future__ import annotations

import pytest

from sglang_hvd.drafter import DrafterConfig, create_drafter
from sglang_hvd.drafter.protocol import Draft, DraftTree
from sglang_hvd.drafter.row_tree import accepted_within, branch, chain_path, is_chain, row_path, row_tree

# 5 -> {7 -> 8, 4} and 9 at the root, in best-first order (the module docstring's example)
TREE = DraftTree(tokens=(5, 9, 7, 4, 8), parents=(-1, -1, 0, 0, 2), probs=(0.5, 0.25, 0.375, 0.125, 0.25))


def shape(row):
    return row.tokens, row.parents


def test_the_row_keeps_the_chain_and_adds_the_trees_other_nodes_in_its_order():
    assert shape(row_tree(Draft(tokens=(5, 7, 8)), TREE, 5)) == ((5, 7, 8, 9, 4), (-1, 0, 1, -1, 0))
    assert shape(row_tree(Draft(tokens=(5, 7, 8)), TREE, 4)) == ((5, 7, 8, 9), (-1, 0, 1, -1))
    assert shape(row_tree(Draft(tokens=(5, 7, 8)), TREE, 2)) == ((5, 7), (-1, 0))  # the chain's first nodes only
    # a chain the tree does not share: every tree node is a sibling branch, parents kept
    assert shape(row_tree(Draft(tokens=(6,)), TREE, 6)) == ((6, 5, 9, 7, 4, 8), (-1, -1, -1, 1, 1, 3))
    # the chain cut at 1 node: the tree's 7 under 5 is then a new node, its 8 too
    assert shape(row_tree(Draft(tokens=(5, 7, 8)), TREE, 1 + 4)) == ((5, 7, 8, 9, 4), (-1, 0, 1, -1, 0))
    assert shape(row_tree(Draft(tokens=(5, 9)), TREE, 5)) == ((5, 9, 9, 7, 4), (-1, 0, -1, 0, 0))
    assert shape(row_tree(Draft(), TREE, 3)) == ((5, 9, 7), (-1, -1, 0))
    assert shape(row_tree(Draft(tokens=(5, 7)), DraftTree(), 5)) == ((5, 7), (-1, 0))


def test_each_node_keeps_its_path_probability_the_chains_or_the_trees():
    row = row_tree(Draft(tokens=(5, 7, 8), probs=(0.5, 0.375, 0.25)), TREE, 5)
    assert row.probs == (0.5, 0.375, 0.25, 0.25, 0.125)  # 9 and 4 from the tree draft
    assert row_tree(Draft(tokens=(6,), probs=(0.75,)), TREE, 3).probs == (0.75, 0.5, 0.25)


def test_the_path_is_the_nodes_the_output_passes_through():
    tokens, parents = (5, 7, 8, 9, 4), (-1, 0, 1, -1, 0)
    assert row_path(tokens, parents, [5, 7, 8, 1]) == (0, 1, 2)
    assert row_path(tokens, parents, [5, 4, 1]) == (0, 4)  # the chain's second token is wrong, its sibling right
    assert row_path(tokens, parents, [9, 5]) == (3,)
    assert row_path(tokens, parents, [0, 5, 7], start=1) == (0, 1)
    assert row_path(tokens, parents, [5, 7]) == (0, 1)  # never past the recorded output
    assert row_path(tokens, parents, [8, 5]) == ()  # 8 is a node, but not under the root
    assert row_path((), (), [5]) == ()


def test_the_branch_through_a_path_runs_down_first_children_to_a_leaf():
    tokens, parents = (5, 7, 8, 9, 4, 6), (-1, 0, 1, -1, 0, 3)
    assert branch(tokens, parents, (0, 4)) == (5, 4)
    assert branch(tokens, parents, ()) == (5, 7, 8)  # nothing accepted: the first branch, the chain
    assert branch(tokens, parents, (3,)) == (9, 6)
    assert branch((5, 7, 8), (-1, 0, 1), (0,)) == (5, 7, 8)  # a chain is its own branch
    assert is_chain((-1, 0, 1)) and not is_chain(parents) and is_chain(())


def test_a_verify_of_the_first_k_nodes_accepts_the_path_nodes_among_them():
    assert [accepted_within((0, 4), k) for k in range(6)] == [0, 1, 1, 1, 1, 2]
    assert [accepted_within((3,), k) for k in range(5)] == [0, 0, 0, 0, 1]
    assert [accepted_within(chain_path(3), k) for k in range(5)] == [0, 1, 2, 3, 3]


@pytest.mark.parametrize("impl", ["native", "python"])
def test_speculate_rows_pack_each_rows_tree_and_leave_rows_without_a_chain_empty(impl):
    drafter = create_drafter(impl, DrafterConfig(max_spec_factor=4.0, max_spec_offset=0.0))
    # own history 1 2 3 8 | 1 2 3 8 | 1 2 4 7 | 9 1 2: after "1 2" the chain says 3 (2 of 3), the sibling 4
    drafter.start_request("a", [1, 2, 3, 8, 1, 2, 3, 8, 1, 2, 4, 7, 9, 1, 2])
    drafter.start_request("b", [50, 51])
    assert drafter.speculate("a").tokens == (3, 8, 1, 2, 4, 7, 9, 1)
    rows = drafter.speculate_rows(["a", "b"], 10)
    # the chain's 8 nodes, then the tree's 4 under the root and its 7
    assert rows.lengths.tolist() == [10, 0]
    assert rows.tokens[0].tolist() == [3, 8, 1, 2, 4, 7, 9, 1, 4, 7]
    assert rows.parents[0].tolist() == [-1, 0, 1, 2, 3, 4, 5, 6, -1, 8]
    assert rows.tokens[1].tolist() == [-1] * 10
    # path probabilities: "1 2" occurs 4 times (the last the context itself): 3 in 2 of them,
    # certain to 2, then 4 in half of "3 8 1 2"; the sibling 4 in 1 of 4, certain to 7
    assert rows.probs[0].tolist() == [0.5] * 4 + [0.25] * 6
    assert rows.probs[1].tolist() == [0.0] * 10
    # speculate_step: the chains and the same row trees, in one call
    chains, step_rows = drafter.speculate_step(["a", "b"], 10)
    assert chains.lengths.tolist() == [8, 0] and chains.tokens[0, :8].tolist() == [3, 8, 1, 2, 4, 7, 9, 1]
    assert step_rows.lengths.tolist() == [10, 0]
    assert step_rows.tokens[0].tolist() == [3, 8, 1, 2, 4, 7, 9, 1, 4, 7]
    assert step_rows.parents[0].tolist() == [-1, 0, 1, 2, 3, 4, 5, 6, -1, 8]
    assert step_rows.probs[0].tolist() == [0.5] * 4 + [0.25] * 6
    assert step_rows.tokens[1].tolist() == [-1] * 10
    assert drafter.speculate_rows(["a"], 3).tokens.tolist() == [[3, 8, 1]]  # the chain fills a short row
    # with S siblings, each row cut at the nodes a decision describes: min(len(chain) + S, 10)
    _, one = drafter.speculate_step(["a", "b"], 10, siblings=1)
    assert one.lengths.tolist() == [9, 0]
    assert one.tokens[0].tolist() == [3, 8, 1, 2, 4, 7, 9, 1, 4, -1]
    assert one.parents[0].tolist() == [-1, 0, 1, 2, 3, 4, 5, 6, -1, -1]
    _, none = drafter.speculate_step(["a", "b"], 10, siblings=0)
    assert none.lengths.tolist() == [8, 0] and none.parents[0, :8].tolist() == list(range(-1, 7))
    with pytest.raises(ValueError, match="siblings must be >= 0"):
        drafter.speculate_step(["a"], 10, siblings=-1)


@pytest.mark.parametrize("impl", ["native", "python"])
def test_a_row_follows_the_chain_of_now_after_another_request_changed_the_global_tree(impl):
    drafter = create_drafter(impl, DrafterConfig(max_spec_factor=4.0, max_spec_offset=0.0))
    drafter.start_request("a", [1, 2, 3, 8, 1, 2])
    assert drafter.speculate("a").tokens == (3, 8, 1, 2)  # from its own tree
    assert drafter.speculate_rows(["a"], 4).tokens.tolist() == [[3, 8, 1, 2]]
    # b's response makes "1 2 -> 5 5 5 5 5" the global tree's best continuation (score 4 > 2)
    drafter.start_request("b", [9])
    drafter.append("b", [1, 2, 5, 5, 5, 5, 5, 1, 2, 5, 5, 5, 5, 5, 1, 2, 5, 5, 5, 5, 5])
    # (no speculate since: a chain remembered from before the change must not be reused)
    assert drafter.speculate_rows(["a"], 4).tokens.tolist() == [[5, 5, 5, 5]]
    assert drafter.speculate("a").tokens[:4] == (5, 5, 5, 5)
