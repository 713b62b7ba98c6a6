"""The trace oracle's prefix hashing on verify inputs built by SGLang's own builders:
EAGLE-grown topk-2 trees laid out by the port of SGLang's tree kernel (both mask
layouts), before and after HVD rewrites rows into cache chains and two-branch rows. The
hash of every node must be the hash of committed prefix + its path from the root,
where the path is read from the first-child / next-sibling links (not from the mask the
oracle reads)."""

from __future__ import annotations

import pytest

pytest.importorskip("sglang", reason="the SGLang CPU harness needs the sglang extra (sglang==0.5.23)")

from sglang_hvd.harness.stubs.hvd_trace_oracle import table as T  # noqa: E402
from sglang_hvd.patches.rows import FULL_MASK, QLEN_ONLY, rewrite_tree_rows  # noqa: E402

from .test_tree_rows import SEQ_LENS, N, build, plans  # noqa: E402


def paths_from_links(next_token: list[int], next_sibling: list[int]) -> dict[int, list[int]]:
    """Node -> the nodes from the root's first child down to it, by the links."""
    paths, stack = {0: []}, [0]
    while stack:
        node = stack.pop()
        child = next_token[node]
        while child != -1:
            paths[child] = paths[node] + [child]
            stack.append(child)
            child = next_sibling[child]
    return paths


def check_rows(vi, mode: int) -> int:
    blocks = T.draft_blocks(vi.custom_mask.numpy(), SEQ_LENS, N)
    checked = 0
    for b, seq_len in enumerate(SEQ_LENS):
        committed = list(range(100 + b, 100 + b + seq_len))
        tokens = vi.draft_token[b * N:(b + 1) * N].numpy()
        pos = vi.positions[b * N:(b + 1) * N].numpy()
        got = T.row_hashes(tokens, pos, blocks[b], T.prefix_hashes(committed)[-1])
        paths = paths_from_links(vi.retrieve_next_token[b].tolist(), vi.retrieve_next_sibling[b].tolist())
        for node, path in paths.items():
            want = T.prefix_hashes(committed + [int(tokens[0])] + [int(tokens[k]) for k in path])[-1]
            assert got[node] == want, (mode, b, node, path)
            checked += 1
    return checked


@pytest.mark.parametrize("mode", [QLEN_ONLY, FULL_MASK])
def test_eagle_trees_hash_each_node_by_its_path(mode):
    assert check_rows(build(mode), mode) == len(SEQ_LENS) * N  # every node is reached by the links


@pytest.mark.parametrize("mode", [QLEN_ONLY, FULL_MASK])
def test_hvd_rewritten_rows_hash_each_node_by_its_path(mode):
    vi = build(mode)
    assert rewrite_tree_rows(vi, plans(), mode) == 2
    # row 0 untouched (8 nodes), row 1 a chain of 7 (8), row 2: EAGLE3's 4 nodes + 3 cache tokens (8)
    assert check_rows(vi, mode) == 3 * N
